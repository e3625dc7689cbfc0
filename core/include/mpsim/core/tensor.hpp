#pragma once
// A tensor is a shape and an opaque, backend-owned buffer of binary32 values.
// Core never looks inside the buffer: only the backend that made it does, so a
// GPU backend can hold device memory here without core naming a CUDA type.

#include <cstdint>
#include <memory>
#include <vector>

namespace mpsim::core {

using Shape = std::vector<std::int64_t>;

std::int64_t element_count(const Shape& shape);

class Tensor {
 public:
  Tensor() = default;
  Tensor(Shape shape, std::shared_ptr<void> buffer) : shape_(std::move(shape)), buffer_(std::move(buffer)) {}

  const Shape& shape() const { return shape_; }
  std::int64_t numel() const { return element_count(shape_); }
  std::int64_t rows() const { return shape_.empty() ? 0 : shape_[0]; }
  std::int64_t cols() const { return rows() == 0 ? 0 : numel() / rows(); }
  bool empty() const { return buffer_ == nullptr; }
  // Same buffer, another shape with the same number of elements.
  Tensor reshaped(Shape shape) const;
  void* buffer() const { return buffer_.get(); }

 private:
  Shape shape_;
  std::shared_ptr<void> buffer_;
};

}  // namespace mpsim::core
