#pragma once
//! \file
//! EAGLE draft heads (Li et al., "EAGLE: Speculative Sampling Requires Rethinking Feature
//! Uncertainty", 2024; EAGLE-2, 2024; "EAGLE-3: Scaling up Inference Acceleration of Large
//! Language Models via Training-Time Test", 2025): what a head computes, its float32 weights
//! (`eagle_weights`), its configuration, one call of a head runner (`eagle_batch`) and heads of
//! random weights (`make_random_eagle_head`). Reading a head as the reference repository
//! (SafeAILab/EAGLE) lays it out is model/eagle_file.hpp's; this header needs only the standard
//! library.
//!
//! The head reads, for each committed token x_j, the target's feature f_j of that token paired
//! with the NEXT token x_{j+1}, at head position j (0-based). One decoder layer:
//! - EAGLE-1 (cnets1.py): u = fc([E(x_{j+1}), f_j]) (+ bias), a Llama layer without the input
//!   norm: h = u + Attn(u); out = h + MLP(post_norm(h)); logits = the target's classifier on out.
//!   f_j is the target's final hidden state (after its final RMSNorm), d = dim wide.
//! - EAGLE-3 (cnets.py): u = fc(f_j) with f_j the target's residual streams at three layers
//!   concatenated (3 dim wide); the attention reads [input_norm(E(x_{j+1})), hidden_norm(u)]
//!   (2 dim wide): h = u + Attn(...); out = h + MLP(post_norm(h)); logits = lm_head(norm(out))
//!   over a draft vocabulary, draft id i being target id i + d2t[i].
//! Deeper tree nodes feed the head's own output `out` in place of a target feature (EAGLE-3 then
//! skips fc, whose input is 3 dim wide; EAGLE-1 always applies it).

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "specdec/core/error.hpp"
#include "specdec/core/types.hpp"
#include "specdec/core/views.hpp"
#include "specdec/model/heads.hpp"
#include "specdec/model/llama_weights.hpp"
#include "specdec/model/random.hpp"
#include "specdec/model/weight_storage.hpp"

namespace specdec {

//! Which EAGLE head.
enum class eagle_version {
  eagle1,  //!< EAGLE-1 / EAGLE-2 (cnets1.py): fc over [embedding, final hidden], target LM head
  eagle3,  //!< EAGLE-3 (cnets.py): fc over three layers' features, own norm and LM head
};

//! What an EAGLE `config.json` says (Hugging Face Llama keys, as the reference's configs).
struct eagle_config {
  //! EAGLE-3 when "draft_vocab_size" is present or "architectures" names an Eagle3 model
  //! ("eagle_version", when present, must agree).
  eagle_version version = eagle_version::eagle1;
  std::size_t hidden_size = 0;        //!< "hidden_size": the target's dim
  std::size_t intermediate_size = 0;  //!< "intermediate_size": the MLP's inner width
  std::size_t num_heads = 0;          //!< "num_attention_heads"
  std::size_t num_kv_heads = 0;       //!< "num_key_value_heads" (default: num_heads)
  std::size_t head_dim = 0;           //!< "head_dim" (default: hidden_size / num_heads), even
  std::size_t vocab_size = 0;         //!< "vocab_size": the target's vocabulary
  std::size_t draft_vocab_size = 0;   //!< "draft_vocab_size" (EAGLE-3; default vocab_size)
  float rms_eps = 1e-6f;              //!< "rms_norm_eps" (default 1e-6, as Hugging Face's)
  float rope_theta = 10000.0f;        //!< "rope_theta" (default 10000)
  bool fc_bias = true;                //!< "bias" (EAGLE-1's fc bias; default true; EAGLE-3: none)
  //! "rope_style": "interleaved" (pairs (2i, 2i + 1), the backends' layout) or "rotate_half"
  //! (pairs (i, i + hs / 2), Hugging Face's: the default, permuted at load).
  bool rope_interleaved = false;
  //! EAGLE-3: the target layers whose INPUT the features are, in the order fc reads them:
  //! "eagle_aux_hidden_state_layer_ids" (vLLM's key and meaning, ids >= 1), or
  //! "eagle_layer_outputs" (the layers whose output is read) plus one; layer n means after the
  //! last layer, before the final norm. The reference's 2, n / 2, n - 3 when absent. Empty for
  //! EAGLE-1.
  std::vector<std::int32_t> eagle_layers;
  std::string base_model;  //!< "base_model_name_or_path", or empty

