// The training data pipeline: synthetic data, HDF5 input (and its errors), the split and
// standardisation. Oracles: fp64 statistics computed here, files written here with the
// HDF5 C API, and scikit-learn's digits as scripts/make_digits_h5.py writes them.
#include <hdf5.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <chrono>

#include "experiments/data_file.hpp"
#include "tests/run_experiment.hpp"

using namespace roundoff;
namespace fs = std::filesystem;

namespace {

fs::path temp_path(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("roundoff-train-test-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  return dir / name;
}

void write_dataset(hid_t file, const char* name, hid_t type, const std::vector<hsize_t>& dims, const void* data) {
  const hid_t space = H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr);
  const hid_t ds = H5Dcreate2(file, name, type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  H5Dwrite(ds, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data);
  H5Dclose(ds);
  H5Sclose(space);
}

// x [n, d] float32 with x[i][j] = i + j / 10, y [n] int32 = i % classes; `with_y` false
// leaves y out; `float_y` writes y as float.
std::string write_file(const std::string& name, int n, int d, int classes, bool with_y = true, bool float_y = false) {
  const std::string path = temp_path(name).string();
  const hid_t file = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  std::vector<float> x(static_cast<std::size_t>(n) * d);
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < d; ++j) x[static_cast<std::size_t>(i) * d + j] = static_cast<float>(i) + static_cast<float>(j) / 10;
  write_dataset(file, "x", H5T_NATIVE_FLOAT, {hsize_t(n), hsize_t(d)}, x.data());
  std::vector<int> y(n);
  std::vector<float> yf(n);
  for (int i = 0; i < n; ++i) yf[i] = static_cast<float>(y[i] = i % classes);
  if (with_y) write_dataset(file, "y", float_y ? H5T_NATIVE_FLOAT : H5T_NATIVE_INT, {hsize_t(n)}, float_y ? (const void*)yf.data() : (const void*)y.data());
  H5Fclose(file);
  return path;
}

void require_error(const std::string& path, const std::string& reason) {
  try {
    (void)data::load_h5(path);
    FAIL("no error for " << path);
  } catch (const std::invalid_argument& e) {
    const std::string what = e.what();
    INFO(what);
    CHECK(what.find(path) != std::string::npos);
    CHECK(what.find(reason) != std::string::npos);
  }
}

}  // namespace

TEST_CASE("synthetic data is deterministic from the seed", "[train][data]") {
  const data::SyntheticSpec spec{200, 5, 4, 1.0, 7};
  const data::Dataset a = data::make_synthetic(spec), b = data::make_synthetic(spec);
  data::SyntheticSpec other = spec;
  other.seed = 8;
  const data::Dataset c = data::make_synthetic(other);
  CHECK(a.x == b.x);
  CHECK(a.y == b.y);
  CHECK(a.x != c.x);
  CHECK(a.classes == 4);
  CHECK(a.x.size() == 200u * 5u);
  for (int label : a.y) CHECK((label >= 0 && label < 4));
}

TEST_CASE("split is a deterministic partition and standardisation uses the training split", "[train][data]") {
  const data::Dataset d = data::make_synthetic({500, 3, 5, 2.0, 3});
  data::Split s = data::split(d, 0.2, 11);
  const data::Split again = data::split(d, 0.2, 11);
  CHECK(s.test.size() == 100u);
  CHECK(s.train.size() == 400u);
  CHECK(s.train.x == again.train.x);
  CHECK(s.test.y == again.test.y);
  // A partition: the multiset of rows is preserved (sum of every feature, in fp64).
  for (int j = 0; j < 3; ++j) {
    double whole = 0.0, parts = 0.0;
    for (std::size_t i = 0; i < d.size(); ++i) whole += d.x[i * 3 + j];
    for (const data::Dataset* p : {&s.train, &s.test})
      for (std::size_t i = 0; i < p->size(); ++i) parts += p->x[i * 3 + j];
    CHECK(parts == Approx(whole).epsilon(1e-12));
  }
  data::standardise(s);
  for (int j = 0; j < 3; ++j) {
    double sum = 0.0, squares = 0.0;
    for (std::size_t i = 0; i < s.train.size(); ++i) sum += s.train.x[i * 3 + j];
    const double mean = sum / static_cast<double>(s.train.size());
    for (std::size_t i = 0; i < s.train.size(); ++i) squares += std::pow(s.train.x[i * 3 + j] - mean, 2);
    CHECK(std::fabs(mean) < 1e-5);
    CHECK(std::sqrt(squares / static_cast<double>(s.train.size())) == Approx(1.0).epsilon(1e-4));
  }
}

