#include "h5util.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <stdexcept>

#include "config.hpp"

namespace roundoff::sweep {

Hid& Hid::operator=(Hid&& other) noexcept {
  if (this != &other) {
    if (id_ >= 0 && close_) close_(id_);
    id_ = other.id_, close_ = other.close_, other.id_ = -1;
  }
  return *this;
}
Hid::~Hid() {
  if (id_ >= 0 && close_) close_(id_);
}

H5Error::H5Error(const std::string& what, const std::string& reason, int error_number)
    : std::runtime_error("HDF5: " + what + " failed" + (reason.empty() ? "" : " (" + reason + ")")),
      error_number_(error_number) {}

void silence_hdf5_errors() {
  static const bool once = [] {
    H5dont_atexit();  // before any other call: it takes effect only then
    return true;
  }();
  (void)once;
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
}

namespace {

struct StackFacts {
  std::string reason;
  int error_number = 0;
};

// Walked from the innermost entry out: the first description is the reason; the file
// drivers report a failed read or write as "... errno = N, error message = ...".
herr_t note_stack_entry(unsigned, const H5E_error2_t* entry, void* data) {
  auto& facts = *static_cast<StackFacts*>(data);
  const std::string description = entry->desc ? entry->desc : "";
  if (facts.reason.empty()) facts.reason = description.substr(0, description.find_first_of(":,\n"));
  if (const auto at = description.find("errno = "); at != std::string::npos && facts.error_number == 0)
    facts.error_number = std::atoi(description.c_str() + at + 8);
  return 0;
}

}  // namespace

H5Error hdf5_error(const std::string& what) {
  StackFacts facts;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, note_stack_entry, &facts);
  return H5Error(what, facts.reason, facts.error_number);
}

void check(herr_t status, const std::string& what) {
  if (status < 0) throw hdf5_error(what);
}
Hid checked(hid_t id, herr_t (*close)(hid_t), const std::string& what) {
  if (id < 0) throw hdf5_error(what);
  return Hid(id, close);
}

Hid utf8_string_type() {
  Hid type = checked(H5Tcopy(H5T_C_S1), H5Tclose, "H5Tcopy");
  check(H5Tset_size(type.get(), H5T_VARIABLE), "H5Tset_size");
  check(H5Tset_cset(type.get(), H5T_CSET_UTF8), "H5Tset_cset");
  return type;
}

Hid simple_space(const std::vector<hsize_t>& dims, const std::vector<hsize_t>& max_dims) {
  return checked(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), max_dims.empty() ? nullptr : max_dims.data()),
                 H5Sclose, "H5Screate_simple");
}

std::vector<hsize_t> dataset_dims(hid_t dataset) {
  Hid space = checked(H5Dget_space(dataset), H5Sclose, "H5Dget_space");
  std::vector<hsize_t> dims(static_cast<std::size_t>(H5Sget_simple_extent_ndims(space.get())));
  H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
  return dims;
}

