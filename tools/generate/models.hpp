#pragma once
// The models specdec-generate runs: `lm`, a `causal_lm` whose backend -- the CPU (cpu_llama) or a
// CUDA device (cuda_llama) -- is chosen at run time by --device, with the matrices' type on the
// device chosen by --dtype. The strategies build every model they need (the target, a draft
// model) through `make_lm`, so each strategy runs on either device unchanged.
//
// The CUDA models are built in a translation unit of their own (cuda_models.cu), compiled by nvcc
// only when CMake enables CUDA; this header names no CUDA type. Without CUDA in the build, or
// without a usable device at run time, --device cuda fails with a message saying which.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>

#include "specdec/backend/cuda/weight_layout.hpp"
#include "specdec/core/error.hpp"
#include "specdec/core/forward.hpp"
#include "specdec/model/llama_weights.hpp"

namespace generate {

namespace sd = specdec;

//! Where the models run (--device).
enum class device_kind {
  cpu,   //!< cpu_llama
  cuda,  //!< cuda_llama on the current CUDA device
};

//! "cpu" or "cuda".
[[nodiscard]] inline std::string to_string(device_kind d) {
  return d == device_kind::cpu ? "cpu" : "cuda";
}

//! The KV cache of an `lm`: the backend's own cache behind a virtual interface (a `kv_cache`).
class lm_cache {
 public:
  virtual ~lm_cache() = default;
  [[nodiscard]] virtual std::size_t size() const = 0;
  [[nodiscard]] virtual std::size_t capacity() const = 0;
  virtual void truncate(std::size_t n) = 0;
  virtual void keep_path(std::size_t n, std::span<std::int32_t const> keep) = 0;
};

//! What a backend implements for `lm`.
class lm_backend {
 public:
  virtual ~lm_backend() = default;
  [[nodiscard]] virtual std::size_t vocab_size() const = 0;
  [[nodiscard]] virtual std::size_t max_context() const = 0;
  [[nodiscard]] virtual std::size_t hidden_size() const = 0;
  virtual void forward(sd::forward_request const& req, sd::forward_result& out) = 0;
  [[nodiscard]] virtual lm_cache& cache() = 0;
  //! Makes room for `positions` ahead of the forwards where the backend can (cpu_llama checks
  //! the memory a request needs before it starts: decode/common.hpp's `reserve_context`).
  virtual void reserve(std::size_t positions) = 0;
};

//! A model on the device --device named (a `causal_lm`; move-only). The virtual call per forward
//! costs nothing next to a forward.
class lm {
 public:
  //! Both backends honour `forward_request::skip_layers`.
  static constexpr bool supports_skip_layers = true;
  //! The CPU backend honours `forward_request::view`; the CUDA backend refuses a request with one.
  static constexpr bool supports_kv_view = true;

  explicit lm(std::unique_ptr<lm_backend> backend) : backend_(std::move(backend)) {
    SPECDEC_CHECK(backend_ != nullptr, internal, "lm: no backend");
  }
  [[nodiscard]] std::size_t vocab_size() const { return backend_->vocab_size(); }
  [[nodiscard]] std::size_t max_context() const { return backend_->max_context(); }
  [[nodiscard]] std::size_t hidden_size() const { return backend_->hidden_size(); }
  void forward(sd::forward_request const& req, sd::forward_result& out) {
    backend_->forward(req, out);
  }
  [[nodiscard]] lm_cache& cache() { return backend_->cache(); }
  [[nodiscard]] lm_cache const& cache() const { return backend_->cache(); }
  //! See `lm_backend::reserve`.
  void reserve(std::size_t positions) { backend_->reserve(positions); }

 private:
  std::unique_ptr<lm_backend> backend_;
};

//! `lm_backend` over a model M of the library (cpu_llama, cuda_llama), which it owns.
template <class M>
class lm_model final : public lm_backend {
 public:
  template <class... Args>
  explicit lm_model(Args&&... args) : model_(std::forward<Args>(args)...), cache_(model_) {}
  [[nodiscard]] std::size_t vocab_size() const override { return model_.vocab_size(); }
  [[nodiscard]] std::size_t max_context() const override { return model_.max_context(); }
  [[nodiscard]] std::size_t hidden_size() const override { return model_.hidden_size(); }
  void forward(sd::forward_request const& req, sd::forward_result& out) override {
    model_.forward(req, out);
  }
  [[nodiscard]] lm_cache& cache() override { return cache_; }
  void reserve(std::size_t positions) override {
    if constexpr (requires(M & m, std::size_t n) { m.reserve(n); }) model_.reserve(positions);
  }

 private:
  class cache_of final : public lm_cache {
   public:
    explicit cache_of(M& m) : model_(&m) {}
    [[nodiscard]] std::size_t size() const override { return model_->cache().size(); }
    [[nodiscard]] std::size_t capacity() const override { return model_->cache().capacity(); }
    void truncate(std::size_t n) override { model_->cache().truncate(n); }
    void keep_path(std::size_t n, std::span<std::int32_t const> keep) override {
      model_->cache().keep_path(n, keep);
    }

   private:
    M* model_;
  };

  M model_;
  cache_of cache_;
};

//! Throws `specdec::error(unsupported)` unless this program was built with CUDA and a CUDA device
//! is usable, saying which is missing. Defined in cuda_models.cu (or below without CUDA).
void require_cuda_device();

//! A cuda_llama over `weights` with its matrices as `dtype` and a cache of `max_context` positions
//! (0 = the model's seq_len), on the current device. Defined in cuda_models.cu.
[[nodiscard]] std::unique_ptr<lm_backend> make_cuda_backend(
    std::shared_ptr<sd::llama_weights const> const& weights, sd::weight_dtype dtype,
    std::size_t max_context);

#if !defined(SPECDEC_GENERATE_CUDA)
inline void require_cuda_device() {
  SPECDEC_THROW(unsupported,
                "--device cuda: this specdec-generate was built without CUDA (configure with a "
                "CUDA compiler found and SPECDEC_ENABLE_CUDA=ON)");
}
inline std::unique_ptr<lm_backend> make_cuda_backend(
    std::shared_ptr<sd::llama_weights const> const&, sd::weight_dtype, std::size_t) {
  require_cuda_device();
  return nullptr;
}
#endif

}  // namespace generate
