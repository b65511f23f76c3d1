#pragma once
//! \file
//! Constrained sampling: the `constraint` concept (a grammar's state machine over tokens) and
//! `constrained`, the policy that applies one to any sampling policy.
//!
//! `constrained<Policy, Constraint>` is an `incremental_policy` (core/concepts.hpp): its state is
//! the constraint's state after the output so far, so the verifiers advance it along each tree
//! path (`detail::path_states`, verify/detail/walk.hpp) and mask every node's row with the state
//! reached along that node's own path; the decoders advance nothing themselves (a rejected node's
//! state is simply never used again). Its distribution is the wrapped policy's applied to the
//! logits with every token the constraint does not allow set to -inf (as vLLM, SGLang and
//! llama.cpp apply grammars): for temperature alone that is the policy's distribution renormalised
//! over the allowed tokens; top-k, top-p and min-p then choose among allowed tokens only, so a
//! row never loses all its mass to the mask. Verification of a constrained policy is therefore
//! exact with respect to the constrained distribution: every verifier that is lossless for a
//! policy is lossless for its constrained version.
//!
//! The constraint covers the output only: the first `prefix_length` tokens of every history (the
//! prompt) are not read.

#include <algorithm>
#include <array>
#include <bit>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "specdec/core/concepts.hpp"
#include "specdec/core/error.hpp"
#include "specdec/core/philox.hpp"
#include "specdec/core/types.hpp"
#include "specdec/sampling/policy.hpp"

