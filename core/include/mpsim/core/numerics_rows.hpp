#pragma once
// The row-wise ops of a training step, one table: an entry transforms each
// segment of `cols` consecutive values (a row, or one head's q or k) from
// statistics of that segment alone, with parameters shared by the segments,
// and its backward pass sums the parameters' gradients over the segments.
// A RowLayout says where the segments lie and which parameters each uses, so
// LayerNorm and RMSNorm over rows and QK-LayerNorm over each head's q and k
// are one rule on two layouts. The backends run any entry with one CPU loop
// and one set of templated CUDA kernels (Backend::row_forward/backward), and
// RowLayer (model.hpp's make_row_layer) is a layer of any entry, so a
// row-wise layer is a rule here, its place in `Rows` and its place in the
// model (layer_table.hpp): no backend call, kernel or layer class to write.
//
// Bits: a segment's statistics (and its backward's) are one serial call of
// the rule, as on the CPU; each element is one call; each parameter index
// sums its terms in binary32 from 0 in increasing segment order. So the launch
// shape never reaches a value.

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <variant>

#include "mpsim/core/numerics_attention.hpp"
#include "mpsim/core/numerics_layers.hpp"
#include "mpsim/core/numerics_ops.hpp"
#include "mpsim/emulation/host_device.hpp"

namespace mpsim::core {

// Segment t starts at offset(t): groups (a token's row) of per_group
// segments, group_stride values apart, the segments of a group side by side.
// Segments k of a group with the same k / shared_by use parameter block
// k / shared_by (cols values from param_offset(t)). rest_count values from
// rest_offset of every group are not segments: they pass unchanged (QK-norm's v).
struct RowLayout {
  std::int64_t segments = 0, cols = 0;
  std::int64_t per_group = 1, group_stride = 0, shared_by = 1;
  std::int64_t rest_offset = 0, rest_count = 0;

  MPSIM_HOST_DEVICE std::int64_t groups() const { return per_group > 0 ? segments / per_group : 0; }
  MPSIM_HOST_DEVICE std::int64_t offset(std::int64_t t) const {
    return t / per_group * group_stride + t % per_group * cols;
  }
  MPSIM_HOST_DEVICE std::int64_t blocks() const { return shared_by > 0 ? per_group / shared_by : 0; }
  MPSIM_HOST_DEVICE std::int64_t param_offset(std::int64_t t) const { return t % per_group / shared_by * cols; }
  MPSIM_HOST_DEVICE std::int64_t param_count() const { return blocks() * cols; }
  MPSIM_HOST_DEVICE std::int64_t size() const { return groups() * group_stride; }  // of the input and the output
  // Whether the segments and the rest fit their groups without overlapping.
  bool valid() const {
    return segments >= 0 && cols >= 0 && per_group > 0 && shared_by > 0 && segments % per_group == 0 &&
           per_group % shared_by == 0 && per_group * cols <= group_stride && rest_count >= 0 &&
           (rest_count == 0 || (rest_offset >= per_group * cols && rest_offset + rest_count <= group_stride));
  }

  // Rows of cols values, one segment each.
  static RowLayout rows(std::int64_t rows, std::int64_t cols) { return {rows, cols, 1, cols, 1, 0, 0}; }
  // QK-LayerNorm on [q | k | v] rows (numerics_attention.hpp): each head's q,
  // then each head's k, head_dim values each; q's heads share the first
  // parameter block, k's the second; v passes. Segment t is qk_norm's
  // (row t / 2 heads, segment t % 2 heads).
  static RowLayout qk_heads(const AttentionShape& s) {
    return {s.rows() * 2 * s.heads, s.head_dim, 2 * s.heads, 3 * s.width(), s.heads, 2 * s.width(), s.width()};
  }
};

// What a rule reads of one segment's parameters: each block at the segment's
// param_offset (null where the call has none).
struct RowParameters {
  const float* at[2] = {};
};

// LayerNorm (centred) and RMSNorm (uncentred: no mean kept, no beta) over
// each segment: numerics_layers.hpp's row and element rules, scaling by gamma
// or, zero-centred, by 1 + gamma (norm_scale). Parameters: gamma, beta;
// statistics: mean, rstd.
struct NormRow {
  struct Params {
    float eps = 1e-5f;
    bool centered = true;
    InternalRounding low{};  // the statistics in a narrow format (policy.norm_statistics)
    bool zero_centered = false;  // the scale is 1 + gamma (norm_scale)
  };
  static constexpr std::string_view name = "norm";
  static constexpr std::string_view fp32_op = "layer_norm";  // autocast's name: fp32_ops may list it
  static constexpr std::array<std::string_view, 2> parameter_names{"gamma", "beta"};
  static constexpr std::array<std::string_view, 2> statistic_names{"mean", "rstd"};
  // Which tensors a call needs: RMSNorm has neither beta (nor its
  // gradient) nor a mean, and no backward reads beta.
  static bool needs_parameter(const Params& p, int k, bool backward) { return k == 0 || (p.centered && !backward); }
  static bool needs_statistic(const Params& p, int k) { return k == 1 || p.centered; }
  static bool needs_parameter_grad(const Params& p, int k) { return k == 0 || p.centered; }
  using Stats = LayerNormStatistics;
  using GradStats = LayerNormRowMeans;

