#include "merge.hpp"

#include <sys/file.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <map>
#include <numeric>
#include <optional>
#include <regex>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "cli.hpp"
#include "config.hpp"
#include "h5file.hpp"
#include "h5util.hpp"
#include "shard.hpp"
#include "signals.hpp"

namespace roundoff::sweep {

namespace {

const char* const kMergeUsage = "usage: sweep merge OUT.h5 SHARD.h5... [--force] [--quiet]";

struct MergeArguments {
  std::string output;
  std::vector<std::string> shards;
  bool force = false, quiet = false;
};

MergeArguments parse_merge_arguments(int argc, char** argv) {
  MergeArguments args;
  std::vector<std::string> files;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--force") args.force = true;
    else if (arg == "--quiet" || arg == "-q") args.quiet = true;
    else if (arg.size() > 1 && arg[0] == '-')
      throw InputError("sweep merge: unknown option '" + arg + "'" + did_you_mean(arg, {"--force", "--quiet"}) + " (" +
                       kMergeUsage + ")");
    else files.push_back(arg);
  }
  if (files.size() < 2) throw InputError(std::string("sweep merge: needs an output and at least one shard file (") + kMergeUsage + ")");
  args.output = files.front();
  args.shards.assign(files.begin() + 1, files.end());
  return args;
}

// Root attributes that belong to one shard, not to the merged file.
const std::set<std::string> kShardOnlyAttributes = {"shard_index", "shard_count", "config_path"};
// Root attributes that legitimately differ between shards.
const std::set<std::string> kPerFileAttributes = {"created", "status"};

struct ShardFile {
  std::string path;
  Hid file;
  std::string config_sha256, roundoff_version, git_commit, status, experiment, config_path, created;
  std::int64_t n_points = 0, replicas = 0;
  Shard shard;
  std::vector<std::uint8_t> done_replicas;  // [P * R]
};

// ---- reading values generically ------------------------------------------------------

// The value of one element in memory (a native type), as bytes that compare equal exactly
// when the values are the same: numbers bit for bit, strings and variable-length sequences
// by content, compounds and arrays member by member.
std::string element_value(hid_t type, const unsigned char* element) {
  const std::size_t size = H5Tget_size(type);
  switch (H5Tget_class(type)) {
    case H5T_STRING:
      if (H5Tis_variable_str(type) > 0) {
        const char* text = *reinterpret_cast<char* const*>(element);
        return text ? "s" + std::string(text) : "n";
      }
      return std::string(reinterpret_cast<const char*>(element), size);
    case H5T_VLEN: {
      const auto* sequence = reinterpret_cast<const hvl_t*>(element);
      Hid base = checked(H5Tget_super(type), H5Tclose, "H5Tget_super");
      const std::size_t base_size = H5Tget_size(base.get());
      std::string value = "v" + std::to_string(sequence->len) + ":";
      for (std::size_t i = 0; i < sequence->len; ++i)
        value += element_value(base.get(), static_cast<const unsigned char*>(sequence->p) + i * base_size);
      return value;
    }
    case H5T_COMPOUND: {
      std::string value;
      for (int m = 0; m < H5Tget_nmembers(type); ++m) {
        Hid member = checked(H5Tget_member_type(type, static_cast<unsigned>(m)), H5Tclose, "H5Tget_member_type");
        value += element_value(member.get(), element + H5Tget_member_offset(type, static_cast<unsigned>(m)));
      }
      return value;
    }
    case H5T_ARRAY: {
      Hid base = checked(H5Tget_super(type), H5Tclose, "H5Tget_super");
      const std::size_t base_size = H5Tget_size(base.get());
      std::string value;
      for (std::size_t offset = 0; offset < size; offset += base_size) value += element_value(base.get(), element + offset);
      return value;
    }
    default:
      return std::string(reinterpret_cast<const char*>(element), size);
  }
}

bool has_variable_length(hid_t type) {
  return H5Tdetect_class(type, H5T_VLEN) > 0 || (H5Tget_class(type) == H5T_STRING && H5Tis_variable_str(type) > 0) ||
         [&] {
           if (H5Tget_class(type) != H5T_COMPOUND) return false;
           for (int m = 0; m < H5Tget_nmembers(type); ++m) {
             Hid member(H5Tget_member_type(type, static_cast<unsigned>(m)), H5Tclose);
             if (has_variable_length(member.get())) return true;
           }
           return false;
         }();
}

// A buffer of elements of a native memory type that frees what HDF5 allocated in it for
// variable-length values (over `space`, its shape) when destroyed.
class ElementBuffer {
 public:
  ElementBuffer(hid_t memory_type, std::vector<hsize_t> shape, const std::string& fill)
      : type_(memory_type), shape_(std::move(shape)), vlen_(has_variable_length(memory_type)) {
    std::size_t n = 1;
    for (hsize_t d : shape_) n *= d;
    count_ = n;
    bytes_.resize(n * fill.size());
    for (std::size_t i = 0; i < n; ++i) std::memcpy(bytes_.data() + i * fill.size(), fill.data(), fill.size());
  }
  ~ElementBuffer() {
    if (vlen_ && count_) {
      Hid space = simple_space(shape_);
      reclaim_variable_length(type_, space.get(), bytes_.data());
    }
  }
  ElementBuffer(const ElementBuffer&) = delete;
  ElementBuffer& operator=(const ElementBuffer&) = delete;
  unsigned char* data() { return bytes_.data(); }
  const std::vector<hsize_t>& shape() const { return shape_; }