TEST_CASE("HDF5 input is read as written, and bad files are refused with path and reason", "[train][data]") {
  const std::string good = write_file("good.h5", 30, 4, 3);
  const auto file = data::load_h5(good);
  const data::Dataset* d = &file->samples;
  REQUIRE(d->size() == 30u);
  CHECK(d->features == 4);
  CHECK(d->classes == 3);
  CHECK_FALSE(d->is_image());
  CHECK_FALSE(file->test.has_value());
  CHECK(d->x[7 * 4 + 2] == 7.2f);
  CHECK(d->y[29] == 2);
  CHECK(data::load_h5(good) == file);  // cached per path

  require_error(temp_path("missing.h5").string(), "no such file");
  require_error(write_file("no_y.h5", 10, 2, 2, false), "no dataset 'y'");
  require_error(write_file("float_y.h5", 10, 2, 2, true, true), "integer");
  const std::string text = temp_path("text.h5").string();
  std::ofstream(text) << "not hdf5\n";
  require_error(text, "not an HDF5 file");
}

TEST_CASE("a data file rewritten under the same path is read again", "[train][data]") {
  const std::string path = write_file("rewritten.h5", 30, 4, 3);
  const auto first = data::load_h5(path);
  CHECK(data::load_h5(path) == first);  // cached: not reopened
  std::filesystem::last_write_time(path, std::filesystem::last_write_time(path) - std::chrono::seconds(5));
  write_file("rewritten.h5", 40, 4, 3);  // new size and modification time
  const auto second = data::load_h5(path);
  CHECK(second != first);
  CHECK(second->samples.size() == 40u);
}

TEST_CASE("a data file that goes bad after check_point is BadInput (exit 2), not a bug", "[train][data]") {
  const std::string path = write_file("vanishing.h5", 60, 3, 2);
  const Experiment* e = find_experiment("train");
  REQUIRE(e);
  const Params p = testing::params_with(*e, {{"data", path}, {"epochs", std::int64_t{1}}, {"batch", std::int64_t{8}},
                                             {"update", std::string("fp16-rn")}});
  CHECK(e->check_point(p) == "");
  // Rewritten valid but smaller: 6 samples leave 5 for training, fewer than batch 8.
  std::filesystem::last_write_time(path, std::filesystem::last_write_time(path) - std::chrono::seconds(5));
  write_file("vanishing.h5", 6, 3, 2);
  try {
    (void)e->run(p, RunEnv{emu::StreamId{1, 0, 0, 0}});
    FAIL("no error");
  } catch (const BadInput& b) {
    CHECK(std::string(b.what()).find("batch 8 is larger than the training split: 5 of the 6 samples") !=
          std::string::npos);
  }
  std::filesystem::remove(path);
  CHECK_THROWS_AS(e->run(p, RunEnv{emu::StreamId{1, 0, 0, 0}}), BadInput);
  std::ofstream(path) << "no longer HDF5\n";
  try {
    (void)e->run(p, RunEnv{emu::StreamId{1, 0, 0, 0}});
    FAIL("no error");
  } catch (const BadInput& b) {
    CHECK(std::string(b.what()).find("data file '" + path + "': not an HDF5 file") != std::string::npos);
  }
}

