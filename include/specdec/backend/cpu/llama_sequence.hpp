#pragma once
//! \file
//! What a `cpu_llama` is built with and what it scores against: `cpu_llama_options`, the state of
//! one sequence (`cpu_llama_sequence`: its KV cache and the transposed copies attention reads) and
//! a sequence's part of a multi-sequence forward (`cpu_llama_segment`).

#include <cstddef>
#include <memory>
#include <vector>

#include "specdec/backend/cpu/aligned_floats.hpp"
#include "specdec/backend/cpu/thread_pool.hpp"
#include "specdec/core/forward.hpp"
#include "specdec/kv/contiguous_cache.hpp"

namespace specdec {

//! Options of a `cpu_llama`.
struct cpu_llama_options {
  //! Threads for the matrix products and attention (the calling thread included). Default 2; set
  //! it to the cores the caller may use: with more threads than free cores (a busy machine,
  //! workers sharing it) every forward is many times slower.
  std::size_t threads = 2;
  //! Positions the KV cache can hold and the largest position + 1 accepted; 0 = the model's
  //! seq_len. It may exceed seq_len (the context the model was trained on), where the output is
  //! whatever the model makes of positions it has not seen. Memory grows with the positions in use,
  //! not with this limit.
  std::size_t max_context = 0;
  //! Batch rows the activation buffers are sized for at construction; larger batches grow them
  //! once (the only allocation a forward may do).
  std::size_t batch_capacity = 64;
  //! The thread pool; null = the process-wide pool of `threads` threads
  //! (`thread_pool::shared`), which every model with the same thread count uses in turn. When
  //! given, its size overrides `threads`.
  std::shared_ptr<thread_pool> pool = nullptr;
  //! Models whose layer matrices and classifier take at most this many bytes are repacked at
  //! construction (a copy of that size) for the small-model kernels (`detail::cpu::packed_gemm`);
  //! larger ones are used in place. Either way a token's logits do not depend on its batch or the
  //! thread count, but the two layouts round differently: models that must agree bit for bit
  //! (two instances of one model, one of them a draft) need the same limit.
  std::size_t pack_limit = std::size_t{64} << 20;
};

class cpu_llama;

//! The state of one sequence a `cpu_llama` scores: its KV cache and, in AVX-512 builds for heads
//! of 8 floats, the cache's keys and values kept transposed per layer for attention. A model holds
//! one of its own (`cpu_llama::cache()`); `cpu_llama::make_sequence` makes more, which a
//! multi-sequence forward (`cpu_llama::forward` over `cpu_llama_segment`s) scores together. A
//! sequence fits every model of the same shape (layers, key/value width, context). Memory grows
//! with the positions in use, as for the model's own sequence.
class cpu_llama_sequence {
 public:
  //! No cache: unusable in a forward until assigned one made by `cpu_llama::make_sequence`.
  cpu_llama_sequence() = default;

  //! The sequence's KV cache: truncate / keep_path it to commit speculation.
  [[nodiscard]] contiguous_cache& cache() noexcept { return cache_; }
  //! The sequence's KV cache, read-only.
  [[nodiscard]] contiguous_cache const& cache() const noexcept { return cache_; }
  //! Positions the sequence's buffers (KV cache, transposed copy) hold in memory now.
  [[nodiscard]] std::size_t reserved() const noexcept { return rows_; }

 private:
  friend class cpu_llama;

  contiguous_cache cache_;
  detail::cpu::aligned_floats kt_;  // [n_layers, kv_heads, lcap / 16, 8, 16] transposed keys
  detail::cpu::aligned_floats vt_;  // [n_layers, kv_heads, lcap / 16, 8, 16] transposed values
  std::vector<std::size_t> transposed_rows_;  // [n_layers] leading cache rows kt_/vt_ hold
  std::size_t rows_ = 0;                      // positions held in memory (see reserved())
  std::size_t lcap_ = 0;                      // rows_ rounded up to 16: a transposed row's room
};

//! One sequence's part of a multi-sequence `cpu_llama::forward`: its tokens, positions, mask and
//! logits rows (`request`, as a single-sequence forward takes them; its mask covers the segment's
//! own tokens: a sequence never sees another's) scored against `sequence`'s cache.
struct cpu_llama_segment {
  cpu_llama_sequence* sequence = nullptr;  //!< the sequence scored (not null)
  forward_request request;                 //!< its tokens, as for a single-sequence forward
};

}  // namespace specdec