 private:
  hid_t type_;
  std::vector<hsize_t> shape_;
  bool vlen_;
  std::size_t count_ = 0;
  std::vector<unsigned char> bytes_;
};

// ---- attributes ----------------------------------------------------------------------

herr_t collect_attribute_name(hid_t, const char* name, const H5A_info_t*, void* names) {
  static_cast<std::vector<std::string>*>(names)->push_back(name);
  return 0;
}

// In creation order where the object tracks it, else by name.
std::vector<std::string> attribute_names(hid_t object) {
  std::vector<std::string> names;
  if (H5Aiterate2(object, H5_INDEX_CRT_ORDER, H5_ITER_INC, nullptr, collect_attribute_name, &names) >= 0) return names;
  names.clear();
  check(H5Aiterate2(object, H5_INDEX_NAME, H5_ITER_INC, nullptr, collect_attribute_name, &names), "list attributes");
  return names;
}

struct AttributeValue {
  Hid file_type, memory_type, space;
  std::vector<hsize_t> shape;
  std::unique_ptr<ElementBuffer> buffer;
  std::string value;  // element_value of every element, for comparisons
};

AttributeValue read_attribute(hid_t object, const std::string& name) {
  AttributeValue a;
  Hid attribute = checked(H5Aopen(object, name.c_str(), H5P_DEFAULT), H5Aclose, "open attribute " + name);
  a.file_type = checked(H5Aget_type(attribute.get()), H5Tclose, "H5Aget_type");
  a.memory_type = checked(H5Tget_native_type(a.file_type.get(), H5T_DIR_ASCEND), H5Tclose, "H5Tget_native_type");
  a.space = checked(H5Aget_space(attribute.get()), H5Sclose, "H5Aget_space");
  const int rank = H5Sget_simple_extent_ndims(a.space.get());
  a.shape.resize(static_cast<std::size_t>(std::max(rank, 0)));
  H5Sget_simple_extent_dims(a.space.get(), a.shape.data(), nullptr);
  const std::size_t size = H5Tget_size(a.memory_type.get());
  a.buffer = std::make_unique<ElementBuffer>(a.memory_type.get(), a.shape, std::string(size, '\0'));
  check(H5Aread(attribute.get(), a.memory_type.get(), a.buffer->data()), "read attribute " + name);
  const auto n = static_cast<std::size_t>(H5Sget_simple_extent_npoints(a.space.get()));
  for (std::size_t i = 0; i < n; ++i) a.value += element_value(a.memory_type.get(), a.buffer->data() + i * size);
  return a;
}

void write_attribute_copy(hid_t object, const std::string& name, const AttributeValue& a) {
  if (H5Aexists(object, name.c_str()) > 0) check(H5Adelete(object, name.c_str()), "replace attribute " + name);
  Hid attribute = checked(H5Acreate2(object, name.c_str(), a.file_type.get(), a.space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose,
                          "create attribute " + name);
  check(H5Awrite(attribute.get(), a.memory_type.get(), a.buffer->data()), "write attribute " + name);
}

// ---- the merge -----------------------------------------------------------------------

// SIGINT or SIGTERM during the merge: the unfinished output is removed, exit 130.
struct MergeInterrupted {};
void stop_if_asked() {
  if (stop_requested().load()) throw MergeInterrupted{};
}

// A new creation property list of `plist_class` (file or group) that tracks the link and
// attribute creation order as `group` does. A copied list would carry the source's storage
// details, which HDF5 1.10 cannot use for a new group; the file's own list does not hold
// its root group's order.
Hid ordered_like(hid_t group, hid_t plist_class) {
  Hid source = checked(H5Gget_create_plist(group), H5Pclose, "H5Gget_create_plist");
  unsigned link_order = 0, attribute_order = 0;
  check(H5Pget_link_creation_order(source.get(), &link_order), "H5Pget_link_creation_order");
  check(H5Pget_attr_creation_order(source.get(), &attribute_order), "H5Pget_attr_creation_order");
  Hid list = checked(H5Pcreate(plist_class), H5Pclose, "H5Pcreate");
  check(H5Pset_link_creation_order(list.get(), link_order), "link order");
  check(H5Pset_attr_creation_order(list.get(), attribute_order), "attribute order");
  return list;
}

class Merger {
 public:
  Merger(const std::vector<ShardFile>& shards, const std::vector<std::size_t>& owner_file)
      : shards_(shards), owner_file_(owner_file), n_points_(static_cast<hsize_t>(shards.front().n_points)),
        replicas_(static_cast<std::size_t>(shards.front().replicas)) {
    // The files holding runs of each point: one (most points) or several (split points).
    holders_.resize(n_points_);
    for (hsize_t p = 0; p < n_points_; ++p)
      for (std::size_t r = 0; r < replicas_; ++r) {
        const std::size_t f = owner_file_[p * replicas_ + r];
        if (std::find(holders_[p].begin(), holders_[p].end(), f) == holders_[p].end()) holders_[p].push_back(f);
      }
  }

  void write(const std::string& path) {
    Hid first_root = checked(H5Gopen2(shards_.front().file.get(), "/", H5P_DEFAULT), H5Gclose, "open /");
    Hid fcpl = ordered_like(first_root.get(), H5P_FILE_CREATE);
    Hid out(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, fcpl.get(), H5P_DEFAULT), H5Fclose);
    if (out.get() < 0) throw std::runtime_error("cannot create '" + path + "'");
    std::vector<Hid> roots;
    std::vector<hid_t> root_ids;
    for (const ShardFile& s : shards_) {
      roots.push_back(checked(H5Gopen2(s.file.get(), "/", H5P_DEFAULT), H5Gclose, "open /"));
      root_ids.push_back(roots.back().get());
    }
    Hid out_root = checked(H5Gopen2(out.get(), "/", H5P_DEFAULT), H5Gclose, "open /");
    copy_root_attributes(root_ids, out_root.get());
    merge_group(root_ids, out_root.get(), "");
    write_attribute(out.get(), "status", std::string("complete"));
    check(H5Fclose(out.release()), "H5Fclose");
  }

 private:
  [[noreturn]] void differ(const std::string& what, std::size_t a, std::size_t b) const {
    throw InputError("sweep merge: " + shards_[a].path + " and " + shards_[b].path + " differ in " + what +
                     ", which should be the same in every shard of one config; not merged");
  }

  void copy_root_attributes(const std::vector<hid_t>& roots, hid_t out) {
    std::string created = shards_.front().created;
    for (const ShardFile& s : shards_) created = std::min(created, s.created);
    const std::vector<std::string> names = attribute_names(roots.front());
    for (std::size_t f = 1; f < roots.size(); ++f)
      if (attribute_names(roots[f]) != names) differ("their root attributes", 0, f);
    for (const std::string& name : names) {
      if (kShardOnlyAttributes.count(name)) continue;
      const AttributeValue value = read_attribute(roots.front(), name);
      if (!kPerFileAttributes.count(name))
        for (std::size_t f = 1; f < roots.size(); ++f)
          if (read_attribute(roots[f], name).value != value.value) differ("the root attribute " + name, 0, f);
      write_attribute_copy(out, name, value);
    }
    write_attribute(out, "created", created);
  }

  void copy_attributes(const std::vector<hid_t>& objects, hid_t out, const std::string& path) {
    const std::vector<std::string> names = attribute_names(objects.front());
    for (std::size_t f = 1; f < objects.size(); ++f)
      if (attribute_names(objects[f]) != names) differ("the attributes of " + path, 0, f);
    for (const std::string& name : names) {
      const AttributeValue value = read_attribute(objects.front(), name);
      for (std::size_t f = 1; f < objects.size(); ++f)
        if (read_attribute(objects[f], name).value != value.value) differ("the attribute " + name + " of " + path, 0, f);
      write_attribute_copy(out, name, value);
    }
  }

  void merge_group(const std::vector<hid_t>& groups, hid_t out, const std::string& path) {
    const std::vector<std::string> names = link_names(groups.front());
    for (std::size_t f = 1; f < groups.size(); ++f) {
      std::vector<std::string> theirs = link_names(groups[f]), ours = names;
      std::sort(theirs.begin(), theirs.end());
      std::sort(ours.begin(), ours.end());
      if (theirs != ours) differ("the contents of " + (path.empty() ? std::string("/") : path), 0, f);
    }
    for (const std::string& name : names) {
      stop_if_asked();
      const std::string child_path = path + "/" + name;
      std::vector<Hid> children;
      std::vector<hid_t> ids;
      H5O_type_t type = H5O_TYPE_UNKNOWN;
      for (std::size_t f = 0; f < groups.size(); ++f) {
        children.push_back(checked(H5Oopen(groups[f], name.c_str(), H5P_DEFAULT), H5Oclose, "open " + child_path));
        ids.push_back(children.back().get());
        H5I_type_t kind = H5Iget_type(ids.back());
        const H5O_type_t this_type = kind == H5I_GROUP ? H5O_TYPE_GROUP : kind == H5I_DATASET ? H5O_TYPE_DATASET : H5O_TYPE_UNKNOWN;
        if (f == 0) type = this_type;
        else if (this_type != type) differ("the kind of " + child_path, 0, f);
      }
      if (type == H5O_TYPE_GROUP) {
        Hid gcpl = ordered_like(ids.front(), H5P_GROUP_CREATE);
        Hid group = checked(H5Gcreate2(out, name.c_str(), H5P_DEFAULT, gcpl.get(), H5P_DEFAULT), H5Gclose, "create group " + child_path);
        copy_attributes(ids, group.get(), child_path);
        merge_group(ids, group.get(), child_path);
      } else if (type == H5O_TYPE_DATASET) {
        merge_dataset(ids, out, name, child_path);
      } else {
        throw InputError("sweep merge: " + shards_.front().path + ": " + child_path + " is neither a group nor a dataset; not merged");
      }
    }
  }

  void merge_dataset(const std::vector<hid_t>& sets, hid_t out_group, const std::string& name, const std::string& path) {
    Hid file_type = checked(H5Dget_type(sets.front()), H5Tclose, "H5Dget_type");
    std::vector<std::vector<hsize_t>> dims;
    for (std::size_t f = 0; f < sets.size(); ++f) {
      Hid type = checked(H5Dget_type(sets[f]), H5Tclose, "H5Dget_type");
      if (H5Tequal(type.get(), file_type.get()) <= 0) differ("the type of " + path, 0, f);
      dims.push_back(dataset_dims(sets[f]));
      if (dims.back().size() != dims.front().size()) differ("the rank of " + path, 0, f);
    }
    Hid memory_type = checked(H5Tget_native_type(file_type.get(), H5T_DIR_ASCEND), H5Tclose, "H5Tget_native_type");
    Hid dcpl = checked(H5Dget_create_plist(sets.front()), H5Pclose, "H5Dget_create_plist");
    std::vector<hsize_t> max_dims(dims.front().size());
    {
      Hid space = checked(H5Dget_space(sets.front()), H5Sclose, "H5Dget_space");
      H5Sget_simple_extent_dims(space.get(), nullptr, max_dims.data());
    }
    // The fill value, as the element where nothing was written.
    std::string fill(H5Tget_size(memory_type.get()), '\0');
    H5D_fill_value_t defined = H5D_FILL_VALUE_UNDEFINED;
    check(H5Pfill_value_defined(dcpl.get(), &defined), "H5Pfill_value_defined");
    if (defined != H5D_FILL_VALUE_UNDEFINED) check(H5Pget_fill_value(dcpl.get(), memory_type.get(), fill.data()), "H5Pget_fill_value");

    const bool is_table = dims.front().size() == 1 && H5Tget_class(file_type.get()) == H5T_COMPOUND &&
                          H5Tget_member_index(file_type.get(), "point") >= 0;
    const bool by_point = !is_table && !dims.front().empty() && dims.front()[0] == n_points_;
    std::vector<hsize_t> merged = dims.front();
    for (std::size_t f = 1; f < sets.size(); ++f)
      for (std::size_t k = 0; k < merged.size(); ++k) {
        if (dims[f][k] == merged[k]) continue;
        if (is_table && k == 0) continue;  // tables: their own lengths, summed below
        if ((!by_point || k == 0) || (max_dims[k] != H5S_UNLIMITED && std::max(dims[f][k], merged[k]) > max_dims[k]))
          differ("the shape of " + path, 0, f);
        merged[k] = std::max(merged[k], dims[f][k]);
      }

    if (path == "/done") {
      if (!by_point || merged.size() != 1) throw InputError("sweep merge: " + shards_.front().path + ": /done is not [n_points]");
      Hid dataset = create(out_group, name, file_type.get(), merged, max_dims, dcpl.get());
      const std::vector<std::uint8_t> ones(n_points_, 1);
      write_block(dataset.get(), H5T_NATIVE_UINT8, {0}, {n_points_}, ones.data());
      copy_attributes(sets, dataset.get(), path);
    } else if (is_table) {
      merge_table(sets, out_group, name, path, file_type.get(), memory_type.get(), max_dims, dcpl.get(), fill);
    } else if (by_point) {
      Hid dataset = create(out_group, name, file_type.get(), merged, max_dims, dcpl.get());
      copy_attributes(sets, dataset.get(), path);
      merge_rows(sets, dims, dataset.get(), merged, memory_type.get(), fill, path);
    } else {
      // The source's own dataspace: scalar and empty (null) ones too.
      Hid space = checked(H5Dget_space(sets.front()), H5Sclose, "H5Dget_space");
      Hid dataset = checked(H5Dcreate2(out_group, name.c_str(), file_type.get(), space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT),
                            H5Dclose, "create dataset " + name);
      copy_attributes(sets, dataset.get(), path);
      copy_identical(sets, dataset.get(), memory_type.get(), fill, path);
    }
  }

  static Hid create(hid_t group, const std::string& name, hid_t file_type, const std::vector<hsize_t>& dims,
                    std::vector<hsize_t> max_dims, hid_t dcpl) {
    for (std::size_t k = 0; k < dims.size(); ++k)
      if (max_dims[k] != H5S_UNLIMITED) max_dims[k] = std::max(max_dims[k], dims[k]);
    Hid space = simple_space(dims, max_dims);
    return checked(H5Dcreate2(group, name.c_str(), file_type, space.get(), H5P_DEFAULT, dcpl, H5P_DEFAULT), H5Dclose,
                   "create dataset " + name);
  }

  // A failed read of shard file f: the file is damaged (it opened and was checked whole
  // before, so its layout is sound; its data are not).
  void check_read(herr_t status, std::size_t f, const std::string& what) const {
    if (status < 0)
      throw InputError("sweep merge: " + shards_[f].path + " is damaged: " + hdf5_error(what).what() + "; not merged");
  }

  // Reads rows [first, first + count) of shard file f's `dataset` (its own extent `dims`)
  // into rows [at, at + count) of `buffer` (shape: rows x the merged extent).
  void read_rows(std::size_t f, hid_t dataset, const std::vector<hsize_t>& dims, hsize_t first, hsize_t count,
                 ElementBuffer& buffer, hsize_t at, hid_t memory_type) const {
    std::vector<hsize_t> start(dims.size(), 0), block = dims, memory_start(dims.size(), 0);
    start[0] = first, block[0] = count, memory_start[0] = at;
    Hid file_space = checked(H5Dget_space(dataset), H5Sclose, "H5Dget_space");
    check(H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, start.data(), nullptr, block.data(), nullptr), "select rows");
    Hid memory_space = simple_space(buffer.shape());
    check(H5Sselect_hyperslab(memory_space.get(), H5S_SELECT_SET, memory_start.data(), nullptr, block.data(), nullptr), "select rows");
    check_read(H5Dread(dataset, memory_type, memory_space.get(), file_space.get(), H5P_DEFAULT, buffer.data()), f, "read rows");
  }

