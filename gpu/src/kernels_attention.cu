// Transformer ops, bit for bit the CPU backend's up to expf: one thread per
// output element running numerics_attention.hpp's rules (the CPU's loop
// bodies), a thread per row for softmax. Attention here is a numerics path:
// each thread re-reads its operands from global memory, no tiling, no
// tensor cores (the sizes mpsim trains are small).
#include "kernels.hpp"
#include "mpsim/core/numerics_attention.hpp"

namespace mpsim::gpu::kernels {
namespace {

__global__ void add_kernel(float* x, const float* y, std::int64_t n) {
  for (std::int64_t t = thread_index(); t < n; t += thread_count()) x[t] = __fadd_rn(x[t], y[t]);
}

__global__ void attention_scores_kernel(const float* qkv, core::AttentionShape s, float* scores) {
  const std::int64_t total = s.score_rows() * s.tokens;
  for (std::int64_t t = thread_index(); t < total; t += thread_count()) {
    const std::int64_t j = t % s.tokens, row = t / s.tokens, i = row % s.tokens, bh = row / s.tokens;
    scores[t] = core::attention_score(qkv, s, bh / s.heads, bh % s.heads, i, j);
  }
}

// One thread per output element (b, i, h, c) in the output's row-major order.
__global__ void attention_values_kernel(const float* probs, const float* qkv, core::AttentionShape s, float* out) {
  const std::int64_t total = s.rows() * s.width();
  for (std::int64_t t = thread_index(); t < total; t += thread_count()) {
    const std::int64_t col = t % s.width(), row = t / s.width();
    out[t] = core::attention_value(probs, qkv, s, row / s.tokens, col / s.head_dim, row % s.tokens, col % s.head_dim);
  }
}

__global__ void attention_probs_grad_kernel(const float* dout, const float* qkv, core::AttentionShape s,
                                            float* dprobs) {
  const std::int64_t total = s.score_rows() * s.tokens;
  for (std::int64_t t = thread_index(); t < total; t += thread_count()) {
    const std::int64_t j = t % s.tokens, row = t / s.tokens, i = row % s.tokens, bh = row / s.tokens;
    dprobs[t] = core::attention_probs_grad(dout, qkv, s, bh / s.heads, bh % s.heads, i, j);
  }
}

// Over (b, token, h, c): dv (part v) or dq and dk (parts q and k) into dqkv.
__global__ void attention_v_grad_kernel(const float* probs, const float* dout, core::AttentionShape s, float* dqkv) {
  const std::int64_t total = s.rows() * s.width();
  for (std::int64_t t = thread_index(); t < total; t += thread_count()) {
    const std::int64_t col = t % s.width(), row = t / s.width();
    const std::int64_t b = row / s.tokens, j = row % s.tokens, h = col / s.head_dim, c = col % s.head_dim;
    dqkv[s.qkv_index(b, j, core::attention_v, h, c)] = core::attention_v_grad(probs, dout, s, b, h, j, c);
  }
}
__global__ void attention_qk_grad_kernel(const float* dscores, const float* qkv, core::AttentionShape s, float* dqkv) {
  const std::int64_t total = s.rows() * s.width();
  for (std::int64_t t = thread_index(); t < total; t += thread_count()) {
    const std::int64_t col = t % s.width(), row = t / s.width();
    const std::int64_t b = row / s.tokens, i = row % s.tokens, h = col / s.head_dim, c = col % s.head_dim;
    dqkv[s.qkv_index(b, i, core::attention_q, h, c)] = core::attention_q_grad(dscores, qkv, s, b, h, i, c);
    dqkv[s.qkv_index(b, i, core::attention_k, h, c)] = core::attention_k_grad(dscores, qkv, s, b, h, i, c);
  }
}

__global__ void attention_mask_kernel(float* scores, core::AttentionShape s, float value) {
  const std::int64_t total = s.score_rows() * s.tokens;
  for (std::int64_t t = thread_index(); t < total; t += thread_count())
    if (t % s.tokens >= s.keys_end(t / s.tokens % s.tokens)) scores[t] = value;
}

__global__ void softmax_kernel(const float* x, std::int64_t rows, std::int64_t cols, float* p,
                               core::InternalRounding low) {
  for (std::int64_t r = thread_index(); r < rows; r += thread_count())
    core::softmax_row(x + r * cols, cols, p + r * cols, low);
}
__global__ void softmax_backward_kernel(const float* p, const float* dp, std::int64_t rows, std::int64_t cols,
                                        float* dx, core::InternalRounding low) {
  for (std::int64_t r = thread_index(); r < rows; r += thread_count())
    core::softmax_backward_row(p + r * cols, dp + r * cols, cols, dx + r * cols, low);
}

// A thread per element of the [q | k | v] rows.
__global__ void rotary_kernel(const float* qkv, core::AttentionShape s, core::RotaryAngles angles, float* y) {
  const std::int64_t cols = 3 * s.width(), total = s.rows() * cols;
  for (std::int64_t t = thread_index(); t < total; t += thread_count()) {
    const std::int64_t r = t / cols, col = t % cols, part = col / s.width(), h = col % s.width() / s.head_dim;
    y[t] = core::rotary_value(qkv, s, angles, r, static_cast<int>(part), h, col % s.head_dim);
  }
}

// Fused attention: a thread per score row (the CPU's loop body), a thread per element for the backward's pieces.
__global__ void fused_attention_kernel(const float* qkv, core::AttentionShape s, core::FusedAttention fused,
                                       float* out, float* lse, float* logit_max) {
  for (std::int64_t r = thread_index(); r < s.score_rows(); r += thread_count()) {
    const std::int64_t i = r % s.tokens, h = r / s.tokens % s.heads, b = r / (s.tokens * s.heads);
    const core::FusedAttentionRow row = core::fused_attention_row(qkv, s, fused, b, h, i, out + s.output_index(b, i, h, 0));
    lse[r] = row.lse;
    logit_max[r] = row.logit_max;
  }
}
__global__ void fused_attention_probs_kernel(const float* scores, const float* lse, std::int64_t rows,
                                             std::int64_t cols, float* probs) {
  for (std::int64_t t = thread_index(); t < rows * cols; t += thread_count())
    probs[t] = core::fused_attention_probability(scores[t], lse[t / cols]);
}
__global__ void fused_attention_row_dot_kernel(const float* dout, const float* out, core::AttentionShape s,
                                               float* dot) {
  for (std::int64_t r = thread_index(); r < s.score_rows(); r += thread_count())
    dot[r] = core::attention_row_dot(dout, out, s, r / (s.tokens * s.heads), r / s.tokens % s.heads, r % s.tokens);
}
__global__ void fused_attention_scores_grad_kernel(const float* probs, const float* dprobs, const float* dot,
                                                   std::int64_t rows, std::int64_t cols, float* dscores) {
  for (std::int64_t t = thread_index(); t < rows * cols; t += thread_count())
    dscores[t] = core::fused_attention_score_grad(probs[t], dprobs[t], dot[t / cols]);
}

__global__ void sequence_mean_kernel(const float* x, std::int64_t tokens, std::int64_t samples, std::int64_t width,
                                     float* y) {
  const std::int64_t total = samples * width;
  for (std::int64_t t = thread_index(); t < total; t += thread_count())
    y[t] = core::sequence_mean(x, tokens, width, t / width, t % width);
}
__global__ void sequence_mean_backward_kernel(const float* dy, std::int64_t tokens, std::int64_t rows,
                                              std::int64_t width, float* dx) {
  const std::int64_t total = rows * width;
  for (std::int64_t t = thread_index(); t < total; t += thread_count())
    dx[t] = core::sequence_mean_grad(dy[(t / width / tokens) * width + t % width], tokens);
}

__global__ void embedding_kernel(const float* ids, const float* table, std::int64_t tokens, std::int64_t rows,
                                 std::int64_t width, float* out) {
  const std::int64_t total = tokens * width;
  for (std::int64_t t = thread_index(); t < total; t += thread_count())
    out[t] = core::embedding_value(table, rows, width, ids[t / width], t % width);
}
// One thread per element of the table, over every token in order (the CPU's order).
__global__ void embedding_grad_kernel(const float* ids, const float* dout, std::int64_t tokens, std::int64_t rows,
                                      std::int64_t width, float* dtable) {
  const std::int64_t total = rows * width;
  for (std::int64_t t = thread_index(); t < total; t += thread_count())
    dtable[t] = core::embedding_grad(ids, dout, tokens, rows, width, t / width, t % width);
}

}  // namespace

void embedding_forward(const float* ids, const float* table, std::int64_t tokens, std::int64_t rows,
                       std::int64_t width, float* out, cudaStream_t stream) {
  if (tokens * width <= 0) return;
  embedding_kernel<<<blocks(tokens * width), threads, 0, stream>>>(ids, table, tokens, rows, width, out);
  MPSIM_CUDA_CHECK_LAUNCH();
}

void embedding_backward(const float* ids, const float* dout, std::int64_t tokens, std::int64_t rows,
                        std::int64_t width, float* dtable, cudaStream_t stream) {
  if (rows * width <= 0) return;
  embedding_grad_kernel<<<blocks(rows * width), threads, 0, stream>>>(ids, dout, tokens, rows, width, dtable);
  MPSIM_CUDA_CHECK_LAUNCH();
}

void add(float* x, const float* y, std::int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  add_kernel<<<blocks(n), threads, 0, stream>>>(x, y, n);
  MPSIM_CUDA_CHECK_LAUNCH();
}

void attention_scores(const float* qkv, const core::AttentionShape& s, float* scores, cudaStream_t stream) {
  const std::int64_t n = s.score_rows() * s.tokens;
  if (n <= 0) return;
  attention_scores_kernel<<<blocks(n), threads, 0, stream>>>(qkv, s, scores);
  MPSIM_CUDA_CHECK_LAUNCH();
}

void attention_values(const float* probs, const float* qkv, const core::AttentionShape& s, float* out,
                      cudaStream_t stream) {
  const std::int64_t n = s.rows() * s.width();
  if (n <= 0) return;
  attention_values_kernel<<<blocks(n), threads, 0, stream>>>(probs, qkv, s, out);
  MPSIM_CUDA_CHECK_LAUNCH();
}

void attention_values_backward(const float* probs, const float* qkv, const float* dout, const core::AttentionShape& s,
                               float* dprobs, float* dqkv, cudaStream_t stream) {
  const std::int64_t scores = s.score_rows() * s.tokens, values = s.rows() * s.width();
  if (scores > 0) {
    attention_probs_grad_kernel<<<blocks(scores), threads, 0, stream>>>(dout, qkv, s, dprobs);
    MPSIM_CUDA_CHECK_LAUNCH();
  }
  if (values > 0) {
    attention_v_grad_kernel<<<blocks(values), threads, 0, stream>>>(probs, dout, s, dqkv);
    MPSIM_CUDA_CHECK_LAUNCH();
  }
}

void attention_scores_backward(const float* dscores, const float* qkv, const core::AttentionShape& s, float* dqkv,
                               cudaStream_t stream) {
  const std::int64_t n = s.rows() * s.width();
  if (n <= 0) return;
  attention_qk_grad_kernel<<<blocks(n), threads, 0, stream>>>(dscores, qkv, s, dqkv);
  MPSIM_CUDA_CHECK_LAUNCH();
}

void fused_attention_forward(const float* qkv, const core::AttentionShape& s, const core::FusedAttention& fused,
                             float* out, float* lse, float* logit_max, cudaStream_t stream) {
  const std::int64_t n = s.score_rows();
  if (n <= 0) return;
  fused_attention_kernel<<<blocks(n), threads, 0, stream>>>(qkv, s, fused, out, lse, logit_max);
  MPSIM_CUDA_CHECK_LAUNCH();
}
void fused_attention_probs(const float* scores, const float* lse, std::int64_t rows, std::int64_t cols, float* probs,
                           cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return;
  fused_attention_probs_kernel<<<blocks(rows * cols), threads, 0, stream>>>(scores, lse, rows, cols, probs);
  MPSIM_CUDA_CHECK_LAUNCH();
}
void fused_attention_row_dot(const float* dout, const float* out, const core::AttentionShape& s, float* dot,
                             cudaStream_t stream) {
  const std::int64_t n = s.score_rows();
  if (n <= 0) return;
  fused_attention_row_dot_kernel<<<blocks(n), threads, 0, stream>>>(dout, out, s, dot);
  MPSIM_CUDA_CHECK_LAUNCH();
}
void fused_attention_scores_grad(const float* probs, const float* dprobs, const float* dot, std::int64_t rows,
                                 std::int64_t cols, float* dscores, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return;
  fused_attention_scores_grad_kernel<<<blocks(rows * cols), threads, 0, stream>>>(probs, dprobs, dot, rows, cols,
                                                                                   dscores);
  MPSIM_CUDA_CHECK_LAUNCH();
}

void attention_mask(float* scores, const core::AttentionShape& s, float value, cudaStream_t stream) {
  const std::int64_t n = s.score_rows() * s.tokens;
  if (!s.causal || n <= 0) return;
  attention_mask_kernel<<<blocks(n), threads, 0, stream>>>(scores, s, value);
  MPSIM_CUDA_CHECK_LAUNCH();
}

void softmax_forward(const float* x, std::int64_t rows, std::int64_t cols, float* probs,
                     const core::InternalRounding& low, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return;
  softmax_kernel<<<blocks(rows), threads, 0, stream>>>(x, rows, cols, probs, low);
  MPSIM_CUDA_CHECK_LAUNCH();
}

void softmax_backward(const float* probs, const float* dprobs, std::int64_t rows, std::int64_t cols, float* dx,
                      const core::InternalRounding& low, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return;
  softmax_backward_kernel<<<blocks(rows), threads, 0, stream>>>(probs, dprobs, rows, cols, dx, low);
  MPSIM_CUDA_CHECK_LAUNCH();
}

void rotary(const float* qkv, const float* table, const core::AttentionShape& s, bool inverse, float* y,
            cudaStream_t stream) {
  const std::int64_t n = s.rows() * 3 * s.width();
  if (n <= 0) return;
  rotary_kernel<<<blocks(n), threads, 0, stream>>>(qkv, s, core::RotaryAngles{table, inverse}, y);
  MPSIM_CUDA_CHECK_LAUNCH();
}

void sequence_mean_forward(const float* x, std::int64_t tokens, std::int64_t samples, std::int64_t width, float* y,
                           cudaStream_t stream) {
  if (samples * width <= 0) return;
  sequence_mean_kernel<<<blocks(samples * width), threads, 0, stream>>>(x, tokens, samples, width, y);
  MPSIM_CUDA_CHECK_LAUNCH();
}

void sequence_mean_backward(const float* dy, std::int64_t tokens, std::int64_t rows, std::int64_t width, float* dx,
                            cudaStream_t stream) {
  if (rows * width <= 0) return;
  sequence_mean_backward_kernel<<<blocks(rows * width), threads, 0, stream>>>(dy, tokens, rows, width, dx);
  MPSIM_CUDA_CHECK_LAUNCH();
}

}  // namespace mpsim::gpu::kernels
