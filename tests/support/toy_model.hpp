#pragma once
// A tiny deterministic causal language model for fast decoder and proposer tests.
//
// The logits of a token are a fixed pseudo-random function of the token and the token visible at
// the previous position (its "context"), so they depend on what the batch mask lets it see and on
// what the cache holds. The cache stores (token, position) pairs and checks its invariants: entry
// i holds position i, truncate and keep_path validate their arguments, and every forward checks
// that each batch token sees exactly one token at the previous position -- so wrong positions,
// masks or cache commits throw instead of passing unnoticed.
//
// `skip_layers` in a request perturbs the logits (by `skip_noise` per skipped layer), which makes a
// layer-skipped forward a cheaper, imperfect draft of the full one; `noise` perturbs every row,
// which makes a second toy_lm an imperfect draft model of the first. Each cache entry remembers how
// many layers the forward that wrote it skipped, and a forward that reads an entry written with
// another skip set throws: entries of a layer-skipped draft must be dropped before a full forward.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "specdec/core/concepts.hpp"
#include "specdec/core/error.hpp"
#include "specdec/core/forward.hpp"
#include "specdec/core/philox.hpp"
#include "specdec/core/types.hpp"

namespace toy {

using specdec::position_t;
using specdec::token_id;

// A KV-like cache of (token, position) pairs.
class toy_cache {
 public:
  explicit toy_cache(std::size_t capacity) : capacity_(capacity) {
    tokens_.reserve(capacity);
    positions_.reserve(capacity);
    skipped_.reserve(capacity);
  }
  std::size_t size() const { return tokens_.size(); }
  std::size_t capacity() const { return capacity_; }
  void truncate(std::size_t n) {
    SPECDEC_CHECK(n <= size(), out_of_range, "toy_cache: truncate to ", n, " > size ", size());
    tokens_.resize(n);
    positions_.resize(n);
    skipped_.resize(n);
  }
  void keep_path(std::size_t n, std::span<std::int32_t const> keep) {
    SPECDEC_CHECK(n <= size(), out_of_range, "toy_cache: keep_path base ", n, " > size ", size());
    for (std::size_t i = 0; i < keep.size(); ++i) {
      SPECDEC_CHECK(keep[i] >= 0 && n + static_cast<std::size_t>(keep[i]) < size(), out_of_range,
                    "toy_cache: keep_path entry ", keep[i], " beyond the cache");
      SPECDEC_CHECK(i == 0 || keep[i - 1] < keep[i], invalid_argument,
                    "toy_cache: keep_path not ascending");
      std::size_t const from = n + static_cast<std::size_t>(keep[i]);
      SPECDEC_CHECK(positions_[from] == static_cast<position_t>(n + i), invalid_argument,
                    "toy_cache: keep_path moves position ", positions_[from], " to slot ", n + i);
      tokens_[n + i] = tokens_[from];
      positions_[n + i] = positions_[from];
      skipped_[n + i] = skipped_[from];
    }
    ++keep_path_calls;
    truncate(n + keep.size());
  }
  void push(token_id t, position_t p, std::size_t skipped = 0) {
    SPECDEC_CHECK(size() < capacity_, context_overflow, "toy_cache: full at ", capacity_);
    tokens_.push_back(t);
    positions_.push_back(p);
    skipped_.push_back(skipped);
  }
  std::span<token_id const> tokens() const { return tokens_; }
  std::span<position_t const> positions() const { return positions_; }
  // Layers skipped by the forward that wrote each entry.
  std::span<std::size_t const> skipped() const { return skipped_; }

  std::size_t keep_path_calls = 0;

 private:
  std::size_t capacity_;
  std::vector<token_id> tokens_;
  std::vector<position_t> positions_;
  std::vector<std::size_t> skipped_;
};

// Uniform in [0, 1) from a hash of (seed, a, b, c).
inline float hash_uniform(std::uint64_t seed, std::int64_t a, std::int64_t b, std::int64_t c) {
  std::uint64_t const stream = (static_cast<std::uint64_t>(a + 1) << 32) ^
                               static_cast<std::uint64_t>(b + 1) * 0x9E3779B97F4A7C15ull;
  return specdec::philox_uniform(seed, stream, static_cast<std::uint64_t>(c));
}

// The toy model (satisfies specdec::causal_lm).
class toy_lm {
 public:
  static constexpr bool supports_skip_layers = true;

  // vocab tokens, max_context positions; `peak` sharpens the distributions (larger = more
  // deterministic); `noise` perturbs every row (a draft of a toy_lm with the same seed).
  toy_lm(std::size_t vocab, std::size_t max_context, std::uint64_t seed = 7, float peak = 6.0f,
         float noise = 0.0f, float skip_noise = 1.5f)
      : vocab_(vocab),
        max_context_(max_context),
        seed_(seed),
        peak_(peak),
        noise_(noise),
        skip_noise_(skip_noise),
        cache_(max_context) {}

