#pragma once
// A causal language-modelling task small enough for a test: windows of 8
// tokens over a repeating text of 5 symbols, each position labelled with the
// next token; 64 training and 16 test samples.

#include <cstdint>

#include "mpsim/core/data.hpp"

namespace mpsim::test {

inline core::TrainTest tiny_text() {
  core::TrainTest t;
  for (core::Dataset* d : {&t.train, &t.test}) {
    d->count = d == &t.train ? 64 : 16;
    d->height = 1;
    d->width = 8;
    d->classes = 5;
    d->labels_per_sample = 8;
    for (std::int64_t s = 0; s < d->count; ++s)
      for (std::int64_t i = 0; i < 8; ++i) {
        d->images.push_back(static_cast<float>((s * 3 + i) % 5));
        d->labels.push_back(static_cast<std::int32_t>((s * 3 + i + 1) % 5));
      }
  }
  return t;
}

}  // namespace mpsim::test