  //! The output widths of the attention: query heads x head_dim, kv heads x head_dim.
  [[nodiscard]] std::size_t q_dim() const noexcept { return num_heads * head_dim; }
  [[nodiscard]] std::size_t kv_dim() const noexcept { return num_kv_heads * head_dim; }
};

//! An EAGLE head's float32 weights for one target: pointers into `storage` (the file's tensors)
//! and into the target's weights (the token embedding, and EAGLE-1's classifier), kept alive by
//! `target`. Matrices are row-major [out, in].
struct eagle_weights {
  eagle_config config;
  std::size_t dim = 0;                          //!< the target's hidden size
  std::size_t vocab = 0;                        //!< the target's vocabulary
  std::size_t draft_vocab = 0;                  //!< rows of `lm_head` (vocab for EAGLE-1)
  std::shared_ptr<void const> storage;          //!< keeps every pointer into the file valid
  std::shared_ptr<llama_weights const> target;  //!< keeps the target's tensors valid
  float const* embedding = nullptr;    //!< [vocab, dim] (the file's embed_tokens, or the target's)
  float const* fc = nullptr;           //!< [dim, fc_width()]
  float const* fc_bias = nullptr;      //!< [dim] or null
  float const* input_norm = nullptr;   //!< [dim] (EAGLE-3) or null
  float const* hidden_norm = nullptr;  //!< [dim] (EAGLE-3) or null
  float const* wq = nullptr;           //!< [q_dim, attention_width()], interleaved RoPE pairs
  float const* wk = nullptr;           //!< [kv_dim, attention_width()], interleaved RoPE pairs
  float const* wv = nullptr;           //!< [kv_dim, attention_width()]
  float const* wo = nullptr;           //!< [dim, q_dim]
  float const* post_norm = nullptr;    //!< [dim]
  float const* w1 = nullptr;           //!< [intermediate, dim] (gate)
  float const* w3 = nullptr;           //!< [intermediate, dim] (up)
  float const* w2 = nullptr;           //!< [dim, intermediate] (down)
  float const* norm = nullptr;         //!< [dim] (EAGLE-3) or null
  float const* lm_head = nullptr;      //!< [draft_vocab, dim]: EAGLE-3's own, EAGLE-1 the target's
  //! [draft_vocab] the target id of each draft id (EAGLE-3: i + d2t[i]); empty = the identity.
  std::vector<token_id> draft_to_target;
  //! The target layers whose residual stream (after that layer, 0-based: what
  //! `forward_request::hidden_layers` asks for) make up a feature, in fc's order; empty for
  //! EAGLE-1, which reads the final hidden state.
  std::vector<std::int32_t> target_layers;

  //! Width of a target feature row: dim (EAGLE-1) or target_layers.size() dim (EAGLE-3).
  [[nodiscard]] std::size_t feature_width() const noexcept {
    return config.version == eagle_version::eagle1 ? dim : target_layers.size() * dim;
  }
  //! Width of fc's input: 2 dim ([embedding, feature]) for EAGLE-1, the feature for EAGLE-3.
  [[nodiscard]] std::size_t fc_width() const noexcept {
    return config.version == eagle_version::eagle1 ? 2 * dim : feature_width();
  }
  //! Width of the attention's input: dim (EAGLE-1) or 2 dim (EAGLE-3).
  [[nodiscard]] std::size_t attention_width() const noexcept {
    return config.version == eagle_version::eagle1 ? dim : 2 * dim;
  }
};

//! One call of an EAGLE head runner (backend/cpu/eagle.hpp, backend/cuda/eagle.cuh): n rows, each
//! an input row paired with a token at a position, appended to the head's KV cache in order
//! (entries size() .. size() + n - 1), each attending to the cache entries its visibility allows.
struct eagle_batch {
  //! [n, feature_width()] the target's features (`from_target`), or [n, dim] outputs of the head
  //! itself (deeper tree nodes: the output of the node's parent).
  matrix_view<float const> inputs;
  bool from_target = true;  //!< whether `inputs` are target features (EAGLE-3 applies fc to them)
  std::span<token_id const> tokens;       //!< [n] the token paired with each row (< vocab)
  std::span<position_t const> positions;  //!< [n] each row's position (RoPE)
  //! Visibility with a mask: every row sees the cache entries [0, shared), then the entries
  //! shared + j whose bit j its mask row sets (j < size() - shared + n: row i is entry
  //! size() + i, and must see itself). Without a mask every row sees every entry before it
  //! (causal) and `shared` is ignored.
  std::size_t shared = 0;
  std::span<std::uint64_t const> mask = {};  //!< [n, mask_stride] bit-packed, or empty
  std::size_t mask_stride = 0;               //!< words per mask row

