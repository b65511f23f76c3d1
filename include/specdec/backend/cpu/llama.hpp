#pragma once
//! \file
//! `cpu_llama`: the Llama forward pass on the CPU, with tree attention over a contiguous KV cache.
//! Satisfies `causal_lm`. One topic (the model's forward, its caches and its weight layout)
//! needs more than 600 lines here; the kernels it calls live in their own headers.
//!
//! Its kernels, one body per topic in backend/cpu/kernels/ compiled per CPU target and called
//! through the table of the target active when the model is built (backend/cpu/kernels.hpp):
//! `gemm_nt` (large models), `packed_gemm` (small models), attention over a virtual sequence of
//! cache rows, RMSNorm / RoPE / SwiGLU. Every output is computed by a fixed sequence of operations
//! that depends only on the model's shape, never on the batch, the tile it lands in or the thread
//! that computes it (the CPU backend's batch invariance).

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "specdec/backend/cpu/aligned_floats.hpp"
#include "specdec/backend/cpu/attention.hpp"
#include "specdec/backend/cpu/elementwise.hpp"
#include "specdec/backend/cpu/kernels.hpp"
#include "specdec/backend/cpu/llama_sequence.hpp"
#include "specdec/backend/cpu/packed_gemm.hpp"
#include "specdec/backend/cpu/thread_pool.hpp"
#include "specdec/core/error.hpp"
#include "specdec/core/forward.hpp"
#include "specdec/core/types.hpp"
#include "specdec/detail/memory.hpp"
#include "specdec/kv/contiguous_cache.hpp"
#include "specdec/model/llama_weights.hpp"

namespace specdec {

//! A Llama-architecture causal language model on the CPU: RMSNorm, RoPE (interleaved pairs),
//! grouped-query attention, SwiGLU, tied or untied classifier, all float32.
//!
//! `forward` scores a batch of tokens against its own `contiguous_cache` with the request's
//! visibility mask (tree attention) and appends the batch's keys and values to the cache in batch
//! order. The weights are shared (read-only) and can back several models, each with its own
//! cache. One forward at a time per model.
//!
//! Several sequences at once: `forward` over `cpu_llama_segment`s scores each segment against its
//! own `cpu_llama_sequence` (made by `make_sequence`) in ONE pass over the weights: the rows of
//! every segment go through each layer's matrix products together, and attention runs per
//! sequence against its own cache. A sequence's rows come out bit for bit as a single-sequence
//! forward of the same request gives them (the kernels are batch-invariant), whatever else is in
//! the batch. `cpu_batched_llama` (backend/cpu/batched_llama.hpp) manages such sequences as slots.
//!
//! Memory that grows with the context (the KV cache, its transposed copy, the RoPE table, the
//! attention scratch) is allocated on demand: a forward that needs more positions than are held
//! grows them to at least twice as many (within `max_context()`), and `reserve` grows them ahead,
//! as the decoders do for a request's positions. Growing checks the memory it needs first and
//! throws `errc::out_of_memory` saying how much. Once the positions and the batch size in use are
//! held, a forward does not allocate.
class cpu_llama {
 public:
  //! Its forward honours `forward_request::skip_layers` (self-speculation).
  static constexpr bool supports_skip_layers = true;
  //! Its forward honours `forward_request::view` (a bounded view of the cache), per segment, and
  //! `forward_request::kv_scores` for a batch of one segment.
  static constexpr bool supports_kv_view = true;

  //! A model over `weights` (which must outlive nothing: the model shares ownership). Throws
  //! `errc::invalid_argument` for null weights, missing tensors or bad options, and
  //! `errc::bad_file` for an inconsistent configuration.
  explicit cpu_llama(std::shared_ptr<llama_weights const> weights, cpu_llama_options options = {})
      : weights_(std::move(weights)), kernels_(&detail::cpu::active_model_kernels()) {
    SPECDEC_CHECK(weights_ != nullptr, invalid_argument, "cpu_llama: null weights");
    detail::check_complete(*weights_, "cpu_llama");
    llama_config const& c = weights_->config;
    dim_ = static_cast<std::size_t>(c.dim);
    hidden_dim_ = static_cast<std::size_t>(c.hidden_dim);
    n_layers_ = static_cast<std::size_t>(c.n_layers);
    n_heads_ = static_cast<std::size_t>(c.n_heads);
    n_kv_heads_ = static_cast<std::size_t>(c.n_kv_heads);
    head_size_ = static_cast<std::size_t>(c.head_size());
    kv_dim_ = static_cast<std::size_t>(c.kv_dim());
    vocab_ = static_cast<std::size_t>(c.vocab_size);
    max_context_ =
        options.max_context == 0 ? static_cast<std::size_t>(c.seq_len) : options.max_context;
    SPECDEC_CHECK(max_context_ <= (std::size_t{1} << 24), invalid_argument,
                  "cpu_llama: max_context ", max_context_, " is beyond 2^24");
    if (options.pool != nullptr) {
      pool_ = std::move(options.pool);
    } else {
      SPECDEC_CHECK(options.threads >= 1 && options.threads <= 1024, invalid_argument,
                    "cpu_llama: threads is ", options.threads, ", need 1 to 1024");
      pool_ = thread_pool::shared(options.threads);
    }
    std::size_t const chunk = kernels_->value_chunk;
    if (chunk != 0 && head_size_ % chunk == 0)
      heads_per_task_ =
          std::max<std::size_t>(1, detail::cpu::max_value_accumulators / (head_size_ / chunk));
    heads_per_task_ = std::min(heads_per_task_, n_heads_);
    seq_ = make_sequence();  // allocates nothing yet
    segs_.reserve(1);
    if (detail::cpu::packed_llama::bytes(c) <= options.pack_limit)
      packed_ = detail::cpu::packed_llama::pack(*weights_, kernels_->width);
    grow(std::max<std::size_t>(1, options.batch_capacity));
  }

