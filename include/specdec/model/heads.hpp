#pragma once
//! \file
//! Medusa and Hydra draft heads: what they compute and their float32 weights (`medusa_weights`,
//! `hydra_weights`), their configurations, random heads for tests and benchmarks, and a sparse
//! tree's paths (`tree_choices`). Reading and writing them as the reference repositories publish
//! them is model/heads_file.hpp's (the files are JSON and safetensors); this header needs only the
//! standard library.
//!
//! Medusa-1 head i (K heads, L residual blocks each), on the target's final hidden state h:
//! x = h; x = x + SiLU(W_il x + b_il) for l < L; logits_i = U_i x. Tensors `{i}.{l}.linear.weight`
//! [dim, dim], `{i}.{l}.linear.bias` [dim], `{i}.{L}.weight` [vocab, dim].
//!
//! Hydra head i (grounded MLP heads): u = concat(h, E[t_0], ..., E[t_i]) with t_0 the root and
//! t_1..t_i the drafted path, E the target's token embedding; x = R_i u + r_i + SiLU(A_i u + a_i);
//! x = x + SiLU(W_il x + b_il) for 1 <= l < L; logits_i = U_i x + c_i. Tensors
//! `hydra_mlp.{i}.0.linear.{weight,bias}` ([dim, (i + 2) dim], [dim]),
//! `hydra_mlp.{i}.0.res_connection.{weight,bias}` (the same shapes),
//! `hydra_mlp.{i}.{l}.linear.{weight,bias}` ([dim, dim], [dim]), `hydra_lm_head.{i}.{weight,bias}`
//! ([vocab, dim], [vocab]).

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "specdec/core/error.hpp"
#include "specdec/model/random.hpp"
#include "specdec/model/weight_storage.hpp"

namespace specdec {

//! The most heads and the most blocks per head a config may declare.
inline constexpr std::int64_t max_draft_heads = 64;
inline constexpr std::int64_t max_head_layers = 64;

//! What a Medusa `config.json` says (the reference's keys).
struct medusa_config {
  std::size_t num_heads = 0;    //!< "medusa_num_heads" (K), in [1, max_draft_heads]
  std::size_t num_layers = 0;   //!< "medusa_num_layers" (L), in [1, max_head_layers]
  std::size_t hidden_size = 0;  //!< "hidden_size" when present (must be the target's dim), else 0
  std::size_t vocab_size = 0;   //!< "vocab_size" when present (must be the target's), else 0
  std::string base_model;       //!< "base_model_name_or_path", or empty
};

//! What a Hydra `config.json` says (the reference's `HydraConfig` keys). Only the grounded MLP
//! heads on the final hidden state are supported.
struct hydra_config {
  std::size_t num_heads = 0;    //!< "hydra_num_heads" (K), in [1, max_draft_heads]
  std::size_t num_layers = 0;   //!< "hydra_num_layers" (L), in [1, max_head_layers]
  std::string head_arch;        //!< "hydra_head_arch": "mlp"
  bool grounded_heads = true;   //!< "grounded_heads": true
  std::size_t hidden_size = 0;  //!< "hidden_size" when present, else 0
  std::size_t vocab_size = 0;   //!< "vocab_size" when present, else 0
  std::string base_model;       //!< "base_model_name_or_path", or empty
};

//! One residual block of a head: x + SiLU(weight x + bias).
struct head_block {
  float const* weight = nullptr;  //!< [dim, dim] row-major [out, in]
  float const* bias = nullptr;    //!< [dim]
};

//! Medusa heads' float32 weights: pointers into `storage`.
struct medusa_weights {
  medusa_config config;
  std::size_t dim = 0;                  //!< the target's hidden size
  std::size_t vocab = 0;                //!< the target's vocabulary
  std::shared_ptr<void const> storage;  //!< keeps every pointer valid
  //! One Medusa head.
  struct head {
    std::vector<head_block> blocks;  //!< [num_layers]
    float const* lm_head = nullptr;  //!< [vocab, dim], no bias
  };
  std::vector<head> heads;  //!< [num_heads]
};

//! Hydra heads' float32 weights: pointers into `storage`.
struct hydra_weights {
  hydra_config config;
  std::size_t dim = 0;                  //!< the target's hidden size
  std::size_t vocab = 0;                //!< the target's vocabulary
  std::shared_ptr<void const> storage;  //!< keeps every pointer valid
  //! One Hydra head; head i reads (i + 2) dim inputs.
  struct head {
    float const* in_weight = nullptr;   //!< A_i, [dim, (i + 2) dim]
    float const* in_bias = nullptr;     //!< a_i, [dim]
    float const* res_weight = nullptr;  //!< R_i, [dim, (i + 2) dim]
    float const* res_bias = nullptr;    //!< r_i, [dim]
    std::vector<head_block> blocks;     //!< [num_layers - 1]
    float const* lm_head = nullptr;     //!< U_i, [vocab, dim]
    float const* lm_bias = nullptr;     //!< c_i, [vocab]
  };
  std::vector<head> heads;  //!< [num_heads]