  void merge_rows(const std::vector<hid_t>& sets, const std::vector<std::vector<hsize_t>>& dims, hid_t out,
                  const std::vector<hsize_t>& merged, hid_t memory_type, const std::string& fill, const std::string& path) {
    const std::size_t element_size = fill.size();
    hsize_t row_elements = 1;
    for (std::size_t k = 1; k < merged.size(); ++k) row_elements *= merged[k];
    const std::size_t row_bytes = std::max<std::size_t>(1, row_elements * element_size);
    const hsize_t block_rows = std::max<hsize_t>(1, (std::size_t{64} << 20) / row_bytes);  // 64 MiB at a time
    const std::string fill_value = element_value(memory_type, reinterpret_cast<const unsigned char*>(fill.data()));
    std::vector<hsize_t> row_shape = merged;
    row_shape[0] = 1;
    for (hsize_t first = 0; first < n_points_; first += block_rows) {
      stop_if_asked();
      const hsize_t rows = std::min(block_rows, n_points_ - first);
      std::vector<hsize_t> shape = merged;
      shape[0] = rows;
      ElementBuffer buffer(memory_type, shape, fill);
      for (hsize_t p = first; p < first + rows;) {
        if (holders_[p].size() == 1) {
          // A run of points held whole by one file: one read.
          const std::size_t f = holders_[p].front();
          hsize_t end = p + 1;
          while (end < first + rows && holders_[end].size() == 1 && holders_[end].front() == f) ++end;
          read_rows(f, sets[f], dims[f], p, end - p, buffer, p - first, memory_type);
          p = end;
          continue;
        }
        // A point split between files: each element from the file that wrote it.
        unsigned char* target = buffer.data() + (p - first) * row_bytes;
        std::vector<std::unique_ptr<ElementBuffer>> parts;
        for (std::size_t f : holders_[p]) {
          parts.push_back(std::make_unique<ElementBuffer>(memory_type, row_shape, fill));
          read_rows(f, sets[f], dims[f], p, 1, *parts.back(), 0, memory_type);
        }
        for (hsize_t e = 0; e < row_elements; ++e) {
          std::optional<std::size_t> source;
          std::string source_value;
          for (std::size_t h = 0; h < parts.size(); ++h) {
            const std::string value = element_value(memory_type, parts[h]->data() + e * element_size);
            if (value == fill_value) continue;
            if (source && value != source_value)
              throw InputError("sweep merge: " + shards_[holders_[p][*source]].path + " and " + shards_[holders_[p][h]].path +
                               " hold different values for point " + std::to_string(p) + " in " + path + "; not merged");
            if (!source) source = h, source_value = value;
          }
          if (!source) continue;
          unsigned char* element = parts[*source]->data() + e * element_size;
          std::memcpy(target + e * element_size, element, element_size);
          std::memset(element, 0, element_size);  // now owned by `buffer` (variable-length data)
        }
        ++p;
      }
      std::vector<hsize_t> start(merged.size(), 0);
      start[0] = first;
      write_block(out, memory_type, start, shape, buffer.data());
    }
  }

