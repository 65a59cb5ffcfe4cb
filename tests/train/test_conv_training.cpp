// The convolutional models trained for a few steps on a tiny Fashion-MNIST subset
// (written by scripts/make_fashion_mnist_h5.py) in each precision setup of the shipped
// configs (fashion_mnist_mixed, resnet_sr, bn_fp16), with the orderings those runs show
// asserted: mechanisms (lost updates, unchanged batch-norm scales, skipped steps), not
// accuracies that a few steps cannot settle. Also the scopes the convolutional models
// report their flags under.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <regex>
#include <set>
#include <string>

#include "tests/run_experiment.hpp"

using namespace roundoff;
namespace fs = std::filesystem;

namespace {

// The first 128 training and 64 test images, written once per test process; "" when
// Debian's dataset-fashion-mnist is not installed.
const std::string& fashion_subset() {
  static const std::string path = [] {
    if (!fs::exists("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz")) return std::string();
    const fs::path dir = fs::temp_directory_path() / ("roundoff-conv-test-" + std::to_string(::getpid()));
    fs::create_directories(dir);
    const std::string out = (dir / "fashion_mnist_small.h5").string();
    const std::string command = "/usr/bin/python3 scripts/make_fashion_mnist_h5.py " + out +
                                " --train-samples 128 --test-samples 64 >/dev/null";
    if (std::system(command.c_str()) != 0) throw std::runtime_error("failed: " + command);
    return out;
  }();
  return path;
}

#define REQUIRE_FASHION_SUBSET()                                                                 \
  if (fashion_subset().empty()) {                                                                \
    WARN("skipped: Debian's dataset-fashion-mnist is not installed (scripts/setup installs it)"); \
    return;                                                                                      \
  }

using Overrides = std::map<std::string, ParamValue>;

Overrides with(Overrides base, const Overrides& more) {
  for (const auto& [k, v] : more) base[k] = v;
  return base;
}

RunResult train(const Overrides& p) { return testing::run_experiment("train", p, emu::StreamId{3, 0, 0, 0}); }

double metric(const RunResult& r, const std::string& name) { return r.metrics.at(name); }

}  // namespace

TEST_CASE("fashion_mnist_mixed in small: mixed precision tracks float32, float and half partials",
          "[train][conv]") {
  REQUIRE_FASHION_SUBSET();
  const Overrides base{{"data", fashion_subset()}, {"model", std::string("convnet")}, {"width1", std::int64_t{4}},
                       {"width2", std::int64_t{4}}, {"epochs", std::int64_t{1}}, {"batch", std::int64_t{16}},
                       {"optimizer", std::string("adam")}, {"eps", 1e-4}, {"lr", 0.01},
                       {"loss_scale", std::string("256")}, {"nanoo", true}};
  const RunResult fp32 = train(with(base, {{"update", std::string("fp32")}}));
  const RunResult mixed = train(with(base, {{"update", std::string("fp32-master")}, {"unit", std::string("ipu-amp")}}));
  const RunResult half =
      train(with(base, {{"update", std::string("fp32-master")}, {"unit", std::string("ipu-amp-half")}}));
  for (const RunResult* r : {&fp32, &mixed, &half}) {
    CHECK(metric(*r, "steps") == 8);
    CHECK(metric(*r, "skipped_steps") == 0);
    CHECK(std::isfinite(metric(*r, "final_train_loss")));
    CHECK(metric(*r, "frac_nonfinite_weights") == 0);
  }
  INFO("train loss fp32 " << metric(fp32, "final_train_loss") << ", mixed " << metric(mixed, "final_train_loss")
                          << ", half partials " << metric(half, "final_train_loss"));
  // Eight Adam steps move the loss off log(10) = 2.30 the same way in all three.
  CHECK(metric(mixed, "final_train_loss") == Approx(metric(fp32, "final_train_loss")).epsilon(0.02));
  CHECK(metric(half, "final_train_loss") == Approx(metric(fp32, "final_train_loss")).epsilon(0.02));
  // fp32 master weights keep every update: none is lost in the mixed runs.
  CHECK(metric(mixed, "frac_lost_updates") <= metric(fp32, "frac_lost_updates") + 1e-3);
}

