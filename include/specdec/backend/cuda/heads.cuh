#pragma once
//! \file
//! The Medusa and Hydra head computations on one CUDA device (`cuda_medusa_heads`,
//! `cuda_hydra_heads`): the heads runners of propose/medusa.hpp and propose/hydra.hpp for a target
//! that runs on the GPU. float32 throughout; cuBLAS for the products (no TF32), own kernels for
//! the residual SiLU, the biases and the gathering of a Hydra head's inputs (the hidden row and
//! the path's token embeddings, from the target's embedding uploaded with the heads). The
//! interface is the CPU runners' (backend/cpu/heads.hpp): host hidden rows and paths in, host
//! logits out, so the proposers run unchanged on either backend.
//!
//! The kernels are templates (`template <int Unused = 0>`): common.cuh says why.

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "specdec/backend/cuda/common.cuh"
#include "specdec/backend/cuda/llama.cuh"
#include "specdec/core/error.hpp"
#include "specdec/core/types.hpp"
#include "specdec/core/views.hpp"
#include "specdec/model/heads.hpp"
#include "specdec/model/llama_weights.hpp"

namespace specdec::cuda::detail {

#if defined(__CUDACC__)

//! x[i] = x[i] + x_bias[i % dim] + SiLU(y[i] + y_bias[i % dim]) over [total] entries (x_bias may
//! be null), SiLU as SwiGLU computes it: g * (1 / (1 + exp(-g))).
template <int Unused = 0>
__global__ void heads_residual_silu_kernel(float* __restrict__ x, float const* __restrict__ y,
                                           float const* __restrict__ x_bias,
                                           float const* __restrict__ y_bias, std::int32_t dim,
                                           std::int64_t total) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    std::int64_t const c = i % dim;
    float g = y[i] + y_bias[c];
    g *= 1.0f / (1.0f + expf(-g));
    x[i] = x[i] + (x_bias != nullptr ? x_bias[c] : 0.0f) + g;
  }
}

//! y[i] += bias[i % cols] over [total] entries.
template <int Unused = 0>
__global__ void heads_bias_kernel(float* __restrict__ y, float const* __restrict__ bias,
                                  std::int32_t cols, std::int64_t total) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    y[i] += bias[i % cols];
}

//! Row r of u [n, (tokens + 1) dim] = concat(hidden, embedding[paths[r, 0]], ...,
//! embedding[paths[r, tokens - 1]]); one block per row.
template <int Unused = 0>
__global__ void heads_gather_kernel(float const* __restrict__ hidden,
                                    float const* __restrict__ embedding,
                                    std::int32_t const* __restrict__ paths, std::int32_t tokens,
                                    std::int32_t dim, float* __restrict__ u) {
  std::int64_t const r = blockIdx.x;
  std::int64_t const width = static_cast<std::int64_t>(tokens + 1) * dim;
  float* const row = u + r * width;
  for (std::int64_t j = threadIdx.x; j < width; j += blockDim.x) {
    std::int64_t const part = j / dim, c = j % dim;
    row[j] = part == 0
                 ? hidden[c]
                 : embedding[static_cast<std::int64_t>(paths[r * tokens + part - 1]) * dim + c];
  }
}

#endif  // __CUDACC__

}  // namespace specdec::cuda::detail

namespace specdec {

#if defined(__CUDACC__)

namespace cuda::detail {

//! What both CUDA heads runners share: a stream, a cuBLAS handle, the uploaded weights, the
//! products and the elementwise launches.
class heads_device {
 public:
  //! A residual block's weights on the device.
  struct block {
    float const* weight;  //!< [dim, dim]
    float const* bias;    //!< [dim]
  };

  explicit heads_device(int device) {
    if (device >= 0) SPECDEC_CUDA_CHECK(cudaSetDevice(device));
    SPECDEC_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    if (cublasCreate(&cublas_) != CUBLAS_STATUS_SUCCESS) {
      cudaStreamDestroy(stream_);
      SPECDEC_THROW(internal, "cuda heads: cublasCreate failed");
    }
    cublasSetStream(cublas_, stream_);
    cublasSetMathMode(cublas_, CUBLAS_DEFAULT_MATH);
  }
  ~heads_device() {
    cudaStreamSynchronize(stream_);
    cublasDestroy(cublas_);
    cudaStreamDestroy(stream_);
  }
  heads_device(heads_device const&) = delete;
  heads_device& operator=(heads_device const&) = delete;

