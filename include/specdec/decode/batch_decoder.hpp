#pragma once
//! \file
//! `batch_decoder`: speculative decoding for serving -- many requests decoded together, each
//! step drafting for every request, scoring ALL drafts in one forward of a `batched_lm`, verifying
//! each request and committing or rolling back each sequence by its own accepted length.
//!
//! Requests (`submit`) each have their own prompt, sampling policy, `decode_config` (stops,
//! max_new_tokens, seed and Philox stream, node cap) and callbacks, and their own proposer state
//! (in the `batch_proposer`, under the request's slot). They wait in a queue and join the batch
//! between steps while the model has free slots (continuous batching); a finished, cancelled or
//! failed request leaves at once and its slot serves the next one.
//!
//! One step (`step`), each request's phases being those of its `sequence_step`
//! (decode/sequence.hpp, shared with `speculative_decoder`):
//! 1. cancelled requests leave; waiting requests are admitted (their prompt checked, a slot
//!    acquired and its positions reserved, the proposer started);
//! 2. each request's draft limit (`sequence_step::draft_limit`: the node budget, the context, and
//!    for chains the tokens still allowed); the `speculation_policy` chooses each request's draft
//!    length within it (`fixed_speculation`: all of it; `adaptive_speculation`: what maximises
//!    goodput);
//! 3. propose: one `batch_proposer::propose` call for the whole batch, then each request's
//!    auxiliary tokens for a proposer that has them (`auxiliary(slot, ctx, tree, aux)`);
//! 4. score: one target forward over every request's segment -- its draft tree (root = its last
//!    committed token, positions base + depth, the tree's mask) and auxiliary tokens, preceded on
//!    a request's first step by its prompt x_1..x_{t-1} (its prefill rides in the same forward).
//!    A proposer that reads the target's hidden rows, or adds auxiliary tokens, gets the prompt
//!    scored alone in the request's first step instead, and drafts from its second; the forward
//!    then asks for the hidden rows the proposer reads (`target_hidden_layers`);
//! 5. verify each request with its own policy and Philox stream (per-request verifier calls: the
//!    policies differ between requests, and the ragged entry points of verify/detail/batch.hpp take
//!    one policy for the batch; they are per-sequence calls too, so nothing is lost);
//! 6. commit each request: its slot's cache keeps the root and the accepted nodes (`truncate` or
//!    `keep_path`), its proposer accepts, its tokens are emitted through its stop checks and
//!    callback. Finished requests leave.
//! A request's draws come from its own stream (seed, stream) exactly as in `speculative_decoder`,
//! and its rows are the same bits whatever else is in the batch (the CPU backend's batch
//! invariance): with a fixed policy that drafts the whole budget, every request's tokens equal
//! `speculative_decoder`'s for the same request, greedy or sampled; with the adaptive policy they
//! follow the same distribution (greedy: the same tokens). A request whose limit is 0
//! (max_draft_nodes = 0) decodes autoregressively, as `autoregressive_decoder` does.
//!
//! Errors are per request: a bad prompt or configuration, a prompt beyond the context, memory
//! that cannot be reserved, a proposer, verifier or callback that throws -- the request finishes
//! with `finish_reason::failed` and its error (`batch_result::error`), and the others go on.
//!
//! One topic -- the batched loop and the life of its requests (admission, the step's phases,
//! failures kept to their request, results) -- needs more than 600 lines here.

#include <algorithm>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "specdec/core/auxiliary_batch.hpp"
#include "specdec/core/batch_forward.hpp"
#include "specdec/core/concepts.hpp"
#include "specdec/core/draft_tree.hpp"
#include "specdec/core/error.hpp"
#include "specdec/core/philox.hpp"
#include "specdec/core/propose_context.hpp"
#include "specdec/core/stats.hpp"
#include "specdec/core/traits.hpp"
#include "specdec/core/types.hpp"
#include "specdec/core/verify_result.hpp"
#include "specdec/core/views.hpp"
#include "specdec/decode/common.hpp"
#include "specdec/decode/detail/phase_timer.hpp"
#include "specdec/decode/sequence.hpp"
#include "specdec/decode/speculation.hpp"