TEST_CASE("resnet_sr in small: stochastic rounding moves fp16 weights that round-to-nearest leaves",
          "[train][conv]") {
  REQUIRE_FASHION_SUBSET();
  const Overrides base{{"data", fashion_subset()}, {"model", std::string("resnet")}, {"resnet_blocks", std::int64_t{1}},
                       {"resnet_width", std::int64_t{4}}, {"test_samples", std::int64_t{32}},
                       {"epochs", std::int64_t{1}}, {"batch", std::int64_t{16}},
                       {"optimizer", std::string("momentum")}, {"lr", 0.05}, {"unscale", std::string("lr")},
                       {"loss_scale", std::string("256")}, {"unit", std::string("ipu-amp")}};
  const RunResult rn = train(with(base, {{"update", std::string("fp16-rn")}}));
  const RunResult sr = train(with(base, {{"update", std::string("fp16-sr")}, {"esr", std::string("on")}}));
  INFO("lost updates rn " << metric(rn, "frac_lost_updates") << ", sr " << metric(sr, "frac_lost_updates")
                          << "; unchanged bn scales rn " << metric(rn, "bn_scale_unchanged") << ", sr "
                          << metric(sr, "bn_scale_unchanged"));
  CHECK(metric(rn, "frac_lost_updates") > metric(sr, "frac_lost_updates"));
  CHECK(metric(rn, "bn_scale_unchanged") >= metric(sr, "bn_scale_unchanged"));
  CHECK(metric(rn, "frac_values_changed") < metric(sr, "frac_values_changed"));
  // ResNet-8: 7 batch norms, one per convolution on the main path.
  CHECK(rn.traces.at("bn_scale_std").y.size() == 7u);
  CHECK(rn.traces.at("bn_scale_unchanged").x == std::vector<double>{1, 2, 3, 4, 5, 6, 7});
}

TEST_CASE("bn_fp16 in small: fp16 weights lose updates that fp32 and fp32 master weights keep", "[train][conv]") {
  REQUIRE_FASHION_SUBSET();
  const Overrides base{{"data", fashion_subset()}, {"model", std::string("convnet")}, {"width1", std::int64_t{4}},
                       {"width2", std::int64_t{4}}, {"epochs", std::int64_t{1}}, {"batch", std::int64_t{16}},
                       {"optimizer", std::string("momentum")}, {"lr", 0.01}, {"unit", std::string("ipu-amp")},
                       {"bn_format", std::string("fp32")}, {"loss_scale", std::string("128")}};
  const RunResult fp32 = train(with(base, {{"update", std::string("fp32")}}));
  const RunResult rn = train(with(base, {{"update", std::string("fp16-rn")}}));
  const RunResult bn32 = train(with(base, {{"update", std::string("fp16-rn")}, {"bn_fp32", true}}));
  const RunResult master = train(with(base, {{"update", std::string("fp32-master")}}));
  INFO("lost updates: fp32 " << metric(fp32, "frac_lost_updates") << ", fp16-rn " << metric(rn, "frac_lost_updates")
                             << ", bn_fp32 " << metric(bn32, "frac_lost_updates") << ", fp32-master "
                             << metric(master, "frac_lost_updates") << "; unchanged bn scales: fp32 "
                             << metric(fp32, "bn_scale_unchanged") << ", fp16-rn " << metric(rn, "bn_scale_unchanged"));
  CHECK(metric(rn, "frac_lost_updates") > metric(fp32, "frac_lost_updates"));
  CHECK(metric(rn, "frac_lost_updates") > metric(master, "frac_lost_updates"));
  // Batch-norm parameters in fp32 keep their own updates: fewer are lost than with all in fp16.
  CHECK(metric(bn32, "frac_lost_updates") < metric(rn, "frac_lost_updates"));
  // In eight steps every scale moves in every setup (the gradients are still large).
  for (const RunResult* r : {&fp32, &rn, &bn32, &master}) {
    CHECK(metric(*r, "bn_layers_unchanged") == 0);
    CHECK(r->traces.at("bn_scale_std").y.size() == 2u);
    CHECK(metric(*r, "bn_scale_std_min") > 0);
  }
}

