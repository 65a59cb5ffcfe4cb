// Classification data for the training experiments: built-in synthetic tasks, split into
// train and test deterministically and standardised per feature or per channel. (Data
// files are read outside the kit: experiments/data_file.hpp.)
#pragma once

#include <cstdint>
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
