// The CUDA training backend ("cuda"): core's Backend with device tensors and
// every op enqueued on one CUDA stream that the backend owns (cuBLAS too).
// Host code only (g++): the kernels live in kernels_*.cu behind kernels.hpp.
// Its semantics are the CPU backend's (core/src/cpu_backend.cpp), op by op;
// docs/gpu.md says which ops give the same bits and which agree within
// stated bounds, and which calls wait for the device.
//
// Memory: a tensor's opaque buffer is a TensorStorage, whose device memory
// comes from a caching pool (like the CPU backend's BufferPool). Memory
// released on the host goes back to the pool at once, while kernels that use
// it may still be queued: that is safe because the pool only hands it out
// again to work enqueued later on the same stream, which runs after them.
//
// Storage: a tensor holds binary32 values until a rounding point rounds it
// to a format of at most 16 bits (binary16, bfloat16, FP8, custom); from
// then on it holds that format's encodings (device_storage.hpp: the bits of
// __half, __nv_bfloat16, __nv_fp8_*), 1 or 2 bytes a value, until an op
// writes it again. cuBLAS reads binary16 and bfloat16 tensors as stored; the
// other ops read a narrow tensor through a binary32 copy widened into pool
// memory just before them (in()), and write binary32 (out(), inout()). Every
// value is the one the CPU backend holds: the codec and the widening are
// exact, and the rounding happened once, in the rounding kernel.
#include <algorithm>
#include <bit>
#include <array>
#include <climits>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "attention_cublas.hpp"
#include "check.hpp"
#include "kernels.hpp"
#include "launch.hpp"
#include "mpsim/core/block_scaled_gemm.hpp"
#include "mpsim/gpu/backend.hpp"
#include "mpsim/gpu/block_quantize.hpp"
#include "mpsim/gpu/device.hpp"
#include "mpsim/gpu/device_format.hpp"
#include "mpsim/gpu/device_storage.hpp"

namespace mpsim::gpu {
namespace {

using core::Activation;
using core::AttentionShape;
using core::ConvGeometry;
using core::FusedAttention;
using core::Counter;
using core::InternalRounding;
using core::RoundingPoint;
using core::RoundResult;
using core::Shape;
using core::Tensor;
using core::TensorStats;

// A tensor's device memory: binary32 values, or (narrow) the encodings of a
// format of at most 16 bits, laid out as the binary32 factor that widening
// multiplies by at byte 0 and the codes from byte narrow_offset.
struct TensorStorage {
  static constexpr std::uint32_t cuda_tag = 0x6d707367;  // "mpsg": made by this backend (cuda_storage_bytes checks)
  std::uint32_t tag = cuda_tag;
  std::shared_ptr<void> memory;  // from the pool
  bool narrow = false;
  DeviceFormat format{};  // narrow: the codes' format
  bool unscaled = false;  // narrow: the factor is known to be 1 (cuBLAS may read the codes)
  bool zeros = false;     // binary32 +0.0 everywhere (zeros(), not written since): values of every format
};

bool same_values(const DeviceFormat& a, const DeviceFormat& b) {
  return a.exponent_bits == b.exponent_bits && a.mantissa_bits == b.mantissa_bits &&
         a.flush_to_zero == b.flush_to_zero && a.has_infinity == b.has_infinity && a.has_nan == b.has_nan;
}

// Whether every value of t is known to be a value of `format`, unscaled:
// stored narrow in it, or all zeros.
bool holds_values_of(const TensorStorage* b, const DeviceFormat& format) {
  return b && (b->zeros || (b->narrow && b->unscaled && same_values(b->format, format)));
}
constexpr std::size_t narrow_offset = 256;  // cudaMalloc's alignment, kept for cuBLAS

// What an op reads: a tensor's binary32 memory, or, for a narrow tensor, a
// binary32 copy widened into pool memory that `hold` keeps until the op is
// queued (CudaBackend::in). Take every input before any output (out, inout): an output may
// share the input's buffer.
struct Input {
  const float* values = nullptr;
  std::shared_ptr<void> hold;
  operator const float*() const { return values; }  // NOLINT: reads like the pointer it stands for
};

TensorStorage* buffer_of(const Tensor& t) { return static_cast<TensorStorage*>(t.buffer()); }

// Whether a rounding to `format` stores the tensor narrow.
bool stored_narrow(const Format& format) {
  return format.invalid_reason() == std::nullopt && fits_in_float(format) && format.total_bits() <= 16;
}

void require(bool ok, const char* what) {
  if (!ok) throw std::logic_error(std::string("cuda backend: ") + what);
}

// cuBLAS takes int dimensions.
int as_int(std::int64_t value, const char* what) {
  if (value < 0 || value > INT_MAX)
    throw std::invalid_argument(std::string("cuda backend: gemm: ") + what + " = " + std::to_string(value) +
                                " does not fit cuBLAS's int");
  return static_cast<int>(value);
}

// Device buffers recycled by size (rounded up to 256 bytes, cudaMalloc's
// alignment): a training step allocates the same shapes every step, and
// cudaMalloc per op would cost more than many ops and may synchronise.
class DevicePool {
 public:
  DevicePool() = default;
  DevicePool(const DevicePool&) = delete;
  DevicePool& operator=(const DevicePool&) = delete;
  ~DevicePool() {
    for (auto& [size, list] : free_)
      for (void* p : list) cudaFree(p);  // no throw from a destructor
  }

  std::shared_ptr<void> get(std::size_t bytes, const std::shared_ptr<DevicePool>& self) {
    const std::size_t size = std::max<std::size_t>(256, (bytes + 255) / 256 * 256);
    void* p = take(size);
    if (!p) p = allocate(size);
    return std::shared_ptr<void>(p, [self, size](void* q) { self->put(q, size); });
  }

 private:
  void* take(std::size_t size) {
    std::lock_guard lock(mutex_);
    auto it = free_.find(size);
    if (it == free_.end() || it->second.empty()) return nullptr;
    void* p = it->second.back();
    it->second.pop_back();
    return p;
  }
  void put(void* p, std::size_t size) {
    std::lock_guard lock(mutex_);
    free_[size].push_back(p);
  }
  void* allocate(std::size_t size) {
    void* p = nullptr;
    cudaError_t status = cudaMalloc(&p, size);
    if (status == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();  // handled here: not to be reported by a later launch check
      release_cached();
      status = cudaMalloc(&p, size);
    }
    if (status != cudaSuccess) {
      (void)cudaGetLastError();
      detail::check_cuda(status, "cudaMalloc", __FILE__, __LINE__);
    }
    return p;
  }
  // Out of memory: gives the cached buffers back. Queued work may still use
  // them, so wait for the device first.
  void release_cached() {
    MPSIM_CUDA_CHECK(cudaDeviceSynchronize());
    std::lock_guard lock(mutex_);
    for (auto& [size, list] : free_)
      for (void* p : list) MPSIM_CUDA_CHECK(cudaFree(p));
    free_.clear();
  }

  std::mutex mutex_;
  std::unordered_map<std::size_t, std::vector<void*>> free_;
};

// RAII owners of the backend's CUDA objects, so that a constructor that
// throws half-way releases what it had made.
struct Stream {
  cudaStream_t stream = nullptr;
  // Non-blocking: the legacy default stream (the one-shot functions of
  // device.hpp) never waits for it, nor it for them.
  Stream() { MPSIM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking)); }
  ~Stream() {
    cudaStreamSynchronize(stream);
    cudaStreamDestroy(stream);
  }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
};

struct Blas {
  cublasHandle_t handle = nullptr;
  explicit Blas(cudaStream_t stream) {
    MPSIM_CUBLAS_CHECK(cublasCreate(&handle));
    const cublasStatus_t status = cublasSetStream(handle, stream);
    if (status != CUBLAS_STATUS_SUCCESS) {
      cublasDestroy(handle);
      detail::check_cublas(status, "cublasSetStream(handle, stream)", __FILE__, __LINE__);
    }
  }
  ~Blas() { cublasDestroy(handle); }
  Blas(const Blas&) = delete;
  Blas& operator=(const Blas&) = delete;
};

