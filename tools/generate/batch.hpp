#pragma once
// specdec-generate --prompts FILE --batch N: every prompt of a JSON Lines file served as a
// concurrent request, N at a time (continuous batching: a finished request's slot takes the next
// prompt), by `batch_decoder` over `cpu_batched_llama`: one target forward per step for all the
// requests in the batch. Text mode streams each request's text after its line number ("12: Once
// upon a time ..."), then a statistics table per request and in total; --json prints one object
// per request as it ends (line, text, tokens, finish reason, stats) and one with the totals.
// Under --regex or --json-schema every request decodes under the constraint, and each request's
// line, table row and object say whether its output is valid; the totals count the valid ones.

#include <memory>
#include <optional>

#include "generate/option.hpp"
#include "generate/strategies.hpp"
#include "specdec/decode/common.hpp"
#include "specdec/model/llama_weights.hpp"
#include "specdec/model/mapped_file.hpp"
#include "specdec/model/tokenizer.hpp"
#include "specdec/sampling/policy.hpp"
#include "specdec/verify/typical_acceptance.hpp"

namespace generate {

//! What batched serving runs with (read by specdec-generate.cpp from the command line).
struct batch_session {
  option_values const& values;                       //!< every option given
  strategy const& chosen;                            //!< the strategy
  std::shared_ptr<sd::llama_weights const> weights;  //!< the target's weights
  sd::tokenizer const& tok;                          //!< the vocabulary
  sd::cpu_llama_options model_options;               //!< threads and context
  sd::sampling_params params;                        //!< every request's sampling parameters
  sd::decode_config config;  //!< stops and length; its seed is the base of the requests' seeds
  std::optional<sd::typical_acceptance_params> typical;  //!< --verifier typical
  sd::file_access access = sd::file_access::map;         //!< how every file is read (--no-mmap)
  output_constraint constraint = {};  //!< every request's output constraint, or none
};

//! Serves every prompt of --prompts with the chosen strategy (batch.cpp); returns the exit
//! status: 0, or 1 when a request failed.
int run_batch(batch_session const& s);

}  // namespace generate
