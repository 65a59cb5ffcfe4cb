// The training experiments' HDF5 data files, read into the network kit's Dataset
// (experiments/nn/datasets.hpp). Outside the kit, which depends on emu alone.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "nn/datasets.hpp"

namespace roundoff::data {

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

}  // namespace roundoff::data
