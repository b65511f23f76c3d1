#pragma once
//! \file
//! Medusa and Hydra draft heads as the reference repositories publish them (FasterDecoding/Medusa,
//! zankner/Hydra): a directory with `config.json` and the heads' safetensors file, and optionally
//! `tree.json`, the sparse tree's paths (tools/heads/README.md is the contract of every file).
//! The config readers, the loaders (`load_medusa_heads`, `load_hydra_heads`) and the tree-file
//! reader and writer; what the heads compute is model/heads.hpp's.
//!
//! The loaders check every tensor against the config and the TARGET's dim and vocabulary: a
//! missing tensor, a tensor no head uses, a shape that disagrees, a config value of the wrong
//! type or out of its range all throw `specdec::error` naming the tensor (or the field) and the
//! file. F32 tensors are used in place in the file's memory map (or in its copy, when the file
//! was read into memory: `file_access::read`); F16 and BF16 ones are converted to float32 once.

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_set>
#include <utility>
#include <vector>

#include "specdec/core/error.hpp"
#include "specdec/model/binary_io.hpp"
#include "specdec/model/heads.hpp"
#include "specdec/model/llama_weights.hpp"
#include "specdec/model/safetensors.hpp"
#include "specdec/model/weight_storage.hpp"

namespace specdec {

//! The file names of a heads directory.
inline constexpr char const* heads_config_file = "config.json";
inline constexpr char const* heads_tree_file = "tree.json";
inline constexpr char const* medusa_heads_file = "medusa_lm_head.safetensors";
inline constexpr char const* hydra_heads_file = "hydra_lm_head.safetensors";

namespace detail {

//! The JSON object of a heads config (`where` names it; see `parse_json`).
[[nodiscard]] inline nlohmann::json config_object(std::string_view text, std::string const& where) {
  nlohmann::json j = parse_json(text, where);
  SPECDEC_CHECK(j.is_object(), bad_file, where, ": a config is a JSON object");
  return j;
}

//! The integer `key` of config `j` in [lo, hi]; `fallback` when absent (required when nullopt).
[[nodiscard]] inline std::size_t config_count(nlohmann::json const& j, char const* key,
                                              std::int64_t lo, std::int64_t hi,
                                              std::string const& where,
                                              std::optional<std::size_t> fallback) {
  auto const it = j.find(key);
  if (it == j.end()) {
    SPECDEC_CHECK(fallback.has_value(), bad_file, where, ": missing \"", key, "\"");
    return *fallback;
  }
  SPECDEC_CHECK(
      it->is_number_integer() && it->get<std::int64_t>() >= lo && it->get<std::int64_t>() <= hi,
      bad_file, where, ": \"", key, "\" must be an integer in [", lo, ", ", hi, "], got ",
      it->dump());
  return static_cast<std::size_t>(it->get<std::int64_t>());
}

//! The string `key` of config `j`, or `fallback` when absent.
[[nodiscard]] inline std::string config_string(nlohmann::json const& j, char const* key,
                                               std::string const& where, std::string fallback) {
  auto const it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  SPECDEC_CHECK(it->is_string(), bad_file, where, ": \"", key, "\" must be a string, got ",
                it->dump());
  return it->get<std::string>();
}

//! The boolean `key` of config `j`, or `fallback` when absent.
[[nodiscard]] inline bool config_bool(nlohmann::json const& j, char const* key,
                                      std::string const& where, bool fallback) {
  auto const it = j.find(key);
  if (it == j.end()) return fallback;
  SPECDEC_CHECK(it->is_boolean(), bad_file, where, ": \"", key, "\" must be true or false, got ",
                it->dump());
  return it->get<bool>();
}

//! The keys of a Hugging Face Llama config that a drafter's decoder layers share (EAGLE heads,
//! block drafters).
struct llama_layer_keys {
  std::size_t hidden_size = 0;        //!< "hidden_size" (required)
  std::size_t intermediate_size = 0;  //!< "intermediate_size" (required)
  std::size_t num_heads = 0;          //!< "num_attention_heads" (required)
  std::size_t num_kv_heads = 0;       //!< "num_key_value_heads" (default num_heads)
  std::size_t head_dim = 0;           //!< "head_dim" (default hidden_size / num_heads), even
  float rms_eps = 1e-6f;              //!< "rms_norm_eps" (default 1e-6, as Hugging Face's)
  float rope_theta = 10000.0f;        //!< "rope_theta" (default 10000)
  bool rope_interleaved = false;      //!< "rope_style" "interleaved" (default "rotate_half")
};

//! Reads the `llama_layer_keys` of config `j` (`w` names it), at most `max_heads` heads. Throws
//! `errc::bad_file` naming the key for a value of the wrong type or out of range,
//! `errc::unsupported` for another activation ("hidden_act") or RoPE scaling.
[[nodiscard]] inline llama_layer_keys config_llama_layer(nlohmann::json const& j,
                                                         std::string const& w,
                                                         std::int64_t max_heads) {
  constexpr std::int64_t big = std::int64_t{1} << 24;
  llama_layer_keys c;
  c.hidden_size = config_count(j, "hidden_size", 1, big, w, std::nullopt);
  c.intermediate_size = config_count(j, "intermediate_size", 1, big, w, std::nullopt);
  c.num_heads = config_count(j, "num_attention_heads", 1, max_heads, w, std::nullopt);
  c.num_kv_heads = config_count(j, "num_key_value_heads", 1, max_heads, w, c.num_heads);
  SPECDEC_CHECK(c.num_heads % c.num_kv_heads == 0, bad_file, w, ": \"num_attention_heads\" ",
                c.num_heads, " is not a multiple of \"num_key_value_heads\" ", c.num_kv_heads);
  c.head_dim = config_count(j, "head_dim", 2, big, w, c.hidden_size / c.num_heads);
  SPECDEC_CHECK(c.head_dim >= 2 && c.head_dim % 2 == 0, bad_file, w, ": the head size ", c.head_dim,
                " (\"head_dim\", or hidden_size / num_attention_heads) must be even");
  SPECDEC_CHECK(c.head_dim * c.num_heads <= static_cast<std::size_t>(big), bad_file, w,
                ": num_attention_heads x head_dim is absurd");
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
  std::string const rope = config_string(j, "rope_style", w, "rotate_half");
  SPECDEC_CHECK(rope == "rotate_half" || rope == "interleaved", bad_file, w, ": \"rope_style\" \"",
                rope, "\" is neither \"rotate_half\" nor \"interleaved\"");
  c.rope_interleaved = rope == "interleaved";
  std::string const act = config_string(j, "hidden_act", w, "silu");
  SPECDEC_CHECK(act == "silu", unsupported, w, ": \"hidden_act\" \"", act,
                "\" is not supported (only \"silu\")");
  if (auto const it = j.find("rope_scaling"); it != j.end())
    SPECDEC_CHECK(it->is_null(), unsupported, w, ": \"rope_scaling\" ", it->dump(),
                  " is not supported (only null)");
  return c;
}

//! Collects the tensors a loader expects, checks each one's shape and that the file holds no
//! other, then points into the file's map (aligned F32) or converts into one owned buffer.
class head_tensor_loader {
 public:
  explicit head_tensor_loader(safetensors_file const& file) : file_(file) {}

