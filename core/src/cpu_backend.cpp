// The CPU backend: mpsim's fixed-order GEMM (ordered_gemm.hpp; OpenBLAS
// through Eigen when the config asks for `gemm = "blas"`) and plain loops for
// the arithmetic, emulation/ for every rounding to a storage format.

#define EIGEN_USE_BLAS
#include <Eigen/Core>
#include <cblas.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <stdexcept>
#include <vector>

#include "mpsim/core/backend.hpp"
#include "mpsim/core/ordered_gemm.hpp"
#include "mpsim/core/numerics.hpp"
#include "mpsim/core/numerics_layers.hpp"
#include "mpsim/core/block_scaled_gemm.hpp"

namespace mpsim::core {
namespace {

using RowMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MatrixMap = Eigen::Map<RowMatrix>;
using ConstMatrixMap = Eigen::Map<const RowMatrix>;
using VectorMap = Eigen::Map<Eigen::VectorXf>;

float* data(const Tensor& t) { return static_cast<float*>(t.buffer()); }
std::span<float> values(const Tensor& t) { return {data(t), static_cast<std::size_t>(t.numel())}; }

MatrixMap matrix(const Tensor& t) { return MatrixMap(data(t), t.rows(), t.cols()); }

void require(bool ok, const char* what) {
  if (!ok) throw std::logic_error(std::string("cpu backend: ") + what);
}

// Buffers are recycled by size: a training step allocates the same shapes
// every step, and fresh pages (mmap, page faults, zeroing) would cost more
// than some element-wise ops themselves.
class BufferPool {
 public:
  std::shared_ptr<void> get(std::size_t count, const std::shared_ptr<BufferPool>& self) {
    float* p = nullptr;
    {
      std::lock_guard lock(mutex_);
      auto& list = free_[count];
      if (!list.empty()) {
        p = list.back().release();
        list.pop_back();
      }
    }
    if (!p) p = new float[count];
    return std::shared_ptr<void>(p, [self, count](void* q) { self->put(static_cast<float*>(q), count); });
  }

 private:
  void put(float* p, std::size_t count) {
    std::lock_guard lock(mutex_);
    free_[count].emplace_back(p);
  }
  std::mutex mutex_;
  std::unordered_map<std::size_t, std::vector<std::unique_ptr<float[]>>> free_;
};

QuantizeOptions options_for(const RoundingPoint& point, StochasticStream stream, int threads) {
  QuantizeOptions o;
  o.rounding = point.rounding;
  o.stochastic = stream;
  o.threads = threads;
  return o;
}

std::uint64_t count_infinite(std::span<const float> v) {
  std::uint64_t n = 0;
  for (const float x : v) n += is_infinite_magnitude(magnitude_bits(x));
  return n;
}

// The largest |x|, NaN ignored: the largest amax_key (numerics.hpp), so it
// vectorises; a float max chain ran at one element per few cycles. The keys
// are below 2^31, so a signed max (SSE2 has no unsigned one) orders them.
float amax_of(std::span<const float> v) {
  std::int32_t largest = 0;
  for (const float x : v) largest = std::max(largest, static_cast<std::int32_t>(amax_key(x)));
  return std::bit_cast<float>(largest);
}

// out[i] = P::forward(in[i], p, i) and dx[i] = P::backward(saved[i], dy[i],
// p, i) over n elements: numerics_ops.hpp's rules, the loops the CUDA
// kernels run too. Branch-free loops: ReLU's sign test is a coin flip on
// real activations, and a branch mispredicted on every other element cost
// 3 ns per element; parameters and indices an entry ignores inline away.
template <typename P>
void pointwise_forward_loop(const float* in, float* out, std::int64_t n, const typename P::Params& p) {
  for (std::int64_t i = 0; i < n; ++i) out[i] = P::forward(in[i], p, i);
}
template <typename P>
void pointwise_backward_loop(const float* saved, const float* dy, float* dx, std::int64_t n,
                             const typename P::Params& p) {
  if constexpr (P::saves == Saves::nothing)
    for (std::int64_t i = 0; i < n; ++i) dx[i] = P::backward(0.0f, dy[i], p, i);
  else
    for (std::int64_t i = 0; i < n; ++i) dx[i] = P::backward(saved[i], dy[i], p, i);
}
// A gated linear unit over rows of [a | b] (numerics_layers.hpp), the CUDA kernels' bodies.
template <typename A>
void gated_forward_loop(const float* x, float* y, std::int64_t rows, std::int64_t n) {
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t j = 0; j < n; ++j) y[r * n + j] = gated_forward<A>(x[r * 2 * n + j], x[r * 2 * n + n + j]);
}
template <typename A>
void gated_backward_loop(const float* x, const float* dy, float* dx, std::int64_t rows, std::int64_t n) {
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t j = 0; j < n; ++j) {
      const float a = x[r * 2 * n + j], b = x[r * 2 * n + n + j], g = dy[r * n + j];
      dx[r * 2 * n + j] = gated_gate_grad<A>(a, b, g);
      dx[r * 2 * n + n + j] = gated_value_grad<A>(a, g);
    }
}

// A row op's optional tensor as memory (null when absent).
float* parameter_data(const Tensor* t) { return t ? data(*t) : nullptr; }
// The parameters of the block at `offset`.
RowParameters at_block(const std::array<const float*, 2>& w, std::int64_t offset) {
  return {{w[0] ? w[0] + offset : nullptr, w[1] ? w[1] + offset : nullptr}};
}
// The values of each group that are no segment, copied (QK-norm's v).
void copy_rest(const RowLayout& L, const float* from, float* to) {
  if (L.rest_count == 0) return;
  for (std::int64_t g = 0; g < L.groups(); ++g)
    std::copy_n(from + g * L.group_stride + L.rest_offset, L.rest_count, to + g * L.group_stride + L.rest_offset);
}

