#pragma once
//! \file
//! `SPECDEC_HOST_DEVICE`: marks a function that host code and CUDA device code both call (Philox,
//! the sampling exp), so that one definition serves both and their results agree by construction.
//! Expands to `__host__ __device__` under nvcc and to nothing elsewhere.

#if defined(__CUDACC__)
#define SPECDEC_HOST_DEVICE __host__ __device__
#else
#define SPECDEC_HOST_DEVICE
#endif
