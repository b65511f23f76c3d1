#pragma once
//! \file
//! `cuda_eagle_head`: the EAGLE head's forward on one CUDA device (model/eagle.hpp gives the
//! computation), the head runner of propose/eagle.hpp for a target that runs on the GPU. Its
//! interface is `cpu_eagle_head`'s (backend/cpu/eagle.hpp): host inputs in, host outputs and
//! logits out, so the proposer runs unchanged on either backend; the head's KV cache lives on the
//! device (a one-layer `cuda_kv_cache`).
//!
//! The layer is `cuda_llama`'s: cuBLAS for the products (no TF32; through the heads' device
//! helper, heads.cuh), and the backend's kernels for RMSNorm, RoPE, the K / V append, SwiGLU
//! (elementwise.cuh) and the masked attention (attention.cuh, whose visible prefix is here the
//! committed entries, so that a tree row sees them and, through the mask, its ancestors' entries
//! from earlier calls). Two small kernels of its own place the concatenated inputs: fc's
//! [embedding, feature] (EAGLE-1) and the attention's [norm(embedding), norm(u)] (EAGLE-3).
//!
//! The kernels are templates (`template <int Unused = 0>`): common.cuh says why.

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <vector>

#include "specdec/backend/cuda/attention.cuh"
#include "specdec/backend/cuda/common.cuh"
#include "specdec/backend/cuda/elementwise.cuh"
#include "specdec/backend/cuda/heads.cuh"
#include "specdec/backend/cuda/kv_cache.cuh"
#include "specdec/core/error.hpp"
#include "specdec/core/types.hpp"
#include "specdec/core/views.hpp"
#include "specdec/model/eagle.hpp"

namespace specdec::cuda::detail {

#if defined(__CUDACC__)

//! Row i of out [n, wa + wb] = concat(a[i, :wa], b[i, :wb]) (a, b rows wa and wb apart); when
//! `a_rows` is given, the first part is row a_rows[i] of a (an embedding lookup). One block per
//! row.
template <int Unused = 0>
__global__ void eagle_concat_kernel(float const* __restrict__ a,
                                    std::int32_t const* __restrict__ a_rows, std::int32_t wa,
                                    float const* __restrict__ b, std::int32_t wb,
                                    float* __restrict__ out) {
  std::int64_t const i = blockIdx.x;
  std::int64_t const width = static_cast<std::int64_t>(wa) + wb;
  float const* const ra = a + (a_rows != nullptr ? a_rows[i] : i) * static_cast<std::int64_t>(wa);
  float const* const rb = b + i * static_cast<std::int64_t>(wb);
  float* const o = out + i * width;
  for (std::int64_t j = threadIdx.x; j < width; j += blockDim.x) o[j] = j < wa ? ra[j] : rb[j - wa];
}

#endif  // __CUDACC__

}  // namespace specdec::cuda::detail