  //! Uploads a residual block.
  block put(head_block const& b, std::size_t dim) {
    return {put(b.weight, dim * dim), put(b.bias, dim)};
  }

  //! x = x + SiLU(x W^T + b) for n rows of `dim`, with `y` [n, dim] as scratch.
  void residual_block(block const& b, std::size_t dim, float* x, float* y, std::size_t n) {
    product(b.weight, dim, dim, x, n, y, 0.0f);
    residual_silu(x, y, nullptr, b.bias, dim, n);
  }

  //! Reserves `count` floats of weights; `put` then copies host tensors in and returns offsets.
  void reserve_weights(std::size_t count) { weights_.resize(count); }
  //! Copies `count` floats from `src` to the next free place of the weights; returns the place.
  //! The copy is ordered before the stream's later work (the stream does not synchronise with
  //! the legacy stream a plain cudaMemcpy runs on); `src` may be released when it returns (a
  //! pageable source is staged before the call returns).
  float const* put(float const* src, std::size_t count) {
    SPECDEC_CHECK(src != nullptr && used_ + count <= weights_.size(), internal,
                  "cuda heads: weight upload out of place");
    float* const dst = weights_.data() + used_;
    SPECDEC_CUDA_CHECK(
        cudaMemcpyAsync(dst, src, count * sizeof(float), cudaMemcpyHostToDevice, stream_));
    used_ += count;
    return dst;
  }

  //! y [n, rows] (+)= x [n, k] W^T for W [rows, k] row-major, on the device.
  void product(float const* w, std::size_t rows, std::size_t k, float const* x, std::size_t n,
               float* y, float beta) {
    float const alpha = 1.0f;
    SPECDEC_CUBLAS_CHECK(cublasSgemm(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(rows),
                                     static_cast<int>(n), static_cast<int>(k), &alpha, w,
                                     static_cast<int>(k), x, static_cast<int>(k), &beta, y,
                                     static_cast<int>(rows)));
  }

  //! x = x + x_bias + SiLU(y + y_bias) over n rows of `dim` (x_bias may be null).
  void residual_silu(float* x, float const* y, float const* x_bias, float const* y_bias,
                     std::size_t dim, std::size_t n) {
    auto const total = static_cast<std::int64_t>(n * dim);
    heads_residual_silu_kernel<<<blocks(total), block_threads, 0, stream_>>>(
        x, y, x_bias, y_bias, static_cast<std::int32_t>(dim), total);
  }

  //! y [n, cols] += bias per row.
  void add_bias(float* y, float const* bias, std::size_t cols, std::size_t n) {
    auto const total = static_cast<std::int64_t>(n * cols);
    heads_bias_kernel<<<blocks(total), block_threads, 0, stream_>>>(
        y, bias, static_cast<std::int32_t>(cols), total);
  }

  //! Throws `specdec::error` when a launch of this call failed.
  void check_launches(char const* where) { throw_if_failed(last_launch_status(where), where); }

  [[nodiscard]] cudaStream_t stream() const noexcept { return stream_; }

 private:
  static unsigned blocks(std::int64_t total) {
    return static_cast<unsigned>(std::clamp<std::int64_t>(ceil_div(total, block_threads), 1, 4096));
  }

  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  device_buffer<float> weights_;
  std::size_t used_ = 0;
};

}  // namespace cuda::detail

//! Options of the CUDA heads runners.
struct cuda_heads_options {
  int device = -1;  //!< CUDA device ordinal; -1 = the current device
};

//! Medusa heads on a CUDA device: the logits of every head on one hidden row. A
//! `medusa_heads_runner` (propose/medusa.hpp). Not thread-safe; all work on its own stream.
class cuda_medusa_heads {
 public:
  //! Uploads `heads` (which may be released afterwards).
  explicit cuda_medusa_heads(medusa_weights const& heads, cuda_heads_options options = {})
      : dev_(options.device), dim_(heads.dim), vocab_(heads.vocab) {
    SPECDEC_CHECK(!heads.heads.empty(), invalid_argument, "cuda_medusa_heads: no heads");
    std::size_t total = 0;
    for (auto const& h : heads.heads)
      total += h.blocks.size() * (dim_ * dim_ + dim_) + vocab_ * dim_;
    dev_.reserve_weights(total);
    for (auto const& h : heads.heads) {
      head d;
      for (head_block const& b : h.blocks) d.blocks.push_back(dev_.put(b, dim_));
      d.lm_head = dev_.put(h.lm_head, vocab_ * dim_);
      heads_.push_back(std::move(d));
    }
    x_.resize(dim_);
    y_.resize(dim_);
    logits_.resize(heads_.size() * vocab_);
  }