class CpuBackend final : public Backend {
 public:
  CpuBackend() { set_threads(1); }
  std::string_view name() const override { return "cpu"; }
  Device device() const override { return Device::host; }

  void set_threads(int threads) override {
    threads_ = std::max(1, threads);
    openblas_set_num_threads(threads_);
  }
  void set_cpu_gemm(CpuGemm gemm) override { gemm_ = gemm; }
  std::string describe_gemm(CpuGemm gemm, DeviceAttention) const override {
    if (gemm == CpuGemm::ordered) return "ordered (" + std::string(ordered_gemm_target()) + ")";
    return std::string("blas (") + openblas_get_config() + ", " + openblas_get_corename() + " kernels)";
  }

  Tensor zeros_impl(const Shape& shape) override {
    Tensor t = empty(shape);
    std::fill_n(data(t), t.numel(), 0.0f);
    return t;
  }
  Tensor empty_impl(const Shape& shape) override {
    return Tensor(shape, pool_->get(static_cast<std::size_t>(element_count(shape)), pool_));
  }
  Tensor from_host_impl(std::span<const float> v, const Shape& shape) override {
    require(static_cast<std::int64_t>(v.size()) == element_count(shape), "from_host: size does not match shape");
    Tensor t = empty(shape);
    std::memcpy(data(t), v.data(), v.size_bytes());
    return t;
  }
  void to_host_impl(const Tensor& t, std::span<float> out) override {
    require(static_cast<std::int64_t>(out.size()) == t.numel(), "to_host: size does not match");
    std::memcpy(out.data(), data(t), out.size_bytes());
  }
  void copy_impl(const Tensor& from, Tensor& to) override {
    require(from.numel() == to.numel(), "copy: sizes differ");
    std::memcpy(data(to), data(from), sizeof(float) * static_cast<std::size_t>(from.numel()));
  }

  RoundResult round_impl(Tensor& t, const RoundingPoint& point, float scale, StochasticStream stream,
                    TensorStats* stats) override {
    std::span<float> v = values(t);
    RoundResult result;
    if (point.delayed_scaling) result.amax = amax_of(v);
    const bool scaled = scale != 1.0f;
    if (scaled)
      for (float& x : v) x *= scale;
    TensorStats::Classes classes;
    if (stats) classes = stats->add_values(v, threads_);
    if (!point.is_identity()) {
      const QuantizeCounts counts = quantize(point.format, v, v, options_for(point, stream, threads_));
      if (stats) {
        stats->add_rounding(counts);
        // Infinite results come only from infinite inputs or overflow.
        if (classes.infinite != 0 || counts.overflow != 0) (*stats)[Counter::infinite] += count_infinite(v);
      }
    } else if (stats) {
      // binary32 storage: nothing is rounded; the values keep their classes.
      (*stats)[Counter::subnormal] += classes.subnormal;
      (*stats)[Counter::nan] += classes.nan;
      (*stats)[Counter::infinite] += classes.infinite;
    }
    if (scaled) {
      const float inverse = 1.0f / scale;  // exact: scale is a power of two
      for (float& x : v) x *= inverse;
    }
    return result;
  }