  //! Expects tensor `name` of shape `shape`; `role` says what the dimensions are (for messages).
  void want(std::string const& name, std::vector<std::uint64_t> shape, std::string_view role,
            float const** target) {
    safetensors_tensor const& t = file_.require(name);
    SPECDEC_CHECK(t.shape == shape, bad_file, file_.where(), ": tensor '", name, "' has shape ",
                  t.shape_text(), ", expected ", shape_text(shape), " = ", role);
    SPECDEC_CHECK(t.dtype == safetensors_dtype::f32 || t.dtype == safetensors_dtype::f16 ||
                      t.dtype == safetensors_dtype::bf16,
                  unsupported, file_.where(), ": tensor '", name, "' has dtype ",
                  to_string(t.dtype), ", which is not supported (F32, F16 and BF16 are)");
    mark_used(t);
    if (!in_place(t)) owned_ = checked_add(owned_, t.elements, file_.where(), "converted floats");
    wanted_.push_back({&t, target});
  }

  //! Expects tensor `name` of shape `shape` that the caller reads itself (an integer or BOOL
  //! tensor, `safetensors_file::read_integers`): checks its shape and marks it used.
  safetensors_tensor const& want_other(std::string const& name, std::vector<std::uint64_t> shape,
                                       std::string_view role) {
    safetensors_tensor const& t = file_.require(name);
    SPECDEC_CHECK(t.shape == shape, bad_file, file_.where(), ": tensor '", name, "' has shape ",
                  t.shape_text(), ", expected ", shape_text(shape), " = ", role);
    mark_used(t);
    wanted_.push_back({&t, nullptr});
    return t;
  }