namespace specdec {

#if defined(__CUDACC__)

//! Options of `cuda_eagle_head`.
struct cuda_eagle_options {
  std::size_t max_context = 0;  //!< head cache entries and positions; 0 = the target's seq_len
  int device = -1;              //!< CUDA device ordinal; -1 = the current device
};

//! An EAGLE head on a CUDA device: `forward` appends a batch of rows to the head's device KV
//! cache and writes their outputs (host), `logits` maps outputs to draft-vocabulary logits (host).
//! An `eagle_head_runner` (propose/eagle.hpp). Not thread-safe; all work on its own stream.
class cuda_eagle_head {
 public:
  //! Uploads `weights` (the head's and the target's embedding, and EAGLE-1's classifier; they may
  //! be released afterwards). Throws `errc::invalid_argument` for incomplete weights,
  //! `errc::unsupported` when the attention's shared memory exceeds the device's.
  explicit cuda_eagle_head(eagle_weights const& w, cuda_eagle_options options = {})
      : dev_(options.device),
        version_(w.config.version),
        dim_(w.dim),
        vocab_(w.vocab),
        draft_vocab_(w.draft_vocab),
        feature_width_(w.feature_width()),
        fc_width_(w.fc_width()),
        att_width_(w.attention_width()),
        heads_(w.config.num_heads),
        kv_heads_(w.config.num_kv_heads),
        hs_(w.config.head_dim),
        q_dim_(w.config.q_dim()),
        kv_dim_(w.config.kv_dim()),
        inner_(w.config.intermediate_size),
        eps_(w.config.rms_eps),
        theta_(w.config.rope_theta),
        draft_to_target_(w.draft_to_target),
        target_layers_(w.target_layers) {
    bool const e3 = version_ == eagle_version::eagle3;
    SPECDEC_CHECK(w.target != nullptr && w.embedding && w.fc && w.wq && w.wk && w.wv && w.wo &&
                      w.post_norm && w.w1 && w.w2 && w.w3 && w.lm_head &&
                      (!e3 || (w.input_norm && w.hidden_norm && w.norm)),
                  invalid_argument, "cuda_eagle_head: missing weights");
    max_context_ = options.max_context != 0 ? options.max_context
                                            : static_cast<std::size_t>(w.target->config.seq_len);
    SPECDEC_CHECK(max_context_ >= 1 && max_context_ <= static_cast<std::size_t>(INT32_MAX / 2),
                  invalid_argument, "cuda_eagle_head: max_context ", max_context_);
    std::size_t const qkv = q_dim_ + 2 * kv_dim_;
    std::size_t total = vocab_ * dim_ + dim_ * fc_width_ + qkv * att_width_ + dim_ * q_dim_ + dim_ +
                        3 * inner_ * dim_ + draft_vocab_ * dim_;
    if (w.fc_bias != nullptr) total += dim_;
    if (e3) total += 3 * dim_;
    dev_.reserve_weights(total);
    embedding_ = dev_.put(w.embedding, vocab_ * dim_);
    fc_ = dev_.put(w.fc, dim_ * fc_width_);
    if (w.fc_bias != nullptr) fc_bias_ = dev_.put(w.fc_bias, dim_);
    if (e3) {
      input_norm_ = dev_.put(w.input_norm, dim_);
      hidden_norm_ = dev_.put(w.hidden_norm, dim_);
    }
    // q, k and v fused (one product); gate and up fused (SwiGLU's layout).
    wqkv_ = dev_.put(w.wq, q_dim_ * att_width_);
    (void)dev_.put(w.wk, kv_dim_ * att_width_);
    (void)dev_.put(w.wv, kv_dim_ * att_width_);
    wo_ = dev_.put(w.wo, dim_ * q_dim_);
    post_norm_ = dev_.put(w.post_norm, dim_);
    w13_ = dev_.put(w.w1, inner_ * dim_);
    (void)dev_.put(w.w3, inner_ * dim_);
    w2_ = dev_.put(w.w2, dim_ * inner_);
    if (e3) norm_ = dev_.put(w.norm, dim_);
    lm_head_ = dev_.put(w.lm_head, draft_vocab_ * dim_);
    cache_ = std::make_unique<cuda_kv_cache>(1, static_cast<std::int32_t>(kv_dim_), max_context_,
                                             dev_.stream());
    cuda::detail::allow_attention_smem(hs_, max_context_, "cuda_eagle_head",
                                       cuda::detail::attention_kernel<float>);
  }

