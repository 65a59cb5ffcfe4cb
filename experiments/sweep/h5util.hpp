// Small helpers over the HDF5 C API shared by the sweep's writer (h5file) and `sweep merge`:
// owned identifiers, checked calls, attributes, hyperslab writes, link listing, the file
// lock probe and publishing a new file under its final name only once it is complete.
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace roundoff::sweep {

// An HDF5 identifier closed when it goes out of scope.
class Hid {
 public:
  Hid() = default;
  Hid(hid_t id, herr_t (*close)(hid_t)) : id_(id), close_(close) {}
  Hid(Hid&& other) noexcept : id_(other.id_), close_(other.close_) { other.id_ = -1; }
  Hid& operator=(Hid&& other) noexcept;
  Hid(const Hid&) = delete;
  Hid& operator=(const Hid&) = delete;
  ~Hid();
  hid_t get() const { return id_; }
  // Gives up ownership (to close it explicitly and check the result).
  hid_t release() { return std::exchange(id_, -1); }

 private:
  hid_t id_ = -1;
  herr_t (*close_)(hid_t) = nullptr;
};

// A failed HDF5 call: "HDF5: WHAT failed (REASON)", REASON the innermost message of HDF5's
// error stack; for a failed read or write of the file, the errno it reported (else 0): a
// full disk or an I/O error, the environment's problem rather than a bug.
class H5Error : public std::runtime_error {
 public:
  H5Error(const std::string& what, const std::string& reason, int error_number);
  int error_number() const { return error_number_; }

 private:
  int error_number_;
};

// Failures are reported by return codes and turned into H5Error: HDF5's own error stack
// printing is switched off, and so is its clean-up at exit (after a failed H5Fclose, on a
// full disk, HDF5 1.10's clean-up closes the broken file again and crashes; the kernel
// closes the files at exit anyway).
void silence_hdf5_errors();
void check(herr_t status, const std::string& what);
Hid checked(hid_t id, herr_t (*close)(hid_t), const std::string& what);
// The H5Error for the failed call `what`, from HDF5's current error stack.
H5Error hdf5_error(const std::string& what);

Hid utf8_string_type();
Hid simple_space(const std::vector<hsize_t>& dims, const std::vector<hsize_t>& max_dims = {});
std::vector<hsize_t> dataset_dims(hid_t dataset);

// Creates or overwrites a scalar attribute (overwriting keeps its creation order).
void write_attribute(hid_t object, const char* name, hid_t file_type, hid_t memory_type, const void* value);
void write_attribute(hid_t object, const char* name, const std::string& value);
void write_attribute(hid_t object, const char* name, std::int64_t value);
void write_attribute(hid_t object, const char* name, std::uint64_t value);
// "" when the attribute is missing or not a string.
std::string read_string_attribute(hid_t object, const char* name);
std::int64_t read_int64_attribute(hid_t object, const char* name);

// A group (or, with H5P_FILE_CREATE, a file) that tracks the creation order of its links and
// attributes, so that readers list parameters and metrics in the experiment's order.
Hid creation_ordered(hid_t property_list_class);
Hid create_group(hid_t parent, const char* name);
Hid open_dataset(hid_t file, const std::string& path);

// The names of a group's links, in creation order where the group tracks it, else by name.
std::vector<std::string> link_names(hid_t group);
// Frees the variable-length data HDF5 allocated while reading into `buffer`.
void reclaim_variable_length(hid_t memory_type, hid_t memory_space, void* buffer);

// Writes the block [start, start + count) of a dataset from contiguous memory.
void write_block(hid_t dataset, hid_t memory_type, const std::vector<hsize_t>& start, const std::vector<hsize_t>& count,
                 const void* data);

// HDF5 (1.10 on) holds a flock() on every file it has open, exclusive for writing and
// shared for reading (unless HDF5_USE_FILE_LOCKING=FALSE). This takes one on `path` too,
// without waiting, and keeps it until destroyed: `refused()` means another process holds a
// conflicting one (LOCK_SH: a writer; LOCK_EX: any writer or reader).
class LockProbe {
 public:
  LockProbe(const std::string& path, int how);
  ~LockProbe();
  LockProbe(const LockProbe&) = delete;
  LockProbe& operator=(const LockProbe&) = delete;
  bool refused() const { return refused_; }

 private:
  int fd_;
  bool refused_ = false;
};

// The one-line message for an output that another process holds (exit status 2).
std::string in_use_message(const std::string& path);

// Writes a new file with `write(temporary_path)` under a temporary name in `target`'s folder
// (.NAME.sweep-tmp-PID), then renames it onto `target` (replacing a file there, unless
// another process holds that one open for writing: InputError). A crash or signal at any
// moment leaves at `target` the old file (or none) or the complete new one.
void publish_new_file(const std::string& target, const std::function<void(const std::string&)>& write);

}  // namespace roundoff::sweep