// Page-locked host memory: device-to-host copies into it are truly
// asynchronous, so a result is read after one stream synchronisation.
template <typename T>
class Pinned {
 public:
  explicit Pinned(std::size_t n) { reserve(n); }
  ~Pinned() { cudaFreeHost(data_); }
  Pinned(const Pinned&) = delete;
  Pinned& operator=(const Pinned&) = delete;
  T* data() { return data_; }
  // Grows (contents lost) to hold n values. Only between synchronisations:
  // no copy into it may be pending.
  void reserve(std::size_t n) {
    if (n <= size_ && data_) return;
    cudaFreeHost(data_);
    data_ = nullptr;
    size_ = 0;
    MPSIM_CUDA_CHECK(cudaMallocHost(&data_, std::max<std::size_t>(n, 1) * sizeof(T)));
    size_ = std::max<std::size_t>(n, 1);
  }

 private:
  T* data_ = nullptr;
  std::size_t size_ = 0;
};

// Uploads through a ring of page-locked buffers, so that a copy never makes
// the host wait for the stream (the driver may do that to stage a copy from
// pageable memory). Each slot records an event after its copy; the host
// waits on a slot's event only when it comes round again, `slots` uploads
// later: the batch of a step is two uploads, so only a host some steps ahead
// of the device waits, and then only for the device to catch up.
class UploadRing {
 public:
  UploadRing() {
    for (Slot& slot : slots_) MPSIM_CUDA_CHECK(cudaEventCreateWithFlags(&slot.done, cudaEventDisableTiming));
  }
  ~UploadRing() {
    for (Slot& slot : slots_) {
      if (slot.done) cudaEventSynchronize(slot.done), cudaEventDestroy(slot.done);
      cudaFreeHost(slot.data);
    }
  }
  UploadRing(const UploadRing&) = delete;
  UploadRing& operator=(const UploadRing&) = delete;

  void copy(void* device, const void* host, std::size_t bytes, cudaStream_t stream) {
    Slot& slot = slots_[next_];
    next_ = (next_ + 1) % slots_.size();
    MPSIM_CUDA_CHECK(cudaEventSynchronize(slot.done));  // its previous copy: `slots` uploads ago
    if (slot.size < bytes) {
      MPSIM_CUDA_CHECK(cudaFreeHost(slot.data));
      slot.data = nullptr;
      slot.size = 0;
      MPSIM_CUDA_CHECK(cudaMallocHost(&slot.data, bytes));
      slot.size = bytes;
    }
    std::memcpy(slot.data, host, bytes);
    MPSIM_CUDA_CHECK(cudaMemcpyAsync(device, slot.data, bytes, cudaMemcpyHostToDevice, stream));
    MPSIM_CUDA_CHECK(cudaEventRecord(slot.done, stream));
  }

 private:
  struct Slot {
    void* data = nullptr;
    std::size_t size = 0;
    cudaEvent_t done = nullptr;
  };
  std::array<Slot, 8> slots_{};
  std::size_t next_ = 0;
};

// Statistics of one call, in one device block copied back at once: the
// histogram, the counters (rounding counters, then swallowed updates), the
// amax (a binary32 pattern in the low bytes of its word).
constexpr int bins_at = 0;
constexpr int counters_at = detail::histogram_bins;
constexpr int counter_words = 8;
constexpr int amax_at = counters_at + counter_words;
constexpr int stats_words = amax_at + 1;
static_assert(kernels::update_counter_count <= counter_words && detail::rounding_counter_count <= counter_words);
static_assert(kernels::swallowed_counter >= detail::rounding_counter_count);

// Which Tensor Core input type holds every value of both operands. A scaled
// rounding point's values are its format's values times a power of two
// (docs/policies.md), so they can sit anywhere in binary32's range: only the
// types with binary32's exponent range (bfloat16, TF32) hold them whatever
// the scale, while binary16 holds the values of an unscaled binary16-like
// format only. The FP8 presets scale, hence bfloat16 for every format of at
// most 7 mantissa bits. What the range argument misses (values scaled below
// 2^-126, or a scaled binary16 point) is caught on the device: the conversion
// flags any value that changes, and the next synchronisation throws.
bool narrow_enough(const Format& f, int mantissa_bits) { return fits_in_float(f) && f.mantissa_bits <= mantissa_bits; }

bool binary16_holds(const Format& f) {
  return narrow_enough(f, formats::binary16.mantissa_bits) &&
         f.emin() - f.mantissa_bits >= formats::binary16.emin() - formats::binary16.mantissa_bits &&
         f.largest_finite() <= formats::binary16.largest_finite();
}

GemmInput gemm_input_for(const Format& a, const Format& b) {
  if (narrow_enough(a, formats::bfloat16.mantissa_bits) && narrow_enough(b, formats::bfloat16.mantissa_bits))
    return GemmInput::bfloat16;
  if (binary16_holds(a) && binary16_holds(b)) return GemmInput::binary16;
  if (narrow_enough(a, formats::tf32.mantissa_bits) && narrow_enough(b, formats::tf32.mantissa_bits))
    return GemmInput::tf32;
  return GemmInput::binary32;
}

std::string inexact_operand_message(unsigned flags) {
  std::string message;
  if (flags & kernels::inexact_storage)
    message = "cuda backend: weights or optimiser state stored in their format held a value that format does not "
              "represent (a bug: the backend stores them narrow only when they are its values). Values stored "
              "since the last synchronisation are not the CPU backend's.";
  if ((flags & ~kernels::inexact_storage) == 0) return message;
  if (!message.empty()) message += " Also: ";
  std::string types;
  const auto add = [&](unsigned bit, const char* name) {
    if ((flags & bit) == 0) return;
    if (!types.empty()) types += ", ";
    types += name;
  };
  add(kernels::inexact_binary16, "binary16");
  add(kernels::inexact_bfloat16, "bfloat16");
  add(kernels::inexact_tf32, "tf32");
  return message + "cuda backend: a GEMM operand held values that its Tensor Core input type (" + types +
         ") does not represent, although GemmNumerics named formats that type holds (a scaled rounding point whose "
         "values left the type's range?). GEMM results computed since the last synchronisation are not the exact "
         "products the CPU backend computes.";
}

kernels::Draws draws_of(const StochasticStream& stream) {
  const DrawKey key = make_draw_key(stream.key);
  return {key.low, key.high, stream.first_index};
}

QuantizeCounts quantize_counts_of(const unsigned long long* counters, std::int64_t n) {
  QuantizeCounts c;
  c.elements = static_cast<std::uint64_t>(n);
  c.inexact = counters[detail::counter::inexact];
  c.flushed_to_zero = counters[detail::counter::flushed];
  c.subnormal = counters[detail::counter::subnormal];
  c.overflow = counters[detail::counter::overflow];
  c.nan = counters[detail::counter::nan];
  return c;
}

kernels::Geometry geometry_of(const ConvGeometry& g) {
  return {g.batch, g.channels, g.height, g.width, g.kernel, g.stride, g.padding, g.out_height(), g.out_width()};
}

int select_device() {
  const DeviceInfo info = query_device();
  if (!info.available)
    throw std::runtime_error("cuda backend: " + info.description + " (backend = \"cpu\" runs without one)");
  MPSIM_CUDA_CHECK(cudaSetDevice(0));
  return 0;
}

class CudaBackend final : public core::Backend {
 public:
  CudaBackend() {
    MPSIM_CUDA_CHECK(cudaMemsetAsync(status_.data(), 0, sizeof(unsigned int), stream()));
    *host_status_.data() = 0;
  }
  ~CudaBackend() override {
    cudaStreamSynchronize(stream_.stream);  // before the members free what queued work may use
  }
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  std::string_view name() const override { return "cuda"; }
  core::Device device() const override { return core::Device::cuda; }
  void set_threads(int) override {}  // the device decides its own parallelism
  void set_device_attention(core::DeviceAttention attention) override { attention_ = attention; }
  std::string describe_gemm(core::CpuGemm, core::DeviceAttention attention) const override {
    return "cuBLAS, attention " + std::string(core::to_string(attention));
  }
  cudaStream_t cuda_stream() const { return stream(); }  // for cuda_stream_of (timing)
  std::uint64_t synchronisations() const { return synchronisations_; }

