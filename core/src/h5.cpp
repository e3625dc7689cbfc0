#include "h5.hpp"

#include <H5DSpublic.h>

#include <algorithm>
#include <cstring>
#include <system_error>

namespace mpsim::core::h5 {

namespace {

struct StackEntry {
  std::string function, description, minor;
};

herr_t collect_entry(unsigned /*n*/, const H5E_error2_t* error, void* data) {
  auto& entries = *static_cast<std::vector<StackEntry>*>(data);
  StackEntry entry;
  if (error->func_name != nullptr) entry.function = error->func_name;
  if (error->desc != nullptr) entry.description = error->desc;
  char minor[256] = {};
  H5E_type_t type;
  if (H5Eget_msg(error->min_num, &type, minor, sizeof minor) > 0) entry.minor = minor;
  entries.push_back(std::move(entry));
  return 0;
}

std::string format_entry(const StackEntry& entry) {
  std::string text = entry.function.empty() ? std::string() : entry.function + "(): ";
  text += entry.description;
  if (!entry.minor.empty()) text += " (" + entry.minor + ")";
  return text;
}

// "<operation> '<name>' in <object>: <stack>"; the stack is read first, since
// any later HDF5 call (describe() makes some) clears it.
[[noreturn]] void fail_at(const std::string& operation, hid_t object, const std::string& name) {
  const std::string stack = error_stack();
  std::string message = operation;
  if (!name.empty()) message += " '" + name + "'";
  if (object >= 0) message += " in " + describe(object);
  throw Error(message + ": " + stack);
}

hid_t check_id_at(hid_t id, const std::string& operation, hid_t object, const std::string& name) {
  if (id < 0) fail_at(operation, object, name);
  return id;
}

void check_at(herr_t status, const std::string& operation, hid_t object, const std::string& name) {
  if (status < 0) fail_at(operation, object, name);
}

Handle make_handle(hid_t id, const std::string& operation, hid_t object, const std::string& name) {
  return Handle(check_id_at(id, operation, object, name));
}

// Replaces an existing attribute, then creates and writes one of the
// dataspace `space` (H5Screate_simple with dims 0 makes an empty array).
void write_attribute_in(hid_t object, const std::string& name, hid_t file_type, hid_t mem_type, hid_t space,
                        const void* value) {
  quiet_errors();
  const htri_t exists = H5Aexists(object, name.c_str());
  check_at(exists, "cannot look up attribute", object, name);
  if (exists > 0) check_at(H5Adelete(object, name.c_str()), "cannot replace attribute", object, name);
  Handle attribute = make_handle(H5Acreate2(object, name.c_str(), file_type, space, H5P_DEFAULT, H5P_DEFAULT),
                                 "cannot create attribute", object, name);
  check_at(H5Awrite(attribute.get(), mem_type, value), "cannot write attribute", object, name);
  attribute.close("cannot close attribute '" + name + "'");
}

void write_scalar_attribute(hid_t object, const std::string& name, hid_t file_type, hid_t mem_type,
                            const void* value) {
  quiet_errors();
  Handle space = make_handle(H5Screate(H5S_SCALAR), "cannot create dataspace for attribute", object, name);
  write_attribute_in(object, name, file_type, mem_type, space.get(), value);
}

Handle string_type(std::size_t size, const std::string& name, hid_t parent) {
  Handle type = make_handle(H5Tcopy(H5T_C_S1), "cannot create string type for", parent, name);
  check_at(H5Tset_size(type.get(), size), "cannot size string type for", parent, name);
  check_at(H5Tset_cset(type.get(), H5T_CSET_UTF8), "cannot set character set for", parent, name);
  if (size != H5T_VARIABLE) {
    check_at(H5Tset_strpad(type.get(), H5T_STR_NULLPAD), "cannot set string padding for", parent, name);
  }
  return type;
}

}  // namespace

void quiet_errors() {
  thread_local bool quiet = false;
  if (!quiet) {
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    quiet = true;
  }
}

std::string error_stack() {
  std::vector<StackEntry> entries;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, collect_entry, &entries);
  H5Eclear2(H5E_DEFAULT);
  if (entries.empty()) return "HDF5 reported no details";
  // The API function's message, then where the failure was detected.
  std::string text = format_entry(entries.front());
  if (entries.size() > 1) text += " <- " + format_entry(entries.back());
  return text;
}

void fail(const std::string& what) {
  const std::string stack = error_stack();
  throw Error(what + ": " + stack);
}

hid_t check_id(hid_t id, const std::string& what) {
  if (id < 0) fail(what);
  return id;
}