  //! Throws `errc::bad_file` naming the first tensor of the file that was not expected, then
  //! fills every target pointer and returns the storage that keeps them valid.
  [[nodiscard]] std::shared_ptr<void const> finish() {
    for (safetensors_tensor const& t : file_.tensors())
      SPECDEC_CHECK(used_.contains(&t), bad_file, file_.where(), ": unexpected tensor '", t.name,
                    "' (shape ", t.shape_text(), "): no head of this configuration uses it");
    auto storage = std::make_shared<weight_storage>();
    storage->map = file_.file();
    float* next = owned_ > 0 ? storage->allocate(static_cast<std::size_t>(owned_)) : nullptr;
    for (auto const& [t, target] : wanted_) {
      if (target == nullptr) continue;  // read by the caller (`want_other`)
      if (in_place(*t)) {
        *target = reinterpret_cast<float const*>(t->data);
        continue;
      }
      auto const n = static_cast<std::size_t>(t->elements);
      file_.read(*t, std::span<float>(next, n));
      *target = next;
      next += n;
    }
    return storage;
  }

 private:
  struct wanted {
    safetensors_tensor const* tensor;
    float const** target;
  };

  // Records `t` as expected (once).
  void mark_used(safetensors_tensor const& t) {
    SPECDEC_CHECK(used_.insert(&t).second, internal, file_.where(), ": tensor '", t.name,
                  "' requested twice");
  }

  // Used in place: F32 at a float-aligned address inside a map (or copy) this file owns.
  [[nodiscard]] bool in_place(safetensors_tensor const& t) const noexcept {
    return file_.file() != nullptr && t.dtype == safetensors_dtype::f32 &&
           reinterpret_cast<std::uintptr_t>(t.data) % alignof(float) == 0;
  }

  static std::string shape_text(std::vector<std::uint64_t> const& shape) {
    safetensors_tensor t;
    t.shape = shape;
    return t.shape_text();
  }