  //! The head's kind.
  [[nodiscard]] eagle_version version() const noexcept { return version_; }
  //! Width of the head's outputs (the target's dim).
  [[nodiscard]] std::size_t hidden_size() const noexcept { return dim_; }
  //! Width of a target feature row.
  [[nodiscard]] std::size_t feature_width() const noexcept { return feature_width_; }
  //! The target's vocabulary.
  [[nodiscard]] std::size_t vocab_size() const noexcept { return vocab_; }
  //! Logits per row of `logits`.
  [[nodiscard]] std::size_t draft_vocab_size() const noexcept { return draft_vocab_; }
  //! [draft_vocab] the target id of each draft id, or empty for the identity.
  [[nodiscard]] std::span<token_id const> draft_to_target() const noexcept {
    return draft_to_target_;
  }
  //! The target layers a feature is made of (empty: the final hidden state).
  [[nodiscard]] std::span<std::int32_t const> target_layers() const noexcept {
    return target_layers_;
  }
  //! Entries the cache can hold; every position must be below it.
  [[nodiscard]] std::size_t max_context() const noexcept { return max_context_; }
  //! The head's device KV cache (truncate it to roll back).
  [[nodiscard]] cuda_kv_cache& cache() noexcept { return *cache_; }

  //! Appends the rows of `batch` (host) to the device cache and writes their outputs to `out`
  //! [n, dim] (host). Errors as `cpu_eagle_head::forward`; the cache is unchanged when it throws.
  void forward(eagle_batch const& batch, matrix_view<float> out) {
    std::size_t const n = batch.tokens.size();
    validate(batch, out);
    std::size_t const size = cache_->size();
    bool const e3 = version_ == eagle_version::eagle3;
    std::size_t const in_width = batch.from_target ? feature_width_ : dim_;
    std::size_t const words = batch.mask.empty() ? 0 : batch.mask_stride;
    reserve(n);

    // Stage the inputs: rows, tokens, positions, the mask (bits after a row's own entry
    // cleared: a row never sees a later one).
    staged_in_.resize(n * in_width);
    for (std::size_t i = 0; i < n; ++i) {
      std::span<float const> const r = batch.inputs.row(i);
      std::copy(r.begin(), r.end(), staged_in_.begin() + static_cast<std::ptrdiff_t>(i * in_width));
    }
    staged_ids_.resize(2 * n + 1);  // tokens | positions | the cache's size
    for (std::size_t i = 0; i < n; ++i) {
      staged_ids_[i] = batch.tokens[i];
      staged_ids_[n + i] = batch.positions[i];
    }
    staged_ids_[2 * n] = static_cast<std::int32_t>(size);
    staged_mask_.assign(n * words, 0);
    for (std::size_t i = 0; i < n && words != 0; ++i) {
      std::size_t const bits = size + i + 1 - batch.shared;
      for (std::size_t w = 0; w < words; ++w) {
        std::uint64_t m = batch.mask[i * batch.mask_stride + w];
        if (w * 64 >= bits)
          m = 0;
        else if (bits - w * 64 < 64)
          m &= (std::uint64_t{1} << (bits - w * 64)) - 1;
        staged_mask_[i * words + w] = m;
      }
    }
    cudaStream_t const s = dev_.stream();
    in_.upload(std::span<float const>(staged_in_), s);
    ids_.upload(std::span<std::int32_t const>(staged_ids_), s);
    if (words != 0) {
      mask_.reserve(n * words);
      mask_.upload(std::span<std::uint64_t const>(staged_mask_), s);
    }
    std::int32_t const* tokens = ids_.data();
    std::int32_t const* positions = ids_.data() + n;
    std::int32_t const* size_at = ids_.data() + 2 * n;  // the kernels read the length on the device
    auto const ni = static_cast<unsigned>(n);
    constexpr unsigned threads = cuda::detail::block_threads;
    auto const i32 = [](std::size_t v) { return static_cast<std::int32_t>(v); };

    // u = fc(x) (+ bias), or the input itself (EAGLE-3, outputs of the head).
    if (!e3) {
      cuda::detail::eagle_concat_kernel<<<ni, threads, 0, s>>>(embedding_, tokens, i32(dim_),
                                                               in_.data(), i32(dim_), x_.data());
      dev_.product(fc_, dim_, fc_width_, x_.data(), n, u_.data(), 0.0f);
    } else if (batch.from_target) {
      dev_.product(fc_, dim_, fc_width_, in_.data(), n, u_.data(), 0.0f);
    } else {
      SPECDEC_CUDA_CHECK(cudaMemcpyAsync(u_.data(), in_.data(), n * dim_ * sizeof(float),
                                         cudaMemcpyDeviceToDevice, s));
    }
    if (fc_bias_ != nullptr) dev_.add_bias(u_.data(), fc_bias_, dim_, n);

    // The attention's input: u, or [input_norm(E(token)), hidden_norm(u)].
    float const* a = u_.data();
    if (e3) {
      cuda::detail::eagle_concat_kernel<<<ni, threads, 0, s>>>(embedding_, tokens, i32(dim_),
                                                               u_.data(), i32(dim_), x_.data());
      // Both halves normed in place: [n, 2 dim] as 2n rows of dim, weights alternating.
      cuda::detail::rmsnorm_kernel<<<ni, threads, 0, s>>>(x_.data(), even_rows_.data(), input_norm_,
                                                          xb_.data(), i32(dim_), eps_);
      cuda::detail::rmsnorm_kernel<<<ni, threads, 0, s>>>(x_.data(), odd_rows_.data(), hidden_norm_,
                                                          xb_.data() + n * dim_, i32(dim_), eps_);
      cuda::detail::eagle_concat_kernel<<<ni, threads, 0, s>>>(
          xb_.data(), nullptr, i32(dim_), xb_.data() + n * dim_, i32(dim_), a_.data());
      a = a_.data();
    }

    // q, k, v in one product; RoPE; k and v into the cache; attention.
    std::size_t const qkv = q_dim_ + 2 * kv_dim_;
    dev_.product(wqkv_, qkv, att_width_, a, n, qkv_.data(), 0.0f);
    cuda::detail::rope_kernel<<<ni, threads, 0, s>>>(qkv_.data(), positions, i32(qkv), i32(q_dim_),
                                                     i32(kv_dim_), i32(hs_), theta_);
    cuda::detail::kv_append_kernel<<<ni, threads, 0, s>>>(qkv_.data(), i32(qkv), i32(q_dim_),
                                                          i32(kv_dim_), cache_->keys(0),
                                                          cache_->values(0), size_at);
    cuda::detail::attention_kernel<<<dim3(static_cast<unsigned>(heads_), ni), attention_threads,
                                     attention_smem(size + n), s>>>(
        qkv_.data(), i32(qkv), cache_->keys(0), cache_->values(0), size_at, i32(n),
        words != 0 ? i32(batch.shared) : i32(size), words != 0 ? mask_.data() : nullptr, i32(words),
        att_.data(), i32(q_dim_), i32(kv_dim_), i32(hs_), i32(heads_ / kv_heads_));

    // h = u + o_proj(att); h += down(SwiGLU(gate, up)(post_norm(h))).
    SPECDEC_CUDA_CHECK(cudaMemcpyAsync(h_.data(), u_.data(), n * dim_ * sizeof(float),
                                       cudaMemcpyDeviceToDevice, s));
    dev_.product(wo_, dim_, q_dim_, att_.data(), n, h_.data(), 1.0f);
    cuda::detail::rmsnorm_kernel<<<ni, threads, 0, s>>>(h_.data(), nullptr, post_norm_, xb_.data(),
                                                        i32(dim_), eps_);
    dev_.product(w13_, 2 * inner_, dim_, xb_.data(), n, gu_.data(), 0.0f);
    auto const total = static_cast<std::int64_t>(n * inner_);
    auto const blocks =
        static_cast<unsigned>(std::clamp<std::int64_t>((total + threads - 1) / threads, 1, 4096));
    cuda::detail::swiglu_kernel<<<blocks, threads, 0, s>>>(gu_.data(), hb_.data(), i32(inner_),
                                                           total);
    dev_.product(w2_, dim_, inner_, hb_.data(), n, h_.data(), 1.0f);
    dev_.check_launches("cuda_eagle_head::forward");
    cache_->commit_append(n);
    SPECDEC_CUDA_CHECK(cudaMemcpy2DAsync(out.data(), out.stride() * sizeof(float), h_.data(),
                                         dim_ * sizeof(float), dim_ * sizeof(float), n,
                                         cudaMemcpyDeviceToHost, s));
    SPECDEC_CUDA_CHECK(cudaStreamSynchronize(s));
  }

