// Emulated training throughput of the digits MLP (64 -> 32 -> BatchNorm -> ReLU -> 10,
// batch 32, SGD lr 0.05, loss scale 128; configs/train_digits.yaml) per matrix unit,
// single thread, as samples/s and as a ratio to the same model written in plain float32
// C++ and trained on the same data in the same run; then the cost of fp_exceptions: count
// (a training step counting over the same step with it off, trained in turn, per unit and
// loss scaling, up to overflows in every step); then the convolutional models (convnet
// with 16 and 16 channels, ResNet-8 of width 16) on 28x28 images per unit, against the
// same models in float32 with im2col + sgemm (benchmarks/float_convnets.hpp), single
// thread and then at 1 and 2 threads by wall time, and the projected time of one
// Fashion-MNIST epoch of the convnet on ipu-amp on 2 threads. The single-thread times are
// thread CPU time, so that other work on a shared machine does not enter the ratios.
// Never fails on speed.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include <tbb/global_control.h>
#include <tbb/info.h>

#include "emu/amp.hpp"
#include "emu/unit.hpp"
#include "experiments/data_file.hpp"
#include "experiments/experiment.hpp"
#include "experiments/nn/mlp.hpp"
#include "float_convnets.hpp"

namespace {

using roundoff::data::Dataset;
using roundoff::data::Split;

constexpr int kHidden = 32, kBatch = 32;
constexpr double kLearningRate = 0.05;
constexpr std::uint64_t kSeed = 2026;
constexpr double kStepCpuBudget = 5.0;  // seconds of CPU per unit at most
constexpr int kMaxSteps = 300, kMinSteps = 10;

// The units measured: those named after the data file on the command line, else all.
std::vector<std::string> selected_units;
bool measured(const std::string& unit) {
  return selected_units.empty() || std::find(selected_units.begin(), selected_units.end(), unit) != selected_units.end();
}
std::vector<const char*> units_to_measure() {
  std::vector<const char*> units;
  for (const char* const* name = emu::unit_names(); *name; ++name)
    if (measured(*name)) units.push_back(*name);
  return units;
}

double cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

// Samples/s over all steps and over the fastest chunk of kChunkSteps consecutive steps:
// even thread CPU time varies by some 20% between runs on a loaded machine (shared
// caches), and the best chunk is the steadier figure for the ratios.
class Throughput {
 public:
  static constexpr int kChunkSteps = 30;
  explicit Throughput(int batch = kBatch) : batch_(batch) {}
  void add_step(double seconds) {
    total_ += seconds;
    chunk_ += seconds;
    if (++steps_ % kChunkSteps == 0) {
      best_chunk_ = std::min(best_chunk_, chunk_);
      chunk_ = 0.0;
    }
  }
  int steps() const { return steps_; }
  double cpu_seconds() const { return total_; }
  double mean() const { return steps_ * batch_ / total_; }
  double best() const { return steps_ < kChunkSteps ? mean() : kChunkSteps * batch_ / best_chunk_; }

 private:
  int batch_;
  int steps_ = 0;
  double total_ = 0.0, chunk_ = 0.0, best_chunk_ = 1e300;
};

// The same model in native float: hidden Linear without bias, batch norm in training
// mode (batch statistics, eps 1e-5), ReLU, Linear with bias, softmax cross-entropy,
// plain SGD. No loss scaling: float32 needs none at this size.
class FloatMlp {
 public:
  FloatMlp(int inputs, int hidden, int classes, unsigned seed)
      : in_(inputs), hid_(hidden), cls_(classes), w1_(inputs * hidden), w2_(hidden * classes),
        gamma_(hidden, 1.0f), beta_(hidden, 0.0f), b2_(classes, 0.0f) {
    std::mt19937 gen(seed);
    std::normal_distribution<float> n1(0.0f, std::sqrt(2.0f / inputs)), n2(0.0f, std::sqrt(2.0f / hidden));
    for (float& v : w1_) v = n1(gen);
    for (float& v : w2_) v = n2(gen);
  }

