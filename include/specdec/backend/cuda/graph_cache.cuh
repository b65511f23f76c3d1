#pragma once
//! \file
//! `cuda::graph_cache`: CUDA graphs of a model's forward, one per shape (tokens, logits rows, mask
//! words, requested outputs, skipped layers), captured the first time a shape is seen and replayed
//! with one `cudaGraphLaunch` afterwards. A replay runs the captured launches with the captured
//! parameters, so everything that changes between calls of one shape -- the tokens, positions,
//! mask, logits rows and the cache length -- must reach the kernels through device memory at fixed
//! addresses (the model's staged inputs), and the cache must be cleared whenever a buffer a graph
//! uses is reallocated.

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "specdec/backend/cuda/common.cuh"
#include "specdec/core/error.hpp"

namespace specdec::cuda {

//! What shapes the launches of one forward (the key of a captured graph).
struct forward_shape {
  std::int32_t tokens = 0;                  //!< batch tokens
  std::int32_t rows = 0;                    //!< logits rows
  std::int32_t mask_words = 0;              //!< words per mask row (0: causal)
  std::vector<std::int32_t> hidden_layers;  //!< residual streams copied out (requested order)
  bool want_hidden = false;                 //!< final hidden rows copied out
  std::vector<std::int32_t> skip_layers;    //!< layers skipped, ascending

  [[nodiscard]] bool operator==(forward_shape const&) const = default;
};

#if defined(__CUDACC__)

//! Captured forwards, at most `max_graphs` shapes (see the file comment). Not thread-safe.
class graph_cache {
 public:
  //! A cache of at most `max_graphs` graphs (0: never captures).
  explicit graph_cache(std::size_t max_graphs) : max_(max_graphs) {}
  ~graph_cache() { clear(); }
  graph_cache(graph_cache const&) = delete;
  graph_cache& operator=(graph_cache const&) = delete;

  //! The graph of `shape`, or null.
  [[nodiscard]] cudaGraphExec_t find(forward_shape const& shape) const noexcept {
    for (entry const& e : entries_)
      if (e.shape == shape) return e.exec;
    return nullptr;
  }

  //! Whether another shape can be captured.
  [[nodiscard]] bool has_room() const noexcept { return entries_.size() < max_; }

  //! Captures what `enqueue()` puts on `stream` (a stream other than the legacy default stream)
  //! as the graph of `shape`, stores it and returns it; nothing runs until it is launched. Throws
  //! `specdec::error` when the capture or the instantiation fails (or what `enqueue` throws; the
  //! capture is then abandoned).
  template <class F>
  cudaGraphExec_t capture(forward_shape shape, cudaStream_t stream, F&& enqueue) {
    SPECDEC_CHECK(has_room(), internal, "graph_cache: full");
    SPECDEC_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    try {
      enqueue();
    } catch (...) {
      cudaGraph_t abandoned = nullptr;
      (void)cudaStreamEndCapture(stream, &abandoned);
      if (abandoned != nullptr) (void)cudaGraphDestroy(abandoned);
      (void)cudaGetLastError();
      throw;
    }
    cudaGraph_t graph = nullptr;
    SPECDEC_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
    cudaGraphExec_t exec = nullptr;
    cudaError_t const err = cudaGraphInstantiate(&exec, graph, 0);
    (void)cudaGraphDestroy(graph);
    SPECDEC_CUDA_CHECK(err);
    entries_.push_back(entry{std::move(shape), exec});
    return exec;
  }

  //! Destroys every graph (after a buffer they use moved).
  void clear() noexcept {
    for (entry const& e : entries_) (void)cudaGraphExecDestroy(e.exec);
    entries_.clear();
  }

  //! Graphs held.
  [[nodiscard]] std::size_t size() const noexcept { return entries_.size(); }

 private:
  struct entry {
    forward_shape shape;
    cudaGraphExec_t exec;
  };
  std::size_t max_;
  std::vector<entry> entries_;
};

#endif  // __CUDACC__

}  // namespace specdec::cuda
