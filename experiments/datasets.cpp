#include "datasets.hpp"

#include <hdf5.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <mutex>
#include <numeric>
#include <stdexcept>

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

namespace {

// Closes an HDF5 identifier when it goes out of scope.
struct H5Handle {
  hid_t id;
  herr_t (*close)(hid_t);
  ~H5Handle() {
    if (id >= 0) close(id);
  }
};

[[noreturn]] void bad_file(const std::string& path, const std::string& reason) {
  throw std::invalid_argument("data file '" + path + "': " + reason);
}

// Opens dataset `name`, checks its type class and rank, and returns its dimensions.
std::vector<hsize_t> open_dataset(const std::string& path, hid_t file, const char* name, H5T_class_t want,
                                  int rank, H5Handle& out) {
  if (H5Lexists(file, name, H5P_DEFAULT) <= 0) bad_file(path, std::string("no dataset '") + name + "'");
  out.id = H5Dopen2(file, name, H5P_DEFAULT);
  if (out.id < 0) bad_file(path, std::string("'") + name + "' is not a dataset");
  H5Handle type{H5Dget_type(out.id), H5Tclose};
  if (H5Tget_class(type.id) != want)
    bad_file(path, std::string("dataset '") + name + "' must have " + (want == H5T_FLOAT ? "a float" : "an integer") +
                       " type");
  H5Handle space{H5Dget_space(out.id), H5Sclose};
  if (H5Sget_simple_extent_ndims(space.id) != rank)
    bad_file(path, std::string("dataset '") + name + "' must have rank " + std::to_string(rank));
  std::vector<hsize_t> dims(rank);
  H5Sget_simple_extent_dims(space.id, dims.data(), nullptr);
  return dims;
}

Dataset read_h5(const std::string& path) {
  if (!std::filesystem::exists(path)) bad_file(path, "no such file");
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);  // errors become exceptions, not stderr noise
  if (H5Fis_hdf5(path.c_str()) <= 0) bad_file(path, "not an HDF5 file");
  H5Handle file{H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose};
  if (file.id < 0) bad_file(path, "cannot be opened");
  H5Handle x{-1, H5Dclose}, y{-1, H5Dclose};
  const auto xdims = open_dataset(path, file.id, "x", H5T_FLOAT, 2, x);
  const auto ydims = open_dataset(path, file.id, "y", H5T_INTEGER, 1, y);
  if (xdims[0] != ydims[0])
    bad_file(path, "x has " + std::to_string(xdims[0]) + " rows but y has " + std::to_string(ydims[0]) + " labels");
  if (xdims[0] < 2 || xdims[1] < 1) bad_file(path, "needs at least 2 samples and 1 feature");
  Dataset d;
  d.features = static_cast<int>(xdims[1]);
  d.x.resize(xdims[0] * xdims[1]);
  std::vector<long long> labels(ydims[0]);
  if (H5Dread(x.id, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, d.x.data()) < 0) bad_file(path, "cannot read x");
  if (H5Dread(y.id, H5T_NATIVE_LLONG, H5S_ALL, H5S_ALL, H5P_DEFAULT, labels.data()) < 0) bad_file(path, "cannot read y");
  for (float v : d.x)
    if (!std::isfinite(v)) bad_file(path, "x holds a non-finite value");
  long long max_label = 0;
  for (long long l : labels) {
    if (l < 0 || l > 1'000'000) bad_file(path, "label " + std::to_string(l) + " out of range 0..1000000");
    max_label = std::max(max_label, l);
  }
  d.classes = static_cast<int>(max_label) + 1;
  if (d.classes < 2) bad_file(path, "needs at least 2 classes");
  d.y.assign(labels.begin(), labels.end());
  return d;
}

}  // namespace

std::shared_ptr<const Dataset> load_h5(const std::string& path) {
  static std::mutex mutex;
  static std::map<std::string, std::shared_ptr<const Dataset>> cache;
  const std::lock_guard<std::mutex> lock(mutex);
  auto it = cache.find(path);
  if (it != cache.end()) return it->second;
  auto d = std::make_shared<const Dataset>(read_h5(path));
  cache.emplace(path, d);
  return d;
}

Split split(const Dataset& d, double test_fraction, std::uint64_t seed) {
  const std::size_t n = d.size();
  std::vector<std::size_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  emu::Rng rng(emu::StreamId{seed, 0, 0, 0x5b1});
  for (std::size_t i = n - 1; i > 0; --i) std::swap(order[i], order[rng.next_u64() % (i + 1)]);  // Fisher-Yates
  const auto n_test = static_cast<std::size_t>(std::llround(test_fraction * static_cast<double>(n)));
  if (n_test < 1 || n_test >= n) throw std::invalid_argument("test_fraction leaves an empty train or test split");
  Split s;
  for (Dataset* part : {&s.train, &s.test}) {
    part->features = d.features;
    part->classes = d.classes;
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

}  // namespace roundoff::data
