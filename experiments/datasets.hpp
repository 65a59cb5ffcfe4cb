// Classification data for the training experiments: a built-in synthetic task and HDF5
// files, split into train and test deterministically and standardised per feature.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace roundoff::data {

struct Dataset {
  int features = 0;
  int classes = 0;
  std::vector<float> x;  // samples x features, row-major
  std::vector<int> y;    // labels in 0 .. classes-1
  std::size_t size() const { return y.size(); }
};

struct Split {
  Dataset train, test;
};

// Gaussian clusters: one centre per class drawn from N(0, 1) per feature, samples drawn
// around their class's centre with standard deviation `noise`, labels cycling through
// the classes. Deterministic from `seed` alone.
struct SyntheticSpec {
  int samples = 2048;
  int features = 32;
  int classes = 10;
  double noise = 1.5;
  std::uint64_t seed = 0;
};
Dataset make_synthetic(const SyntheticSpec& spec);

// A fixed random teacher network: inputs drawn from N(0, 1) per feature, labelled by the
// argmax of a random two-layer ReLU network (features -> 64 -> classes, weights
// N(0, 2 / fan_in) and N(0, 1 / fan_in), no bias). `noise` is not used: the labels are
// a deterministic function of the inputs, as a teacher defines them. Deterministic from
// `seed` alone.
Dataset make_teacher(const SyntheticSpec& spec);

// An HDF5 file holding `x` [N, D] (a float type; float16/32/64 are read as float32, and
// every value must be finite in float32) and `y` [N] (an integer type, labels 0..10^6;
// classes = max + 1 >= 2), N >= 2, D >= 1. Read and validated once and then cached by
// path while the file's size and modification time stay the same (the last 4 files are
// kept; a mutex guards the cache and the HDF5 library, which may be built without
// thread safety). A missing, unreadable or malformed file throws std::invalid_argument
// "data file 'PATH': reason" (nothing is cached for it).
std::shared_ptr<const Dataset> load_h5(const std::string& path);

// The number of test samples split() takes from n: round(test_fraction * n).
std::size_t test_size(std::size_t n, double test_fraction);

// A random permutation from `seed` puts test_size(N, test_fraction) samples in the test
// split and the rest in the training split (same seed, same split). Throws
// std::invalid_argument when either split would be empty.
Split split(const Dataset& d, double test_fraction, std::uint64_t seed);

// Per-feature standardisation with the mean and standard deviation of the training
// split, computed in float32 (features with zero spread are only centred); applied to
// both splits. Unnormalised inputs are a known failure of low-precision training.
void standardise(Split& s);

}  // namespace roundoff::data
