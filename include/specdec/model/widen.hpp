#pragma once
//! \file
//! `widen_llama`: a Llama model's function in a larger shape (and `widen_medusa_heads`,
//! `widen_hydra_heads`: the heads that read its hidden state, for the widened model). A small
//! model's forward is compute-bound on a CPU (stories260K's weights are 1 MB) while a real model's
//! streams its weights, and speculation pays only in the second regime; the widened model keeps the
//! small model's outputs, and so its drafts' acceptance, while its forward reads and multiplies the
//! bytes of the large shape (the kernels do not skip zeros).
//!
//! How: every matrix is padded with zeros around its real block (the top-left corner: real rows
//! and columns first); the head size stays, so the real heads are the first ones, and the number
//! of key/value heads grows with the query heads in the same ratio, so that every real query head
//! keeps its key/value head; extra layers are appended with every weight zero (their attention and
//! feed-forward outputs are zero: the residual stream passes through them unchanged). The padded
//! coordinates of the residual stream stay zero, so an RMSNorm over the wider stream divides by
//! sqrt(old dim / new dim) times the old norm: its weights are scaled by sqrt(old dim / new dim)
//! and its epsilon by old dim / new dim, which leaves every normalised real coordinate as it was.
//! The results differ from the original's only by the rounding of longer sums (zeros added in
//! another order); formats that do not store the epsilon (llama2.c) read back the default one, a
//! difference of the order of the epsilon in the normalisation.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "specdec/core/error.hpp"
#include "specdec/model/heads.hpp"
#include "specdec/model/llama_weights.hpp"
#include "specdec/model/weight_storage.hpp"

