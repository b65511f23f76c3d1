#pragma once
//! \file
//! `verify_inputs`: what the verification launchers (verify.cuh, chain_verify.cuh) read and write.

#include <cstdint>

#include "specdec/backend/cuda/common.cuh"
#include "specdec/core/types.hpp"

namespace specdec::cuda {

//! What the verification launchers read and write. All pointers are device pointers.
struct verify_inputs {
  ragged_layout layout;                   //!< sequence b owns rows [begin(b), end(b)): its nodes
  std::int32_t vocab = 0;                 //!< entries per row
  float const* target = nullptr;          //!< [rows, target_stride] target logits (or probs)
  std::int64_t target_stride = 0;         //!< floats between target rows
  bool target_is_probs = false;           //!< rows already are the policy's distributions
  token_id const* tokens = nullptr;       //!< [rows] node tokens, root first per sequence
  std::int32_t const* parents = nullptr;  //!< [rows] local parents (-1 for roots); null = chains
  float const* q = nullptr;               //!< [rows, q_stride] q rows (row i: node i's children's
                                          //!< distribution), or null for point masses
  std::int64_t q_stride = 0;              //!< floats between q rows
  token_id const* history = nullptr;      //!< [cu_history[batch]] committed tokens (penalties)
  std::int32_t const* cu_history = nullptr;  //!< [batch + 1], or null
  rng_state* rng = nullptr;                  //!< [batch] in/out
  std::int32_t* num_accepted = nullptr;      //!< [batch] out
  std::int32_t* accepted_nodes = nullptr;    //!< [rows] out: at begin(b), local indices
  token_id* out_tokens = nullptr;            //!< [rows] out: at begin(b), accepted then bonus
  std::int32_t* error_flags = nullptr;       //!< [batch] out (or null), zeroed by the caller
};

}  // namespace specdec::cuda
