#pragma once
//! \file
//! Block drafter directories (tools/block/README.md): `config.json` (Hugging Face Llama keys plus
//! the block's) and `model.safetensors`. The config reader and the loader (`load_block_drafter`);
//! what a drafter computes is model/block_drafter.hpp's. It shares the heads files' JSON and
//! tensor-loading helpers (model/heads_file.hpp) and EAGLE's RoPE row permutation.
//!
//! The loader checks every tensor against the config and the TARGET (dim, vocabulary, the layers
//! the features are read from): a missing tensor, one the drafter does not use, a wrong shape, a
//! config key absent, of the wrong type or out of range, all throw `specdec::error` naming the
//! tensor or the key and the file. F32 tensors are used in place; F16 / BF16 ones are converted
//! once; q and k rows in the rotate-half RoPE layout are permuted to the interleaved one at load.

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "specdec/core/error.hpp"
#include "specdec/model/block_drafter.hpp"
#include "specdec/model/eagle.hpp"
#include "specdec/model/heads_file.hpp"
#include "specdec/model/llama_weights.hpp"
#include "specdec/model/safetensors.hpp"
#include "specdec/model/weight_storage.hpp"

namespace specdec {

//! The file names of a block drafter directory.
inline constexpr char const* block_drafter_config_file = "config.json";
inline constexpr char const* block_drafter_weights_file = "model.safetensors";

namespace detail {
struct block_drafter_storage {
  std::shared_ptr<void const> file;  // what `head_tensor_loader::finish` returned
  std::vector<float> permuted;       // [layers, q_dim + kv_dim, dim] or empty
};
}  // namespace detail

//! Parses the text of a block drafter's `config.json` (`w` names it). Required: "hidden_size",
//! "intermediate_size", "num_attention_heads", "num_hidden_layers", "vocab_size", "block_size",
//! "target_layer_outputs", and "markov_rank" for DSpark; optional: "num_key_value_heads",
//! "head_dim", "rms_norm_eps", "rope_theta", "rope_style", "hidden_act" ("silu"), "rope_scaling"
//! (null), "architectures" ("DFlashDraftModel" or "DSparkDraftModel"), "base_model_name_or_path".
//! Throws `errc::bad_file` naming the key, `errc::unsupported` for a valid value this library
//! cannot run.
[[nodiscard]] inline block_drafter_config parse_block_drafter_config(std::string_view text,
                                                                     std::string const& w) {
  nlohmann::json const j = detail::config_object(text, w);
  constexpr std::int64_t big = std::int64_t{1} << 24;
  block_drafter_config c;
  if (auto const it = j.find("architectures"); it != j.end() && !it->is_null()) {
    SPECDEC_CHECK(it->is_array(), bad_file, w, ": \"architectures\" must be an array of strings");
    for (auto const& a : *it) {
      SPECDEC_CHECK(a.is_string(), bad_file, w, ": \"architectures\" must be an array of strings");
      c.dspark = c.dspark || a.get_ref<std::string const&>().find("DSpark") != std::string::npos;
    }
  }
  detail::llama_layer_keys const k = detail::config_llama_layer(j, w, max_eagle_heads);
  c.hidden_size = k.hidden_size;
  c.intermediate_size = k.intermediate_size;
  c.num_heads = k.num_heads;
  c.num_kv_heads = k.num_kv_heads;
  c.head_dim = k.head_dim;
  c.rms_eps = k.rms_eps;
  c.rope_theta = k.rope_theta;
  c.rope_interleaved = k.rope_interleaved;
  c.num_layers = detail::config_count(j, "num_hidden_layers", 1, 256, w, std::nullopt);
  c.vocab_size = detail::config_count(j, "vocab_size", 1, big, w, std::nullopt);
  c.block_size = detail::config_count(j, "block_size", 2, 64, w, std::nullopt);
  c.markov_rank =
      c.dspark ? detail::config_count(j, "markov_rank", 1, 4096, w, std::nullopt) : std::size_t{0};
  auto const it = j.find("target_layer_outputs");
  SPECDEC_CHECK(it != j.end(), bad_file, w, ": missing \"target_layer_outputs\"");
  SPECDEC_CHECK(it->is_array() && !it->empty() && it->size() <= 16, bad_file, w,
                ": \"target_layer_outputs\" must be an array of 1 to 16 layer indices, got ",
                it->dump());
  for (auto const& l : *it) {
    SPECDEC_CHECK(
        l.is_number_integer() && l.get<std::int64_t>() >= 0 && l.get<std::int64_t>() < 4096,
        bad_file, w, ": \"target_layer_outputs\" holds ", l.dump(),
        ", not a layer index in [0, 4096)");
    c.target_layers.push_back(static_cast<std::int32_t>(l.get<std::int64_t>()));
  }
  c.base_model = detail::config_string(j, "base_model_name_or_path", w, "");
  return c;
}

//! Reads the block drafter `config.json` at `path` (see `parse_block_drafter_config`).
[[nodiscard]] inline block_drafter_config read_block_drafter_config(
    std::filesystem::path const& path) {
  return parse_block_drafter_config(detail::read_text_file(path), path.string());
}

//! Loads a block drafter from `file` with `config` for `target` (shared: the drafter reads its
//! embedding and classifier). Throws `errc::bad_file` naming the tensor for a missing, unexpected
//! or misshapen tensor, `errc::invalid_argument` when the config disagrees with the target (dim,
//! vocabulary, layers), `errc::unsupported` for a tensor type other than F32 / F16 / BF16.
[[nodiscard]] inline block_drafter_weights load_block_drafter(
    safetensors_file const& file, block_drafter_config const& config,
    std::shared_ptr<llama_weights const> target) {
  std::string const& where = file.where();
  SPECDEC_CHECK(
      target != nullptr && target->token_embedding != nullptr && target->classifier != nullptr,
      invalid_argument, where, ": a block drafter needs the target's weights");
  auto const dim = static_cast<std::size_t>(target->config.dim);
  auto const vocab = static_cast<std::size_t>(target->config.vocab_size);
  SPECDEC_CHECK(config.hidden_size == dim, invalid_argument, where, ": \"hidden_size\" is ",
                config.hidden_size, " but the target's dim is ", dim);
  SPECDEC_CHECK(config.vocab_size == vocab, invalid_argument, where, ": \"vocab_size\" is ",
                config.vocab_size, " but the target's vocabulary has ", vocab, " tokens");
  for (std::int32_t l : config.target_layers)
    SPECDEC_CHECK(l < target->config.n_layers, invalid_argument, where,
                  ": \"target_layer_outputs\" names layer ", l, " but the target has ",
                  target->config.n_layers, " layers");
  block_drafter_weights w;
  w.config = config;
  w.dim = dim;
  w.vocab = vocab;
  w.target = target;
  w.embedding = target->token_embedding;
  w.classifier = target->classifier;
  auto const u = [](std::size_t v) { return static_cast<std::uint64_t>(v); };
  std::uint64_t const d = u(dim), q = u(config.q_dim()), kv = u(config.kv_dim()),
                      inner = u(config.intermediate_size);
  detail::head_tensor_loader loader(file);
  loader.want("fc.weight", {d, u(w.feature_width())},
              "[dim, " + std::to_string(config.target_layers.size()) + " dim] (the fused features)",
              &w.fc);
  loader.want("hidden_norm.weight", {d}, "[dim]", &w.hidden_norm);
  loader.want("mask_embedding", {d}, "[dim]", &w.mask_embedding);
  w.layers.resize(config.num_layers);
  for (std::size_t l = 0; l < config.num_layers; ++l) {
    block_drafter_layer& L = w.layers[l];
    std::string const p = "layers." + std::to_string(l) + ".";
    loader.want(p + "input_layernorm.weight", {d}, "[dim]", &L.input_norm);
    loader.want(p + "self_attn.q_proj.weight", {q, d}, "[heads x head_dim, dim]", &L.wq);
    loader.want(p + "self_attn.k_proj.weight", {kv, d}, "[kv heads x head_dim, dim]", &L.wk);
    loader.want(p + "self_attn.v_proj.weight", {kv, d}, "[kv heads x head_dim, dim]", &L.wv);
    loader.want(p + "self_attn.o_proj.weight", {d, q}, "[dim, heads x head_dim]", &L.wo);
    loader.want(p + "post_attention_layernorm.weight", {d}, "[dim]", &L.post_norm);
    loader.want(p + "mlp.gate_proj.weight", {inner, d}, "[intermediate, dim]", &L.w1);
    loader.want(p + "mlp.up_proj.weight", {inner, d}, "[intermediate, dim]", &L.w3);
    loader.want(p + "mlp.down_proj.weight", {d, inner}, "[dim, intermediate]", &L.w2);
  }
  loader.want("norm.weight", {d}, "[dim]", &w.norm);
  if (config.dspark) {
    std::uint64_t const r = u(config.markov_rank);
    loader.want("markov_head.in", {u(vocab), r}, "[vocab, markov_rank]", &w.markov_in);
    loader.want("markov_head.out", {u(vocab), r}, "[vocab, markov_rank]", &w.markov_out);
    loader.want("confidence_head.weight", {2 * d}, "[2 dim]", &w.confidence);
    loader.want("confidence_head.position_bias", {u(config.block_size - 1)}, "[block_size - 1]",
                &w.confidence_bias);
  }
  auto storage = std::make_shared<detail::block_drafter_storage>();
  storage->file = loader.finish();
  if (!config.rope_interleaved) {  // RoPE rows into the interleaved layout
    std::size_t const per = static_cast<std::size_t>((q + kv) * d);
    storage->permuted.resize(per * config.num_layers);
    for (std::size_t l = 0; l < config.num_layers; ++l) {
      float* const pq = storage->permuted.data() + l * per;
      float* const pk = pq + static_cast<std::size_t>(q * d);
      detail::interleave_rope_rows(w.layers[l].wq, config.num_heads, config.head_dim, dim, pq);
      detail::interleave_rope_rows(w.layers[l].wk, config.num_kv_heads, config.head_dim, dim, pk);
      w.layers[l].wq = pq;
      w.layers[l].wk = pk;
    }
  }
  w.storage = std::move(storage);
  return w;
}

//! Loads the block drafter in the directory `dir` (config.json + model.safetensors) for `target`,
//! the weights mapped or read (`access`; a mapped file must not change while it is used).
[[nodiscard]] inline block_drafter_weights load_block_drafter(
    std::filesystem::path const& dir, std::shared_ptr<llama_weights const> target,
    file_access access = file_access::map) {
  block_drafter_config const c = read_block_drafter_config(dir / block_drafter_config_file);
  return load_block_drafter(safetensors_file(dir / block_drafter_weights_file, access), c,
                            std::move(target));
}

}  // namespace specdec
