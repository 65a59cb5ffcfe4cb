#include "datasets.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <utility>

#include "emu/rng.hpp"

namespace roundoff::data {

Dataset make_synthetic(const SyntheticSpec& spec) {
  if (spec.samples < 2 || spec.features < 1 || spec.classes < 2)
    throw std::invalid_argument("synthetic data needs samples >= 2, features >= 1, classes >= 2");
  emu::Rng rng(emu::StreamId{spec.seed, 0, 0, 0x5e7});
  std::vector<double> centres(static_cast<std::size_t>(spec.classes) * spec.features);
  for (double& c : centres) c = rng.normal();
  Dataset d;
  d.features = spec.features;
  d.classes = spec.classes;
  d.x.resize(static_cast<std::size_t>(spec.samples) * spec.features);
  d.y.resize(spec.samples);
  for (int i = 0; i < spec.samples; ++i) {
    const int label = i % spec.classes;
    d.y[i] = label;
    for (int j = 0; j < spec.features; ++j)
      d.x[static_cast<std::size_t>(i) * spec.features + j] =
          static_cast<float>(centres[static_cast<std::size_t>(label) * spec.features + j] + spec.noise * rng.normal());
  }
  return d;
}

Dataset make_teacher(const SyntheticSpec& spec) {
  if (spec.samples < 2 || spec.features < 1 || spec.classes < 2)
    throw std::invalid_argument("teacher data needs samples >= 2, features >= 1, classes >= 2");
  constexpr int kHidden = 64;
  const std::size_t d = spec.features, c = spec.classes;
  emu::Rng rng(emu::StreamId{spec.seed, 0, 0, 0x7eac});
  std::vector<double> w1(d * kHidden), w2(kHidden * c);
  for (double& w : w1) w = std::sqrt(2.0 / static_cast<double>(d)) * rng.normal();
  for (double& w : w2) w = std::sqrt(1.0 / kHidden) * rng.normal();
  Dataset out;
  out.features = spec.features;
  out.classes = spec.classes;
  out.x.resize(static_cast<std::size_t>(spec.samples) * d);
  out.y.resize(spec.samples);
  std::vector<double> x(d), h(kHidden);
  for (int i = 0; i < spec.samples; ++i) {
    for (std::size_t j = 0; j < d; ++j) {
      out.x[i * d + j] = static_cast<float>(rng.normal());
      x[j] = out.x[i * d + j];
    }
    for (int k = 0; k < kHidden; ++k) {
      double s = 0.0;
      for (std::size_t j = 0; j < d; ++j) s += x[j] * w1[j * kHidden + k];
      h[k] = std::max(s, 0.0);
    }
    int best = 0;
    double best_logit = -std::numeric_limits<double>::infinity();
    for (std::size_t k = 0; k < c; ++k) {
      double s = 0.0;
      for (int j = 0; j < kHidden; ++j) s += h[j] * w2[j * c + k];
      if (s > best_logit) best_logit = s, best = static_cast<int>(k);
    }
    out.y[i] = best;
  }
  return out;
}

std::string Dataset::sample_shape() const {
  // append: gcc 12 warns falsely (-Wrestrict) on "[" + std::to_string(...).
  if (!is_image()) return std::string("[").append(std::to_string(features)).append("]");
  return std::string("[")
      .append(std::to_string(channels))
      .append(", ")
      .append(std::to_string(height))
      .append(", ")
      .append(std::to_string(width))
      .append("]");
}

std::size_t test_size(std::size_t n, double test_fraction) {
  return static_cast<std::size_t>(std::llround(test_fraction * static_cast<double>(n)));
}

Dataset first_samples(const Dataset& d, std::size_t n) {
  if (n == 0 || n >= d.size()) return d;
  Dataset out = d;
  out.y.resize(n);
  out.x.resize(n * static_cast<std::size_t>(d.features));
  return out;
}

Split split(const Dataset& d, double test_fraction, std::uint64_t seed) {
  const std::size_t n = d.size();
  std::vector<std::size_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  emu::Rng rng(emu::StreamId{seed, 0, 0, 0x5b1});
  for (std::size_t i = n - 1; i > 0; --i) std::swap(order[i], order[rng.next_u64() % (i + 1)]);  // Fisher-Yates
  const std::size_t n_test = test_size(n, test_fraction);
  if (n_test < 1 || n_test >= n) throw std::invalid_argument("test_fraction leaves an empty train or test split");
  Split s;
  for (Dataset* part : {&s.train, &s.test}) {
    *part = d;
    part->x.clear();
    part->y.clear();
  }
  for (std::size_t k = 0; k < n; ++k) {
    Dataset& part = k < n_test ? s.test : s.train;
    const std::size_t i = order[k];
    part.y.push_back(d.y[i]);
    part.x.insert(part.x.end(), d.x.begin() + static_cast<std::ptrdiff_t>(i * d.features),
                  d.x.begin() + static_cast<std::ptrdiff_t>((i + 1) * d.features));
  }
  return s;
}

void standardise(Split& s) {
  const int dims = s.train.features;
  const std::size_t n = s.train.size();
  for (int j = 0; j < dims; ++j) {
    float sum = 0.0f;
    for (std::size_t i = 0; i < n; ++i) sum += s.train.x[i * dims + j];
    const float mean = sum / static_cast<float>(n);
    float squares = 0.0f;
    for (std::size_t i = 0; i < n; ++i) {
      const float c = s.train.x[i * dims + j] - mean;
      squares += c * c;
    }
    const float sd = std::sqrt(squares / static_cast<float>(n));
    const float divisor = sd > 0.0f ? sd : 1.0f;
    for (Dataset* part : {&s.train, &s.test})
      for (std::size_t i = 0; i < part->size(); ++i) {
        float& v = part->x[i * dims + j];
        v = (v - mean) / divisor;
      }
  }
}

void standardise_channels(Split& s) {
  if (!s.train.is_image()) throw std::invalid_argument("standardise_channels needs images");
  const std::size_t channels = s.train.channels;
  const std::size_t pixels = static_cast<std::size_t>(s.train.height) * s.train.width;
  for (std::size_t c = 0; c < channels; ++c) {
    double sum = 0.0;
    for (std::size_t i = 0; i < s.train.size(); ++i)
      for (std::size_t k = 0; k < pixels; ++k) sum += s.train.x[(i * channels + c) * pixels + k];
    const double count = static_cast<double>(s.train.size() * pixels);
    const double mean = sum / count;
    double squares = 0.0;
    for (std::size_t i = 0; i < s.train.size(); ++i)
      for (std::size_t k = 0; k < pixels; ++k) {
        const double d = s.train.x[(i * channels + c) * pixels + k] - mean;
        squares += d * d;
      }
    const double sd = std::sqrt(squares / count);
    const float mean_f = static_cast<float>(mean), divisor = sd > 0 ? static_cast<float>(sd) : 1.0f;
    for (Dataset* part : {&s.train, &s.test})
      for (std::size_t i = 0; i < part->size(); ++i)
        for (std::size_t k = 0; k < pixels; ++k) {
          float& v = part->x[(i * channels + c) * pixels + k];
          v = (v - mean_f) / divisor;
        }
  }
}

}  // namespace roundoff::data