  void copy_identical(const std::vector<hid_t>& sets, hid_t out, hid_t memory_type, const std::string& fill, const std::string& path) {
    Hid space = checked(H5Dget_space(sets.front()), H5Sclose, "H5Dget_space");
    const auto elements = static_cast<std::size_t>(std::max<hssize_t>(0, H5Sget_simple_extent_npoints(space.get())));
    std::vector<std::unique_ptr<ElementBuffer>> buffers;
    std::vector<std::string> values;
    for (std::size_t f = 0; f < sets.size(); ++f) {
      buffers.push_back(std::make_unique<ElementBuffer>(memory_type, std::vector<hsize_t>{elements}, fill));
      if (elements) check_read(H5Dread(sets[f], memory_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, buffers.back()->data()), f, "read " + path);
      std::string value;
      for (std::size_t e = 0; e < elements; ++e) value += element_value(memory_type, buffers.back()->data() + e * fill.size());
      values.push_back(std::move(value));
      if (values.back() != values.front()) differ(path + " (not indexed by point, so it cannot be combined)", 0, f);
    }
    if (elements) check(H5Dwrite(out, memory_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, buffers.front()->data()), "write " + path);
  }

  void merge_table(const std::vector<hid_t>& sets, hid_t out_group, const std::string& name, const std::string& path,
                   hid_t file_type, hid_t memory_type, const std::vector<hsize_t>& max_dims, hid_t dcpl, const std::string& fill) {
    const std::size_t row_size = fill.size();
    const bool has_replica = H5Tget_member_index(file_type, "replica") >= 0;
    struct Key {
      std::int64_t point = 0, replica = 0;
    };
    Hid key_type = checked(H5Tcreate(H5T_COMPOUND, sizeof(Key)), H5Tclose, "H5Tcreate");
    check(H5Tinsert(key_type.get(), "point", HOFFSET(Key, point), H5T_NATIVE_INT64), "H5Tinsert");
    if (has_replica) check(H5Tinsert(key_type.get(), "replica", HOFFSET(Key, replica), H5T_NATIVE_INT64), "H5Tinsert");
    struct Row {
      Key key;
      std::size_t file, index;
    };
    std::vector<std::unique_ptr<ElementBuffer>> tables;
    std::vector<Row> rows;
    for (std::size_t f = 0; f < sets.size(); ++f) {
      const hsize_t n = dataset_dims(sets[f])[0];
      tables.push_back(std::make_unique<ElementBuffer>(memory_type, std::vector<hsize_t>{n}, fill));
      std::vector<Key> keys(n);
      if (n) {
        check_read(H5Dread(sets[f], memory_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, tables.back()->data()), f, "read " + path);
        check_read(H5Dread(sets[f], key_type.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, keys.data()), f, "read " + path + " point");
      }
      for (hsize_t i = 0; i < n; ++i) {
        const Key k = keys[i];
        if (k.point < 0 || static_cast<hsize_t>(k.point) >= n_points_ || k.replica < 0 || static_cast<std::size_t>(k.replica) >= replicas_)
          throw InputError("sweep merge: " + shards_[f].path + ": " + path + " row " + std::to_string(i) +
                           " names a run the sweep does not have; not merged");
        // Each run's rows come from the file that holds the run.
        if (owner_file_[static_cast<std::size_t>(k.point) * replicas_ + static_cast<std::size_t>(k.replica)] == f)
          rows.push_back({k, f, static_cast<std::size_t>(i)});
      }
    }
    std::stable_sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) {
      return a.key.point != b.key.point ? a.key.point < b.key.point : a.key.replica < b.key.replica;
    });
    const hsize_t total = rows.size();
    std::vector<unsigned char> merged(std::max<std::size_t>(1, rows.size() * row_size));
    for (std::size_t i = 0; i < rows.size(); ++i)  // copies of the rows: the tables keep owning their data
      std::memcpy(merged.data() + i * row_size, tables[rows[i].file]->data() + rows[i].index * row_size, row_size);
    Hid dataset = create(out_group, name, file_type, {total}, max_dims, dcpl);
    copy_attributes(sets, dataset.get(), path);
    if (total) write_block(dataset.get(), memory_type, {0}, {total}, merged.data());
  }

  const std::vector<ShardFile>& shards_;
  const std::vector<std::size_t>& owner_file_;
  hsize_t n_points_;
  std::size_t replicas_;
  std::vector<std::vector<std::size_t>> holders_;  // [point]: files holding its runs
};

