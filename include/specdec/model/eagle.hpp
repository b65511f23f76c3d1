#pragma once
//! \file
//! EAGLE draft heads (Li et al., "EAGLE: Speculative Sampling Requires Rethinking Feature
//! Uncertainty", 2024; EAGLE-2, 2024; "EAGLE-3: Scaling up Inference Acceleration of Large
//! Language Models via Training-Time Test", 2025) as the reference repository (SafeAILab/EAGLE)
//! lays them out: a directory with `config.json` (a Hugging Face Llama config) and
//! `model.safetensors` (the state dict of the reference's `Model`, tools/eagle/README.md). The
//! config reader, the loader (`load_eagle_head`) and heads of random weights
//! (`make_random_eagle_head`).
//!
//! This is its own header rather than a section of model/heads.hpp: an EAGLE head is a transformer
//! layer with its own KV cache, its own config format and its own file, not a set of MLP heads; it
//! shares that header's JSON and tensor-loading helpers (`detail::head_tensor_loader`,
//! `detail::config_count`, ...) and the safetensors reader.
//!
//! The head reads, for each committed token x_j, the target's feature f_j of that token paired
//! with the NEXT token x_{j+1}, at head position j (0-based). One decoder layer:
//! - EAGLE-1 (cnets1.py): u = fc([E(x_{j+1}), f_j]) (+ bias), a Llama layer without the input
//!   norm: h = u + Attn(u); out = h + MLP(post_norm(h)); logits = the target's classifier on out.
//!   f_j is the target's final hidden state (after its final RMSNorm), d = dim wide.
//! - EAGLE-3 (cnets.py): u = fc(f_j) with f_j the target's residual streams at three layers
//!   concatenated (3 dim wide); the attention reads [input_norm(E(x_{j+1})), hidden_norm(u)]
//!   (2 dim wide): h = u + Attn(...); out = h + MLP(post_norm(h)); logits = lm_head(norm(out))
//!   over a draft vocabulary, draft id i being target id i + d2t[i].
//! Deeper tree nodes feed the head's own output `out` in place of a target feature (EAGLE-3 then
//! skips fc, whose input is 3 dim wide; EAGLE-1 always applies it).
//!
//! The loader checks every tensor against the config and the TARGET (dim, vocabulary, the layers
//! EAGLE-3 reads): a missing tensor, one the head does not use, a wrong shape, a config key
//! absent, of the wrong type or out of range, a d2t entry outside the vocabulary or repeated, all
//! throw `specdec::error` naming the tensor or the key and the file. F32 tensors are used in place;
//! F16 / BF16 ones are converted once. The attention's q and k rows are permuted at load from the
//! reference's RoPE layout (Hugging Face `rotate_half`: pairs (i, i + hs / 2)) into the backends'
//! interleaved pairs (2i, 2i + 1), which leaves every attention score unchanged.

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "specdec/core/error.hpp"
#include "specdec/core/types.hpp"
#include "specdec/core/views.hpp"
#include "specdec/model/heads.hpp"
#include "specdec/model/llama_weights.hpp"
#include "specdec/model/random.hpp"
#include "specdec/model/safetensors.hpp"
#include "specdec/model/weight_storage.hpp"

