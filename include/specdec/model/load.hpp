#pragma once
//! \file
//! `load_model`: loads a Llama model from a llama2.c checkpoint or a GGUF file, choosing the
//! reader by the file's magic.

#include <cstdint>
#include <cstring>
#include <filesystem>

#include "specdec/core/error.hpp"
#include "specdec/model/llama2c.hpp"
#include "specdec/model/llama_weights.hpp"
#include "specdec/model/mapped_file.hpp"

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

//! Loads the Llama model at `path` (llama2.c or GGUF, chosen by magic). See `load_llama2c` and
//! `load_gguf` for what each accepts and the errors they throw.
[[nodiscard]] inline llama_weights load_model(std::filesystem::path const& path) {
  switch (detect_model_format(path)) {
    case model_format::gguf:
      SPECDEC_THROW(unsupported, path.string(), ": GGUF models are not supported yet");
    case model_format::llama2c:
      break;
  }
  return load_llama2c(path);
}

}  // namespace specdec