TEST_CASE("teacher data: deterministic from the seed, labels from the teacher in range", "[train][data]") {
  const data::SyntheticSpec spec{3000, 8, 5, 1.0, 7};
  const data::Dataset a = data::make_teacher(spec), b = data::make_teacher(spec);
  data::SyntheticSpec other = spec;
  other.seed = 8;
  CHECK(a.x == b.x);
  CHECK(a.y == b.y);
  CHECK(a.y != data::make_teacher(other).y);
  std::vector<int> per_class(5, 0);
  for (int label : a.y) {
    REQUIRE((label >= 0 && label < 5));
    ++per_class[label];
  }
  // Inputs N(0, 1): mean within 5 standard errors of 0, variance near 1.
  double sum = 0, squares = 0;
  for (float v : a.x) sum += v, squares += double(v) * v;
  const double n = static_cast<double>(a.x.size());
  CHECK(std::fabs(sum / n) < 5 / std::sqrt(n));
  CHECK(squares / n == Approx(1.0).epsilon(0.05));
  // The noise parameter is not used: the labels are a function of the inputs alone.
  data::SyntheticSpec noisy = spec;
  noisy.noise = 3.0;
  CHECK(data::make_teacher(noisy).y == a.y);
  // Every class is some input's argmax (a random teacher is not perfectly balanced).
  for (int c = 0; c < 5; ++c) CHECK(per_class[c] > 0);
}

TEST_CASE("train reports a missing data file as invalid_argument naming it", "[train][data]") {
  const std::string missing = temp_path("nowhere.h5").string();
  try {
    (void)testing::run_experiment("train", {{"data", missing}});
    FAIL("no error");
  } catch (const std::invalid_argument& e) {
    CHECK(std::string(e.what()).find(missing) != std::string::npos);
  }
}

TEST_CASE("scripts/make_digits_h5.py writes sklearn's 8x8 digits in the input layout", "[train][data]") {
  if (std::system("/usr/bin/python3 -c 'import sklearn, h5py' >/dev/null 2>&1") != 0) {
    WARN("skipped: /usr/bin/python3 lacks sklearn or h5py (Debian python3-sklearn, python3-h5py)");
    return;
  }
  const std::string out = temp_path("digits.h5").string();
  REQUIRE(std::system(("/usr/bin/python3 scripts/make_digits_h5.py " + out + " >/dev/null").c_str()) == 0);
  const auto file = data::load_h5(out);
  const data::Dataset* d = &file->samples;
  // UCI optical digits as sklearn ships them: 1797 images of 8x8 pixels, values 0..16,
  // written as images [N, 1, 8, 8] (the MLP reads their 64 pixels).
  CHECK(d->sample_shape() == "[1, 8, 8]");
  CHECK(d->size() == 1797u);
  CHECK(d->features == 64);
  CHECK(d->classes == 10);
  CHECK(*std::min_element(d->x.begin(), d->x.end()) == 0.0f);
  CHECK(*std::max_element(d->x.begin(), d->x.end()) == 16.0f);
}

namespace {

// An image file: x [n, c, h, w] float32 with x[i][ch][r][col] = i + ch / 10 + r / 100 +
// col / 1000, y [n] = i % classes, and when test_n > 0 x_test [test_n, c, h, w] (value
// -i - ...) and y_test = (i + 1) % test_classes.
std::string write_images(const std::string& name, int n, int c, int h, int w, int classes, int test_n = 0,
                         int test_classes = 2, int test_c = -1) {
  const std::string path = temp_path(name).string();
  const hid_t file = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  auto images = [&](const char* x_name, const char* y_name, int count, int channels, double sign, int cls, int shift) {
    std::vector<float> x(static_cast<std::size_t>(count) * channels * h * w);
    std::size_t k = 0;
    for (int i = 0; i < count; ++i)
      for (int ch = 0; ch < channels; ++ch)
        for (int r = 0; r < h; ++r)
          for (int col = 0; col < w; ++col) x[k++] = static_cast<float>(sign * (i + ch / 10.0 + r / 100.0 + col / 1000.0));
    write_dataset(file, x_name, H5T_NATIVE_FLOAT, {hsize_t(count), hsize_t(channels), hsize_t(h), hsize_t(w)}, x.data());
    std::vector<int> y(count);
    for (int i = 0; i < count; ++i) y[i] = (i + shift) % cls;
    if (y_name) write_dataset(file, y_name, H5T_NATIVE_INT, {hsize_t(count)}, y.data());
  };
  images("x", "y", n, c, 1.0, classes, 0);
  if (test_n > 0) images("x_test", "y_test", test_n, test_c < 0 ? c : test_c, -1.0, test_classes, 1);
  H5Fclose(file);
  return path;
}

}  // namespace