  //! Inputs of head i: (i + 2) x dim.
  [[nodiscard]] std::size_t input_width(std::size_t i) const noexcept { return (i + 2) * dim; }
};

namespace detail {

//! Hands out consecutive tensors of one owned buffer, each filled with N(0, stddev^2) values from
//! its own Philox stream (the tensor's index), as `make_random_llama` fills a model.
class random_tensor_pool {
 public:
  random_tensor_pool(std::size_t floats, std::uint64_t seed, float stddev)
      : storage_(std::make_shared<weight_storage>()), seed_(seed), stddev_(stddev) {
    next_ = storage_->allocate(floats);
    end_ = next_ + floats;
  }
  //! The next `count` floats, filled.
  float const* take(std::size_t count) {
    SPECDEC_ASSERT(static_cast<std::size_t>(end_ - next_) >= count);
    float* const p = next_;
    fill_normal(std::span<float>(p, count), seed_, stream_++, stddev_);
    next_ += count;
    return p;
  }
  //! The owner of every tensor handed out.
  [[nodiscard]] std::shared_ptr<void const> storage() const { return storage_; }

 private:
  std::shared_ptr<weight_storage> storage_;
  std::uint64_t seed_;
  float stddev_;
  std::uint64_t stream_ = 0;
  float* next_ = nullptr;
  float* end_ = nullptr;
};

}  // namespace detail

//! Medusa heads of random weights, every tensor N(0, stddev^2), for a target of hidden size `dim`
//! and `vocab` tokens: `num_heads` heads of `num_layers` blocks (benchmarks at real shapes, tests
//! of shapes no trained file has). Deterministic in `seed`.
[[nodiscard]] inline medusa_weights make_random_medusa_heads(std::size_t dim, std::size_t vocab,
                                                             std::size_t num_heads,
                                                             std::size_t num_layers,
                                                             std::uint64_t seed, float stddev) {
  SPECDEC_CHECK(dim > 0 && vocab > 0 && num_heads > 0 && num_layers > 0, invalid_argument,
                "make_random_medusa_heads: dim ", dim, ", vocab ", vocab, ", ", num_heads,
                " heads, ", num_layers, " layers");
  medusa_weights w;
  w.config.num_heads = num_heads;
  w.config.num_layers = num_layers;
  w.dim = dim;
  w.vocab = vocab;
  detail::random_tensor_pool pool(num_heads * (num_layers * (dim * dim + dim) + vocab * dim), seed,
                                  stddev);
  w.heads.resize(num_heads);
  for (auto& h : w.heads) {
    for (std::size_t l = 0; l < num_layers; ++l)
      h.blocks.push_back({pool.take(dim * dim), pool.take(dim)});
    h.lm_head = pool.take(vocab * dim);
  }
  w.storage = pool.storage();
  return w;
}

//! Hydra heads of random weights (see `make_random_medusa_heads`).
[[nodiscard]] inline hydra_weights make_random_hydra_heads(std::size_t dim, std::size_t vocab,
                                                           std::size_t num_heads,
                                                           std::size_t num_layers,
                                                           std::uint64_t seed, float stddev) {
  SPECDEC_CHECK(dim > 0 && vocab > 0 && num_heads > 0 && num_layers > 0, invalid_argument,
                "make_random_hydra_heads: dim ", dim, ", vocab ", vocab, ", ", num_heads,
                " heads, ", num_layers, " layers");
  hydra_weights w;
  w.config.num_heads = num_heads;
  w.config.num_layers = num_layers;
  w.config.head_arch = "mlp";
  w.dim = dim;
  w.vocab = vocab;
  std::size_t floats = 0;
  for (std::size_t i = 0; i < num_heads; ++i)
    floats += 2 * (dim * w.input_width(i) + dim) + (num_layers - 1) * (dim * dim + dim) +
              vocab * dim + vocab;
  detail::random_tensor_pool pool(floats, seed, stddev);
  w.heads.resize(num_heads);
  for (std::size_t i = 0; i < num_heads; ++i) {
    auto& h = w.heads[i];
    h.in_weight = pool.take(dim * w.input_width(i));
    h.in_bias = pool.take(dim);
    h.res_weight = pool.take(dim * w.input_width(i));
    h.res_bias = pool.take(dim);
    for (std::size_t l = 1; l < num_layers; ++l)
      h.blocks.push_back({pool.take(dim * dim), pool.take(dim)});
    h.lm_head = pool.take(vocab * dim);
    h.lm_bias = pool.take(vocab);
  }
  w.storage = pool.storage();
  return w;
}

//! A sparse tree's paths as tree.json holds them (the reference's `medusa_choices`): path
//! [k_1, ..., k_d] is the node at depth d whose token is rank k_d of head d - 1, under the node
//! [k_1, ..., k_{d-1}].
using tree_choices = std::vector<std::vector<std::int32_t>>;

//! The most paths a tree file may hold and the deepest path.
inline constexpr std::size_t max_tree_choices = 4095;
inline constexpr std::size_t max_tree_choice_depth = 64;

//! `choices` as tree-file text: one line, "[[0], [1], [0, 0]]", and a newline.
[[nodiscard]] inline std::string tree_choices_text(tree_choices const& choices) {
  std::string s = "[";
  for (std::size_t i = 0; i < choices.size(); ++i) {
    s += i == 0 ? "[" : ", [";
    for (std::size_t j = 0; j < choices[i].size(); ++j)
      s += (j == 0 ? "" : ", ") + std::to_string(choices[i][j]);
    s += "]";
  }
  return s + "]\n";
}

}  // namespace specdec
