// Device time for benchmarks: CUDA events on a stream, and a bare cuBLAS GEMM
// timed launch by launch (mpsim/gpu/timing.hpp).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "check.hpp"
#include "mpsim/gpu/timing.hpp"
// nvcc's host pass rewrites core/policy.hpp's `RoundingPoint Policy::*point;`
// (reached through backend.hpp) as `RoundingPoint (Policy::*point);`, which
// g++'s -Wall flags. The header is fine as written; only this rewrite warns.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wparentheses"
#include "mpsim/gpu/backend.hpp"  // cuda_stream_of
#pragma GCC diagnostic pop

namespace mpsim::gpu {

struct EventTimer::Events {
  cudaStream_t stream = nullptr;
  std::vector<cudaEvent_t> events;  // created on demand, reused after clear()
  std::size_t used = 0;

  ~Events() {
    for (cudaEvent_t e : events) cudaEventDestroy(e);  // no throw from a destructor
  }
};

EventTimer::EventTimer() : events_(std::make_unique<Events>()) {}

EventTimer::EventTimer(core::Backend& backend) : events_(std::make_unique<Events>()) {
  events_->stream = static_cast<cudaStream_t>(cuda_stream_of(backend));
}

EventTimer::~EventTimer() = default;

void EventTimer::mark() {
  Events& e = *events_;
  if (e.used == e.events.size()) {
    cudaEvent_t event = nullptr;
    MPSIM_CUDA_CHECK(cudaEventCreate(&event));  // timing enabled: the default flags
    e.events.push_back(event);
  }
  MPSIM_CUDA_CHECK(cudaEventRecord(e.events[e.used], e.stream));
  ++e.used;
}

std::size_t EventTimer::marks() const { return events_->used; }

std::vector<double> EventTimer::intervals_ms() {
  const Events& e = *events_;
  std::vector<double> intervals;
  if (e.used == 0) return intervals;
  MPSIM_CUDA_CHECK(cudaEventSynchronize(e.events[e.used - 1]));
  for (std::size_t i = 1; i < e.used; ++i) {
    float ms = 0.0f;
    MPSIM_CUDA_CHECK(cudaEventElapsedTime(&ms, e.events[i - 1], e.events[i]));
    intervals.push_back(ms);
  }
  return intervals;
}

void EventTimer::clear() { events_->used = 0; }

namespace {

// splitmix-style finaliser: a fixed, well-mixed 32-bit word per index.
__device__ std::uint32_t hash_index(std::uint64_t i, std::uint32_t salt) {
  std::uint64_t z = i + 0x9e3779b97f4a7c15ull * (salt + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return static_cast<std::uint32_t>((z ^ (z >> 31)) >> 32);
}

// Values in [-1, 1) with full-width significands, rounded to nearest into T:
// the power a Tensor Core draws, and so its clock, depends on the bits it
// multiplies, so operands of small integers or zeros would flatter it.
template <typename T>
__global__ void fill_uniform(T* out, std::size_t n, std::uint32_t salt) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const float v = static_cast<float>(hash_index(i, salt) >> 8) * 0x1p-23f - 1.0f;  // exact in binary32
    if constexpr (std::is_same_v<T, __half>) out[i] = __float2half_rn(v);
    else if constexpr (std::is_same_v<T, __nv_bfloat16>) out[i] = __float2bfloat16_rn(v);
    else out[i] = v;
  }
}

// RAII owners, so that a check that throws half-way releases what was made.
struct OwnStream {
  cudaStream_t stream = nullptr;
  OwnStream() { MPSIM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking)); }
  ~OwnStream() {
    cudaStreamSynchronize(stream);
    cudaStreamDestroy(stream);
  }
  OwnStream(const OwnStream&) = delete;
  OwnStream& operator=(const OwnStream&) = delete;
};

struct OwnBlas {
  cublasHandle_t handle = nullptr;
  explicit OwnBlas(cudaStream_t stream) {
    MPSIM_CUBLAS_CHECK(cublasCreate(&handle));
    const cublasStatus_t status = cublasSetStream(handle, stream);
    if (status != CUBLAS_STATUS_SUCCESS) {
      cublasDestroy(handle);
      detail::check_cublas(status, "cublasSetStream(handle, stream)", __FILE__, __LINE__);
    }
  }
  ~OwnBlas() { cublasDestroy(handle); }
  OwnBlas(const OwnBlas&) = delete;
  OwnBlas& operator=(const OwnBlas&) = delete;
};

struct OwnEvents {
  std::vector<cudaEvent_t> events;
  explicit OwnEvents(std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) {
      cudaEvent_t e = nullptr;
      MPSIM_CUDA_CHECK(cudaEventCreate(&e));
      events.push_back(e);
    }
  }
  ~OwnEvents() {
    for (cudaEvent_t e : events) cudaEventDestroy(e);
  }
  OwnEvents(const OwnEvents&) = delete;
  OwnEvents& operator=(const OwnEvents&) = delete;
};