namespace specdec {

//! A constraint on the output: a state machine over tokens.
//!
//! Requirements:
//! - `state_type`, copyable: the state after some output (copied once per tree node).
//! - `c.start()`: the state before any output.
//! - `c.advance(state, token) -> bool`: moves by one token; false when the token is not allowed
//!   (the state is then unusable). Why: the verifiers advance along tree paths, the decoder along
//!   its committed tokens.
//! - `c.allowed(state)`: the allowed tokens, a bitmask of ceil(vocab / 64) words (bit t of word
//!   t / 64). Why: masking a row is a pass over words, and the bitmask is what a device kernel
//!   uploads.
//! - `c.can_end(state)`: whether the output may end here (an end token is then allowed).
//! - `c.forced(state)`: the only allowed token, or `no_token`. Why: a forced token is a draft that
//!   is accepted by construction.
//! - `c.vocab_size()`: the vocabulary the masks cover.
template <class C>
concept constraint = std::copyable<typename C::state_type> &&
    requires(C const& c, typename C::state_type& s, typename C::state_type const& cs, token_id t) {
  { c.start() } -> std::same_as<typename C::state_type>;
  { c.advance(s, t) } -> std::same_as<bool>;
  { c.allowed(cs) } -> std::convertible_to<std::span<std::uint64_t const>>;
  { c.can_end(cs) } -> std::convertible_to<bool>;
  { c.forced(cs) } -> std::same_as<token_id>;
  { c.vocab_size() } -> std::convertible_to<std::size_t>;
};

namespace detail {

//! Writes `logits` into `out` with the tokens not in `mask` set to -inf (`out` may be `logits`).
//! For each byte value, eight lanes of all-ones (bit set) or zero: a mixed word of a mask is
//! applied eight floats at a time with bitwise selects, which the compiler vectorises.
inline std::array<std::array<std::uint32_t, 8>, 256> const& byte_lanes() noexcept {
  static auto const lanes = [] {
    std::array<std::array<std::uint32_t, 8>, 256> l{};
    for (std::size_t b = 0; b < 256; ++b)
      for (std::size_t j = 0; j < 8; ++j) l[b][j] = ((b >> j) & 1u) != 0 ? ~std::uint32_t{0} : 0u;
    return l;
  }();
  return lanes;
}

inline void apply_token_mask(std::span<float const> logits, std::span<std::uint64_t const> mask,
                             std::span<float> out) {
  constexpr float ninf = -std::numeric_limits<float>::infinity();
  std::uint32_t const ninf_bits = std::bit_cast<std::uint32_t>(ninf);
  std::size_t const vocab = logits.size();
  float const* in = logits.data();
  float* o = out.data();
  std::size_t const full = vocab / 64;
  auto const& lanes = byte_lanes();
  // Word by word: a word with no allowed token is a fill, one with all of them a copy, a mixed
  // one eight bitwise selects of eight lanes.
  for (std::size_t w = 0; w < full; ++w) {
    std::uint64_t const bits = mask[w];
    float const* src = in + w * 64;
    float* dst = o + w * 64;
    if (bits == 0) {
      std::fill(dst, dst + 64, ninf);
    } else if (bits == ~std::uint64_t{0}) {
      if (dst != src) std::copy(src, src + 64, dst);
    } else {
      std::array<std::uint32_t, 64> x;
      std::memcpy(x.data(), src, sizeof x);
      for (std::size_t g = 0; g < 8; ++g) {
        std::array<std::uint32_t, 8> const& m = lanes[(bits >> (8 * g)) & 0xFFu];
        for (std::size_t j = 0; j < 8; ++j)
          x[8 * g + j] = (x[8 * g + j] & m[j]) | (ninf_bits & ~m[j]);
      }
      std::memcpy(dst, x.data(), sizeof x);
    }
  }
  for (std::size_t i = full * 64; i < vocab; ++i)
    o[i] = ((mask[full] >> (i - full * 64)) & 1u) != 0 ? in[i] : ninf;
}

//! The argmax of `logits` among the tokens in `mask` (ties to the lowest id), or `no_token` when
//! the mask is empty. NaN logits are skipped (the caller checks the chosen one).
inline token_id masked_argmax(std::span<float const> logits, std::span<std::uint64_t const> mask) {
  token_id best = no_token;
  float best_v = -std::numeric_limits<float>::infinity();
  for (std::size_t w = 0; w * 64 < logits.size(); ++w) {
    for (std::uint64_t bits = mask[w]; bits != 0; bits &= bits - 1) {
      std::size_t const i = w * 64 + static_cast<std::size_t>(std::countr_zero(bits));
      if (i >= logits.size()) break;
      if (best == no_token || logits[i] > best_v) {
        best = static_cast<token_id>(i);
        best_v = logits[i];
      }
    }
  }
  return best;
}

//! `policy`'s distribution of `logits` with every token outside `mask` set to -inf first (the
//! masked row is written to `probs`, then the policy reads it there). `History` is what the
//! policy's distribution reads (a `token_history`, or a policy's state).
template <class Policy, class History>
void masked_distribution(Policy const& policy, std::span<float const> logits,
                         std::span<std::uint64_t const> mask, History const& history,
                         std::span<float> probs) {
  apply_token_mask(logits, mask, probs);
  policy.distribution(std::span<float const>(probs.data(), probs.size()), history, probs);
}

//! `policy`'s greedy token of `logits` among the tokens in `mask` (`no_token` when none is, for
//! the plain `greedy` policy): the argmax over the mask for `greedy`, else the policy applied to
//! the masked row.
template <class Policy, class History>
[[nodiscard]] token_id masked_greedy_token(Policy const& policy, std::span<float const> logits,
                                           std::span<std::uint64_t const> mask,
                                           History const& history) {
  if constexpr (std::same_as<Policy, greedy>) {
    return masked_argmax(logits, mask);
  } else {
    std::vector<float>& tmp = thread_scratch<float, 4>(logits.size());
    std::span<float> const row(tmp.data(), logits.size());
    apply_token_mask(logits, mask, row);
    return policy.greedy_token(std::span<float const>(row), history);
  }
}

//! Whether a policy's distribution reads the history (penalties): otherwise a constrained policy
//! need not materialise the path to each node.
template <class Policy>
[[nodiscard]] bool reads_history(Policy const& p) {
  if constexpr (requires { p.params().repetition_penalty; }) {
    auto const& q = p.params();
    return q.repetition_penalty != 1.0f || q.frequency_penalty != 0.0f ||
           q.presence_penalty != 0.0f;
  } else {
    return true;
  }
}

}  // namespace detail

//! `Policy` under `Constraint` (see the file comment). Shares the constraint (its token tables are
//! cached across requests and threads); each request gets its own `constrained` with its prompt
//! length.
template <sampling_policy Policy, constraint Constraint>
class constrained {
 public:
  //! Masks are applied on the host only.
  static constexpr bool device_supported = false;

  //! The state after some output: the constraint's, with the history it started from and the
  //! path since (for a policy that reads the history). It refers to that history (a view), as the
  //! verifiers' per-tree states do: valid while the history is.
  struct state_type {
    typename Constraint::state_type at{};
    token_history committed;
    std::vector<token_id> path;
  };

  //! `policy` under `constraint` (null: no constraint, the policy as it is), for a request whose
  //! first `prefix_length` tokens (the prompt) are not output. The decoders set the prefix of each
  //! request themselves (`for_prompt`), so a policy built once serves every request.
  explicit constrained(Policy policy, std::shared_ptr<Constraint const> constraint = nullptr,
                       std::size_t prefix_length = 0)
      : policy_(std::move(policy)),
        constraint_(std::move(constraint)),
        prefix_(prefix_length),
        history_(detail::reads_history(policy_)) {}

  //! This policy for a request whose prompt has `prompt_length` tokens (what the decoders call
  //! when a request starts: `for_prompt` in sampling/policy.hpp).
  [[nodiscard]] constrained for_prompt(std::size_t prompt_length) const {
    return constrained(policy_, constraint_, prompt_length);
  }
  //! Whether a constraint applies.
  [[nodiscard]] bool has_constraint() const noexcept { return constraint_ != nullptr; }