namespace specdec {

//! Configuration of a `batch_decoder` (each request has its own `decode_config`).
struct batch_decoder_config {
  //! Most requests decoded at once; 0 = as many as the model has slots.
  std::size_t max_batch = 0;
  //! Most prompt tokens admitted per step (a step always admits one waiting request when it
  //! can); 0 = no limit. Bounds how long a step that prefills new prompts takes.
  std::size_t max_prefill_tokens = 0;
  //! Each request's acceptance estimate, what the speculation policy sees (see
  //! `acceptance_estimator`: decayed counts, the batch's rate as their prior).
  acceptance_options acceptance = {};

  //! Throws `errc::invalid_argument` naming the field out of its domain.
  void validate() const { acceptance.validate("batch_decoder_config"); }
};

//! The outcome of one request of a `batch_decoder`.
struct batch_result {
  //! Its tokens, why it ended (`finish_reason::failed` when it failed) and its statistics. Phase
  //! times: `score_seconds` and `propose_seconds` are those of the batched steps it took part in
  //! (shared with the batch), `verify_seconds` and `commit_seconds` its own; `prefill_seconds` is
  //! 0 (its prompt rides in its first step); `total_seconds` runs from its admission to its end.
  decode_result result;
  std::string error;              //!< what failed (when `failed()`), else empty
  errc code = errc::internal;     //!< the failure's code (when `failed()`)
  std::size_t waiting_steps = 0;  //!< steps it waited in the queue before admission

  //! Whether the request failed.
  [[nodiscard]] bool failed() const noexcept { return result.reason == finish_reason::failed; }
};

//! What a `batch_decoder`'s steps did, all requests together.
struct batch_stats {
  std::size_t steps = 0;              //!< batched steps (one target forward each)
  std::size_t request_steps = 0;      //!< requests summed over steps
  std::size_t max_batch = 0;          //!< most requests in one step
  std::size_t rows = 0;               //!< target forward rows (prompts included)
  std::size_t prefill_rows = 0;       //!< of which prompt rows
  std::size_t drafted = 0;            //!< draft tokens scored
  std::size_t accepted = 0;           //!< draft tokens accepted
  std::size_t committed = 0;          //!< tokens emitted
  std::size_t finished = 0;           //!< requests that ended (failed ones included)
  std::size_t failed = 0;             //!< requests that failed
  double forward_seconds = 0.0;       //!< in target forwards
  double propose_seconds = 0.0;       //!< in the proposer
  double seconds = 0.0;               //!< wall time of every step
  double prefill_seconds = 0.0;       //!< of which steps that scored prompt rows
  std::size_t prefill_committed = 0;  //!< tokens emitted by those steps

  //! Committed tokens per second of step time (goodput).
  [[nodiscard]] double tokens_per_second() const noexcept {
    return seconds > 0.0 ? static_cast<double>(committed) / seconds : 0.0;
  }
  //! Committed tokens per second of the steps without prompt rows: the decode phase alone.
  [[nodiscard]] double decode_tokens_per_second() const noexcept {
    double const t = seconds - prefill_seconds;
    return t > 0.0 ? static_cast<double>(committed - prefill_committed) / t : 0.0;
  }
  //! Mean requests per step.
  [[nodiscard]] double mean_batch() const noexcept {
    return steps == 0 ? 0.0 : static_cast<double>(request_steps) / static_cast<double>(steps);
  }
  //! Mean tokens committed per request and step (accepted + 1, after stops).
  [[nodiscard]] double mean_accepted_length() const noexcept {
    return request_steps == 0 ? 0.0
                              : static_cast<double>(committed) / static_cast<double>(request_steps);
  }
};

//! The callbacks of one request.
struct batch_callbacks {
  //! Each committed token, in order, as soon as it is committed; false cancels the request after
  //! that token (`finish_reason::cancelled`). A callback that throws fails its request.
  token_callback on_token = {};
  //! Called once when the request ends (finished, cancelled or failed), at the end of the step;
  //! an exception it throws leaves `step` after the step's bookkeeping.
  std::function<void(std::uint64_t id, batch_result const& result)> on_finish = {};
};

//! Speculative decoding of many requests at once (see the file comment).
//!
//! \tparam Model       the target, a `batched_lm`; held by reference. The decoder acquires and
//!                     releases its slots; a forward that throws must leave every cache
//!                     unchanged (as the concept's models do).
//! \tparam Proposer    a `batch_proposer`; held by reference. Its `max_nodes() const`, when it has
//!                     one, is every request's node budget.
//! \tparam Verifier    a `verifier` for Policy; owned, shared by the requests in turn.
//! \tparam Policy      a `sampling_policy`; each request has its own.
//! \tparam Speculation a `speculation_policy`; owned.
//! Not thread-safe: submit, cancel and step from one thread (the callbacks run inside `step`
//! and may submit or cancel).
template <batched_lm Model, batch_proposer Proposer, class Verifier, sampling_policy Policy,
          speculation_policy Speculation = fixed_speculation>
requires verifier<Verifier, Policy>
class batch_decoder {
  static_assert(detail::pairing_checks<Model, Proposer, Verifier>::ok);
  static_assert(
      !has_auxiliary_tokens_v<Proposer> ||
          requires(Proposer & p, std::size_t slot, propose_context const& ctx,
                   draft_tree const& tree, auxiliary_batch& aux, matrix_view<float const> rows,
                   verify_result const& r) {
            p.auxiliary(slot, ctx, tree, aux);
            p.observe(slot, rows, rows, r);
          },
      "batch_decoder: this proposer declares has_auxiliary_tokens but lacks "
      "auxiliary(slot, ctx, tree, aux) or observe(slot, tree_logits, aux_logits, result)");

