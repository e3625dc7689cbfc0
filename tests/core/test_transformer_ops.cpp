// The CPU backend's transformer ops against numerics_attention.hpp's
// per-output functions, the code the CUDA kernels run: bit for bit. The CPU
// computes the same sums a head at a time along contiguous rows
// (cpu_backend.cpp); this is what proves, on a machine without a GPU, that
// the two backends share their arithmetic. (Whether the arithmetic is right
// is test_layers.cpp's business: binary64 references and finite differences.)
#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "mpsim/core/backend.hpp"
#include "mpsim/core/model.hpp"
#include "mpsim/core/numerics_attention.hpp"
#include "mpsim/core/policy.hpp"

namespace {

using namespace mpsim::core;
using FVec = std::vector<float>;

FVec normal_values(std::size_t n, std::uint64_t seed, float sigma) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, sigma);
  FVec v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// Same bits, NaNs as a class.
void check_bits(const char* what, const FVec& want, const FVec& got) {
  REQUIRE(want.size() == got.size());
  std::size_t differ = 0, first = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const bool same = std::isnan(want[i]) ? std::isnan(got[i])
                                          : std::bit_cast<std::uint32_t>(want[i]) == std::bit_cast<std::uint32_t>(got[i]);
    if (!same && differ++ == 0) first = i;
  }
  INFO(what << ": " << differ << " of " << want.size() << " values differ; first at " << first << ": "
            << (differ ? want[first] : 0.0f) << " vs " << (differ ? got[first] : 0.0f));
  CHECK(differ == 0);
}

FVec host(Backend& b, const Tensor& t) {
  FVec v(static_cast<std::size_t>(t.numel()));
  b.to_host(t, v);
  return v;
}

}  // namespace

TEST_CASE("CPU attention ops equal numerics_attention.hpp's per-output functions bit for bit",
          "[backend][transformer]") {
  auto cpu = make_cpu_backend();
  for (const bool causal : {false, true}) {
    INFO((causal ? "causal" : "not causal"));
    AttentionShape s;
    s.batch = 2;
    s.tokens = 13;
    s.heads = 3;
    s.head_dim = 7;  // not a power of four: the scale is rounded
    s.causal = causal;
    const std::int64_t rows = s.rows(), cols = 3 * s.width(), score_rows = s.score_rows(), n = s.tokens;
    FVec qkv = normal_values(static_cast<std::size_t>(rows * cols), 11, 3.0f);
    qkv[5] = -0.0f;  // signed zeros and a tiny value among the operands
    qkv[40] = 1e-40f;
    const Tensor qkv_t = cpu->from_host(qkv, {rows, cols});

    FVec want(static_cast<std::size_t>(score_rows * n));
    for (std::int64_t b = 0; b < s.batch; ++b)
      for (std::int64_t h = 0; h < s.heads; ++h)
        for (std::int64_t i = 0; i < n; ++i)
          for (std::int64_t j = 0; j < n; ++j)
            want[static_cast<std::size_t>(s.score_index(b, h, i, j))] = attention_score(qkv.data(), s, b, h, i, j);
    Tensor scores = cpu->empty({score_rows, n});
    cpu->attention_scores(qkv_t, s, scores);
    check_bits("scores", want, host(*cpu, scores));

    // Probabilities from the softmax rows, then every product with them.
    FVec probs(want.size());
    for (std::int64_t r = 0; r < score_rows; ++r) softmax_row(want.data() + r * n, n, probs.data() + r * n);
    Tensor probs_t = cpu->empty({score_rows, n});
    cpu->softmax_forward(scores, probs_t);
    check_bits("softmax", probs, host(*cpu, probs_t));

    FVec out(static_cast<std::size_t>(rows * s.width()));
    const FVec dout = normal_values(out.size(), 12, 1.0f);
    FVec dprobs(want.size()), dscores(want.size()), dqkv(qkv.size());
    for (std::int64_t b = 0; b < s.batch; ++b)
      for (std::int64_t h = 0; h < s.heads; ++h)
        for (std::int64_t i = 0; i < n; ++i) {
          for (std::int64_t c = 0; c < s.head_dim; ++c) {
            out[static_cast<std::size_t>(s.output_index(b, i, h, c))] =
                attention_value(probs.data(), qkv.data(), s, b, h, i, c);
            dqkv[static_cast<std::size_t>(s.qkv_index(b, i, attention_v, h, c))] =
                attention_v_grad(probs.data(), dout.data(), s, b, h, i, c);
          }
          for (std::int64_t j = 0; j < n; ++j)
            dprobs[static_cast<std::size_t>(s.score_index(b, h, i, j))] =
                attention_probs_grad(dout.data(), qkv.data(), s, b, h, i, j);
        }
    for (std::int64_t r = 0; r < score_rows; ++r)
      softmax_backward_row(probs.data() + r * n, dprobs.data() + r * n, n, dscores.data() + r * n);
    for (std::int64_t b = 0; b < s.batch; ++b)
      for (std::int64_t h = 0; h < s.heads; ++h)
        for (std::int64_t i = 0; i < n; ++i)
          for (std::int64_t c = 0; c < s.head_dim; ++c) {
            dqkv[static_cast<std::size_t>(s.qkv_index(b, i, attention_q, h, c))] =
                attention_q_grad(dscores.data(), qkv.data(), s, b, h, i, c);
            dqkv[static_cast<std::size_t>(s.qkv_index(b, i, attention_k, h, c))] =
                attention_k_grad(dscores.data(), qkv.data(), s, b, h, i, c);
          }

    Tensor out_t = cpu->empty({rows, s.width()});
    cpu->attention_values(probs_t, qkv_t, s, out_t);
    check_bits("output", out, host(*cpu, out_t));
    const Tensor dout_t = cpu->from_host(dout, {rows, s.width()});
    Tensor dprobs_t = cpu->empty({score_rows, n}), dscores_t = cpu->empty({score_rows, n});
    Tensor dqkv_t = cpu->from_host(FVec(qkv.size(), NAN), {rows, cols});
    cpu->attention_values_backward(probs_t, qkv_t, dout_t, s, dprobs_t, dqkv_t);
    check_bits("dprobs", dprobs, host(*cpu, dprobs_t));
    cpu->softmax_backward(probs_t, dprobs_t, dscores_t);
    check_bits("softmax backward", dscores, host(*cpu, dscores_t));
    cpu->attention_scores_backward(dscores_t, qkv_t, s, dqkv_t);
    check_bits("dqkv", dqkv, host(*cpu, dqkv_t));
  }
}