// ---- checks --------------------------------------------------------------------------

ShardFile open_shard(const std::string& path) {
  ShardFile s;
  s.path = path;
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) throw InputError("sweep merge: " + path + ": no such file");
  if (LockProbe(path, LOCK_SH).refused()) throw InputError(in_use_message(path));
  if (H5Fis_hdf5(path.c_str()) <= 0) throw InputError("sweep merge: " + path + " is not an HDF5 file");
  check_readable_output(path, "sweep merge");
  s.file = Hid(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  if (s.file.get() < 0) throw InputError("sweep merge: " + path + ": cannot open it as HDF5");
  const hid_t f = s.file.get();
  s.config_sha256 = read_string_attribute(f, "config_sha256");
  if (s.config_sha256.empty() || H5Lexists(f, "done", H5P_DEFAULT) <= 0)
    throw InputError("sweep merge: " + path + " is not a roundoff sweep output");
  if (H5Aexists(f, "shard_index") <= 0)
    throw InputError("sweep merge: " + path + " is not a shard file (no shard_index attribute): it holds a whole sweep");
  if (H5Lexists(f, "done_replicas", H5P_DEFAULT) <= 0)
    throw InputError("sweep merge: " + path + " has no /done_replicas (written by an older build?); not merged");
  s.roundoff_version = read_string_attribute(f, "roundoff_version");
  s.git_commit = read_string_attribute(f, "git_commit");
  s.status = read_string_attribute(f, "status");
  s.experiment = read_string_attribute(f, "experiment");
  s.config_path = read_string_attribute(f, "config_path");
  s.created = read_string_attribute(f, "created");
  s.n_points = read_int64_attribute(f, "n_points");
  s.replicas = read_int64_attribute(f, "replicas");
  const std::int64_t index = read_int64_attribute(f, "shard_index"), count = read_int64_attribute(f, "shard_count");
  if (count < 1 || count > kMaxShards || index < 0 || index >= count || s.n_points < 0 || s.replicas < 1 ||
      static_cast<std::uint64_t>(s.n_points) * static_cast<std::uint64_t>(s.replicas) > kMaxRuns)
    throw InputError("sweep merge: " + path + ": its shard_index, shard_count, n_points or replicas are out of range");
  s.shard = Shard{static_cast<std::uint32_t>(index), static_cast<std::uint32_t>(count)};
  s.done_replicas.resize(static_cast<std::size_t>(s.n_points * s.replicas));
  Hid done = open_dataset(f, "done_replicas");
  if (dataset_dims(done.get()) != std::vector<hsize_t>{static_cast<hsize_t>(s.n_points), static_cast<hsize_t>(s.replicas)})
    throw InputError("sweep merge: " + path + ": /done_replicas is not [n_points, replicas]");
  check(H5Dread(done.get(), H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, s.done_replicas.data()), "read done_replicas");
  return s;
}