TEST_CASE("image files: x [N, C, H, W] with its own test split, and their errors", "[train][data]") {
  const auto file = data::load_h5(write_images("images.h5", 6, 2, 3, 4, 3, 7, 7));
  const data::Dataset& d = file->samples;
  CHECK(d.is_image());
  CHECK(d.sample_shape() == "[2, 3, 4]");
  CHECK(d.features == 24);
  CHECK(d.x[((4 * 2 + 1) * 3 + 2) * 4 + 3] == 4.123f);  // NCHW, row-major
  REQUIRE(file->test.has_value());
  const data::Dataset& t = *file->test;
  CHECK(t.size() == 7u);
  CHECK(t.sample_shape() == "[2, 3, 4]");
  CHECK(t.x[24 * 2] == -2.0f);
  CHECK(t.y[4] == 5);
  // classes count the labels of both splits: the largest is y_test's 6.
  CHECK(d.classes == 7);
  CHECK(t.classes == 7);

  SECTION("x_test's sample shape must be x's") {
    require_error(write_images("mismatch.h5", 6, 2, 3, 4, 3, 5, 2, 1), "x_test's samples are [1, 3, 4] but x's are [2, 3, 4]");
  }
  SECTION("x_test needs y_test") {
    const std::string path = temp_path("half.h5").string();
    const hid_t f = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    const std::vector<float> x(8, 1.0f);
    const std::vector<int> y{0, 1};
    write_dataset(f, "x", H5T_NATIVE_FLOAT, {2, 4}, x.data());
    write_dataset(f, "y", H5T_NATIVE_INT, {2}, y.data());
    write_dataset(f, "x_test", H5T_NATIVE_FLOAT, {2, 4}, x.data());
    H5Fclose(f);
    require_error(path, "has 'x_test' without 'y_test'");
  }
  SECTION("x of rank 3 is neither flat nor an image") {
    const std::string path = temp_path("rank3.h5").string();
    const hid_t f = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    const std::vector<float> x(8, 1.0f);
    const std::vector<int> y{0, 1};
    write_dataset(f, "x", H5T_NATIVE_FLOAT, {2, 2, 2}, x.data());
    write_dataset(f, "y", H5T_NATIVE_INT, {2}, y.data());
    H5Fclose(f);
    require_error(path, "'x' must be a float dataset [N, D] or [N, C, H, W] (images; float32, float16/64 are read as "
                        "float32), but it has 3 dimensions");
  }
}

TEST_CASE("a missing data file names the command that writes it", "[train][data]") {
  require_error(temp_path("fashion_mnist.h5").string(),
                "no such file (create it with: /usr/bin/python3 scripts/make_fashion_mnist_h5.py " +
                    temp_path("fashion_mnist.h5").string() + ")");
  require_error(temp_path("digits_absent.h5").string(), "create it with: /usr/bin/python3 scripts/make_digits_h5.py ");
  require_error(temp_path("mine.h5").string(), "scripts/make_fashion_mnist_h5.py and scripts/make_digits_h5.py");
}