  cpu_llama(cpu_llama&&) noexcept = default;
  cpu_llama& operator=(cpu_llama&&) noexcept = default;
  cpu_llama(cpu_llama const&) = delete;
  cpu_llama& operator=(cpu_llama const&) = delete;
  ~cpu_llama() = default;

  //! Vocabulary size (logits per row).
  [[nodiscard]] std::size_t vocab_size() const noexcept { return vocab_; }
  //! Positions the cache can hold; every request position must be below it.
  [[nodiscard]] std::size_t max_context() const noexcept { return max_context_; }
  //! Positions the context buffers (KV cache, transposed copy, RoPE table) hold in memory now.
  [[nodiscard]] std::size_t reserved() const noexcept { return seq_.rows_; }

  //! Bytes the context buffers take for `positions` positions: the KV cache, its transposed copy
  //! (AVX-512 builds, heads of 8), the RoPE table and the attention scratch.
  [[nodiscard]] std::uint64_t context_bytes(std::size_t positions) const noexcept {
    return sequence_bytes(positions) + shared_bytes(positions);
  }

  //! Bytes a sequence's own buffers take for `positions` positions: its KV cache and its
  //! transposed copy (AVX-512 builds, heads of 8).
  [[nodiscard]] std::uint64_t sequence_bytes(std::size_t positions) const noexcept {
    std::uint64_t const rows = round_rows(positions);
    std::uint64_t const floats = transposed_heads() ? 2 * n_layers_ * kv_dim_ * rows : 0;
    return seq_.cache_.bytes_for(positions) + floats * sizeof(float);
  }

  //! Holds min(`positions`, max_context()) positions in memory (see the class comment), keeping
  //! the cache's contents. Checks the memory first and throws `errc::out_of_memory` ("a context
  //! of N positions needs X: ... but only Y is available"), changing nothing, when it is not there.
  void reserve(std::size_t positions) { reserve(seq_, positions); }

  //! `reserve` for `sequence` (made by `make_sequence`): its own buffers, and the model's buffers
  //! indexed by position (RoPE table, attention scratch), which serve every sequence and grow to
  //! at least twice as many positions when they grow. Throws `errc::invalid_argument` for a
  //! sequence of another shape.
  void reserve(cpu_llama_sequence& sequence, std::size_t positions) {
    check_sequence(sequence, "cpu_llama::reserve");
    positions = std::min(positions, max_context_);
    bool const grow_sequence = positions > sequence.rows_;
    bool const grow_shared = positions > shared_rows_;
    if (!grow_sequence && !grow_shared) return;
    std::size_t const shared_positions =
        grow_shared ? std::max(positions, std::min(max_context_, 2 * shared_rows_)) : shared_rows_;
    std::uint64_t const extra =
        (grow_sequence ? sequence_bytes(positions) - sequence_bytes(sequence.rows_) : 0) +
        (grow_shared ? shared_bytes(shared_positions) - shared_bytes(shared_rows_) : 0);
    detail::check_memory(
        extra, "cpu_llama",
        detail::concat("a context of ", positions, " positions (KV cache of ", n_layers_,
                       " layers x 2 x ", kv_dim_, " floats per position",
                       transposed_heads() ? ", kept twice" : "", ", RoPE table, scratch)"));
    if (grow_sequence) sequence.cache_.reserve(positions);
    detail::allocate_checked(extra, "cpu_llama", "the RoPE table and attention scratch", [&] {
      // Everything is allocated before anything changes.
      std::size_t const lcap = round_rows(positions);
      std::size_t const shared_cap = round_rows(shared_positions);
      std::size_t const per_thread = (transposed_heads() ? 1 : heads_per_task_) * shared_cap;
      std::vector<float> scores;
      if (grow_shared) scores.resize(pool_->size() * per_thread);
      detail::cpu::aligned_floats kt, vt;
      if (grow_sequence && transposed_heads()) {
        kt = detail::cpu::aligned_floats(n_layers_ * kv_dim_ * lcap);
        vt = detail::cpu::aligned_floats(n_layers_ * kv_dim_ * lcap);
      }
      if (grow_shared) {
        rope_.reserve(shared_positions * head_size_);
        grow_rope(shared_positions);
        scores_ = std::move(scores);
        scores_per_thread_ = per_thread;
        score_stride_ = shared_cap;
        shared_rows_ = shared_positions;
      }
      if (grow_sequence) {
        if (transposed_heads()) {
          // A new layout: the copies are refreshed from the cache by the next forward.
          sequence.kt_ = std::move(kt);
          sequence.vt_ = std::move(vt);
          sequence.transposed_rows_.assign(n_layers_, 0);
        }
        sequence.lcap_ = lcap;
        sequence.rows_ = positions;
      }
    });
  }