 public:
  using request_id = std::uint64_t;  //!< a request's id (0, 1, 2, ... in submission order)

  //! A decoder scoring `proposer`'s drafts with `target` (both must outlive it). Throws
  //! `errc::invalid_argument` for a bad configuration.
  batch_decoder(Model& target, Proposer& proposer, Verifier verifier = {},
                Speculation speculation = {}, batch_decoder_config config = {})
      : target_(&target),
        proposer_(&proposer),
        verifier_(std::move(verifier)),
        speculation_(std::move(speculation)),
        config_((config.validate(), config)),
        acceptance_(config_.acceptance) {}

  //! Queues a request: `prompt` (copied), its own sampling `policy`, `config` and `callbacks`;
  //! returns its id. It joins the batch at a coming step. Never throws for a bad request: a
  //! request that cannot run fails alone when it is admitted (see the file comment).
  request_id submit(std::span<token_id const> prompt, Policy policy, decode_config config = {},
                    batch_callbacks callbacks = {}) {
    if constexpr (!std::is_reference_v<decltype(policy_for_prompt(policy, prompt.size()))>)
      policy = policy_for_prompt(policy, prompt.size());
    auto r = std::make_unique<request>(std::move(policy));
    r->id = next_id_++;
    r->prompt.assign(prompt.begin(), prompt.end());
    r->config = std::move(config);
    r->callbacks = std::move(callbacks);
    waiting_.push_back(std::move(r));
    return next_id_ - 1;
  }

  //! Cancels request `id`: a waiting one ends at once, a running one at the start of the next
  //! step, either with `finish_reason::cancelled` and the tokens it has. Returns whether it was
  //! waiting or running.
  bool cancel(request_id id) {
    for (auto it = waiting_.begin(); it != waiting_.end(); ++it) {
      if ((*it)->id == id) {
        std::unique_ptr<request> r = std::move(*it);
        waiting_.erase(it);
        r->out.reason = finish_reason::cancelled;
        r->out.stats.prompt_tokens = r->prompt.size();
        record(*r);
        notify_finished();
        return true;
      }
    }
    for (auto& r : running_) {
      if (r->id == id && !r->done) {
        r->cancel = true;
        return true;
      }
    }
    return false;
  }

