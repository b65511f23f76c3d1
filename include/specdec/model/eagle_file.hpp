#pragma once
//! \file
//! EAGLE draft heads as the reference repository (SafeAILab/EAGLE) lays them out: a directory with
//! `config.json` (a Hugging Face Llama config) and `model.safetensors` (the state dict of the
//! reference's `Model`, tools/eagle/README.md). The config reader and the loader
//! (`load_eagle_head`); what a head computes is model/eagle.hpp's. It shares the heads files'
//! JSON and tensor-loading helpers (`detail::head_tensor_loader`, `detail::config_count`, ...,
//! model/heads_file.hpp) and the safetensors reader.
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
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "specdec/core/error.hpp"
#include "specdec/model/eagle.hpp"
#include "specdec/model/heads_file.hpp"
#include "specdec/model/llama_weights.hpp"
#include "specdec/model/safetensors.hpp"
#include "specdec/model/weight_storage.hpp"

namespace specdec {

//! The file names of an EAGLE head directory.
inline constexpr char const* eagle_config_file = "config.json";
inline constexpr char const* eagle_weights_file = "model.safetensors";

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
  detail::llama_layer_keys const k = detail::config_llama_layer(j, w, max_eagle_heads);
  c.hidden_size = k.hidden_size;
  c.intermediate_size = k.intermediate_size;
  c.num_heads = k.num_heads;
  c.num_kv_heads = k.num_kv_heads;
  c.head_dim = k.head_dim;
  c.rms_eps = k.rms_eps;
  c.rope_theta = k.rope_theta;
  c.rope_interleaved = k.rope_interleaved;
  c.vocab_size = detail::config_count(j, "vocab_size", 1, big, w, std::nullopt);
  c.draft_vocab_size = detail::config_count(
      j, "draft_vocab_size", 1, static_cast<std::int64_t>(c.vocab_size), w, c.vocab_size);
  std::size_t const layers = detail::config_count(j, "num_hidden_layers", 1, 4096, w, 1);
  SPECDEC_CHECK(layers == 1, unsupported, w, ": \"num_hidden_layers\" ", layers,
                " is not supported (an EAGLE head has one decoder layer)");
  c.fc_bias = detail::config_bool(j, "bias", w, true) && !eagle3;
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

}  // namespace specdec