  //! A new sequence for this model (and every model of the same shape): an empty cache of
  //! `max_context()` positions, none held in memory yet.
  [[nodiscard]] cpu_llama_sequence make_sequence() const {
    cpu_llama_sequence s;
    s.cache_ = contiguous_cache(n_layers_, kv_dim_, max_context_);  // allocates nothing yet
    if (transposed_heads()) s.transposed_rows_.assign(n_layers_, 0);
    return s;
  }
  //! Width of the residual stream (hidden rows).
  [[nodiscard]] std::size_t hidden_size() const noexcept { return dim_; }
  //! Number of transformer layers.
  [[nodiscard]] std::size_t n_layers() const noexcept { return n_layers_; }
  //! Threads used by a forward.
  [[nodiscard]] std::size_t threads() const noexcept { return pool_->size(); }
  //! The model's hyper-parameters.
  [[nodiscard]] llama_config const& config() const noexcept { return weights_->config; }
  //! The shared weights.
  [[nodiscard]] std::shared_ptr<llama_weights const> const& weights() const noexcept {
    return weights_;
  }
  //! The thread pool (shareable with another model through `cpu_llama_options::pool`).
  [[nodiscard]] std::shared_ptr<thread_pool> const& pool() const noexcept { return pool_; }
  //! Whether the weights were repacked for the small-model kernels
  //! (`cpu_llama_options::pack_limit`).
  [[nodiscard]] bool packed() const noexcept { return !packed_.layers.empty(); }

  //! The KV cache: truncate / keep_path it to commit speculation.
  [[nodiscard]] contiguous_cache& cache() noexcept { return seq_.cache_; }
  //! The KV cache, read-only.
  [[nodiscard]] contiguous_cache const& cache() const noexcept { return seq_.cache_; }
  //! Empties the cache (a new sequence).
  void reset() noexcept { seq_.cache_.clear(); }

  //! Scores `req` against the cache, appends the batch's keys and values to it, and fills `out`
  //! (see `forward_request`, `forward_result`). Throws `specdec::error`, leaving the cache and
  //! `out` untouched, for a malformed request (`forward_request::validate`; a mask row that does
  //! not let a token see itself; hidden layers or skip_layers outside the model's layers; a
  //! `view` block past the cache's end) and `errc::context_overflow` when it cannot take the batch.
  void forward(forward_request const& req, forward_result& out) {
    cpu_llama_segment const one{&seq_, req};
    forward(std::span<cpu_llama_segment const>(&one, 1), out);
  }

  //! Scores several sequences in one pass over the weights (see the class comment): segment s's
  //! request against its sequence's cache, as a single-sequence forward of that request against
  //! that cache would (the same bits), appending its keys and values to that cache. `out.logits`
  //! holds the logits rows of every segment one after the other (segment s's `logits_rows`, or
  //! all its rows when empty, in request order). `want_hidden`, `hidden_layer` and `skip_layers`
  //! apply to the whole batch, so every segment must give the same ones; hidden rows are those of
  //! every batch row, segment after segment. Throws `specdec::error`, leaving every cache and
  //! `out` untouched: `errc::invalid_argument` for no segment, a null sequence or one given
  //! twice, a sequence made for another shape, or segments that disagree on the batch-wide
  //! fields; for a malformed segment request or one its cache cannot take, the single-sequence
  //! forward's error prefixed with "segment s: " (when there are several).
  void forward(std::span<cpu_llama_segment const> segments, forward_result& out) {
    SPECDEC_CHECK(!segments.empty(), invalid_argument, "cpu_llama::forward: no segments");
    std::size_t const count = segments.size();
    forward_request const& first = segments[0].request;
    std::size_t n = 0, m = 0;
    for (std::size_t s = 0; s < count; ++s) {
      cpu_llama_sequence const* const q = segments[s].sequence;
      forward_request const& req = segments[s].request;
      SPECDEC_CHECK(q != nullptr, invalid_argument, "cpu_llama::forward: segment ", s,
                    " has no sequence");
      check_sequence(*q, "cpu_llama::forward");
      SPECDEC_CHECK(count == 1 || req.kv_scores.kind == kv_score_kind::none, invalid_argument,
                    "cpu_llama::forward: segment ", s, " asks for kv_scores (one segment only)");
      for (std::size_t j = 0; j < s; ++j)
        SPECDEC_CHECK(segments[j].sequence != q, invalid_argument, "cpu_llama::forward: segments ",
                      j, " and ", s, " score the same sequence");
      if (count == 1) {
        validate(req, q->cache_);
      } else {
        try {
          validate(req, q->cache_);
        } catch (error const& e) {
          throw detail::with_context(e, detail::concat("segment ", s, ": "));
        }
      }
      SPECDEC_CHECK(req.same_outputs(first), invalid_argument, "cpu_llama::forward: segment ", s,
                    " asks for other hidden rows or skipped layers than segment 0 (they apply to "
                    "the whole batch)");
      n += req.tokens.size();
      m += req.logits_rows.empty() ? req.tokens.size() : req.logits_rows.size();
    }
    for (std::size_t s = 0; s < count; ++s) {
      cpu_llama_sequence& q = *segments[s].sequence;
      forward_request const& req = segments[s].request;
      std::size_t needed = q.cache_.size() + req.tokens.size();  // cache rows, RoPE rows
      for (position_t p : req.positions) needed = std::max(needed, static_cast<std::size_t>(p) + 1);
      if (needed > q.rows_ || needed > shared_rows_)
        reserve(q, std::max(needed, needed > q.rows_ ? 2 * q.rows_ : 0));
    }
    if (n > batch_capacity_) grow(n);
    for (cpu_llama_segment const& sg : segments)  // views: longer virtual sequences
      if (kv_view const& v = sg.request.view; !v.empty())
        sequence_room(n + 1 + v.max_runs(), v.max_rows(sg.sequence->cache_.size()) + n + 16);
    segs_.resize(count);
    out.vocab = vocab_;
    out.hidden_size = dim_;
    out.logits.resize(m * vocab_);
    out.hidden.resize(first.want_hidden ? n * dim_ : 0);
    out.layer_count = first.requested_layers().size();
    out.layer_hidden.resize(n * out.layer_count * dim_);
    out.logits_count = m;
    bool const scoring = first.kv_scores.kind != kv_score_kind::none;
    std::size_t const past = segments[0].sequence->cache_.size();
    out.kv_scores.assign(scoring ? n_layers_ * n_kv_heads_ * past : 0, 0.0f);
    out.kv_score_heads = scoring ? n_kv_heads_ : 0;
    out.kv_score_positions = scoring ? past : 0;
    kv_scores_ = scoring ? out.kv_scores.data() : nullptr;
    std::size_t row = 0;
    for (std::size_t s = 0; s < count; ++s) {
      cpu_llama_sequence& q = *segments[s].sequence;
      forward_request const& req = segments[s].request;
      // The room was checked and the rows reserved above: appending cannot fail.
      segs_[s] = segment{.sequence = &q,
                         .req = &req,
                         .past = q.cache_.append(req.tokens.size()),
                         .first = row,
                         .visible_rows = 0};
      row += req.tokens.size();
    }
    run(n, first, out);
    for (segment const& g : segs_) g.sequence->cache_.mark_unchanged();
  }