  //! logits [n, draft_vocab] (host) of the outputs `hidden` [n, dim] (host): EAGLE-3
  //! lm_head(norm(h)), EAGLE-1 the target's classifier on h.
  void logits(matrix_view<float const> hidden, matrix_view<float> logits) {
    std::size_t const n = hidden.rows();
    SPECDEC_CHECK(hidden.cols() == dim_ && logits.rows() == n && logits.cols() == draft_vocab_,
                  invalid_argument, "cuda_eagle_head::logits: ", n, " x ", hidden.cols(),
                  " outputs and logits of ", logits.rows(), " x ", logits.cols(), " for dim ", dim_,
                  " and a draft vocabulary of ", draft_vocab_);
    if (n == 0) return;
    reserve(n);
    cudaStream_t const s = dev_.stream();
    SPECDEC_CUDA_CHECK(cudaMemcpy2DAsync(h_.data(), dim_ * sizeof(float), hidden.data(),
                                         hidden.stride() * sizeof(float), dim_ * sizeof(float), n,
                                         cudaMemcpyHostToDevice, s));
    float const* rows = h_.data();
    if (version_ == eagle_version::eagle3) {
      cuda::detail::rmsnorm_kernel<<<static_cast<unsigned>(n), cuda::detail::block_threads, 0, s>>>(
          h_.data(), nullptr, norm_, xb_.data(), static_cast<std::int32_t>(dim_), eps_);
      rows = xb_.data();
    }
    logits_.reserve(n * draft_vocab_);
    dev_.product(lm_head_, draft_vocab_, dim_, rows, n, logits_.data(), 0.0f);
    dev_.check_launches("cuda_eagle_head::logits");
    SPECDEC_CUDA_CHECK(cudaMemcpy2DAsync(
        logits.data(), logits.stride() * sizeof(float), logits_.data(),
        draft_vocab_ * sizeof(float), draft_vocab_ * sizeof(float), n, cudaMemcpyDeviceToHost, s));
    SPECDEC_CUDA_CHECK(cudaStreamSynchronize(s));
  }