// "a.h5 (X), b.h5 (Y)": the files grouped by a property.
template <typename Property>
std::string grouped(const std::vector<ShardFile>& shards, Property property) {
  std::map<std::string, std::vector<std::string>> groups;
  std::vector<std::string> order;
  for (const ShardFile& s : shards) {
    const std::string key = property(s);
    if (!groups.count(key)) order.push_back(key);
    groups[key].push_back(s.path);
  }
  std::string text;
  for (const std::string& key : order) {
    std::string files;
    for (const std::string& path : groups[key]) files += (files.empty() ? "" : ", ") + path;
    text += (text.empty() ? "" : "; ") + files + " (" + key + ")";
  }
  return text;
}

// Where the shard `shard` of the files' split would be written: beside the given shards,
// named as they are (x.shard-K-of-N.h5), or after the merged output.
std::string missing_shard_path(const std::vector<ShardFile>& shards, const std::string& output, const Shard& shard) {
  static const std::regex pattern(R"((.*)\.shard-[0-9]+-of-[0-9]+(\.[^./]*)?)");
  const std::filesystem::path first(shards.front().path);
  std::smatch match;
  const std::string name = first.filename().string();
  if (std::regex_match(name, match, pattern))
    return (first.parent_path() / (match[1].str() + ".shard-" + std::to_string(shard.index) + "-of-" +
                                   std::to_string(shard.count) + match[2].str()))
        .string();
  return shard_output_path(output, shard);
}

