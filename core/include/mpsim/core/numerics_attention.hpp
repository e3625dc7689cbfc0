#pragma once
// Multi-head self-attention's arithmetic (Vaswani et al., "Attention Is All
// You Need", 2017, section 3.2), written once for every backend as
// numerics_layers.hpp writes the other layers': the CPU backend loops over
// these functions, the CUDA kernels call them one output per thread, so the
// CPU tests prove the GPU's arithmetic. Nothing here names CUDA.
//
// Layout. One Linear makes q, k and v for every head at once: `qkv` has a row
// per token (row b * tokens + i) and 3 * width columns, q in [0, width), k in
// [width, 2 width), v in [2 width, 3 width), head h at h * head_dim within
// each. Scores and probabilities have a row per (sample, head, query token)
// (row (b * heads + h) * tokens + i) and a column per key token j; the
// attention output has the qkv's rows and width columns, heads side by side.
//
// Sums. Every dot product runs in binary32, one multiplication and one
// addition per term (no FMA contraction on either side: numerics.hpp), from
// 0 in increasing index, over the unmasked range only (a causal query i
// sees keys 0..i, a key j is seen by queries j..tokens-1), so the masked
// entries never add a zero whose sign could change a -0. The softmax sums in
// binary64. Bits match between the backends up to expf (glibc's on the host,
// CUDA's on the device: at most 2 ulps apart, tests/gpu states the bound).

#include <bit>
#include <cmath>
#include <cstdint>

#include "mpsim/core/numerics_layers.hpp"
#include "mpsim/emulation/host_device.hpp"

namespace mpsim::core {

struct AttentionShape {
  std::int64_t batch = 0, tokens = 0, heads = 0, head_dim = 0;
  bool causal = false;  // query i sees keys j <= i only (a decoder)