herr_t check_status(herr_t status, const std::string& what) {
  if (status < 0) fail(what);
  return status;
}

std::string describe(hid_t object) {
  std::string text;
  const ssize_t name_size = H5Iget_name(object, nullptr, 0);
  if (name_size > 0) {
    std::string name(static_cast<std::size_t>(name_size) + 1, '\0');
    H5Iget_name(object, name.data(), name.size());
    name.resize(static_cast<std::size_t>(name_size));
    text = "'" + name + "'";
  }
  const ssize_t file_size = H5Fget_name(object, nullptr, 0);
  if (file_size > 0) {
    std::string file(static_cast<std::size_t>(file_size) + 1, '\0');
    H5Fget_name(object, file.data(), file.size());
    file.resize(static_cast<std::size_t>(file_size));
    text += (text.empty() ? "'" : " of '") + file + "'";
  }
  H5Eclear2(H5E_DEFAULT);
  return text.empty() ? "an unnamed HDF5 object" : text;
}

std::unique_lock<std::recursive_mutex> library_lock() {
  static std::recursive_mutex mutex;
  return std::unique_lock<std::recursive_mutex>(mutex);
}

// --- Handle ------------------------------------------------------------------------

Handle& Handle::operator=(Handle&& other) noexcept {
  if (this != &other) {
    reset();
    id_ = other.id_;
    other.id_ = H5I_INVALID_HID;
  }
  return *this;
}

namespace {
herr_t close_id(hid_t id) {
  switch (H5Iget_type(id)) {
    case H5I_FILE: return H5Fclose(id);
    case H5I_GROUP: return H5Gclose(id);
    case H5I_DATASET: return H5Dclose(id);
    case H5I_DATASPACE: return H5Sclose(id);
    case H5I_DATATYPE: return H5Tclose(id);
    case H5I_GENPROP_LST: return H5Pclose(id);
    case H5I_ATTR: return H5Aclose(id);
    default: return H5Idec_ref(id) < 0 ? -1 : 0;
  }
}
}  // namespace

void Handle::reset() noexcept {
  if (id_ >= 0) {
    quiet_errors();
    close_id(id_);
    H5Eclear2(H5E_DEFAULT);
    id_ = H5I_INVALID_HID;
  }
}

void Handle::close(const std::string& what) {
  if (id_ < 0) return;
  quiet_errors();
  const hid_t id = id_;
  id_ = H5I_INVALID_HID;
  if (close_id(id) < 0) fail(what);
}

Handle take(hid_t id, const std::string& what) { return Handle(check_id(id, what)); }

// --- Files ---------------------------------------------------------------------------

Handle create_file(const std::filesystem::path& path) {
  quiet_errors();
  const std::string name = path.string();
  Handle access = take(H5Pcreate(H5P_FILE_ACCESS), "cannot create file access property list for " + name);
  // 1.8 structures: superblock version 2 carries no "open for writing" flag,
  // so a file whose writer died after a flush opens without h5clear; dense
  // attribute storage lets the config attribute exceed 64 KiB.
  check_status(H5Pset_libver_bounds(access.get(), H5F_LIBVER_V18, H5F_LIBVER_V18),
               "cannot set format bounds for " + name);
#if H5_VERSION_GE(1, 10, 7)
  // Readers (notebooks) may open the file while it is written.
  check_status(H5Pset_file_locking(access.get(), false, true), "cannot configure file locking for " + name);
#endif
  const hid_t file = H5Fcreate(name.c_str(), H5F_ACC_EXCL, H5P_DEFAULT, access.get());
  if (file < 0) {
    const std::string stack = error_stack();
    std::error_code ec;
    if (std::filesystem::exists(path, ec)) throw Error(name + " exists; pass --force to overwrite");
    throw Error("cannot create HDF5 file " + name + ": " + stack);
  }
  return Handle(file);
}

void flush_file(hid_t file) {
  quiet_errors();
  check_at(H5Fflush(file, H5F_SCOPE_GLOBAL), "cannot flush", file, "");
}

// --- Groups and attributes ---------------------------------------------------------------