  void gemm_impl(const Tensor& a, bool ta, const Tensor& b, bool tb, Tensor& c, const GemmNumerics& numerics,
            StochasticStream stream) override {
    const RoundingPoint& accumulation = numerics.accumulation;
    const ConstMatrixMap am(data(a), a.rows(), a.cols());
    const ConstMatrixMap bm(data(b), b.rows(), b.cols());
    const std::int64_t m = ta ? a.cols() : a.rows(), k = ta ? a.rows() : a.cols();
    const std::int64_t kb = tb ? b.cols() : b.rows(), n = tb ? b.rows() : b.cols();
    require(k == kb && c.rows() == m && c.cols() == n, "gemm: shapes do not match");
    MatrixMap cm = matrix(c);
    if (numerics.a_block || numerics.b_block) {
      require(numerics.a_block && numerics.b_block, "gemm: a block-scaled GEMM takes two block-scaled operands");
      block_scaled_gemm(data(a), ta, a.rows(), a.cols(), data(b), tb, b.rows(), b.cols(), cm.data(), numerics);
      return;
    }
    if (numerics.model) {
      // The model's GEMM takes row-major op(a) [m x k] and op(b) [k x n]: a
      // transposed operand is copied, the other read in place.
      RowMatrix a_copy, b_copy;
      if (ta) a_copy = am.transpose();
      if (tb) b_copy = bm.transpose();
      mpsim::gemm(*numerics.model, ta ? a_copy.data() : data(a), tb ? b_copy.data() : data(b), cm.data(),
                  static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), false, threads_);
      return;
    }
    if (accumulation.is_identity() && gemm_ == CpuGemm::ordered) {
      ordered_gemm(data(a), ta, data(b), tb, cm.data(), m, n, k, threads_);
      return;
    }
    if (accumulation.is_identity()) {
      if (!ta && !tb) cm.noalias() = am * bm;
      else if (ta && !tb) cm.noalias() = am.transpose() * bm;
      else if (!ta && tb) cm.noalias() = am * bm.transpose();
      else cm.noalias() = am.transpose() * bm.transpose();
      return;
    }
    gemm_rounding_every_addition(ta ? RowMatrix(am.transpose()) : RowMatrix(am),
                                 tb ? RowMatrix(bm.transpose()) : RowMatrix(bm), cm, accumulation, stream);
  }

  void add_row_vector_impl(Tensor& x, const Tensor& row) override {
    require(row.numel() == x.cols(), "add_row_vector: sizes differ");
    matrix(x).rowwise() += Eigen::Map<const Eigen::RowVectorXf>(data(row), row.numel());
  }
  void column_sums_impl(const Tensor& x, Tensor& sums) override {
    require(sums.numel() == x.cols(), "column_sums: sizes differ");
    // Rows added in increasing order from +0, each column its own chain (the
    // order ordered_gemm uses; it vectorises across columns).
    const std::int64_t rows = x.rows(), cols = x.cols();
    const float* in = data(x);
    float* out = data(sums);
    std::fill(out, out + cols, 0.0f);
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t j = 0; j < cols; ++j) out[j] += in[r * cols + j];
  }
  void scale_impl(Tensor& x, float factor) override {
    for (float& v : values(x)) v *= factor;
  }
  double sum_squares_impl(const Tensor& x) override {
    // Sixteen partial sums in binary64, a fixed order: vectorised, and the
    // same bits on every run.
    constexpr int lanes = 16;
    std::array<double, lanes> partial{};
    const float* v = data(x);
    const std::int64_t n = x.numel();
    std::int64_t i = 0;
    for (; i + lanes <= n; i += lanes)
      for (int l = 0; l < lanes; ++l) partial[l] += static_cast<double>(v[i + l]) * static_cast<double>(v[i + l]);
    for (; i < n; ++i) partial[0] += static_cast<double>(v[i]) * static_cast<double>(v[i]);
    double sum = 0.0;
    for (const double p : partial) sum += p;
    return sum;
  }
  float max_abs_finite_impl(const Tensor& x) override {
    std::int32_t largest = 0;  // keys are below 2^31: see amax_of
    for (const float v : values(x)) largest = std::max(largest, static_cast<std::int32_t>(finite_amax_key(v)));
    return std::bit_cast<float>(largest);
  }

  // Every entry of the element-wise table, one loop each, instantiated from the table.
  void pointwise_forward_impl(const PointwiseCall& op, const Tensor& x, Tensor& y) override {
    Pointwises::visit(op, [&]<typename P>(P, const typename P::Params& p) {
      pointwise_forward_loop<P>(data(x), data(y), x.numel(), p);
    });
  }
  void pointwise_backward_impl(const PointwiseCall& op, const Tensor& saved, const Tensor& dy, Tensor& dx) override {
    Pointwises::visit(op, [&]<typename P>(P, const typename P::Params& p) {
      pointwise_backward_loop<P>(P::saves == Saves::nothing ? nullptr : data(saved), data(dy), data(dx), dy.numel(), p);
    });
  }

  void gated_activation_forward_impl(Activation kind, const Tensor& x, Tensor& y) override {
    Activations::visit(kind, [&]<typename A>(A) { gated_forward_loop<A>(data(x), data(y), x.rows(), y.cols()); });
  }
  void gated_activation_backward_impl(Activation kind, const Tensor& x, const Tensor& dy, Tensor& dx) override {
    Activations::visit(kind, [&]<typename A>(A) {
      gated_backward_loop<A>(data(x), data(dy), data(dx), x.rows(), dy.cols());
    });
  }

  // Transformers: numerics_attention.hpp's rules; the residual sum, softmax and
  // the mean output by output, as the CUDA kernels run them.
  void add_impl(Tensor& x, const Tensor& y) override {
    float* out = data(x);
    const float* in = data(y);
    for (std::int64_t t = 0; t < x.numel(); ++t) out[t] += in[t];
  }
  // Attention: numerics_attention.hpp's sums, each from 0 in increasing
  // index over the same range, computed a head at a time with the
  // operands copied out contiguously, so that the loops run along a
  // contiguous output dimension (one accumulator per output, vectorised
  // across outputs, never across a sum): the same bits as calling the
  // per-output functions (tests/core/test_transformer_ops.cpp checks that).
  struct Head {
    std::vector<float> q, k, v, kt, vt;  // [tokens, dim] each; kt, vt transposed [dim, tokens]
  };
  static void load_head(const float* qkv, const AttentionShape& s, std::int64_t b, std::int64_t h, Head& head) {
    const std::int64_t n = s.tokens, d = s.head_dim;
    for (auto* m : {&head.q, &head.k, &head.v, &head.kt, &head.vt}) m->resize(static_cast<std::size_t>(n * d));
    for (std::int64_t i = 0; i < n; ++i)
      for (std::int64_t c = 0; c < d; ++c) {
        const float q = qkv[s.qkv_index(b, i, attention_q, h, c)], k = qkv[s.qkv_index(b, i, attention_k, h, c)],
                    v = qkv[s.qkv_index(b, i, attention_v, h, c)];
        head.q[static_cast<std::size_t>(i * d + c)] = q;
        head.k[static_cast<std::size_t>(i * d + c)] = k;
        head.v[static_cast<std::size_t>(i * d + c)] = v;
        head.kt[static_cast<std::size_t>(c * n + i)] = k;
        head.vt[static_cast<std::size_t>(c * n + i)] = v;
      }
  }
  // acc[j] = sum_c a[c] * bt[c * stride + j] for j < count, c in increasing order.
  static void dot_rows(const float* a, const float* bt, std::int64_t dim, std::int64_t stride, std::int64_t count,
                       float* acc) {
    std::fill_n(acc, count, 0.0f);
    for (std::int64_t c = 0; c < dim; ++c) {
      const float x = a[c];
      const float* row = bt + c * stride;
      for (std::int64_t j = 0; j < count; ++j) acc[j] += x * row[j];
    }
  }
  // acc[c] = sum over r in [begin, end) of w[r * w_stride] * m[r * dim + c], r in increasing order.
  static void weighted_rows(const float* w, std::int64_t w_stride, const float* m, std::int64_t dim,
                            std::int64_t begin, std::int64_t end, float* acc) {
    std::fill_n(acc, dim, 0.0f);
    for (std::int64_t r = begin; r < end; ++r) {
      const float x = w[r * w_stride];
      const float* row = m + r * dim;
      for (std::int64_t c = 0; c < dim; ++c) acc[c] += x * row[c];
    }
  }

  void attention_scores_impl(const Tensor& qkv, const AttentionShape& s, Tensor& scores) override {
    const std::int64_t n = s.tokens, d = s.head_dim;
    const float scale = s.scale();
    Head head;
    for (std::int64_t b = 0; b < s.batch; ++b)
      for (std::int64_t h = 0; h < s.heads; ++h) {
        load_head(data(qkv), s, b, h, head);
        for (std::int64_t i = 0; i < n; ++i) {
          float* row = data(scores) + s.score_index(b, h, i, 0);
          const std::int64_t end = s.keys_end(i);
          dot_rows(head.q.data() + i * d, head.kt.data(), d, n, end, row);
          for (std::int64_t j = 0; j < end; ++j) row[j] *= scale;
          std::fill(row + end, row + n, -INFINITY);
        }
      }
  }
  void attention_values_impl(const Tensor& probs, const Tensor& qkv, const AttentionShape& s, Tensor& out) override {
    const std::int64_t n = s.tokens, d = s.head_dim;
    Head head;
    for (std::int64_t b = 0; b < s.batch; ++b)
      for (std::int64_t h = 0; h < s.heads; ++h) {
        load_head(data(qkv), s, b, h, head);
        for (std::int64_t i = 0; i < n; ++i)
          weighted_rows(data(probs) + s.score_index(b, h, i, 0), 1, head.v.data(), d, 0, s.keys_end(i),
                        data(out) + s.output_index(b, i, h, 0));
      }
  }
  void attention_values_backward_impl(const Tensor& probs, const Tensor& qkv, const Tensor& dout,
                                      const AttentionShape& s, Tensor& dprobs, Tensor& dqkv) override {
    const std::int64_t n = s.tokens, d = s.head_dim;
    Head head;
    std::vector<float> g(static_cast<std::size_t>(n * d)), acc(static_cast<std::size_t>(d));
    for (std::int64_t b = 0; b < s.batch; ++b)
      for (std::int64_t h = 0; h < s.heads; ++h) {
        load_head(data(qkv), s, b, h, head);
        for (std::int64_t i = 0; i < n; ++i)
          std::copy_n(data(dout) + s.output_index(b, i, h, 0), d, g.begin() + i * d);
        for (std::int64_t i = 0; i < n; ++i) {
          float* row = data(dprobs) + s.score_index(b, h, i, 0);
          const std::int64_t end = s.keys_end(i);
          dot_rows(g.data() + i * d, head.vt.data(), d, n, end, row);
          std::fill(row + end, row + n, 0.0f);
        }
        for (std::int64_t j = 0; j < n; ++j) {
          weighted_rows(data(probs) + s.score_index(b, h, 0, j), n, g.data(), d, s.queries_begin(j), n, acc.data());
          std::copy_n(acc.begin(), d, data(dqkv) + s.qkv_index(b, j, attention_v, h, 0));
        }
      }
  }
  void attention_scores_backward_impl(const Tensor& dscores, const Tensor& qkv, const AttentionShape& s,
                                      Tensor& dqkv) override {
    const std::int64_t n = s.tokens, d = s.head_dim;
    const float scale = s.scale();
    Head head;
    std::vector<float> acc(static_cast<std::size_t>(d));
    for (std::int64_t b = 0; b < s.batch; ++b)
      for (std::int64_t h = 0; h < s.heads; ++h) {
        load_head(data(qkv), s, b, h, head);
        for (std::int64_t i = 0; i < n; ++i) {
          weighted_rows(data(dscores) + s.score_index(b, h, i, 0), 1, head.k.data(), d, 0, s.keys_end(i), acc.data());
          float* dq = data(dqkv) + s.qkv_index(b, i, attention_q, h, 0);
          for (std::int64_t c = 0; c < d; ++c) dq[c] = acc[static_cast<std::size_t>(c)] * scale;
        }
        for (std::int64_t j = 0; j < n; ++j) {
          weighted_rows(data(dscores) + s.score_index(b, h, 0, j), n, head.q.data(), d, s.queries_begin(j), n,
                        acc.data());
          float* dk = data(dqkv) + s.qkv_index(b, j, attention_k, h, 0);
          for (std::int64_t c = 0; c < d; ++c) dk[c] = acc[static_cast<std::size_t>(c)] * scale;
        }
      }
  }
  // Fused attention: numerics_attention.hpp's online softmax row by row, on
  // the logits attention_scores_impl computes (the same bits as
  // attention_score's) and the head's v rows copied out contiguously.
  void fused_attention_forward_impl(const Tensor& qkv, const AttentionShape& s, const FusedAttention& fused,
                                    Tensor& out, Tensor& lse, Tensor& logit_max) override {
    const std::int64_t n = s.tokens, d = s.head_dim;
    const float scale = s.scale();
    Head head;
    std::vector<float> logits(static_cast<std::size_t>(n));
    for (std::int64_t b = 0; b < s.batch; ++b)
      for (std::int64_t h = 0; h < s.heads; ++h) {
        load_head(data(qkv), s, b, h, head);
        for (std::int64_t i = 0; i < n; ++i) {
          const std::int64_t end = s.keys_end(i);
          dot_rows(head.q.data() + i * d, head.kt.data(), d, n, end, logits.data());
          for (std::int64_t j = 0; j < end; ++j) logits[static_cast<std::size_t>(j)] *= scale;
          const std::int64_t r = (b * s.heads + h) * n + i;
          const FusedAttentionRow row = fused_attention_online(
              end, d, fused, [&](std::int64_t j) { return logits[static_cast<std::size_t>(j)]; },
              [&](std::int64_t j) { return head.v.data() + j * d; }, data(out) + s.output_index(b, i, h, 0),
              s.score_index(b, h, i, 0));
          data(lse)[r] = row.lse;
          data(logit_max)[r] = row.logit_max;
        }
      }
  }
  void fused_attention_probs_impl(const Tensor& scores, const Tensor& lse, Tensor& probs) override {
    const std::int64_t cols = scores.cols();
    for (std::int64_t r = 0; r < scores.rows(); ++r)
      for (std::int64_t j = 0; j < cols; ++j)
        data(probs)[r * cols + j] = fused_attention_probability(data(scores)[r * cols + j], data(lse)[r]);
  }
  void fused_attention_row_dot_impl(const Tensor& dout, const Tensor& out, const AttentionShape& s,
                                    Tensor& dot) override {
    for (std::int64_t b = 0; b < s.batch; ++b)
      for (std::int64_t h = 0; h < s.heads; ++h)
        for (std::int64_t i = 0; i < s.tokens; ++i)
          data(dot)[(b * s.heads + h) * s.tokens + i] = attention_row_dot(data(dout), data(out), s, b, h, i);
  }
  void fused_attention_scores_grad_impl(const Tensor& probs, const Tensor& dprobs, const Tensor& dot,
                                        Tensor& dscores) override {
    const std::int64_t cols = probs.cols();
    for (std::int64_t r = 0; r < probs.rows(); ++r)
      for (std::int64_t j = 0; j < cols; ++j)
        data(dscores)[r * cols + j] =
            fused_attention_score_grad(data(probs)[r * cols + j], data(dprobs)[r * cols + j], data(dot)[r]);
  }
  void softmax_forward_impl(const Tensor& x, Tensor& probs, const InternalRounding& low) override {
    const std::int64_t cols = x.cols();
    for (std::int64_t r = 0; r < x.rows(); ++r) softmax_row(data(x) + r * cols, cols, data(probs) + r * cols, low);
  }
  void softmax_backward_impl(const Tensor& probs, const Tensor& dprobs, Tensor& dx,
                             const InternalRounding& low) override {
    const std::int64_t cols = probs.cols();
    for (std::int64_t r = 0; r < probs.rows(); ++r)
      softmax_backward_row(data(probs) + r * cols, data(dprobs) + r * cols, cols, data(dx) + r * cols, low);
  }
  void rotary_impl(const Tensor& qkv, const Tensor& table, const AttentionShape& s, bool inverse,
                   Tensor& y) override {
    const float* x = data(qkv);
    float* out = data(y);
    const RotaryAngles angles{data(table), inverse};
    for (std::int64_t r = 0; r < s.rows(); ++r)
      for (int part = attention_q; part <= attention_v; ++part)
        for (std::int64_t h = 0; h < s.heads; ++h)
          for (std::int64_t c = 0; c < s.head_dim; ++c)
            out[s.qkv_index(r / s.tokens, r % s.tokens, part, h, c)] = rotary_value(x, s, angles, r, part, h, c);
  }
  void sequence_mean_forward_impl(const Tensor& x, std::int64_t tokens, Tensor& y) override {
    const std::int64_t width = x.cols();
    for (std::int64_t b = 0; b < y.rows(); ++b)
      for (std::int64_t c = 0; c < width; ++c) data(y)[b * width + c] = sequence_mean(data(x), tokens, width, b, c);
  }
  void sequence_mean_backward_impl(const Tensor& dy, std::int64_t tokens, Tensor& dx) override {
    const std::int64_t width = dy.cols();
    for (std::int64_t r = 0; r < dx.rows(); ++r)
      for (std::int64_t c = 0; c < width; ++c)
        data(dx)[r * width + c] = sequence_mean_grad(data(dy)[(r / tokens) * width + c], tokens);
  }

  void embedding_forward_impl(const Tensor& ids, const Tensor& table, Tensor& out) override {
    const std::int64_t width = table.cols(), rows = table.rows();
    for (std::int64_t t = 0; t < ids.numel(); ++t)
      for (std::int64_t c = 0; c < width; ++c)
        data(out)[t * width + c] = embedding_value(data(table), rows, width, data(ids)[t], c);
  }
  // Token by token in increasing order: each element of the table adds its
  // terms in embedding_grad's order, without its search over all tokens.
  void embedding_backward_impl(const Tensor& ids, const Tensor& dout, Tensor& dtable) override {
    const std::int64_t width = dtable.cols(), rows = dtable.rows();
    float* g = data(dtable);
    std::fill_n(g, dtable.numel(), 0.0f);
    for (std::int64_t t = 0; t < ids.numel(); ++t) {
      const std::int64_t v = embedding_row(data(ids)[t], rows);
      if (v < 0) continue;
      for (std::int64_t c = 0; c < width; ++c) g[v * width + c] += data(dout)[t * width + c];
    }
  }

  // Every entry of the row-wise table (numerics_rows.hpp): segments in
  // increasing order, each one's statistics and then its elements; the
  // parameters' gradients summed in binary32 from 0 in increasing segment
  // order, as the CUDA kernel's threads sum them one parameter index each.
  void row_forward_impl(const RowCall& op, const RowLayout& L, const Tensor& x, Tensor& y,
                        const RowTensors& t) override {
    Rows::visit(op, [&]<typename R>(R, const typename R::Params& p) {
      const float* in = data(x);
      float* out = data(y);
      const std::array<const float*, 2> w{parameter_data(t.parameters[0]), parameter_data(t.parameters[1])};
      float* const stats[2] = {parameter_data(t.statistics[0]), parameter_data(t.statistics[1])};
      for (std::int64_t s = 0; s < L.segments; ++s) {
        const float* segment = in + L.offset(s);
        const typename R::Stats st = R::statistics(segment, L.cols, p);
        R::store(st, stats, s);
        const RowParameters at = at_block(w, L.param_offset(s));
        for (std::int64_t j = 0; j < L.cols; ++j) out[L.offset(s) + j] = R::value(segment[j], j, st, at, p);
      }
      copy_rest(L, in, out);
    });
  }
  void row_backward_impl(const RowCall& op, const RowLayout& L, const Tensor& x, const Tensor& dy, Tensor& dx,
                         const RowTensors& t) override {
    Rows::visit(op, [&]<typename R>(R, const typename R::Params& p) {
      const float *in = data(x), *g = data(dy);
      float* out = data(dx);
      const std::array<const float*, 2> w{parameter_data(t.parameters[0]), parameter_data(t.parameters[1])};
      const float* const stats[2] = {parameter_data(t.statistics[0]), parameter_data(t.statistics[1])};
      float* const grads[2] = {parameter_data(t.parameter_grads[0]), parameter_data(t.parameter_grads[1])};
      for (float* const grad : grads)
        if (grad) std::fill(grad, grad + L.param_count(), 0.0f);
      for (std::int64_t s = 0; s < L.segments; ++s) {
        const std::int64_t o = L.offset(s), po = L.param_offset(s);
        const typename R::Stats st = R::load(stats, s);
        const RowParameters at = at_block(w, po);
        const typename R::GradStats gs = R::grad_statistics(in + o, g + o, L.cols, st, at, p);
        for (std::int64_t j = 0; j < L.cols; ++j) {
          float terms[2];
          R::parameter_terms(in[o + j], g[o + j], st, terms);
          for (int k = 0; k < 2; ++k)
            if (grads[k]) grads[k][po + j] += terms[k];
          out[o + j] = R::grad(in[o + j], g[o + j], j, st, gs, at, p);  // last: dx may be dy
        }
      }
      copy_rest(L, g, out);
    });
  }

  void im2col_impl(const Tensor& x, const ConvGeometry& g, Tensor& columns) override {
    const std::int64_t oh = g.out_height(), ow = g.out_width(), kk = g.kernel * g.kernel;
    const std::int64_t width = g.channels * kk;
    require(columns.numel() == g.batch * oh * ow * width, "im2col: output size");
    const float* in = data(x);
    float* out = data(columns);
    for (std::int64_t b = 0; b < g.batch; ++b)
      for (std::int64_t i = 0; i < oh; ++i)
        for (std::int64_t j = 0; j < ow; ++j) {
          float* row = out + ((b * oh + i) * ow + j) * width;
          for (std::int64_t c = 0; c < g.channels; ++c)
            for (std::int64_t p = 0; p < g.kernel; ++p)
              for (std::int64_t q = 0; q < g.kernel; ++q) {
                const std::int64_t y = i * g.stride - g.padding + p, xx = j * g.stride - g.padding + q;
                const bool inside = y >= 0 && y < g.height && xx >= 0 && xx < g.width;
                row[c * kk + p * g.kernel + q] =
                    inside ? in[((b * g.channels + c) * g.height + y) * g.width + xx] : 0.0f;
              }
        }
  }
  void col2im_impl(const Tensor& columns, const ConvGeometry& g, Tensor& dx) override {
    const std::int64_t oh = g.out_height(), ow = g.out_width(), kk = g.kernel * g.kernel;
    const std::int64_t width = g.channels * kk;
    const float* in = data(columns);
    float* out = data(dx);
    for (std::int64_t b = 0; b < g.batch; ++b)
      for (std::int64_t i = 0; i < oh; ++i)
        for (std::int64_t j = 0; j < ow; ++j) {
          const float* row = in + ((b * oh + i) * ow + j) * width;
          for (std::int64_t c = 0; c < g.channels; ++c)
            for (std::int64_t p = 0; p < g.kernel; ++p)
              for (std::int64_t q = 0; q < g.kernel; ++q) {
                const std::int64_t y = i * g.stride - g.padding + p, xx = j * g.stride - g.padding + q;
                if (y >= 0 && y < g.height && xx >= 0 && xx < g.width)
                  out[((b * g.channels + c) * g.height + y) * g.width + xx] += row[c * kk + p * g.kernel + q];
              }
        }
  }
  void rows_to_nchw_impl(const Tensor& rows, std::int64_t batch, std::int64_t h, std::int64_t w, Tensor& nchw) override {
    const std::int64_t c = rows.cols(), hw = h * w;
    const float* in = data(rows);
    float* out = data(nchw);
    for (std::int64_t b = 0; b < batch; ++b)
      for (std::int64_t p = 0; p < hw; ++p)
        for (std::int64_t ch = 0; ch < c; ++ch) out[(b * c + ch) * hw + p] = in[(b * hw + p) * c + ch];
  }
  void nchw_to_rows_impl(const Tensor& nchw, Tensor& rows) override {
    const Shape& s = nchw.shape();
    const std::int64_t batch = s[0], c = s[1], hw = s[2] * s[3];
    const float* in = data(nchw);
    float* out = data(rows);
    for (std::int64_t b = 0; b < batch; ++b)
      for (std::int64_t ch = 0; ch < c; ++ch)
        for (std::int64_t p = 0; p < hw; ++p) out[(b * hw + p) * c + ch] = in[(b * c + ch) * hw + p];
  }
  void max_pool_forward_impl(const Tensor& x, const ConvGeometry& g, Tensor& y, Tensor& argmax) override {
    const std::int64_t oh = g.out_height(), ow = g.out_width();
    const float* in = data(x);
    float *out = data(y), *arg = data(argmax);
    for (std::int64_t plane = 0; plane < g.batch * g.channels; ++plane)
      for (std::int64_t i = 0; i < oh; ++i)
        for (std::int64_t j = 0; j < ow; ++j) {
          float best = -std::numeric_limits<float>::infinity();
          std::int64_t best_index = -1;
          for (std::int64_t p = 0; p < g.kernel; ++p)
            for (std::int64_t q = 0; q < g.kernel; ++q) {
              const std::int64_t yy = i * g.stride - g.padding + p, xx = j * g.stride - g.padding + q;
              if (yy < 0 || yy >= g.height || xx < 0 || xx >= g.width) continue;
              const std::int64_t index = yy * g.width + xx;
              const float v = in[plane * g.height * g.width + index];
              if (best_index < 0 || v > best || std::isnan(v)) {  // NaN propagates, as in PyTorch
                best = v;
                best_index = index;
                if (std::isnan(v)) p = q = g.kernel;
              }
            }
          out[(plane * oh + i) * ow + j] = best;
          arg[(plane * oh + i) * ow + j] = static_cast<float>(best_index);  // index within the plane: < 2^24
        }
  }
  void max_pool_backward_impl(const Tensor& dy, const Tensor& argmax, Tensor& dx) override {
    const Shape& in = dx.shape();
    const Shape& out = dy.shape();
    const std::int64_t planes = in[0] * in[1], in_hw = in[2] * in[3], out_hw = out[2] * out[3];
    const float *g = data(dy), *arg = data(argmax);
    float* gx = data(dx);
    std::fill(gx, gx + dx.numel(), 0.0f);
    for (std::int64_t plane = 0; plane < planes; ++plane)
      for (std::int64_t p = 0; p < out_hw; ++p)
        gx[plane * in_hw + static_cast<std::int64_t>(arg[plane * out_hw + p])] += g[plane * out_hw + p];
  }

  LossResult softmax_cross_entropy_impl(const Tensor& logits, const Tensor& labels, float grad_scale,
                                   Tensor& d_logits) override {
    return softmax_rows(logits, labels, grad_scale / static_cast<float>(logits.rows()), d_logits);
  }
  // d_logits = (softmax - onehot) * factor, row by row (numerics_layers.hpp);
  // the rows' losses added in binary64 in row order, as the CUDA step does.
  static LossResult softmax_rows(const Tensor& logits, const Tensor& labels, float factor, Tensor& d_logits,
                                 float z_loss = 0.0f, const InternalRounding& low = {}) {
    const std::int64_t rows = logits.rows(), cols = logits.cols();
    const float *z = data(logits), *y = data(labels);
    float* dz = data(d_logits);
    LossResult result;
    for (std::int64_t r = 0; r < rows; ++r) {
      const SoftmaxRow row = softmax_cross_entropy_row(z + r * cols, cols, y[r], factor, dz + r * cols, z_loss, low);
      result.loss_sum += static_cast<double>(row.loss);
      result.correct += row.correct;
    }
    return result;
  }

  // The per-element rules are numerics.hpp's, which the CUDA kernels run too.
  void sgd_update(const Tensor& weight, const Tensor& grad, Tensor& momentum, float lr, float momentum_factor,
                  float weight_decay, bool first_step, Tensor& update) override {
    const float *w = data(weight), *g = data(grad);
    float *m = data(momentum), *u = data(update);
    const SgdConstants c{-lr, momentum_factor, weight_decay, first_step};
    for (std::int64_t i = 0, n = weight.numel(); i < n; ++i) u[i] = core::sgd_update(c, w[i], g[i], m[i]);
  }
  void adam_update(const Tensor& weight, const Tensor& grad, Tensor& m, Tensor& v, const AdamParams& p,
                   Tensor& update) override {
    const float *w = data(weight), *g = data(grad);
    float *mm = data(m), *vv = data(v), *u = data(update);
    const AdamConstants c = adam_constants(p.lr, p.beta1, p.beta2, p.eps, p.weight_decay, p.decoupled, p.step);
    for (std::int64_t i = 0, n = weight.numel(); i < n; ++i) u[i] = core::adam_update(c, w[i], g[i], mm[i], vv[i]);
  }

  void apply_update(Tensor& weight, const Tensor& update, const RoundingPoint& storage,
                    StochasticStream stream, TensorStats* stats) override {
    float* w = data(weight);
    const float* u = data(update);
    const std::int64_t n = weight.numel();
    if (stats) stats->add_values(values(update), threads_);
    std::uint64_t swallowed = 0;
    if (storage.is_identity()) {
      for (std::int64_t i = 0; i < n; ++i) {
        const float next = w[i] + u[i];
        swallowed += core::swallowed(u[i], w[i], next);
        w[i] = next;
      }
    } else {
      // Exact sum rounded to odd in binary64, then one rounding to the storage format.
      std::vector<double>& sum = scratch_;
      sum.resize(static_cast<std::size_t>(n));
      for (std::int64_t i = 0; i < n; ++i) sum[i] = add_round_to_odd(w[i], u[i]);
      const QuantizeCounts counts = quantize(storage.format, sum, sum, options_for(storage, stream, threads_));
      if (stats) stats->add_rounding(counts);
      for (std::int64_t i = 0; i < n; ++i) {
        const auto next = static_cast<float>(sum[i]);  // exact: the storage format fits in binary32
        swallowed += core::swallowed(u[i], w[i], next);
        w[i] = next;
      }
    }
    if (stats) (*stats)[Counter::swallowed] += swallowed;
  }

  void round_delayed_impl(Tensor& t, const RoundingPoint& point, Tensor& history, int margin, bool record,
                     StochasticStream stream, TensorStats* stats) override {
    const std::span<float> ring = values(history);
    require(ring.size() >= 2 && point.delayed_scaling, "round_delayed: needs a scaled point and a history of >= 1");
    const int length = static_cast<int>(ring.size() - 1);
    const float amax = history_amax(ring.data(), length);
    const RoundResult r = round(t, point, delayed_scale(amax, point.format.largest_finite(), margin), stream, stats);
    if (record) push_history(ring.data(), length, r.amax);
  }

  // --- The training step: its scalars live on the host here ---------------------------------------------------
  void start_steps_impl(const LossScaling& scaling, const LossDefinition& loss,
                        const InternalRounding& loss_low) override {
    scaling_ = scaling;
    loss_ = loss;
    loss_low_ = loss_low;
    scaler_ = initial_loss_scale(scaling);
    current_ = {};
    steps_.clear();
    skip_ = false;
    optimizer_steps_ = 0;
  }
  void step_loss_impl(const Tensor& logits, const Tensor& labels, Tensor& d_logits) override {
    const LossResult r =
        softmax_rows(logits, labels, loss_gradient_factor(scaler_.scale, loss_, logits.rows()), d_logits,
                     static_cast<float>(loss_.z_loss), loss_low_);
    current_.loss_sum += r.loss_sum;
    current_.correct += r.correct;
  }
  void step_check_gradient_impl(const Tensor& grad) override { current_.grad_sum_squares += sum_squares(grad); }
  void end_step_impl() override {
    current_.loss_scale = scaler_.scale;
    const StepDecision decision = decide_step(scaler_, scaling_, current_.loss_sum, current_.grad_sum_squares);
    current_.found_inf = decision.found_inf;
    skip_ = decision.found_inf;
    unscale_ = decision.unscale;
    inverse_scale_ = decision.inverse_scale;
    last_sum_squares_ = current_.grad_sum_squares;
    last_scale_ = current_.loss_scale;
    if (!skip_) ++optimizer_steps_;
    steps_.push_back(std::exchange(current_, {}));
  }
  void optimizer_step_impl(const OptimizerParams& p, Tensor& weight, Tensor& grad, Tensor& state1, Tensor& state2,
                      Tensor& update, const RoundingPoint& storage, StochasticStream stream,
                      TensorStats* stats) override {
    if (skip_) return;
    if (unscale_) {  // numerics.hpp's unscale, element by element
      float* g = data(grad);
      for (std::int64_t i = 0, n = grad.numel(); i < n; ++i) g[i] = unscale(g[i], inverse_scale_);
    }
    // Clipping: a second binary32 multiplication, as clip_grad_norm_ after unscale_.
    if (const float f = clip_factor(last_sum_squares_, last_scale_, p.clip_norm); f < 1.0f) {
      float* g = data(grad);
      for (std::int64_t i = 0, n = grad.numel(); i < n; ++i) g[i] *= f;
    }
    if (p.kind == OptimizerKind::sgd) {
      sgd_update(weight, grad, state1, p.lr, p.momentum, p.weight_decay, optimizer_steps_ == 1, update);
    } else {
      const AdamParams a{p.lr, p.beta1, p.beta2, p.eps, p.weight_decay, p.kind == OptimizerKind::adamw,
                         optimizer_steps_};
      adam_update(weight, grad, state1, state2, a, update);
    }
    apply_update(weight, update, storage, stream, stats);
  }
  void round_state_impl(Tensor& state, const RoundingPoint& point, Tensor* history, int margin,
                   StochasticStream stream) override {
    if (skip_) return;
    if (history) round_delayed(state, point, *history, margin, true, stream, nullptr);
    else if (!point.is_identity()) round(state, point, 1.0f, stream, nullptr);
  }
  std::vector<StepScalars> take_steps_impl() override { return std::exchange(steps_, {}); }

 private:
  // Every multiply-add rounds to the accumulation format: acc <- round(acc + a*b),
  // k in increasing order. a*b is exact in binary64; the addition is rounded to
  // odd and then once to the format, so each step is one correct rounding.
  void gemm_rounding_every_addition(const RowMatrix& a, const RowMatrix& b, MatrixMap& c,
                                    const RoundingPoint& accumulation, StochasticStream stream) {
    const std::int64_t m = a.rows(), k = a.cols(), n = b.cols();
    std::vector<double> acc(static_cast<std::size_t>(n));
    QuantizeOptions options = options_for(accumulation, stream, 1);
    for (std::int64_t i = 0; i < m; ++i) {
      std::fill(acc.begin(), acc.end(), 0.0);
      for (std::int64_t kk = 0; kk < k; ++kk) {
        const double aik = a(i, kk);
        const float* brow = b.data() + kk * n;
        for (std::int64_t j = 0; j < n; ++j) acc[j] = add_round_to_odd(acc[j], aik * static_cast<double>(brow[j]));
        options.stochastic.first_index = stream.first_index + static_cast<std::uint64_t>((i * k + kk) * n);
        quantize(accumulation.format, acc, acc, options);
      }
      for (std::int64_t j = 0; j < n; ++j) c(i, j) = static_cast<float>(acc[j]);
    }
  }

  int threads_ = 1;
  CpuGemm gemm_ = CpuGemm::ordered;
  std::vector<double> scratch_;
  // The training step's state (start_steps .. take_steps).
  LossScaling scaling_;
  LossDefinition loss_;
  InternalRounding loss_low_;
  LossScaleState scaler_;
  StepScalars current_;
  std::vector<StepScalars> steps_;
  bool skip_ = false, unscale_ = false;
  float inverse_scale_ = 1.0f;
  double last_sum_squares_ = 0.0, last_scale_ = 1.0;  // the last ended step's, for clipping
  std::int64_t optimizer_steps_ = 0;
  std::shared_ptr<BufferPool> pool_ = std::make_shared<BufferPool>();
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend() { return std::make_unique<CpuBackend>(); }

namespace {
std::vector<std::pair<std::string, BackendFactory>>& registry() {
  static std::vector<std::pair<std::string, BackendFactory>> backends{{"cpu", &make_cpu_backend}};
  return backends;
}
}  // namespace

void register_backend(std::string_view name, BackendFactory factory) {
  registry().emplace_back(std::string(name), factory);
}
std::unique_ptr<Backend> make_backend(std::string_view name) {
  for (const auto& [n, factory] : registry())
    if (n == name) return factory();
  return nullptr;
}
std::vector<std::string> backend_names() {
  std::vector<std::string> names;
  for (const auto& entry : registry()) names.push_back(entry.first);
  return names;
}

}  // namespace mpsim::core
