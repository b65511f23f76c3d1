#pragma once
//! \file
//! The Llama architecture's hyper-parameters and a read-only view of its float32 weights, as the
//! model readers (llama2.c, GGUF) produce them and the backends consume them.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "specdec/core/error.hpp"

namespace specdec {

//! Hyper-parameters of a Llama-architecture model.
struct llama_config {
  std::int32_t dim = 0;         //!< model width (residual stream)
  std::int32_t hidden_dim = 0;  //!< SwiGLU inner width
  std::int32_t n_layers = 0;
  std::int32_t n_heads = 0;     //!< query heads
  std::int32_t n_kv_heads = 0;  //!< key/value heads (grouped-query attention when < n_heads)
  std::int32_t vocab_size = 0;
  std::int32_t seq_len = 0;  //!< maximum context length
  float rope_theta = 10000.0f;
  float rms_eps = 1e-5f;
  bool shared_classifier = true;  //!< classifier tied to the token embedding

  [[nodiscard]] std::int32_t head_size() const noexcept { return n_heads > 0 ? dim / n_heads : 0; }
  [[nodiscard]] std::int32_t kv_dim() const noexcept { return n_kv_heads * head_size(); }

  //! Throws `errc::bad_file` (with `where`, e.g. the file name) unless the sizes are positive,
  //! consistent (heads divide dim, kv heads divide heads, even head size) and not absurd, and
  //! rope_theta and rms_eps finite and in range (`check_hyperparameter`).
  void validate(char const* where) const {
    auto const positive = [&](std::int32_t v, char const* name) {
      SPECDEC_CHECK(v > 0, bad_file, where, ": ", name, " is ", v, ", must be positive");
    };
    positive(dim, "dim");
    positive(hidden_dim, "hidden_dim");
    positive(n_layers, "n_layers");
    positive(n_heads, "n_heads");
    positive(n_kv_heads, "n_kv_heads");
    positive(vocab_size, "vocab_size");
    positive(seq_len, "seq_len");
    constexpr std::int32_t limit = 1 << 24;
    SPECDEC_CHECK(dim <= limit && hidden_dim <= limit && n_layers <= 4096 && n_heads <= 4096 &&
                      vocab_size <= limit && seq_len <= limit,
                  bad_file, where, ": absurd dimensions (dim ", dim, ", hidden_dim ", hidden_dim,
                  ", n_layers ", n_layers, ", n_heads ", n_heads, ", vocab_size ", vocab_size,
                  ", seq_len ", seq_len, ")");
    SPECDEC_CHECK(dim % n_heads == 0, bad_file, where, ": dim ", dim,
                  " is not a multiple of n_heads ", n_heads);
    SPECDEC_CHECK(n_kv_heads <= n_heads && n_heads % n_kv_heads == 0, bad_file, where, ": n_heads ",
                  n_heads, " is not a multiple of n_kv_heads ", n_kv_heads);
    SPECDEC_CHECK(head_size() % 2 == 0, bad_file, where, ": head size ", head_size(),
                  " is odd (RoPE rotates pairs)");
    check_hyperparameter(rope_theta, max_rope_theta, where, "rope_theta");
    check_hyperparameter(rms_eps, max_rms_eps, where, "rms_eps");
  }

  //! The RoPE base and the RMSNorm epsilon accepted: finite, positive and below these (real
  //! models use bases up to about 1e8 and epsilons of 1e-6 to 1e-5).
  static constexpr float max_rope_theta = 1e12f;
  static constexpr float max_rms_eps = 1.0f;

  //! Throws `errc::bad_file` naming `key` (and `where`) unless 0 < `value` < `max` (NaN and the
  //! infinities fail too: a model with them runs but produces nothing but one token).
  static void check_hyperparameter(float value, float max, std::string_view where,
                                   std::string_view key) {
    SPECDEC_CHECK(std::isfinite(value) && value > 0.0f && value < max, bad_file, where, ": ", key,
                  " is ", value, ", must be a finite number in (0, ", max, ")");
  }

  //! Number of float parameters (classifier counted once when shared).
  [[nodiscard]] std::size_t parameter_count() const noexcept {
    auto const d = static_cast<std::size_t>(dim), h = static_cast<std::size_t>(hidden_dim),
               l = static_cast<std::size_t>(n_layers), v = static_cast<std::size_t>(vocab_size),
               kv = static_cast<std::size_t>(kv_dim());
    std::size_t const per_layer = 2 * d + 2 * d * d + 2 * kv * d + 3 * h * d;
    return v * d + l * per_layer + d + (shared_classifier ? 0 : v * d);
  }
};

//! Pointers to one transformer layer's float32 weights. Matrices are row-major [out, in].
struct llama_layer_weights {
  float const* rms_att = nullptr;  //!< [dim]
  float const* wq = nullptr;       //!< [dim, dim]
  float const* wk = nullptr;       //!< [kv_dim, dim]
  float const* wv = nullptr;       //!< [kv_dim, dim]
  float const* wo = nullptr;       //!< [dim, dim]
  float const* rms_ffn = nullptr;  //!< [dim]
  float const* w1 = nullptr;       //!< [hidden_dim, dim] (gate)
  float const* w2 = nullptr;       //!< [dim, hidden_dim] (down)
  float const* w3 = nullptr;       //!< [hidden_dim, dim] (up)
};

//! A Llama model's float32 weights: pointers into `storage`, which owns them (a memory map or a
//! buffer of converted values). Read-only; share it (e.g. through std::shared_ptr) between models
//! that use the same weights. RoPE rotates interleaved pairs (2i, 2i+1) of each head, as in the
//! llama2.c and GGUF (llama) layouts.
struct llama_weights {
  llama_config config;
  std::shared_ptr<void const> storage;      //!< keeps the memory behind every pointer alive
  float const* token_embedding = nullptr;   //!< [vocab_size, dim]
  std::vector<llama_layer_weights> layers;  //!< [n_layers]
  float const* rms_final = nullptr;         //!< [dim]
  float const* classifier = nullptr;        //!< [vocab_size, dim]; == token_embedding when shared
};

namespace detail {

//! Throws `errc::invalid_argument` unless every pointer of `w` is set and its config is valid.
inline void check_complete(llama_weights const& w, char const* who) {
  w.config.validate(who);
  SPECDEC_CHECK(w.token_embedding && w.rms_final && w.classifier, invalid_argument, who,
                ": the weights have null tensors");
  SPECDEC_CHECK(w.layers.size() == static_cast<std::size_t>(w.config.n_layers), invalid_argument,
                who, ": ", w.layers.size(), " layers but the config says ", w.config.n_layers);
  for (std::size_t i = 0; i < w.layers.size(); ++i) {
    llama_layer_weights const& l = w.layers[i];
    SPECDEC_CHECK(l.rms_att && l.wq && l.wk && l.wv && l.wo && l.rms_ffn && l.w1 && l.w2 && l.w3,
                  invalid_argument, who, ": layer ", i, " has null tensors");
  }
}

}  // namespace detail

}  // namespace specdec
