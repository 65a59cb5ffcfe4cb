// Reading the training experiments' HDF5 data files (data_file.hpp).
#include "data_file.hpp"

#include <hdf5.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <utility>
#include <vector>

namespace roundoff::data {

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

// Opens dataset `name`, checks its type class and rank (one of `ranks`), and returns its
// dimensions. `expected` describes what the dataset must be, for messages.
std::vector<hsize_t> open_dataset(const std::string& path, hid_t file, const char* name, H5T_class_t want,
                                  std::initializer_list<int> ranks, const std::string& expected, H5Handle& out) {
  if (H5Lexists(file, name, H5P_DEFAULT) <= 0) bad_file(path, std::string("no dataset '") + name + "'");
  out.id = H5Dopen2(file, name, H5P_DEFAULT);
  if (out.id < 0) bad_file(path, std::string("'") + name + "' is not a dataset");
  H5Handle type{H5Dget_type(out.id), H5Tclose};
  if (H5Tget_class(type.id) != want)
    bad_file(path, std::string("'") + name + "' must be " + expected + ", but its type is not " +
                       (want == H5T_FLOAT ? "float" : "integer"));
  H5Handle space{H5Dget_space(out.id), H5Sclose};
  const int ndims = H5Sget_simple_extent_ndims(space.id);
  if (std::find(ranks.begin(), ranks.end(), ndims) == ranks.end())
    bad_file(path, std::string("'") + name + "' must be " + expected + ", but it has " + std::to_string(ndims) +
                       " dimension" + (ndims == 1 ? "" : "s"));
  std::vector<hsize_t> dims(ndims);
  H5Sget_simple_extent_dims(space.id, dims.data(), nullptr);
  return dims;
}

std::string shape_text(const std::vector<hsize_t>& dims, std::size_t from) {
  std::string text = "[";
  for (std::size_t i = from; i < dims.size(); ++i) text += (i > from ? ", " : "") + std::to_string(dims[i]);
  return text + "]";
}

// Reads the samples `x_name` and labels `y_name` (the largest label goes to max_label).
Dataset read_samples(const std::string& path, hid_t file, const char* x_name, const char* y_name,
                     long long& max_label) {
  const std::string x_expected = std::string("a float dataset [N, D] or [N, C, H, W] (images; float32, float16/64 "
                                             "are read as float32)");
  const std::string y_expected = "a 1-D integer dataset [N] of labels";
  H5Handle x{-1, H5Dclose}, y{-1, H5Dclose};
  const auto xdims = open_dataset(path, file, x_name, H5T_FLOAT, {2, 4}, x_expected, x);
  const auto ydims = open_dataset(path, file, y_name, H5T_INTEGER, {1}, y_expected, y);
  const std::string xs = x_name, ys = y_name;
  if (xdims[0] != ydims[0])
    bad_file(path, xs + " has " + std::to_string(xdims[0]) + " rows but " + ys + " has " +
                       std::to_string(ydims[0]) + " labels");
  for (std::size_t i = 1; i < xdims.size(); ++i)
    if (xdims[i] < 1) bad_file(path, xs + " has an empty sample shape " + shape_text(xdims, 1));
  Dataset d;
  std::size_t features = 1;
  for (std::size_t i = 1; i < xdims.size(); ++i) features *= xdims[i];
  if (features > (std::size_t{1} << 30)) bad_file(path, xs + " has more than 2^30 values per sample");
  d.features = static_cast<int>(features);
  if (xdims.size() == 4) {
    d.channels = static_cast<int>(xdims[1]);
    d.height = static_cast<int>(xdims[2]);
    d.width = static_cast<int>(xdims[3]);
  }
  d.x.resize(xdims[0] * features);
  std::vector<long long> labels(ydims[0]);
  if (!d.x.empty() && H5Dread(x.id, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, d.x.data()) < 0)
    bad_file(path, "cannot read " + xs);
  if (!labels.empty() && H5Dread(y.id, H5T_NATIVE_LLONG, H5S_ALL, H5S_ALL, H5P_DEFAULT, labels.data()) < 0)
    bad_file(path, "cannot read " + ys);
  for (std::size_t i = 0; i < d.x.size(); ++i)
    if (!std::isfinite(d.x[i]))
      bad_file(path, xs + "[" + std::to_string(i / features) + ", " + std::to_string(i % features) +
                         "] is not finite in float32 (NaN, inf, or beyond float32's range)");
  for (std::size_t i = 0; i < labels.size(); ++i) {
    const long long l = labels[i];
    if (l < 0 || l > 1'000'000)
      bad_file(path, ys + "[" + std::to_string(i) + "] = " + std::to_string(l) + " is not a label in 0..1000000");
    max_label = std::max(max_label, l);
  }
  d.y.assign(labels.begin(), labels.end());
  return d;
}

DataFile read_h5(const std::string& path) {
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  if (!std::filesystem::exists(status)) bad_file(path, "no such file (" + creation_hint(path) + ")");
  if (std::filesystem::is_directory(status)) bad_file(path, "is a directory, not an HDF5 file");
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);  // errors become exceptions, not stderr noise
  if (H5Fis_hdf5(path.c_str()) <= 0) bad_file(path, "not an HDF5 file");
  H5Handle file{H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose};
  if (file.id < 0) bad_file(path, "cannot be opened");
  long long max_label = 0;
  DataFile f;
  f.samples = read_samples(path, file.id, "x", "y", max_label);
  if (f.samples.size() < 2) bad_file(path, "needs at least 2 samples");
  const bool x_test = H5Lexists(file.id, "x_test", H5P_DEFAULT) > 0;
  const bool y_test = H5Lexists(file.id, "y_test", H5P_DEFAULT) > 0;
  if (x_test != y_test)
    bad_file(path, std::string("has '") + (x_test ? "x_test" : "y_test") + "' without '" +
                       (x_test ? "y_test" : "x_test") + "': a test split needs both");
  if (x_test) {
    f.test = read_samples(path, file.id, "x_test", "y_test", max_label);
    const Dataset& t = *f.test;
    if (t.size() < 1) bad_file(path, "x_test holds no samples");
    if (t.features != f.samples.features || t.channels != f.samples.channels || t.height != f.samples.height ||
        t.width != f.samples.width)
      bad_file(path, "x_test's samples are " + t.sample_shape() + " but x's are " + f.samples.sample_shape());
  }
  const int classes = static_cast<int>(max_label) + 1;
  if (classes < 2) bad_file(path, "needs at least 2 classes");
  f.samples.classes = classes;
  if (f.test) f.test->classes = classes;
  return f;
}