TEST_CASE("CPU fused attention equals numerics_attention.hpp's fused_attention_row bit for bit, every tile size, "
          "rounded or not, capped or not, with dropout or not", "[backend][transformer]") {
  auto cpu = make_cpu_backend();
  // bfloat16, nearest even (bf16-mixed's activations): the fused kernel's rounding of exp(s - m).
  const InternalRounding bf16 = internal_rounding(*preset_policy("bf16-mixed"), &Policy::activations, "fused attention");
  REQUIRE(bf16.enabled);
  for (const bool causal : {false, true})
    for (const std::int64_t tile : {1, 4, 13, 256})
      for (const bool rounded : {false, true})
        for (const float cap : {0.0f, 2.0f})
        for (const bool dropping : {false, true}) {
          INFO((causal ? "causal" : "not causal") << ", tiles of " << tile << (rounded ? ", bfloat16" : "")
                                                  << ", cap " << cap << (dropping ? ", dropout 0.25" : ""));
          AttentionShape s;
          s.batch = 2;
          s.tokens = 13;
          s.heads = 3;
          s.head_dim = 7;
          s.causal = causal;
          const std::int64_t rows = s.rows(), cols = 3 * s.width(), score_rows = s.score_rows();
          const FVec qkv = normal_values(static_cast<std::size_t>(rows * cols), 13, 3.0f);
          mpsim::StochasticStream stream;
          stream.key = {31, 7};
          stream.first_index = 1000;
          const FusedAttention fused{tile, cap, rounded ? bf16 : InternalRounding{}, dropping,
                                     dropout_mask(stream, 0.25)};
          FVec out(static_cast<std::size_t>(rows * s.width())), lse(static_cast<std::size_t>(score_rows)),
              logit_max(lse.size());
          for (std::int64_t b = 0; b < s.batch; ++b)
            for (std::int64_t h = 0; h < s.heads; ++h)
              for (std::int64_t i = 0; i < s.tokens; ++i) {
                const FusedAttentionRow row =
                    fused_attention_row(qkv.data(), s, fused, b, h, i, out.data() + s.output_index(b, i, h, 0));
                lse[static_cast<std::size_t>((b * s.heads + h) * s.tokens + i)] = row.lse;
                logit_max[static_cast<std::size_t>((b * s.heads + h) * s.tokens + i)] = row.logit_max;
              }
          Tensor out_t = cpu->empty({rows, s.width()}), lse_t = cpu->empty({score_rows, 1}),
                 max_t = cpu->empty({score_rows, 1});
          cpu->fused_attention_forward(cpu->from_host(qkv, {rows, cols}), s, fused, out_t, lse_t, max_t);
          check_bits("fused output", out, host(*cpu, out_t));
          check_bits("fused lse", lse, host(*cpu, lse_t));
          check_bits("fused logit maxima", logit_max, host(*cpu, max_t));
        }
}

