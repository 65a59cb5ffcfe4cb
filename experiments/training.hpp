// The experiment glue that train, updates and grad_underflow share around the network
// kit (nn/mlp.hpp): their parameters, their data (built-in or a data file) and the
// typed TrainSpec of a point. Defined in train.cpp, the gradient cache in
// grad_underflow.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "experiment.hpp"
#include "nn/datasets.hpp"
#include "nn/mlp.hpp"

namespace roundoff::train {

// data, samples, features, classes, noise, test_fraction, train_samples, test_samples:
std::vector<ParamSpec> data_param_specs();
// layers, width1, width2, epochs, batch, lr:
std::vector<ParamSpec> run_param_specs();
// How prepare_data standardises: per feature (data::standardise, for the MLP) or per
// channel of images (data::standardise_channels, for the convolutional models).
enum class Standardisation { per_feature, per_channel };
// The data and split (a file's own test split where it has one, else test_fraction),
// cut to train_samples and test_samples, standardised. Repeats check_data_and_batch
// (cheap: files are cached) and throws BadInput if a data file changed or vanished since
// check_point.
std::shared_ptr<const data::Split> prepare_data(const Params& p, std::uint64_t seed, Standardisation how);
// check_point's part for data, test_fraction and batch: validates a data file (once per
// path; see data::load_h5), and that both splits are non-empty and batch <= the
// training split. "" when fine, else one line naming the file or parameter.
std::string check_data_and_batch(const Params& p);
// Training steps of a run at these params (epochs x full batches of the training split);
// call after check_data_and_batch accepted them.
std::int64_t planned_steps(const Params& p);
void read_run_params(const Params& p, TrainSpec& spec);

// grad_underflow keeps the gradients of its recent training runs (replicas of a point run
// in parallel; points that differ only in format and scale share one), up to a byte
// budget: a count limit thrashes once more runs than it cycle in the grid's inner loop.
inline constexpr std::size_t kGradientCacheBytes = std::size_t{512} << 20;
std::size_t gradient_cache_bytes();  // gradient bytes cached now (tests)
// Tests only: a smaller budget, to see eviction without gigabytes of gradients.
void set_gradient_cache_budget(std::size_t bytes);

}  // namespace roundoff::train