 private:
  // Per-batch activation rows, cache-line aligned (the matrix kernels' vector loads).
  using activations = std::vector<float, detail::cache_aligned_allocator<float>>;

  void validate(forward_request const& req, contiguous_cache const& cache) const {
    req.validate(vocab_, max_context_, n_layers_);
    req.view.check_fits(cache.size(), n_layers_, n_kv_heads_);
    std::size_t const n = req.tokens.size();
    SPECDEC_CHECK(n <= cache.room(), context_overflow, "cpu_llama::forward: a batch of ", n,
                  " tokens does not fit the cache (", cache.size(), " of ", cache.capacity(),
                  " positions used)");
    if (!req.mask.empty()) {
      for (std::size_t i = 0; i < n; ++i)
        SPECDEC_CHECK(req.visible(i, i), invalid_argument, "cpu_llama::forward: mask row ", i,
                      " does not let token ", i, " see itself");
    }
  }

  // Rows of the position-indexed buffers (a score row, the transposed copies) for `positions`.
  [[nodiscard]] static std::size_t round_rows(std::size_t positions) noexcept {
    return (positions + 15) / 16 * 16;
  }

  // Bytes of the model's buffers indexed by position (RoPE table, attention scratch) for
  // `positions`.
  [[nodiscard]] std::uint64_t shared_bytes(std::size_t positions) const noexcept {
    std::uint64_t const rows = round_rows(positions);
    std::uint64_t floats = rows * head_size_;                                     // RoPE
    floats += pool_->size() * (transposed_heads() ? 1 : heads_per_task_) * rows;  // scores
    return floats * sizeof(float);
  }

  // Throws errc::invalid_argument when `sequence` was not made for a model of this shape.
  void check_sequence(cpu_llama_sequence const& sequence, char const* who) const {
    contiguous_cache const& c = sequence.cache_;
    SPECDEC_CHECK(c.n_layers() == n_layers_ && c.kv_dim() == kv_dim_ &&
                      c.capacity() == max_context_ &&
                      sequence.transposed_rows_.size() == (transposed_heads() ? n_layers_ : 0),
                  invalid_argument, who, ": the sequence (", c.n_layers(), " layers x ", c.kv_dim(),
                  " floats, ", c.capacity(), " positions) was not made for this model (", n_layers_,
                  " layers x ", kv_dim_, " floats, ", max_context_, " positions)");
  }

  // One segment of the forward in progress.
  struct segment {
    cpu_llama_sequence* sequence = nullptr;
    forward_request const* req = nullptr;
    std::size_t past = 0;          // cache rows before the segment's
    std::size_t first = 0;         // its first batch row
    std::size_t visible_rows = 0;  // max over its rows of visible_end_
  };

  // Extends the RoPE table to `positions` rows: [positions, head_size / 2] (cos, sin) pairs,
  // each computed in double from its position alone.
  void grow_rope(std::size_t positions) {
    detail::cpu::grow_rope_table(rope_, head_size_,
                                 static_cast<double>(weights_->config.rope_theta), positions);
  }

  // Whether attention uses keys and values transposed into blocks (AVX-512, heads of 8 floats).
  [[nodiscard]] bool transposed_heads() const noexcept {
    return kernels_->transposed8 && head_size_ == 8;
  }

  // Grows the per-batch buffers to `n` rows (allocates; never called once large enough).
  void grow(std::size_t n) {
    x_.resize(n * dim_);
    xb_.resize(n * dim_);
    if (packed())
      qkv_.resize(n * (dim_ + 2 * kv_dim_));
    else
      q_.resize(n * dim_);
    att_.resize(n * dim_);
    hb_.resize(n * hidden_dim_);
    if (!packed()) hb2_.resize(n * hidden_dim_);
    if (!packed()) kv_.resize(n * 2 * kv_dim_);
    gather_.resize(n * dim_);
    visible_end_.resize(n);
    row_segment_.resize(n);
    sequence_room(n + 1, n + 16);
    batch_capacity_ = n;
  }

  // Grows the per-thread room of a virtual sequence to `runs` runs and, for transposed heads,
  // `rows` rows gathered apart from the cache order (allocates; never called once large enough).
  void sequence_room(std::size_t runs, std::size_t rows) {
    if (runs > runs_room_) {
      runs_room_ = runs;
      runs_.resize(pool_->size() * runs_room_);
    }
    if (transposed_heads() && rows > tail_rows_room_) {
      tail_rows_room_ = rows;
      tail_blocks_ = (rows + 15) / 16;
      tail_.resize(pool_->size() * tail_blocks_ * 128);
      tail_rows_.resize(pool_->size() * tail_rows_room_);
    }
  }

