#pragma once
// A tensor is a shape, an element type, the device its values live on, and
// an opaque, backend-owned buffer. Core never looks inside the buffer: only
// the backend that made it does, so a GPU backend can hold device memory
// here without core naming a CUDA type. Backend's public calls check the
// type and device of every tensor they are given (backend.hpp), so a
// tensor never reaches a backend that would misread it.

#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "mpsim/core/names.hpp"

namespace mpsim::core {

using Shape = std::vector<std::int64_t>;

std::int64_t element_count(const Shape& shape);

// What one element is, as the ops read and write it. A backend may store a
// tensor more narrowly (the CUDA backend keeps binary16 values in 2 bytes),
// but its values are binary32 values.
enum class ElementType : std::uint8_t { binary32 };
inline constexpr EnumNames<ElementType, 1> element_type_names{{"binary32"}};
inline std::string_view to_string(ElementType type) { return element_type_names(type); }

// Where the values live: host memory or a CUDA device's.
enum class Device : std::uint8_t { host, cuda };
inline constexpr EnumNames<Device, 2> device_names{{"host", "cuda"}};
inline std::string_view to_string(Device device) { return device_names(device); }

class Tensor {
 public:
  Tensor() = default;
  Tensor(Shape shape, std::shared_ptr<void> buffer, Device device = Device::host,
         ElementType type = ElementType::binary32)
      : shape_(std::move(shape)), buffer_(std::move(buffer)), device_(device), type_(type) {}

  const Shape& shape() const { return shape_; }
  std::int64_t numel() const { return element_count(shape_); }
  std::int64_t rows() const { return shape_.empty() ? 0 : shape_[0]; }
  std::int64_t cols() const { return rows() == 0 ? 0 : numel() / rows(); }
  bool empty() const { return buffer_ == nullptr; }
  Device device() const { return device_; }
  ElementType element_type() const { return type_; }
  // Same buffer, device and type, another shape with the same number of elements.
  Tensor reshaped(Shape shape) const;
  void* buffer() const { return buffer_.get(); }

 private:
  Shape shape_;
  std::shared_ptr<void> buffer_;
  Device device_ = Device::host;
  ElementType type_ = ElementType::binary32;
};

}  // namespace mpsim::core