void check_shards(const std::vector<ShardFile>& shards) {
  if (std::any_of(shards.begin(), shards.end(), [&](const ShardFile& s) { return s.config_sha256 != shards.front().config_sha256; }))
    throw InputError("sweep merge: the files come from different configs (config_sha256): " +
                     grouped(shards, [](const ShardFile& s) { return s.experiment + ", config_sha256 " + s.config_sha256.substr(0, 12) + "..."; }) +
                     "; merge the shards of one config");
  if (std::any_of(shards.begin(), shards.end(), [&](const ShardFile& s) {
        return s.roundoff_version != shards.front().roundoff_version || s.git_commit != shards.front().git_commit;
      }))
    throw InputError("sweep merge: the shards come from different builds: " +
                     grouped(shards, [](const ShardFile& s) { return "roundoff " + s.roundoff_version + ", git_commit " + s.git_commit; }) +
                     "; one file holds one build's numbers: recompute the odd shards with one build (sweep CONFIG --shard K/N --force)");
  if (std::any_of(shards.begin(), shards.end(), [&](const ShardFile& s) { return s.shard.count != shards.front().shard.count; }))
    throw InputError("sweep merge: the shards come from different splits: " +
                     grouped(shards, [](const ShardFile& s) { return "of " + std::to_string(s.shard.count) + " shards"; }) +
                     "; merge the shards of one split");
  std::map<std::uint32_t, std::string> seen;
  for (const ShardFile& s : shards) {
    const auto [it, fresh] = seen.emplace(s.shard.index, s.path);
    if (!fresh)
      throw InputError("sweep merge: shard " + s.shard.text() + " is given twice (" + it->second + " and " + s.path +
                       "): its runs would be merged twice; give each shard once");
  }
}

}  // namespace

