#pragma once
// Device time for benchmarks (issue #4 §5): marks recorded as CUDA events on a
// stream, read once the work is done, and the throughput of a bare cuBLAS GEMM.
// The host runs ahead of the device, so a mark taken on the host at some point
// of a training step stands for the moment the device reaches the work
// enqueued before it. No CUDA type appears here.

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "mpsim/gpu/device.hpp"  // GemmInput

namespace mpsim::core {
class Backend;
}

namespace mpsim::gpu {

// Marks on one stream: the "cuda" backend's own stream, or the legacy default
// stream that the one-shot functions of device.hpp (gemm, quantize) use.
class EventTimer {
 public:
  EventTimer();  // the legacy default stream
  // The stream of a backend made by make_cuda_backend; std::invalid_argument for any other backend.
  explicit EventTimer(core::Backend& backend);
  ~EventTimer();
  EventTimer(const EventTimer&) = delete;
  EventTimer& operator=(const EventTimer&) = delete;

  // Records an event on the stream after everything enqueued so far. Never waits.
  void mark();
  std::size_t marks() const;
  // Waits for the last mark; returns the device time between consecutive
  // marks in milliseconds (marks() - 1 values; CUDA's resolution is about 0.5 us).
  std::vector<double> intervals_ms();
  // Forgets the marks (their events are reused by later marks).
  void clear();

 private:
  struct Events;
  std::unique_ptr<Events> events_;
};

// Median device time of `repetitions` back-to-back launches (after 3 untimed
// ones) of row-major c[m x n] = a[m x k] b[k x n] through cublasGemmEx, with
// the operands already stored in `input`'s type, so that no conversion is
// timed, and the compute type that gemm() and the "cuda" backend use for that
// input: binary32 PEDANTIC (no TF32), FAST_TF32, or binary32 accumulation of
// binary16 / bfloat16 products. Operands hold values in [-1, 1) drawn from a
// fixed hash of the index. Allocates its own operands; synchronises the device.
struct GemmTiming {
  double median_ms = 0.0, min_ms = 0.0, max_ms = 0.0;
  double tflops = 0.0;  // 2 m n k / median
};
GemmTiming time_cublas_gemm(GemmInput input, int m, int n, int k, int repetitions);

// Versions as "major.minor" (cuBLAS: "major.minor.patch"), for benchmark reports.
struct CudaVersions {
  std::string runtime, driver, cublas;
};
CudaVersions cuda_versions();

}  // namespace mpsim::gpu