  // One SGD step on a batch (x: batch x inputs); returns the mean batch loss.
  float step(const float* x, const int* y, int batch, float lr) {
    const int B = batch, D = in_, H = hid_, C = cls_;
    h_.assign(B * H, 0.0f);
    for (int i = 0; i < B; ++i)
      for (int p = 0; p < D; ++p) {
        const float a = x[i * D + p];
        for (int j = 0; j < H; ++j) h_[i * H + j] += a * w1_[p * H + j];
      }
    xhat_.resize(B * H);
    z_.resize(B * H);
    inv_std_.resize(H);
    for (int j = 0; j < H; ++j) {
      float mean = 0.0f, var = 0.0f;
      for (int i = 0; i < B; ++i) mean += h_[i * H + j];
      mean /= static_cast<float>(B);
      for (int i = 0; i < B; ++i) var += (h_[i * H + j] - mean) * (h_[i * H + j] - mean);
      var /= static_cast<float>(B);
      inv_std_[j] = 1.0f / std::sqrt(var + 1e-5f);
      for (int i = 0; i < B; ++i) {
        xhat_[i * H + j] = (h_[i * H + j] - mean) * inv_std_[j];
        z_[i * H + j] = gamma_[j] * xhat_[i * H + j] + beta_[j];
      }
    }
    act_.resize(B * H);
    for (int k = 0; k < B * H; ++k) act_[k] = std::max(z_[k], 0.0f);
    logits_.assign(B * C, 0.0f);
    for (int i = 0; i < B; ++i) {
      for (int c = 0; c < C; ++c) logits_[i * C + c] = b2_[c];
      for (int p = 0; p < H; ++p) {
        const float a = act_[i * H + p];
        for (int c = 0; c < C; ++c) logits_[i * C + c] += a * w2_[p * C + c];
      }
    }
    // Softmax cross-entropy; dlogits = (softmax - onehot) / B.
    float loss = 0.0f;
    for (int i = 0; i < B; ++i) {
      float* l = &logits_[i * C];
      const float top = *std::max_element(l, l + C);
      float sum = 0.0f;
      for (int c = 0; c < C; ++c) sum += std::exp(l[c] - top);
      loss += std::log(sum) + top - l[y[i]];
      for (int c = 0; c < C; ++c) l[c] = std::exp(l[c] - top) / sum / static_cast<float>(B);
      l[y[i]] -= 1.0f / static_cast<float>(B);
    }
    // Backward.
    dact_.assign(B * H, 0.0f);
    for (int i = 0; i < B; ++i)
      for (int p = 0; p < H; ++p) {
        float s = 0.0f;
        for (int c = 0; c < C; ++c) s += logits_[i * C + c] * w2_[p * C + c];
        dact_[i * H + p] = z_[i * H + p] > 0.0f ? s : 0.0f;  // through ReLU
      }
    for (int p = 0; p < H; ++p)
      for (int c = 0; c < C; ++c) {
        float g = 0.0f;
        for (int i = 0; i < B; ++i) g += act_[i * H + p] * logits_[i * C + c];
        w2_[p * C + c] -= lr * g;
      }
    for (int c = 0; c < C; ++c) {
      float g = 0.0f;
      for (int i = 0; i < B; ++i) g += logits_[i * C + c];
      b2_[c] -= lr * g;
    }
    // Batch norm: dh = inv_std / B * (B dxhat - sum dxhat - xhat sum(dxhat xhat)).
    for (int j = 0; j < H; ++j) {
      float dgamma = 0.0f, dbeta = 0.0f;
      for (int i = 0; i < B; ++i) {
        dgamma += dact_[i * H + j] * xhat_[i * H + j];
        dbeta += dact_[i * H + j];
      }
      const float sum_dxhat = gamma_[j] * dbeta, sum_dxhat_xhat = gamma_[j] * dgamma;
      for (int i = 0; i < B; ++i)
        h_[i * H + j] = inv_std_[j] / static_cast<float>(B) *
                        (static_cast<float>(B) * gamma_[j] * dact_[i * H + j] - sum_dxhat -
                         xhat_[i * H + j] * sum_dxhat_xhat);
      gamma_[j] -= lr * dgamma;
      beta_[j] -= lr * dbeta;
    }
    for (int p = 0; p < D; ++p)
      for (int j = 0; j < H; ++j) {
        float g = 0.0f;
        for (int i = 0; i < B; ++i) g += x[i * D + p] * h_[i * H + j];
        w1_[p * H + j] -= lr * g;
      }
    return loss / static_cast<float>(B);
  }