  [[nodiscard]] Policy const& policy() const noexcept { return policy_; }
  //! The constraint (null when none applies).
  [[nodiscard]] std::shared_ptr<Constraint const> const& constraint() const noexcept {
    return constraint_;
  }
  [[nodiscard]] std::size_t prefix_length() const noexcept { return prefix_; }
  [[nodiscard]] decltype(auto) params() const noexcept { return policy_.params(); }
  [[nodiscard]] bool is_greedy() const noexcept { return policy_.is_greedy(); }

  //! The state after `history` (its tokens from `prefix_length()` on are the output). Throws
  //! `errc::invalid_argument` naming the first output token the constraint does not allow.
  [[nodiscard]] state_type begin(token_history history) const {
    state_type s;
    s.committed = history;
    if (!constraint_) return s;
    s.at = constraint_->start();
    std::span<token_id const> const tokens = history.tokens();
    for (std::size_t i = prefix_; i < tokens.size(); ++i)
      SPECDEC_CHECK(constraint_->advance(s.at, tokens[i]), invalid_argument,
                    "constrained: output token ", i - prefix_, " (", tokens[i],
                    ") breaks the constraint");
    return s;
  }
  //! Moves `s` by `token` (a state that breaks the constraint is never scored: see the file
  //! comment).
  void advance(state_type& s, token_id token) const {
    if (constraint_) (void)constraint_->advance(s.at, token);
    if (history_) s.path.push_back(token);
  }

  //! The constrained distribution at state `s`.
  void distribution(std::span<float const> logits, state_type const& s,
                    std::span<float> probs) const {
    detail::check_row_shapes(logits, probs, "constrained::distribution");
    if (!constraint_) {
      policy_.distribution(logits, history(s), probs);
      return;
    }
    detail::masked_distribution(policy_, logits, allowed(s, logits.size()), history(s), probs);
  }
  //! The constrained distribution after `history`.
  void distribution(std::span<float const> logits, token_history history,
                    std::span<float> probs) const {
    distribution(logits, begin(history), probs);
  }
  //! The constrained greedy token at state `s`.
  [[nodiscard]] token_id greedy_token(std::span<float const> logits, state_type const& s) const {
    SPECDEC_CHECK(!logits.empty(), invalid_argument, "constrained::greedy_token: empty row");
    if (!constraint_) return policy_.greedy_token(logits, history(s));
    std::span<std::uint64_t const> const mask = allowed(s, logits.size());
    if constexpr (std::same_as<Policy, greedy>)
      return detail::masked_argmax(logits, mask);  // reads no history: none is materialised
    else
      return detail::masked_greedy_token(policy_, logits, mask, history(s));
  }
  //! The constrained greedy token after `history`.
  [[nodiscard]] token_id greedy_token(std::span<float const> logits, token_history history) const {
    return greedy_token(logits, begin(history));
  }
  //! Whether `output` (the generated tokens, prompt excluded) is complete under the constraint:
  //! it may end there (true without a constraint; false when it breaks the constraint).
  [[nodiscard]] bool output_complete(std::span<token_id const> output) const {
    if (!constraint_) return true;
    auto s = constraint_->start();
    for (token_id t : output)
      if (!constraint_->advance(s, t)) return false;
    return constraint_->can_end(s);
  }
  //! `policy.sample(probs, rng)`.
  [[nodiscard]] token_id sample(std::span<float const> probs, philox& rng) const {
    return policy_.sample(probs, rng);
  }

 private:
  std::span<std::uint64_t const> allowed(state_type const& s, std::size_t vocab) const {
    SPECDEC_CHECK(vocab == constraint_->vocab_size(), invalid_argument, "constrained: a row of ",
                  vocab, " logits but the constraint covers ", constraint_->vocab_size(),
                  " tokens");
    std::span<std::uint64_t const> const mask = constraint_->allowed(s.at);
    bool any = false;
    for (std::uint64_t w : mask) any = any || w != 0;
    SPECDEC_CHECK(any, invalid_argument,
                  "constrained: the output is complete but no end token is allowed (the "
                  "constraint's vocabulary has no end tokens)");
    return mask;
  }

  //! What the wrapped policy reads: the history and the path, materialised only when it reads
  //! them.
  token_history history(state_type const& s) const {
    if (!history_) return token_history::checked(std::span<token_id const>());
    if (s.path.empty()) return s.committed;
    std::span<token_id const> const c = s.committed.tokens();
    std::vector<token_id>& buf = detail::thread_scratch<token_id, 5>(c.size() + s.path.size());
    std::copy(c.begin(), c.end(), buf.begin());
    std::copy(s.path.begin(), s.path.end(), buf.begin() + static_cast<std::ptrdiff_t>(c.size()));
    return token_history(std::span<token_id const>(buf.data(), c.size() + s.path.size()));
  }

  Policy policy_;
  std::shared_ptr<Constraint const> constraint_;
  std::size_t prefix_;
  bool history_;
};

}  // namespace specdec
