// The arm result file: written and read field by field from one table
// (arm_result_fields); the layout is in arm_result_file.hpp.
#include "mpsim/core/arm_result_file.hpp"

#include <cstring>
#include <fstream>
#include <stdexcept>
#include <type_traits>

namespace mpsim::core {
namespace {

namespace fs = std::filesystem;

constexpr char magic[8] = {'m', 'p', 's', 'i', 'm', 'A', 'r', 'm'};

// A value is kept as raw bytes: a trivially copyable scalar, or a string or
// vector of trivially copyable elements.
template <typename T>
constexpr bool is_scalar_field = std::is_trivially_copyable_v<T>;
template <typename T>
std::size_t element_size() {
  if constexpr (is_scalar_field<T>) {
    return sizeof(T);
  } else {
    static_assert(std::is_trivially_copyable_v<typename T::value_type>);
    return sizeof(typename T::value_type);
  }
}

class Writer {
 public:
  explicit Writer(const fs::path& path) : out_(path, std::ios::binary | std::ios::trunc) {}
  void bytes(const void* data, std::size_t n) { out_.write(static_cast<const char*>(data), static_cast<std::streamsize>(n)); }
  template <typename T>
  void word(T v) {
    bytes(&v, sizeof v);
  }
  template <typename T>
  void field(std::string_view name, const T& value) {
    word<std::uint64_t>(name.size());
    bytes(name.data(), name.size());
    word<std::uint64_t>(element_size<T>());
    if constexpr (is_scalar_field<T>) {
      bytes(&value, sizeof value);
    } else {
      word<std::uint64_t>(value.size());
      bytes(value.data(), value.size() * element_size<T>());
    }
  }
  bool ok() const { return out_.good(); }

 private:
  std::ofstream out_;
};

class Reader {
 public:
  explicit Reader(const fs::path& path) : path_(path), in_(path, std::ios::binary) {
    std::error_code ec;
    left_ = fs::file_size(path, ec);
    if (!in_ || ec) throw std::runtime_error("cannot read result file '" + path.string() + "'");
  }
  [[noreturn]] void fail(const std::string& what) const {
    throw std::runtime_error("result file '" + path_.string() + "' " + what);
  }
  // n bytes that `what` needs; a shorter file is truncated there.
  void bytes(void* data, std::uint64_t n, std::string_view what) {
    if (n > left_) fail("is truncated in " + std::string(what));
    in_.read(static_cast<char*>(data), static_cast<std::streamsize>(n));
    if (!in_) fail("cannot be read at " + std::string(what));
    left_ -= n;
  }
  template <typename T>
  T word(std::string_view what) {
    T v{};
    bytes(&v, sizeof v, what);
    return v;
  }
  template <typename T>
  void field(std::string_view name, T& value) {
    const std::string where = "field '" + std::string(name) + "'";
    const std::uint64_t length = word<std::uint64_t>(where);
    if (length > left_) fail("is truncated in " + where);
    std::string found(length, '\0');
    bytes(found.data(), length, where);
    if (found != name) fail("has field '" + found + "' where this build has '" + std::string(name) + "'");
    const std::uint64_t size = word<std::uint64_t>(where);
    if (size != element_size<T>())
      fail("has " + where + " with elements of " + std::to_string(size) + " bytes; this build's have " +
           std::to_string(element_size<T>()));
    if constexpr (is_scalar_field<T>) {
      bytes(&value, sizeof value, where);
    } else {
      const std::uint64_t count = word<std::uint64_t>(where);
      if (count > left_ / size) fail("is truncated in " + where);
      value.resize(count);
      bytes(value.data(), count * size, where);
    }
  }
  std::uint64_t left() const { return left_; }

 private:
  fs::path path_;
  std::ifstream in_;
  std::uint64_t left_ = 0;
};

}  // namespace

void write_arm_result(const fs::path& path, const ArmResult& result) {
  Writer out(path);
  out.bytes(magic, sizeof magic);
  out.word<std::uint32_t>(arm_result_file_version);
  out.word<std::uint32_t>(arm_result_fields.size());
  for (const ArmResultField& f : arm_result_fields)
    std::visit([&](auto member) { out.field(f.name, result.*member); }, f.member);
  if (!out.ok()) throw std::runtime_error("cannot write result file '" + path.string() + "'");
}

ArmResult read_arm_result(const fs::path& path) {
  Reader in(path);
  char head[sizeof magic];
  in.bytes(head, sizeof head, "its header");
  if (std::memcmp(head, magic, sizeof magic) != 0) in.fail("is not an mpsim arm result");
  const auto version = in.word<std::uint32_t>("its header");
  if (version != arm_result_file_version)
    in.fail("has version " + std::to_string(version) + "; this build reads version " +
            std::to_string(arm_result_file_version));
  const auto fields = in.word<std::uint32_t>("its header");
  if (fields != arm_result_fields.size())
    in.fail("has " + std::to_string(fields) + " fields; this build's ArmResult has " +
            std::to_string(arm_result_fields.size()));
  ArmResult result;
  for (const ArmResultField& f : arm_result_fields)
    std::visit([&](auto member) { in.field(f.name, result.*member); }, f.member);
  if (in.left() != 0) in.fail("has " + std::to_string(in.left()) + " bytes after its last field");
  return result;
}

}  // namespace mpsim::core