TEST_CASE("first_samples and per-channel standardisation of images", "[train][data]") {
  const auto file = data::load_h5(write_images("standardise.h5", 10, 2, 3, 3, 2, 4));
  data::Split s{data::first_samples(file->samples, 7), data::first_samples(*file->test, 0)};
  REQUIRE(s.train.size() == 7u);
  CHECK(s.test.size() == 4u);  // 0 = all
  CHECK(s.train.sample_shape() == "[2, 3, 3]");
  CHECK(s.train.x.back() == file->samples.x[7 * 18 - 1]);
  data::standardise_channels(s);
  // Oracle: per channel, the mean and population sd over the 7 x 9 training pixels in
  // fp64 from the values as written; every pixel standardised with them.
  for (int c = 0; c < 2; ++c) {
    double sum = 0.0, squares = 0.0;
    std::vector<double> v;
    for (int i = 0; i < 7; ++i)
      for (int k = 0; k < 9; ++k) v.push_back(file->samples.x[(i * 2 + c) * 9 + k]);
    for (double a : v) sum += a;
    const double mean = sum / v.size();
    for (double a : v) squares += (a - mean) * (a - mean);
    const double sd = std::sqrt(squares / v.size());
    double after = 0.0, after_sq = 0.0;
    for (int i = 0; i < 7; ++i)
      for (int k = 0; k < 9; ++k) {
        const float x = s.train.x[(i * 2 + c) * 9 + k];
        CHECK(x == Approx((file->samples.x[(i * 2 + c) * 9 + k] - mean) / sd).margin(1e-6));
        after += x;
        after_sq += double(x) * x;
      }
    CHECK(after / 63 == Approx(0.0).margin(1e-6));
    CHECK(after_sq / 63 == Approx(1.0).epsilon(1e-5));
    CHECK(s.test.x[c * 9] == Approx((file->test->x[c * 9] - mean) / sd).margin(1e-6));
  }
  data::Split flat = data::split(data::make_synthetic({40, 4, 2, 1.0, 1}), 0.25, 1);
  CHECK_THROWS_AS(data::standardise_channels(flat), std::invalid_argument);
}

TEST_CASE("scripts/make_fashion_mnist_h5.py keeps the official split, as images", "[train][data]") {
  if (!fs::exists("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz")) {
    WARN("skipped: Debian's dataset-fashion-mnist is not installed (scripts/setup installs it)");
    return;
  }
  const std::string out = temp_path("fashion_mnist_small.h5").string();
  REQUIRE(std::system(("/usr/bin/python3 scripts/make_fashion_mnist_h5.py " + out +
                       " --train-samples 120 --test-samples 30 >/dev/null").c_str()) == 0);
  const auto file = data::load_h5(out);
  const data::Dataset& d = file->samples;
  REQUIRE(file->test.has_value());
  CHECK(d.size() == 120u);
  CHECK(file->test->size() == 30u);
  CHECK(d.sample_shape() == "[1, 28, 28]");
  CHECK(d.classes == 10);
  CHECK(*std::min_element(d.x.begin(), d.x.end()) == 0.0f);
  CHECK(*std::max_element(d.x.begin(), d.x.end()) == 255.0f);
  // The first labels of each IDX file as `zcat FILE | od -An -tu1 -j8 -N4` prints them
  // (after the 8-byte header): 9 (ankle boot), 0, 0, 3 and 9, 2, 1, 1.
  CHECK(std::vector<int>(d.y.begin(), d.y.begin() + 4) == std::vector<int>{9, 0, 0, 3});
  CHECK(std::vector<int>(file->test->y.begin(), file->test->y.begin() + 4) == std::vector<int>{9, 2, 1, 1});
  // Bad arguments and a missing source exit 2 with one line.
  CHECK(std::system(("/usr/bin/python3 scripts/make_fashion_mnist_h5.py " + out +
                     " --train-samples 0 2>/dev/null").c_str()) == 2 * 256);
  CHECK(std::system(("/usr/bin/python3 scripts/make_fashion_mnist_h5.py " + out +
                     " --source /nonexistent 2>/dev/null").c_str()) == 2 * 256);
}