  std::size_t vocab_size() const { return vocab_; }
  std::size_t max_context() const { return max_context_; }
  std::size_t hidden_size() const { return 4; }
  toy_cache& cache() { return cache_; }
  toy_cache const& cache() const { return cache_; }

  // The logits after `cur` when the previous token is `prev` (-1 at position 0), with `skipped`
  // layers skipped.
  void logits_for(token_id prev, token_id cur, std::size_t skipped, std::span<float> out) const {
    for (std::size_t v = 0; v < vocab_; ++v) {
      float const u = hash_uniform(seed_, prev, cur, static_cast<std::int64_t>(v));
      float l = peak_ * u * u * u;
      float const extra = noise_ + skip_noise_ * static_cast<float>(skipped);
      if (extra != 0.0f)
        l += extra *
             (hash_uniform(seed_ + 1000 + skipped, prev, cur, static_cast<std::int64_t>(v)) - 0.5f);
      out[v] = l;
    }
  }

  void forward(specdec::forward_request const& req, specdec::forward_result& out) {
    req.validate(vocab_, max_context_);
    std::size_t const n = req.tokens.size();
    SPECDEC_CHECK(cache_.size() + n <= cache_.capacity(), context_overflow,
                  "toy_lm: ", cache_.size(), " + ", n, " positions exceed the cache of ",
                  cache_.capacity());
    std::size_t const skipped = req.skip_layers.size();
    std::size_t const rows = req.logits_rows.empty() ? n : req.logits_rows.size();
    out.vocab = vocab_;
    out.logits_count = rows;
    out.logits.resize(rows * vocab_);
    out.hidden_size = 4;
    if (req.want_hidden)
      out.hidden.resize(n * 4);
    else
      out.hidden.clear();
    out.layer_hidden.clear();
    std::size_t const base = cache_.size();
    prev_.resize(n);
    for (std::size_t i = 0; i < n; ++i) {
      position_t const pos = req.positions[i];
      SPECDEC_CHECK(static_cast<std::size_t>(pos) >= base, invalid_argument, "toy_lm: batch token ",
                    i, " at position ", pos, " overlaps the cache of ", base);
      token_id prev = -1;
      std::size_t seen = 0;
      if (pos > 0) {
        for (std::size_t j = 0; j < n; ++j)
          if (j != i && req.visible(i, j) && req.positions[j] == pos - 1) {
            prev = req.tokens[j];
            ++seen;
          }
        if (static_cast<std::size_t>(pos - 1) < base) {
          SPECDEC_CHECK(cache_.positions()[static_cast<std::size_t>(pos - 1)] == pos - 1, internal,
                        "toy_lm: cache entry ", pos - 1, " holds another position");
          std::size_t const written = cache_.skipped()[static_cast<std::size_t>(pos - 1)];
          SPECDEC_CHECK(written == 0 || written == skipped, internal, "toy_lm: a forward skipping ",
                        skipped, " layers reads cache entry ", pos - 1, ", written skipping ",
                        written);
          prev = cache_.tokens()[static_cast<std::size_t>(pos - 1)];
          ++seen;
        }
      }
      SPECDEC_CHECK(pos == 0 || seen == 1, invalid_argument, "toy_lm: batch token ", i,
                    " at position ", pos, " sees ", seen, " tokens at the previous position");
      for (std::size_t j = 0; j < n; ++j)
        SPECDEC_CHECK(j == i || !req.visible(i, j) || req.positions[j] < pos, invalid_argument,
                      "toy_lm: batch token ", i, " sees a token at a later position");
      prev_[i] = prev;
      if (req.want_hidden) {
        out.hidden[i * 4 + 0] = static_cast<float>(req.tokens[i]);
        out.hidden[i * 4 + 1] = static_cast<float>(prev);
        out.hidden[i * 4 + 2] = static_cast<float>(pos);
        out.hidden[i * 4 + 3] = 1.0f;
      }
    }
    for (std::size_t r = 0; r < rows; ++r) {
      std::size_t const i =
          req.logits_rows.empty() ? r : static_cast<std::size_t>(req.logits_rows[r]);
      logits_for(prev_[i], req.tokens[i], req.skip_layers.size(),
                 std::span<float>(out.logits.data() + r * vocab_, vocab_));
    }
    for (std::size_t i = 0; i < n; ++i) cache_.push(req.tokens[i], req.positions[i], skipped);
    ++forwards;
    tokens_scored += n;
  }

  std::size_t forwards = 0;       // forward calls
  std::size_t tokens_scored = 0;  // batch tokens over all forwards

 private:
  std::size_t vocab_;
  std::size_t max_context_;
  std::uint64_t seed_;
  float peak_;
  float noise_;
  float skip_noise_;
  toy_cache cache_;
  std::vector<token_id> prev_;
};

static_assert(specdec::kv_cache<toy_cache>);
static_assert(specdec::causal_lm<toy_lm>);

}  // namespace toy