int merge_main(int argc, char** argv) {
  silence_hdf5_errors();
  const MergeArguments args = parse_merge_arguments(argc, argv);
  namespace fs = std::filesystem;
  std::error_code ec;
  for (const std::string& shard : args.shards)
    if (fs::exists(args.output, ec) && fs::equivalent(args.output, shard, ec))
      throw InputError("sweep merge: the output " + args.output + " is also given as a shard; name a new file for the output");

  std::vector<ShardFile> shards;
  for (const std::string& path : args.shards) shards.push_back(open_shard(path));
  check_shards(shards);
  const ShardFile& first = shards.front();
  const auto n_points = static_cast<std::uint32_t>(first.n_points), replicas = static_cast<std::uint32_t>(first.replicas);
  const Shard split{0, first.shard.count};
  const std::vector<std::uint32_t> owners = item_owners(n_points, replicas, split.count);

  // Every file marks done only runs of its own shard.
  for (const ShardFile& s : shards)
    for (std::size_t i = 0; i < owners.size(); ++i)
      if (s.done_replicas[i] && owners[i] != s.shard.index)
        throw InputError("sweep merge: " + s.path + " marks point " + std::to_string(i / replicas) + " replica " +
                         std::to_string(i % replicas) + " done, which shard " + s.shard.text() +
                         " does not hold (a file not written by sweep --shard?); not merged");

  // What is missing: shards not given, and runs not yet done in the given ones.
  const std::string config = shell_quoted(first.config_path.empty() ? "CONFIG" : first.config_path);
  std::map<std::uint32_t, const ShardFile*> by_index;
  for (const ShardFile& s : shards) by_index[s.shard.index] = &s;
  std::vector<std::string> problems;
  std::vector<std::uint32_t> more_missing;
  std::size_t missing_runs = 0;
  constexpr std::size_t kListed = 8;
  for (std::uint32_t k = 0; k < split.count; ++k) {
    const Shard shard{k, split.count};
    const auto it = by_index.find(k);
    std::vector<PointWork> todo = shard_items(n_points, replicas, shard);
    if (it != by_index.end()) {
      for (PointWork& w : todo)
        w.replicas.erase(std::remove_if(w.replicas.begin(), w.replicas.end(),
                                        [&](std::uint32_t r) { return it->second->done_replicas[std::size_t{w.point} * replicas + r]; }),
                         w.replicas.end());
      todo.erase(std::remove_if(todo.begin(), todo.end(), [](const PointWork& w) { return w.replicas.empty(); }), todo.end());
      if (todo.empty() && it->second->status == "complete") continue;
    }
    std::size_t runs = 0;
    for (const PointWork& w : todo) runs += w.replicas.size();
    missing_runs += runs;
    if (problems.size() == kListed) {
      more_missing.push_back(k);
      continue;
    }
    const std::string items = runs ? ", " + std::to_string(runs) + " run" + (runs > 1 ? "s" : "") + ": " + describe_items(todo, replicas, 6) : "";
    if (it == by_index.end()) {
      const std::string path = missing_shard_path(shards, args.output, shard);
      problems.push_back("shard " + shard.text() + " is missing (" + (runs ? items.substr(2) : "no runs") +
                         "); compute it with: sweep " + config + " --shard " + shard.text() + " -o " + shell_quoted(path));
    } else {
      // A file that says complete but lacks runs was not finished by sweep: computed anew.
      const bool claims_complete = it->second->status == "complete";
      problems.push_back("shard " + shard.text() + " (" + it->second->path + ") is unfinished (status " + it->second->status +
                         items + "); " + (claims_complete ? "recompute" : "finish") + " it with: sweep " + config +
                         " --shard " + shard.text() + " -o " + shell_quoted(it->second->path) +
                         (claims_complete ? " --force" : " --resume"));
    }
  }
  if (!problems.empty()) {
    std::string message = "sweep merge: " + args.output + " not written: " + std::to_string(missing_runs) + " of " +
                          std::to_string(owners.size()) + " runs are missing; ";
    for (std::size_t i = 0; i < problems.size(); ++i) message += (i ? "; " : "") + problems[i];
    if (!more_missing.empty()) {
      std::vector<PointWork> as_items;  // describe_items prints index ranges compactly
      for (std::uint32_t k : more_missing) as_items.push_back({k, {0}});
      message += "; and " + std::to_string(more_missing.size()) + " more shards, computed or finished the same way (" +
                 describe_items(as_items, 1, 20).substr(describe_items(as_items, 1, 20).find(' ') + 1) + ")";
    }
    throw InputError(message);
  }

  // The output: like sweep's own, an existing merge of this config is shown, not redone.
  const ExistingOutput existing = inspect_output(args.output);
  if (existing.kind == ExistingOutput::Kind::in_use) throw InputError(in_use_message(args.output));
  if (existing.kind != ExistingOutput::Kind::missing && !args.force) {
    if (existing.kind == ExistingOutput::Kind::roundoff && !existing.shard && existing.config_sha256 == first.config_sha256 &&
        existing.status == "complete") {
      check_readable_output(args.output, "sweep merge");
      std::fprintf(stderr, "sweep merge: %s is already the complete output of this config; showing it (--force merges again)\n",
                   args.output.c_str());
      if (!args.quiet) print_summary(args.output);
      return 0;
    }
    throw InputError("sweep merge: " + args.output + " exists; left untouched (choose another output, or --force to replace it)");
  }

  std::vector<std::size_t> owner_file(owners.size());
  for (std::size_t f = 0; f < shards.size(); ++f)
    for (std::size_t i = 0; i < owners.size(); ++i)
      if (owners[i] == shards[f].shard.index) owner_file[i] = f;
  Merger merger(shards, owner_file);
  try {
    publish_new_file(args.output, [&](const std::string& temporary) { merger.write(temporary); });
  } catch (const MergeInterrupted&) {
    std::fprintf(stderr, "sweep merge: interrupted; %s not written\n", args.output.c_str());
    return 130;
  } catch (const H5Error& e) {
    if (e.error_number() == 0) throw;  // a full disk or an I/O error: the environment's, not a bug
    throw InputError("sweep merge: cannot write " + args.output + ": " + std::strerror(e.error_number()) + " (" + e.what() +
                     "); not written, the shards are unchanged");
  }
  std::fprintf(stderr, "sweep merge: wrote %s from %zu shards (%zu runs)\n", args.output.c_str(), shards.size(), owners.size());
  if (!args.quiet) print_summary(args.output);
  return 0;
}

}  // namespace roundoff::sweep