  // --- Memory ------------------------------------------------------------------------------------------------------
  Tensor zeros_impl(const Shape& shape) override {
    Tensor t = empty(shape);
    if (t.numel() > 0) MPSIM_CUDA_CHECK(cudaMemsetAsync(out(t), 0, bytes(t), stream()));  // +0.0f is all zero bits
    buffer_of(t)->zeros = true;
    return t;
  }
  Tensor empty_impl(const Shape& shape) override {
    const std::int64_t n = core::element_count(shape);
    require(n >= 0, "empty: negative size");
    auto buffer = std::make_shared<TensorStorage>();
    buffer->memory = pool_->get(static_cast<std::size_t>(n) * sizeof(float), pool_);
    return Tensor(shape, std::move(buffer), core::Device::cuda);
  }
  Tensor from_host_impl(std::span<const float> values, const Shape& shape) override {
    require(static_cast<std::int64_t>(values.size()) == core::element_count(shape),
            "from_host: size does not match shape");
    Tensor t = empty(shape);
    if (!values.empty()) uploads_.copy(out(t), values.data(), values.size_bytes(), stream());
    return t;
  }
  void to_host_impl(const Tensor& t, std::span<float> host) override {
    require(static_cast<std::int64_t>(host.size()) == t.numel(), "to_host: size does not match");
    if (host.empty()) return;
    const Input values = in(t);
    MPSIM_CUDA_CHECK(cudaMemcpyAsync(host.data(), values, host.size_bytes(), cudaMemcpyDeviceToHost, stream()));
    synchronize();
  }
  void copy_impl(const Tensor& from, Tensor& to) override {
    require(from.numel() == to.numel(), "copy: sizes differ");
    if (from.numel() == 0 || from.buffer() == to.buffer()) return;
    const TensorStorage& source = *buffer_of(from);
    if (source.narrow) {  // widened straight into the destination
      widen_into(source, out(to), from.numel());
      return;
    }
    const Input values = in(from);
    MPSIM_CUDA_CHECK(cudaMemcpyAsync(out(to), values, bytes(from), cudaMemcpyDeviceToDevice, stream()));
  }

  // --- Rounding: one pass of the rounding kernel (quantize.cu) -----------------------------------------------------
  RoundResult round_impl(Tensor& t, const RoundingPoint& point, float scale, StochasticStream stream,
                    TensorStats* stats) override {
    RoundResult result;
    const std::int64_t n = t.numel();
    const bool scaled = scale != 1.0f;
    const bool rounds = !point.is_identity();
    if (n == 0 || (!rounds && !scaled && stats == nullptr && !point.delayed_scaling)) return result;
    detail::RoundLaunch launch = round_launch(point, stream);
    launch.scale_before = launch.scale_after = scaled;
    launch.before = scale;
    launch.after = 1.0f / scale;  // exact: scale is a power of two (as the CPU computes it)
    // A pass that only counts (no rounding, no scaling) writes back what it read: it may read a widened copy.
    const Input counted = !rounds && !scaled ? in(t) : Input{};
    float* values = counted.values ? const_cast<float*>(counted.values) : inout(t);
    const std::shared_ptr<void> narrow = rounds ? narrow_store(point, n, launch) : nullptr;
    const bool fetch = stats != nullptr || point.delayed_scaling;
    if (fetch) {
      clear_stats();
      if (stats) {
        launch.counters = device_stats_.data() + counters_at;
        launch.bins = device_stats_.data() + bins_at;
      }
      if (point.delayed_scaling) launch.amax = device_amax();
    }
    detail::launch_round(values, static_cast<std::size_t>(n), launch, this->stream());
    if (narrow) store_narrow(t, narrow, launch.format, !scaled);
    if (!fetch) return result;
    const unsigned long long* host = fetch_round_stats();  // waits: the interface returns amax and counts now
    if (point.delayed_scaling) result.amax = host_amax();
    if (stats) add_round_stats(*stats, host, n, rounds);
    return result;
  }

  // --- GEMM --------------------------------------------------------------------------------------------------------
  void gemm_impl(const Tensor& a, bool ta, const Tensor& b, bool tb, Tensor& c, const core::GemmNumerics& numerics,
            StochasticStream stream) override {
    const std::int64_t m = ta ? a.cols() : a.rows(), k = ta ? a.rows() : a.cols();
    const std::int64_t kb = tb ? b.cols() : b.rows(), n = tb ? b.rows() : b.cols();
    require(k == kb && c.rows() == m && c.cols() == n, "gemm: shapes do not match");
    if (numerics.a_block || numerics.b_block) {
      require(numerics.a_block && numerics.b_block, "gemm: a block-scaled GEMM takes two block-scaled operands");
      return block_scaled_gemm_staged(a, ta, b, tb, c, numerics);
    }
    if (m == 0 || n == 0) return;
    // numerics.model (Policy::gemm) is ignored: on the device the hardware is the model (backend.hpp). A policy
    // with a model keeps accumulation at binary32 (core's gemm_model checks), so such GEMMs go to cuBLAS.
    if (!numerics.accumulation.is_identity()) {
      const kernels::GemmShape shape{m, n, k, ta, tb, a.cols(), b.cols()};
      const Input a_values = in(a), b_values = in(b);
      kernels::gemm_rounding_every_addition(a_values, b_values, out(c), shape,
                                            make_device_format(numerics.accumulation.format),
                                            make_device_rounding(numerics.accumulation.rounding), draws_of(stream),
                                            this->stream());
      return;
    }
    if (k == 0) {
      MPSIM_CUDA_CHECK(cudaMemsetAsync(out(c), 0, bytes(c), this->stream()));
      return;
    }
    cublas_gemm(a, ta, b, tb, c, as_int(m, "m"), as_int(n, "n"), as_int(k, "k"),
                gemm_input_for(numerics.a_format, numerics.b_format));
  }

  // Block-scaled GEMMs: core's one orchestration (layout, Hadamard transform, statistics) on the host, the
  // quantization and the GEMM in the device kernels of block_quantize.cu, which give the CPU's bits
  // (tests/gpu/test_device.cpp); through a tensor-core model, the tensor cores themselves: binary32 scales
  // (deepseek-fp8, fp8-current) through the H100's FP8 model, partials from cuBLASLt's FP8 GEMM
  // (tensor_core_block_gemm.cu); E8M0/UE4M3 scales (MXFP8, NVFP4) through the B200's model, Blackwell's
  // block-scaled GEMM (blackwell_block_gemm.cu). Staged through host memory and waiting on the device: a
  // numerics path, not a fast one (docs/gpu.md).
  static bool software_scales(const BlockFormat& a, const BlockFormat& b) {
    return a.scale == ScaleFormat::binary32 || b.scale == ScaleFormat::binary32;
  }
  std::string block_gemm_refusal(const core::BlockPoint& a, const core::BlockPoint& b,
                                 const std::optional<TensorCoreModel>& promotion,
                                 int promotion_interval) const override {
    if (!promotion) return block_gemm_refusal_on_device(a.format, b.format);
    if (software_scales(a.format, b.format)) return tensor_core_block_gemm_refusal(a.format, b.format, *promotion);
    return native_block_gemm_refusal(a.format, b.format, *promotion, promotion_interval);
  }
  void block_scaled_gemm_staged(const Tensor& a, bool ta, const Tensor& b, bool tb, Tensor& c,
                                const core::GemmNumerics& numerics) {
    const std::string why = block_gemm_refusal(numerics.a_block->point, numerics.b_block->point,
                                               numerics.block_promotion, numerics.block_promotion_interval);
    require(why.empty(), ("gemm: " + why + "; run the arm on cpu").c_str());
    std::vector<float> host_a(static_cast<std::size_t>(a.numel())), host_b(static_cast<std::size_t>(b.numel()));
    std::vector<float> host_c(static_cast<std::size_t>(c.numel()));
    to_host_impl(a, host_a);  // waits for the stream
    to_host_impl(b, host_b);
    core::BlockGemmSteps steps;
    steps.quantize = quantize_block_operand_on_device;
    steps.multiply = [](const BlockGemmModel& model, const BlockFormat& fa, const BlockOperand& qa,
                        const BlockFormat& fb, const BlockOperand& qb, float* out, int m, int n, int k) {
      if (!model.tensor_core) block_gemm_on_device(fa, qa, fb, qb, out, m, n, k);
      else if (software_scales(fa, fb)) tensor_core_block_gemm_on_device(model, fa, qa, fb, qb, out, m, n, k);
      else native_block_gemm_on_device(model, fa, qa, fb, qb, out, m, n, k);
    };
    core::block_scaled_gemm(host_a.data(), ta, a.rows(), a.cols(), host_b.data(), tb, b.rows(), b.cols(),
                            host_c.data(), numerics, steps);
    if (!host_c.empty()) uploads_.copy(out(c), host_c.data(), host_c.size() * sizeof(float), stream());
  }