  //! Runs one batched step (see the file comment) and returns the requests still waiting or
  //! running. Throws `errc::context_overflow` when requests wait but the model has no free slot
  //! and none runs (its slots are held elsewhere), and what the speculation policy's `prepare`
  //! throws; request failures do not throw.
  std::size_t step() {
    auto const start = std::chrono::steady_clock::now();
    std::size_t const committed_before = stats_.committed;
    if (!prepared_) {
      if constexpr (requires(Speculation & s, Model & m) { s.prepare(m); })
        speculation_.prepare(*target_);
      prepared_ = true;
    }
    for (auto& r : running_)
      if (r->cancel) finish(*r, finish_reason::cancelled);
    compact();
    admit();
    if (running_.empty()) {
      SPECDEC_CHECK(waiting_.empty(), context_overflow, "batch_decoder: ", waiting_.size(),
                    " requests wait but the model has no free slot");
      notify_finished();
      return 0;
    }
    for (auto& r : waiting_) ++r->waiting_steps;

    // Limits and the speculation policy's choice.
    spec_.clear();
    for (auto& r : running_) {
      std::size_t limit = 0;
      if (!r->prefills_alone()) {
        std::optional<std::size_t> const l = r->seq.draft_limit();
        if (!l) {
          finish(*r, r->out.reason);
          continue;
        }
        limit = *l;
      }
      spec_.push_back(acceptance_.request(r->acceptance, r->slot, limit,
                                          (r->prefills_alone() ? 0 : 1) + r->seq.prompt_rows()));
      // Every count decays once per step; this step's outcomes come in at full weight.
      acceptance_.decay(r->acceptance);
    }
    acceptance_.decay_all();
    compact();
    if (running_.empty()) return finish_step(start, 0, 0.0, 0.0, 0, false, committed_before);
    draft_.assign(running_.size(), 0);
    speculation_.choose(std::span<speculation_request const>(spec_),
                        std::span<std::size_t>(draft_));

    // Propose, for the whole batch at once (not for requests whose prompt is scored alone first).
    auto const propose_start = std::chrono::steady_clock::now();
    items_.clear();
    owners_.clear();
    for (std::size_t i = 0; i < running_.size(); ++i) {
      request& r = *running_[i];
      if (r.prefills_alone()) continue;
      items_.push_back({.slot = r.slot,
                        .ctx = r.seq.context(std::min(draft_[i], spec_[i].max_draft)),
                        .tree = &r.seq.tree(),
                        .error = nullptr});
      owners_.push_back(i);
    }
    std::exception_ptr propose_error;
    if (!items_.empty()) {
      try {
        proposer_->propose(std::span<batch_propose_item>(items_));
      } catch (...) {
        propose_error = std::current_exception();
      }
    }
    std::size_t drafted = 0;
    for (std::size_t k = 0; k < items_.size(); ++k) {
      request& r = *running_[owners_[k]];
      std::exception_ptr const e = propose_error ? propose_error : items_[k].error;
      if (e) {
        fail(r, e);
        continue;
      }
      try {
        r.seq.end_propose();
        if constexpr (has_auxiliary_tokens_v<Proposer>)
          r.seq.auxiliary([&](auxiliary_batch& aux) {
            proposer_->auxiliary(r.slot, items_[k].ctx, r.seq.tree(), aux);
          });
        r.seq.check_draft(items_[k].ctx.max_nodes, who);
      } catch (...) {
        fail(r, std::current_exception());
        continue;
      }
      drafted += r.seq.tree().num_drafted();
    }
    double const propose_seconds = detail::seconds_since(propose_start);
    compact();
    if (running_.empty())
      return finish_step(start, 0, 0.0, propose_seconds, drafted, false, committed_before);

    // Score: one forward over every request's segment.
    segments_.clear();
    std::size_t rows = 0, prefill_rows = 0;
    for (auto& r : running_) {
      prefill_rows += r->seq.prompt_rows();
      forward_request const req =
          r->prefills_alone() ? r->seq.prefill_request() : r->seq.request(r->seq.prompt_rows() > 0);
      segments_.push_back({.slot = r->slot, .request = req});
      rows += req.tokens.size();
    }
    batch_forward_request const batch{.segments = std::span<batch_segment const>(segments_)};
    auto const forward_start = std::chrono::steady_clock::now();
    bool batched = true;
    try {
      target_->forward(batch, fwd_);
    } catch (...) {
      batched = false;
    }
    double forward_seconds = detail::seconds_since(forward_start);

    for (auto& r : running_) {
      r->out.stats.score_seconds += forward_seconds;
      r->out.stats.propose_seconds += propose_seconds;
    }

    // Verify and commit each request (segment by segment when the batched forward failed, so
    // that a segment that fails fails its request alone).
    for (std::size_t i = 0; i < running_.size(); ++i) {
      request& r = *running_[i];
      if (batched) {
        conclude(r, fwd_, i);
        continue;
      }
      auto const t0 = std::chrono::steady_clock::now();
      try {
        batch_forward_request one = batch;
        one.segments = std::span<batch_segment const>(&segments_[i], 1);
        target_->forward(one, single_);
      } catch (...) {
        forward_seconds += detail::seconds_since(t0);
        fail(r, std::current_exception());
        continue;
      }
      forward_seconds += detail::seconds_since(t0);
      conclude(r, single_, 0);
    }
    stats_.rows += rows;
    stats_.prefill_rows += prefill_rows;
    return finish_step(start, rows, forward_seconds, propose_seconds, drafted, prefill_rows > 0,
                       committed_before);
  }