  safetensors_file const& file_;
  std::vector<wanted> wanted_;
  std::unordered_set<safetensors_tensor const*> used_;  // the tensors of wanted_
  std::uint64_t owned_ = 0;
};

}  // namespace detail

//! Parses the text of a Medusa `config.json` (`w` names it in messages). Required:
//! "medusa_num_heads", "medusa_num_layers" (integers in range); optional: "hidden_size",
//! "vocab_size" (positive integers), "base_model_name_or_path" (a string); other keys are
//! ignored. Throws `errc::bad_file` naming the key and the file.
[[nodiscard]] inline medusa_config parse_medusa_config(std::string_view text,
                                                       std::string const& w) {
  nlohmann::json const j = detail::config_object(text, w);
  medusa_config c;
  c.num_heads = detail::config_count(j, "medusa_num_heads", 1, max_draft_heads, w, std::nullopt);
  c.num_layers = detail::config_count(j, "medusa_num_layers", 1, max_head_layers, w, std::nullopt);
  c.hidden_size = detail::config_count(j, "hidden_size", 1, std::int64_t{1} << 24, w, 0);
  c.vocab_size = detail::config_count(j, "vocab_size", 1, std::int64_t{1} << 24, w, 0);
  c.base_model = detail::config_string(j, "base_model_name_or_path", w, "");
  return c;
}

//! Reads the Medusa `config.json` at `path` (see `parse_medusa_config`).
[[nodiscard]] inline medusa_config read_medusa_config(std::filesystem::path const& path) {
  return parse_medusa_config(detail::read_text_file(path), path.string());
}

//! Parses the text of a Hydra `config.json` (`w` names it). Required: "hydra_num_heads",
//! "hydra_num_layers"; optional: "hydra_head_arch" (default "mlp"), "grounded_heads" (default
//! true), "hidden_state_offset" (default 0), "hidden_size", "vocab_size",
//! "base_model_name_or_path". Throws `errc::bad_file` for a malformed value and `errc::unsupported`
//! for a valid one other than the grounded MLP heads on the final hidden state ("prefix-mlp",
//! ungrounded heads, a nonzero hidden_state_offset).
[[nodiscard]] inline hydra_config parse_hydra_config(std::string_view text, std::string const& w) {
  nlohmann::json const j = detail::config_object(text, w);
  hydra_config c;
  c.num_heads = detail::config_count(j, "hydra_num_heads", 1, max_draft_heads, w, std::nullopt);
  c.num_layers = detail::config_count(j, "hydra_num_layers", 1, max_head_layers, w, std::nullopt);
  c.head_arch = detail::config_string(j, "hydra_head_arch", w, "mlp");
  c.grounded_heads = detail::config_bool(j, "grounded_heads", w, true);
  std::size_t const offset =
      detail::config_count(j, "hidden_state_offset", 0, std::int64_t{1} << 16, w, 0);
  c.hidden_size = detail::config_count(j, "hidden_size", 1, std::int64_t{1} << 24, w, 0);
  c.vocab_size = detail::config_count(j, "vocab_size", 1, std::int64_t{1} << 24, w, 0);
  c.base_model = detail::config_string(j, "base_model_name_or_path", w, "");
  SPECDEC_CHECK(c.head_arch == "mlp", unsupported, w, ": \"hydra_head_arch\" \"", c.head_arch,
                "\" is not supported (only \"mlp\": no prefix attention layer)");
  SPECDEC_CHECK(c.grounded_heads, unsupported, w,
                ": \"grounded_heads\" false is not supported (only sequentially dependent heads)");
  SPECDEC_CHECK(offset == 0, unsupported, w, ": \"hidden_state_offset\" ", offset,
                " is not supported (only 0, the final hidden state)");
  return c;
}

//! Reads the Hydra `config.json` at `path` (see `parse_hydra_config`).
[[nodiscard]] inline hydra_config read_hydra_config(std::filesystem::path const& path) {
  return parse_hydra_config(detail::read_text_file(path), path.string());
}

namespace detail {

//! Heads weights `W` (medusa_weights, hydra_weights) for `config` and the target, with one empty
//! head per configured head, after checking the config against the target: at least one head and
//! one layer, and its informative sizes, when present, equal to the target's.
template <class W, class Config>
[[nodiscard]] W start_heads(safetensors_file const& file, Config const& config,
                            std::size_t target_dim, std::size_t target_vocab) {
  std::string const& where = file.where();
  SPECDEC_CHECK(target_dim > 0 && target_vocab > 0, invalid_argument, where,
                ": heads for a target of dim ", target_dim, " and vocab ", target_vocab);
  SPECDEC_CHECK(config.num_heads >= 1 && config.num_layers >= 1, invalid_argument, where,
                ": a config needs at least one head and one layer");
  SPECDEC_CHECK(config.hidden_size == 0 || config.hidden_size == target_dim, invalid_argument,
                where, ": \"hidden_size\" is ", config.hidden_size, " but the target's dim is ",
                target_dim);
  SPECDEC_CHECK(config.vocab_size == 0 || config.vocab_size == target_vocab, invalid_argument,
                where, ": \"vocab_size\" is ", config.vocab_size,
                " but the target's vocabulary has ", target_vocab, " tokens");
  W w;
  w.config = config;
  w.dim = target_dim;
  w.vocab = target_vocab;
  w.heads.resize(config.num_heads);
  return w;
}

}  // namespace detail

//! Loads Medusa heads from `file` for a target of hidden size `target_dim` and `target_vocab`
//! tokens, with `config`. Throws `errc::bad_file` naming the tensor for a missing tensor, an
//! unexpected one or a wrong shape, `errc::invalid_argument` when the config's sizes disagree with
//! the target's, `errc::unsupported` for a tensor type other than F32 / F16 / BF16.
[[nodiscard]] inline medusa_weights load_medusa_heads(safetensors_file const& file,
                                                      medusa_config const& config,
                                                      std::size_t target_dim,
                                                      std::size_t target_vocab) {
  auto w = detail::start_heads<medusa_weights>(file, config, target_dim, target_vocab);
  auto const d = static_cast<std::uint64_t>(target_dim),
             v = static_cast<std::uint64_t>(target_vocab);
  detail::head_tensor_loader loader(file);
  for (std::size_t i = 0; i < config.num_heads; ++i) {
    auto& h = w.heads[i];
    h.blocks.resize(config.num_layers);
    std::string const p = std::to_string(i) + ".";
    for (std::size_t l = 0; l < config.num_layers; ++l) {
      std::string const b = p + std::to_string(l) + ".linear.";
      loader.want(b + "weight", {d, d}, "[dim, dim]", &h.blocks[l].weight);
      loader.want(b + "bias", {d}, "[dim]", &h.blocks[l].bias);
    }
    loader.want(p + std::to_string(config.num_layers) + ".weight", {v, d}, "[vocab, dim]",
                &h.lm_head);
  }
  w.storage = loader.finish();
  return w;
}

//! Loads Medusa heads from the directory `dir` (config.json + medusa_lm_head.safetensors) for the
//! target `target` (see the other overload). The heads file is mapped, or read into memory with
//! `file_access::read` (mapped_file.hpp: a mapped file must not change while the heads are used).
[[nodiscard]] inline medusa_weights load_medusa_heads(std::filesystem::path const& dir,
                                                      llama_config const& target,
                                                      file_access access = file_access::map) {
  medusa_config const c = read_medusa_config(dir / heads_config_file);
  return load_medusa_heads(safetensors_file(dir / medusa_heads_file, access), c,
                           static_cast<std::size_t>(target.dim),
                           static_cast<std::size_t>(target.vocab_size));
}

//! Loads Hydra heads from `file` (see `load_medusa_heads` for the errors).
[[nodiscard]] inline hydra_weights load_hydra_heads(safetensors_file const& file,
                                                    hydra_config const& config,
                                                    std::size_t target_dim,
                                                    std::size_t target_vocab) {
  auto w = detail::start_heads<hydra_weights>(file, config, target_dim, target_vocab);
  auto const d = static_cast<std::uint64_t>(target_dim),
             v = static_cast<std::uint64_t>(target_vocab);
  detail::head_tensor_loader loader(file);
  for (std::size_t i = 0; i < config.num_heads; ++i) {
    auto& h = w.heads[i];
    std::string const p = "hydra_mlp." + std::to_string(i) + ".";
    auto const in = static_cast<std::uint64_t>(w.input_width(i));
    std::string const in_role = "[dim, " + std::to_string(i + 2) + " dim] (head " +
                                std::to_string(i) + " reads h and " + std::to_string(i + 1) +
                                " token embeddings)";
    loader.want(p + "0.linear.weight", {d, in}, in_role, &h.in_weight);
    loader.want(p + "0.linear.bias", {d}, "[dim]", &h.in_bias);
    loader.want(p + "0.res_connection.weight", {d, in}, in_role, &h.res_weight);
    loader.want(p + "0.res_connection.bias", {d}, "[dim]", &h.res_bias);
    h.blocks.resize(config.num_layers - 1);
    for (std::size_t l = 1; l < config.num_layers; ++l) {
      std::string const b = p + std::to_string(l) + ".linear.";
      loader.want(b + "weight", {d, d}, "[dim, dim]", &h.blocks[l - 1].weight);
      loader.want(b + "bias", {d}, "[dim]", &h.blocks[l - 1].bias);
    }
    std::string const lm = "hydra_lm_head." + std::to_string(i) + ".";
    loader.want(lm + "weight", {v, d}, "[vocab, dim]", &h.lm_head);
    loader.want(lm + "bias", {v}, "[vocab]", &h.lm_bias);
  }
  w.storage = loader.finish();
  return w;
}

//! Loads Hydra heads from the directory `dir` (config.json + hydra_lm_head.safetensors), the heads
//! file mapped or read as `access` says (see `load_medusa_heads`).
[[nodiscard]] inline hydra_weights load_hydra_heads(std::filesystem::path const& dir,
                                                    llama_config const& target,
                                                    file_access access = file_access::map) {
  hydra_config const c = read_hydra_config(dir / heads_config_file);
  return load_hydra_heads(safetensors_file(dir / hydra_heads_file, access), c,
                          static_cast<std::size_t>(target.dim),
                          static_cast<std::size_t>(target.vocab_size));
}

//! Parses tree-file text (`where` names it in messages): a JSON array of at most
//! `max_tree_choices` arrays, each of 1 to `max_tree_choice_depth` integers in [0, 2^20). Throws
//! `errc::bad_file` naming the entry. The tree structure (every prefix present, no repeats) is
//! checked by `sparse_tree::from_choices` (propose/sparse_tree.hpp).
[[nodiscard]] inline tree_choices parse_tree_choices(std::string_view text,
                                                     std::string const& where) {
  nlohmann::json const j = detail::parse_json(text, where);
  SPECDEC_CHECK(j.is_array(), bad_file, where, ": a tree file is a JSON array of paths");
  SPECDEC_CHECK(j.size() <= max_tree_choices, bad_file, where, ": ", j.size(), " paths, more than ",
                max_tree_choices);
  tree_choices out;
  out.reserve(j.size());
  for (std::size_t i = 0; i < j.size(); ++i) {
    nlohmann::json const& path = j[i];
    SPECDEC_CHECK(path.is_array() && !path.empty() && path.size() <= max_tree_choice_depth,
                  bad_file, where, ": path ", i, " must be an array of 1 to ",
                  max_tree_choice_depth, " ranks, got ", path.dump());
    std::vector<std::int32_t> ranks;
    for (auto const& k : path) {
      SPECDEC_CHECK(k.is_number_integer() && k.get<std::int64_t>() >= 0 &&
                        k.get<std::int64_t>() < (std::int64_t{1} << 20),
                    bad_file, where, ": path ", i, " holds ", k.dump(),
                    ", not a rank (an integer in [0, 2^20))");
      ranks.push_back(static_cast<std::int32_t>(k.get<std::int64_t>()));
    }
    out.push_back(std::move(ranks));
  }
  return out;
}

//! Reads a tree file (see `parse_tree_choices`).
[[nodiscard]] inline tree_choices read_tree_choices(std::filesystem::path const& path) {
  return parse_tree_choices(detail::read_text_file(path), path.string());
}

//! Writes `choices` to `path` as a tree file. Throws `errc::io` when it cannot be written.
inline void write_tree_choices(std::filesystem::path const& path, tree_choices const& choices) {
  std::string const text = tree_choices_text(choices);
  detail::binary_writer out(path);
  out.write_bytes(text.data(), text.size());
  out.close();
}

}  // namespace specdec
