#pragma once
//! \file
//! Shared pieces of the CUDA backend: the status every launcher returns, CUDA error checks,
//! an owning device buffer, the ragged batch layout, and warp / block reductions.
//!
//! Launchers (`specdec::cuda::launch_*`) never throw and never run device code on bad parameters:
//! they validate what they can see on the host and return a `launch_status`. Data-dependent
//! problems found on the device (a NaN logit, a token id outside the vocabulary, a malformed
//! tree) are reported per sequence through an `error_flags` array (bits of `device_error`).
//! `throw_if_failed` turns a bad status into `specdec::error` for callers that prefer exceptions.
//!
//! Kernels in headers. Every kernel of backend/cuda is a function template with a parameter it
//! never uses, `template <int Unused = 0> __global__ void name_kernel(...)`, launched as
//! `name_kernel<<<...>>>` and named `name_kernel<0>` where a pointer to it is needed (e.g. for
//! `cudaFuncSetAttribute`). The library is header-only, so a kernel is defined in every
//! translation unit that includes its header, and nvcc gives each `__global__` function a host-side
//! launch stub with external linkage: a plain kernel defined in a header fails to link ("multiple
//! definition" of the stub) as soon as two `.cu` files include it; `inline` is ignored on a
//! `__global__` function (nvcc warning 20050, an error with SPECDEC_WERROR); `static` or an unnamed
//! namespace would give every translation unit a kernel of its own. Implicit instantiations of a
//! template may occur in any number of translation units and are merged by the linker, so each
//! kernel stays one entity, as the one-definition rule requires.

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <utility>

#include "specdec/core/error.hpp"
#include "specdec/core/philox.hpp"
#include "specdec/core/types.hpp"

namespace specdec::cuda {

//! What a launcher found.
enum class status : std::int32_t {
  ok = 0,            //!< launched (or nothing to do)
  invalid_argument,  //!< a parameter is outside its documented domain (null pointer, bad size)
  out_of_range,      //!< a size exceeds what the kernels support
  cuda_error,        //!< the CUDA runtime refused the launch; see `launch_status::cuda`
};

//! The result of a launcher: `ok`, or what is wrong and where (a static string).
struct launch_status {
  status code = status::ok;        //!< what kind of failure
  cudaError_t cuda = cudaSuccess;  //!< the CUDA error when code == cuda_error
  char const* what = "";           //!< which launcher and which check, e.g. "launch_softmax: vocab"

  //! Whether the launch went ahead.
  [[nodiscard]] constexpr bool ok() const noexcept { return code == status::ok; }
};

//! A failed status with a message.
[[nodiscard]] constexpr launch_status fail(status code, char const* what) noexcept {
  return launch_status{code, cudaSuccess, what};
}

//! `ok`, or `cuda_error` carrying the last launch error (clears it).
[[nodiscard]] inline launch_status last_launch_status(char const* what) noexcept {
  cudaError_t const e = cudaGetLastError();
  return e == cudaSuccess ? launch_status{} : launch_status{status::cuda_error, e, what};
}

//! Bits of the per-sequence `error_flags` output that kernels set on data-dependent problems.
//! A flagged sequence's other outputs are unspecified but written without out-of-bounds access.
enum device_error : std::int32_t {
  device_ok = 0,
  non_finite_logit = 1,     //!< a NaN or +inf logit, or a row without a finite entry
  token_out_of_range = 2,   //!< a token id (draft, history, bias) outside [0, vocab)
  bad_tree = 4,             //!< a parent index that does not precede its node
  no_probability_mass = 8,  //!< a distribution that sums to zero (or is not finite)
};

//! Throws `specdec::error` (with `where`) unless `s` is ok.
inline void throw_if_failed(launch_status const& s, char const* where) {
  switch (s.code) {
    case status::ok:
      return;
    case status::invalid_argument:
      SPECDEC_THROW(invalid_argument, where, ": ", s.what);
    case status::out_of_range:
      SPECDEC_THROW(out_of_range, where, ": ", s.what);
    case status::cuda_error:
      SPECDEC_THROW(internal, where, ": ", s.what, ": CUDA error ", cudaGetErrorName(s.cuda), " (",
                    cudaGetErrorString(s.cuda), ")");
  }
  SPECDEC_THROW(internal, where, ": unknown launch status");
}

//! Throws `specdec::error` for a nonzero device error flag, naming the sequence and the problem.
inline void throw_if_flagged(std::span<std::int32_t const> flags, char const* where) {
  for (std::size_t b = 0; b < flags.size(); ++b) {
    std::int32_t const f = flags[b];
    if (f == 0) continue;
    if (f & token_out_of_range)
      SPECDEC_THROW(out_of_range, where, ": sequence ", b,
                    " has a token id outside the vocabulary");
    if (f & bad_tree)
      SPECDEC_THROW(invalid_argument, where, ": sequence ", b,
                    " has a parent index that does not precede its node");
    if (f & non_finite_logit)
      SPECDEC_THROW(numerical, where, ": sequence ", b, " has a NaN or infinite logit");
    SPECDEC_THROW(numerical, where, ": sequence ", b, " has a distribution without mass");
  }
}

}  // namespace specdec::cuda