  //! Steps until no request waits or runs.
  void run() {
    while (step() > 0) {
    }
  }

  //! Requests admitted and not finished.
  [[nodiscard]] std::size_t running() const noexcept { return running_.size(); }
  //! Requests waiting for admission.
  [[nodiscard]] std::size_t waiting() const noexcept { return waiting_.size(); }
  //! Whether request `id` has ended and its result was not taken yet.
  [[nodiscard]] bool finished(request_id id) const { return results_.contains(id); }
  //! The result of finished request `id`, moved out (once); nullopt when it has not ended or was
  //! taken.
  [[nodiscard]] std::optional<batch_result> take(request_id id) {
    auto const it = results_.find(id);
    if (it == results_.end()) return std::nullopt;
    batch_result r = std::move(it->second);
    results_.erase(it);
    return r;
  }

  //! What the steps did so far.
  [[nodiscard]] batch_stats const& stats() const noexcept { return stats_; }
  //! The speculation policy.
  [[nodiscard]] Speculation& speculation() noexcept { return speculation_; }
  //! The owned verifier.
  [[nodiscard]] Verifier& get_verifier() noexcept { return verifier_; }
  //! The configuration (validated).
  [[nodiscard]] batch_decoder_config const& config() const noexcept { return config_; }

 private:
  static constexpr char const* who = "batch_decoder";

  //! One request and its state.
  struct request {
    explicit request(Policy p) : policy(std::move(p)) {}

    request_id id = 0;
    std::vector<token_id> prompt;
    Policy policy;
    decode_config config;
    batch_callbacks callbacks;
    std::size_t waiting_steps = 0;
    // While running.
    std::size_t slot = 0;
    bool has_slot = false;
    bool proposer_started = false;
    bool cancel = false;
    bool done = false;
    sequence_step<Proposer> seq;  // its step's state (its prompt rides in its first forward)
    decode_result out;
    std::string error;
    errc code = errc::internal;
    acceptance_estimator::counts acceptance;  // decayed counts
    std::chrono::steady_clock::time_point start;

    //! Whether its next forward scores its prompt alone (its proposer reads the prompt's hidden
    //! rows before its first draft).
    [[nodiscard]] bool prefills_alone() const noexcept {
      return sequence_step<Proposer>::prefills_alone && seq.prompt_rows() > 0;
    }
  };

  //! Admits waiting requests while slots are free (within max_batch and the prompt budget).
  void admit() {
    std::size_t const limit = config_.max_batch == 0 ? target_->max_slots() : config_.max_batch;
    std::size_t prefill = 0;
    bool any = false;
    while (!waiting_.empty() && running_.size() < limit && target_->free_slots() > 0) {
      request& next = *waiting_.front();
      std::size_t const rows = next.prompt.empty() ? 0 : next.prompt.size() - 1;
      if (any && config_.max_prefill_tokens > 0 && prefill + rows > config_.max_prefill_tokens)
        break;
      std::unique_ptr<request> r = std::move(waiting_.front());
      waiting_.pop_front();
      any = true;
      prefill += rows;
      if (start(*r)) {
        running_.push_back(std::move(r));
      } else {
        record(*r);
      }
    }
  }