  //! Number of heads (K).
  [[nodiscard]] std::size_t num_heads() const noexcept { return heads_.size(); }
  //! Width of the hidden row.
  [[nodiscard]] std::size_t hidden_size() const noexcept { return dim_; }
  //! Logits per head.
  [[nodiscard]] std::size_t vocab_size() const noexcept { return vocab_; }

  //! logits [num_heads, vocab] (host) of the heads on `hidden` [hidden_size] (host).
  void run(std::span<float const> hidden, matrix_view<float> logits) {
    SPECDEC_CHECK(hidden.size() == dim_ && logits.rows() == num_heads() && logits.cols() == vocab_,
                  invalid_argument, "cuda_medusa_heads::run: a hidden row of ", hidden.size(),
                  " floats and logits of ", logits.rows(), " x ", logits.cols(), " for ",
                  num_heads(), " heads of dim ", dim_, " and vocab ", vocab_);
    cudaStream_t const s = dev_.stream();
    for (std::size_t i = 0; i < heads_.size(); ++i) {
      x_.upload(hidden, s);
      for (auto const& b : heads_[i].blocks) dev_.residual_block(b, dim_, x_.data(), y_.data(), 1);
      dev_.product(heads_[i].lm_head, vocab_, dim_, x_.data(), 1, logits_.data() + i * vocab_,
                   0.0f);
    }
    dev_.check_launches("cuda_medusa_heads::run");
    for (std::size_t i = 0; i < heads_.size(); ++i)
      SPECDEC_CUDA_CHECK(cudaMemcpyAsync(logits.row(i).data(), logits_.data() + i * vocab_,
                                         vocab_ * sizeof(float), cudaMemcpyDeviceToHost, s));
    SPECDEC_CUDA_CHECK(cudaStreamSynchronize(s));
  }

 private:
  struct head {
    std::vector<cuda::detail::heads_device::block> blocks;
    float const* lm_head = nullptr;
  };

  cuda::detail::heads_device dev_;
  std::size_t dim_, vocab_;
  std::vector<head> heads_;
  cuda::device_buffer<float> x_, y_, logits_;
};

//! Hydra heads on a CUDA device: head d for a batch of drafted paths, with the target's token
//! embedding uploaded beside the heads. A `hydra_heads_runner` (propose/hydra.hpp). Not
//! thread-safe; all work on its own stream.
class cuda_hydra_heads {
 public:
  //! Uploads `heads` and the token embedding of `target` (both may be released afterwards).
  //! Throws `errc::invalid_argument` when the heads do not fit the target.
  cuda_hydra_heads(hydra_weights const& heads, llama_weights const& target,
                   cuda_heads_options options = {})
      : dev_(options.device), dim_(heads.dim), vocab_(heads.vocab) {
    SPECDEC_CHECK(!heads.heads.empty() && target.token_embedding != nullptr, invalid_argument,
                  "cuda_hydra_heads: no heads or no target embedding");
    SPECDEC_CHECK(static_cast<std::size_t>(target.config.dim) == dim_ &&
                      static_cast<std::size_t>(target.config.vocab_size) == vocab_,
                  invalid_argument, "cuda_hydra_heads: heads of dim ", dim_, " and vocab ", vocab_,
                  " for a target of dim ", target.config.dim, " and vocab ",
                  target.config.vocab_size);
    std::size_t total = vocab_ * dim_;
    for (std::size_t i = 0; i < heads.heads.size(); ++i)
      total += 2 * (dim_ * heads.input_width(i) + dim_) +
               heads.heads[i].blocks.size() * (dim_ * dim_ + dim_) + vocab_ * dim_ + vocab_;
    dev_.reserve_weights(total);
    embedding_ = dev_.put(target.token_embedding, vocab_ * dim_);
    for (std::size_t i = 0; i < heads.heads.size(); ++i) {
      auto const& h = heads.heads[i];
      std::size_t const in = heads.input_width(i);
      head d;
      d.in_weight = dev_.put(h.in_weight, dim_ * in);
      d.in_bias = dev_.put(h.in_bias, dim_);
      d.res_weight = dev_.put(h.res_weight, dim_ * in);
      d.res_bias = dev_.put(h.res_bias, dim_);
      for (head_block const& b : h.blocks) d.blocks.push_back(dev_.put(b, dim_));
      d.lm_head = dev_.put(h.lm_head, vocab_ * dim_);
      d.lm_bias = dev_.put(h.lm_bias, vocab_);
      heads_.push_back(std::move(d));
    }
    hidden_.resize(dim_);
  }