namespace specdec {

//! The file names of an EAGLE head directory.
inline constexpr char const* eagle_config_file = "config.json";
inline constexpr char const* eagle_weights_file = "model.safetensors";

//! Which EAGLE head.
enum class eagle_version {
  eagle1,  //!< EAGLE-1 / EAGLE-2 (cnets1.py): fc over [embedding, final hidden], target LM head
  eagle3,  //!< EAGLE-3 (cnets.py): fc over three layers' features, own norm and LM head
};

//! What an EAGLE `config.json` says (Hugging Face Llama keys, as the reference's configs).
struct eagle_config {
  //! EAGLE-3 when "draft_vocab_size" is present or "architectures" names an Eagle3 model
  //! ("eagle_version", when present, must agree).
  eagle_version version = eagle_version::eagle1;
  std::size_t hidden_size = 0;        //!< "hidden_size": the target's dim
  std::size_t intermediate_size = 0;  //!< "intermediate_size": the MLP's inner width
  std::size_t num_heads = 0;          //!< "num_attention_heads"
  std::size_t num_kv_heads = 0;       //!< "num_key_value_heads" (default: num_heads)
  std::size_t head_dim = 0;           //!< "head_dim" (default: hidden_size / num_heads), even
  std::size_t vocab_size = 0;         //!< "vocab_size": the target's vocabulary
  std::size_t draft_vocab_size = 0;   //!< "draft_vocab_size" (EAGLE-3; default vocab_size)
  float rms_eps = 1e-6f;              //!< "rms_norm_eps" (default 1e-6, as Hugging Face's)
  float rope_theta = 10000.0f;        //!< "rope_theta" (default 10000)
  bool fc_bias = true;                //!< "bias" (EAGLE-1's fc bias; default true; EAGLE-3: none)
  //! "rope_style": "interleaved" (pairs (2i, 2i + 1), the backends' layout) or "rotate_half"
  //! (pairs (i, i + hs / 2), Hugging Face's: the default, permuted at load).
  bool rope_interleaved = false;
  //! EAGLE-3: the target layers whose INPUT the features are, in the order fc reads them:
  //! "eagle_aux_hidden_state_layer_ids" (vLLM's key and meaning, ids >= 1), or
  //! "eagle_layer_outputs" (the layers whose output is read) plus one; layer n means after the
  //! last layer, before the final norm. The reference's 2, n / 2, n - 3 when absent. Empty for
  //! EAGLE-1.
  std::vector<std::int32_t> eagle_layers;
  std::string base_model;  //!< "base_model_name_or_path", or empty

  //! The output widths of the attention: query heads x head_dim, kv heads x head_dim.
  [[nodiscard]] std::size_t q_dim() const noexcept { return num_heads * head_dim; }
  [[nodiscard]] std::size_t kv_dim() const noexcept { return num_kv_heads * head_dim; }
};

//! An EAGLE head's float32 weights for one target: pointers into `storage` (the file's tensors)
//! and into the target's weights (the token embedding, and EAGLE-1's classifier), kept alive by
//! `target`. Matrices are row-major [out, in].
struct eagle_weights {
  eagle_config config;
  std::size_t dim = 0;                          //!< the target's hidden size
  std::size_t vocab = 0;                        //!< the target's vocabulary
  std::size_t draft_vocab = 0;                  //!< rows of `lm_head` (vocab for EAGLE-1)
  std::shared_ptr<void const> storage;          //!< keeps every pointer into the file valid
  std::shared_ptr<llama_weights const> target;  //!< keeps the target's tensors valid
  float const* embedding = nullptr;    //!< [vocab, dim] (the file's embed_tokens, or the target's)
  float const* fc = nullptr;           //!< [dim, fc_width()]
  float const* fc_bias = nullptr;      //!< [dim] or null
  float const* input_norm = nullptr;   //!< [dim] (EAGLE-3) or null
  float const* hidden_norm = nullptr;  //!< [dim] (EAGLE-3) or null
  float const* wq = nullptr;           //!< [q_dim, attention_width()], interleaved RoPE pairs
  float const* wk = nullptr;           //!< [kv_dim, attention_width()], interleaved RoPE pairs
  float const* wv = nullptr;           //!< [kv_dim, attention_width()]
  float const* wo = nullptr;           //!< [dim, q_dim]
  float const* post_norm = nullptr;    //!< [dim]
  float const* w1 = nullptr;           //!< [intermediate, dim] (gate)
  float const* w3 = nullptr;           //!< [intermediate, dim] (up)
  float const* w2 = nullptr;           //!< [dim, intermediate] (down)
  float const* norm = nullptr;         //!< [dim] (EAGLE-3) or null
  float const* lm_head = nullptr;      //!< [draft_vocab, dim]: EAGLE-3's own, EAGLE-1 the target's
  //! [draft_vocab] the target id of each draft id (EAGLE-3: i + d2t[i]); empty = the identity.
  std::vector<token_id> draft_to_target;
  //! The target layers whose residual stream (after that layer, 0-based: what
  //! `forward_request::hidden_layers` asks for) make up a feature, in fc's order; empty for
  //! EAGLE-1, which reads the final hidden state.
  std::vector<std::int32_t> target_layers;