 private:
  static constexpr unsigned attention_threads = cuda::detail::attention_threads;

  [[nodiscard]] std::size_t attention_smem(std::size_t keys) const noexcept {
    return cuda::detail::attention_smem(hs_, keys);
  }

  void validate(eagle_batch const& b, matrix_view<float> out) const {
    std::size_t const n = b.tokens.size();
    std::size_t const width = b.from_target ? feature_width_ : dim_;
    SPECDEC_CHECK(n > 0 && b.positions.size() == n && b.inputs.rows() == n &&
                      b.inputs.cols() == width && out.rows() == n && out.cols() == dim_,
                  invalid_argument, "cuda_eagle_head::forward: ", n, " tokens, ",
                  b.positions.size(), " positions, inputs of ", b.inputs.rows(), " x ",
                  b.inputs.cols(), " (need width ", width, "), outputs of ", out.rows(), " x ",
                  out.cols(), " (need width ", dim_, ")");
    SPECDEC_CHECK(n <= cache_->capacity() - cache_->size(), context_overflow,
                  "cuda_eagle_head::forward: ", n, " rows do not fit the head's cache (",
                  cache_->size(), " of ", cache_->capacity(), " entries used)");
    for (std::size_t i = 0; i < n; ++i) {
      SPECDEC_CHECK(b.tokens[i] >= 0 && static_cast<std::size_t>(b.tokens[i]) < vocab_,
                    out_of_range, "cuda_eagle_head::forward: token ", b.tokens[i], " of row ", i,
                    " is outside the vocabulary of ", vocab_);
      SPECDEC_CHECK(b.positions[i] >= 0 && static_cast<std::size_t>(b.positions[i]) < max_context_,
                    context_overflow, "cuda_eagle_head::forward: position ", b.positions[i],
                    " of row ", i, " is outside the context of ", max_context_);
    }
    if (b.mask.empty()) return;
    std::size_t const size = cache_->size();
    SPECDEC_CHECK(b.shared <= size, invalid_argument, "cuda_eagle_head::forward: ", b.shared,
                  " shared entries but the cache holds ", size);
    std::size_t const bits = size - b.shared + n;
    SPECDEC_CHECK(b.mask_stride >= mask_words(bits) && b.mask.size() >= n * b.mask_stride,
                  invalid_argument, "cuda_eagle_head::forward: a mask of ", b.mask.size(),
                  " words, rows of ", b.mask_stride, ", for ", n, " rows of ", bits, " entries");
    for (std::size_t i = 0; i < n; ++i)
      SPECDEC_CHECK(b.visible(i, size + i, size), invalid_argument,
                    "cuda_eagle_head::forward: mask row ", i, " does not let the row see itself");
  }