  // y (op)= w x for the tokens [0, n) of x (rows ldx apart; y rows ldy apart), vectors split
  // across the pool.
  template <detail::cpu::panel_op Op>
  void packed_product(detail::cpu::packed_matrix const& w, float const* x, std::size_t ldx,
                      std::size_t n, float* y, std::size_t ldy) noexcept {
    std::size_t const work = w.vectors() * w.width() * w.k() * n;
    pool_->split_rows(w.vectors(), 4, work, [&](std::size_t v0, std::size_t v1) {
      kernels_->packed(Op, w, v0, v1, x, ldx, n, y, ldy);
    });
  }

  // The forward of the n rows of the segments in segs_ (batch: the batch-wide fields).
  void run(std::size_t n, forward_request const& batch, forward_result& out) noexcept {
    namespace k = detail::cpu;
    llama_weights const& w = *weights_;
    float const eps = w.config.rms_eps;

    // Embeddings. Per token, one past the last token of its segment it sees (attention scores no
    // row after it).
    bool all_logits = true;  // every row of every segment needs logits
    for (std::size_t s = 0; s < segs_.size(); ++s) {
      segment& g = segs_[s];
      forward_request const& req = *g.req;
      all_logits = all_logits && req.logits_rows.empty();
      g.visible_rows = 0;
      for (std::size_t i = 0; i < req.tokens.size(); ++i) {
        std::size_t const t = g.first + i;
        std::memcpy(x_.data() + t * dim_,
                    w.token_embedding + static_cast<std::size_t>(req.tokens[i]) * dim_,
                    dim_ * sizeof(float));
        row_segment_[t] = s;
        visible_end_[t] = detail::cpu::last_visible(req, i) + 1;
        g.visible_rows = std::max(g.visible_rows, visible_end_[t]);
      }
    }

    std::size_t skip_at = 0;
    for (std::size_t l = 0; l < n_layers_; ++l) {
      bool skip = false;
      if (skip_at < batch.skip_layers.size() &&
          static_cast<std::size_t>(batch.skip_layers[skip_at]) == l) {
        skip = true;
        ++skip_at;
      }
      if (!skip) {
        if (packed())
          layer_packed(l, n);
        else
          layer(l, n);
      }
      std::span<std::int32_t const> const wanted = batch.requested_layers();
      for (std::size_t j = 0; j < wanted.size(); ++j) {
        if (static_cast<std::size_t>(wanted[j]) != l) continue;
        for (std::size_t t = 0; t < n; ++t)
          std::memcpy(out.layer_hidden.data() + (t * wanted.size() + j) * dim_,
                      x_.data() + t * dim_, dim_ * sizeof(float));
      }
    }

    // Final norm, hidden rows, classifier rows.
    for (std::size_t t = 0; t < n; ++t)
      kernels_->rmsnorm(xb_.data() + t * dim_, x_.data() + t * dim_, w.rms_final, dim_, eps);
    if (batch.want_hidden) std::memcpy(out.hidden.data(), xb_.data(), n * dim_ * sizeof(float));
    float const* rows = xb_.data();
    std::size_t m = n;
    if (!all_logits) {
      m = 0;
      auto const take = [&](std::size_t row) {
        std::memcpy(gather_.data() + m++ * dim_, xb_.data() + row * dim_, dim_ * sizeof(float));
      };
      for (segment const& g : segs_) {
        if (g.req->logits_rows.empty()) {
          for (std::size_t i = 0; i < g.req->tokens.size(); ++i) take(g.first + i);
        } else {
          for (std::int32_t const r : g.req->logits_rows)
            take(g.first + static_cast<std::size_t>(r));
        }
      }
      rows = gather_.data();
    }
    float* const logits = out.logits.data();
    if (packed()) {
      packed_product<k::panel_op::store>(packed_.classifier, rows, dim_, m, logits, vocab_);
      return;
    }
    pool_->split_rows(vocab_, k::tile_rows, vocab_ * dim_ * m, [&](std::size_t r0, std::size_t r1) {
      kernels_->gemm_nt(w.classifier, dim_, r0, r1, rows, dim_, m, dim_, logits, vocab_, false);
    });
  }