  //! Width of a target feature row: dim (EAGLE-1) or target_layers.size() dim (EAGLE-3).
  [[nodiscard]] std::size_t feature_width() const noexcept {
    return config.version == eagle_version::eagle1 ? dim : target_layers.size() * dim;
  }
  //! Width of fc's input: 2 dim ([embedding, feature]) for EAGLE-1, the feature for EAGLE-3.
  [[nodiscard]] std::size_t fc_width() const noexcept {
    return config.version == eagle_version::eagle1 ? 2 * dim : feature_width();
  }
  //! Width of the attention's input: dim (EAGLE-1) or 2 dim (EAGLE-3).
  [[nodiscard]] std::size_t attention_width() const noexcept {
    return config.version == eagle_version::eagle1 ? dim : 2 * dim;
  }
};

//! One call of an EAGLE head runner (backend/cpu/eagle.hpp, backend/cuda/eagle.cuh): n rows, each
//! an input row paired with a token at a position, appended to the head's KV cache in order
//! (entries size() .. size() + n - 1), each attending to the cache entries its visibility allows.
struct eagle_batch {
  //! [n, feature_width()] the target's features (`from_target`), or [n, dim] outputs of the head
  //! itself (deeper tree nodes: the output of the node's parent).
  matrix_view<float const> inputs;
  bool from_target = true;  //!< whether `inputs` are target features (EAGLE-3 applies fc to them)
  std::span<token_id const> tokens;       //!< [n] the token paired with each row (< vocab)
  std::span<position_t const> positions;  //!< [n] each row's position (RoPE)
  //! Visibility with a mask: every row sees the cache entries [0, shared), then the entries
  //! shared + j whose bit j its mask row sets (j < size() - shared + n: row i is entry
  //! size() + i, and must see itself). Without a mask every row sees every entry before it
  //! (causal) and `shared` is ignored.
  std::size_t shared = 0;
  std::span<std::uint64_t const> mask = {};  //!< [n, mask_stride] bit-packed, or empty
  std::size_t mask_stride = 0;               //!< words per mask row