TEST_CASE("CPU embedding and sequence-mean ops equal their per-output functions bit for bit",
          "[backend][transformer]") {
  auto cpu = make_cpu_backend();
  const std::int64_t vocabulary = 7, width = 5, tokens = 40;
  const FVec table = normal_values(static_cast<std::size_t>(vocabulary * width), 21, 1.0f);
  FVec ids(static_cast<std::size_t>(tokens));
  std::mt19937_64 rng(22);
  for (float& id : ids) id = static_cast<float>(rng() % vocabulary);
  ids[3] = 7.0f;   // outside the table: a NaN row, no gradient
  ids[4] = 2.5f;   // not an integer: the same
  ids[5] = -1.0f;
  const FVec dout = normal_values(static_cast<std::size_t>(tokens * width), 23, 1.0f);
  FVec want(dout.size()), dtable(table.size());
  for (std::int64_t t = 0; t < tokens; ++t)
    for (std::int64_t c = 0; c < width; ++c)
      want[static_cast<std::size_t>(t * width + c)] =
          embedding_value(table.data(), vocabulary, width, ids[static_cast<std::size_t>(t)], c);
  for (std::int64_t v = 0; v < vocabulary; ++v)
    for (std::int64_t c = 0; c < width; ++c)
      dtable[static_cast<std::size_t>(v * width + c)] =
          embedding_grad(ids.data(), dout.data(), tokens, vocabulary, width, v, c);
  const Tensor ids_t = cpu->from_host(ids, {tokens}), table_t = cpu->from_host(table, {vocabulary, width});
  Tensor out = cpu->empty({tokens, width});
  cpu->embedding_forward(ids_t, table_t, out);
  const FVec got = host(*cpu, out);
  check_bits("embedding", want, got);
  for (std::int64_t c = 0; c < width; ++c) {
    CHECK(std::isnan(got[static_cast<std::size_t>(3 * width + c)]));
    CHECK(std::isnan(got[static_cast<std::size_t>(4 * width + c)]));
    CHECK(got[static_cast<std::size_t>(c)] == table[static_cast<std::size_t>(ids[0] * width + c)]);
  }
  Tensor dtable_t = cpu->from_host(FVec(table.size(), NAN), {vocabulary, width});
  cpu->embedding_backward(ids_t, cpu->from_host(dout, {tokens, width}), dtable_t);
  check_bits("embedding gradient", dtable, host(*cpu, dtable_t));

  // The mean over 8 tokens of 5 samples.
  const Tensor x = cpu->from_host(dout, {tokens, width});
  Tensor mean = cpu->empty({5, width}), dx = cpu->empty({tokens, width});
  cpu->sequence_mean_forward(x, 8, mean);
  FVec want_mean(static_cast<std::size_t>(5 * width)), want_dx(dout.size());
  for (std::int64_t b = 0; b < 5; ++b)
    for (std::int64_t c = 0; c < width; ++c)
      want_mean[static_cast<std::size_t>(b * width + c)] = sequence_mean(dout.data(), 8, width, b, c);
  check_bits("sequence mean", want_mean, host(*cpu, mean));
  cpu->sequence_mean_backward(mean, 8, dx);
  for (std::int64_t t = 0; t < tokens; ++t)
    for (std::int64_t c = 0; c < width; ++c)
      want_dx[static_cast<std::size_t>(t * width + c)] =
          sequence_mean_grad(want_mean[static_cast<std::size_t>((t / 8) * width + c)], 8);
  check_bits("sequence mean backward", want_dx, host(*cpu, dx));
}

