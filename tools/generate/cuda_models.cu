// specdec-generate's CUDA models (models.hpp): cuda_llama behind `lm_backend`, and the check that a
// device is usable. The only translation unit of the tools that nvcc compiles; built when CMake
// enables CUDA.

#include <cuda_runtime.h>

#include <memory>
#include <string>

#include "generate/models.hpp"
#include "specdec/backend/cuda/llama.cuh"
#include "specdec/core/error.hpp"

namespace generate {

void require_cuda_device() {
  int count = 0;
  cudaError_t const e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    SPECDEC_THROW(unsupported, "--device cuda: no usable CUDA device (cudaGetDeviceCount: ",
                  cudaGetErrorString(e), ")");
  }
  SPECDEC_CHECK(count > 0, unsupported, "--device cuda: no CUDA device is present");
}

std::unique_ptr<lm_backend> make_cuda_backend(
    std::shared_ptr<sd::llama_weights const> const& weights, sd::weight_dtype dtype,
    std::size_t max_context) {
  require_cuda_device();
  return std::make_unique<lm_model<sd::cuda_llama>>(
      weights, sd::cuda_llama_options{.max_context = max_context, .dtype = dtype});
}

}  // namespace generate
