#pragma once
//! \file
//! `write_medusa_heads`, `write_hydra_heads`: Medusa and Hydra heads written as their loaders
//! (model/heads.hpp) read them -- config.json and the heads' safetensors file, F32
//! (`write_safetensors`) -- for heads made or changed in memory (`widen_medusa_heads`,
//! `widen_hydra_heads`: model/widen.hpp).

#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <system_error>
#include <vector>

#include "specdec/core/error.hpp"
#include "specdec/model/binary_io.hpp"
#include "specdec/model/heads.hpp"
#include "specdec/model/heads_file.hpp"
#include "specdec/model/safetensors.hpp"

namespace specdec {

namespace detail {

//! Writes `j` (pretty-printed, a newline after it) to `path`; throws `errc::io`.
inline void write_json_file(std::filesystem::path const& path, nlohmann::ordered_json const& j) {
  std::string const text = j.dump(2) + "\n";
  binary_writer out(path);
  out.write_bytes(text.data(), text.size());
  out.close();
}

//! Writes heads: `tensors` as `file` and `config` as config.json into `dir` (created when
//! missing); `who` names the caller in errors (`errc::io`).
inline void write_heads_dir(std::filesystem::path const& dir, char const* file,
                            std::span<safetensors_output const> tensors,
                            nlohmann::ordered_json const& config, char const* who) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  SPECDEC_CHECK(!ec, io, who, ": cannot create '", dir.string(), "': ", ec.message());
  write_safetensors(dir / file, tensors);
  write_json_file(dir / heads_config_file, config);
}

//! The sizes and base model every heads config.json states.
inline void put_sizes(nlohmann::ordered_json& j, std::size_t dim, std::size_t vocab,
                      std::string const& base_model) {
  if (!base_model.empty()) j["base_model_name_or_path"] = base_model;
  j["hidden_size"] = dim;
  j["vocab_size"] = vocab;
}

}  // namespace detail

//! Writes `w` into the directory `dir` (created when missing) as `load_medusa_heads` reads it:
//! config.json (with `w`'s dim and vocabulary) and medusa_lm_head.safetensors (F32). Throws
//! `errc::io` when they cannot be written.
inline void write_medusa_heads(std::filesystem::path const& dir, medusa_weights const& w) {
  nlohmann::ordered_json j;
  j["medusa_num_heads"] = w.heads.size();
  j["medusa_num_layers"] = w.config.num_layers;
  detail::put_sizes(j, w.dim, w.vocab, w.config.base_model);
  std::vector<safetensors_output> t;
  auto const d = static_cast<std::uint64_t>(w.dim), v = static_cast<std::uint64_t>(w.vocab);
  for (std::size_t i = 0; i < w.heads.size(); ++i) {
    std::string const p = std::to_string(i) + ".";
    for (std::size_t l = 0; l < w.heads[i].blocks.size(); ++l) {
      head_block const& b = w.heads[i].blocks[l];
      std::string const n = p + std::to_string(l) + ".linear.";
      t.push_back({n + "weight", {d, d}, {b.weight, w.dim * w.dim}});
      t.push_back({n + "bias", {d}, {b.bias, w.dim}});
    }
    t.push_back({p + std::to_string(w.heads[i].blocks.size()) + ".weight",
                 {v, d},
                 {w.heads[i].lm_head, w.vocab * w.dim}});
  }
  detail::write_heads_dir(dir, medusa_heads_file, t, j, "write_medusa_heads");
}

//! Writes `w` into the directory `dir` (created when missing) as `load_hydra_heads` reads it:
//! config.json and hydra_lm_head.safetensors (F32). Throws `errc::io` when they cannot be written.
inline void write_hydra_heads(std::filesystem::path const& dir, hydra_weights const& w) {
  nlohmann::ordered_json j;
  j["hydra_num_heads"] = w.heads.size();
  j["hydra_num_layers"] = w.config.num_layers;
  j["hydra_head_arch"] = "mlp";
  j["grounded_heads"] = true;
  j["hidden_state_offset"] = 0;
  detail::put_sizes(j, w.dim, w.vocab, w.config.base_model);
  std::vector<safetensors_output> t;
  auto const d = static_cast<std::uint64_t>(w.dim), v = static_cast<std::uint64_t>(w.vocab);
  for (std::size_t i = 0; i < w.heads.size(); ++i) {
    hydra_weights::head const& h = w.heads[i];
    std::string const p = "hydra_mlp." + std::to_string(i) + ".";
    std::size_t const in = w.input_width(i);
    auto const in64 = static_cast<std::uint64_t>(in);
    t.push_back({p + "0.linear.weight", {d, in64}, {h.in_weight, w.dim * in}});
    t.push_back({p + "0.linear.bias", {d}, {h.in_bias, w.dim}});
    t.push_back({p + "0.res_connection.weight", {d, in64}, {h.res_weight, w.dim * in}});
    t.push_back({p + "0.res_connection.bias", {d}, {h.res_bias, w.dim}});
    for (std::size_t l = 0; l < h.blocks.size(); ++l) {
      std::string const n = p + std::to_string(l + 1) + ".linear.";
      t.push_back({n + "weight", {d, d}, {h.blocks[l].weight, w.dim * w.dim}});
      t.push_back({n + "bias", {d}, {h.blocks[l].bias, w.dim}});
    }
    std::string const lm = "hydra_lm_head." + std::to_string(i) + ".";
    t.push_back({lm + "weight", {v, d}, {h.lm_head, w.vocab * w.dim}});
    t.push_back({lm + "bias", {v}, {h.lm_bias, w.vocab}});
  }
  detail::write_heads_dir(dir, hydra_heads_file, t, j, "write_hydra_heads");
}

}  // namespace specdec