TEST_CASE("QK-LayerNorm equals LayerNorm on each head's q and k, gathered into rows, bit for bit; v passes",
          "[backend][transformer]") {
  // LayerNorm itself is checked against binary64 references and finite
  // differences in test_layers.cpp; gathering a head's q (or k) of every
  // token in (row, head) order gives LayerNorm the rows QK-LayerNorm
  // normalises, with the same sums in the same order.
  auto b = make_cpu_backend();
  AttentionShape s;
  s.batch = 2;
  s.tokens = 5;
  s.heads = 3;
  s.head_dim = 4;
  const std::int64_t rows = s.rows(), width = s.width(), hd = s.head_dim;
  const FVec qkv = normal_values(static_cast<std::size_t>(rows * 3 * width), 31, 1.5f);
  FVec gamma = normal_values(static_cast<std::size_t>(2 * hd), 32, 1.0f), beta = normal_values(gamma.size(), 33, 0.5f);
  const FVec dy = normal_values(qkv.size(), 34, 1.0f);
  const Tensor x = b->from_host(qkv, {rows, 3 * width}), g = b->from_host(gamma, {2 * hd}),
               be = b->from_host(beta, {2 * hd}), gy = b->from_host(dy, {rows, 3 * width});
  Tensor y = b->empty(x.shape()), mean = b->empty({rows * 2 * s.heads}), rstd = b->empty(mean.shape());
  b->qk_norm_forward(x, g, be, s, 1e-5f, y, mean, rstd);
  Tensor dx = b->empty(x.shape()), dgamma = b->empty({2 * hd}), dbeta = b->empty({2 * hd});
  b->qk_norm_backward(x, g, mean, rstd, gy, s, dx, dgamma, dbeta);
  const FVec out = host(*b, y), din = host(*b, dx), dg = host(*b, dgamma), db = host(*b, dbeta);
  for (int part = 0; part < 3; ++part) {
    // The part's values as rows of head_dim, in (row, head) order.
    const auto gather = [&](const FVec& v) {
      FVec rows_of(static_cast<std::size_t>(rows * width));
      for (std::int64_t r = 0; r < rows; ++r)
        for (std::int64_t c = 0; c < width; ++c)
          rows_of[static_cast<std::size_t>(r * width + c)] = v[static_cast<std::size_t>(r * 3 * width + part * width + c)];
      return rows_of;
    };
    INFO("part " << part);
    if (part == 2) {  // v: unchanged, its gradient dy's
      check_bits("v", gather(qkv), gather(out));
      check_bits("dv", gather(dy), gather(din));
      continue;
    }
    const FVec pg(gamma.begin() + part * hd, gamma.begin() + (part + 1) * hd),
        pb(beta.begin() + part * hd, beta.begin() + (part + 1) * hd);
    const Tensor xr = b->from_host(gather(qkv), {rows * s.heads, hd}), gr = b->from_host(pg, {hd}),
                 br = b->from_host(pb, {hd}), dyr = b->from_host(gather(dy), {rows * s.heads, hd});
    Tensor yr = b->empty(xr.shape()), mr = b->empty({rows * s.heads}), rr = b->empty(mr.shape());
    b->layer_norm_forward(xr, gr, br, 1e-5f, yr, mr, rr);
    check_bits("y", host(*b, yr), gather(out));
    Tensor dxr = b->empty(xr.shape()), dgr = b->empty({hd}), dbr = b->empty({hd});
    b->layer_norm_backward(xr, gr, mr, rr, dyr, dxr, dgr, dbr);
    check_bits("dx", host(*b, dxr), gather(din));
    check_bits("dgamma", host(*b, dgr), FVec(dg.begin() + part * hd, dg.begin() + (part + 1) * hd));
    check_bits("dbeta", host(*b, dbr), FVec(db.begin() + part * hd, db.begin() + (part + 1) * hd));
  }
}