  void add_row_vector_impl(Tensor& x, const Tensor& row) override {
    require(row.numel() == x.cols(), "add_row_vector: sizes differ");
    const Input r = in(row);
    kernels::add_row_vector(inout(x), r, x.rows(), x.cols(), stream());
  }
  void column_sums_impl(const Tensor& x, Tensor& sums) override {
    require(sums.numel() == x.cols(), "column_sums: sizes differ");
    const std::int64_t words = kernels::column_sums_scratch(x.rows(), x.cols());
    const auto scratch = pool_->get(static_cast<std::size_t>(words) * sizeof(float), pool_);
    const Input values = in(x);
    kernels::column_sums(values, x.rows(), x.cols(), out(sums), static_cast<float*>(scratch.get()), stream());
  }
  void scale_impl(Tensor& x, float factor) override { kernels::scale(inout(x), x.numel(), factor, stream()); }
  double sum_squares_impl(const Tensor& x) override {
    const QueuedSum sum = queue_sum_squares(x);
    MPSIM_CUDA_CHECK(
        cudaMemcpyAsync(host_double_.data(), sum.value, sizeof(double), cudaMemcpyDeviceToHost, stream()));
    synchronize();  // waits: the interface returns the sum now
    return *host_double_.data();
  }
  float max_abs_finite_impl(const Tensor& x) override {
    const auto scratch = pool_->get(sizeof(std::uint32_t), pool_);
    auto* key = static_cast<std::uint32_t*>(scratch.get());
    const Input values = in(x);
    kernels::max_abs_finite(values, x.numel(), key, stream());
    std::uint32_t host_key = 0;
    MPSIM_CUDA_CHECK(cudaMemcpyAsync(&host_key, key, sizeof host_key, cudaMemcpyDeviceToHost, stream()));
    synchronize();  // waits: the interface returns the maximum now
    return std::bit_cast<float>(host_key);
  }

  // --- Activations and LayerNorm -----------------------------------------------------------------------------------
  // Every entry of the element-wise table (numerics_ops.hpp): one templated kernel.
  void pointwise_forward_impl(const core::PointwiseCall& op, const Tensor& x, Tensor& y) override {
    const Input v = in(x);
    kernels::pointwise_forward(op, v, out(y), x.numel(), stream());
  }
  void pointwise_backward_impl(const core::PointwiseCall& op, const Tensor& saved, const Tensor& dy,
                               Tensor& dx) override {
    const Input v = in(saved), g = in(dy);  // v is null when the entry saves nothing
    kernels::pointwise_backward(op, v, g, out(dx), dy.numel(), stream());
  }
  void gated_activation_forward_impl(Activation kind, const Tensor& x, Tensor& y) override {
    const Input v = in(x);
    kernels::gated_activation_forward(kind, v, out(y), x.rows(), y.cols(), stream());
  }
  void gated_activation_backward_impl(Activation kind, const Tensor& x, const Tensor& dy, Tensor& dx) override {
    const Input v = in(x), g = in(dy);
    kernels::gated_activation_backward(kind, v, g, out(dx), x.rows(), dy.cols(), stream());
  }
  void add_impl(Tensor& x, const Tensor& y) override {
    const Input v = in(y);
    kernels::add(inout(x), v, x.numel(), stream());
  }
  // Attention's products: the kernels (the CPU's sums) or batched cuBLAS GEMMs (train.attention).
  bool attention_on_cublas(const AttentionShape& s) const {
    return attention_ == core::DeviceAttention::cublas && detail::cublas_attention_applies(s);
  }
  void attention_scores_impl(const Tensor& qkv, const AttentionShape& s, Tensor& scores) override {
    const Input q = in(qkv);
    if (attention_on_cublas(s)) return detail::cublas_attention_scores(blas_.handle, stream(), q, s, out(scores));
    kernels::attention_scores(q, s, out(scores), stream());
  }
  void attention_values_impl(const Tensor& probs, const Tensor& qkv, const AttentionShape& s, Tensor& o) override {
    const Input p = in(probs), q = in(qkv);
    if (attention_on_cublas(s)) return detail::cublas_attention_values(blas_.handle, p, q, s, out(o));
    kernels::attention_values(p, q, s, out(o), stream());
  }
  void attention_values_backward_impl(const Tensor& probs, const Tensor& qkv, const Tensor& dout,
                                      const AttentionShape& s, Tensor& dprobs, Tensor& dqkv) override {
    const Input p = in(probs), q = in(qkv), g = in(dout);
    if (attention_on_cublas(s))
      return detail::cublas_attention_values_backward(blas_.handle, stream(), p, q, g, s, out(dprobs), inout(dqkv));
    kernels::attention_values_backward(p, q, g, s, out(dprobs), inout(dqkv), stream());
  }
  void attention_scores_backward_impl(const Tensor& dscores, const Tensor& qkv, const AttentionShape& s,
                                      Tensor& dqkv) override {
    const Input d = in(dscores), q = in(qkv);
    if (attention_on_cublas(s)) return detail::cublas_attention_scores_backward(blas_.handle, d, q, s, inout(dqkv));
    kernels::attention_scores_backward(d, q, s, inout(dqkv), stream());
  }
  void fused_attention_forward_impl(const Tensor& qkv, const AttentionShape& s, const FusedAttention& fused,
                                    Tensor& o, Tensor& lse, Tensor& logit_max) override {
    const Input q = in(qkv);
    kernels::fused_attention_forward(q, s, fused, out(o), out(lse), out(logit_max), stream());
  }
  void fused_attention_probs_impl(const Tensor& scores, const Tensor& lse, Tensor& probs) override {
    const Input x = in(scores), l = in(lse);
    kernels::fused_attention_probs(x, l, scores.rows(), scores.cols(), out(probs), stream());
  }
  void fused_attention_row_dot_impl(const Tensor& dout, const Tensor& o, const AttentionShape& s,
                                    Tensor& dot) override {
    const Input g = in(dout), y = in(o);
    kernels::fused_attention_row_dot(g, y, s, out(dot), stream());
  }
  void fused_attention_scores_grad_impl(const Tensor& probs, const Tensor& dprobs, const Tensor& dot,
                                        Tensor& dscores) override {
    const Input p = in(probs), g = in(dprobs), d = in(dot);
    kernels::fused_attention_scores_grad(p, g, d, probs.rows(), probs.cols(), out(dscores), stream());
  }
  void softmax_forward_impl(const Tensor& x, Tensor& probs, const InternalRounding& low) override {
    const Input v = in(x);
    kernels::softmax_forward(v, x.rows(), x.cols(), out(probs), low, stream());
  }
  void softmax_backward_impl(const Tensor& probs, const Tensor& dprobs, Tensor& dx,
                             const InternalRounding& low) override {
    const Input p = in(probs), g = in(dprobs);
    kernels::softmax_backward(p, g, probs.rows(), probs.cols(), out(dx), low, stream());
  }
  void rotary_impl(const Tensor& qkv, const Tensor& table, const AttentionShape& s, bool inverse,
                   Tensor& y) override {
    const Input x = in(qkv), t = in(table);
    kernels::rotary(x, t, s, inverse, out(y), stream());
  }
  void sequence_mean_forward_impl(const Tensor& x, std::int64_t tokens, Tensor& y) override {
    const Input v = in(x);
    kernels::sequence_mean_forward(v, tokens, y.rows(), x.cols(), out(y), stream());
  }
  void sequence_mean_backward_impl(const Tensor& dy, std::int64_t tokens, Tensor& dx) override {
    const Input g = in(dy);
    kernels::sequence_mean_backward(g, tokens, dx.rows(), dx.cols(), out(dx), stream());
  }
  void embedding_forward_impl(const Tensor& ids, const Tensor& table, Tensor& o) override {
    const Input i = in(ids), t = in(table);
    kernels::embedding_forward(i, t, ids.numel(), table.rows(), table.cols(), out(o), stream());
  }
  void embedding_backward_impl(const Tensor& ids, const Tensor& dout, Tensor& dtable) override {
    const Input i = in(ids), g = in(dout);
    kernels::embedding_backward(i, g, ids.numel(), dtable.rows(), dtable.cols(), out(dtable), stream());
  }
  // Every entry of the row-wise table (numerics_rows.hpp): kernels_rows.cu.
  void row_forward_impl(const core::RowCall& op, const core::RowLayout& layout, const Tensor& x, Tensor& y,
                        const RowTensors& t) override {
    const Input v = in(x), p0 = in_or_null(t.parameters[0]), p1 = in_or_null(t.parameters[1]);
    const kernels::RowBuffers buffers{{p0, p1}, {out_or_null(t.statistics[0]), out_or_null(t.statistics[1])}, {}};
    kernels::row_forward(op, layout, v, out(y), buffers, stream());
  }
  void row_backward_impl(const core::RowCall& op, const core::RowLayout& layout, const Tensor& x, const Tensor& dy,
                         Tensor& dx, const RowTensors& t) override {
    const Input v = in(x), g = in(dy), p0 = in_or_null(t.parameters[0]), p1 = in_or_null(t.parameters[1]);
    const Input s0 = in_or_null(t.statistics[0]), s1 = in_or_null(t.statistics[1]);
    const kernels::RowBuffers buffers{{p0, p1},
                                      {const_cast<float*>(s0.values), const_cast<float*>(s1.values)},  // read only
                                      {out_or_null(t.parameter_grads[0]), out_or_null(t.parameter_grads[1])}};
    const auto scratch =
        pool_->get(static_cast<std::size_t>(std::max<std::int64_t>(kernels::row_grad_scratch_bytes(op, layout), 4)),
                   pool_);
    kernels::row_backward(op, layout, v, g, out(dx), buffers, scratch.get(), stream());
  }
  Input in_or_null(const Tensor* t) { return t ? in(*t) : Input{}; }
  float* out_or_null(const Tensor* t) { return t ? out(*t) : nullptr; }

