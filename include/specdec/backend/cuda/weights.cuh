#pragma once
//! \file
//! `cuda_llama`'s weights on the device (`cuda::llama_device_weights`): every matrix in one
//! allocation, in the weights' dtype (float32, binary16 or bfloat16; weight_layout.hpp), rows
//! padded to 16 bytes, each matrix at a 256-byte boundary; the fused QKV ([dim + 2 kv_dim, dim])
//! and gate/up ([2 hidden, dim]) matrices; the norm vectors in float32 in a second allocation.
//! Uploaded through a pinned staging buffer, converted on the host (`pack_rows`).

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "specdec/backend/cuda/common.cuh"
#include "specdec/backend/cuda/weight_layout.hpp"
#include "specdec/core/error.hpp"
#include "specdec/model/llama_weights.hpp"

namespace specdec::cuda {

//! One matrix on the device: `rows` rows of `cols` elements of the weights' dtype, row r starting
//! `ld` elements (a multiple of 8) after row r - 1; the start is 256-byte aligned.
struct device_matrix {
  void const* data = nullptr;  //!< [rows, ld] elements on the device
  std::int64_t ld = 0;         //!< elements between row starts (padded_cols(cols))
  std::int32_t rows = 0;       //!< output features
  std::int32_t cols = 0;       //!< input features
};

#if defined(__CUDACC__)

//! The weights of a Llama model on one device (see the file comment). Move-only.
class llama_device_weights {
 public:
  //! The matrices of one layer and its norm vectors.
  struct layer {
    device_matrix qkv;               //!< [dim + 2 kv_dim, dim]: wq, wk, wv stacked
    device_matrix wo;                //!< [dim, dim]
    device_matrix w13;               //!< [2 hidden, dim]: w1 (gate) then w3 (up)
    device_matrix w2;                //!< [dim, hidden]
    float const* rms_att = nullptr;  //!< [dim] float32
    float const* rms_ffn = nullptr;  //!< [dim] float32
  };

  //! Uploads `w` as `dtype` (synchronously, with `stream`). Throws `specdec::error` for missing
  //! tensors, values that do not fit the dtype, or too little device memory.
  llama_device_weights(llama_weights const& w, weight_dtype dtype, cudaStream_t stream)
      : dtype_(dtype) {
    llama_config const& c = w.config;
    auto const d = static_cast<std::size_t>(c.dim), h = static_cast<std::size_t>(c.hidden_dim),
               kv = static_cast<std::size_t>(c.kv_dim()),
               v = static_cast<std::size_t>(c.vocab_size);
    auto const nl = static_cast<std::size_t>(c.n_layers);
    SPECDEC_CHECK(w.token_embedding != nullptr && w.rms_final != nullptr &&
                      w.classifier != nullptr && w.layers.size() == nl,
                  invalid_argument, "cuda_llama: incomplete weights (", w.layers.size(),
                  " layers for n_layers ", c.n_layers, ")");
    bool const shared = w.classifier == w.token_embedding;

    // Lay out: byte offsets of the matrices, float offsets of the vectors.
    std::size_t bytes = 0;
    auto place = [&](std::size_t rows, std::size_t cols) {
      placed p{bytes, rows, cols};
      bytes += (packed_bytes(rows, cols, dtype) + 255) / 256 * 256;
      return p;
    };
    std::size_t floats = 0;
    auto place_vector = [&](std::size_t n) {
      std::size_t const at = floats;
      floats += (n + 63) / 64 * 64;
      return at;
    };
    placed const embedding = place(v, d);
    std::vector<placed> qkv, wo, w13, w2;
    std::vector<std::size_t> rms_att, rms_ffn;
    for (std::size_t i = 0; i < nl; ++i) {
      qkv.push_back(place(d + 2 * kv, d));
      wo.push_back(place(d, d));
      w13.push_back(place(2 * h, d));
      w2.push_back(place(d, h));
      rms_att.push_back(place_vector(d));
      rms_ffn.push_back(place_vector(d));
    }
    placed const classifier = shared ? embedding : place(v, d);
    std::size_t const rms_final = place_vector(d);
    matrices_.resize(bytes);
    vectors_.resize(floats);
    matrix_bytes_ = bytes;

    // Upload through a pinned staging buffer, one part of a matrix (whole rows) at a time.
    uploader up(stream);
    auto put_rows = [&](placed const& p, std::size_t row0, float const* src, std::size_t rows,
                        char const* what) {
      SPECDEC_CHECK(src != nullptr, invalid_argument, "cuda_llama: weight ", what, " is null");
      std::size_t const row_bytes = packed_bytes(1, p.cols, dtype);
      std::size_t const per_chunk = std::max<std::size_t>(1, uploader::capacity / row_bytes);
      for (std::size_t r = 0; r < rows; r += per_chunk) {
        std::size_t const m = std::min(per_chunk, rows - r);
        std::byte* stage = up.stage(m * row_bytes);
        pack_rows(src + r * p.cols, m, p.cols, dtype, stage, what);
        up.send(matrices_.data() + p.offset + (row0 + r) * row_bytes, m * row_bytes);
      }
    };
    auto put_vector = [&](std::size_t at, float const* src, std::size_t n, char const* what) {
      SPECDEC_CHECK(src != nullptr, invalid_argument, "cuda_llama: weight ", what, " is null");
      std::byte* stage = up.stage(n * sizeof(float));
      std::copy(src, src + n, reinterpret_cast<float*>(stage));
      up.send(vectors_.data() + at, n * sizeof(float));
    };
    put_rows(embedding, 0, w.token_embedding, v, "token_embedding");
    layers_.resize(nl);
    for (std::size_t i = 0; i < nl; ++i) {
      llama_layer_weights const& src = w.layers[i];
      put_rows(qkv[i], 0, src.wq, d, "wq");
      put_rows(qkv[i], d, src.wk, kv, "wk");
      put_rows(qkv[i], d + kv, src.wv, kv, "wv");
      put_rows(wo[i], 0, src.wo, d, "wo");
      put_rows(w13[i], 0, src.w1, h, "w1");
      put_rows(w13[i], h, src.w3, h, "w3");
      put_rows(w2[i], 0, src.w2, d, "w2");
      put_vector(rms_att[i], src.rms_att, d, "rms_att");
      put_vector(rms_ffn[i], src.rms_ffn, d, "rms_ffn");
      layers_[i] = layer{matrix(qkv[i]), matrix(wo[i]),      matrix(w13[i]),
                         matrix(w2[i]),  vector(rms_att[i]), vector(rms_ffn[i])};
    }
    if (!shared) put_rows(classifier, 0, w.classifier, v, "classifier");
    put_vector(rms_final, w.rms_final, d, "rms_final");
    up.finish();
    embedding_ = matrix(embedding);
    classifier_ = matrix(classifier);
    rms_final_ = vector(rms_final);
  }

