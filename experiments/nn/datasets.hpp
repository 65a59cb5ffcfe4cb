// Classification data for the training experiments: a built-in synthetic task and HDF5
// files, split into train and test deterministically and standardised per feature.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace roundoff::data {

struct Dataset {
  int features = 0;  // values per sample (channels x height x width for images)
  int classes = 0;
  // Images: each sample is channels x height x width values, row-major (NCHW, as a file's
  // x [N, C, H, W] holds them); 0, 0, 0 for flat samples (x [N, D]).
  int channels = 0, height = 0, width = 0;
  std::vector<float> x;  // samples x features, row-major
  std::vector<int> y;    // labels in 0 .. classes-1
  std::size_t size() const { return y.size(); }
  bool is_image() const { return channels > 0; }
  // "[C, H, W]" or "[D]": the shape of one sample, for messages.
  std::string sample_shape() const;
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

// The contents of an HDF5 data file: its samples, and its own test split if it has one.
struct DataFile {
  Dataset samples;
  std::optional<Dataset> test;
};

// An HDF5 file holding `x` [N, D] or [N, C, H, W] (images; a float type; float16/32/64
// are read as float32, and every value must be finite in float32) and `y` [N] (an
// integer type, labels 0..10^6), N >= 2, every dimension >= 1; optionally its own test
// split `x_test` [M, ...] (the same sample shape as x) and `y_test` [M], M >= 1, both or
// neither (Fashion-MNIST's official split: scripts/make_fashion_mnist_h5.py). classes =
// the largest label of y and y_test + 1 >= 2. Read and validated once and then cached by
// path while the file's size and modification time stay the same (the last 4 files are
// kept; a mutex guards the cache and the HDF5 library, which may be built without
// thread safety). A missing, unreadable or malformed file throws std::invalid_argument
// "data file 'PATH': reason" (nothing is cached for it); for a missing file the reason
// names the command that writes it (creation_hint).
std::shared_ptr<const DataFile> load_h5(const std::string& path);

// The command that writes a data file at `path` ("/usr/bin/python3 scripts/
// make_fashion_mnist_h5.py PATH" for a name starting with fashion_mnist, make_digits_h5.py
// for digits), or a sentence naming both scripts for any other name.
std::string creation_hint(const std::string& path);

// The number of test samples split() takes from n: round(test_fraction * n).
std::size_t test_size(std::size_t n, double test_fraction);

// A random permutation from `seed` puts test_size(N, test_fraction) samples in the test
// split and the rest in the training split (same seed, same split). Throws
// std::invalid_argument when either split would be empty.
Split split(const Dataset& d, double test_fraction, std::uint64_t seed);

// The first n samples of d (all of them when n is 0 or at least d.size()).
Dataset first_samples(const Dataset& d, std::size_t n);

// Per-feature standardisation with the mean and standard deviation of the training
// split, computed in float32 (features with zero spread are only centred); applied to
// both splits. Unnormalised inputs are a known failure of low-precision training.
void standardise(Split& s);

// Per-channel standardisation of images (as convolutional networks' input pipelines do:
// one mean and standard deviation per channel over every pixel of the training split),
// statistics computed in fp64 (a channel pools N x H x W values, too many for a float32
// running sum), applied in float32: v = (v - mean) / sd with mean and sd rounded to
// float (a channel with zero spread is only centred). Throws std::invalid_argument for
// flat data.
void standardise_channels(Split& s);

}  // namespace roundoff::data