namespace specdec {

//! The shape `widen_llama` pads a model to; 0 keeps the model's own value.
struct widen_shape {
  std::int32_t dim = 0;         //!< model width: a multiple of the head size
  std::int32_t hidden_dim = 0;  //!< SwiGLU inner width
  std::int32_t n_layers = 0;    //!< layers (the model's own first, then identities)
};

//! The configuration of `w.config` widened to `to` (see the file comment): throws
//! `errc::invalid_argument` when `to` is smaller than the model in any size, when its width is not
//! a multiple of the head size, or when its heads cannot keep the model's query/key-value ratio.
[[nodiscard]] inline llama_config widened_config(llama_config const& c, widen_shape const& to) {
  llama_config out = c;
  out.dim = to.dim == 0 ? c.dim : to.dim;
  out.hidden_dim = to.hidden_dim == 0 ? c.hidden_dim : to.hidden_dim;
  out.n_layers = to.n_layers == 0 ? c.n_layers : to.n_layers;
  SPECDEC_CHECK(out.dim >= c.dim && out.hidden_dim >= c.hidden_dim && out.n_layers >= c.n_layers,
                invalid_argument, "widen_llama: the shape (dim ", out.dim, ", hidden_dim ",
                out.hidden_dim, ", n_layers ", out.n_layers, ") is smaller than the model's (dim ",
                c.dim, ", hidden_dim ", c.hidden_dim, ", n_layers ", c.n_layers, ")");
  std::int32_t const hs = c.head_size();
  SPECDEC_CHECK(out.dim % hs == 0, invalid_argument, "widen_llama: dim ", out.dim,
                " is not a multiple of the model's head size ", hs);
  std::int32_t const group = c.n_heads / c.n_kv_heads;  // query heads per key/value head
  out.n_heads = out.dim / hs;
  SPECDEC_CHECK(out.n_heads % group == 0, invalid_argument, "widen_llama: dim ", out.dim, " gives ",
                out.n_heads, " heads of size ", hs, ", not a multiple of the model's ", group,
                " query heads per key/value head");
  out.n_kv_heads = out.n_heads / group;
  out.rms_eps = c.rms_eps * static_cast<float>(c.dim) / static_cast<float>(out.dim);
  // The same validation as a file's: absurd sizes, an epsilon scaled to 0.
  try {
    out.validate("widen_llama");
  } catch (error const& e) {
    throw error(errc::invalid_argument, e.what());
  }
  return out;
}

namespace detail {

//! Copies `src` ([src_rows, groups * src_cols], the concatenation of `groups` inputs of src_cols
//! each) into `out` ([>= src_rows, groups * cols], zeros elsewhere) group by group: group g's block
//! at the top-left of column group g, so that each input is padded on its own.
inline void place_blocks(float const* src, std::size_t src_rows, std::size_t src_cols, float* out,
                         std::size_t cols, std::size_t groups = 1) noexcept {
  for (std::size_t r = 0; r < src_rows; ++r)
    for (std::size_t g = 0; g < groups; ++g)
      std::copy_n(src + (r * groups + g) * src_cols, src_cols, out + r * groups * cols + g * cols);
}

}  // namespace detail

//! `w` widened to `to` (see the file comment): a model of `widened_config(w.config, to)` whose
//! outputs are `w`'s up to rounding. Allocates the whole widened model (its
//! `parameter_count()` floats; `errc::out_of_memory` when they are not there).
[[nodiscard]] inline llama_weights widen_llama(llama_weights const& w, widen_shape const& to) {
  detail::check_complete(w, "widen_llama");
  llama_config const& c = w.config;
  llama_config const n = widened_config(c, to);
  auto const size = [](std::int32_t v) { return static_cast<std::size_t>(v); };
  std::size_t const d = size(c.dim), h = size(c.hidden_dim), kv = size(c.kv_dim()),
                    v = size(c.vocab_size);
  std::size_t const nd = size(n.dim), nh = size(n.hidden_dim), nkv = size(n.kv_dim());

  auto storage = std::make_shared<detail::weight_storage>();
  float* next = storage->allocate(n.parameter_count());
  auto const take = [&](std::size_t count) {
    std::span<float> const s(next, count);
    next += count;
    for (float& x : s) x = 0.0f;
    return s;
  };
  // A [rows, cols] matrix of zeros with `src` ([src_rows, src_cols], may be null: all zeros) in its
  // top-left corner.
  auto const matrix = [&](float const* src, std::size_t src_rows, std::size_t src_cols,
                          std::size_t rows, std::size_t cols) -> float const* {
    std::span<float> const out = take(rows * cols);
    if (src != nullptr) detail::place_blocks(src, src_rows, src_cols, out.data(), cols);
    return out.data();
  };
  float const norm_scale =
      static_cast<float>(std::sqrt(static_cast<double>(c.dim) / static_cast<double>(n.dim)));
  auto const norm = [&](float const* src) -> float const* {
    std::span<float> const out = take(nd);
    if (src != nullptr)
      for (std::size_t i = 0; i < d; ++i) out[i] = src[i] * norm_scale;
    return out.data();
  };

  llama_weights out;
  out.config = n;
  out.token_embedding = matrix(w.token_embedding, v, d, v, nd);
  out.layers.resize(size(n.n_layers));
  for (std::size_t l = 0; l < out.layers.size(); ++l) {
    llama_layer_weights const* src = l < w.layers.size() ? &w.layers[l] : nullptr;
    auto const from = [&](float const* llama_layer_weights::*m) {
      return src != nullptr ? src->*m : nullptr;
    };
    llama_layer_weights& o = out.layers[l];
    o.rms_att = norm(from(&llama_layer_weights::rms_att));
    o.wq = matrix(from(&llama_layer_weights::wq), d, d, nd, nd);
    o.wk = matrix(from(&llama_layer_weights::wk), kv, d, nkv, nd);
    o.wv = matrix(from(&llama_layer_weights::wv), kv, d, nkv, nd);
    o.wo = matrix(from(&llama_layer_weights::wo), d, d, nd, nd);
    o.rms_ffn = norm(from(&llama_layer_weights::rms_ffn));
    o.w1 = matrix(from(&llama_layer_weights::w1), h, d, nh, nd);
    o.w2 = matrix(from(&llama_layer_weights::w2), d, h, nd, nh);
    o.w3 = matrix(from(&llama_layer_weights::w3), h, d, nh, nd);
  }
  out.rms_final = norm(w.rms_final);
  out.classifier = n.shared_classifier ? out.token_embedding : matrix(w.classifier, v, d, v, nd);
  SPECDEC_ASSERT(next == storage->owned.get() + storage->owned_size);
  out.storage = std::move(storage);
  return out;
}

namespace detail {

//! The buffers of widened head tensors (the heads' `storage`).
struct widened_tensors {
  std::vector<std::vector<float>> owned;  // a moved vector keeps its buffer: pointers stay valid