Handle create_group(hid_t parent, const std::string& name) {
  quiet_errors();
  return make_handle(H5Gcreate2(parent, name.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                     "cannot create group", parent, name);
}

Handle create_group(hid_t parent, const std::string& name, unsigned compact_attributes) {
  quiet_errors();
  Handle create = make_handle(H5Pcreate(H5P_GROUP_CREATE), "cannot create property list for group", parent, name);
  check_at(H5Pset_attr_phase_change(create.get(), compact_attributes, compact_attributes),
           "cannot set attribute storage for group", parent, name);
  return make_handle(H5Gcreate2(parent, name.c_str(), H5P_DEFAULT, create.get(), H5P_DEFAULT),
                     "cannot create group", parent, name);
}

void write_attribute(hid_t object, const std::string& name, std::string_view value) {
  quiet_errors();
  Handle type = string_type(H5T_VARIABLE, name, object);
  const std::string copy(value);  // NUL-terminated
  const char* pointer = copy.c_str();
  write_scalar_attribute(object, name, type.get(), type.get(), &pointer);
}

void write_attribute(hid_t object, const std::string& name, const char* value) {
  write_attribute(object, name, std::string_view(value));
}

void write_attribute(hid_t object, const std::string& name, std::int32_t value) {
  write_scalar_attribute(object, name, H5T_STD_I32LE, H5T_NATIVE_INT32, &value);
}

void write_attribute(hid_t object, const std::string& name, std::int64_t value) {
  write_scalar_attribute(object, name, H5T_STD_I64LE, H5T_NATIVE_INT64, &value);
}

void write_attribute(hid_t object, const std::string& name, std::uint64_t value) {
  write_scalar_attribute(object, name, H5T_STD_U64LE, H5T_NATIVE_UINT64, &value);
}

void write_attribute(hid_t object, const std::string& name, double value) {
  write_scalar_attribute(object, name, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, &value);
}

void write_attribute(hid_t object, const std::string& name, bool value) {
  const std::uint8_t byte = value ? 1 : 0;
  write_scalar_attribute(object, name, H5T_STD_U8LE, H5T_NATIVE_UINT8, &byte);
}

void write_attribute(hid_t object, const std::string& name, const std::vector<std::string>& values) {
  quiet_errors();
  Handle type = string_type(H5T_VARIABLE, name, object);
  std::vector<const char*> pointers;
  for (const auto& value : values) pointers.push_back(value.c_str());
  const hsize_t dims[1] = {values.size()};
  Handle space = make_handle(H5Screate_simple(1, dims, nullptr), "cannot create dataspace for attribute", object, name);
  const char* none = nullptr;  // H5Awrite wants a buffer even for no elements
  write_attribute_in(object, name, type.get(), type.get(), space.get(), pointers.empty() ? &none : pointers.data());
}

// --- Datasets ------------------------------------------------------------------------------

Handle create_string_array(hid_t parent, const std::string& name, const std::vector<std::string>& values) {
  quiet_errors();
  std::size_t width = 1;
  for (const auto& value : values) width = std::max(width, value.size());
  Handle type = string_type(width, name, parent);
  std::vector<char> buffer(values.size() * width, '\0');
  for (std::size_t i = 0; i < values.size(); ++i) std::memcpy(&buffer[i * width], values[i].data(), values[i].size());
  const hsize_t dims[1] = {values.size()};
  Handle space = make_handle(H5Screate_simple(1, dims, nullptr), "cannot create dataspace for", parent, name);
  Handle dataset = make_handle(
      H5Dcreate2(parent, name.c_str(), type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
      "cannot create dataset", parent, name);
  if (!values.empty()) {
    check_at(H5Dwrite(dataset.get(), type.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, buffer.data()),
             "cannot write dataset", parent, name);
  }
  return dataset;
}

Handle create_array(hid_t parent, const std::string& name, hid_t file_type, hid_t mem_type,
                    const std::vector<hsize_t>& dims, const void* data) {
  quiet_errors();
  Handle space = make_handle(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr),
                             "cannot create dataspace for", parent, name);
  Handle dataset =
      make_handle(H5Dcreate2(parent, name.c_str(), file_type, space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                  "cannot create dataset", parent, name);
  hsize_t elements = 1;
  for (const hsize_t d : dims) elements *= d;
  if (elements > 0) {
    check_at(H5Dwrite(dataset.get(), mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data), "cannot write dataset",
             parent, name);
  }
  return dataset;
}

Handle create_extendible(hid_t parent, const std::string& name, hid_t file_type,
                         const std::vector<hsize_t>& row_dims, const std::vector<hsize_t>& chunk) {
  quiet_errors();
  const std::size_t rank = row_dims.size() + 1;
  if (chunk.size() != rank) throw Error("dataset '" + name + "': chunk rank differs from dataset rank");
  std::vector<hsize_t> dims(rank, 0), max_dims(rank, H5S_UNLIMITED), chunk_dims(rank, 1);
  chunk_dims[0] = std::max<hsize_t>(1, chunk[0]);
  for (std::size_t i = 1; i < rank; ++i) {
    dims[i] = row_dims[i - 1];
    // A zero-length axis cannot hold a chunk of 1 unless it may grow.
    max_dims[i] = dims[i] == 0 ? H5S_UNLIMITED : dims[i];
    chunk_dims[i] = std::max<hsize_t>(1, dims[i] == 0 ? chunk[i] : std::min(chunk[i], dims[i]));
  }
  Handle space = make_handle(H5Screate_simple(static_cast<int>(rank), dims.data(), max_dims.data()),
                             "cannot create dataspace for", parent, name);
  Handle create = make_handle(H5Pcreate(H5P_DATASET_CREATE), "cannot create property list for", parent, name);
  check_at(H5Pset_chunk(create.get(), static_cast<int>(rank), chunk_dims.data()), "cannot set chunking of", parent,
           name);
  check_at(H5Pset_shuffle(create.get()), "cannot set shuffle filter of", parent, name);
  // Level 1: half the CPU time of level 4 on the histograms (about 0.07 ms per
  // instrumented step of the default MLP) for files about 20% larger.
  check_at(H5Pset_deflate(create.get(), 1), "cannot set deflate filter of", parent, name);

  // Chunk cache: room for two rows of chunks (one block along the step axis),
  // so appends do not evict and re-read partly filled chunks.
  hsize_t chunk_bytes = H5Tget_size(file_type);
  hsize_t chunks_per_block = 1;
  for (std::size_t i = 0; i < rank; ++i) chunk_bytes *= chunk_dims[i];
  for (std::size_t i = 1; i < rank; ++i) chunks_per_block *= std::max<hsize_t>(1, (dims[i] + chunk_dims[i] - 1) / chunk_dims[i]);
  const hsize_t cache_bytes =
      std::clamp<hsize_t>(2 * chunks_per_block * chunk_bytes, hsize_t{1} << 20, hsize_t{64} << 20);
  Handle access = make_handle(H5Pcreate(H5P_DATASET_ACCESS), "cannot create property list for", parent, name);
  check_at(H5Pset_chunk_cache(access.get(), 12421, cache_bytes, 1.0), "cannot set chunk cache of", parent, name);

  return make_handle(
      H5Dcreate2(parent, name.c_str(), file_type, space.get(), H5P_DEFAULT, create.get(), access.get()),
      "cannot create dataset", parent, name);
}

std::vector<hsize_t> extent(hid_t dataset) {
  quiet_errors();
  Handle space = make_handle(H5Dget_space(dataset), "cannot get dataspace of", dataset, "");
  const int rank = H5Sget_simple_extent_ndims(space.get());
  if (rank < 0) fail_at("cannot get rank of", dataset, "");
  std::vector<hsize_t> dims(static_cast<std::size_t>(rank));
  if (H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr) < 0) fail_at("cannot get extent of", dataset, "");
  return dims;
}

void read_all(hid_t dataset, hid_t mem_type, void* data) {
  quiet_errors();
  check_at(H5Dread(dataset, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data), "cannot read", dataset, "");
}

void append_rows(hid_t dataset, hid_t mem_type, std::size_t rows, const void* data) {
  quiet_errors();
  if (rows == 0) return;
  const std::vector<hsize_t> old_dims = extent(dataset);
  std::vector<hsize_t> new_dims = old_dims;
  new_dims[0] += rows;
  check_at(H5Dset_extent(dataset, new_dims.data()), "cannot extend", dataset, "");
  std::vector<hsize_t> start(old_dims.size(), 0), count = old_dims;
  start[0] = old_dims[0];
  count[0] = rows;
  hsize_t elements = 1;
  for (const hsize_t c : count) elements *= c;
  if (elements == 0) return;
  Handle file_space = make_handle(H5Dget_space(dataset), "cannot get dataspace of", dataset, "");
  check_at(H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr),
           "cannot select rows of", dataset, "");
  Handle memory_space = make_handle(H5Screate_simple(static_cast<int>(count.size()), count.data(), nullptr),
                                    "cannot create memory dataspace for", dataset, "");
  check_at(H5Dwrite(dataset, mem_type, memory_space.get(), file_space.get(), H5P_DEFAULT, data),
           "cannot append rows to", dataset, "");
}