  MPSIM_HOST_DEVICE std::int64_t width() const { return heads * head_dim; }
  MPSIM_HOST_DEVICE std::int64_t rows() const { return batch * tokens; }              // of qkv and the output
  MPSIM_HOST_DEVICE std::int64_t score_rows() const { return batch * heads * tokens; }  // of scores and probs
  // The first and one-past-last key a query sees, the first query a key is seen by.
  MPSIM_HOST_DEVICE std::int64_t keys_end(std::int64_t query) const { return causal ? query + 1 : tokens; }
  MPSIM_HOST_DEVICE std::int64_t queries_begin(std::int64_t key) const { return causal ? key : 0; }
  // 1 / sqrt(head_dim) rounded once to binary32 (exact for powers of four).
  MPSIM_HOST_DEVICE float scale() const { return static_cast<float>(1.0 / sqrt(static_cast<double>(head_dim))); }
  // Element c of head h's q (part 0), k (1) or v (2) of token i of sample b.
  MPSIM_HOST_DEVICE std::int64_t qkv_index(std::int64_t b, std::int64_t i, int part, std::int64_t h,
                                           std::int64_t c) const {
    return (b * tokens + i) * 3 * width() + part * width() + h * head_dim + c;
  }
  MPSIM_HOST_DEVICE std::int64_t score_index(std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j) const {
    return ((b * heads + h) * tokens + i) * tokens + j;
  }
  MPSIM_HOST_DEVICE std::int64_t output_index(std::int64_t b, std::int64_t i, std::int64_t h, std::int64_t c) const {
    return (b * tokens + i) * width() + h * head_dim + c;
  }
};

// The parts of a qkv row.
inline constexpr int attention_q = 0, attention_k = 1, attention_v = 2;

// The logit of query i against key j: (q_i . k_j) * scale; -inf where the mask hides j.
MPSIM_HOST_DEVICE inline float attention_score(const float* qkv, const AttentionShape& s, std::int64_t b,
                                               std::int64_t h, std::int64_t i, std::int64_t j) {
  if (j >= s.keys_end(i)) return -INFINITY;
  float sum = 0.0f;
  for (std::int64_t c = 0; c < s.head_dim; ++c)
    sum += qkv[s.qkv_index(b, i, attention_q, h, c)] * qkv[s.qkv_index(b, j, attention_k, h, c)];
  return sum * s.scale();
}

// Output element c of head h at query i: sum_j p_ij v_jc.
MPSIM_HOST_DEVICE inline float attention_value(const float* probs, const float* qkv, const AttentionShape& s,
                                               std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t c) {
  float sum = 0.0f;
  for (std::int64_t j = 0; j < s.keys_end(i); ++j)
    sum += probs[s.score_index(b, h, i, j)] * qkv[s.qkv_index(b, j, attention_v, h, c)];
  return sum;
}

// Backward of the output: dp_ij = sum_c dout_ic v_jc (zero where masked) ...
MPSIM_HOST_DEVICE inline float attention_probs_grad(const float* dout, const float* qkv, const AttentionShape& s,
                                                    std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j) {
  if (j >= s.keys_end(i)) return 0.0f;
  float sum = 0.0f;
  for (std::int64_t c = 0; c < s.head_dim; ++c)
    sum += dout[s.output_index(b, i, h, c)] * qkv[s.qkv_index(b, j, attention_v, h, c)];
  return sum;
}
// ... and dv_jc = sum_i p_ij dout_ic.
MPSIM_HOST_DEVICE inline float attention_v_grad(const float* probs, const float* dout, const AttentionShape& s,
                                                std::int64_t b, std::int64_t h, std::int64_t j, std::int64_t c) {
  float sum = 0.0f;
  for (std::int64_t i = s.queries_begin(j); i < s.tokens; ++i)
    sum += probs[s.score_index(b, h, i, j)] * dout[s.output_index(b, i, h, c)];
  return sum;
}

// Backward of the scores (ds the gradient of the logits): dq_ic = (sum_j ds_ij k_jc) * scale ...
MPSIM_HOST_DEVICE inline float attention_q_grad(const float* dscores, const float* qkv, const AttentionShape& s,
                                                std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t c) {
  float sum = 0.0f;
  for (std::int64_t j = 0; j < s.keys_end(i); ++j)
    sum += dscores[s.score_index(b, h, i, j)] * qkv[s.qkv_index(b, j, attention_k, h, c)];
  return sum * s.scale();
}
// ... and dk_jc = (sum_i ds_ij q_ic) * scale.
MPSIM_HOST_DEVICE inline float attention_k_grad(const float* dscores, const float* qkv, const AttentionShape& s,
                                                std::int64_t b, std::int64_t h, std::int64_t j, std::int64_t c) {
  float sum = 0.0f;
  for (std::int64_t i = s.queries_begin(j); i < s.tokens; ++i)
    sum += dscores[s.score_index(b, h, i, j)] * qkv[s.qkv_index(b, i, attention_q, h, c)];
  return sum * s.scale();
}

// --- Softmax over a row ---------------------------------------------------------------------------------------------
// p_j = exp(x_j - max) / sum_k exp(x_k - max): the max and the exponentials
// in binary32, their sum in binary64 in increasing j, each p_j one binary64
// division rounded to binary32. -inf entries (masked) give 0; a NaN anywhere
// makes the row NaN (the sum is NaN), as PyTorch's softmax.
// With `low` enabled (policy.softmax_internals), a softmax computed in that
// format: the inputs as read, x_j - max, each exponential, the running sum
// (in increasing j) and each quotient rounded by `low`. A narrow sum swallows
// the small exponentials of a long row once it has grown (bfloat16: terms
// below 2^-8 of the sum), which biases every probability of the row.
MPSIM_HOST_DEVICE inline void softmax_row(const float* x, std::int64_t cols, float* p,
                                          const InternalRounding& low = {}) {
  if (low.enabled) {
    // Masked entries (-inf) stay out of the format: probability 0, nothing added (a format without
    // infinities would otherwise turn the mask into a finite logit).
    double max = -INFINITY;
    for (std::int64_t j = 0; j < cols; ++j) {
      const double v = x[j] == -INFINITY ? -INFINITY : low(x[j]);
      if (v > max) max = v;
    }
    double sum = 0.0;
    for (std::int64_t j = 0; j < cols; ++j) {
      const double e = x[j] == -INFINITY ? 0.0 : low(exp(low.sub(low(x[j]), max)));
      p[j] = static_cast<float>(e);
      if (x[j] != -INFINITY) sum = low.add(sum, e);
    }
    for (std::int64_t j = 0; j < cols; ++j) p[j] = static_cast<float>(low.div(p[j], sum));
    return;
  }
  float max = -INFINITY;
  for (std::int64_t j = 0; j < cols; ++j)
    if (x[j] > max) max = x[j];
  double sum = 0.0;
  for (std::int64_t j = 0; j < cols; ++j) {
    p[j] = expf(x[j] - max);
    sum += static_cast<double>(p[j]);
  }
  for (std::int64_t j = 0; j < cols; ++j) p[j] = static_cast<float>(static_cast<double>(p[j]) / sum);
}
// dx_j = p_j (dp_j - sum_k p_k dp_k), the sum in binary64 in increasing k
// and rounded once to binary32, the rest in binary32; with `low` enabled,
// the inputs, each product, the running sum, each difference and each dx_j
// rounded by `low`.
MPSIM_HOST_DEVICE inline void softmax_backward_row(const float* p, const float* dp, std::int64_t cols, float* dx,
                                                   const InternalRounding& low = {}) {
  if (low.enabled) {
    double dot = 0.0;
    for (std::int64_t j = 0; j < cols; ++j) dot = low.add(dot, low.mul(low(p[j]), low(dp[j])));
    for (std::int64_t j = 0; j < cols; ++j) dx[j] = static_cast<float>(low.mul(low(p[j]), low.sub(low(dp[j]), dot)));
    return;
  }
  double dot = 0.0;
  for (std::int64_t j = 0; j < cols; ++j) dot += static_cast<double>(p[j]) * static_cast<double>(dp[j]);
  const float d = static_cast<float>(dot);
  for (std::int64_t j = 0; j < cols; ++j) dx[j] = p[j] * (dp[j] - d);
}

// --- Rotary position embeddings (Su et al., "RoFormer", 2021; LLaMA) ------------------------------------------------
// Each head's q and k turned pairwise by angles that grow with the token's
// position: at position i, features c and c + d/2 of a head of d features
// (the "rotate half" pairing of GPT-NeoX and Hugging Face's LLaMA) turn by
// theta = i * base^(-2c/d), c < d/2:
//   y_c = x_c cos - x_{c+d/2} sin,   y_{c+d/2} = x_{c+d/2} cos + x_c sin.
// cos and sin come from a table of 2 x tokens x d/2 binary32 values (cos,
// then sin; rotary_table below, binary64 rounded once), so both backends read
// the same angles; each output is two binary32 products and one sum. The
// backward is the same rotation by -theta; v passes unchanged.
struct RotaryAngles {
  const float* table;  // [2][tokens][head_dim / 2]
  bool inverse;        // rotate by -theta (the backward)
};
MPSIM_HOST_DEVICE inline float rotary_value(const float* x, const AttentionShape& s, const RotaryAngles& a,
                                            std::int64_t row, int part, std::int64_t h, std::int64_t c) {
  const std::int64_t half = s.head_dim / 2, at = row * 3 * s.width() + part * s.width() + h * s.head_dim;
  if (part == attention_v) return x[at + c];
  const std::int64_t pair = c < half ? c : c - half, angle = (row % s.tokens) * half + pair;
  const float cos = a.table[angle], sin = a.inverse ? -a.table[s.tokens * half + angle] : a.table[s.tokens * half + angle];
  return c < half ? x[at + c] * cos - x[at + c + half] * sin : x[at + c] * cos + x[at + pair] * sin;
}

// --- Logit soft-capping (Gemma Team, "Gemma 2", 2024, section 2; Grok-1) -----------------------------------------
// y = cap * tanh(x / cap): logits keep their order but never pass +-cap;
// the backward reads the capped value, dx = dy * (1 - (y / cap)^2). Binary32
// throughout; tanhf is glibc's on the host and CUDA's on the device (at most
// 2 ulps apart), which tests/gpu bounds. An infinity becomes +-cap, as in
// PyTorch (an overflowed logit is rescued), except -inf with keep_mask: the
// attention's causal mask, which Gemma 2 applies after the cap, stays -inf
// with a zero gradient.
MPSIM_HOST_DEVICE inline float soft_cap(float x, float cap, bool keep_mask) {
  return keep_mask && x == -INFINITY ? x : cap * tanhf(x / cap);
}
MPSIM_HOST_DEVICE inline float soft_cap_grad(float y, float dy, float cap) {
  const float t = y / cap;
  return y == -INFINITY ? 0.0f : dy * (1.0f - t * t);
}

// --- Fused attention: FlashAttention-2's online softmax (Dao, "FlashAttention-2", 2023, Algorithms 1 and 2) ---
// The fused kernel never stores the logits nor the probabilities: a query's
// row walks its keys a tile of `block` keys at a time (FlashAttention's B_c)
// and keeps, in binary32, the running maximum m, the running sum l of
// exp(s - m) and the unnormalised output o. At each tile:
//   m' = max(m, the tile's largest logit);  a = exp(m - m') (0 at the first tile)
//   l  = a l + sum_j exp(s_j - m')          (binary32, increasing j; unrounded exponentials)
//   o  = a o + sum_j P(exp(s_j - m')) v_j  (P: the exponential rounded to the second product's operand format)
// and at the end o * (1 / l) (FlashAttention-2 multiplies by the reciprocal)
// and lse = m + log(l), the one value per row that the backward keeps.
// Where this differs from the unfused path (SelfAttention's other branch):
// the logits are binary32 dot products that are never rounded to a GEMM's
// output format (no overflow of FP16 logits, no BF16 quantum on them); the
// softmax is always binary32; the operand rounding hits exp(s - m'), whose
// row maximum is exactly 1, not the normalised probabilities; and the
// normalisation happens once, after the sum. This is a model of the
// algorithm, not of one kernel's bits: a real kernel splits the sums across
// threads in its own order (and uses exp2 with log2(e) folded into the scale).
// The backward (Algorithm 2) recomputes the logits, p = exp(s - lse), rounds
// p as dV's operand, and forms ds = p (dp - D) with D = sum_c dout_c o_c
// (binary32, increasing c) instead of softmax's sum_j p_j dp_j.
// Dropout (FlashAttention-2 applies it inside the kernel, §3.1 of the paper):
// the value sum takes Z_j exp(s_j - m') with Z the unfused path's mask (the
// same counter-based draw of element (row, key) of the probabilities, so both
// paths drop the same elements), l sums the exponentials undropped, and the
// operand rounding hits the scaled value, as the unfused path rounds its
// dropped probabilities (FlashAttention-2's kernel zeroes in registers and
// folds 1 / (1 - p) into its final scale: the same value before rounding).
// The backward's dV operand is dropout(p) and its dp is dropout(dout v^T),
// so that ds = p (Z dp - D) with D = sum_c dout_c o_c still (o is the dropped
// output: sum_j Z_j p_j dp_j = dout . o).
struct FusedAttention {
  static constexpr std::int64_t max_block = 256;  // a tile's logits live in a thread's registers
  std::int64_t block = 64;  // keys per tile, 1 to max_block
  float softcap = 0.0f;     // > 0: cap tanh(s / cap) on each logit, in binary32 (soft_cap)
  InternalRounding probs;   // exp(s - m') as the second product reads it; disabled: binary32
  bool dropping = false;    // training with dropout on the probabilities: `dropout` holds the mask
  DropoutMask dropout{};    // numerics_layers.hpp; element (r, j) of the score matrix is r * tokens + j
};
struct FusedAttentionRow {
  float lse;        // m + log(l): the backward's p = exp(s - lse)
  float logit_max;  // the largest finite |s| of the row before any cap, as the unfused path logs it
};
// One row's online softmax and value sum: logit(j) gives the binary32
// logit of key j (before any cap), value(j) points at v_j's head_dim
// values; the keys are 0..end-1; writes the outputs at out[0..dim).
// `mask_first`: the dropout mask's index of key 0 of this row.
template <typename Logit, typename Value>
MPSIM_HOST_DEVICE inline FusedAttentionRow fused_attention_online(std::int64_t end, std::int64_t dim,
                                                                  const FusedAttention& f, Logit logit, Value value,
                                                                  float* out, std::int64_t mask_first = 0) {
  float tile[FusedAttention::max_block];
  float m = -INFINITY, l = 0.0f, logit_max = 0.0f;
  for (std::int64_t c = 0; c < dim; ++c) out[c] = 0.0f;
  for (std::int64_t j0 = 0; j0 < end; j0 += f.block) {
    const std::int64_t j1 = j0 + f.block < end ? j0 + f.block : end;
    float tile_max = -INFINITY;
    for (std::int64_t j = j0; j < j1; ++j) {
      float x = logit(j);
      const float magnitude = x < 0.0f ? -x : x;
      if (magnitude <= 3.40282347e38f && magnitude > logit_max) logit_max = magnitude;
      if (f.softcap > 0.0f) x = soft_cap(x, f.softcap, true);
      tile[j - j0] = x;
      if (x > tile_max) tile_max = x;
    }
    const float m_new = tile_max > m ? tile_max : m;
    const float a = m == -INFINITY ? 0.0f : expf(m - m_new);
    l *= a;
    for (std::int64_t c = 0; c < dim; ++c) out[c] *= a;
    for (std::int64_t j = j0; j < j1; ++j) {
      const float e = expf(tile[j - j0] - m_new);
      l += e;
      const float kept = f.dropping ? dropout_value(e, f.dropout, mask_first + j) : e;
      const float operand = f.probs.enabled ? static_cast<float>(f.probs(kept)) : kept;
      const float* v = value(j);
      for (std::int64_t c = 0; c < dim; ++c) out[c] += operand * v[c];
    }
    m = m_new;
  }
  const float inverse = 1.0f / l;
  for (std::int64_t c = 0; c < dim; ++c) out[c] *= inverse;
  return {m + logf(l), logit_max};
}
// Row i of head h of sample b from the [q | k | v] rows (attention_score's
// logits): writes the head_dim outputs at out[0..head_dim).
MPSIM_HOST_DEVICE inline FusedAttentionRow fused_attention_row(const float* qkv, const AttentionShape& s,
                                                               const FusedAttention& f, std::int64_t b,
                                                               std::int64_t h, std::int64_t i, float* out) {
  return fused_attention_online(
      s.keys_end(i), s.head_dim, f, [&](std::int64_t j) { return attention_score(qkv, s, b, h, i, j); },
      [&](std::int64_t j) { return qkv + s.qkv_index(b, j, attention_v, h, 0); }, out, s.score_index(b, h, i, 0));
}
// The backward's probability from a recomputed (capped) logit; masked keys (-inf) give 0.
MPSIM_HOST_DEVICE inline float fused_attention_probability(float logit, float lse) {
  return logit == -INFINITY ? 0.0f : expf(logit - lse);
}
// D of score row (b, h, i): sum_c dout_ic o_ic in binary32, increasing c.
MPSIM_HOST_DEVICE inline float attention_row_dot(const float* dout, const float* out, const AttentionShape& s,
                                                 std::int64_t b, std::int64_t h, std::int64_t i) {
  float sum = 0.0f;
  for (std::int64_t c = 0; c < s.head_dim; ++c) sum += dout[s.output_index(b, i, h, c)] * out[s.output_index(b, i, h, c)];
  return sum;
}
// The logit's gradient from p, dp = dout . v_j and the row's D.
MPSIM_HOST_DEVICE inline float fused_attention_score_grad(float p, float dp, float dot) { return p * (dp - dot); }

// --- QK-LayerNorm (Dehghani et al. 2023, "Scaling Vision Transformers to 22 Billion Parameters"; Wortsman et al.
// 2023): LayerNorm over each head's q and each head's k, head_dim features each, before the logits, so that
// they cannot grow without bound. gamma and beta hold 2 x head_dim values (q's, then k's), shared by the
// heads; v passes unchanged. It is numerics_rows.hpp's NormRow on RowLayout::qk_heads: segment g in
// [0, 2 heads) of token row r is part g / heads, head g % heads, its statistics kept at index r * 2 heads + g,
// and dgamma and dbeta sum their terms over (r, h) in increasing order.

// --- Token embeddings -----------------------------------------------------------------------------------------------
// A token id is stored as binary32; one that is not an integer in [0, rows)
// selects no row (-1): its output row is NaN, as the loss treats such a label.
MPSIM_HOST_DEVICE inline std::int64_t embedding_row(float id, std::int64_t rows) {
  if (!(id >= 0.0f && id < static_cast<float>(rows))) return -1;
  const auto row = static_cast<std::int64_t>(id);
  return static_cast<float>(row) == id ? row : -1;
}
MPSIM_HOST_DEVICE inline float embedding_value(const float* table, std::int64_t rows, std::int64_t width, float id,
                                               std::int64_t c) {
  const std::int64_t row = embedding_row(id, rows);
  return row < 0 ? std::bit_cast<float>(0x7fc00000u) : table[row * width + c];
}
// The table's gradient, element (v, c): the output gradients of the tokens
// whose id is v, summed in binary32 from 0 in increasing token order (the
// CPU scatters token by token in that order, which adds each element's
// terms in the same order).
MPSIM_HOST_DEVICE inline float embedding_grad(const float* ids, const float* dout, std::int64_t tokens,
                                              std::int64_t rows, std::int64_t width, std::int64_t v, std::int64_t c) {
  float sum = 0.0f;
  for (std::int64_t t = 0; t < tokens; ++t)
    if (embedding_row(ids[t], rows) == v) sum += dout[t * width + c];
  return sum;
}

// --- The mean over a sequence's tokens (a ViT's pooling) ---------------------------------------------------------
// y_bc = (sum_i x_bic) / tokens, the sum in binary32 in increasing i; the
// backward spreads dy_bc / tokens over the tokens.
MPSIM_HOST_DEVICE inline float sequence_mean(const float* x, std::int64_t tokens, std::int64_t width, std::int64_t b,
                                             std::int64_t c) {
  float sum = 0.0f;
  for (std::int64_t i = 0; i < tokens; ++i) sum += x[(b * tokens + i) * width + c];
  return sum / static_cast<float>(tokens);
}
MPSIM_HOST_DEVICE inline float sequence_mean_grad(float dy, std::int64_t tokens) {
  return dy / static_cast<float>(tokens);
}

}  // namespace mpsim::core