  //! [rows, groups * cols] zeros with `src` placed as `place_blocks` places it.
  float const* matrix(float const* src, std::size_t src_rows, std::size_t src_cols,
                      std::size_t rows, std::size_t cols, std::size_t groups = 1) {
    std::vector<float>& out = owned.emplace_back(rows * groups * cols, 0.0f);
    place_blocks(src, src_rows, src_cols, out.data(), cols, groups);
    return out.data();
  }
};

//! Heads weights W (medusa_weights, hydra_weights) of `w`'s config and vocabulary at width `dim`,
//! with as many empty heads; throws `errc::invalid_argument` when `dim` is below `w`'s (`who`).
template <class W>
[[nodiscard]] W start_widened_heads(W const& w, std::size_t dim, char const* who) {
  SPECDEC_CHECK(dim >= w.dim, invalid_argument, who, ": dim ", dim, " is smaller than the heads' ",
                w.dim);
  W out;
  out.config = w.config;
  out.config.hidden_size = dim;
  out.dim = dim;
  out.vocab = w.vocab;
  out.heads.resize(w.heads.size());
  return out;
}

}  // namespace detail

//! Medusa heads for the target `widen_llama` makes of theirs at width `dim`: every matrix padded
//! with zeros around its real block, as the target's. The widened target's final hidden state
//! holds the original's in its first coordinates and zeros after them, so each residual block
//! keeps the padded coordinates zero and the heads' logits are the original heads' (up to the
//! rounding of longer sums), at the cost of heads of that width. Throws `errc::invalid_argument`
//! when `dim` is below the heads' width.
[[nodiscard]] inline medusa_weights widen_medusa_heads(medusa_weights const& w, std::size_t dim) {
  auto out = detail::start_widened_heads(w, dim, "widen_medusa_heads");
  auto t = std::make_shared<detail::widened_tensors>();
  for (std::size_t i = 0; i < w.heads.size(); ++i) {
    for (head_block const& b : w.heads[i].blocks)
      out.heads[i].blocks.push_back(
          {t->matrix(b.weight, w.dim, w.dim, dim, dim), t->matrix(b.bias, 1, w.dim, 1, dim)});
    out.heads[i].lm_head = t->matrix(w.heads[i].lm_head, w.vocab, w.dim, w.vocab, dim);
  }
  out.storage = std::move(t);
  return out;
}

//! Hydra heads widened to `dim` as `widen_medusa_heads` widens Medusa heads; each input of a head
//! (the hidden state, then one token embedding per drafted token: the widened target's embeddings,
//! padded with zeros) is widened on its own, so head i reads (i + 2) dim inputs.
[[nodiscard]] inline hydra_weights widen_hydra_heads(hydra_weights const& w, std::size_t dim) {
  auto out = detail::start_widened_heads(w, dim, "widen_hydra_heads");
  auto t = std::make_shared<detail::widened_tensors>();
  for (std::size_t i = 0; i < w.heads.size(); ++i) {
    hydra_weights::head const& h = w.heads[i];
    hydra_weights::head& o = out.heads[i];
    std::size_t const inputs = i + 2;
    o.in_weight = t->matrix(h.in_weight, w.dim, w.dim, dim, dim, inputs);
    o.in_bias = t->matrix(h.in_bias, 1, w.dim, 1, dim);
    o.res_weight = t->matrix(h.res_weight, w.dim, w.dim, dim, dim, inputs);
    o.res_bias = t->matrix(h.res_bias, 1, w.dim, 1, dim);
    for (head_block const& b : h.blocks)
      o.blocks.push_back(
          {t->matrix(b.weight, w.dim, w.dim, dim, dim), t->matrix(b.bias, 1, w.dim, 1, dim)});
    o.lm_head = t->matrix(h.lm_head, w.vocab, w.dim, w.vocab, dim);
    o.lm_bias = t->matrix(h.lm_bias, 1, w.vocab, 1, w.vocab);
  }
  out.storage = std::move(t);
  return out;
}

}  // namespace specdec