  // A layer with the weights in place (large models).
  void layer(std::size_t l, std::size_t n) noexcept {
    namespace k = detail::cpu;
    llama_layer_weights const& lw = weights_->layers[l];
    float const eps = weights_->config.rms_eps;
    // One segment: k and v straight into its cache rows; several: into kv_, then each segment's
    // rows into its own cache.
    bool const direct = segs_.size() == 1;
    float* const kd =
        direct ? segs_[0].sequence->cache_.keys(l) + segs_[0].past * kv_dim_ : kv_.data();
    float* const vd = direct ? segs_[0].sequence->cache_.values(l) + segs_[0].past * kv_dim_
                             : kv_.data() + kv_dim_;
    std::size_t const ld = direct ? kv_dim_ : 2 * kv_dim_;

    // Attention block: norm, q/k/v projections.
    for (std::size_t t = 0; t < n; ++t)
      kernels_->rmsnorm(xb_.data() + t * dim_, x_.data() + t * dim_, lw.rms_att, dim_, eps);
    std::size_t const qkv_rows = dim_ + 2 * kv_dim_;
    pool_->split_rows(
        qkv_rows, k::tile_rows, qkv_rows * dim_ * n, [&](std::size_t r0, std::size_t r1) {
          auto block = [&](float const* wt, std::size_t first, std::size_t count, float* y,
                           std::size_t ldy) {
            std::size_t const b = std::max(r0, first), e = std::min(r1, first + count);
            if (b < e)
              kernels_->gemm_nt(wt, dim_, b - first, e - first, xb_.data(), dim_, n, dim_, y, ldy,
                                false);
          };
          block(lw.wq, 0, dim_, q_.data(), dim_);
          block(lw.wk, dim_, kv_dim_, kd, ld);
          block(lw.wv, dim_ + kv_dim_, kv_dim_, vd, ld);
        });
    for (std::size_t t = 0; t < n; ++t) {
      segment const& g = segs_[row_segment_[t]];
      float const* const cs =
          rope_.data() + static_cast<std::size_t>(g.req->positions[t - g.first]) * head_size_;
      kernels_->rope(q_.data() + t * dim_, n_heads_, head_size_, cs);
      kernels_->rope(kd + t * ld, n_kv_heads_, head_size_, cs);
      if (!direct) {
        std::size_t const at = (g.past + t - g.first) * kv_dim_;
        std::memcpy(g.sequence->cache_.keys(l) + at, kd + t * ld, kv_dim_ * sizeof(float));
        std::memcpy(g.sequence->cache_.values(l) + at, vd + t * ld, kv_dim_ * sizeof(float));
      }
    }
    q_base_ = q_.data();
    q_ld_ = dim_;
    attention(l, n);
    score_cache(l);

    // Output projection, added to the residual stream.
    pool_->split_rows(dim_, k::tile_rows, dim_ * dim_ * n, [&](std::size_t r0, std::size_t r1) {
      kernels_->gemm_nt(lw.wo, dim_, r0, r1, att_.data(), dim_, n, dim_, x_.data(), dim_, true);
    });

    // Feed-forward block: norm, gate and up projections with SwiGLU, down projection added.
    for (std::size_t t = 0; t < n; ++t)
      kernels_->rmsnorm(xb_.data() + t * dim_, x_.data() + t * dim_, lw.rms_ffn, dim_, eps);
    pool_->split_rows(hidden_dim_, k::tile_rows, 2 * hidden_dim_ * dim_ * n,
                      [&](std::size_t r0, std::size_t r1) {
                        kernels_->gemm_nt(lw.w1, dim_, r0, r1, xb_.data(), dim_, n, dim_,
                                          hb_.data(), hidden_dim_, false);
                        kernels_->gemm_nt(lw.w3, dim_, r0, r1, xb_.data(), dim_, n, dim_,
                                          hb2_.data(), hidden_dim_, false);
                        for (std::size_t t = 0; t < n; ++t)
                          kernels_->swiglu(hb_.data() + t * hidden_dim_ + r0,
                                           hb2_.data() + t * hidden_dim_ + r0, r1 - r0);
                      });
    pool_->split_rows(dim_, k::tile_rows, dim_ * hidden_dim_ * n,
                      [&](std::size_t r0, std::size_t r1) {
                        kernels_->gemm_nt(lw.w2, hidden_dim_, r0, r1, hb_.data(), hidden_dim_, n,
                                          hidden_dim_, x_.data(), dim_, true);
                      });
  }

  // A layer with repacked weights (small models): q, k and v in one product, then RoPE and the
  // copy of k and v into the cache rows; gate and up in one product with SwiGLU applied.
  void layer_packed(std::size_t l, std::size_t n) noexcept {
    namespace k = detail::cpu;
    detail::cpu::packed_llama::layer const& pl = packed_.layers[l];
    llama_layer_weights const& lw = weights_->layers[l];
    float const eps = weights_->config.rms_eps;
    std::size_t const ld = dim_ + 2 * kv_dim_;

    for (std::size_t t = 0; t < n; ++t)
      kernels_->rmsnorm(xb_.data() + t * dim_, x_.data() + t * dim_, lw.rms_att, dim_, eps);
    packed_product<k::panel_op::store>(pl.qkv, xb_.data(), dim_, n, qkv_.data(), ld);
    for (std::size_t t = 0; t < n; ++t) {
      segment const& g = segs_[row_segment_[t]];
      float* const row = qkv_.data() + t * ld;
      float const* const cs =
          rope_.data() + static_cast<std::size_t>(g.req->positions[t - g.first]) * head_size_;
      kernels_->rope(row, n_heads_, head_size_, cs);
      kernels_->rope(row + dim_, n_kv_heads_, head_size_, cs);
      std::size_t const at = (g.past + t - g.first) * kv_dim_;
      std::memcpy(g.sequence->cache_.keys(l) + at, row + dim_, kv_dim_ * sizeof(float));
      std::memcpy(g.sequence->cache_.values(l) + at, row + dim_ + kv_dim_, kv_dim_ * sizeof(float));
    }
    q_base_ = qkv_.data();
    q_ld_ = ld;
    attention(l, n);
    score_cache(l);

    packed_product<k::panel_op::add>(pl.wo, att_.data(), dim_, n, x_.data(), dim_);
    for (std::size_t t = 0; t < n; ++t)
      kernels_->rmsnorm(xb_.data() + t * dim_, x_.data() + t * dim_, lw.rms_ffn, dim_, eps);
    packed_product<k::panel_op::swiglu>(pl.w13, xb_.data(), dim_, n, hb_.data(), hidden_dim_);
    packed_product<k::panel_op::add>(pl.w2, hb_.data(), hidden_dim_, n, x_.data(), dim_);
  }

