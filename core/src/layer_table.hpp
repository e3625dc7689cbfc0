#pragma once
// The optional layers of a transformer (vit, gpt), one entry each: its
// config keys (model.*), where it goes in the model and under which name,
// and what it refuses. The model (model.cpp's build_layers), the config
// (config.cpp's model_fields, its reader, writer and docs) and the
// experiment's checks (experiment.cpp) read this table, so an optional
// layer is an entry here and its ModelSpec member (model.hpp); an
// element-wise or row-wise one needs only its op in numerics_ops.hpp or
// numerics_rows.hpp besides (make_pointwise, make_row_layer): no backend
// call, kernel or layer class.
//
// The entries' order is the order of the layers that share a place (QK-norm
// before rotary embeddings). Layer names and order must not move: a layer's
// index keys its random streams (StepContext::stream).

#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "config_field.hpp"
#include "mpsim/core/model.hpp"

namespace mpsim::core::layer_table {

using config_field::ConfigField;
using config_field::enum_key;
using config_field::key;

// The places in a transformer where optional layers go.
enum class Slot : std::uint8_t {
  after_embedding,  // the input rows, before the first block
  after_qkv,        // each block's [q | k | v] rows, before attention
  after_attention,  // each block's attention branch, before its residual sum
  after_mlp,        // each block's MLP branch, before its residual sum
  after_head,       // the model's logits
};

struct Place {
  const ModelSpec& spec;
  Slot slot;
  std::string block;    // "block3." inside a block, "" outside
  std::int64_t tokens;  // per sample
  std::int64_t head_dim() const { return spec.width / spec.heads; }
};

struct LayerEntry {
  std::string_view name;
  // The layer at this place, or null where the spec puts none.
  std::unique_ptr<Layer> (*make)(const Place&);
  std::span<const ConfigField<ModelSpec>> keys;
  // Why the spec cannot build this layer (empty when it can), checked before a run.
  std::string (*refusal)(const ModelSpec&) = nullptr;
};

// --- QK-LayerNorm (Dehghani et al. 2023; Wortsman et al. 2023) ---------------------------------------------------
inline constexpr auto qk_norm_keys = std::to_array<ConfigField<ModelSpec>>({
    key<&ModelSpec::qk_norm>("qk_norm", "",
                             "vit, gpt: QK-LayerNorm, a LayerNorm on each head's queries and keys before the logits "
                             "(Dehghani et al. 2023; Wortsman et al. 2023), which bounds the attention logits"),
});
inline std::unique_ptr<Layer> qk_norm_at(const Place& at) {
  if (!at.spec.qk_norm || at.slot != Slot::after_qkv) return nullptr;
  return make_qk_norm(at.block + "qk_norm", at.tokens, at.spec.heads, at.head_dim(), 1e-5f,
                      at.spec.zero_centered_gamma);
}

// --- Gemma's scaling of the embedded tokens ----------------------------------------------------------------------
inline constexpr auto embedding_scale_keys = std::to_array<ConfigField<ModelSpec>>({
    key<&ModelSpec::embedding_scale>(
        "embedding_scale", "",
        "vit, gpt: > 0 multiplies the embedded rows by this factor in binary32, an `embed_scale` layer before the "
        "positions, its output rounded at the policy's elementwise point (Gemma: sqrt(width), which its reference "
        "code rounds to the activations' format first: give that value to match it). 0: off",
        config_field::finite_at_least(0)),
});
inline std::unique_ptr<Layer> embedding_scale_at(const Place& at) {
  if (!(at.spec.embedding_scale > 0) || at.slot != Slot::after_embedding) return nullptr;
  return make_pointwise("embed_scale", {.op = MultiplyOp::Params{static_cast<float>(at.spec.embedding_scale)},
                                        .output = PointwiseOutput::elementwise,
                                        .per_step = {}});
}

// --- Positions: a learned table added to the input rows, or rotary embeddings of q and k --------------------------
inline constexpr auto position_keys = std::to_array<ConfigField<ModelSpec>>({
    enum_key<&ModelSpec::positions, position_kind_names>(
        "positions", "vit, gpt: `learned` (a position table added to the input rows, GPT-2) or `rotary` (rotary "
                     "embeddings of q and k in every attention, Su et al. 2021, LLaMA's \"rotate half\" pairing; "
                     "width / heads must be even)"),
    key<&ModelSpec::rotary_base>("rotary_base", "",
                                 "vit, gpt with rotary positions: the angle of feature pair c at position i is i x "
                                 "rotary_base^(-2c / head_dim) (LLaMA: 10000)",
                                 config_field::finite_above(1)),
});
inline std::unique_ptr<Layer> positions_at(const Place& at) {
  const ModelSpec& m = at.spec;
  if (m.positions == PositionKind::learned && at.slot == Slot::after_embedding)
    return make_position_embedding("pos", at.tokens, m.width);
  if (m.positions == PositionKind::rotary && at.slot == Slot::after_qkv)  // after QK-LayerNorm, as OLMo 2 orders them
    return make_rotary(at.block + "rope", at.tokens, m.heads, at.head_dim(), m.rotary_base);
  return nullptr;
}
inline std::string positions_refusal(const ModelSpec& m) {
  if (m.positions != PositionKind::rotary || (m.width / m.heads) % 2 == 0) return {};
  return fmt::format("model.positions = \"rotary\" pairs each head's features, but width / heads = {} is odd: use a "
                     "width that 2 x heads divides",
                     m.width / m.heads);
}

// --- Post-branch norms: Gemma 2's (Gemma Team 2024, "Gemma 2"); CogView's sandwich LayerNorm (Ding et al. 2021) --
inline constexpr auto post_norm_keys = std::to_array<ConfigField<ModelSpec>>({
    key<&ModelSpec::post_norm>(
        "post_norm", "",
        "vit, gpt: a norm of model.norm's kind on each block's attention and MLP outputs before their residual sums "
        "(`blockN.ln1_post`, `blockN.ln2_post`; Gemma 2's post_attention_layernorm and post_feedforward_layernorm, "
        "CogView's sandwich LayerNorm), which bounds what each branch adds to the residual stream"),
});
inline std::unique_ptr<Layer> post_norm_at(const Place& at) {
  if (!at.spec.post_norm) return nullptr;
  switch (at.slot) {
    case Slot::after_attention: return make_norm(at.block + "ln1_post", at.spec, at.spec.width);
    case Slot::after_mlp: return make_norm(at.block + "ln2_post", at.spec, at.spec.width);
    default: return nullptr;
  }
}

// --- Dropout (GPT-2's embd_pdrop and resid_pdrop) ----------------------------------------------------------------
inline constexpr auto dropout_keys = std::to_array<ConfigField<ModelSpec>>({
    key<&ModelSpec::dropout>("dropout", "",
                             "vit, gpt: dropout probability after the embeddings and after each block's attention "
                             "and MLP branches (GPT-2's embd_pdrop and resid_pdrop), in training only; the mask is "
                             "counter-based from the seed, layer and step, the same on every backend. 0: off",
                             config_field::at_least_below(0, 1)),
});
inline std::unique_ptr<Layer> dropout_at(const Place& at) {
  if (!(at.spec.dropout > 0)) return nullptr;
  switch (at.slot) {
    case Slot::after_embedding: return make_dropout("drop", at.spec.dropout);
    case Slot::after_attention: return make_dropout(at.block + "drop1", at.spec.dropout);
    case Slot::after_mlp: return make_dropout(at.block + "drop2", at.spec.dropout);
    default: return nullptr;
  }
}

// --- Final logit soft-capping (Gemma 2) --------------------------------------------------------------------------
inline constexpr auto logit_softcap_keys = std::to_array<ConfigField<ModelSpec>>({
    key<&ModelSpec::logit_softcap>(
        "logit_softcap", "",
        "vit, gpt: > 0 caps the output logits at +-this (Gemma 2: 30), a `softcap` layer after the head; the loss "
        "and accuracy read the capped logits, the logged maximum is the head's output before the cap. 0: off",
        config_field::finite_at_least(0)),
});
inline std::unique_ptr<Layer> logit_softcap_at(const Place& at) {
  if (!(at.spec.logit_softcap > 0) || at.slot != Slot::after_head) return nullptr;
  return make_soft_cap("softcap", static_cast<float>(at.spec.logit_softcap));
}
// A cap or a factor (`what`) runs in binary32: a value > 0 must stay > 0 and
// finite there (shared with attention_softcap's check, experiment.cpp).
inline std::string binary32_refusal(std::string_view key, double value, std::string_view what = "cap") {
  if (!(value > 0) || (static_cast<float>(value) > 0.0f && std::isfinite(static_cast<float>(value)))) return {};
  return fmt::format("model.{} = {} is not a positive binary32 value (the {} runs in binary32): use a {} between "
                     "1e-30 and 1e30, or 0 for none",
                     key, value, what, what);
}
inline std::string logit_softcap_refusal(const ModelSpec& m) {
  return binary32_refusal("logit_softcap", m.logit_softcap);
}
inline std::string embedding_scale_refusal(const ModelSpec& m) {
  return binary32_refusal("embedding_scale", m.embedding_scale, "factor");
}

// --- The table ---------------------------------------------------------------------------------------------------
inline constexpr std::array entries{
    LayerEntry{"qk_norm", &qk_norm_at, qk_norm_keys},
    LayerEntry{"embedding_scale", &embedding_scale_at, embedding_scale_keys, &embedding_scale_refusal},
    LayerEntry{"positions", &positions_at, position_keys, &positions_refusal},
    LayerEntry{"post_norm", &post_norm_at, post_norm_keys},  // before dropout: the mask stays last before the sum
    LayerEntry{"dropout", &dropout_at, dropout_keys},
    LayerEntry{"logit_softcap", &logit_softcap_at, logit_softcap_keys, &logit_softcap_refusal},
};

// Every entry's keys, in the table's order (config.cpp appends them to model_fields).
inline constexpr std::size_t key_count = [] {
  std::size_t n = 0;
  for (const LayerEntry& e : entries) n += e.keys.size();
  return n;
}();
inline constexpr std::array<ConfigField<ModelSpec>, key_count> keys = [] {
  std::array<ConfigField<ModelSpec>, key_count> all{};
  std::size_t i = 0;
  for (const LayerEntry& e : entries)
    for (const ConfigField<ModelSpec>& k : e.keys) all[i++] = k;
  return all;
}();

// The layers the spec puts at a place, appended in the table's order.
inline void add_layers(std::vector<std::unique_ptr<Layer>>& layers, const Place& at) {
  for (const LayerEntry& e : entries)
    if (std::unique_ptr<Layer> layer = e.make(at)) layers.push_back(std::move(layer));
}

// The first refusal of an entry (empty: the spec can build every layer it asks for).
inline std::string refusal(const ModelSpec& spec) {
  for (const LayerEntry& e : entries)
    if (e.refusal)
      if (std::string why = e.refusal(spec); !why.empty()) return why;
  return {};
}

}  // namespace mpsim::core::layer_table