  //! Starts request `r` (see the file comment); false when it ended at once (failed, or nothing
  //! to generate).
  bool start(request& r) {
    r.start = std::chrono::steady_clock::now();
    r.out.stats = request_stats{};
    r.out.stats.prompt_tokens = r.prompt.size();
    r.out.tokens.clear();
    try {
      std::size_t const vocab = target_->vocab_size();
      detail::check_prompt(r.prompt, vocab, target_->max_context(), who);
      r.config.validate(vocab);
      if (r.config.max_new_tokens == 0) {  // nothing to generate: no slot, no proposer
        r.out.reason = finish_reason::max_tokens;
        return false;
      }
      r.slot = target_->acquire_slot();
      r.has_slot = true;
      std::size_t const capacity =
          std::min<std::size_t>(target_->max_context(), target_->cache(r.slot).capacity());
      detail::check_prompt(r.prompt, vocab, capacity, who);
      std::size_t const budget = node_budget(*proposer_, r.config);
      std::size_t const room = capacity - r.prompt.size();
      std::size_t const wanted = std::min(room, r.config.max_new_tokens) + std::min(room, budget);
      if constexpr (requires(Model & m, std::size_t s, std::size_t n) { m.reserve(s, n); })
        target_->reserve(r.slot, r.prompt.size() + std::min(room, wanted));
      r.seq.begin(r.prompt, r.config, budget, capacity, r.out, &r.callbacks.on_token, nullptr,
                  target_hidden_layers(*proposer_));
      if constexpr (uses_target_v<Proposer>)
        r.seq.bind_target(target_handle(*target_, r.slot, handle_scratch_));
      proposer_->begin(r.slot, r.prompt);
      r.proposer_started = true;
    } catch (...) {
      set_failure(r, std::current_exception());
      release(r);
      return false;
    }
    return true;
  }

  //! Concludes request `r`'s part of the step from segment `s` of `fwd`: keeps the hidden rows of
  //! a prompt scored alone, or verifies and commits its draft (see the file comment).
  void conclude(request& r, batch_forward_result const& fwd, std::size_t s) {
    matrix_view<float const> hidden;
    if constexpr (needs_target_hidden_v<Proposer>)
      hidden = target_hidden_layers(*proposer_).empty() ? fwd.hidden(s) : fwd.layer_hidden(s);
    if (r.prefills_alone()) {
      r.seq.prefilled(hidden);
      return;
    }
    matrix_view<float const> const all = fwd.logits(s);
    std::size_t const n = r.seq.tree().size();
    matrix_view<float const> const rows = all.subrows(0, n);
    auto const t0 = std::chrono::steady_clock::now();
    try {
      r.seq.verify(verifier_, rows, r.policy, who);
    } catch (...) {
      fail(r, std::current_exception());
      return;
    }
    auto const t1 = std::chrono::steady_clock::now();
    r.out.stats.verify_seconds += std::chrono::duration<double>(t1 - t0).count();
    step_stats step;
    try {
      step = r.seq.commit(
          target_->cache(r.slot), rows, hidden,
          [&] {
            if constexpr (has_auxiliary_tokens_v<Proposer>)
              proposer_->observe(r.slot, rows, all.subrows(n, all.rows() - n), r.seq.result());
            proposer_->accept(r.slot, r.seq.result());
          },
          who);
    } catch (...) {
      fail(r, std::current_exception());
      return;
    }
    r.out.stats.commit_seconds += detail::seconds_since(t1);
    stats_.drafted += step.tree_size;
    stats_.accepted += step.accepted;
    stats_.committed += step.emitted;
    ++stats_.request_steps;
    acceptance_.record(r.acceptance, step.accepted, step.tree_depth);
    if (r.seq.done()) finish(r, r.out.reason);
  }

  //! Records the failure `e` of `r` (its message and code).
  static void set_failure(request& r, std::exception_ptr e) {
    r.out.reason = finish_reason::failed;
    try {
      std::rethrow_exception(e);
    } catch (error const& x) {
      r.code = x.code();
      r.error = x.what();
    } catch (std::exception const& x) {
      r.code = errc::internal;
      r.error = x.what();
    } catch (...) {
      r.code = errc::internal;
      r.error = "unknown exception";
    }
  }

  void fail(request& r, std::exception_ptr e) {
    set_failure(r, std::move(e));
    finish(r, finish_reason::failed);
  }
  void fail(request& r, std::string const& message) {
    fail(r, std::make_exception_ptr(error(errc::invalid_argument, message)));
  }