//! Throws `specdec::error(errc::internal)` naming the call and the CUDA error unless EXPR returns
//! cudaSuccess. Host code only.
#define SPECDEC_CUDA_CHECK(EXPR)                                                   \
  do {                                                                             \
    cudaError_t const specdec_cuda_err_ = (EXPR);                                  \
    if (specdec_cuda_err_ != cudaSuccess) [[unlikely]] {                           \
      SPECDEC_THROW(internal, #EXPR, " failed at ", __FILE__, ":", __LINE__, ": ", \
                    cudaGetErrorName(specdec_cuda_err_), " (",                     \
                    cudaGetErrorString(specdec_cuda_err_), ")");                   \
    }                                                                              \
  } while (false)

//! Throws `specdec::error(errc::internal)` naming the call unless the cuBLAS call succeeds.
#define SPECDEC_CUBLAS_CHECK(EXPR)                                                 \
  do {                                                                             \
    cublasStatus_t const specdec_cublas_st_ = (EXPR);                              \
    if (specdec_cublas_st_ != CUBLAS_STATUS_SUCCESS) [[unlikely]] {                \
      SPECDEC_THROW(internal, #EXPR, " failed at ", __FILE__, ":", __LINE__, ": ", \
                    cublasGetStatusName(specdec_cublas_st_));                      \
    }                                                                              \
  } while (false)

namespace specdec::cuda {

//! An owning, move-only array of `T` in device memory. Growing discards the contents.
template <class T>
class device_buffer {
 public:
  //! An empty buffer (no allocation).
  device_buffer() noexcept = default;
  //! A buffer of `count` elements (uninitialised). Throws `specdec::error` when cudaMalloc fails
  //! (`errc::out_of_memory` when the device has not enough memory).
  explicit device_buffer(std::size_t count) { resize(count); }
  ~device_buffer() { release(); }
  device_buffer(device_buffer const&) = delete;
  device_buffer& operator=(device_buffer const&) = delete;
  //! Moves the allocation; `other` becomes empty.
  device_buffer(device_buffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}
  //! Moves the allocation; `other` becomes empty.
  device_buffer& operator=(device_buffer&& other) noexcept {
    if (this != &other) {
      release();
      data_ = std::exchange(other.data_, nullptr);
      size_ = std::exchange(other.size_, 0);
    }
    return *this;
  }

