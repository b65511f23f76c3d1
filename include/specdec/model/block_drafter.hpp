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
#include <utility>
#include <vector>

#include "specdec/core/error.hpp"
#include "specdec/core/types.hpp"
#include "specdec/model/heads.hpp"
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

//! A block drafter of random weights for `target` (benchmarks at real shapes, tests of shapes no
//! trained file has): `layers` decoder layers of the target's width with `heads` query heads over
//! `kv_heads`, an MLP of `intermediate`, blocks of `block` rows, the features of target layers
//! `target_layers`; DSpark's heads of rank `markov_rank` when it is > 0. Every matrix and the
//! mask embedding N(0, stddev^2), every norm weight 1. Deterministic in `seed`. Throws
//! `errc::invalid_argument` for impossible shapes.
[[nodiscard]] inline block_drafter_weights make_random_block_drafter(
    std::shared_ptr<llama_weights const> target, std::size_t layers, std::size_t heads,
    std::size_t kv_heads, std::size_t intermediate, std::size_t block,
    std::vector<std::int32_t> target_layers, std::size_t markov_rank, std::uint64_t seed,
    float stddev) {
  SPECDEC_CHECK(
      target != nullptr && target->token_embedding != nullptr && target->classifier != nullptr,
      invalid_argument, "make_random_block_drafter: no target weights");
  auto const dim = static_cast<std::size_t>(target->config.dim);
  auto const vocab = static_cast<std::size_t>(target->config.vocab_size);
  bool layers_ok = !target_layers.empty();
  for (std::int32_t l : target_layers)
    layers_ok = layers_ok && l >= 0 && l < target->config.n_layers;
  SPECDEC_CHECK(layers >= 1 && heads >= 1 && kv_heads >= 1 && heads % kv_heads == 0 &&
                    dim % heads == 0 && (dim / heads) % 2 == 0 && intermediate >= 1 && block >= 2 &&
                    block <= 64 && layers_ok,
                invalid_argument, "make_random_block_drafter: ", layers, " layers, ", heads,
                " heads, ", kv_heads, " kv heads, intermediate ", intermediate, ", block ", block,
                ", target layers outside the target's or none, for dim ", dim);
  block_drafter_weights w;
  block_drafter_config& c = w.config;
  c.dspark = markov_rank > 0;
  c.hidden_size = dim;
  c.intermediate_size = intermediate;
  c.num_heads = heads;
  c.num_kv_heads = kv_heads;
  c.head_dim = dim / heads;
  c.num_layers = layers;
  c.vocab_size = vocab;
  c.block_size = block;
  c.markov_rank = markov_rank;
  c.rms_eps = target->config.rms_eps;
  c.rope_theta = target->config.rope_theta;
  c.rope_interleaved = true;
  c.target_layers = std::move(target_layers);
  w.dim = dim;
  w.vocab = vocab;
  w.target = target;
  w.embedding = target->token_embedding;
  w.classifier = target->classifier;
  std::size_t const q = c.q_dim(), kv = c.kv_dim(), f = w.feature_width();
  std::size_t const per_layer = (q + 2 * kv) * dim + dim * q + 3 * intermediate * dim;
  std::size_t const floats = dim * f + dim + layers * per_layer +
                             (c.dspark ? 2 * vocab * markov_rank + 2 * dim + block - 1 : 0);
  detail::random_tensor_pool pool(floats, seed, stddev);
  auto ones = std::make_shared<std::vector<float>>((3 + 2 * layers) * dim, 1.0f);
  w.fc = pool.take(dim * f);
  w.mask_embedding = pool.take(dim);
  w.hidden_norm = ones->data();
  w.norm = ones->data() + dim;
  w.layers.resize(layers);
  for (std::size_t l = 0; l < layers; ++l) {
    block_drafter_layer& L = w.layers[l];
    L.input_norm = ones->data() + (2 + 2 * l) * dim;
    L.post_norm = ones->data() + (3 + 2 * l) * dim;
    L.wq = pool.take(q * dim);
    L.wk = pool.take(kv * dim);
    L.wv = pool.take(kv * dim);
    L.wo = pool.take(dim * q);
    L.w1 = pool.take(intermediate * dim);
    L.w3 = pool.take(intermediate * dim);
    L.w2 = pool.take(dim * intermediate);
  }
  if (c.dspark) {
    w.markov_in = pool.take(vocab * markov_rank);
    w.markov_out = pool.take(vocab * markov_rank);
    w.confidence = pool.take(2 * dim);
    w.confidence_bias = pool.take(block - 1);
  }
  w.storage =
      std::make_shared<std::pair<std::shared_ptr<void const>, std::shared_ptr<std::vector<float>>>>(
          pool.storage(), std::move(ones));
  return w;
}

}  // namespace specdec