  //! Layer `i`'s matrices and norms.
  [[nodiscard]] layer const& at(std::size_t i) const noexcept { return layers_[i]; }
  //! The token embedding [vocab, dim].
  [[nodiscard]] device_matrix const& embedding() const noexcept { return embedding_; }
  //! The classifier [vocab, dim] (the embedding itself when tied).
  [[nodiscard]] device_matrix const& classifier() const noexcept { return classifier_; }
  //! The final norm [dim], float32.
  [[nodiscard]] float const* rms_final() const noexcept { return rms_final_; }
  //! The dtype of the matrices.
  [[nodiscard]] weight_dtype dtype() const noexcept { return dtype_; }
  //! Bytes of the matrices on the device (padding included): what a decode step streams.
  [[nodiscard]] std::size_t matrix_bytes() const noexcept { return matrix_bytes_; }
  //! Bytes of the norm vectors.
  [[nodiscard]] std::size_t vector_bytes() const noexcept {
    return vectors_.size() * sizeof(float);
  }

 private:
  struct placed {
    std::size_t offset, rows, cols;  // byte offset in matrices_, shape
  };

  // A pinned staging buffer and the copies out of it: `stage` waits for the previous copy before
  // handing the buffer out again.
  class uploader {
   public:
    static constexpr std::size_t capacity = std::size_t{16} << 20;
    explicit uploader(cudaStream_t stream) : stream_(stream) {
      void* p = nullptr;
      SPECDEC_CUDA_CHECK(cudaMallocHost(&p, capacity));
      buffer_ = static_cast<std::byte*>(p);
    }
    ~uploader() {
      if (pending_) (void)cudaStreamSynchronize(stream_);
      cudaFreeHost(buffer_);
    }
    uploader(uploader const&) = delete;
    uploader& operator=(uploader const&) = delete;
    std::byte* stage(std::size_t bytes) {
      SPECDEC_CHECK(bytes <= capacity, unsupported, "cuda_llama: a weight row of ", bytes,
                    " bytes exceeds the upload buffer of ", capacity);
      finish();
      return buffer_;
    }
    void send(void* dst, std::size_t bytes) {
      SPECDEC_CUDA_CHECK(cudaMemcpyAsync(dst, buffer_, bytes, cudaMemcpyHostToDevice, stream_));
      pending_ = true;
    }
    void finish() {
      if (pending_) SPECDEC_CUDA_CHECK(cudaStreamSynchronize(stream_));
      pending_ = false;
    }

   private:
    cudaStream_t stream_;
    std::byte* buffer_ = nullptr;
    bool pending_ = false;
  };

  [[nodiscard]] device_matrix matrix(placed const& p) const noexcept {
    return device_matrix{matrices_.data() + p.offset,
                         static_cast<std::int64_t>(padded_cols(p.cols)),
                         static_cast<std::int32_t>(p.rows), static_cast<std::int32_t>(p.cols)};
  }
  [[nodiscard]] float const* vector(std::size_t at) const noexcept { return vectors_.data() + at; }

  weight_dtype dtype_;
  device_buffer<std::byte> matrices_;
  device_buffer<float> vectors_;
  std::size_t matrix_bytes_ = 0;
  std::vector<layer> layers_;
  device_matrix embedding_, classifier_;
  float const* rms_final_ = nullptr;
};

#endif  // __CUDACC__

}  // namespace specdec::cuda