  // --- Convolution layout and pooling ------------------------------------------------------------------------------
  void im2col_impl(const Tensor& x, const ConvGeometry& g, Tensor& columns) override {
    require_geometry(g, x);
    require(columns.numel() == g.batch * g.out_height() * g.out_width() * g.channels * g.kernel * g.kernel,
            "im2col: output size");
    const Input v = in(x);
    kernels::im2col(v, geometry_of(g), out(columns), stream());
  }
  void col2im_impl(const Tensor& columns, const ConvGeometry& g, Tensor& dx) override {
    require_geometry(g, dx);
    require(columns.numel() == g.batch * g.out_height() * g.out_width() * g.channels * g.kernel * g.kernel,
            "col2im: input size");
    const Input v = in(columns);
    kernels::col2im(v, geometry_of(g), inout(dx), stream());
  }
  void rows_to_nchw_impl(const Tensor& rows, std::int64_t batch, std::int64_t h, std::int64_t w, Tensor& nchw) override {
    require(rows.rows() == batch * h * w && nchw.numel() == rows.numel(), "rows_to_nchw: sizes differ");
    const Input v = in(rows);
    kernels::rows_to_nchw(v, batch, rows.cols(), h * w, out(nchw), stream());
  }
  void nchw_to_rows_impl(const Tensor& nchw, Tensor& rows) override {
    const Shape& s = nchw.shape();
    require(s.size() == 4 && rows.numel() == nchw.numel(), "nchw_to_rows: expects NCHW of the rows' size");
    const Input v = in(nchw);
    kernels::nchw_to_rows(v, s[0], s[1], s[2] * s[3], out(rows), stream());
  }
  void max_pool_forward_impl(const Tensor& x, const ConvGeometry& g, Tensor& y, Tensor& argmax) override {
    require_geometry(g, x);
    const std::int64_t outputs = g.batch * g.channels * g.out_height() * g.out_width();
    require(y.numel() == outputs && argmax.numel() == outputs, "max_pool_forward: output size");
    const Input v = in(x);
    kernels::max_pool_forward(v, geometry_of(g), out(y), out(argmax), stream());
  }
  void max_pool_backward_impl(const Tensor& dy, const Tensor& argmax, Tensor& dx) override {
    const Shape& in = dx.shape();
    const Shape& out = dy.shape();
    require(in.size() == 4 && out.size() == 4 && in[0] == out[0] && in[1] == out[1] && argmax.numel() == dy.numel(),
            "max_pool_backward: expects NCHW gradients of one batch and channel count");
    const Input g = this->in(dy), where = this->in(argmax);
    kernels::max_pool_backward(g, where, in[0] * in[1], in[2] * in[3], out[2] * out[3], this->out(dx), stream());
  }

  // --- Loss --------------------------------------------------------------------------------------------------------
  core::LossResult softmax_cross_entropy_impl(const Tensor& logits, const Tensor& labels, float grad_scale,
                                         Tensor& d_logits) override {
    core::LossResult result;
    const std::int64_t rows = logits.rows();
    const float factor = grad_scale / static_cast<float>(rows);
    const auto scratch = queue_softmax("softmax_cross_entropy", logits, labels, factor, nullptr, d_logits);
    if (!scratch) return result;
    const float* row_results = static_cast<const float*>(scratch.get());
    const std::size_t words = 2 * static_cast<std::size_t>(rows);
    host_rows_.reserve(words);  // nothing is pending into it: every copy into it is waited for
    MPSIM_CUDA_CHECK(
        cudaMemcpyAsync(host_rows_.data(), row_results, words * sizeof(float), cudaMemcpyDeviceToHost, stream()));
    synchronize();  // waits: the interface returns the loss now
    // The CPU's binary64 sum of the rows' binary32 losses, in row order.
    const float* host = host_rows_.data();
    for (std::int64_t r = 0; r < rows; ++r) {
      result.loss_sum += static_cast<double>(host[r]);
      result.correct += host[rows + r] != 0.0f;
    }
    return result;
  }

  // --- Optimiser ---------------------------------------------------------------------------------------------------
  void sgd_update(const Tensor& weight, const Tensor& grad, Tensor& momentum, float lr, float momentum_factor,
                  float weight_decay, bool first_step, Tensor& update) override {
    const std::int64_t n = weight.numel();
    require(grad.numel() == n && update.numel() == n && (momentum_factor == 0.0f || momentum.numel() == n),
            "sgd_update: sizes differ");
    const Input w = in(weight), g = in(grad);
    kernels::sgd_update(w, g, inout(momentum), out(update), n, lr, momentum_factor, weight_decay, first_step, nullptr,
                        stream());
  }
  void adam_update(const Tensor& weight, const Tensor& grad, Tensor& m, Tensor& v, const core::AdamParams& p,
                   Tensor& update) override {
    const std::int64_t n = weight.numel();
    require(grad.numel() == n && m.numel() == n && v.numel() == n && update.numel() == n, "adam_update: sizes differ");
    const kernels::AdamConstants c{
        core::adam_constants(p.lr, p.beta1, p.beta2, p.eps, p.weight_decay, p.decoupled, p.step), p.lr, nullptr};
    const Input w = in(weight), g = in(grad);
    kernels::adam_update(w, g, inout(m), inout(v), out(update), n, c, nullptr, stream());
  }
  void apply_update(Tensor& weight, const Tensor& update, const RoundingPoint& storage, StochasticStream stream,
                    TensorStats* stats) override {
    apply_update_gated(weight, update, storage, stream, stats, nullptr, !storage.is_identity());
  }

  void round_delayed_impl(Tensor& t, const RoundingPoint& point, Tensor& history, int margin, bool record,
                     StochasticStream stream, TensorStats* stats) override {
    round_with_ring(t, point, history, margin, record, stream, stats, nullptr);
  }