// The file's size and modification time, or nullopt when it cannot be examined: a file
// replaced or rewritten under the same path is read again.
std::optional<std::pair<std::uintmax_t, std::filesystem::file_time_type>> identity(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return std::nullopt;
  const std::uintmax_t size = std::filesystem::file_size(path, ec);
  if (ec) return std::nullopt;
  const auto time = std::filesystem::last_write_time(path, ec);
  if (ec) return std::nullopt;
  return std::make_pair(size, time);
}

}  // namespace

std::string creation_hint(const std::string& path) {
  const std::string name = std::filesystem::path(path).filename().string();
  if (name.rfind("fashion_mnist", 0) == 0)
    return "create it with: /usr/bin/python3 scripts/make_fashion_mnist_h5.py " + path;
  if (name.rfind("digits", 0) == 0) return "create it with: /usr/bin/python3 scripts/make_digits_h5.py " + path;
  return "scripts/make_fashion_mnist_h5.py and scripts/make_digits_h5.py write the shipped data sets";
}

std::shared_ptr<const DataFile> load_h5(const std::string& path) {
  struct Entry {
    std::pair<std::uintmax_t, std::filesystem::file_time_type> id;
    std::shared_ptr<const DataFile> data;
    std::uint64_t used;
  };
  constexpr std::size_t kMaxEntries = 4;
  static std::mutex mutex;
  static std::map<std::string, Entry> cache;
  static std::uint64_t clock = 0;
  const std::lock_guard<std::mutex> lock(mutex);
  const auto id = identity(path);
  auto it = cache.find(path);
  if (it != cache.end() && id && it->second.id == *id) {
    it->second.used = ++clock;
    return it->second.data;
  }
  if (it != cache.end()) cache.erase(it);
  auto d = std::make_shared<const DataFile>(read_h5(path));  // throws for a bad file: nothing cached
  if (!id) return d;
  if (cache.size() >= kMaxEntries)  // forget the least recently used file
    cache.erase(std::min_element(cache.begin(), cache.end(), [](const auto& a, const auto& b) {
      return a.second.used < b.second.used;
    }));
  cache.emplace(path, Entry{*id, d, ++clock});
  return d;
}

}  // namespace roundoff::data
