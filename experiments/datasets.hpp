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

// An HDF5 file holding `x` [N, D] (float type; read as float32) and `y` [N] (integer
// type, labels >= 0; classes = max + 1). Read once per path and cached (a mutex guards
// the cache and the HDF5 library, which may be built without thread safety). A missing
// or malformed file throws std::invalid_argument naming the path and the reason.
std::shared_ptr<const Dataset> load_h5(const std::string& path);

// A random permutation from `seed` puts round(test_fraction * N) samples in the test
// split and the rest in the training split (same seed, same split).
Split split(const Dataset& d, double test_fraction, std::uint64_t seed);

// Per-feature standardisation with the mean and standard deviation of the training
// split, computed in float32 (features with zero spread are only centred); applied to
// both splits. Unnormalised inputs are a known failure of low-precision training.
void standardise(Split& s);

}  // namespace roundoff::data