  // --- The training step: its scalars stay on the device (kernels_step.cu) -----------------------------------------
  void start_steps_impl(const core::LossScaling& scaling, const core::LossDefinition& loss,
                        const core::InternalRounding& loss_low) override {
    scaling_ = scaling;
    pending_ = 0;
    taken_.clear();
    steps_started_ = 0;
    kernels::step_start(step_.data(), scaling, loss, loss_low, stream());
  }
  void step_loss_impl(const Tensor& logits, const Tensor& labels, Tensor& d_logits) override {
    const auto scratch = queue_softmax("step_loss", logits, labels, 0.0f, step_.data(), d_logits);
    if (scratch) kernels::step_add_loss(static_cast<const float*>(scratch.get()), logits.rows(), step_.data(), stream());
  }
  void step_check_gradient_impl(const Tensor& grad) override {
    const QueuedSum sum = queue_sum_squares(grad);
    kernels::step_add_sum_squares(sum.value, step_.data(), stream());
  }
  void end_step_impl() override {
    if (pending_ == step_record_capacity) keep_records();  // the trainer reads more often than this
    kernels::step_end(step_.data(), scaling_, records_.data() + pending_, stream());
    ++pending_;
    ++steps_started_;
  }
  void optimizer_step_impl(const core::OptimizerParams& p, Tensor& weight, Tensor& grad, Tensor& state1, Tensor& state2,
                      Tensor& update, const RoundingPoint& storage, StochasticStream stream,
                      TensorStats* stats) override {
    const std::int64_t n = weight.numel();
    require(grad.numel() == n && update.numel() == n, "optimizer_step: sizes differ");
    // Asked before anything widens the weights; they are widened once, here, for both kernels.
    const bool narrow = !storage.is_identity() && narrow_after_gated(weight, storage);
    const float* w = inout(weight);
    if (p.kind == core::OptimizerKind::sgd) {
      require(p.momentum == 0.0f || state1.numel() == n, "optimizer_step: momentum size differs");
      const Input g = in(grad);
      kernels::sgd_update(w, g, inout(state1), out(update), n, p.lr, p.momentum, p.weight_decay, false, step_.data(),
                          this->stream(), p.clip_norm);
    } else {
      require(state1.numel() == n && state2.numel() == n, "optimizer_step: Adam state sizes differ");
      // step_size and bias2_sqrt come from the table at the gate's t.
      const kernels::AdamConstants c{core::adam_constants(p.lr, p.beta1, p.beta2, p.eps, p.weight_decay,
                                                          p.kind == core::OptimizerKind::adamw, 1),
                                     p.lr, adam_bias_table(p.beta1, p.beta2, steps_started_)};
      const Input g = in(grad);
      kernels::adam_update(w, g, inout(state1), inout(state2), out(update), n, c, step_.data(), this->stream(),
                           p.clip_norm);
    }
    apply_update_gated(weight, update, storage, stream, stats, step_.data(), narrow);
  }
  void round_state_impl(Tensor& state, const RoundingPoint& point, Tensor* history, int margin,
                   StochasticStream stream) override {
    if (history) {
      round_with_ring(state, point, *history, margin, true, stream, nullptr, step_.data());
      return;
    }
    if (point.is_identity() || state.numel() == 0) return;
    detail::RoundLaunch launch = round_launch(point, stream);
    launch.skip = skip_flag();
    const bool narrow = narrow_after_gated(state, point);
    detail::launch_round(inout(state), static_cast<std::size_t>(state.numel()), launch, this->stream());
    if (narrow) store_values_narrow(state, point);
  }
  std::vector<core::StepScalars> take_steps_impl() override {
    keep_records();
    return std::exchange(taken_, {});
  }

 private:
  // sum_squares(x) queued on the stream into a pool buffer (kept alive by
  // `scratch` until the work that reads `value` is queued).
  struct QueuedSum {
    std::shared_ptr<void> scratch;
    double* value;
  };
  QueuedSum queue_sum_squares(const Tensor& x) {
    auto scratch = pool_->get((kernels::sum_squares_blocks + 1) * sizeof(double), pool_);
    double* partial = static_cast<double*>(scratch.get());
    double* value = partial + kernels::sum_squares_blocks;
    const Input values = in(x);
    kernels::sum_squares(values, x.numel(), partial, value, stream());
    return {std::move(scratch), value};
  }

  // The softmax cross-entropy kernel queued for `op`: the gradient's factor is
  // `factor`, or taken from the step's loss scale when scale_from is set.
  // Returns the pool buffer of the per-row results (kernels.hpp), null when
  // there are no rows.
  std::shared_ptr<void> queue_softmax(const char* op, const Tensor& logits, const Tensor& labels, float factor,
                                      const kernels::StepState* scale_from, Tensor& d_logits) {
    const std::int64_t rows = logits.rows(), cols = logits.cols();
    const auto fail = [op](const char* what) { throw std::logic_error(std::string("cuda backend: ") + op + what); };
    if (labels.numel() != rows || d_logits.numel() != logits.numel()) fail(": sizes differ");
    if (rows == 0) return nullptr;
    if (cols <= 0) fail(": no classes");
    auto scratch = pool_->get(2 * static_cast<std::size_t>(rows) * sizeof(float), pool_);
    const Input z = in(logits), y = in(labels);
    kernels::softmax_cross_entropy(z, y, rows, cols, factor, out(d_logits), static_cast<float*>(scratch.get()),
                                   scale_from, stream());
    return scratch;
  }

  // Rounds t with the scale of its amax ring, computed on the device, and
  // records t's amax there: nothing waits unless stats are asked for.
  void round_with_ring(Tensor& t, const RoundingPoint& point, Tensor& history, int margin, bool record,
                       StochasticStream stream, TensorStats* stats, const kernels::StepState* gate) {
    require(history.numel() >= 2 && point.delayed_scaling, "round_delayed: needs a scaled point and a history of >= 1");
    const int length = static_cast<int>(history.numel() - 1);
    if (t.numel() == 0) return;
    const auto scratch = pool_->get(2 * sizeof(float), pool_);
    float* scale = static_cast<float*>(scratch.get());
    auto* amax = reinterpret_cast<unsigned int*>(scale + 1);
    detail::RoundLaunch launch = round_launch(point, stream);
    float* ring = inout(history);
    kernels::delayed_scale_from_ring(ring, length, point.format.largest_finite(), margin, scale, amax, gate,
                                     this->stream());
    launch.device_scale = scale;
    launch.amax = amax;
    if (gate) launch.skip = skip_flag();
    if (stats) {
      clear_stats();
      launch.counters = device_stats_.data() + counters_at;
      launch.bins = device_stats_.data() + bins_at;
    }
    float* values = inout(t);
    // A gated rounding may not run (a skipped step), so it keeps binary32 storage: a store must always be written.
    const std::shared_ptr<void> narrow =
        gate == nullptr && !point.is_identity() ? narrow_store(point, t.numel(), launch) : nullptr;
    detail::launch_round(values, static_cast<std::size_t>(t.numel()), launch, this->stream());
    if (narrow) store_narrow(t, narrow, launch.format, false);
    if (record) kernels::push_amax(ring, length, amax, gate, this->stream());
    if (stats) add_round_stats(*stats, fetch_round_stats(), t.numel(), !point.is_identity());
  }

  // The launch of a rounding at `point` (scale, stats and gates left unset).
  static detail::RoundLaunch round_launch(const RoundingPoint& point, const StochasticStream& stream) {
    detail::RoundLaunch launch;
    launch.round = !point.is_identity();
    if (launch.round) {
      launch.format = make_device_format(point.format);  // throws unless fits_in_float, as quantize does
      launch.rounding = make_device_rounding(point.rounding);
      const kernels::Draws draws = draws_of(stream);
      launch.key_low = draws.key_low;
      launch.key_high = draws.key_high;
      launch.first_index = draws.first_index;
    }
    return launch;
  }

  const unsigned long long* fetch_round_stats() {
    fetch_stats();  // waits: only on instrumented (logged) steps
    return host_stats_.data();
  }
  // Adds one rounding's histogram and counters to stats, as the CPU counts them.
  static void add_round_stats(TensorStats& stats, const unsigned long long* host, std::int64_t n, bool rounds) {
    const TensorStats::Classes classes = stats.add_field_counts(detail::field_counts_of(host + bins_at));
    const unsigned long long* counters = host + counters_at;
    if (rounds) {
      const QuantizeCounts counts = quantize_counts_of(counters, n);
      stats.add_rounding(counts);
      // Infinite results come only from infinite inputs or overflow (the CPU counts them only then).
      if (classes.infinite != 0 || counts.overflow != 0) stats[Counter::infinite] += counters[detail::counter::infinite];
    } else {
      stats[Counter::subnormal] += classes.subnormal;
      stats[Counter::nan] += classes.nan;
      stats[Counter::infinite] += classes.infinite;
    }
  }

