#include "mpsim/core/tensor.hpp"

#include <stdexcept>

namespace mpsim::core {

std::int64_t element_count(const Shape& shape) {
  std::int64_t n = 1;
  for (const auto d : shape) n *= d;
  return shape.empty() ? 0 : n;
}

Tensor Tensor::reshaped(Shape shape) const {
  if (element_count(shape) != numel()) throw std::logic_error("Tensor::reshaped: element count changes");
  return Tensor(std::move(shape), buffer_, device_, type_);
}

}  // namespace mpsim::core
