#pragma once
//! \file
//! `target_handle`: a proposer's access to the target model of its sequence, for strategies that
//! draft with the target itself (self-speculation: the target with layers skipped, or over a
//! bounded view of its own cache). The decoder gives one to every proposer that declares
//! `uses_target` (`propose_context::target`); it reaches that sequence's cache only, and only
//! above the committed positions.
//!
//! During `propose`, the cache holds the committed tokens but the root (`committed()` positions:
//! the root is the last committed token, scored by the step's own forward). The proposer may run
//! forwards of any variant the model supports (`forward_request::skip_layers`) against it: each
//! appends its tokens' entries after the committed ones, as a draft model's forward appends to its
//! own cache. Those entries are the draft's alone -- a forward that skips layers writes no entry
//! for the layers it skips -- so they must never be seen by a full forward: the proposer may drop
//! them (`rollback`), and the decoder drops whatever is left as soon as `propose` returns, before
//! the step's forward. A proposer therefore owns no second model and no second cache, and the
//! committed prefix it drafts from is the target's own.
//!
//! Type-erased (a model pointer and a table of functions), so that proposers need not know the
//! model's type; copying a handle is free. One handle serves one sequence; not thread-safe.

#include <algorithm>
#include <cstddef>
#include <utility>

#include "specdec/core/batch_forward.hpp"
#include "specdec/core/error.hpp"
#include "specdec/core/forward.hpp"

namespace specdec {

//! A proposer's access to its sequence on the target (see the file comment).
class target_handle {
 public:
  //! A handle on nothing (`valid()` is false).
  target_handle() = default;

  //! On the single-sequence cache of `model` (a `causal_lm`), which must outlive the handle.
  template <class Model>
  requires requires(Model& m, forward_request const& req, forward_result& out) {
    m.forward(req, out);
    m.cache().truncate(std::size_t{});
  }
  explicit target_handle(Model& model) noexcept : model_(&model), ops_(&single_ops<Model>) {}

  //! On slot `slot` of `model` (a `batched_lm`): each forward is a batch of that one segment, its
  //! result received in `scratch`. Both must outlive the handle.
  template <class Model>
  requires requires(Model& m, batch_forward_request const& req, batch_forward_result& out,
                    std::size_t slot) {
    m.forward(req, out);
    m.cache(slot).truncate(std::size_t{});
  }
  target_handle(Model& model, std::size_t slot, batch_forward_result& scratch) noexcept
      : model_(&model), slot_(slot), scratch_(&scratch), ops_(&slot_ops<Model>) {}

  //! Whether the handle reaches a model.
  [[nodiscard]] bool valid() const noexcept { return ops_ != nullptr; }

  //! Positions the decoder keeps: the committed tokens but the root. Set by the decoder.
  [[nodiscard]] std::size_t committed() const noexcept { return committed_; }
  //! Sets `committed()` (the decoder, before each `propose`).
  void set_committed(std::size_t n) noexcept { committed_ = n; }

  //! Target vocabulary size.
  [[nodiscard]] std::size_t vocab_size() const { return checked().vocab(model_); }
  //! Positions the sequence can hold: the smaller of the model's context and its cache's capacity.
  [[nodiscard]] std::size_t capacity() const { return checked().capacity(model_, slot_); }
  //! Positions in the sequence's cache now: `committed()` plus the draft's entries.
  [[nodiscard]] std::size_t size() const { return checked().size(model_, slot_); }

  //! Runs `req` against the sequence's cache (see the file comment); its positions follow
  //! `size()`. Throws what the model's forward throws.
  void forward(forward_request const& req, forward_result& out) const {
    checked().forward(model_, slot_, scratch_, req, out);
  }

  //! Drops the draft's entries after position n (n >= committed(); all of them by default).
  //! Throws `errc::invalid_argument` for n below committed() or above size().
  void rollback(std::size_t n) const {
    std::size_t const now = size();
    SPECDEC_CHECK(n >= committed_ && n <= now, invalid_argument, "target_handle: rollback to ", n,
                  " positions, outside [", committed_, ", ", now,
                  "] (the committed positions stay)");
    if (n < now) checked().truncate(model_, slot_, n);
  }
  void rollback() const { rollback(committed_); }

 private:
  struct ops {
    std::size_t (*vocab)(void*);
    std::size_t (*capacity)(void*, std::size_t);
    std::size_t (*size)(void*, std::size_t);
    void (*truncate)(void*, std::size_t, std::size_t);
    void (*forward)(void*, std::size_t, batch_forward_result*, forward_request const&,
                    forward_result&);
  };

  template <class Model>
  static constexpr ops single_ops{
      .vocab = [](void* m) -> std::size_t { return static_cast<Model*>(m)->vocab_size(); },
      .capacity = [](void* m, std::size_t) -> std::size_t {
        auto& model = *static_cast<Model*>(m);
        return std::min<std::size_t>(model.max_context(), model.cache().capacity());
      },
      .size = [](void* m, std::size_t) -> std::size_t {
        return static_cast<Model*>(m)->cache().size();
      },
      .truncate = [](void* m, std::size_t,
                     std::size_t n) { static_cast<Model*>(m)->cache().truncate(n); },
      .forward = [](void* m, std::size_t, batch_forward_result*, forward_request const& req,
                    forward_result& out) { static_cast<Model*>(m)->forward(req, out); }};

  template <class Model>
  static constexpr ops slot_ops{
      .vocab = [](void* m) -> std::size_t { return static_cast<Model*>(m)->vocab_size(); },
      .capacity = [](void* m, std::size_t slot) -> std::size_t {
        auto& model = *static_cast<Model*>(m);
        return std::min<std::size_t>(model.max_context(), model.cache(slot).capacity());
      },
      .size = [](void* m, std::size_t slot) -> std::size_t {
        return static_cast<Model*>(m)->cache(slot).size();
      },
      .truncate = [](void* m, std::size_t slot,
                     std::size_t n) { static_cast<Model*>(m)->cache(slot).truncate(n); },
      .forward =
          [](void* m, std::size_t slot, batch_forward_result* scratch, forward_request const& req,
             forward_result& out) {
            batch_segment const one{.slot = slot, .request = req};
            // The segment's rows are the whole result: `out` lends its buffers to the batch.
            std::swap(scratch->rows, out);
            try {
              static_cast<Model*>(m)->forward(
                  batch_forward_request{.segments = std::span<batch_segment const>(&one, 1)},
                  *scratch);
            } catch (...) {
              std::swap(scratch->rows, out);
              throw;
            }
            std::swap(scratch->rows, out);
          }};

  [[nodiscard]] ops const& checked() const {
    SPECDEC_CHECK(ops_ != nullptr, invalid_argument,
                  "target_handle: no target (the decoder gives a handle to proposers that "
                  "declare uses_target)");
    return *ops_;
  }

  void* model_ = nullptr;
  std::size_t slot_ = 0;
  batch_forward_result* scratch_ = nullptr;
  ops const* ops_ = nullptr;
  std::size_t committed_ = 0;
};

}  // namespace specdec
