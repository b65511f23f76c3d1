#pragma once
//! \file
//! The umbrella header: everything in specdec except backend/, interop/ and the model files whose
//! format is JSON (specdec/files.hpp).
//!
//! It needs only the standard library and POSIX (for the memory-mapped model and datastore
//! files). The model backends (the CPU one is kept out only to keep the umbrella light; the CUDA
//! one needs a CUDA compiler), the readers and writers of safetensors, draft-head and tree files
//! (which need nlohmann/json: CMake target `specdec::files`) and the adapters for outside
//! containers (which need xtensor) are included on their own:
//!
//! ```cpp
//! #include <specdec/specdec.hpp>              // concepts, sampling, verify, propose, decode, ...
//! #include <specdec/backend/cpu/llama.hpp>    // cpu_llama (standard library only)
//! #include <specdec/files.hpp>                // safetensors, Medusa/Hydra/EAGLE files (JSON)
//! #include <specdec/interop/xtensor.hpp>      // xtensor <-> matrix_view (xtensor)
//! #include <specdec/interop/raw.hpp>          // C arrays -> forward_request, draft_tree, ...
//! ```

// core/: the shared types and the concepts.
#include "specdec/core/auxiliary_batch.hpp"
#include "specdec/core/batch_forward.hpp"
#include "specdec/core/concepts.hpp"
#include "specdec/core/cpu_target.hpp"
#include "specdec/core/draft_tree.hpp"
#include "specdec/core/error.hpp"
#include "specdec/core/forward.hpp"
#include "specdec/core/host_device.hpp"
#include "specdec/core/philox.hpp"
#include "specdec/core/propose_context.hpp"
#include "specdec/core/stats.hpp"
#include "specdec/core/target_handle.hpp"
#include "specdec/core/traits.hpp"
#include "specdec/core/types.hpp"
#include "specdec/core/verify_result.hpp"
#include "specdec/core/views.hpp"

// sampling/: sampling policies (greedy, sampler), softmax, drawing from a distribution, output
// constraints (regular expressions over byte automata; JSON Schema: specdec/files.hpp).
#include "specdec/sampling/automaton.hpp"
#include "specdec/sampling/automaton_constraint.hpp"
#include "specdec/sampling/constraint.hpp"
#include "specdec/sampling/draw.hpp"
#include "specdec/sampling/params.hpp"
#include "specdec/sampling/policy.hpp"
#include "specdec/sampling/regex.hpp"
#include "specdec/sampling/select.hpp"
#include "specdec/sampling/softmax.hpp"

// verify/: greedy, speculative sampling (chains), tree sampling, typical acceptance.
#include "specdec/verify/greedy.hpp"
#include "specdec/verify/speculative_sampling.hpp"
#include "specdec/verify/tree_sampling.hpp"
#include "specdec/verify/typical_acceptance.hpp"

// propose/: one header per drafting strategy.
#include "specdec/propose/block.hpp"
#include "specdec/propose/chain_drafter.hpp"
#include "specdec/propose/constrained.hpp"
#include "specdec/propose/cross_vocabulary.hpp"
#include "specdec/propose/draft_model.hpp"
#include "specdec/propose/eagle.hpp"
#include "specdec/propose/hydra.hpp"
#include "specdec/propose/jacobi.hpp"
#include "specdec/propose/layer_skip.hpp"
#include "specdec/propose/lookahead.hpp"
#include "specdec/propose/medusa.hpp"
#include "specdec/propose/parallel_draft.hpp"
#include "specdec/propose/per_request.hpp"
#include "specdec/propose/prompt_lookup.hpp"
#include "specdec/propose/rest.hpp"
#include "specdec/propose/rest_datastore.hpp"
#include "specdec/propose/sparse_kv.hpp"
#include "specdec/propose/sparse_tree.hpp"
#include "specdec/propose/suffix.hpp"
#include "specdec/propose/suffix_tree.hpp"

// kv/: KV cache layouts.
#include "specdec/kv/contiguous_cache.hpp"
#include "specdec/kv/slots.hpp"

// model/: model files (llama2.c, GGUF), draft heads, tokenizers, random models of any shape,
// models widened to a larger shape (the JSON formats: specdec/files.hpp).
#include "specdec/model/binary_io.hpp"
#include "specdec/model/block_drafter.hpp"
#include "specdec/model/eagle.hpp"
#include "specdec/model/gguf.hpp"
#include "specdec/model/gguf_writer.hpp"
#include "specdec/model/half.hpp"
#include "specdec/model/heads.hpp"
#include "specdec/model/llama2c.hpp"
#include "specdec/model/llama_weights.hpp"
#include "specdec/model/load.hpp"
#include "specdec/model/mapped_file.hpp"
#include "specdec/model/random.hpp"
#include "specdec/model/tokenizer.hpp"
#include "specdec/model/weight_storage.hpp"
#include "specdec/model/widen.hpp"

// decode/: the speculative decoder, the autoregressive baseline, and the batch decoder for
// serving many requests with its speculation policies.
#include "specdec/decode/autoregressive.hpp"
#include "specdec/decode/batch_decoder.hpp"
#include "specdec/decode/common.hpp"
#include "specdec/decode/forward_cost.hpp"
#include "specdec/decode/sequence.hpp"
#include "specdec/decode/speculation.hpp"
#include "specdec/decode/speculative_decoder.hpp"

// reference/: slow, obviously correct versions that tests compare against.
#include "specdec/reference/block_drafter.hpp"
#include "specdec/reference/eagle.hpp"
#include "specdec/reference/heads.hpp"
#include "specdec/reference/pivot.hpp"
#include "specdec/reference/regex.hpp"
#include "specdec/reference/sampling.hpp"
#include "specdec/reference/verify.hpp"