  const int* skip_flag() {
    return reinterpret_cast<const int*>(reinterpret_cast<const char*>(step_.data()) +
                                        offsetof(kernels::StepState, skip));
  }

  // Copies the records written since the last copy to taken_ (waits).
  void keep_records() {
    if (pending_ > 0) {
      MPSIM_CUDA_CHECK(cudaMemcpyAsync(host_records_.data(), records_.data(), pending_ * sizeof(kernels::StepRecord),
                                       cudaMemcpyDeviceToHost, stream()));
    }
    synchronize();
    for (std::size_t i = 0; i < pending_; ++i) {
      const kernels::StepRecord& r = host_records_.data()[i];
      core::StepScalars s;
      s.loss_sum = r.loss_sum;
      s.correct = static_cast<std::int64_t>(r.correct);
      s.grad_sum_squares = r.grad_sum_squares;
      s.loss_scale = r.loss_scale;
      s.found_inf = r.found_inf != 0;
      taken_.push_back(s);
    }
    pending_ = 0;
  }

  // The device table of core::adam_bias for t = 1 .. at least `steps` (the gated
  // kernel picks its t there): regrown, by doubling, on the host when the
  // steps could outrun it, and copied without waiting.
  const float* adam_bias_table(float beta1, float beta2, std::int64_t steps) {
    if (!adam_table_ || beta1 != adam_betas_[0] || beta2 != adam_betas_[1] || steps > adam_table_steps_) {
      std::int64_t size = std::max<std::int64_t>(1024, adam_table_steps_);
      while (size < steps) size *= 2;
      std::vector<float> table(2 * static_cast<std::size_t>(size));
      for (std::int64_t t = 1; t <= size; ++t) {
        const core::AdamBias b = core::adam_bias(beta1, beta2, t);
        table[2 * (t - 1)] = b.bias1;
        table[2 * (t - 1) + 1] = b.bias2_sqrt;
      }
      adam_table_ = pool_->get(table.size() * sizeof(float), pool_);
      uploads_.copy(adam_table_.get(), table.data(), table.size() * sizeof(float), stream());
      adam_table_steps_ = size;
      adam_betas_[0] = beta1;
      adam_betas_[1] = beta2;
    }
    return static_cast<const float*>(adam_table_.get());
  }

  // narrow: store the weights narrow afterwards (every value is then storage's: see narrow_after_gated).
  void apply_update_gated(Tensor& weight, const Tensor& update, const RoundingPoint& storage,
                          StochasticStream stream, TensorStats* stats, const kernels::StepState* gate, bool narrow) {
    const std::int64_t n = weight.numel();
    require(update.numel() == n, "apply_update: sizes differ");
    if (n == 0) return;
    const bool rounds = !storage.is_identity();
    DeviceFormat format{};
    DeviceRounding rounding{};
    if (rounds) {
      format = make_device_format(storage.format);  // throws unless fits_in_float, before anything is queued
      rounding = make_device_rounding(storage.rounding);
    }
    const Input u = in(update);
    float* w = inout(weight);
    unsigned long long* counters = nullptr;
    if (stats) {
      clear_stats();
      detail::launch_histogram(u, static_cast<std::size_t>(n), device_stats_.data() + bins_at, this->stream());
      counters = device_stats_.data() + counters_at;
    }
    if (rounds)
      kernels::apply_update_rounded(w, u, n, format, rounding, draws_of(stream), counters, gate, this->stream());
    else
      kernels::apply_update_binary32(w, u, n, counters, gate, this->stream());
    if (narrow) store_values_narrow(weight, storage);
    if (!stats) return;
    fetch_stats();  // waits: the interface adds to *stats now (only at the logging interval)
    const unsigned long long* host = host_stats_.data();
    stats->add_field_counts(detail::field_counts_of(host + bins_at));
    if (rounds) stats->add_rounding(quantize_counts_of(host + counters_at, n));
    (*stats)[Counter::swallowed] += host[counters_at + kernels::swallowed_counter];
  }

  cudaStream_t stream() const { return stream_.stream; }
  static std::size_t bytes(const Tensor& t) { return static_cast<std::size_t>(t.numel()) * sizeof(float); }

  static void require_geometry(const ConvGeometry& g, const Tensor& image) {
    require(g.batch >= 0 && g.channels >= 0 && g.height >= 0 && g.width >= 0 && g.kernel >= 1 && g.stride >= 1 &&
                g.padding >= 0 && g.out_height() >= 0 && g.out_width() >= 0,
            "convolution geometry out of range");
    require(image.numel() == g.batch * g.channels * g.height * g.width, "image size does not match the geometry");
  }


  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: cuBLAS
  // reads each row-major buffer as its column-major transpose, with the
  // buffer's row length as leading dimension.
  void cublas_gemm(const Tensor& a, bool ta, const Tensor& b, bool tb, Tensor& c, int m, int n, int k,
                   GemmInput input) {
    const int lda = as_int(a.cols(), "a's row length"), ldb = as_int(b.cols(), "b's row length");
    cudaDataType_t type = CUDA_R_32F;
    cublasComputeType_t compute = CUBLAS_COMPUTE_32F_PEDANTIC;  // binary32 products and sums, never TF32
    Input a_in, b_in;  // what cuBLAS reads, kept until the GEMM is queued
    switch (input) {
      case GemmInput::binary16:
      case GemmInput::bfloat16: {
        const bool bf = input == GemmInput::bfloat16;
        a_in = operand_16(a, bf);
        b_in = operand_16(b, bf);
        type = bf ? CUDA_R_16BF : CUDA_R_16F;
        compute = CUBLAS_COMPUTE_32F;  // binary32 accumulation on Tensor Cores
        break;
      }
      case GemmInput::tf32:
        // The values are TF32's already (checked), so cuBLAS's own conversion cannot change them.
        a_in = in(a);
        b_in = in(b);
        kernels::check_tf32(a_in, a.numel(), status_.data(), stream());
        kernels::check_tf32(b_in, b.numel(), status_.data(), stream());
        compute = CUBLAS_COMPUTE_32F_FAST_TF32;
        break;
      case GemmInput::binary32:
        a_in = in(a);
        b_in = in(b);
        break;
    }
    const float alpha = 1.0f, beta = 0.0f;  // read by cuBLAS when the call is made (host pointer mode)
    MPSIM_CUBLAS_CHECK(cublasGemmEx(blas_.handle, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, n, m,
                                    k, &alpha, b_in.values, type, ldb, a_in.values, type, lda, &beta, out(c),
                                    CUDA_R_32F, n, compute, CUBLAS_GEMM_DEFAULT));
  }

  // A GEMM operand as a 16-bit Tensor Core input type: the tensor's own codes
  // when it is stored unscaled in that type's layout (no copy, no check: its
  // values are the type's), else a converted copy in pool memory (any value
  // that changes sets the inexact-operand flag).
  Input operand_16(const Tensor& t, bool bfloat16) {
    const TensorStorage* b = buffer_of(t);
    const Format& type = bfloat16 ? formats::bfloat16 : formats::binary16;
    if (b->narrow && b->unscaled && b->format.has_infinity && b->format.exponent_bits == type.exponent_bits &&
        b->format.mantissa_bits == type.mantissa_bits)
      return {static_cast<const float*>(codes(*b)), nullptr};  // the codes, typed as cuBLAS's type says
    const Input values = in(t);
    auto converted = pool_->get(static_cast<std::size_t>(t.numel()) * 2, pool_);
    kernels::convert_for_gemm(values, converted.get(), t.numel(), bfloat16, status_.data(), stream());
    return {static_cast<const float*>(converted.get()), converted};
  }

