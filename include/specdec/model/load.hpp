#pragma once
//! \file
//! `load_model` and `load_tokenizer`: load a Llama model and its vocabulary from a llama2.c
//! checkpoint (+ tokenizer.bin) or a GGUF file (which embeds its vocabulary), choosing the reader
//! by the file's magic.

#include <climits>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <optional>

#include "specdec/core/error.hpp"
#include "specdec/model/gguf.hpp"
#include "specdec/model/llama2c.hpp"
#include "specdec/model/llama_weights.hpp"
#include "specdec/model/mapped_file.hpp"
#include "specdec/model/tokenizer.hpp"

namespace specdec {

//! The model file formats `load_model` recognises.
enum class model_format {
  llama2c,  //!< llama2.c checkpoint (legacy or "ak42" versioned)
  gguf,     //!< GGUF v2/v3
};

//! Detects the format of the model file at `path` from its first bytes: "GGUF" is GGUF, anything
//! else is taken for a llama2.c checkpoint (whose legacy form has no magic). Throws `errc::io`
//! when the file cannot be read.
[[nodiscard]] inline model_format detect_model_format(std::filesystem::path const& path) {
  auto const map = mapped_file::open(path);
  if (map->size() >= 4 && std::memcmp(map->data(), "GGUF", 4) == 0) return model_format::gguf;
  return model_format::llama2c;
}

//! Loads the Llama model at `path` (llama2.c or GGUF, chosen by magic), memory-mapped or read
//! into memory (`access`; see mapped_file.hpp for what mapping implies). See `load_llama2c` and
//! `load_gguf` for what each accepts and the errors they throw.
[[nodiscard]] inline llama_weights load_model(std::filesystem::path const& path,
                                              file_access access = file_access::map) {
  if (detect_model_format(path) == model_format::gguf) return load_gguf(path, access);
  return load_llama2c(path, access);
}

namespace detail {

//! The vocabulary size in a llama2.c checkpoint's header (without reading the tensors).
inline std::int32_t llama2c_vocab_size(std::filesystem::path const& path) {
  auto const map = mapped_file::open(path);
  byte_reader r(map->bytes(), path.string());
  std::uint64_t const at = r.read<std::uint32_t>("magic") == llama2c_magic ? 28 : 20;
  r.seek(at, "vocab_size");
  std::int32_t const v = r.read<std::int32_t>("vocab_size");
  SPECDEC_CHECK(v != 0 && v != INT_MIN, bad_file, path.string(), ": vocab_size ", v);
  return v < 0 ? -v : v;
}

}  // namespace detail

//! The vocabulary of the model at `model_path`. With `tokenizer_path`, that file is read: a GGUF
//! file's embedded vocabulary, or else a llama2.c tokenizer.bin holding the model's vocab_size
//! tokens. Without it, a GGUF model's embedded vocabulary is used, and for a llama2.c model the
//! file tokenizer.bin next to it (llama2.c's default name). Throws `errc::invalid_argument` when
//! no vocabulary can be found, `errc::bad_file` when its size differs from the model's, and the
//! readers' errors.
[[nodiscard]] inline tokenizer load_tokenizer(
    std::filesystem::path const& model_path,
    std::optional<std::filesystem::path> const& tokenizer_path = std::nullopt) {
  bool const model_is_gguf = detect_model_format(model_path) == model_format::gguf;
  std::int32_t model_vocab = 0;
  std::optional<gguf_file> model_gguf;
  if (model_is_gguf) {
    model_gguf.emplace(model_path);
    gguf_tensor_info const* embd = model_gguf->find_tensor("token_embd.weight");
    SPECDEC_CHECK(embd != nullptr && embd->ne[1] <= INT_MAX, bad_file, model_path.string(),
                  ": missing or malformed tensor 'token_embd.weight'");
    model_vocab = static_cast<std::int32_t>(embd->ne[1]);
  } else {
    model_vocab = detail::llama2c_vocab_size(model_path);
  }

  auto const checked = [&](tokenizer t, std::filesystem::path const& from) {
    SPECDEC_CHECK(t.vocab_size() == model_vocab, bad_file, from.string(), ": the vocabulary has ",
                  t.vocab_size(), " tokens but the model '", model_path.string(), "' has ",
                  model_vocab, " (a tokenizer of another model?)");
    return t;
  };
  if (tokenizer_path.has_value()) {
    if (detect_model_format(*tokenizer_path) == model_format::gguf) {
      return checked(tokenizer::from_gguf(gguf_file(*tokenizer_path)), *tokenizer_path);
    }
    // Every token of the file is read, then the sizes compared: a vocabulary of another size is
    // reported as such, naming both files, rather than as a truncated or overlong file.
    return checked(tokenizer::load_llama2c(*tokenizer_path), *tokenizer_path);
  }
  if (model_is_gguf) return checked(tokenizer::from_gguf(*model_gguf), model_path);
  auto const beside = model_path.parent_path() / "tokenizer.bin";
  SPECDEC_CHECK(std::filesystem::is_regular_file(beside), invalid_argument, model_path.string(),
                ": a llama2.c checkpoint has no embedded vocabulary and there is no ",
                beside.string(), "; pass the tokenizer's path");
  return checked(tokenizer::load_llama2c(beside), beside);
}

}  // namespace specdec
