//! \file
//! The kernel table of one CPU target (`model_kernels`, backend/cpu/kernels.hpp): the entry points
//! of the kernel bodies compiled for it. A kernel body: backend/cpu/kernels.hpp compiles it once
//! per CPU target.

//! This target's kernels.
inline constexpr model_kernels table{
    .target = this_target,
    .width = simd::width,
    .transposed8 = transposed8,
    .value_chunk = value_chunk,
    .gemm_nt = gemm_nt,
    .packed_store = packed_gemm<panel_op::store>,
    .packed_add = packed_gemm<panel_op::add>,
    .packed_swiglu = packed_gemm<panel_op::swiglu>,
    .rmsnorm = rmsnorm,
    .rope = rope,
    .swiglu = swiglu,
    .add_silu = add_silu,
    .transpose_rows8 = transpose_rows8,
    .transpose_gather8 = transpose_gather8,
    .scores8 = scores8,
    .softmax_values8 = softmax_values8,
    .row_max = row_max,
    .attend_heads = attend_heads,
    .add_cache_scores = add_cache_scores,
};