 private:
  int in_, hid_, cls_;
  std::vector<float> w1_, w2_, gamma_, beta_, b2_;
  std::vector<float> h_, xhat_, z_, inv_std_, act_, logits_, dact_;  // reused per step
};

// Trains the float model on the training split in the Trainer's manner (a fresh
// permutation per epoch, the last incomplete batch dropped); returns samples/s.
Throughput run_float_reference(const Dataset& train, int steps, bool print_loss) {
  FloatMlp model(train.features, kHidden, train.classes, static_cast<unsigned>(kSeed));
  std::mt19937 gen(static_cast<unsigned>(kSeed) + 1);
  std::vector<std::size_t> order(train.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  const int per_epoch = static_cast<int>(train.size()) / kBatch;
  std::vector<float> x(static_cast<std::size_t>(kBatch) * train.features);
  std::vector<int> y(kBatch);
  Throughput rate;
  double epoch_loss = 0.0;
  for (int s = 0; s < steps; ++s) {
    const int in_epoch = s % per_epoch;
    if (in_epoch == 0) std::shuffle(order.begin(), order.end(), gen);
    for (int i = 0; i < kBatch; ++i) {
      const std::size_t sample = order[static_cast<std::size_t>(in_epoch * kBatch + i)];
      y[i] = train.y[sample];
      std::copy_n(train.x.begin() + static_cast<std::ptrdiff_t>(sample * train.features), train.features,
                  x.begin() + static_cast<std::ptrdiff_t>(i * train.features));
    }
    const double start = cpu_seconds();
    const float loss = model.step(x.data(), y.data(), kBatch, static_cast<float>(kLearningRate));
    rate.add_step(cpu_seconds() - start);
    epoch_loss += loss;
    if (print_loss && (in_epoch == per_epoch - 1)) {
      std::printf("  float32 reference, epoch %d: mean train loss %.4f\n", s / per_epoch + 1, epoch_loss / per_epoch);
      epoch_loss = 0.0;
    }
  }
  return rate;
}

// The digits file if it exists (relative to the working directory, or the path given
// as the first argument), else synthetic data of the same shape.
std::shared_ptr<const Split> load_data(const std::string& path, std::string& source) {
  Split s;
  if (std::filesystem::exists(path)) {
    source = path + " (8x8 digits)";
    s = roundoff::data::split(roundoff::data::load_h5(path)->samples, 0.2, kSeed);
  } else {
    source = "synthetic, 1797 x 64, 10 classes (" + path +
             " not found: run /usr/bin/python3 scripts/make_digits_h5.py, or pass the file's path)";
    s = roundoff::data::split(roundoff::data::make_synthetic({1797, 64, 10, 1.5, kSeed}), 0.2, kSeed);
  }
  roundoff::data::standardise(s);
  return std::make_shared<const Split>(std::move(s));
}

struct Measured {
  Throughput rate;
  double first_loss = 0.0, last_loss = 0.0;  // mean batch loss, first and last epoch's worth of steps
};

// Steps a Trainer until max_steps or kStepCpuBudget (at least min_steps), timing step()
// alone.
Measured measure_trainer(roundoff::train::Trainer& trainer, int batch = kBatch, int min_steps = kMinSteps,
                         int max_steps = kMaxSteps) {
  Measured m{Throughput(batch)};
  std::vector<double> losses;
  while (m.rate.steps() < max_steps && (m.rate.steps() < min_steps || m.rate.cpu_seconds() < kStepCpuBudget)) {
    const double start = cpu_seconds();
    losses.push_back(trainer.step().loss);
    m.rate.add_step(cpu_seconds() - start);
  }
  const auto window = static_cast<std::ptrdiff_t>(std::min<std::int64_t>(m.rate.steps(), trainer.steps_per_epoch()));
  m.first_loss = std::accumulate(losses.begin(), losses.begin() + window, 0.0) / static_cast<double>(window);
  m.last_loss = std::accumulate(losses.end() - window, losses.end(), 0.0) / static_cast<double>(window);
  return m;
}

// Trains the spec with fp_exceptions off and count (as a sweep sets them: the real
// with_fp_exceptions), one step of each in turn, and prints the time ratio.
void report_counting(const std::shared_ptr<const Split>& data, roundoff::train::TrainSpec spec, const std::string& scale) {
  const roundoff::Params count_params({{"fp_exceptions", std::string("count")}, {"oflo", true}, {"div0", true},
                                       {"inv", true}, {"nanoo", false}, {"tininess", std::string("before")}});
  roundoff::train::Trainer off(spec, data, kSeed, 0, emu::StreamId{kSeed, 0, 0, 3});
  spec.fp_control = roundoff::with_fp_exceptions(emu::FpControl{}, count_params);
  roundoff::train::Trainer count(spec, data, kSeed, 0, emu::StreamId{kSeed, 0, 0, 3});
  Throughput off_rate, count_rate;
  bool same_losses = true;

  while (off_rate.steps() < kMaxSteps &&
         (off_rate.steps() < kMinSteps || off_rate.cpu_seconds() + count_rate.cpu_seconds() < kStepCpuBudget)) {
    double start = cpu_seconds();
    const double off_loss = off.step().loss;
    off_rate.add_step(cpu_seconds() - start);
    start = cpu_seconds();
    const double count_loss = count.step().loss;
    count_rate.add_step(cpu_seconds() - start);
    same_losses = same_losses && (off_loss == count_loss || (std::isnan(off_loss) && std::isnan(count_loss)));
  }
  std::uint64_t counted = 0;
  for (const emu::OpCount& c : count.fp_counts()) counted += c.count;
  const double off_ms = 1e3 * kBatch / off_rate.mean(), count_ms = 1e3 * kBatch / count_rate.mean();
  std::printf("%-13s %-14s %6d %12.2f %12.2f %9.3f %9.3f %8llu %s\n", emu::unit_kind_name(spec.unit), scale.c_str(),
              off_rate.steps(), off_ms, count_ms, count_ms / off_ms, off_rate.best() / count_rate.best(),
              static_cast<unsigned long long>(counted / static_cast<std::uint64_t>(count_rate.steps())),
              same_losses ? "yes" : "NO");
  std::fflush(stdout);
}

// The first 2048 training images of Fashion-MNIST if results/fashion_mnist.h5 exists,
// else random normal images of the same shape with random labels (speed does not depend
// on the pixels), standardised per channel.
std::shared_ptr<const Split> load_images(std::string& source) {
  const std::string path = "results/fashion_mnist.h5";
  Split s;
  if (std::filesystem::exists(path)) {
    const auto file = roundoff::data::load_h5(path);
    s = Split{roundoff::data::first_samples(file->samples, 2048), roundoff::data::first_samples(*file->test, 256)};
    source = path + ", the first 2048 training images";
  } else {
    roundoff::data::Dataset d;
    d.channels = 1;
    d.height = d.width = 28;
    d.features = 784;
    d.classes = 10;
    std::mt19937 gen(kSeed);
    std::normal_distribution<float> normal;
    d.x.resize(2304 * 784);
    for (float& v : d.x) v = normal(gen);
    for (int i = 0; i < 2304; ++i) d.y.push_back(i % 10);
    s = roundoff::data::split(d, 256.0 / 2304.0, kSeed);
    source = "random 28x28 images (" + path + " not found: run /usr/bin/python3 scripts/make_fashion_mnist_h5.py)";
  }
  roundoff::data::standardise_channels(s);
  return std::make_shared<const Split>(std::move(s));
}

// Images/s of the float32 reference model, training on the images in batches.
Throughput run_float_conv(floatref::Net& net, const roundoff::data::Dataset& train, int batch, int steps) {
  Throughput rate(batch);
  const int per_epoch = static_cast<int>(train.size()) / batch;
  for (int s = 0; s < steps; ++s) {
    const std::size_t first = static_cast<std::size_t>(s % per_epoch) * batch;
    const double start = cpu_seconds();
    net.step(&train.x[first * train.features], &train.y[first], batch, static_cast<float>(kLearningRate));
    rate.add_step(cpu_seconds() - start);
  }
  return rate;
}

// One row per model: `measure(label)` for the fp32 baseline (update fp32), then for
// every measured unit with fp32-master updates (spec's rule and unit set for each); a
// unit that cannot run the spec gets a "not available" row.
template <class Measure>
void report_each_unit(roundoff::train::TrainSpec& spec, const Measure& measure) {
  auto row = [&](const std::string& label) {
    try {
      measure(label);
    } catch (const std::invalid_argument& e) {
      std::printf("%-16s not available: %s\n", label.c_str(), e.what());
    }
    std::fflush(stdout);
  };
  spec.rule = roundoff::train::UpdateRule::fp32;
  row("fp32 baseline");
  spec.rule = roundoff::train::UpdateRule::fp32_master;
  for (const char* name : units_to_measure()) {
    spec.unit = emu::unit_kind_by_name(name);
    row(name);
  }
}

// Wall seconds per training step on `threads` threads (oneTBB for the emulated layers,
// OpenBLAS for the float32 reference), after one warm-up step: the mean over the steps
// that fit in kWallBudget seconds, at least kMinWallSteps. Wall time, unlike the tables'
// CPU time, counts every thread's work; on a shared machine it also counts the others'.
constexpr double kWallBudget = 3.0;
constexpr int kMinWallSteps = 2;
template <class Step>
double wall_per_step(int threads, const Step& step) {
  const tbb::global_control limit(tbb::global_control::max_allowed_parallelism, static_cast<std::size_t>(threads));
  floatref::use_threads(threads);
  step();
  int steps = 0;
  double elapsed = 0.0;
  const auto start = std::chrono::steady_clock::now();
  while (steps < kMinWallSteps || elapsed < kWallBudget) {
    step();
    ++steps;
    elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  floatref::use_threads(1);
  return elapsed / steps;
}

// Throughput of one convolutional model per unit against its float32 reference.
void bench_conv_model(const std::shared_ptr<const Split>& images, roundoff::train::ModelKind kind) {
  using roundoff::train::ModelKind;
  const bool resnet = kind == ModelKind::resnet;
  const int batch = resnet ? 16 : kBatch;
  const roundoff::data::Dataset& train = images->train;
  std::unique_ptr<floatref::Net> net;
  if (resnet)
    net = std::make_unique<floatref::ResNet>(train.channels, train.height, train.width, train.classes, 1, 16, kSeed);
  else
    net = std::make_unique<floatref::ConvNet>(train.channels, train.height, train.width, train.classes, 16, 16, kSeed);
  run_float_conv(*net, train, batch, 5);  // warm-up
  const Throughput float_rate = run_float_conv(*net, train, batch, resnet ? 60 : 120);
  std::printf("\n%s, batch %d, SGD lr %.2f: float32 reference (%s): %.0f images/s (%.0f best %d-step chunk)\n",
              resnet ? "ResNet-8 (N = 1, width 16)" : "convnet (16 and 16 channels)", batch, kLearningRate,
              floatref::gemm_name(), float_rate.mean(), float_rate.best(), Throughput::kChunkSteps);
  std::printf("%-16s %6s %11s %10s %24s\n", "unit", "steps", "images/s", "emu/float", "loss first -> last steps");
  roundoff::train::TrainSpec spec;
  spec.model = kind;
  spec.conv_width1 = spec.conv_width2 = 16;
  spec.resnet_blocks = 1;
  spec.resnet_width = 16;
  spec.batch = batch;
  spec.lr = kLearningRate;
  roundoff::train::parse_loss_scale("128", spec);
  report_each_unit(spec, [&](const std::string& label) {
    roundoff::train::Trainer trainer(spec, images, kSeed, 0, emu::StreamId{kSeed, 0, 0, 3});
    const tbb::global_control one_thread(tbb::global_control::max_allowed_parallelism, 1);
    const Measured m = measure_trainer(trainer, batch, 2, 60);
    std::printf("%-16s %6d %11.1f %10.4f %14.4f -> %.4f\n", label.c_str(), m.rate.steps(), m.rate.mean(),
                m.rate.mean() / float_rate.mean(), m.first_loss, m.last_loss);
  });

  // The same steps at 1 and 2 threads by wall time: a run computes a layer's images,
  // channels and row blocks in parallel (experiments/nn/layers.hpp), the GEMMs in bands.
  const int cores = tbb::info::default_concurrency();
  if (cores < 2) {
    std::printf("1 and 2 threads: not measured, this process may use %d core\n", cores);
    return;
  }
  std::printf("\n1 and 2 threads, wall ms per step (mean of %d to as many steps as fit in %.0f s; the machine may be "
              "shared),\nspeed-up, and the step's ratio to float32 on as many threads (emu/float: float32's time over "
              "the unit's)\n", kMinWallSteps, kWallBudget);
  std::printf("%-16s %12s %12s %9s %12s %12s\n", "unit", "1 thread ms", "2 threads ms", "speed-up", "emu/float 1",
              "emu/float 2");
  int next_batch = 0;
  const int per_epoch = static_cast<int>(train.size()) / batch;
  auto float_step = [&] {
    const std::size_t first = static_cast<std::size_t>(next_batch++ % per_epoch) * batch;
    net->step(&train.x[first * train.features], &train.y[first], batch, static_cast<float>(kLearningRate));
  };
  const double float_wall[2] = {wall_per_step(1, float_step), wall_per_step(2, float_step)};
  std::printf("%-16s %12.1f %12.1f %8.2fx\n", "float32", 1e3 * float_wall[0], 1e3 * float_wall[1],
              float_wall[0] / float_wall[1]);
  report_each_unit(spec, [&](const std::string& label) {
    roundoff::train::Trainer trainer(spec, images, kSeed, 0, emu::StreamId{kSeed, 0, 0, 3});
    auto step = [&] { trainer.step(); };
    const double wall[2] = {wall_per_step(1, step), wall_per_step(2, step)};
    std::printf("%-16s %12.1f %12.1f %8.2fx %12.4f %12.4f\n", label.c_str(), 1e3 * wall[0], 1e3 * wall[1],
                wall[0] / wall[1], float_wall[0] / wall[0], float_wall[1] / wall[1]);
  });

  if (kind != ModelKind::convnet || !measured("ipu-amp")) return;
  // One Fashion-MNIST epoch of the convnet on ipu-amp on 2 cores (issue 22's figure).
  spec.unit = emu::UnitKind::ipu_amp;
  roundoff::train::Trainer trainer(spec, images, kSeed, 0, emu::StreamId{kSeed, 0, 0, 3});
  constexpr int kEpochSteps = 30;
  const tbb::global_control two_threads(tbb::global_control::max_allowed_parallelism, 2);
  const auto start = std::chrono::steady_clock::now();
  for (int s = 0; s < kEpochSteps; ++s) trainer.step();
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / kEpochSteps;
  const double steps = 60000.0 / batch;
  std::printf("one Fashion-MNIST epoch (60,000 images, %.0f steps) of this convnet on ipu-amp on 2 threads: "
              "%.0f s = %.1f min wall\n  (projected from %d steps, %.3f s each; the machine may be shared)\n",
              steps, wall * steps, wall * steps / 60, kEpochSteps, wall);
}

}  // namespace

int main(int argc, char** argv) {
  // Single thread: training runs may compute a layer's parts in parallel, and the times
  // are the calling thread's CPU time. Lifted for the all-core epoch at the end.
  std::optional<tbb::global_control> single_thread(std::in_place, tbb::global_control::max_allowed_parallelism, 1);
  floatref::use_threads(1);
  std::string source;
  // bench_train [DIGITS.h5 [UNIT ...]]
  for (int i = 2; i < argc; ++i) {
    selected_units.emplace_back(argv[i]);
    if (units_to_measure().size() != selected_units.size()) {
      std::fprintf(stderr, "bench_train: unknown unit '%s' (emu units lists them)\n", argv[i]);
      return 2;
    }
  }
  const std::shared_ptr<const Split> data = load_data(argc > 1 ? argv[1] : "results/digits.h5", source);
  std::printf("Training throughput, digits MLP %d -> %d -> BatchNorm -> ReLU -> %d, batch %d, SGD lr %.2f\n",
              data->train.features, kHidden, data->train.classes, kBatch, kLearningRate);
  std::printf("data: %s, %zu training samples\n", source.c_str(), data->train.size());
  std::printf("single thread; times are thread CPU time (CLOCK_THREAD_CPUTIME_ID), the machine is shared\n");
  std::printf("emulated runs: update fp32-master, fp16 weights/activations/gradients, loss scale 128;\n"
              "  'fp32 baseline' is update rule fp32 (all fp32, fp32-seq unit) in the same emulator\n");

  // The float reference learns (loss per epoch falls), so the comparison is with a
  // working model; then it is timed on as many steps as the largest emulated run.
  const int per_epoch = static_cast<int>(data->train.size()) / kBatch;
  run_float_reference(data->train, 8 * per_epoch, true);
  const Throughput float_rate = run_float_reference(data->train, 20 * kMaxSteps, false);
  std::printf("float32 reference: %.0f samples/s mean, %.0f best %d-step chunk (%d steps)\n\n", float_rate.mean(),
              float_rate.best(), Throughput::kChunkSteps, float_rate.steps());

  std::printf("%-16s %6s %11s %11s %10s %10s %24s\n", "unit", "steps", "samples/s", "(best)", "emu/float", "(best)",
              "loss 1st -> last epoch");
  roundoff::train::TrainSpec spec;
  spec.hidden = {kHidden};
  spec.batch = kBatch;
  spec.lr = kLearningRate;
  roundoff::train::parse_loss_scale("128", spec);
  report_each_unit(spec, [&](const std::string& label) {
    roundoff::train::Trainer trainer(spec, data, kSeed, 0, emu::StreamId{kSeed, 0, 0, 3});
    const Measured m = measure_trainer(trainer);
    std::printf("%-16s %6d %11.0f %11.0f %10.4f %10.4f %14.4f -> %.4f\n", label.c_str(), m.rate.steps(),
                m.rate.mean(), m.rate.best(), m.rate.mean() / float_rate.mean(), m.rate.best() / float_rate.best(),
                m.first_loss, m.last_loss);
  });
  std::printf("\nemu/float: emulated samples/s divided by the float32 reference's (same data, same run);\n"
              "(best): the same from each run's fastest %d-step chunk\n", Throughput::kChunkSteps);

  // fp_exceptions: count against off, the same training interleaved step by step.
  std::printf("\nfp_exceptions count / off: CPU time of a training step counting OFLO, DIV0 and INV per scope and op,\n"
              "over the same step with fp_exceptions off (goal: at most 1.3), both trained in turn in the same run\n");
  std::printf("%-13s %-14s %6s %12s %12s %9s %9s %8s %s\n", "unit", "loss scale", "steps", "off ms/step", "count ms/step",
              "count/off", "(best)", "counted", "same losses");
  spec.rule = roundoff::train::UpdateRule::fp32_master;
  for (const char* unit : {"fp32-seq", "ipu-amp", "ipu-amp-half", "a100"})
    for (const char* scaling : measured(unit) ? std::vector<const char*>{"128", "dynamic/2", "1e9 skip"}
                                              : std::vector<const char*>{}) {
      spec.unit = emu::unit_kind_by_name(unit);
      const std::string how = scaling;
      roundoff::train::parse_loss_scale(how == "128" ? "128" : "dynamic", spec);
      spec.scale = how == "128" ? 128.0 : how == "dynamic/2" ? 65536.0 : 1e9;
      spec.scale_interval = 2;
      spec.scale_backoff = how == "1e9 skip" ? 1.0 : 0.5;
      report_counting(data, spec, how);
    }
  std::printf("(best): from the fastest %d-step chunks; counted: operations counted per step (mean). Loss scale\n"
              "dynamic/2: dynamic from 65536, doubling after 2 clean steps (overflows every few steps); 1e9 skip:\n"
              "dynamic at 1e9 that never backs off (every step overflows and is skipped: the most counting)\n",
              Throughput::kChunkSteps);
  // Counting must leave the AMP's vectorised GEMM on (trapping needs the exact model).
  for (const char* mode : {"off", "count", "trap"}) {
    const roundoff::Params p({{"fp_exceptions", std::string(mode)}, {"oflo", true}, {"div0", true}, {"inv", true},
                              {"nanoo", false}, {"tininess", std::string("before")}});
    const emu::Context ctx(roundoff::with_fp_exceptions(emu::FpControl{}, p));
    std::printf("%sipu-amp vectorised GEMM with fp_exceptions %s: %s", mode == std::string("off") ? "" : ", ", mode,
                emu::amp_gemm_is_vectorised(ctx, emu::amp_config(emu::PartialsType::float32)) ? "yes" : "no");
  }
  std::printf("\n");
  single_thread.reset();  // bench_conv_model limits each measurement itself
  // The convolutional models, per unit, against float32 im2col + sgemm.
  std::string image_source;
  const std::shared_ptr<const Split> images = load_images(image_source);
  std::printf("\nConvolutional models: images/s, single thread, per unit (update fp32-master, fp16 weights, activations\n"
              "and gradients, loss scale 128; 'fp32 baseline' = update fp32 on fp32-seq), against the same model in\n"
              "plain float32 code. Data: %s\n", image_source.c_str());
  bench_conv_model(images, roundoff::train::ModelKind::convnet);
  bench_conv_model(images, roundoff::train::ModelKind::resnet);
  return 0;
}