template <typename T>
GemmTiming time_typed(cudaDataType_t type, cublasComputeType_t compute, int m, int n, int k, int repetitions) {
  const auto size_a = static_cast<std::size_t>(m) * k, size_b = static_cast<std::size_t>(k) * n;
  const auto size_c = static_cast<std::size_t>(m) * n;
  OwnStream stream;
  OwnBlas blas(stream.stream);
  detail::DeviceArray<T> a(size_a), b(size_b);
  detail::DeviceArray<float> c(size_c);
  constexpr unsigned threads = 256;
  fill_uniform<T><<<detail::blocks_for(size_a, threads), threads, 0, stream.stream>>>(a.data(), size_a, 1);
  MPSIM_CUDA_CHECK_LAUNCH();
  fill_uniform<T><<<detail::blocks_for(size_b, threads), threads, 0, stream.stream>>>(b.data(), size_b, 2);
  MPSIM_CUDA_CHECK_LAUNCH();
  const float alpha = 1.0f, beta = 0.0f;
  // Row-major C = A B is column-major C^T = B^T A^T, as gemm() and the backend call it.
  const auto launch = [&] {
    MPSIM_CUBLAS_CHECK(cublasGemmEx(blas.handle, CUBLAS_OP_N, CUBLAS_OP_N, n, m, k, &alpha, b.data(), type, n,
                                    a.data(), type, k, &beta, c.data(), CUDA_R_32F, n, compute, CUBLAS_GEMM_DEFAULT));
  };
  for (int i = 0; i < 3; ++i) launch();  // heuristics, workspace and clocks settle
  OwnEvents marks(static_cast<std::size_t>(repetitions) + 1);
  MPSIM_CUDA_CHECK(cudaEventRecord(marks.events[0], stream.stream));
  for (int i = 0; i < repetitions; ++i) {
    launch();
    MPSIM_CUDA_CHECK(cudaEventRecord(marks.events[static_cast<std::size_t>(i) + 1], stream.stream));
  }
  MPSIM_CUDA_CHECK(cudaEventSynchronize(marks.events.back()));
  std::vector<double> ms;
  for (int i = 0; i < repetitions; ++i) {
    float t = 0.0f;
    MPSIM_CUDA_CHECK(cudaEventElapsedTime(&t, marks.events[static_cast<std::size_t>(i)],
                                          marks.events[static_cast<std::size_t>(i) + 1]));
    ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  GemmTiming result;
  const std::size_t mid = ms.size() / 2;
  result.median_ms = ms.size() % 2 ? ms[mid] : 0.5 * (ms[mid - 1] + ms[mid]);
  result.min_ms = ms.front();
  result.max_ms = ms.back();
  result.tflops = 2.0 * m * static_cast<double>(n) * k / (result.median_ms * 1e-3) * 1e-12;
  return result;
}

std::string version_string(int v) { return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10); }

}  // namespace

GemmTiming time_cublas_gemm(GemmInput input, int m, int n, int k, int repetitions) {
  if (m <= 0 || n <= 0 || k <= 0 || repetitions <= 0)
    throw std::invalid_argument("time_cublas_gemm: sizes and repetitions must be positive, got m=" +
                                std::to_string(m) + " n=" + std::to_string(n) + " k=" + std::to_string(k) +
                                " repetitions=" + std::to_string(repetitions));
  switch (input) {
    case GemmInput::binary32:
      return time_typed<float>(CUDA_R_32F, CUBLAS_COMPUTE_32F_PEDANTIC, m, n, k, repetitions);
    case GemmInput::tf32:
      return time_typed<float>(CUDA_R_32F, CUBLAS_COMPUTE_32F_FAST_TF32, m, n, k, repetitions);
    case GemmInput::binary16:
      return time_typed<__half>(CUDA_R_16F, CUBLAS_COMPUTE_32F, m, n, k, repetitions);
    case GemmInput::bfloat16:
      return time_typed<__nv_bfloat16>(CUDA_R_16BF, CUBLAS_COMPUTE_32F, m, n, k, repetitions);
  }
  throw std::invalid_argument("time_cublas_gemm: unknown GemmInput");
}

CudaVersions cuda_versions() {
  CudaVersions v;
  int runtime = 0, driver = 0, major = 0, minor = 0, patch = 0;
  MPSIM_CUDA_CHECK(cudaRuntimeGetVersion(&runtime));
  v.runtime = version_string(runtime);
  // Without a driver this reports 0 rather than failing.
  MPSIM_CUDA_CHECK(cudaDriverGetVersion(&driver));
  v.driver = driver ? version_string(driver) : "none";
  MPSIM_CUBLAS_CHECK(cublasGetProperty(MAJOR_VERSION, &major));
  MPSIM_CUBLAS_CHECK(cublasGetProperty(MINOR_VERSION, &minor));
  MPSIM_CUBLAS_CHECK(cublasGetProperty(PATCH_LEVEL, &patch));
  v.cublas = std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch);
  return v;
}

}  // namespace mpsim::gpu