// --- Dimension scales ------------------------------------------------------------------------

void make_scale(hid_t dataset, const std::string& name) {
  quiet_errors();
  check_at(H5DSset_scale(dataset, name.c_str()), "cannot make dimension scale of", dataset, "");
}

void attach_scale(hid_t dataset, hid_t scale, unsigned axis) {
  quiet_errors();
  if (H5DSattach_scale(dataset, scale, axis) < 0) {
    const std::string stack = error_stack();
    throw Error("cannot attach dimension scale " + describe(scale) + " to axis " + std::to_string(axis) + " of " +
                describe(dataset) + ": " + stack);
  }
}

// --- Copies between files ------------------------------------------------------------------

namespace {

struct Attachment {
  std::string dataset, scale;  // absolute paths
  unsigned axis;
};

std::string path_of(hid_t object) {
  const ssize_t size = H5Iget_name(object, nullptr, 0);
  if (size <= 0) throw Error("an HDF5 object without a path");
  std::string name(static_cast<std::size_t>(size) + 1, '\0');
  H5Iget_name(object, name.data(), name.size());
  name.resize(static_cast<std::size_t>(size));
  return name;
}

// Every dataset under `root` (an open group) that has scales attached, with them.
std::vector<Attachment> attachments_under(hid_t root) {
  std::vector<std::string> datasets;
  const auto collect = [](hid_t group, const char* name, const H5L_info_t*, void* data) -> herr_t {
    H5O_info_t info;
    if (H5Oget_info_by_name(group, name, &info, H5P_DEFAULT) < 0) return -1;
    if (info.type == H5O_TYPE_DATASET) static_cast<std::vector<std::string>*>(data)->push_back(name);
    return 0;
  };
  check_status(H5Lvisit(root, H5_INDEX_NAME, H5_ITER_INC, collect, &datasets), "H5Lvisit");
  std::vector<Attachment> found;
  for (const std::string& name : datasets) {
    const Handle dataset = take(H5Dopen2(root, name.c_str(), H5P_DEFAULT), "cannot open dataset " + name);
    if (H5Aexists(dataset.get(), "DIMENSION_LIST") <= 0) continue;
    const Handle space = take(H5Dget_space(dataset.get()), "H5Dget_space");
    const int rank = H5Sget_simple_extent_ndims(space.get());
    const std::string path = path_of(dataset.get());
    for (int axis = 0; axis < rank; ++axis) {
      std::vector<std::string> scales;
      const auto add = [](hid_t, unsigned, hid_t scale, void* data) -> herr_t {
        try {  // no exception may cross HDF5's C frames
          static_cast<std::vector<std::string>*>(data)->push_back(path_of(scale));
          return 0;
        } catch (...) {
          return -1;
        }
      };
      check_status(H5DSiterate_scales(dataset.get(), static_cast<unsigned>(axis), nullptr, add, &scales),
                   "cannot list the dimension scales of " + path);
      for (const auto& scale : scales) found.push_back({path, scale, static_cast<unsigned>(axis)});
    }
  }
  return found;
}

}  // namespace