  //! Makes room for at least `count` elements; reallocates (dropping the contents) only when the
  //! current allocation is smaller.
  void reserve(std::size_t count) {
    if (count > size_) resize(count);
  }
  //! Reallocates to exactly `count` elements (dropping the contents).
  void resize(std::size_t count) {
    SPECDEC_CHECK(count <= std::numeric_limits<std::size_t>::max() / sizeof(T), out_of_range,
                  "device_buffer: ", count, " elements overflow the address space");
    release();
    if (count == 0) return;
    void* p = nullptr;
    cudaError_t const err = cudaMalloc(&p, count * sizeof(T));
    if (err == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      SPECDEC_THROW(out_of_memory, "device_buffer: cudaMalloc of ", count * sizeof(T),
                    " bytes failed: out of device memory");
    }
    SPECDEC_CUDA_CHECK(err);
    data_ = static_cast<T*>(p);
    size_ = count;
  }
  //! Sets every byte to zero (asynchronously on `stream`).
  void zero(cudaStream_t stream = nullptr) {
    if (size_ != 0) SPECDEC_CUDA_CHECK(cudaMemsetAsync(data_, 0, size_ * sizeof(T), stream));
  }
  //! Copies `host` into the first host.size() elements (asynchronously; `host` must stay alive
  //! until the copy is done, e.g. until the stream is synchronised).
  void upload(std::span<T const> host, cudaStream_t stream = nullptr) {
    SPECDEC_CHECK(host.size() <= size_, out_of_range, "device_buffer: uploading ", host.size(),
                  " elements into a buffer of ", size_);
    if (!host.empty())
      SPECDEC_CUDA_CHECK(cudaMemcpyAsync(data_, host.data(), host.size() * sizeof(T),
                                         cudaMemcpyHostToDevice, stream));
  }
  //! Copies the first host.size() elements into `host` and waits for the copy.
  void download(std::span<T> host, cudaStream_t stream = nullptr) const {
    SPECDEC_CHECK(host.size() <= size_, out_of_range, "device_buffer: downloading ", host.size(),
                  " elements from a buffer of ", size_);
    if (host.empty()) return;
    SPECDEC_CUDA_CHECK(cudaMemcpyAsync(host.data(), data_, host.size() * sizeof(T),
                                       cudaMemcpyDeviceToHost, stream));
    SPECDEC_CUDA_CHECK(cudaStreamSynchronize(stream));
  }

  [[nodiscard]] T* data() noexcept { return data_; }
  [[nodiscard]] T const* data() const noexcept { return data_; }
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  [[nodiscard]] bool empty() const noexcept { return size_ == 0; }

 private:
  void release() noexcept {
    if (data_ != nullptr) cudaFree(data_);
    data_ = nullptr;
    size_ = 0;
  }

  T* data_ = nullptr;
  std::size_t size_ = 0;
};

//! An owning, non-copyable array of `T` in pinned (page-locked) host memory, the staging area of
//! asynchronous copies. Growing discards the contents.
template <class T>
class pinned_buffer {
 public:
  pinned_buffer() noexcept = default;
  ~pinned_buffer() { release(); }
  pinned_buffer(pinned_buffer const&) = delete;
  pinned_buffer& operator=(pinned_buffer const&) = delete;

  //! Makes room for at least `count` elements; reallocates (dropping the contents) only when the
  //! current allocation is smaller. Throws `specdec::error` when cudaMallocHost fails.
  void reserve(std::size_t count) {
    if (count <= size_) return;
    SPECDEC_CHECK(count <= std::numeric_limits<std::size_t>::max() / sizeof(T), out_of_range,
                  "pinned_buffer: ", count, " elements overflow the address space");
    release();
    void* p = nullptr;
    SPECDEC_CUDA_CHECK(cudaMallocHost(&p, count * sizeof(T)));
    data_ = static_cast<T*>(p);
    size_ = count;
  }
  //! Frees the memory.
  void release() noexcept {
    if (data_ != nullptr) cudaFreeHost(data_);
    data_ = nullptr;
    size_ = 0;
  }

  [[nodiscard]] T* data() noexcept { return data_; }
  [[nodiscard]] std::size_t size() const noexcept { return size_; }

 private:
  T* data_ = nullptr;
  std::size_t size_ = 0;
};

//! Where each sequence's rows lie in a batch of flattened rows: either ragged (`cu_rows`, a
//! device array of batch + 1 cumulative counts; sequence b owns rows [cu_rows[b], cu_rows[b+1]))
//! or padded (`cu_rows` null; sequence b owns rows [b * rows_per_seq, (b + 1) * rows_per_seq)),
//! which is the [batch, k + 1, vocab] layout.
struct ragged_layout {
  std::int32_t const* cu_rows = nullptr;  //!< [batch + 1] on the device, or null for padded
  std::int32_t batch = 0;                 //!< number of sequences
  std::int32_t rows_per_seq = 0;          //!< rows per sequence when padded
  std::int32_t total_rows = 0;            //!< rows in the flattened arrays (cu_rows[batch])
  std::int32_t max_rows_per_seq = 0;      //!< upper bound on any sequence's row count