  //! Frees what `r` holds: its proposer state and its slot.
  void release(request& r) {
    if (r.proposer_started) {
      r.proposer_started = false;
      try {
        proposer_->end(r.slot);
      } catch (...) {
        // Ending cannot fail the request further; the slot is freed below either way.
      }
    }
    if (r.has_slot) {
      r.has_slot = false;
      target_->release_slot(r.slot);
    }
  }

  //! Ends running request `r` with `reason`.
  void finish(request& r, finish_reason reason) {
    if (r.done) return;
    r.done = true;
    r.out.reason = reason;
    detail::check_output_complete(r.policy, r.out);
    r.out.stats.total_seconds = detail::seconds_since(r.start);
    release(r);
    record(r);
  }

  //! Stores `r`'s result and queues its on_finish callback.
  void record(request& r) {
    batch_result res;
    res.result = std::move(r.out);
    res.error = std::move(r.error);
    res.code = r.code;
    res.waiting_steps = r.waiting_steps;
    ++stats_.finished;
    if (res.failed()) ++stats_.failed;
    if (r.callbacks.on_finish) to_notify_.emplace_back(r.id, std::move(r.callbacks.on_finish));
    results_.insert_or_assign(r.id, std::move(res));
  }

  //! Drops finished requests from the batch, keeping the order of the others.
  void compact() {
    std::erase_if(running_, [](std::unique_ptr<request> const& r) { return r->done; });
  }

  //! The step's bookkeeping: statistics, the speculation policy's measurement, finished
  //! requests' callbacks (`prefilled`: the step scored prompt rows; `committed_before`:
  //! stats_.committed when it began). Returns the requests waiting or running.
  std::size_t finish_step(std::chrono::steady_clock::time_point start, std::size_t rows,
                          double forward_seconds, double propose_seconds, std::size_t drafted,
                          bool prefilled, std::size_t committed_before) {
    std::size_t const in_step = spec_.size();
    compact();
    double const seconds = detail::seconds_since(start);
    if (rows > 0) ++stats_.steps;
    stats_.max_batch = std::max(stats_.max_batch, in_step);
    stats_.forward_seconds += forward_seconds;
    stats_.propose_seconds += propose_seconds;
    stats_.seconds += seconds;
    if (prefilled) {
      stats_.prefill_seconds += seconds;
      stats_.prefill_committed += stats_.committed - committed_before;
    }
    if (rows > 0)
      speculation_.observe(step_cost{
          .requests = in_step,
          .rows = rows,
          .drafted = drafted,
          .forward_seconds = forward_seconds,
          .propose_seconds = propose_seconds,
          .remaining_seconds = std::max(0.0, seconds - forward_seconds - propose_seconds)});
    notify_finished();
    return running_.size() + waiting_.size();
  }

  //! Calls the queued on_finish callbacks (with the results kept until taken).
  void notify_finished() {
    while (!to_notify_.empty()) {
      auto [id, callback] = std::move(to_notify_.front());
      to_notify_.pop_front();
      auto const it = results_.find(id);
      if (it != results_.end()) callback(id, it->second);
    }
  }

  Model* target_;
  Proposer* proposer_;
  Verifier verifier_;
  Speculation speculation_;
  batch_decoder_config config_;
  bool prepared_ = false;
  request_id next_id_ = 0;
  acceptance_estimator acceptance_;
  std::deque<std::unique_ptr<request>> waiting_;
  std::vector<std::unique_ptr<request>> running_;  // in admission order
  std::unordered_map<request_id, batch_result> results_;
  std::deque<std::pair<request_id, std::function<void(std::uint64_t, batch_result const&)>>>
      to_notify_;
  batch_stats stats_;
  // Per-step buffers, reused.
  std::vector<speculation_request> spec_;
  std::vector<std::size_t> draft_;
  std::vector<batch_propose_item> items_;
  std::vector<std::size_t> owners_;  // items_[k] is running_[owners_[k]]'s
  std::vector<batch_segment> segments_;
  batch_forward_result handle_scratch_;  // the forwards of proposers drafting on the target
  batch_forward_result fwd_;
  batch_forward_result single_;
};

}  // namespace specdec
