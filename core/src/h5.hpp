#pragma once
// A small RAII layer over the HDF5 C API (1.10) and its high-level dimension
// scale functions (H5DS*). Internal to core/: hdf5_log.cpp uses it.
//
// Errors: every failing HDF5 call becomes an h5::Error whose message names the
// operation and the object ("cannot create dataset 'loss' in '/arms/a/steps'
// of 'run.h5': ..."), followed by a summary of HDF5's error stack. HDF5's own
// printing of the error stack is turned off in every thread that calls these
// helpers (the stack is per thread in a thread-safe build).
//
// Thread safety: HDF5's high-level library is not covered by the thread-safe
// build's lock, and a non-thread-safe build may be linked instead, so callers
// that use HDF5 from more than one thread hold h5::library_lock() around every
// sequence of calls (closing handles included).

#include <hdf5.h>

#include <cstdint>
#include <filesystem>
#include <mutex>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace mpsim::core::h5 {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Turns off HDF5's automatic error printing for the calling thread (cheap
// after the first call in a thread). Every helper below calls it.
void quiet_errors();

// The innermost messages of the calling thread's HDF5 error stack, then clears it.
std::string error_stack();

// Throws Error(what + ": " + error_stack()).
[[noreturn]] void fail(const std::string& what);
// id < 0 (or status < 0) throws Error naming `what`; otherwise returns its argument.
hid_t check_id(hid_t id, const std::string& what);
herr_t check_status(herr_t status, const std::string& what);

// "'/arms/a' in 'run.h5'", for messages; never throws.
std::string describe(hid_t object);

// Process-wide lock for HDF5 calls from several threads.
std::unique_lock<std::recursive_mutex> library_lock();

// Owns one identifier of a file, group, dataset, dataspace, datatype, property
// list or attribute, and closes it with the matching H5?close. Move-only.
class Handle {
 public:
  Handle() = default;
  explicit Handle(hid_t id) : id_(id) {}
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  Handle(Handle&& other) noexcept : id_(other.id_) { other.id_ = H5I_INVALID_HID; }
  Handle& operator=(Handle&& other) noexcept;
  ~Handle() { reset(); }

  hid_t get() const { return id_; }
  explicit operator bool() const { return id_ >= 0; }
  // Closes now (errors ignored: a destructor cannot report them).
  void reset() noexcept;
  // Closes now and throws Error naming `what` if HDF5 reports a failure.
  void close(const std::string& what);
  // Forgets the identifier without closing it: for a file whose write failed,
  // which closing would try to write again (the process is about to end).
  void abandon() noexcept { id_ = H5I_INVALID_HID; }

 private:
  hid_t id_ = H5I_INVALID_HID;
};

// Wraps a freshly returned identifier; throws Error naming `what` if it is negative.
Handle take(hid_t id, const std::string& what);

// --- Files ---------------------------------------------------------------------
// Creates a new file, failing if it exists (H5F_ACC_EXCL). The file keeps
// HDF5 1.8 format structures (superblock version 2: no "open for writing"
// flags, so a file whose writer was killed after a flush still opens), and
// the writer does not take HDF5 1.10's file lock, so readers may open the file
// while it is written. Throws Error naming the path; when the file exists the
// message is "<path> exists; pass --force to overwrite".
Handle create_file(const std::filesystem::path& path);
// H5Fflush(file, H5F_SCOPE_GLOBAL).
void flush_file(hid_t file);

// --- Groups and attributes ------------------------------------------------------
Handle create_group(hid_t parent, const std::string& name);
// A group that keeps up to `compact_attributes` attributes in its object
// header (HDF5's default moves more than 8 to dense storage). copy_tree needs
// this for groups with many string attributes: libhdf5 1.10.8's H5Ocopy
// crashes (H5T__conv_vlen) copying densely stored variable-length attributes.
Handle create_group(hid_t parent, const std::string& name, unsigned compact_attributes);

// Attributes, scalar unless said otherwise; an existing attribute of the same
// name is replaced.
// Strings are variable-length UTF-8.
void write_attribute(hid_t object, const std::string& name, std::string_view value);
void write_attribute(hid_t object, const std::string& name, const char* value);
void write_attribute(hid_t object, const std::string& name, std::int32_t value);
void write_attribute(hid_t object, const std::string& name, std::int64_t value);
void write_attribute(hid_t object, const std::string& name, std::uint64_t value);
void write_attribute(hid_t object, const std::string& name, double value);
// A flag, stored as uint8 0 or 1 (as the logs' flag datasets are).
void write_attribute(hid_t object, const std::string& name, bool value);
// A 1-D attribute of variable-length UTF-8 strings (0 elements when empty).
void write_attribute(hid_t object, const std::string& name, const std::vector<std::string>& values);

// --- Datasets -------------------------------------------------------------------
// A fixed-size 1-D dataset of fixed-length, null-padded UTF-8 strings (length
// of the longest, at least 1).
Handle create_string_array(hid_t parent, const std::string& name, const std::vector<std::string>& values);

// A fixed-size dataset of `dims`, written from `data` (laid out in C order in
// the memory type `mem_type`), stored as `file_type`.
Handle create_array(hid_t parent, const std::string& name, hid_t file_type, hid_t mem_type,
                    const std::vector<hsize_t>& dims, const void* data);

// An extendible dataset of rank 1 + row_dims.size(): the first (step) axis
// starts at 0 and is unlimited, the others are row_dims. Chunked by `chunk`
// (same rank; each entry at least 1 and at most its axis's size, except on
// the first axis) and compressed with shuffle + deflate level 1.
Handle create_extendible(hid_t parent, const std::string& name, hid_t file_type,
                         const std::vector<hsize_t>& row_dims, const std::vector<hsize_t>& chunk);

// Appends `rows` rows (each the product of the dataset's other axes) from
// `data`, laid out in C order in `mem_type`.
void append_rows(hid_t dataset, hid_t mem_type, std::size_t rows, const void* data);

// Reads the whole dataset into `data` (room for every element, in C order,
// as `mem_type`).
void read_all(hid_t dataset, hid_t mem_type, void* data);

// Current extent of a dataset.
std::vector<hsize_t> extent(hid_t dataset);

// --- Dimension scales ----------------------------------------------------------------
// H5DSset_scale: makes `dataset` a dimension scale named `name`.
void make_scale(hid_t dataset, const std::string& name);
// H5DSattach_scale: attaches `scale` to axis `axis` of `dataset`.
void attach_scale(hid_t dataset, hid_t scale, unsigned axis);

// --- Copies between files ----------------------------------------------------------
// Copies the object `name` of group `from` (another file) into group `to`
// under the same name, whole. Dimension scales inside the copied tree are
// attached again in the copy as they were in the source: H5Ocopy cannot
// carry their object references across files. Both trees must sit at the
// same path in their files (the attachments are found by absolute path).
void copy_tree(hid_t from, hid_t to, const std::string& name);

}  // namespace mpsim::core::h5
