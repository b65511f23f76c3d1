#pragma once
//! \file
//! Block drafters: a whole block of draft tokens in one forward (DFlash, arXiv 2602.06036), with
//! DSpark's low-rank Markov head and confidence head (arXiv 2607.05147). What a drafter computes,
//! its configuration and its float32 weights (`block_drafter_weights`). Reading a drafter directory
//! (config.json + model.safetensors, tools/block/README.md) is model/block_drafter_file.hpp's;
//! this header needs only the standard library.
//!
//! Context row j, for each committed token x_j whose target feature f_j exists (the residual
//! streams after the layers the config names, side by side): c_j = rms(fc f_j, hidden_norm) at
//! position j. A block of B rows at positions t .. t + B - 1 drafts the B - 1 tokens after the
//! root x_t (the token the target chose last): row 0 holds E[x_t] (the target's embedding), rows
//! 1.. the learned mask embedding. Every decoder layer (Llama's, SwiGLU, RMSNorm, RoPE) lets each
//! block row attend to every context row and to every block row (no causal mask within the
//! block); the context rows' keys and values are that layer's projections of c_j. Row i >= 1's
//! logits rank x_{t+i}: the target's classifier on rms(h_i, norm).
//!
//! DSpark adds, for row i, the Markov bias markov_out (markov_in[prev]) over the vocabulary (prev:
//! the root for row 1, the token drafted at row i - 1 after; so a row's distribution depends on the
//! drafted prefix, drawn left to right) and the confidence sigmoid(w . [rms(h_i, norm), E[y_i]] +
//! position_bias[i - 1]) of the token y_i drafted at row i: the estimated probability that y_i is
//! accepted given the earlier rows were.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "specdec/core/types.hpp"
#include "specdec/model/llama_weights.hpp"

namespace specdec {

//! What a block drafter's `config.json` says.
struct block_drafter_config {
  //! DSpark: "architectures" names a DSpark model (the Markov and confidence heads are in the
  //! file); DFlash otherwise.
  bool dspark = false;
  std::size_t hidden_size = 0;        //!< "hidden_size": the target's dim
  std::size_t intermediate_size = 0;  //!< "intermediate_size"
  std::size_t num_heads = 0;          //!< "num_attention_heads"
  std::size_t num_kv_heads = 0;       //!< "num_key_value_heads" (default num_heads)
  std::size_t head_dim = 0;           //!< "head_dim" (default hidden_size / num_heads), even
  std::size_t num_layers = 0;         //!< "num_hidden_layers"
  std::size_t vocab_size = 0;         //!< "vocab_size": the target's
  std::size_t block_size = 0;         //!< "block_size": B, rows per block (B - 1 drafts), >= 2
  std::size_t markov_rank = 0;        //!< "markov_rank" (DSpark)
  float rms_eps = 1e-6f;              //!< "rms_norm_eps"
  float rope_theta = 10000.0f;        //!< "rope_theta"
  //! "rope_style": "interleaved" (the backends' pairs) or "rotate_half" (permuted at load).
  bool rope_interleaved = false;
  //! "target_layer_outputs": the target layers (0-based) whose output residual streams make a
  //! feature, in fc's column order.
  std::vector<std::int32_t> target_layers;
  std::string base_model;  //!< "base_model_name_or_path", or empty

  [[nodiscard]] std::size_t q_dim() const noexcept { return num_heads * head_dim; }
  [[nodiscard]] std::size_t kv_dim() const noexcept { return num_kv_heads * head_dim; }
};

//! One decoder layer of a block drafter (row-major [out, in] matrices, interleaved RoPE rows).
struct block_drafter_layer {
  float const* input_norm = nullptr;  //!< [dim]
  float const* wq = nullptr;          //!< [q_dim, dim]
  float const* wk = nullptr;          //!< [kv_dim, dim]
  float const* wv = nullptr;          //!< [kv_dim, dim]
  float const* wo = nullptr;          //!< [dim, q_dim]
  float const* post_norm = nullptr;   //!< [dim]
  float const* w1 = nullptr;          //!< [intermediate, dim] (gate)
  float const* w3 = nullptr;          //!< [intermediate, dim] (up)
  float const* w2 = nullptr;          //!< [dim, intermediate] (down)
};

//! A block drafter's float32 weights for one target: pointers into `storage` and into the
//! target's weights (its embedding and classifier), kept alive by `target`.
struct block_drafter_weights {
  block_drafter_config config;
  std::size_t dim = 0;                          //!< the target's hidden size
  std::size_t vocab = 0;                        //!< the target's vocabulary
  std::shared_ptr<void const> storage;          //!< keeps every pointer into the file valid
  std::shared_ptr<llama_weights const> target;  //!< keeps the target's tensors valid
  float const* embedding = nullptr;             //!< [vocab, dim] the target's
  float const* classifier = nullptr;            //!< [vocab, dim] the target's
  float const* fc = nullptr;                    //!< [dim, feature_width()]
  float const* hidden_norm = nullptr;           //!< [dim]
  float const* mask_embedding = nullptr;        //!< [dim]
  std::vector<block_drafter_layer> layers;
  float const* norm = nullptr;             //!< [dim]
  float const* markov_in = nullptr;        //!< [vocab, markov_rank] (DSpark), else null
  float const* markov_out = nullptr;       //!< [vocab, markov_rank] (DSpark), else null
  float const* confidence = nullptr;       //!< [2 dim] (DSpark), else null
  float const* confidence_bias = nullptr;  //!< [block_size - 1] (DSpark), else null

  //! Width of a target feature row: one dim per target layer.
  [[nodiscard]] std::size_t feature_width() const noexcept {
    return config.target_layers.size() * dim;
  }
  //! Drafts per block: B - 1.
  [[nodiscard]] std::size_t drafts() const noexcept { return config.block_size - 1; }
};

}  // namespace specdec