TEST_CASE("dynamic loss scaling on the fastai schedule skips the first steps, then settles", "[train][conv]") {
  REQUIRE_FASHION_SUBSET();
  const RunResult r = train({{"data", fashion_subset()}, {"model", std::string("convnet")}, {"width1", std::int64_t{4}},
                             {"width2", std::int64_t{4}}, {"epochs", std::int64_t{2}}, {"batch", std::int64_t{16}},
                             {"optimizer", std::string("momentum")}, {"lr", 0.01}, {"unit", std::string("ipu-amp")},
                             {"update", std::string("fp32-master")}, {"loss_scale", std::string("dynamic")},
                             {"ls_init", 16777216.0}, {"ls_backoff", 0.5}, {"ls_growth", 2.0},
                             {"ls_interval", std::int64_t{500}}});
  const std::vector<double>& scale = r.traces.at("loss_scale").y;
  INFO("skipped " << metric(r, "skipped_steps") << ", final scale " << metric(r, "final_loss_scale"));
  CHECK(metric(r, "skipped_steps") >= 1);
  CHECK(scale.front() == 16777216.0);
  CHECK(metric(r, "final_loss_scale") < 16777216.0);
  // Halved once per skipped step, never grown (fewer than 500 clean steps).
  CHECK(metric(r, "final_loss_scale") == std::ldexp(16777216.0, -static_cast<int>(metric(r, "skipped_steps"))));
  // The skips come first: once a step is applied, the scale stays.
  const std::size_t settled = static_cast<std::size_t>(metric(r, "skipped_steps"));
  for (std::size_t s = settled; s < scale.size(); ++s) CHECK(scale[s] == scale[settled]);
}

TEST_CASE("fp_exceptions: the convolutional models name their scopes as documented", "[train][conv]") {
  REQUIRE_FASHION_SUBSET();
  // Loss scale 2^24 overflows fp16 gradients: flags in the backward passes.
  for (const char* model : {"convnet", "resnet"}) {
    const RunResult r = train({{"data", fashion_subset()}, {"model", std::string(model)}, {"width1", std::int64_t{2}},
                               {"width2", std::int64_t{2}}, {"resnet_width", std::int64_t{2}},
                               {"train_samples", std::int64_t{32}}, {"test_samples", std::int64_t{16}},
                               {"epochs", std::int64_t{1}}, {"batch", std::int64_t{16}},
                               {"update", std::string("fp16-rn")}, {"unit", std::string("ipu-amp")},
                               {"loss_scale", std::string("16777216")}, {"fp_exceptions", std::string("count")}});
    const std::string layers =
        "conv[12]|bn[12]|dense|pool|stem\\.(conv|bn)|stage[123]\\.block1\\.(conv[12]|bn[12]|shortcut|add)";
    const std::string weighted = "conv[12]|dense|stem\\.conv|stage[123]\\.block1\\.(conv[12]|shortcut)";
    const std::regex documented("init|loss|forward\\.(" + layers + ")|backward\\.((" + weighted +
                                ")\\.(bias|dw|dx)|" + layers + ")|update\\.(" + weighted +
                                "|dense\\.bias|.*bn[12]?\\.(gamma|beta))|evaluate\\.(train|test)\\.(input|loss|" +
                                layers + ")");
    std::set<std::string> scopes;
    for (const emu::OpCount& row : r.fp_counts) {
      INFO(model << ": " << row.scope << " " << row.op);
      CHECK(std::regex_match(row.scope, documented));
      scopes.insert(row.scope);
      if (row.first_element.known() && row.first_element.rank == 4)  // (sample, channel, row, column)
        CHECK(row.first_element.index[0] < 16);
    }
    INFO(model);
    CHECK(scopes.size() >= 3);
  }
}
