#pragma once
// What the tools that write models (specdec-randmodel, specdec-widen) share: the shapes of real
// models they can be asked for by name, and the output formats (--format), written by the
// library's writers.

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

#include "cli.hpp"
#include "specdec/model/gguf.hpp"
#include "specdec/model/gguf_writer.hpp"
#include "specdec/model/llama2c.hpp"
#include "specdec/model/llama_weights.hpp"
#include "specdec/model/tokenizer.hpp"

namespace specdec_cli {

//! The shape of a real model (--preset).
struct model_preset {
  char const* name;
  std::int32_t dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len;
  bool tied;  // classifier shared with the token embedding, as in the real model
};

inline constexpr model_preset model_presets[] = {
    {"stories260K", 64, 172, 5, 8, 4, 512, 512, true},
    {"stories15M", 288, 768, 6, 6, 6, 32000, 256, true},
    {"stories42M", 512, 1376, 8, 8, 8, 32000, 1024, true},
    {"stories110M", 768, 2048, 12, 12, 12, 32000, 1024, true},
    {"tinyllama-1.1b", 2048, 5632, 22, 32, 4, 32000, 2048, false},
};

//! The names of the presets, for --help.
inline std::string model_preset_names() {
  std::string names;
  for (model_preset const& p : model_presets)
    names += (names.empty() ? "" : ", ") + std::string(p.name);
  return names;
}

//! The preset called `name`; throws usage_error for an unknown one.
inline model_preset const& find_model_preset(std::string_view name) {
  for (model_preset const& p : model_presets)
    if (name == p.name) return p;
  throw usage_error("unknown preset '" + std::string(name) + "' (one of " + model_preset_names() +
                    ")");
}

//! --format's help.
inline constexpr char const* model_format_help =
    "llama2c (legacy), llama2c-v1, llama2c-q8 (version 2, Q8_0), gguf-f32, gguf-f16, gguf-bf16 "
    "(default: gguf-f32 for a .gguf output, else llama2c)";

//! Declares a model-writing program's output options in `group`: -o/--output PATH (required by the
//! program), --format F and --tokenizer PATH (a vocabulary for a GGUF output; `tokenizer_help`).
inline void declare_model_output(CLI::App& app, std::string& output, std::string& format,
                                 std::string& tokenizer, std::string const& tokenizer_help,
                                 std::string const& group) {
  app.add_option("-o,--output", output, "the file to write (required)")
      ->type_name("PATH")
      ->group(group);
  app.add_option("--format", format, model_format_help)->type_name("F")->group(group);
  app.add_option("--tokenizer", tokenizer, tokenizer_help)->type_name("PATH")->group(group);
}

//! The format `format` names, or the default for the output `path` (see model_format_help);
//! throws usage_error for an unknown one.
inline std::string model_output_format(std::optional<std::string> const& format,
                                       std::filesystem::path const& path) {
  std::string const f = format ? *format : (path.extension() == ".gguf" ? "gguf-f32" : "llama2c");
  if (f != "llama2c" && f != "llama2c-v1" && f != "llama2c-q8" && f != "gguf-f32" &&
      f != "gguf-f16" && f != "gguf-bf16")
    throw usage_error("unknown format '" + f + "'");
  return f;
}

//! Whether `format` (model_output_format's) is a GGUF one.
inline bool is_gguf_format(std::string const& format) {
  return format.rfind("gguf-", 0) == 0;
}

//! Writes `w` to `path` in `format` (model_output_format's), with the vocabulary `vocab` when it
//! is a GGUF format and `vocab` is not null.
inline void write_model(std::filesystem::path const& path, specdec::llama_weights const& w,
                        std::string const& format, specdec::tokenizer const* vocab) {
  if (format == "llama2c") {
    specdec::write_llama2c(path, w, specdec::llama2c_format::legacy);
  } else if (format == "llama2c-v1") {
    specdec::write_llama2c(path, w, specdec::llama2c_format::v1);
  } else if (format == "llama2c-q8") {
    specdec::write_llama2c(path, w, specdec::llama2c_format::v2_q8_0);
  } else {
    auto const type = format == "gguf-f32"   ? specdec::gguf_type::f32
                      : format == "gguf-f16" ? specdec::gguf_type::f16
                                             : specdec::gguf_type::bf16;
    specdec::write_gguf(path, w, vocab, type);
  }
}

}  // namespace specdec_cli