  // Device buffers for `n` rows.
  void reserve(std::size_t n) {
    if (n <= reserved_) return;
    in_.resize(n * std::max(feature_width_, dim_));
    ids_.resize(2 * n + 1);
    x_.resize(n * std::max(fc_width_, 2 * dim_));
    u_.resize(n * dim_);
    a_.resize(n * att_width_);
    xb_.resize(2 * n * dim_);
    qkv_.resize(n * (q_dim_ + 2 * kv_dim_));
    att_.resize(n * q_dim_);
    h_.resize(n * dim_);
    gu_.resize(n * 2 * inner_);
    hb_.resize(n * inner_);
    // The rows of the concatenated [n, 2 dim] block as 2n rows of dim: even (the embeddings)
    // and odd (the states), for the two RMSNorms.
    std::vector<std::int32_t> even(n), odd(n);
    for (std::size_t i = 0; i < n; ++i) {
      even[i] = static_cast<std::int32_t>(2 * i);
      odd[i] = static_cast<std::int32_t>(2 * i + 1);
    }
    even_rows_.resize(n);
    odd_rows_.resize(n);
    even_rows_.upload(std::span<std::int32_t const>(even), dev_.stream());
    odd_rows_.upload(std::span<std::int32_t const>(odd), dev_.stream());
    SPECDEC_CUDA_CHECK(cudaStreamSynchronize(dev_.stream()));
    reserved_ = n;
  }

  cuda::detail::heads_device dev_;
  eagle_version version_;
  std::size_t dim_, vocab_, draft_vocab_, feature_width_, fc_width_, att_width_;
  std::size_t heads_, kv_heads_, hs_, q_dim_, kv_dim_, inner_;
  float eps_, theta_;
  std::vector<token_id> draft_to_target_;
  std::vector<std::int32_t> target_layers_;
  std::size_t max_context_ = 0;
  float const *embedding_ = nullptr, *fc_ = nullptr, *fc_bias_ = nullptr;
  float const *input_norm_ = nullptr, *hidden_norm_ = nullptr, *wqkv_ = nullptr, *wo_ = nullptr;
  float const *post_norm_ = nullptr, *w13_ = nullptr, *w2_ = nullptr, *norm_ = nullptr;
  float const* lm_head_ = nullptr;
  std::unique_ptr<cuda_kv_cache> cache_;
  std::size_t reserved_ = 0;
  std::vector<float> staged_in_;
  std::vector<std::int32_t> staged_ids_;
  std::vector<std::uint64_t> staged_mask_;
  cuda::device_buffer<float> in_, x_, u_, a_, xb_, qkv_, att_, h_, gu_, hb_, logits_;
  cuda::device_buffer<std::int32_t> ids_, even_rows_, odd_rows_;
  cuda::device_buffer<std::uint64_t> mask_;
};

#endif  // __CUDACC__

}  // namespace specdec