  // --- Storage: TensorStorage ---------------------------------------------------------------------------------------
  Input in(const Tensor& t) {
    const TensorStorage* b = buffer_of(t);
    if (!b) return {};
    if (!b->narrow) return {static_cast<const float*>(b->memory.get()), nullptr};
    auto wide = widened(t);
    return {static_cast<const float*>(wide.get()), std::move(wide)};
  }
  // The binary32 memory of a tensor that an op writes whole: a narrow
  // tensor's codes are dropped for fresh binary32 memory.
  float* out(const Tensor& t) {
    TensorStorage* b = buffer_of(t);
    if (!b) return nullptr;
    if (b->narrow) {
      b->memory = pool_->get(bytes(t), pool_);
      b->narrow = false;
    }
    b->zeros = false;
    return static_cast<float*>(b->memory.get());
  }
  // The binary32 memory of a tensor that an op reads and writes: a narrow tensor is widened into it first.
  float* inout(const Tensor& t) {
    TensorStorage* b = buffer_of(t);
    if (!b) return nullptr;
    if (b->narrow) {
      b->memory = widened(t);
      b->narrow = false;
    }
    b->zeros = false;
    return static_cast<float*>(b->memory.get());
  }
  // Queues the widening of a narrow tensor's n values into `out`.
  void widen_into(const TensorStorage& b, float* out, std::int64_t n) {
    kernels::widen(codes(b), b.format, descale(b), out, n, stream());
  }
  // Fresh pool memory holding a narrow tensor's values widened to binary32.
  std::shared_ptr<void> widened(const Tensor& t) {
    auto wide = pool_->get(bytes(t), pool_);
    widen_into(*buffer_of(t), static_cast<float*>(wide.get()), t.numel());
    return wide;
  }
  // Pool memory for n codes of `format`, after the slot of the factor that widening multiplies by.
  std::shared_ptr<void> narrow_memory(const DeviceFormat& format, std::int64_t n) {
    return pool_->get(narrow_offset + static_cast<std::size_t>(n) * storage_bytes(format), pool_);
  }
  // Pool memory for n values of point's format stored narrow, wired into the
  // launch as its store; null when that format is not stored narrow.
  std::shared_ptr<void> narrow_store(const RoundingPoint& point, std::int64_t n, detail::RoundLaunch& launch) {
    if (!stored_narrow(point.format)) return nullptr;
    auto memory = narrow_memory(launch.format, n);
    launch.store_descale = static_cast<float*>(memory.get());
    launch.store = static_cast<char*>(memory.get()) + narrow_offset;
    return memory;
  }
  // Whether a rounding at `point` that a skipped step may leave undone (the
  // gated update of the weights, the optimiser state's) leaves t with the
  // format's values either way, so that store_values_narrow may store it:
  // true when t holds them before (stored narrow in the format, or zeros).
  // Asked before the op writes t.
  static bool narrow_after_gated(const Tensor& t, const RoundingPoint& point) {
    return stored_narrow(point.format) && !point.delayed_scaling &&
           holds_values_of(buffer_of(t), make_device_format(point.format));
  }
  // Stores t narrow in point's format, all of whose values are the format's
  // (just rounded there; or see narrow_after_gated). A value that is not the
  // format's is reported at the next synchronisation.
  void store_values_narrow(const Tensor& t, const RoundingPoint& point) {
    if (!stored_narrow(point.format) || point.delayed_scaling || t.numel() == 0) return;
    const DeviceFormat format = make_device_format(point.format);
    const std::int64_t n = t.numel();
    auto memory = narrow_memory(format, n);
    kernels::narrow(inout(t), format, static_cast<char*>(memory.get()) + narrow_offset,
                    static_cast<float*>(memory.get()), n, status_.data(), stream());
    store_narrow(t, std::move(memory), format, true);
  }
  // Makes the store just queued the tensor's storage.
  static void store_narrow(const Tensor& t, std::shared_ptr<void> memory, const DeviceFormat& device, bool unscaled) {
    TensorStorage* b = buffer_of(t);
    b->memory = std::move(memory);
    b->narrow = true;
    b->format = device;
    b->unscaled = unscaled;
    b->zeros = false;
  }
  static const void* codes(const TensorStorage& b) { return static_cast<const char*>(b.memory.get()) + narrow_offset; }
  static const float* descale(const TensorStorage& b) { return static_cast<const float*>(b.memory.get()); }

  // --- Synchronisation: every wait of the backend goes through here ------------------------------------------------
  // Waits for the stream, then reports an inexact GEMM operand flagged since the last wait.
  void synchronize() {
    ++synchronisations_;
    MPSIM_CUDA_CHECK(
        cudaMemcpyAsync(host_status_.data(), status_.data(), sizeof(unsigned int), cudaMemcpyDeviceToHost, stream()));
    MPSIM_CUDA_CHECK(cudaStreamSynchronize(stream()));
    const unsigned int flags = *host_status_.data();
    if (flags != 0) {
      *host_status_.data() = 0;
      MPSIM_CUDA_CHECK(cudaMemsetAsync(status_.data(), 0, sizeof(unsigned int), stream()));
      throw std::runtime_error(inexact_operand_message(flags));
    }
  }
  void clear_stats() {
    MPSIM_CUDA_CHECK(cudaMemsetAsync(device_stats_.data(), 0, stats_words * sizeof(unsigned long long), stream()));
  }
  void fetch_stats() {
    MPSIM_CUDA_CHECK(cudaMemcpyAsync(host_stats_.data(), device_stats_.data(), stats_words * sizeof(unsigned long long),
                                     cudaMemcpyDeviceToHost, stream()));
    synchronize();
  }
  unsigned int* device_amax() { return reinterpret_cast<unsigned int*>(device_stats_.data() + amax_at); }
  float host_amax() {
    // The kernel wrote a 32-bit pattern at the start of the word: read those same bytes.
    std::uint32_t bits;
    std::memcpy(&bits, host_stats_.data() + amax_at, sizeof bits);
    float amax;
    std::memcpy(&amax, &bits, sizeof amax);
    return amax;
  }

  // Declaration order is construction order: the device first, then what lives on it.
  int device_ = select_device();
  std::shared_ptr<DevicePool> pool_ = std::make_shared<DevicePool>();
  Stream stream_;
  Blas blas_{stream_.stream};
  core::DeviceAttention attention_ = core::DeviceAttention::kernels;
  detail::DeviceArray<unsigned long long> device_stats_{stats_words};
  detail::DeviceArray<unsigned int> status_{1};  // inexact GEMM operand flags (kernels.hpp)
  Pinned<unsigned long long> host_stats_{stats_words};
  Pinned<unsigned int> host_status_{1};
  UploadRing uploads_;
  Pinned<double> host_double_{1};
  Pinned<float> host_rows_{1024};
  // The training step (start_steps .. take_steps).
  static constexpr std::size_t step_record_capacity = 1024;
  core::LossScaling scaling_;
  detail::DeviceArray<kernels::StepState> step_{1};
  detail::DeviceArray<kernels::StepRecord> records_{step_record_capacity};
  Pinned<kernels::StepRecord> host_records_{step_record_capacity};
  std::size_t pending_ = 0;              // records on the device not yet copied
  std::vector<core::StepScalars> taken_;  // copied, not yet taken
  std::int64_t steps_started_ = 0;        // end_step calls: an upper bound on Adam's t
  std::shared_ptr<void> adam_table_;
  std::int64_t adam_table_steps_ = 0;
  float adam_betas_[2] = {0.0f, 0.0f};
  std::uint64_t synchronisations_ = 0;
};

}  // namespace

std::unique_ptr<core::Backend> make_cuda_backend() { return std::make_unique<CudaBackend>(); }

void register_cuda_backend() {
  static std::once_flag once;
  std::call_once(once, [] { core::register_backend("cuda", &make_cuda_backend); });
}

namespace {
CudaBackend& cuda_backend_of(core::Backend& backend, const char* caller) {
  auto* cuda = dynamic_cast<CudaBackend*>(&backend);
  if (!cuda)
    throw std::invalid_argument(std::string(caller) + ": backend \"" + std::string(backend.name()) +
                                "\" was not made by make_cuda_backend");
  return *cuda;
}
}  // namespace

void* cuda_stream_of(core::Backend& backend) {
  return static_cast<void*>(cuda_backend_of(backend, "cuda_stream_of").cuda_stream());
}

std::uint64_t cuda_synchronisations(core::Backend& backend) {
  return cuda_backend_of(backend, "cuda_synchronisations").synchronisations();
}

int cuda_storage_bytes(core::Backend& backend, const core::Tensor& tensor) {
  cuda_backend_of(backend, "cuda_storage_bytes");
  const TensorStorage* b = buffer_of(tensor);
  if (b && b->tag != TensorStorage::cuda_tag)
    throw std::invalid_argument("cuda_storage_bytes: the tensor was not made by a cuda backend");
  return b && b->narrow ? storage_bytes(b->format) : 4;
}

}  // namespace mpsim::gpu