  // Attention of every batch token over the cache rows it sees, in its own segment's sequence;
  // writes att_. Heads of 8 floats (AVX-512): keys and values kept transposed per layer and
  // sequence (refreshed from the first changed row), then one task per (kv head, token).
  // Otherwise one task per (token, group of heads_per_task_ heads).
  void attention(std::size_t l, std::size_t n) noexcept {
    std::size_t work = 0;
    for (segment const& sg : segs_)
      work += sg.req->tokens.size() * n_heads_ * (sg.past + sg.visible_rows) * head_size_ * 2;
    if (transposed_heads()) {
      // Each sequence's transposed copy of the layer is kept across forwards: refresh it from the
      // block holding its first row that is new or changed.
      for (segment const& sg : segs_) {
        cpu_llama_sequence& q = *sg.sequence;
        std::size_t const from =
            std::min(q.transposed_rows_[l], q.cache_.unchanged_rows()) / 16 * 16;
        std::size_t const rows = sg.past + sg.visible_rows;
        float const* const kc = q.cache_.keys(l);
        float const* const vc = q.cache_.values(l);
        float* const kt = q.kt_.data() + l * kv_dim_ * q.lcap_;
        float* const vt = q.vt_.data() + l * kv_dim_ * q.lcap_;
        if (from < rows) {
          for (std::size_t g = 0; g < n_kv_heads_; ++g) {
            kernels_->transpose_rows8(kc + from * kv_dim_ + g * 8, kv_dim_, rows - from,
                                      kt + g * q.lcap_ * 8 + from * 8);
            kernels_->transpose_rows8(vc + from * kv_dim_ + g * 8, kv_dim_, rows - from,
                                      vt + g * q.lcap_ * 8 + from * 8);
          }
        }
        q.transposed_rows_[l] = rows;
      }
      pool_->split_tasks(n_kv_heads_ * n, work,
                         [&](std::size_t thread, std::size_t b, std::size_t e) {
                           for (std::size_t task = b; task < e; ++task)
                             attend8(task / n, task % n, thread, l);
                         });
      return;
    }
    std::size_t const groups = (n_heads_ + heads_per_task_ - 1) / heads_per_task_;
    pool_->split_tasks(n * groups, work, [&](std::size_t thread, std::size_t b, std::size_t e) {
      for (std::size_t task = b; task < e; ++task) attend(task / groups, task % groups, thread, l);
    });
  }

  // Attention of batch token t for the query heads of kv head g (heads of 8 floats, keys and
  // values transposed): scores from the layer's transposed keys `kt`, then softmax and values in
  // one pass over its transposed values `vt` (and, for a sequence that leaves the cache order, its
  // tail gathered from the cache values `vc` and transposed here).
  void attend8(std::size_t g, std::size_t t, std::size_t thread, std::size_t l) noexcept {
    namespace k = detail::cpu;
    segment const& sg = segs_[row_segment_[t]];
    cpu_llama_sequence const& q = *sg.sequence;
    float const* const vc = q.cache_.values(l);
    float const* const kt = q.kt_.data() + l * kv_dim_ * q.lcap_;
    float const* const vt = q.vt_.data() + l * kv_dim_ * q.lcap_;
    std::size_t const lcap = q.lcap_;
    std::size_t const per_kv = n_heads_ / n_kv_heads_;
    float* const scores = scores_.data() + thread * scores_per_thread_;
    k::row_run* const runs = runs_.data() + thread * runs_room_;
    std::size_t length = 0;
    std::size_t const n_runs =
        k::virtual_sequence(t - sg.first, *sg.req, sg.past, runs, length, l * n_kv_heads_ + g);
    bool const compacted = n_runs > 1 || runs[0].row != 0;  // the sequence is not [0, length)
    // Blocks [0, from) of the sequence are cache rows at their own index (the shared transposed
    // values); the others are gathered and transposed here.
    std::size_t const blocks = (length + 15) / 16;
    std::size_t const from = !compacted ? blocks : runs[0].row == 0 ? runs[0].count / 16 : 0;
    float* const tail = tail_.data() + thread * tail_blocks_ * 128;
    if (from < blocks) {
      std::size_t* const phys = tail_rows_.data() + thread * tail_rows_room_;
      std::size_t vi = 0, m = 0;
      for (std::size_t r = 0; r < n_runs; ++r)
        for (std::size_t c = 0; c < runs[r].count; ++c, ++vi)
          if (vi >= 16 * from) phys[m++] = runs[r].row + c;
      for (std::size_t b = from; b < blocks; ++b) {
        float const* rows[16];
        for (std::size_t i = 0; i < 16; ++i) {
          std::size_t const at = (b - from) * 16 + i;
          rows[i] = at < m ? vc + phys[at] * kv_dim_ + g * 8 : nullptr;
        }
        kernels_->transpose_gather8(rows, tail + (b - from) * 128);
      }
    }
    std::size_t const end = sg.past + visible_end_[t];
    float const scale = 1.0f / std::sqrt(static_cast<float>(head_size_));
    for (std::size_t h = g * per_kv; h < (g + 1) * per_kv; ++h) {
      float top =
          kernels_->scores8(q_base_ + t * q_ld_ + h * 8, kt + g * lcap * 8, end, scale, scores);
      if (compacted) {
        k::compact_scores(scores, runs, n_runs);
        top = kernels_->row_max(scores, length);
      }
      kernels_->softmax_values8(scores, length, top, vt + g * lcap * 8, from, tail,
                                att_.data() + t * dim_ + h * 8);
    }
  }