  //! Number of heads (K).
  [[nodiscard]] std::size_t num_heads() const noexcept { return heads_.size(); }
  //! Width of the hidden row.
  [[nodiscard]] std::size_t hidden_size() const noexcept { return dim_; }
  //! Logits per head.
  [[nodiscard]] std::size_t vocab_size() const noexcept { return vocab_; }

  //! logits [n, vocab] (host) of head `head` for the paths `paths` [n, head + 1] (host; root
  //! first) after `hidden` [hidden_size] (host). Errors as `cpu_hydra_heads::run`.
  void run(std::size_t head, std::span<float const> hidden, matrix_view<token_id const> paths,
           matrix_view<float> logits) {
    std::size_t const n = paths.rows();
    SPECDEC_CHECK(head < num_heads() && hidden.size() == dim_ && paths.cols() == head + 1 &&
                      logits.rows() == n && logits.cols() == vocab_,
                  invalid_argument, "cuda_hydra_heads::run: head ", head, " of ", num_heads(),
                  ", a hidden row of ", hidden.size(), " floats, paths of ", n, " x ", paths.cols(),
                  ", logits of ", logits.rows(), " x ", logits.cols());
    if (n == 0) return;
    std::size_t const tokens = head + 1, width = (tokens + 1) * dim_;
    staged_.resize(n * tokens);
    for (std::size_t r = 0; r < n; ++r) {
      for (std::size_t j = 0; j < tokens; ++j) {
        token_id const t = paths(r, j);
        SPECDEC_CHECK(t >= 0 && static_cast<std::size_t>(t) < vocab_, out_of_range,
                      "cuda_hydra_heads::run: token ", t, " of path ", r,
                      " is outside the vocabulary of ", vocab_);
        staged_[r * tokens + j] = t;
      }
    }
    paths_.reserve(n * tokens);
    u_.reserve(n * width);
    x_.reserve(n * dim_);
    y_.reserve(n * dim_);
    out_.reserve(n * vocab_);
    cudaStream_t const s = dev_.stream();
    hidden_.upload(hidden, s);
    paths_.upload(std::span<std::int32_t const>(staged_), s);
    cuda::detail::
        heads_gather_kernel<<<static_cast<unsigned>(n), cuda::detail::block_threads, 0, s>>>(
            hidden_.data(), embedding_, paths_.data(), static_cast<std::int32_t>(tokens),
            static_cast<std::int32_t>(dim_), u_.data());
    auto const& h = heads_[head];
    dev_.product(h.res_weight, dim_, width, u_.data(), n, x_.data(), 0.0f);
    dev_.product(h.in_weight, dim_, width, u_.data(), n, y_.data(), 0.0f);
    dev_.residual_silu(x_.data(), y_.data(), h.res_bias, h.in_bias, dim_, n);
    for (auto const& b : h.blocks) dev_.residual_block(b, dim_, x_.data(), y_.data(), n);
    dev_.product(h.lm_head, vocab_, dim_, x_.data(), n, out_.data(), 0.0f);
    dev_.add_bias(out_.data(), h.lm_bias, vocab_, n);
    dev_.check_launches("cuda_hydra_heads::run");
    SPECDEC_CUDA_CHECK(cudaMemcpy2DAsync(logits.data(), logits.stride() * sizeof(float),
                                         out_.data(), vocab_ * sizeof(float),
                                         vocab_ * sizeof(float), n, cudaMemcpyDeviceToHost, s));
    SPECDEC_CUDA_CHECK(cudaStreamSynchronize(s));
  }

 private:
  struct head {
    float const *in_weight = nullptr, *in_bias = nullptr, *res_weight = nullptr,
                *res_bias = nullptr;
    std::vector<cuda::detail::heads_device::block> blocks;
    float const *lm_head = nullptr, *lm_bias = nullptr;
  };

  cuda::detail::heads_device dev_;
  std::size_t dim_, vocab_;
  float const* embedding_ = nullptr;  // [vocab, dim] on the device
  std::vector<head> heads_;
  std::vector<std::int32_t> staged_;  // [n, head + 1] the paths on the host
  cuda::device_buffer<float> hidden_, u_, x_, y_, out_;
  cuda::device_buffer<std::int32_t> paths_;
};

#endif  // __CUDACC__

}  // namespace specdec