  //! Whether row i sees cache entry e (of a cache that held `size` entries before the batch).
  [[nodiscard]] bool visible(std::size_t i, std::size_t e, std::size_t size) const noexcept {
    if (mask.empty()) return e <= size + i;
    if (e < shared) return true;
    std::size_t const j = e - shared;
    return (mask[i * mask_stride + j / 64] >> (j % 64)) & 1u;
  }
};

//! The most query or kv heads, and the widest inner MLP, a config may declare.
inline constexpr std::int64_t max_eagle_heads = 4096;

namespace detail {

//! The storage of a loaded head: the file's tensors and the q / k rows permuted into the
//! interleaved RoPE layout.
struct eagle_storage {
  std::shared_ptr<void const> file;  //!< what `head_tensor_loader::finish` returned
  std::vector<float> permuted;       //!< [q_dim + kv_dim, attention_width] or empty
};

//! `w` [heads * hs, cols] with each head's rows reordered from the rotate_half pairs (i, i + hs/2)
//! to the interleaved pairs (2i, 2i + 1): row 2i of a head is row i, row 2i + 1 is row i + hs / 2.
inline void interleave_rope_rows(float const* w, std::size_t heads, std::size_t hs,
                                 std::size_t cols, float* out) {
  for (std::size_t h = 0; h < heads; ++h)
    for (std::size_t i = 0; i < hs / 2; ++i) {
      float const* const a = w + (h * hs + i) * cols;
      float const* const b = w + (h * hs + i + hs / 2) * cols;
      std::copy(a, a + cols, out + (h * hs + 2 * i) * cols);
      std::copy(b, b + cols, out + (h * hs + 2 * i + 1) * cols);
    }
}

//! The target layers (after-layer indices) an EAGLE-3 config reads, checked against a target of
//! `n_layers` layers: `eagle_config::eagle_layers` (input-of-layer indices in [1, n_layers]) minus
//! one, or the reference's (2, n / 2, n - 3) when absent.
[[nodiscard]] inline std::vector<std::int32_t> eagle_target_layers(eagle_config const& c,
                                                                   std::int32_t n_layers,
                                                                   std::string const& where) {
  std::vector<std::int32_t> in = c.eagle_layers;
  if (in.empty()) {
    SPECDEC_CHECK(n_layers >= 4, invalid_argument, where,
                  ": no EAGLE-3 layers in the config and a target of ", n_layers,
                  " layers, too few for the reference's layers (2, n / 2, n - 3)");
    in = {2, n_layers / 2, n_layers - 3};
  }
  std::vector<std::int32_t> out;
  for (std::int32_t l : in) {
    SPECDEC_CHECK(l >= 1 && l <= n_layers, invalid_argument, where,
                  ": the EAGLE-3 layers name the input of layer ", l, " but the target has ",
                  n_layers, " layers (inputs 1 to ", n_layers, " can be read)");
    out.push_back(l - 1);
  }
  return out;
}

}  // namespace detail

//! An EAGLE head of random weights for `target` (benchmarks at real shapes, tests of shapes no
//! trained file has): every matrix N(0, stddev^2), every norm weight 1, `heads` query heads and
//! `kv_heads` kv heads of dim / heads, an MLP of `intermediate` inner width; EAGLE-3 reads the
//! target's layers `layers` (input-of-layer indices, as `eagle_config::eagle_layers`) and drafts
//! over `draft_vocab` tokens spread evenly over the vocabulary (every vocab / draft_vocab-th id).
//! Deterministic in `seed`. Throws `errc::invalid_argument` for impossible shapes.
[[nodiscard]] inline eagle_weights make_random_eagle_head(
    eagle_version version, std::shared_ptr<llama_weights const> target, std::size_t heads,
    std::size_t kv_heads, std::size_t intermediate, std::size_t draft_vocab,
    std::vector<std::int32_t> layers, std::uint64_t seed, float stddev) {
  SPECDEC_CHECK(
      target != nullptr && target->token_embedding != nullptr && target->classifier != nullptr,
      invalid_argument, "make_random_eagle_head: no target weights");
  auto const dim = static_cast<std::size_t>(target->config.dim);
  auto const vocab = static_cast<std::size_t>(target->config.vocab_size);
  bool const e3 = version == eagle_version::eagle3;
  SPECDEC_CHECK(heads >= 1 && kv_heads >= 1 && heads % kv_heads == 0 && dim % heads == 0 &&
                    (dim / heads) % 2 == 0 && intermediate >= 1 &&
                    (!e3 || (draft_vocab >= 1 && draft_vocab <= vocab)),
                invalid_argument, "make_random_eagle_head: ", heads, " heads, ", kv_heads,
                " kv heads, intermediate ", intermediate, ", draft vocabulary ", draft_vocab,
                " for dim ", dim, " and vocabulary ", vocab);
  eagle_weights w;
  w.config.version = version;
  w.config.hidden_size = dim;
  w.config.intermediate_size = intermediate;
  w.config.num_heads = heads;
  w.config.num_kv_heads = kv_heads;
  w.config.head_dim = dim / heads;
  w.config.vocab_size = vocab;
  w.config.draft_vocab_size = e3 ? draft_vocab : vocab;
  w.config.rms_eps = target->config.rms_eps;
  w.config.rope_theta = target->config.rope_theta;
  w.config.fc_bias = !e3;
  w.config.rope_interleaved = true;
  w.config.eagle_layers = e3 ? std::move(layers) : std::vector<std::int32_t>{};
  w.dim = dim;
  w.vocab = vocab;
  w.draft_vocab = w.config.draft_vocab_size;
  w.target = target;
  if (e3)
    w.target_layers =
        detail::eagle_target_layers(w.config, target->config.n_layers, "make_random_eagle_head");
  std::size_t const q = w.config.q_dim(), kv = w.config.kv_dim(), att = w.attention_width();
  std::size_t floats = dim * w.fc_width() + (w.config.fc_bias ? dim : 0) + (q + 2 * kv) * att +
                       dim * q + 3 * intermediate * dim + (e3 ? w.draft_vocab * dim : 0);
  detail::random_tensor_pool pool(floats, seed, stddev);
  w.embedding = target->token_embedding;
  w.fc = pool.take(dim * w.fc_width());
  if (w.config.fc_bias) w.fc_bias = pool.take(dim);
  w.wq = pool.take(q * att);
  w.wk = pool.take(kv * att);
  w.wv = pool.take(kv * att);
  w.wo = pool.take(dim * q);
  w.w1 = pool.take(intermediate * dim);
  w.w3 = pool.take(intermediate * dim);
  w.w2 = pool.take(dim * intermediate);
  auto ones = std::make_shared<std::vector<float>>(4 * dim, 1.0f);
  w.post_norm = ones->data();
  if (e3) {
    w.input_norm = ones->data() + dim;
    w.hidden_norm = ones->data() + 2 * dim;
    w.norm = ones->data() + 3 * dim;
    w.lm_head = pool.take(w.draft_vocab * dim);
    w.draft_to_target.resize(w.draft_vocab);
    for (std::size_t i = 0; i < w.draft_vocab; ++i)
      w.draft_to_target[i] = static_cast<token_id>(i * vocab / w.draft_vocab);
    if (w.draft_vocab == vocab) w.draft_to_target.clear();
  } else {
    w.lm_head = target->classifier;
  }
  w.storage =
      std::make_shared<std::pair<std::shared_ptr<void const>, std::shared_ptr<std::vector<float>>>>(
          pool.storage(), std::move(ones));
  return w;
}

}  // namespace specdec
