// train: an MLP with batch norm trained on emulated arithmetic, comparing update
// strategies, optimisers, loss scaling and per-tensor formats (see experiments/nn/mlp.hpp).
#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <utility>

#include "data_file.hpp"
#include "training.hpp"

namespace roundoff::train {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr int kMaxLayers = 3;  // metric names are declared for the largest model

std::string check_format_or_auto(const ParamValue& v) {
  const auto* s = std::get_if<std::string>(&v);
  if (s && *s == "auto") return "";
  return check_format_name(v);
}

std::string check_loss_scale(const ParamValue& v) {
  const auto* s = std::get_if<std::string>(&v);
  if (!s) return "expected a string";
  try {
    TrainSpec spec;
    parse_loss_scale(*s, spec);
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

ParamSpec loss_scale_param() {
  ParamSpec spec = string_param("loss_scale", "none",
                                "none, a constant S (a positive number, quoted or not: 128 or \"128\"), or dynamic",
                                {}, check_loss_scale);
  spec.numbers_as_text = true;
  return spec;
}

// "" when the point's unit takes its act_format as input format, else why not (asked of
// emu, which builds it).
std::string check_unit_accepts(const Params& p, const TrainSpec& spec) {
  try {
    (void)emu::make_unit(spec.unit, spec.act_format);
  } catch (const std::invalid_argument& e) {
    return "unit " + p.string("unit") + " does not accept act_format " + p.string("act_format") +
           " (its matmul input format): " + e.what();
  }
  return "";
}

// (append: gcc 12 warns falsely (-Wrestrict) on "l" + std::to_string(...).)
std::vector<std::string> layer_names() {
  std::vector<std::string> names;
  for (int l = 1; l <= kMaxLayers; ++l) names.push_back(std::string("l").append(std::to_string(l)));
  for (int b = 1; b < kMaxLayers; ++b) names.push_back(std::string("bn").append(std::to_string(b)));
  return names;
}

}  // namespace

std::vector<ParamSpec> data_param_specs() {
  return {
      string_param("data", "synthetic",
                   "'synthetic' (Gaussian clusters from the seed), 'teacher' (N(0,1) inputs labelled by a fixed "
                   "random ReLU network from the seed), or the path of an HDF5 file (relative to sweep's current "
                   "directory) with x [N, D] or images [N, C, H, W] float32, y [N] integer labels >= 0 and "
                   "optionally its own test split x_test, y_test (scripts/make_fashion_mnist_h5.py, "
                   "scripts/make_digits_h5.py), checked before any run"),
      int_param("samples", 2048, "synthetic and teacher: number of samples", 20, 1e7),
      int_param("features", 32, "synthetic and teacher: input dimension", 1, 1e5),
      int_param("classes", 10, "synthetic and teacher: number of classes", 2, 1000),
      real_param("noise", 1.5, "synthetic: standard deviation of samples around their class centre (teacher: unused)",
                 0.0),
      real_param("test_fraction", 0.2,
                 "share of samples held out for testing (a fixed split per seed); a data file with its own test "
                 "split (x_test, y_test) keeps that split and ignores this",
                 0.01, 0.99),
      int_param("train_samples", 0, "use the first N samples of the training split only (0 = all)", 0, 1e9),
      int_param("test_samples", 0, "use the first N samples of the test split only (0 = all)", 0, 1e9),
  };
}

std::vector<ParamSpec> run_param_specs() {
  return {
      int_param("layers", 2, "Linear layers: 2 or 3 (all but the last followed by BatchNorm and ReLU)", 2, 3),
      int_param("width1", 32, "width of the first hidden layer", 1, 4096),
      int_param("width2", 32, "width of the second hidden layer (layers: 3)", 1, 4096),
      int_param("epochs", 5, "passes over the training split", 1, 10000),
      int_param("batch", 32, "batch size (the last incomplete batch of an epoch is dropped)", 1, 1e6),
      real_param("lr", 0.05, "learning rate", 0.0),
  };
}

namespace {

bool is_builtin_data(const std::string& source) { return source == "synthetic" || source == "teacher"; }

}  // namespace

std::shared_ptr<const data::Split> prepare_data(const Params& p, std::uint64_t seed, Standardisation how) {
  // check_point accepted this point, but a data file may have changed or vanished since.
  if (std::string problem = check_data_and_batch(p); !problem.empty()) throw BadInput(problem);
  const std::string& source = p.string("data");
  data::Split s;
  if (is_builtin_data(source)) {
    data::SyntheticSpec spec{static_cast<int>(p.integer("samples")), static_cast<int>(p.integer("features")),
                             static_cast<int>(p.integer("classes")), p.real("noise"), seed};
    s = data::split(source == "teacher" ? data::make_teacher(spec) : data::make_synthetic(spec),
                    p.real("test_fraction"), seed);
  } else {
    std::shared_ptr<const data::DataFile> file;
    try {
      file = data::load_h5(source);
    } catch (const std::invalid_argument& e) {
      throw BadInput(e.what());  // changed again since the check above
    }
    s = file->test ? data::Split{file->samples, *file->test} : data::split(file->samples, p.real("test_fraction"), seed);
  }
  s.train = data::first_samples(s.train, static_cast<std::size_t>(p.integer("train_samples")));
  s.test = data::first_samples(s.test, static_cast<std::size_t>(p.integer("test_samples")));
  if (how == Standardisation::per_channel)
    data::standardise_channels(s);
  else
    data::standardise(s);
  return std::make_shared<const data::Split>(std::move(s));
}

namespace {

// The sizes of the two splits a point trains and tests on, and how to name the data in
// messages; throws std::invalid_argument for a bad data file.
struct SplitSizes {
  std::size_t rows = 0;   // samples before the split (the file's x or the built-in set)
  bool own_test = false;  // the file has its own test split
  std::size_t train = 0, test = 0;
  std::string of;  // "the 1797 samples in data file 'F'"
};

SplitSizes split_sizes(const Params& p) {
  const std::string& source = p.string("data");
  SplitSizes s;
  if (is_builtin_data(source)) {
    s.rows = static_cast<std::size_t>(p.integer("samples"));
  } else {
    const std::shared_ptr<const data::DataFile> file = data::load_h5(source);  // validates; cached by path
    s.rows = file->samples.size();
    if (file->test) {
      s.own_test = true;
      s.train = s.rows;
      s.test = file->test->size();
    }
  }
  s.of = "the " + std::to_string(s.rows) + " samples" + (is_builtin_data(source) ? "" : " in data file '" + source + "'");
  if (!s.own_test) {
    s.test = data::test_size(s.rows, p.real("test_fraction"));
    s.train = s.test < s.rows ? s.rows - s.test : 0;
  }
  const auto keep = [](std::size_t n, std::int64_t first) {
    return first > 0 ? std::min(n, static_cast<std::size_t>(first)) : n;
  };
  s.train = keep(s.train, p.integer("train_samples"));
  s.test = keep(s.test, p.integer("test_samples"));
  return s;
}

}  // namespace

std::int64_t planned_steps(const Params& p) {
  const SplitSizes s = split_sizes(p);
  return p.integer("epochs") * static_cast<std::int64_t>(s.train / static_cast<std::size_t>(p.integer("batch")));
}

std::string check_data_and_batch(const Params& p) {
  SplitSizes s;
  try {
    s = split_sizes(p);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  if (!s.own_test && (s.test < 1 || s.test >= s.rows))
    return "test_fraction " + to_string(p.at("test_fraction")) + " of " + s.of +
           " leaves an empty training or test split";
  if (static_cast<std::size_t>(p.integer("batch")) > s.train)
    return "batch " + std::to_string(p.integer("batch")) + " is larger than the training split: " +
           std::to_string(s.train) + " of " + s.of +
           (s.own_test ? std::string(" (its own training split") : " (test_fraction " + to_string(p.at("test_fraction"))) +
           (p.integer("train_samples") > 0 ? ", train_samples " + std::to_string(p.integer("train_samples")) : "") + ")";
  return "";
}

void read_run_params(const Params& p, TrainSpec& spec) {
  spec.hidden = {static_cast<int>(p.integer("width1"))};
  if (p.integer("layers") == 3) spec.hidden.push_back(static_cast<int>(p.integer("width2")));
  spec.epochs = static_cast<int>(p.integer("epochs"));
  spec.batch = static_cast<int>(p.integer("batch"));
  spec.lr = p.real("lr");
}

namespace {

// Layer counts of the point's model: the weight layers and batch norms that the
// per-layer metrics and histograms cover (at most kMaxLayers and kMaxLayers - 1, the
// first in forward order), and the batch-norm layers.
struct LayerCounts {
  std::int64_t recorded, batch_norms;
};
LayerCounts layer_counts(const Params& p) {
  switch (p.choice<ModelKind>("model", kModelNames)) {
    case ModelKind::mlp: return {2 * p.integer("layers") - 1, p.integer("layers") - 1};
    case ModelKind::convnet: return {2 * kMaxLayers - 1, 2};
    case ModelKind::resnet: return {2 * kMaxLayers - 1, 6 * p.integer("resnet_blocks") + 1};
  }
  return {0, 0};
}

// "" when the point's model can take its data: the convolutional models need images
// (convnet: at least 4x4).
std::string check_model_data(const Params& p) {
  const std::string& model = p.string("model");
  if (model == "mlp") return "";
  const std::string& source = p.string("data");
  if (is_builtin_data(source))
    return "model " + model + " needs images: data must be an HDF5 file with x [N, C, H, W] (" + source +
           " data are flat vectors)";
  std::shared_ptr<const data::DataFile> file;
  try {
    file = data::load_h5(source);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  const data::Dataset& d = file->samples;
  if (!d.is_image())
    return "model " + model + " needs images x [N, C, H, W], but data file '" + source + "' holds flat samples x [N, " +
           std::to_string(d.features) + "] (scripts/make_digits_h5.py writes the digits as [N, 1, 8, 8])";
  if (model == "convnet" && (d.height < 4 || d.width < 4))
    return "model convnet needs images of at least 4x4 (two 2x2 poolings), but data file '" + source + "' holds " +
           d.sample_shape();
  return "";
}

// The point's names parsed, once: the typed TrainSpec that check_point and the run share.
TrainSpec train_spec(const Params& p) {
  TrainSpec spec;
  read_run_params(p, spec);
  spec.model = p.choice<ModelKind>("model", kModelNames);
  spec.conv_width1 = static_cast<int>(p.integer("width1"));
  spec.conv_width2 = static_cast<int>(p.integer("width2"));
  spec.resnet_blocks = static_cast<int>(p.integer("resnet_blocks"));
  spec.resnet_width = static_cast<int>(p.integer("resnet_width"));
  spec.unit = emu::unit_kind_by_name(p.string("unit"));
  spec.rule = p.choice<UpdateRule>("update", kUpdateRuleNames);
  spec.optimizer.kind = p.choice<OptimizerKind>("optimizer", kOptimizerNames);
  spec.optimizer.momentum = p.real("momentum");
  spec.optimizer.beta1 = p.real("beta1");
  spec.optimizer.beta2 = p.real("beta2");
  spec.optimizer.eps = p.real("eps");
  spec.weight_format = emu::format_by_name(p.string("weight_format"));
  spec.act_format = emu::format_by_name(p.string("act_format"));
  spec.grad_format = emu::format_by_name(p.string("grad_format"));
  if (p.string("state_format") != "auto") spec.state_format = emu::format_by_name(p.string("state_format"));
  spec.master_format = emu::format_by_name(p.string("master_format"));
  spec.loss_format = emu::format_by_name(p.string("loss_format"));
  spec.bn_fp32 = p.boolean("bn_fp32");
  spec.bn_arith_fp32 = p.string("bn_format") == "fp32";
  parse_loss_scale(p.string("loss_scale"), spec);
  if (spec.loss_scale == LossScaleKind::dynamic) spec.scale = p.real("ls_init");
  spec.scale_interval = p.integer("ls_interval");
  spec.scale_growth = p.real("ls_growth");
  spec.scale_backoff = p.real("ls_backoff");
  spec.unscale_lr = p.string("unscale") == "lr";
  spec.unscale_format = p.choice<UnscaleFormat>("unscale_format", kUnscaleFormatNames);
  spec.fp_control = with_fp_exceptions(emu::FpControl{}, p);
  spec.esr = p.choice<EsrMode>("esr", kEsrModeNames);
  spec.dp_replicas = static_cast<int>(p.integer("dp_replicas"));
  spec.allreduce_format = emu::format_by_name(p.string("allreduce_format"));
  spec.allreduce_order = p.choice<AllReduceOrder>("allreduce_order", kAllReduceOrderNames);
  spec.grad_accum = static_cast<int>(p.integer("grad_accum"));
  spec.accum_format = emu::format_by_name(p.string("accum_format"));
  return spec;
}

RunResult run_train(const Params& p, const RunEnv& env) {
  const TrainSpec spec = train_spec(p);
  const std::int64_t hist_every = p.integer("hist_every");

  const Standardisation how =
      spec.model == ModelKind::mlp ? Standardisation::per_feature : Standardisation::per_channel;
  Trainer trainer(spec, prepare_data(p, env.stream.seed, how), env.stream.seed, env.stream.replica,
                  emu::StreamId{env.stream.seed, env.stream.point, env.stream.replica, 3});
  RunResult result;
  Trace loss_trace, scale_trace;
  // The layers the per-layer metrics and histograms cover (names declared below).
  std::vector<std::size_t> recorded;
  const std::vector<std::string> declared = layer_names();
  for (std::size_t l = 0; l < trainer.layer_names().size(); ++l)
    if (std::find(declared.begin(), declared.end(), trainer.layer_names()[l]) != declared.end()) recorded.push_back(l);
  std::vector<Trace> hist_traces(recorded.size());
  const std::int64_t total = trainer.steps_per_epoch() * spec.epochs;
  for (std::int64_t s = 0; s < total; ++s) {
    if (env.cancelled()) throw Cancelled();
    if (s == total - trainer.steps_per_epoch()) trainer.reset_window();  // last epoch
    const StepResult r = trainer.step();
    loss_trace.x.push_back(static_cast<double>(s));
    loss_trace.y.push_back(r.loss);
    scale_trace.x.push_back(static_cast<double>(s));
    scale_trace.y.push_back(r.scale);
    if (hist_every > 0 && s % hist_every == 0)
      for (std::size_t l = 0; l < hist_traces.size(); ++l) {
        std::array<std::uint64_t, kHistBins> counts{};
        for (double g : trainer.layer_params()[recorded[l]]->grad) add_to_histogram(counts, g);
        const Histogram h = normalise(counts);
        hist_traces[l].x.insert(hist_traces[l].x.end(), kHistBins, static_cast<double>(s));
        hist_traces[l].y.insert(hist_traces[l].y.end(), h.begin(), h.end());
      }
  }
  result.traces["loss"] = std::move(loss_trace);
  result.traces["loss_scale"] = std::move(scale_trace);
  if (hist_every > 0)
    for (std::size_t l = 0; l < hist_traces.size(); ++l)
      result.traces["grad_hist_" + trainer.layer_names()[recorded[l]]] = std::move(hist_traces[l]);

  const Evaluation train_eval = trainer.evaluate_train(), test_eval = trainer.evaluate_test();
  const Evaluation train64 = trainer.evaluate_train_fp64(), test64 = trainer.evaluate_test_fp64();
  auto& m = result.metrics;
  m["final_train_loss"] = train_eval.loss;
  m["final_train_acc"] = train_eval.accuracy;
  m["final_test_loss"] = test_eval.loss;
  m["final_test_acc"] = test_eval.accuracy;
  m["final_train_loss_fp64"] = train64.loss;
  m["final_train_acc_fp64"] = train64.accuracy;
  m["final_test_loss_fp64"] = test64.loss;
  m["final_test_acc_fp64"] = test64.accuracy;
  m["frac_values_changed"] = trainer.frac_values_changed();
  m["steps"] = static_cast<double>(total);
  m["skipped_steps"] = static_cast<double>(trainer.skipped_steps());
  m["nonfinite_grad_steps"] = static_cast<double>(trainer.nonfinite_grad_steps());
  m["accum_overflow_steps"] = static_cast<double>(trainer.accum_overflow_steps());
  m["allreduce_overflow_steps"] = static_cast<double>(trainer.allreduce_overflow_steps());
  const ReplicaDivergence divergence = trainer.replica_divergence();
  m["replica_max_ulp_diff"] = divergence.max_ulps;
  m["replica_max_rel_diff"] = divergence.max_rel;
  m["replica_frac_differ"] = divergence.frac_differing();
  m["final_loss_scale"] = trainer.loss_scale();
  const UpdateCounts& counts = trainer.update_counts();
  m["frac_lost_updates"] = counts.updates ? static_cast<double>(counts.lost) / static_cast<double>(counts.updates) : kNaN;
  m["effective_lr"] = trainer.effective_lr();
  m["effective_lr_rel_err"] = trainer.effective_lr_error_max();
  std::uint64_t weights = 0, nonfinite = 0;
  for (const ParamRef& w : trainer.params())
    if (w.role == ParamRole::weight)
      for (double v : w.param->value) {
        ++weights;
        if (!std::isfinite(v)) ++nonfinite;
      }
  m["frac_nonfinite_weights"] = static_cast<double>(nonfinite) / static_cast<double>(weights);
  for (const std::string& name : layer_names()) {
    m["frac_zero_grad_" + name] = kNaN;
    m["grad_std_" + name] = kNaN;
  }
  for (std::size_t l : recorded) {
    const GradStats& run = trainer.run_stats[l];
    m["frac_zero_grad_" + trainer.layer_names()[l]] =
        run.count ? static_cast<double>(run.zeros) / static_cast<double>(run.count) : kNaN;
    m["grad_std_" + trainer.layer_names()[l]] = trainer.window_stats[l].std_dev();
  }
  // Batch-norm scales and shifts at the end, of their stored state (the master copy
  // under fp32-master): per layer the standard deviation of the scales across channels
  // and the fraction unchanged since initialisation.
  Trace bn_std, bn_unchanged;
  std::uint64_t scales = 0, scales_unchanged = 0, shifts = 0, shifts_unchanged = 0;
  double std_min = kNaN;
  int layers_unchanged = 0;
  for (const ParamRef& r : trainer.params()) {
    const std::vector<double>& v = r.param->master.empty() ? r.param->value : r.param->master;
    const std::uint64_t same = v.size() - trainer.values_changed(*r.param);
    const double unchanged = static_cast<double>(same) / static_cast<double>(v.size());
    if (r.role == ParamRole::bn_shift) {
      shifts += v.size();
      shifts_unchanged += same;
    }
    if (r.role != ParamRole::bn_scale) continue;
    scales += v.size();
    scales_unchanged += same;
    layers_unchanged += same == v.size();
    double mean = 0.0, squares = 0.0;
    for (double g : v) mean += g / static_cast<double>(v.size());
    for (double g : v) squares += (g - mean) * (g - mean);
    const double sd = std::sqrt(squares / static_cast<double>(v.size()));
    std_min = std::isnan(std_min) ? sd : std::min(std_min, sd);
    const double layer = static_cast<double>(bn_std.x.size() + 1);
    bn_std.x.push_back(layer);
    bn_std.y.push_back(sd);
    bn_unchanged.x.push_back(layer);
    bn_unchanged.y.push_back(unchanged);
  }
  m["bn_scale_std_min"] = std_min;
  m["bn_scale_unchanged"] = scales ? static_cast<double>(scales_unchanged) / static_cast<double>(scales) : kNaN;
  m["bn_shift_unchanged"] = shifts ? static_cast<double>(shifts_unchanged) / static_cast<double>(shifts) : kNaN;
  m["bn_layers_unchanged"] = static_cast<double>(layers_unchanged);
  result.traces["bn_scale_std"] = std::move(bn_std);
  result.traces["bn_scale_unchanged"] = std::move(bn_unchanged);
  result.flags = trainer.flags();
  result.fp_counts = trainer.fp_counts();
  return result;
}

Experiment make_train() {
  Experiment e;
  e.name = "train";
  e.description =
      "an MLP, a convnet or a ResNet with batch norm trained on emulated arithmetic: update strategies, loss scaling, "
      "formats";
  e.params = data_param_specs();
  e.params.push_back(string_param("model", "mlp",
                                  "mlp (Linear -> BatchNorm -> ReLU blocks), convnet ((conv 3x3 -> BatchNorm -> ReLU "
                                  "-> 2x2 max pool) x 2 -> dense) or resnet (depth 6N + 2: stem, 3 stages of N basic "
                                  "blocks, global average pooling, dense); the convolutional models need images",
                                  names_of(kModelNames)));
  for (ParamSpec& s : run_param_specs()) {
    if (s.name == "layers") s.meaning = "mlp: " + s.meaning;
    if (s.name == "width1") s.meaning = "mlp: width of the first hidden layer; convnet: channels of its first convolution";
    if (s.name == "width2")
      s.meaning = "mlp: width of the second hidden layer (layers: 3); convnet: channels of its second convolution";
    e.params.push_back(std::move(s));
  }
  e.params.push_back(int_param("resnet_blocks", 1,
                               "resnet: N, basic blocks per stage (depth 6N + 2: 1 = ResNet-8, 2 = 14, 3 = 20, 4 = 26)",
                               1, 18));
  e.params.push_back(int_param("resnet_width", 16, "resnet: channels of the stem and the first stage (then x2, x4)", 1, 1024));
  const std::vector<ParamSpec> more = {
      string_param("unit", "fp32-seq",
                   "matrix unit for every matmul, training and evaluation (input format = act_format; a unit "
                   "that does not take act_format is refused before any run)",
                   {},
                   check_unit_name),
      string_param("update", "fp32",
                   "update strategy; fp32 = every tensor fp32 on fp32-seq, whatever the format and unit params say",
                   names_of(kUpdateRuleNames)),
      string_param("optimizer", "sgd", "optimiser", names_of(kOptimizerNames)),
      real_param("momentum", 0.9, "momentum coefficient", 0.0, 1.0),
      real_param("beta1", 0.9, "adam: first-moment decay", 0.0, 1.0),
      real_param("beta2", 0.999, "adam: second-moment decay", 0.0, 1.0),
      real_param("eps", 1e-8, "adam: epsilon, rounded into the update arithmetic's format", 0.0),
      string_param("weight_format", "fp16", "weights as stored (fp16-*) or as the compute copy (fp32-master)", {},
                   check_format_name),
      string_param("act_format", "fp16", "activations", {}, check_format_name),
      string_param("grad_format", "fp16", "activation and weight gradients", {}, check_format_name),
      string_param("state_format", "auto", "optimiser state; auto = the update arithmetic's format", {},
                   check_format_or_auto),
      string_param("master_format", "fp32", "fp32-master: the master copy and its update arithmetic", {},
                   check_format_name),
      string_param("loss_format", "fp32", "softmax, loss and loss gradient", {}, check_format_name),
      bool_param("bn_fp32", false,
                 "batch-norm arithmetic, parameters and running statistics in fp32 (false: in act_format forward, "
                 "grad_format backward)"),
      string_param("bn_format", "auto",
                   "batch-norm arithmetic (statistics, normalisation, backward reductions): auto = act_format forward "
                   "and grad_format backward, or fp32 with the parameters still in their formats, as libraries compute "
                   "a half-precision batch norm (popnn's batchNormStatistics reduces with float partials by default; "
                   "cuDNN keeps float statistics); bn_fp32 implies fp32",
                   {"auto", "fp32"}),
      loss_scale_param(),
      real_param("ls_init", 65536.0, "dynamic: initial loss scale", 0.0),
      int_param("ls_interval", 2000, "dynamic: clean steps before the scale grows", 1, 1e12),
      real_param("ls_growth", 2.0, "dynamic: growth factor", 1.0),
      real_param("ls_backoff", 0.5, "dynamic: back-off factor on inf/NaN", 0.0, 1.0),
      string_param("unscale", "grads", "divide gradients by S, or fold 1/S into the learning rate", {"grads", "lr"}),
      string_param("unscale_format", "auto",
                   "format the division by S (of each gradient, or of lr under unscale: lr) is rounded in before "
                   "the result goes into the update arithmetic: auto = the update arithmetic's format (fp32 for "
                   "fp32-master, the weight format for fp16-*), fp32, or compute = the gradient's own format "
                   "(grad_format; fp32 for batch-norm parameters under bn_fp32)",
                   names_of(kUnscaleFormatNames)),
      int_param("hist_every", 0, "record gradient histograms every k steps (0 = never)", 0, 1e9),
      string_param("esr", "off",
                   "the IPU's stochastic rounding ($FP_CTL.ESR) during training, as Graphcore's "
                   "StochasticRoundingBehaviour: off = round to nearest (the update rule fp16-sr still rounds its weight "
                   "update stochastically, with random bits shared by the data-parallel replicas); on = every operation of the training steps rounds stochastically "
                   "into its format (conversions, batch norm, loss, the AMP's fp16 partials and results, "
                   "accumulation, all-reduce, unscaling, the optimiser and the weight update, so fp16-rn updates "
                   "round stochastically too), each data-parallel replica drawing its own random bits; "
                   "replica_identical_only = only the all-reduce and the update after it (operations whose inputs "
                   "are the same on every replica) round stochastically, with random bits shared by the replicas, "
                   "the rest to nearest, so the replicas stay bit-identical; the tensor cores keep their own "
                   "rounding; the evaluation rounds to nearest",
                   names_of(kEsrModeNames)),
      int_param("dp_replicas", 1,
                "data-parallel replicas R, run one after the other: each takes its contiguous share (batch / R "
                "samples) of every batch, computes gradients on its own copy of the model, the gradients are "
                "all-reduced (allreduce_format, allreduce_order) and each replica updates its own copy; batch must "
                "be a multiple of R x grad_accum; metrics describe replica 0",
                1, 256),
      string_param("allreduce_format", "fp32",
                   "dp_replicas > 1: the all-reduce's data type: each replica's gradient is rounded into it and every "
                   "partial sum is rounded into it (the update: fp32 baseline reduces in fp32)",
                   {}, check_format_name),
      string_param("allreduce_order", "ring",
                   "dp_replicas > 1: the all-reduce's summation order: ring (reduce-scatter of a ring all-reduce: "
                   "chunk c of R contiguous chunks summed in replica order c, c+1, ..., c+R-1 mod R) or tree "
                   "(pairwise: (g0 + g1) + (g2 + g3) ...)",
                   names_of(kAllReduceOrderNames)),
      int_param("grad_accum", 1,
                "micro-batches M per optimiser step: `batch` stays the samples of one step, each replica's share "
                "is cut into M micro-batches of batch / (dp_replicas x M) samples, whose gradients (times the loss "
                "scale) are summed in an accum_format buffer before the update divides by S x dp_replicas x M",
                1, 65536),
      string_param("accum_format", "fp32",
                   "grad_accum > 1: the accumulation buffer's format (every addition rounded into it; the update: "
                   "fp32 baseline accumulates in fp32)",
                   {}, check_format_name),
  };
  e.params.insert(e.params.end(), more.begin(), more.end());
  for (ParamSpec& s : fp_exception_params()) e.params.push_back(std::move(s));
  const std::string in_model =
      " of the final model in its own arithmetic (matmuls through the unit in act_format, batch norm in inference "
      "mode with its running statistics in the batch-norm format, logits in act_format, cross-entropy in "
      "loss_format; the mean over samples in fp64)";
  const std::string in_fp64 =
      " of the final weights in fp64 arithmetic, nothing rounded; batch norm normalising with the evaluated split's "
      "own statistics (mlp) or with the running statistics (convnet, resnet: the split's own statistics would need "
      "every activation of the split at once)";
  e.metrics = {
      {"final_train_loss", "mean cross-entropy on the training split" + in_model},
      {"final_train_acc", "accuracy on the training split" + in_model + "; samples with a non-finite logit count "
                          "as wrong"},
      {"final_test_loss", "mean cross-entropy on the test split" + in_model},
      {"final_test_acc", "accuracy on the test split" + in_model + "; samples with a non-finite logit count as "
                         "wrong"},
      {"final_train_loss_fp64", "mean cross-entropy on the training split" + in_fp64},
      {"final_train_acc_fp64", "accuracy on the training split" + in_fp64},
      {"final_test_loss_fp64", "mean cross-entropy on the test split" + in_fp64},
      {"final_test_acc_fp64", "accuracy on the test split" + in_fp64},
      {"steps", "optimiser steps attempted"},
      {"skipped_steps", "steps skipped by dynamic loss scaling (inf/NaN in a gradient)"},
      {"nonfinite_grad_steps", "steps whose gradient entering the update (after accumulation and all-reduce) held "
                               "an inf or NaN: skipped under dynamic scaling, applied as they are otherwise"},
      {"accum_overflow_steps", "of nonfinite_grad_steps, those where a replica's accumulation buffer (grad_accum > "
                               "1) turned micro-batch gradients that were all finite into an inf or NaN"},
      {"allreduce_overflow_steps", "of nonfinite_grad_steps, those where the all-reduce (dp_replicas > 1) turned "
                                   "gradients that were all finite into an inf or NaN"},
      {"replica_max_ulp_diff", "the largest spread of a trainable value's stored state (master copy for "
                               "fp32-master) across the data-parallel replicas at the end, from the smallest to "
                               "the largest copy in ulps of its format (steps between their encodings); 0 for one "
                               "replica, inf where some copies are NaN or infinite and others not"},
      {"replica_max_rel_diff", "the largest spread of a trainable value across the replicas at the end, relative "
                               "to the largest magnitude among its copies"},
      {"replica_frac_differ", "fraction of the trainable values (weights, biases, batch-norm gamma and beta) "
                              "whose copies are not all equal across the replicas at the end"},
      {"final_loss_scale", "loss scale after the last step (1 without loss scaling)"},
      {"frac_lost_updates", "non-zero finite updates (all parameters, all applied steps) that left the stored state "
                            "unchanged: the weight (fp32, fp16-rn, fp16-sr), the master weight (fp32-master), or "
                            "both the weight and its compensation (fp16-kahan); swamping. NaN when no update was "
                            "non-zero (e.g. an lr/S that rounded to 0)"},
      {"frac_values_changed", "fraction of all trainable values (weights, bias, gamma, beta) whose stored state "
                              "(master copy for fp32-master) differs from its initial value at the end; 0 = the "
                              "model never moved"},
      {"effective_lr", "learning rate as the weight update arithmetic held it in the last step (lr/S for unscale: lr)"},
      {"effective_lr_rel_err", "largest relative rounding error of lr/S in the update format (1 = underflow to 0)"},
      {"frac_nonfinite_weights", "fraction of final weights (Linear, convolution and dense layers; not biases or "
                                 "batch-norm parameters) that are inf or NaN"},
      {"bn_scale_std_min", "the smallest, over batch-norm layers, standard deviation of the layer's scales (gamma) "
                           "across channels at the end, of their stored state (master copy for fp32-master); 0 = "
                           "some layer's scales are all equal (all still 1: never moved)"},
      {"bn_scale_unchanged", "fraction of all batch-norm scales (gamma; they start at 1) whose stored state equals "
                             "its initial value at the end"},
      {"bn_shift_unchanged", "the same for the batch-norm shifts (beta; they start at 0)"},
      {"bn_layers_unchanged", "batch-norm layers whose every scale equals its initial value at the end"},
  };
  const std::string which = " (l<k>: the k-th weight layer in forward order, bn<k>: the k-th batch norm's gamma)";
  for (const std::string& name : layer_names()) {
    e.metrics.push_back({"frac_zero_grad_" + name,
                         "fraction of " + name + " weight-gradient values exactly zero (underflow or dead units), "
                         "all applied steps; NaN if the layer is absent" + which});
    e.metrics.push_back({"grad_std_" + name, "standard deviation of " + name +
                                                 " weight gradients (divided by S; with dp_replicas R or grad_accum M, the sum of the R M "
                                                 "micro-batch gradients divided by S R M), pooled over the last epoch"});
  }
  e.headline_metric = "final_test_acc";
  e.traces = {{"loss", "mean batch loss as computed, per step (with dp_replicas or grad_accum: the mean, in fp64, "
                       "of the micro-batches' losses)"},
              {"loss_scale", "loss scale used, per step"},
              {"bn_scale_std", "per batch-norm layer in forward order, at the end: the standard deviation of its "
                               "scales (gamma) across channels, of their stored state (master copy for fp32-master)",
               "bn_layer"},
              {"bn_scale_unchanged", "per batch-norm layer in forward order, at the end: the fraction of its scales "
                                     "whose stored state equals its initial value 1",
               "bn_layer"}};
  for (const std::string& name : layer_names())
    e.traces.push_back({"grad_hist_" + name,
                        "every hist_every steps, 58 fractions of " + name +
                            " weight gradients (times S; with dp_replicas R or grad_accum M, the sum of the R M "
                            "micro-batch gradients that enters the update): zero, [2^e, 2^(e+1)) for e = -40..15 (clamped), "
                            "non-finite; x repeats the step 58 times"});
  e.run = run_train;
  e.check_point = [](const Params& p) -> std::string {
    const TrainSpec spec = train_spec(p);
    if (spec.optimizer.kind == OptimizerKind::adam && spec.unscale_lr)
      return "unscale: lr does not apply to adam (its step m/sqrt(v) does not scale with the gradient)";
    if (spec.rule != UpdateRule::fp32) {  // the baseline ignores unit and formats
      if (std::string problem = check_unit_accepts(p, spec); !problem.empty()) return problem;
    }
    if (std::string problem = check_model_data(p); !problem.empty()) return problem;
    const std::int64_t micro_batches = p.integer("dp_replicas") * p.integer("grad_accum");
    if (p.integer("batch") % micro_batches != 0)
      return "batch " + std::to_string(p.integer("batch")) + " is not a multiple of dp_replicas " +
             std::to_string(p.integer("dp_replicas")) + " x grad_accum " + std::to_string(p.integer("grad_accum")) +
             " = " + std::to_string(micro_batches) + " (each micro-batch holds batch / (dp_replicas x grad_accum) "
             "samples)";
    return check_data_and_batch(p);
  };
  // loss and loss_scale: one sample per step; grad_hist_<layer>: kHistBins per recorded
  // step for each recorded layer (mlp: the 2 * layers - 1 weight layers l1..lL,
  // bn1..bn(L-1); convnet and resnet: l1..l3, bn1, bn2); bn_scale_*: one per batch norm.
  e.trace_length = [](const Params& p) -> std::int64_t {
    const std::int64_t steps = planned_steps(p), every = p.integer("hist_every");
    const std::int64_t histograms = every == 0 ? 0 : (steps + every - 1) / every;
    const LayerCounts layers = layer_counts(p);
    return 2 * steps + layers.recorded * kHistBins * histograms + 2 * layers.batch_norms;
  };
  e.fp_exceptions_note =
      "scopes: init (initial weights and the training inputs rounded into their formats), forward.<layer>, loss "
      "(softmax cross-entropy and its gradient), backward.<layer> (dense layers and convolutions: "
      "backward.<layer>.bias|dw|dx), accumulate.<tensor> (grad_accum > 1: adding a micro-batch's gradient into "
      "the buffer), allreduce.<tensor> (dp_replicas > 1: rounding into allreduce_format and the partial sums), "
      "update.<tensor> (unscaling, optimiser and the update rule), evaluate.train.* "
      "and evaluate.test.* (the final evaluation in the model's arithmetic: input, the layers, loss). Layers: mlp "
      "l<k> (Linear k through the unit), bn<k> (batch norm and ReLU); convnet conv<k>, bn<k>, dense; resnet "
      "stem.conv, stem.bn, stage<s>.block<b>.conv1|bn1|conv2|bn2|shortcut|add (backward: add sums the gradients of "
      "the two paths at the block input), pool (global average pooling), dense. Tensors: mlp l<k>, l<L>.bias, "
      "bn<k>.gamma, bn<k>.beta; convnet conv<k>, bn<k>.gamma|beta, dense, dense.bias; resnet the layer names above "
      "with .gamma|.beta for batch norms. Elements: (sample, channel, row, column) for images, (sample, channel or "
      "class), (channel), or a tensor's flat index in accumulate.*, allreduce.* and update.*; the unit's own "
      "operations (fma, amp, mma, ...) carry the elements the unit reports; samples are counted within a "
      "micro-batch. Counts add up over all steps and over the data-parallel replicas (replica 0's first, so the "
      "first element is the first replica's that raised it). The baseline "
      "(update: fp32) counts and traps in fp32 like any other";
  return e;
}

const Registration registration(make_train());

}  // namespace

}  // namespace roundoff::train