void write_attribute(hid_t object, const char* name, hid_t file_type, hid_t memory_type, const void* value) {
  Hid space = checked(H5Screate(H5S_SCALAR), H5Sclose, "H5Screate");
  Hid attribute = H5Aexists(object, name) > 0
                      ? checked(H5Aopen(object, name, H5P_DEFAULT), H5Aclose, std::string("open attribute ") + name)
                      : checked(H5Acreate2(object, name, file_type, space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose,
                                std::string("create attribute ") + name);
  check(H5Awrite(attribute.get(), memory_type, value), std::string("write attribute ") + name);
}
void write_attribute(hid_t object, const char* name, const std::string& value) {
  Hid type = utf8_string_type();
  const char* text = value.c_str();
  write_attribute(object, name, type.get(), type.get(), &text);
}
void write_attribute(hid_t object, const char* name, std::int64_t value) {
  write_attribute(object, name, H5T_STD_I64LE, H5T_NATIVE_INT64, &value);
}
void write_attribute(hid_t object, const char* name, std::uint64_t value) {
  write_attribute(object, name, H5T_STD_U64LE, H5T_NATIVE_UINT64, &value);
}

std::string read_string_attribute(hid_t object, const char* name) {
  if (H5Aexists(object, name) <= 0) return "";
  Hid attribute = checked(H5Aopen(object, name, H5P_DEFAULT), H5Aclose, std::string("open attribute ") + name);
  Hid file_type = checked(H5Aget_type(attribute.get()), H5Tclose, "H5Aget_type");
  if (H5Tget_class(file_type.get()) != H5T_STRING) return "";
  if (H5Tis_variable_str(file_type.get()) > 0) {
    Hid type = utf8_string_type();
    char* text = nullptr;
    check(H5Aread(attribute.get(), type.get(), &text), std::string("read attribute ") + name);
    std::string value = text ? text : "";
    H5free_memory(text);
    return value;
  }
  std::string value(H5Tget_size(file_type.get()), '\0');
  check(H5Aread(attribute.get(), file_type.get(), value.data()), std::string("read attribute ") + name);
  return value.substr(0, value.find('\0'));
}

std::int64_t read_int64_attribute(hid_t object, const char* name) {
  Hid attribute = checked(H5Aopen(object, name, H5P_DEFAULT), H5Aclose, std::string("open attribute ") + name);
  std::int64_t value = 0;
  check(H5Aread(attribute.get(), H5T_NATIVE_INT64, &value), std::string("read attribute ") + name);
  return value;
}

Hid creation_ordered(hid_t property_list_class) {
  Hid list = checked(H5Pcreate(property_list_class), H5Pclose, "H5Pcreate");
  check(H5Pset_link_creation_order(list.get(), H5P_CRT_ORDER_TRACKED | H5P_CRT_ORDER_INDEXED), "link order");
  if (property_list_class == H5P_FILE_CREATE)
    check(H5Pset_attr_creation_order(list.get(), H5P_CRT_ORDER_TRACKED | H5P_CRT_ORDER_INDEXED), "attribute order");
  return list;
}

Hid create_group(hid_t parent, const char* name) {
  Hid gcpl = creation_ordered(H5P_GROUP_CREATE);
  return checked(H5Gcreate2(parent, name, H5P_DEFAULT, gcpl.get(), H5P_DEFAULT), H5Gclose, std::string("create group ") + name);
}

Hid open_dataset(hid_t file, const std::string& path) {
  return checked(H5Dopen2(file, path.c_str(), H5P_DEFAULT), H5Dclose, "open dataset " + path);
}

namespace {

// HDF5 1.12 renamed the link iteration API; Debian 12 ships 1.10.
#if H5_VERSION_GE(1, 12, 0)
using LinkInfo = H5L_info2_t;
#define ROUNDOFF_H5_LITERATE H5Literate2
#else
using LinkInfo = H5L_info_t;
#define ROUNDOFF_H5_LITERATE H5Literate
#endif

herr_t collect_link_name(hid_t, const char* name, const LinkInfo*, void* names) {
  static_cast<std::vector<std::string>*>(names)->push_back(name);
  return 0;
}

}  // namespace

std::vector<std::string> link_names(hid_t group) {
  Hid gcpl = checked(H5Gget_create_plist(group), H5Pclose, "H5Gget_create_plist");
  unsigned order_flags = 0;
  check(H5Pget_link_creation_order(gcpl.get(), &order_flags), "H5Pget_link_creation_order");
  const H5_index_t index = (order_flags & H5P_CRT_ORDER_INDEXED) ? H5_INDEX_CRT_ORDER : H5_INDEX_NAME;
  std::vector<std::string> names;
  check(ROUNDOFF_H5_LITERATE(group, index, H5_ITER_INC, nullptr, collect_link_name, &names), "list a group");
  return names;
}

void reclaim_variable_length(hid_t memory_type, hid_t memory_space, void* buffer) {
#if H5_VERSION_GE(1, 12, 0)
  H5Treclaim(memory_type, memory_space, H5P_DEFAULT, buffer);
#else
  H5Dvlen_reclaim(memory_type, memory_space, H5P_DEFAULT, buffer);
#endif
}

void write_block(hid_t dataset, hid_t memory_type, const std::vector<hsize_t>& start, const std::vector<hsize_t>& count,
                 const void* data) {
  Hid file_space = checked(H5Dget_space(dataset), H5Sclose, "H5Dget_space");
  check(H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr), "select");
  Hid memory_space = simple_space(count);
  check(H5Dwrite(dataset, memory_type, memory_space.get(), file_space.get(), H5P_DEFAULT, data), "H5Dwrite");
}

LockProbe::LockProbe(const std::string& path, int how) : fd_(open(path.c_str(), O_RDONLY | O_CLOEXEC)) {
  if (fd_ < 0) return;
  while (flock(fd_, how | LOCK_NB) != 0) {
    if (errno == EINTR) continue;
    refused_ = errno == EWOULDBLOCK;
    break;
  }
}
LockProbe::~LockProbe() {
  if (fd_ >= 0) close(fd_);
}

std::string in_use_message(const std::string& path) {
  return "sweep: " + path + " is in use by another process (it holds the file's HDF5 lock: a sweep still writing it, "
         "or a program that has it open); left untouched, try again when that has finished";
}

void publish_new_file(const std::string& target, const std::function<void(const std::string&)>& write) {
  namespace fs = std::filesystem;
  const fs::path path(target);
  const fs::path folder = path.parent_path().empty() ? fs::path(".") : path.parent_path();
  std::string hidden_name(".");  // appended, not "." + ...: gcc 12 warns falsely (-Wrestrict) on that
  hidden_name += path.filename().string();
  hidden_name += ".sweep-tmp-" + std::to_string(getpid());
  const std::string temporary = (folder / hidden_name).string();
  std::error_code ignored;
  // Created here first, to report a folder we may not write to by its reason.
  const int fd = open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
  if (fd < 0)
    throw InputError("sweep: cannot create a file in '" + folder.string() + "' for " + target + ": " + std::strerror(errno));
  close(fd);
  try {
    write(temporary);
    // Held across the rename: no other process starts writing the file being replaced.
    const LockProbe old(target, LOCK_SH);
    if (old.refused()) throw InputError(in_use_message(target));
    if (std::rename(temporary.c_str(), target.c_str()) != 0)
      throw std::runtime_error("cannot rename '" + temporary + "' to '" + target + "': " + std::strerror(errno));
  } catch (...) {
    fs::remove(temporary, ignored);
    throw;
  }
}

}  // namespace roundoff::sweep