  // Attention of batch token t, heads [group * heads_per_task_, ...) (any head size), layer l: over
  // its virtual sequence in its own segment's cache (`detail::cpu::attend_heads`).
  void attend(std::size_t t, std::size_t group, std::size_t thread, std::size_t l) noexcept {
    namespace k = detail::cpu;
    segment const& sg = segs_[row_segment_[t]];
    float const* const kc = sg.sequence->cache_.keys(l);
    float const* const vc = sg.sequence->cache_.values(l);
    float* const scores = scores_.data() + thread * scores_per_thread_;
    k::row_run* const runs = runs_.data() + thread * runs_room_;
    std::size_t const h1 = std::min(n_heads_, (group + 1) * heads_per_task_);
    std::size_t const per_kv = n_heads_ / n_kv_heads_;
    bool const by_head = !sg.req->view.positions.empty();  // the view lists positions per kv head
    for (std::size_t a = group * heads_per_task_, b = 0; a < h1; a = b) {
      b = by_head ? std::min(h1, (a / per_kv + 1) * per_kv) : h1;
      std::size_t length = 0;
      std::size_t const n_runs = k::virtual_sequence(t - sg.first, *sg.req, sg.past, runs, length,
                                                     l * n_kv_heads_ + a / per_kv);
      kernels_->attend_heads(q_base_ + t * q_ld_, kc, vc, kv_dim_, head_size_, per_kv, a, b,
                             sg.past + visible_end_[t], runs, n_runs, length, scores, score_stride_,
                             att_.data() + t * dim_);
    }
  }

  // Adds layer l's attention statistics to kv_scores_ when a (one-segment) forward asks for them
  // (forward_request::kv_scores): per kv head, over its query heads and the last rows.
  void score_cache(std::size_t l) noexcept {
    if (kv_scores_ == nullptr) return;
    namespace k = detail::cpu;
    segment const& sg = segs_[0];
    kv_scores_request const want = sg.req->kv_scores;
    std::size_t const n = sg.req->tokens.size(), per_kv = n_heads_ / n_kv_heads_;
    std::size_t const work = want.rows * n_heads_ * (sg.past + n) * head_size_ * 2;
    pool_->split_tasks(n_kv_heads_, work, [&](std::size_t thread, std::size_t g0, std::size_t g1) {
      float* const s = scores_.data() + thread * scores_per_thread_;
      k::row_run* const runs = runs_.data() + thread * runs_room_;
      for (std::size_t g = g0; g < g1; ++g) {
        for (std::size_t t = n - want.rows; t < n; ++t) {
          std::size_t length = 0;
          std::size_t const n_runs =
              k::virtual_sequence(t, *sg.req, sg.past, runs, length, l * n_kv_heads_ + g);
          for (std::size_t h = g * per_kv; h < (g + 1) * per_kv; ++h)
            kernels_->add_cache_scores(q_base_ + (sg.first + t) * q_ld_ + h * head_size_,
                                       sg.sequence->cache_.keys(l) + g * head_size_, kv_dim_,
                                       head_size_, runs, n_runs, length, sg.past, want.kind, s,
                                       kv_scores_ + (l * n_kv_heads_ + g) * sg.past);
        }
      }
    });
  }

  std::shared_ptr<llama_weights const> weights_;
  std::shared_ptr<thread_pool> pool_;
  detail::cpu::model_kernels const* kernels_;  // the CPU target's, chosen when built
  cpu_llama_sequence seq_;                     // the model's own sequence (cache())
  std::size_t dim_ = 0, hidden_dim_ = 0, n_layers_ = 0, n_heads_ = 0, n_kv_heads_ = 0;
  std::size_t head_size_ = 0, kv_dim_ = 0, vocab_ = 0, max_context_ = 0;
  std::size_t batch_capacity_ = 0;
  std::size_t shared_rows_ = 0;        // positions the RoPE table and the scores hold
  std::size_t score_stride_ = 0;       // shared_rows_ rounded up to 16: a score row's room
  std::size_t heads_per_task_ = 1;     // heads of one attention task (any head size)
  std::size_t scores_per_thread_ = 0;  // floats of score rows per thread
  float const* q_base_ = nullptr;      // the current layer's queries, rows q_ld_ apart
  float* kv_scores_ = nullptr;         // the forward's kv_scores when it asks for them
  std::size_t q_ld_ = 0;
  detail::cpu::packed_llama packed_;  // the repacked matrices (small models), else empty
  std::vector<float> rope_;           // [rows, head_size]: (cos, sin) per pair
  std::vector<float> scores_;         // [threads, heads_per_task, lcap] attention scratch
  std::size_t tail_blocks_ = 0;       // blocks of a gathered sequence tail per kv head
  std::size_t runs_room_ = 0, tail_rows_room_ = 0;  // per thread: room of runs_, tail_rows_
  std::vector<float> tail_;                         // [threads, tail_blocks, 128] gathered values
  std::vector<std::size_t> tail_rows_;      // [threads, tail_rows_room_] rows of a sequence tail
  std::vector<detail::cpu::row_run> runs_;  // [threads, runs_room_] virtual sequences
  activations x_;                           // [batch, dim] residual stream
  activations xb_;                          // [batch, dim] normed input
  activations q_;                           // [batch, dim] queries (weights in place)
  activations qkv_;                         // [batch, dim + 2 kv_dim] q, k, v (packed)
  activations att_;                         // [batch, dim] attention output
  activations hb_;                          // [batch, hidden_dim] gate, then SwiGLU
  activations hb2_;                         // [batch, hidden_dim] up (weights in place)
  activations gather_;                      // [batch, dim] rows that need logits
  activations kv_;                          // [batch, 2 kv_dim] k, v of several segments
  std::vector<std::size_t> visible_end_;    // [batch] within the row's segment
  std::vector<std::size_t> row_segment_;    // [batch] the segment of each row
  std::vector<segment> segs_;               // the segments of the forward in progress
};

}  // namespace specdec