  //! A padded layout: `batch` sequences of `rows_per_seq` rows each.
  [[nodiscard]] static constexpr ragged_layout padded(std::int32_t batch,
                                                      std::int32_t rows_per_seq) noexcept {
    return ragged_layout{nullptr, batch, rows_per_seq, batch * rows_per_seq, rows_per_seq};
  }
  //! A ragged layout; `total_rows` = cu_rows[batch] and `max_rows` bounds every count.
  [[nodiscard]] static constexpr ragged_layout ragged(std::int32_t const* cu_rows,
                                                      std::int32_t batch, std::int32_t total_rows,
                                                      std::int32_t max_rows) noexcept {
    return ragged_layout{cu_rows, batch, 0, total_rows, max_rows};
  }

  //! First row of sequence b.
  [[nodiscard]] __host__ __device__ std::int32_t begin(std::int32_t b) const noexcept {
    return cu_rows != nullptr ? cu_rows[b] : b * rows_per_seq;
  }
  //! One past the last row of sequence b.
  [[nodiscard]] __host__ __device__ std::int32_t end(std::int32_t b) const noexcept {
    return cu_rows != nullptr ? cu_rows[b + 1] : (b + 1) * rows_per_seq;
  }

  //! Host-side check of the sizes (not of the device array's contents, which kernels check).
  [[nodiscard]] constexpr bool valid() const noexcept {
    if (batch < 0 || total_rows < 0 || max_rows_per_seq < 0) return false;
    if (cu_rows == nullptr)
      return rows_per_seq >= 0 && static_cast<std::int64_t>(batch) * rows_per_seq == total_rows;
    return true;
  }
};

//! The Philox position of one sequence as kernels read it: a `specdec::philox` (host and device
//! agree on its words). Verifiers read words relative to `offset()` and advance it.
using rng_state = philox;

namespace detail {

//! Threads per block of the row kernels.
inline constexpr int block_threads = 256;

//! ceil(a / b) for positive b.
[[nodiscard]] __host__ __device__ constexpr std::int64_t ceil_div(std::int64_t a,
                                                                  std::int64_t b) noexcept {
  return (a + b - 1) / b;
}

#if defined(__CUDACC__)

//! Sum over a warp (every lane gets the result).
template <class T>
__device__ __forceinline__ T warp_sum(T v) noexcept {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
//! Max over a warp (every lane gets the result).
__device__ __forceinline__ float warp_max(float v) noexcept {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

//! Sum over the block (every thread gets the result). `scratch` holds >= 32 T in shared memory.
//! The reduction order is fixed, so the result is the same on every run.
template <class T>
__device__ __forceinline__ T block_sum(T v, T* scratch) noexcept {
  int const lane = static_cast<int>(threadIdx.x) & 31, warp = static_cast<int>(threadIdx.x) >> 5;
  int const warps = static_cast<int>((blockDim.x + 31) / 32);
  v = warp_sum(v);
  __syncthreads();  // scratch may still be read by a previous reduction
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : T(0);
  return warp_sum(v);
}

//! Three block sums at once (every thread gets them): one pass through shared memory instead
//! of three. `scratch` holds >= 96 doubles. Fixed order, like `block_sum`.
__device__ __forceinline__ void block_sum3(double& a, double& b, double& c,
                                           double* scratch) noexcept {
  int const lane = static_cast<int>(threadIdx.x) & 31, warp = static_cast<int>(threadIdx.x) >> 5;
  int const warps = static_cast<int>((blockDim.x + 31) / 32);
  a = warp_sum(a);
  b = warp_sum(b);
  c = warp_sum(c);
  __syncthreads();  // scratch may still be read by a previous reduction
  if (lane == 0) {
    scratch[warp] = a;
    scratch[32 + warp] = b;
    scratch[64 + warp] = c;
  }
  __syncthreads();
  a = warp_sum(lane < warps ? scratch[lane] : 0.0);
  b = warp_sum(lane < warps ? scratch[32 + lane] : 0.0);
  c = warp_sum(lane < warps ? scratch[64 + lane] : 0.0);
}

//! Max over the block (every thread gets the result). `scratch` holds >= 32 floats.
__device__ __forceinline__ float block_max(float v, float* scratch) noexcept {
  int const lane = static_cast<int>(threadIdx.x) & 31, warp = static_cast<int>(threadIdx.x) >> 5;
  int const warps = static_cast<int>((blockDim.x + 31) / 32);
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : -INFINITY;
  return warp_max(v);
}

//! A (value, index) pair ordered by value, ties to the lower index; used for argmax.
struct arg_max_pair {
  float value;         //!< the value (NaN never enters: callers flag it)
  std::int32_t index;  //!< its index, or INT32_MAX for "none"
};

//! The better of two argmax candidates: larger value, then lower index.
__device__ __forceinline__ arg_max_pair better(arg_max_pair a, arg_max_pair b) noexcept {
  if (b.value > a.value || (b.value == a.value && b.index < a.index)) return b;
  return a;
}

//! Argmax over a warp (every lane gets the result).
__device__ __forceinline__ arg_max_pair warp_argmax(arg_max_pair v) noexcept {
  for (int o = 16; o > 0; o >>= 1) {
    arg_max_pair other;
    other.value = __shfl_xor_sync(0xffffffffu, v.value, o);
    other.index = __shfl_xor_sync(0xffffffffu, v.index, o);
    v = better(v, other);
  }
  return v;
}

//! Argmax over the block (every thread gets the result). `scratch` holds >= 32 pairs.
__device__ __forceinline__ arg_max_pair block_argmax(arg_max_pair v,
                                                     arg_max_pair* scratch) noexcept {
  int const lane = static_cast<int>(threadIdx.x) & 31, warp = static_cast<int>(threadIdx.x) >> 5;
  int const warps = static_cast<int>((blockDim.x + 31) / 32);
  v = warp_argmax(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : arg_max_pair{-INFINITY, INT32_MAX};
  return warp_argmax(v);
}

//! An online-softmax partial: the max of a set of values and the sum of exp(value - max).
struct softmax_partial {
  float max;  //!< -inf for an empty set
  float sum;  //!< sum of exp(v - max); 0 for an empty set
};

//! Merges two partials (the result does not depend on which is `a`, up to rounding).
__device__ __forceinline__ softmax_partial merge(softmax_partial a, softmax_partial b) noexcept {
  float const m = fmaxf(a.max, b.max);
  if (m == -INFINITY) return softmax_partial{-INFINITY, 0.0f};
  float const sa = a.max == -INFINITY ? 0.0f : a.sum * expf(a.max - m);
  float const sb = b.max == -INFINITY ? 0.0f : b.sum * expf(b.max - m);
  return softmax_partial{m, sa + sb};
}

//! Inclusive prefix sum over the block in thread order (every thread gets its own prefix and the
//! total). `scratch` holds >= 32 T. Deterministic.
template <class T>
__device__ __forceinline__ T block_inclusive_scan(T v, T* scratch, T& total) noexcept {
  int const lane = static_cast<int>(threadIdx.x) & 31, warp = static_cast<int>(threadIdx.x) >> 5;
  int const warps = static_cast<int>((blockDim.x + 31) / 32);
  T x = v;
  for (int o = 1; o < 32; o <<= 1) {
    T const y = __shfl_up_sync(0xffffffffu, x, o);
    if (lane >= o) x += y;
  }
  __syncthreads();
  if (lane == 31) scratch[warp] = x;
  __syncthreads();
  if (warp == 0) {
    T w = lane < warps ? scratch[lane] : T(0);
    for (int o = 1; o < 32; o <<= 1) {
      T const y = __shfl_up_sync(0xffffffffu, w, o);
      if (lane >= o) w += y;
    }
    if (lane < warps) scratch[lane] = w;  // inclusive prefix of warp totals
  }
  __syncthreads();
  T const before = warp == 0 ? T(0) : scratch[warp - 1];
  total = scratch[warps - 1];
  return x + before;
}

//! Maps a float to an unsigned key with the same order (for radix selection); -0 maps to +0's
//! key, so that keys are equal exactly when the floats compare equal.
__device__ __forceinline__ std::uint32_t float_key(float f) noexcept {
  std::uint32_t const u = __float_as_uint(f == 0.0f ? 0.0f : f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
//! The inverse of float_key.
__device__ __forceinline__ float key_float(std::uint32_t k) noexcept {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

#endif  // __CUDACC__

}  // namespace detail
}  // namespace specdec::cuda