  //! Whether row i sees cache entry e (of a cache that held `size` entries before the batch).
  [[nodiscard]] bool visible(std::size_t i, std::size_t e, std::size_t size) const noexcept {
    if (mask.empty()) return e <= size + i;
    if (e < shared) return true;
    std::size_t const j = e - shared;
    return (mask[i * mask_stride + j / 64] >> (j % 64)) & 1u;
  }
};

//! The most query or kv heads, and the widest inner MLP, a config may declare.
inline constexpr std::int64_t max_eagle_heads = 4096;

//! Parses the text of an EAGLE `config.json` (`w` names it in messages). Required: "hidden_size",
//! "intermediate_size", "num_attention_heads", "vocab_size"; optional: "num_key_value_heads",
//! "head_dim", "draft_vocab_size", "rms_norm_eps", "rope_theta", "bias", "rope_style",
//! "eagle_aux_hidden_state_layer_ids" or "eagle_layer_outputs", "eagle_version" (1 or 3),
//! "num_hidden_layers" (1), "hidden_act" ("silu"), "rope_scaling" (null), "architectures",
//! "base_model_name_or_path"; other keys are ignored. Throws `errc::bad_file`
//! naming the key for a value of the wrong type or out of range, `errc::unsupported` for a valid
//! one this head cannot run (several layers, another activation, RoPE scaling).
[[nodiscard]] inline eagle_config parse_eagle_config(std::string_view text, std::string const& w) {
  nlohmann::json const j = detail::config_object(text, w);
  constexpr std::int64_t big = std::int64_t{1} << 24;
  eagle_config c;
  bool eagle3 = j.contains("draft_vocab_size");
  if (auto const it = j.find("architectures"); it != j.end() && !it->is_null()) {
    SPECDEC_CHECK(it->is_array(), bad_file, w, ": \"architectures\" must be an array of strings");
    for (auto const& a : *it) {
      SPECDEC_CHECK(a.is_string(), bad_file, w, ": \"architectures\" must be an array of strings");
      eagle3 = eagle3 || a.get_ref<std::string const&>().find("Eagle3") != std::string::npos;
    }
  }
  c.version = eagle3 ? eagle_version::eagle3 : eagle_version::eagle1;
  c.hidden_size = detail::config_count(j, "hidden_size", 1, big, w, std::nullopt);
  c.intermediate_size = detail::config_count(j, "intermediate_size", 1, big, w, std::nullopt);
  c.num_heads = detail::config_count(j, "num_attention_heads", 1, max_eagle_heads, w, std::nullopt);
  c.num_kv_heads =
      detail::config_count(j, "num_key_value_heads", 1, max_eagle_heads, w, c.num_heads);
  SPECDEC_CHECK(c.num_heads % c.num_kv_heads == 0, bad_file, w, ": \"num_attention_heads\" ",
                c.num_heads, " is not a multiple of \"num_key_value_heads\" ", c.num_kv_heads);
  c.head_dim = detail::config_count(j, "head_dim", 2, big, w, c.hidden_size / c.num_heads);
  SPECDEC_CHECK(c.head_dim >= 2 && c.head_dim % 2 == 0, bad_file, w, ": the head size ", c.head_dim,
                " (\"head_dim\", or hidden_size / num_attention_heads) must be even");
  SPECDEC_CHECK(c.head_dim * c.num_heads <= static_cast<std::size_t>(big), bad_file, w,
                ": num_attention_heads x head_dim is absurd");
  c.vocab_size = detail::config_count(j, "vocab_size", 1, big, w, std::nullopt);
  c.draft_vocab_size = detail::config_count(
      j, "draft_vocab_size", 1, static_cast<std::int64_t>(c.vocab_size), w, c.vocab_size);
  std::size_t const layers = detail::config_count(j, "num_hidden_layers", 1, 4096, w, 1);
  SPECDEC_CHECK(layers == 1, unsupported, w, ": \"num_hidden_layers\" ", layers,
                " is not supported (an EAGLE head has one decoder layer)");
  auto const positive = [&](char const* key, float fallback, float hi) {
    auto const it = j.find(key);
    if (it == j.end()) return fallback;
    SPECDEC_CHECK(it->is_number() && std::isfinite(it->get<double>()) && it->get<double>() > 0.0 &&
                      it->get<double>() < static_cast<double>(hi),
                  bad_file, w, ": \"", key, "\" must be a positive number below ", hi, ", got ",
                  it->dump());
    return static_cast<float>(it->get<double>());
  };
  c.rms_eps = positive("rms_norm_eps", 1e-6f, 1.0f);
  c.rope_theta = positive("rope_theta", 10000.0f, 1e12f);
  c.fc_bias = detail::config_bool(j, "bias", w, true) && !eagle3;
  std::string const rope = detail::config_string(j, "rope_style", w, "rotate_half");
  SPECDEC_CHECK(rope == "rotate_half" || rope == "interleaved", bad_file, w, ": \"rope_style\" \"",
                rope, "\" is neither \"rotate_half\" nor \"interleaved\"");
  c.rope_interleaved = rope == "interleaved";
  std::string const act = detail::config_string(j, "hidden_act", w, "silu");
  SPECDEC_CHECK(act == "silu", unsupported, w, ": \"hidden_act\" \"", act,
                "\" is not supported (only \"silu\")");
  if (auto const it = j.find("rope_scaling"); it != j.end())
    SPECDEC_CHECK(it->is_null(), unsupported, w, ": \"rope_scaling\" ", it->dump(),
                  " is not supported (only null)");
  // The target layers: vLLM's key (inputs of the layers named), or ours (their outputs).
  auto const layer_list = [&](char const* key, std::int64_t lo, std::int32_t shift) {
    auto const it = j.find(key);
    if (it == j.end() || it->is_null()) return false;
    SPECDEC_CHECK(eagle3, bad_file, w, ": \"", key, "\" is given but this is an EAGLE-1 head");
    SPECDEC_CHECK(
        c.eagle_layers.empty(), bad_file, w,
        ": both \"eagle_aux_hidden_state_layer_ids\" and \"eagle_layer_outputs\" are given");
    SPECDEC_CHECK(it->is_array() && !it->empty() && it->size() <= 16, bad_file, w, ": \"", key,
                  "\" must be an array of 1 to 16 layer indices, got ", it->dump());
    for (auto const& l : *it) {
      bool const ok =
          l.is_number_integer() && l.get<std::int64_t>() >= 0 && l.get<std::int64_t>() <= 4096;
      SPECDEC_CHECK(ok, bad_file, w, ": \"", key, "\" holds ", l.dump(),
                    ", not a layer index in [0, 4096]");
      SPECDEC_CHECK(l.get<std::int64_t>() >= lo, unsupported, w, ": \"", key, "\" holds ", l.dump(),
                    ": the input of layer 0 (the token embedding) is not supported");
      c.eagle_layers.push_back(static_cast<std::int32_t>(l.get<std::int64_t>()) + shift);
    }
    return true;
  };
  layer_list("eagle_aux_hidden_state_layer_ids", 1, 0);
  layer_list("eagle_layer_outputs", 0, 1);
  std::size_t const version = detail::config_count(j, "eagle_version", 1, 3, w, eagle3 ? 3 : 1);
  SPECDEC_CHECK(version != 2, bad_file, w,
                ": \"eagle_version\" 2 (EAGLE-2 drafts with EAGLE-1 heads: write 1)");
  SPECDEC_CHECK((version == 3) == eagle3, bad_file, w, ": \"eagle_version\" ", version,
                " disagrees with ", eagle3 ? "" : "the absence of ",
                "\"draft_vocab_size\" / an Eagle3 architecture");
  c.base_model = detail::config_string(j, "base_model_name_or_path", w, "");
  return c;
}

//! Reads the EAGLE `config.json` at `path` (see `parse_eagle_config`).
[[nodiscard]] inline eagle_config read_eagle_config(std::filesystem::path const& path) {
  return parse_eagle_config(detail::read_text_file(path), path.string());
}

namespace detail {

//! The storage of a loaded head: the file's tensors and the q / k rows permuted into the
//! interleaved RoPE layout.
struct eagle_storage {
  std::shared_ptr<void const> file;  //!< what `head_tensor_loader::finish` returned
  std::vector<float> permuted;       //!< [q_dim + kv_dim, attention_width] or empty
};

//! `w` [heads * hs, cols] with each head's rows reordered from the rotate_half pairs (i, i + hs/2)
//! to the interleaved pairs (2i, 2i + 1): row 2i of a head is row i, row 2i + 1 is row i + hs / 2.
inline void interleave_rope_rows(float const* w, std::size_t heads, std::size_t hs,
                                 std::size_t cols, float* out) {
  for (std::size_t h = 0; h < heads; ++h)
    for (std::size_t i = 0; i < hs / 2; ++i) {
      float const* const a = w + (h * hs + i) * cols;
      float const* const b = w + (h * hs + i + hs / 2) * cols;
      std::copy(a, a + cols, out + (h * hs + 2 * i) * cols);
      std::copy(b, b + cols, out + (h * hs + 2 * i + 1) * cols);
    }
}

//! The target layers (after-layer indices) an EAGLE-3 config reads, checked against a target of
//! `n_layers` layers: `eagle_config::eagle_layers` (input-of-layer indices in [1, n_layers]) minus
//! one, or the reference's (2, n / 2, n - 3) when absent.
[[nodiscard]] inline std::vector<std::int32_t> eagle_target_layers(eagle_config const& c,
                                                                   std::int32_t n_layers,
                                                                   std::string const& where) {
  std::vector<std::int32_t> in = c.eagle_layers;
  if (in.empty()) {
    SPECDEC_CHECK(n_layers >= 4, invalid_argument, where,
                  ": no EAGLE-3 layers in the config and a target of ", n_layers,
                  " layers, too few for the reference's layers (2, n / 2, n - 3)");
    in = {2, n_layers / 2, n_layers - 3};
  }
  std::vector<std::int32_t> out;
  for (std::int32_t l : in) {
    SPECDEC_CHECK(l >= 1 && l <= n_layers, invalid_argument, where,
                  ": the EAGLE-3 layers name the input of layer ", l, " but the target has ",
                  n_layers, " layers (inputs 1 to ", n_layers, " can be read)");
    out.push_back(l - 1);
  }
  return out;
}

}  // namespace detail

//! Loads an EAGLE head from `file` with `config` for the target `target` (shared: the head reads
//! its token embedding and, for EAGLE-1, its classifier). Throws `errc::bad_file` naming the
//! tensor for a missing tensor, an unexpected one, a wrong shape or bad d2t / t2d entries,
//! `errc::invalid_argument` when the config disagrees with the target (dim, vocabulary, layers),
//! `errc::unsupported` for a tensor type other than F32 / F16 / BF16 (d2t: an integer type).
[[nodiscard]] inline eagle_weights load_eagle_head(safetensors_file const& file,
                                                   eagle_config const& config,
                                                   std::shared_ptr<llama_weights const> target) {
  std::string const& where = file.where();
  SPECDEC_CHECK(
      target != nullptr && target->token_embedding != nullptr && target->classifier != nullptr,
      invalid_argument, where, ": an EAGLE head needs the target's weights");
  auto const dim = static_cast<std::size_t>(target->config.dim);
  auto const vocab = static_cast<std::size_t>(target->config.vocab_size);
  SPECDEC_CHECK(config.hidden_size == dim, invalid_argument, where, ": \"hidden_size\" is ",
                config.hidden_size, " but the target's dim is ", dim);
  SPECDEC_CHECK(config.vocab_size == vocab, invalid_argument, where, ": \"vocab_size\" is ",
                config.vocab_size, " but the target's vocabulary has ", vocab, " tokens");
  bool const e3 = config.version == eagle_version::eagle3;
  eagle_weights w;
  w.config = config;
  w.dim = dim;
  w.vocab = vocab;
  w.draft_vocab = e3 ? config.draft_vocab_size : vocab;
  w.target = target;
  if (e3) w.target_layers = detail::eagle_target_layers(config, target->config.n_layers, where);

  auto const d = static_cast<std::uint64_t>(dim);
  auto const u = [](std::size_t v) { return static_cast<std::uint64_t>(v); };
  std::uint64_t const q = u(config.q_dim()), kv = u(config.kv_dim()),
                      inner = u(config.intermediate_size), att = u(w.attention_width());
  std::string const att_role = e3 ? "2 dim (embedding and hidden state)" : "dim";
  detail::head_tensor_loader loader(file);
  w.embedding = target->token_embedding;
  if (file.find("embed_tokens.weight") != nullptr)
    loader.want("embed_tokens.weight", {u(vocab), d}, "[vocab, dim]", &w.embedding);
  loader.want("fc.weight", {d, u(w.fc_width())},
              e3 ? "[dim, " + std::to_string(w.target_layers.size()) + " dim] (the fused features)"
                 : std::string("[dim, 2 dim] (embedding, feature)"),
              &w.fc);
  if (config.fc_bias) loader.want("fc.bias", {d}, "[dim]", &w.fc_bias);
  std::string const p = e3 ? "midlayer." : "layers.0.";
  if (e3) {
    loader.want(p + "input_layernorm.weight", {d}, "[dim]", &w.input_norm);
    loader.want(p + "hidden_norm.weight", {d}, "[dim]", &w.hidden_norm);
  }
  float const* wq = nullptr;
  float const* wk = nullptr;
  loader.want(p + "self_attn.q_proj.weight", {q, att}, "[heads x head_dim, " + att_role + "]", &wq);
  loader.want(p + "self_attn.k_proj.weight", {kv, att}, "[kv heads x head_dim, " + att_role + "]",
              &wk);
  loader.want(p + "self_attn.v_proj.weight", {kv, att}, "[kv heads x head_dim, " + att_role + "]",
              &w.wv);
  loader.want(p + "self_attn.o_proj.weight", {d, q}, "[dim, heads x head_dim]", &w.wo);
  loader.want(p + "post_attention_layernorm.weight", {d}, "[dim]", &w.post_norm);
  loader.want(p + "mlp.gate_proj.weight", {inner, d}, "[intermediate, dim]", &w.w1);
  loader.want(p + "mlp.up_proj.weight", {inner, d}, "[intermediate, dim]", &w.w3);
  loader.want(p + "mlp.down_proj.weight", {d, inner}, "[dim, intermediate]", &w.w2);
  safetensors_tensor const* d2t = nullptr;
  safetensors_tensor const* t2d = nullptr;
  if (e3) {
    loader.want("norm.weight", {d}, "[dim]", &w.norm);
    loader.want("lm_head.weight", {u(w.draft_vocab), d}, "[draft_vocab, dim]", &w.lm_head);
    d2t = &loader.want_other("d2t", {u(w.draft_vocab)}, "[draft_vocab]");
    if (file.find("t2d") != nullptr) t2d = &loader.want_other("t2d", {u(vocab)}, "[vocab]");
  } else {
    w.lm_head = target->classifier;
  }
  auto storage = std::make_shared<detail::eagle_storage>();
  storage->file = loader.finish();

  // RoPE rows into the interleaved layout (or as they are).
  if (config.rope_interleaved) {
    w.wq = wq;
    w.wk = wk;
  } else {
    storage->permuted.resize(static_cast<std::size_t>((q + kv) * att));
    float* const pq = storage->permuted.data();
    float* const pk = pq + static_cast<std::size_t>(q * att);
    detail::interleave_rope_rows(wq, config.num_heads, config.head_dim, w.attention_width(), pq);
    detail::interleave_rope_rows(wk, config.num_kv_heads, config.head_dim, w.attention_width(), pk);
    w.wq = pq;
    w.wk = pk;
  }

  // d2t: draft id i is target id i + d2t[i], every one in the vocabulary and none repeated; t2d
  // (when present) marks exactly those target ids.
  if (d2t != nullptr) {
    std::vector<std::int64_t> offsets(w.draft_vocab);
    file.read_integers(*d2t, offsets);
    std::vector<bool> seen(vocab, false);
    w.draft_to_target.resize(w.draft_vocab);
    for (std::size_t i = 0; i < w.draft_vocab; ++i) {
      std::int64_t const off = offsets[i];
      bool const in_range =
          off >= -static_cast<std::int64_t>(i) && off < static_cast<std::int64_t>(vocab - i);
      if (!in_range) {
        // i + off, unless it overflows int64 (then written as the sum).
        auto const id = static_cast<std::int64_t>(i);
        std::string const to = off > std::numeric_limits<std::int64_t>::max() - id
                                   ? std::to_string(i) + " + " + std::to_string(off)
                                   : std::to_string(id + off);
        SPECDEC_THROW(bad_file, where, ": tensor 'd2t' maps draft token ", i, " to ", to,
                      ", outside the vocabulary of ", vocab);
      }
      auto const t = static_cast<std::size_t>(static_cast<std::int64_t>(i) + off);
      SPECDEC_CHECK(!seen[t], bad_file, where, ": tensor 'd2t' maps two draft tokens to ", t);
      seen[t] = true;
      w.draft_to_target[i] = static_cast<token_id>(t);
    }
    if (t2d != nullptr) {
      std::vector<std::int64_t> marks(vocab);
      file.read_integers(*t2d, marks);
      for (std::size_t t = 0; t < vocab; ++t)
        SPECDEC_CHECK((marks[t] != 0) == seen[t], bad_file, where, ": tensor 't2d' ",
                      marks[t] != 0 ? "marks" : "does not mark", " token ", t, ", which d2t ",
                      seen[t] ? "maps to" : "does not map to");
    }
    bool identity = true;
    for (std::size_t i = 0; i < w.draft_vocab && identity; ++i)
      identity = w.draft_to_target[i] == static_cast<token_id>(i);
    if (identity && w.draft_vocab == vocab) w.draft_to_target.clear();
  }
  w.storage = std::move(storage);
  return w;
}

//! Loads the EAGLE head in the directory `dir` (config.json + model.safetensors) for `target`,
//! the weights file mapped, or read into memory with `file_access::read` (mapped_file.hpp: a
//! mapped file must not change while the head is used).
[[nodiscard]] inline eagle_weights load_eagle_head(std::filesystem::path const& dir,
                                                   std::shared_ptr<llama_weights const> target,
                                                   file_access access = file_access::map) {
  eagle_config const c = read_eagle_config(dir / eagle_config_file);
  return load_eagle_head(safetensors_file(dir / eagle_weights_file, access), c, std::move(target));
}

//! An EAGLE head of random weights for `target` (benchmarks at real shapes, tests of shapes no
//! trained file has): every matrix N(0, stddev^2), every norm weight 1, `heads` query heads and
//! `kv_heads` kv heads of dim / heads, an MLP of `intermediate` inner width; EAGLE-3 reads the
//! target's layers `layers` (input-of-layer indices, as `eagle_config::eagle_layers`) and drafts
//! over `draft_vocab` tokens spread evenly over the vocabulary (every vocab / draft_vocab-th id).
//! Deterministic in `seed`. Throws `errc::invalid_argument` for impossible shapes.
[[nodiscard]] inline eagle_weights make_random_eagle_head(
    eagle_version version, std::shared_ptr<llama_weights const> target, std::size_t heads,
    std::size_t kv_heads, std::size_t intermediate, std::size_t draft_vocab,
    std::vector<std::int32_t> layers, std::uint64_t seed, float stddev) {
  SPECDEC_CHECK(
      target != nullptr && target->token_embedding != nullptr && target->classifier != nullptr,
      invalid_argument, "make_random_eagle_head: no target weights");
  auto const dim = static_cast<std::size_t>(target->config.dim);
  auto const vocab = static_cast<std::size_t>(target->config.vocab_size);
  bool const e3 = version == eagle_version::eagle3;
  SPECDEC_CHECK(heads >= 1 && kv_heads >= 1 && heads % kv_heads == 0 && dim % heads == 0 &&
                    (dim / heads) % 2 == 0 && intermediate >= 1 &&
                    (!e3 || (draft_vocab >= 1 && draft_vocab <= vocab)),
                invalid_argument, "make_random_eagle_head: ", heads, " heads, ", kv_heads,
                " kv heads, intermediate ", intermediate, ", draft vocabulary ", draft_vocab,
                " for dim ", dim, " and vocabulary ", vocab);
  eagle_weights w;
  w.config.version = version;
  w.config.hidden_size = dim;
  w.config.intermediate_size = intermediate;
  w.config.num_heads = heads;
  w.config.num_kv_heads = kv_heads;
  w.config.head_dim = dim / heads;
  w.config.vocab_size = vocab;
  w.config.draft_vocab_size = e3 ? draft_vocab : vocab;
  w.config.rms_eps = target->config.rms_eps;
  w.config.rope_theta = target->config.rope_theta;
  w.config.fc_bias = !e3;
  w.config.rope_interleaved = true;
  w.config.eagle_layers = e3 ? std::move(layers) : std::vector<std::int32_t>{};
  w.dim = dim;
  w.vocab = vocab;
  w.draft_vocab = w.config.draft_vocab_size;
  w.target = target;
  if (e3)
    w.target_layers =
        detail::eagle_target_layers(w.config, target->config.n_layers, "make_random_eagle_head");
  std::size_t const q = w.config.q_dim(), kv = w.config.kv_dim(), att = w.attention_width();
  std::size_t floats = dim * w.fc_width() + (w.config.fc_bias ? dim : 0) + (q + 2 * kv) * att +
                       dim * q + 3 * intermediate * dim + (e3 ? w.draft_vocab * dim : 0);
  detail::random_tensor_pool pool(floats, seed, stddev);
  w.embedding = target->token_embedding;
  w.fc = pool.take(dim * w.fc_width());
  if (w.config.fc_bias) w.fc_bias = pool.take(dim);
  w.wq = pool.take(q * att);
  w.wk = pool.take(kv * att);
  w.wv = pool.take(kv * att);
  w.wo = pool.take(dim * q);
  w.w1 = pool.take(intermediate * dim);
  w.w3 = pool.take(intermediate * dim);
  w.w2 = pool.take(dim * intermediate);
  auto ones = std::make_shared<std::vector<float>>(4 * dim, 1.0f);
  w.post_norm = ones->data();
  if (e3) {
    w.input_norm = ones->data() + dim;
    w.hidden_norm = ones->data() + 2 * dim;
    w.norm = ones->data() + 3 * dim;
    w.lm_head = pool.take(w.draft_vocab * dim);
    w.draft_to_target.resize(w.draft_vocab);
    for (std::size_t i = 0; i < w.draft_vocab; ++i)
      w.draft_to_target[i] = static_cast<token_id>(i * vocab / w.draft_vocab);
    if (w.draft_vocab == vocab) w.draft_to_target.clear();
  } else {
    w.lm_head = target->classifier;
  }
  w.storage =
      std::make_shared<std::pair<std::shared_ptr<void const>, std::shared_ptr<std::vector<float>>>>(
          pool.storage(), std::move(ones));
  return w;
}

}  // namespace specdec