  MPSIM_HOST_DEVICE static Stats statistics(const float* x, std::int64_t cols, const Params& p) {
    return layer_norm_statistics(x, cols, p.eps, p.centered, p.low);
  }
  MPSIM_HOST_DEVICE static void store(const Stats& s, float* const* stats, std::int64_t t) {
    if (stats[0]) stats[0][t] = s.mean;
    stats[1][t] = s.rstd;
  }
  MPSIM_HOST_DEVICE static Stats load(const float* const* stats, std::int64_t t) {
    return {stats[0] ? stats[0][t] : 0.0f, stats[1][t]};
  }
  MPSIM_HOST_DEVICE static float value(float x, std::int64_t j, const Stats& s, const RowParameters& w,
                                       const Params& p) {
    const float scale = norm_scale(w.at[0][j], p.zero_centered);
    return w.at[1] ? layer_norm_output(x, s.mean, s.rstd, scale, w.at[1][j]) : rms_norm_output(x, s.rstd, scale);
  }
  MPSIM_HOST_DEVICE static GradStats grad_statistics(const float* x, const float* dy, std::int64_t cols,
                                                     const Stats& s, const RowParameters& w, const Params& p) {
    return layer_norm_row_means(x, dy, w.at[0], cols, s.mean, s.rstd, p.centered, p.low, p.zero_centered);
  }
  MPSIM_HOST_DEVICE static float grad(float x, float dy, std::int64_t j, const Stats& s, const GradStats& g,
                                      const RowParameters& w, const Params& p) {
    return layer_norm_input_grad(dy, norm_scale(w.at[0][j], p.zero_centered), layer_norm_xhat(x, s.mean, s.rstd),
                                 s.rstd, g);
  }
  // Element j's terms of dgamma and dbeta.
  MPSIM_HOST_DEVICE static void parameter_terms(float x, float dy, const Stats& s, float* terms) {
    terms[0] = dy * layer_norm_xhat(x, s.mean, s.rstd);
    terms[1] = dy;
  }
};

// The table. Call holds which entry (its index) and that entry's parameters.
template <typename... R>
struct RowTable {
  static constexpr std::size_t size = sizeof...(R);
  using Entries = std::tuple<R...>;
  using Call = std::variant<typename R::Params...>;
  static constexpr std::array<std::string_view, size> names{R::name...};
  static constexpr std::array<std::string_view, size> fp32_ops{R::fp32_op...};
  static_assert((std::is_trivially_copyable_v<typename R::Params> && ...), "parameters travel by value into a kernel");
  static_assert((std::is_trivially_copyable_v<typename R::GradStats> && ...), "kept per segment in device scratch");

  template <typename F>
  static void visit(const Call& call, F&& f) {
    visit_entry<Entries>(call, std::forward<F>(f));
  }
};
using Rows = RowTable<NormRow>;
using RowCall = Rows::Call;

inline RowCall norm_call(float eps, bool centered, const InternalRounding& low, bool zero_centered = false) {
  return NormRow::Params{eps, centered, low, zero_centered};
}

}  // namespace mpsim::core