void copy_tree(hid_t from, hid_t to, const std::string& name) {
  quiet_errors();
  const Handle source = take(H5Oopen(from, name.c_str(), H5P_DEFAULT), "cannot open " + name);
  const std::vector<Attachment> attachments = attachments_under(source.get());
  check_status(H5Ocopy(from, name.c_str(), to, name.c_str(), H5P_DEFAULT, H5P_DEFAULT),
               "cannot copy " + describe(source.get()));
  // The copied reference lists point nowhere: drop them and attach afresh.
  const hid_t file = H5Iget_file_id(to);
  const Handle file_handle = take(file, "H5Iget_file_id");
  for (const Attachment& a : attachments) {
    for (const auto& [path, attribute] : {std::pair{a.dataset, "DIMENSION_LIST"}, std::pair{a.scale, "REFERENCE_LIST"}}) {
      const Handle object = take(H5Oopen(file, path.c_str(), H5P_DEFAULT), "cannot open the copy of " + path);
      if (H5Aexists(object.get(), attribute) > 0)
        check_status(H5Adelete(object.get(), attribute), "cannot reset " + std::string(attribute) + " of " + path);
    }
  }
  for (const Attachment& a : attachments) {
    const Handle dataset = take(H5Dopen2(file, a.dataset.c_str(), H5P_DEFAULT), "cannot open " + a.dataset);
    const Handle scale = take(H5Dopen2(file, a.scale.c_str(), H5P_DEFAULT), "cannot open " + a.scale);
    attach_scale(dataset.get(), scale.get(), a.axis);
  }
}

}  // namespace mpsim::core::h5
