// specdec-generate --prompts: the batched serving that batch.hpp declares (see its comment). A
// translation unit of its own: every strategy's batch decoder is compiled here.

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "generate/batch.hpp"
#include "generate/option.hpp"
#include "generate/options.hpp"
#include "generate/prompts.hpp"
#include "generate/report.hpp"
#include "generate/strategies.hpp"
#include "specdec/backend/cpu/batched_llama.hpp"
#include "specdec/decode/batch_decoder.hpp"
#include "specdec/decode/speculation.hpp"
#include "specdec/detail/memory.hpp"
#include "specdec/model/load.hpp"
#include "specdec/model/tokenizer.hpp"
#include "specdec/propose/constrained.hpp"
#include "specdec/propose/cross_vocabulary.hpp"
#include "specdec/propose/draft_model.hpp"
#include "specdec/propose/per_request.hpp"
#include "specdec/propose/prompt_lookup.hpp"
#include "specdec/propose/rest.hpp"
#include "specdec/propose/suffix.hpp"
#include "specdec/sampling/automaton_constraint.hpp"
#include "specdec/sampling/policy.hpp"
#include "specdec/verify/greedy.hpp"
#include "specdec/verify/tree_sampling.hpp"
#include "specdec/verify/typical_acceptance.hpp"

namespace generate {

//! Drafts nothing: every request decodes autoregressively.
struct no_draft {
  void begin(std::span<sd::token_id const>) {}
  void propose(sd::propose_context const& ctx, sd::draft_tree& tree) {
    tree.reset(ctx.tokens.back());
  }
  void accept(sd::verify_result const&) {}
  [[nodiscard]] std::size_t max_nodes() const noexcept { return 0; }
};

//! Streams the text of many requests to stdout, each output line after its request's line number
//! ("12: Once upon a time ..."): a request's text (its prompt, then its pieces as they are
//! committed) is written a line at a time, when it completes a line or reaches `width` bytes (cut
//! at its last space), so that the requests' lines interleave without mixing.
class prefixed_stream {
 public:
  prefixed_stream(sd::tokenizer const& tok, std::vector<numbered_prompt> const& prompts,
                  std::vector<std::vector<sd::token_id>> const& encoded, std::size_t width = 96)
      : tok_(&tok), prompts_(&prompts), width_(width) {
    previous_.reserve(encoded.size());
    for (auto const& e : encoded) previous_.push_back(e.empty() ? sd::no_token : e.back());
    started_.assign(encoded.size(), false);
    pending_.resize(encoded.size());
  }

  //! Request i committed `token`.
  void token(std::size_t i, sd::token_id token) {
    std::string& text = pending_[i];
    if (!started_[i]) {
      started_[i] = true;
      text = (*prompts_)[i].text;
    }
    text += tok_->decode(previous_[i], token);
    previous_[i] = token;
    for (;;) {
      std::size_t cut = text.find('\n');
      if (cut == std::string::npos) {
        if (text.size() < width_) break;
        cut = text.rfind(' ', width_);
        if (cut == std::string::npos || cut == 0) cut = width_;
        line(i, text.substr(0, cut));
        text.erase(0, cut < text.size() && text[cut] == ' ' ? cut + 1 : cut);
        continue;
      }
      line(i, text.substr(0, cut));
      text.erase(0, cut + 1);
    }
  }

  //! Request i ended: the rest of its text, then "12: -- <what>".
  void end(std::size_t i, std::string const& what) {
    if (!pending_[i].empty()) line(i, pending_[i]);
    pending_[i].clear();
    std::printf("%zu: -- %s\n", (*prompts_)[i].line, what.c_str());
    std::fflush(stdout);
  }

 private:
  void line(std::size_t i, std::string const& text) {
    std::printf("%zu: ", (*prompts_)[i].line);
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fputc('\n', stdout);
    auto const now = std::chrono::steady_clock::now();
    if (now - last_flush_ > std::chrono::milliseconds(25)) {
      std::fflush(stdout);
      last_flush_ = now;
    }
  }

  sd::tokenizer const* tok_;
  std::vector<numbered_prompt> const* prompts_;
  std::size_t width_;
  std::vector<sd::token_id> previous_;
  std::vector<bool> started_;
  std::vector<std::string> pending_;  // text not written yet
  std::chrono::steady_clock::time_point last_flush_ = std::chrono::steady_clock::now();
};

//! One request's outcome with its line, as the table and --json show it.
struct served_request {
  std::size_t line = 0;
  sd::batch_result result;
  std::optional<constraint_check> check;  //!< its output against the constraint, if one applies
};

//! One request's proposer under the constraint of `s` (a pass-through with none): what
//! `run_speculative` does for a single request (strategies.hpp), inside each request's factory.
template <class Proposer>
sd::constrained_proposer<Proposer, sd::automaton_constraint> constrain(batch_session const& s,
                                                                       Proposer proposer) {
  return sd::constrained_proposer<Proposer, sd::automaton_constraint>(
      std::move(proposer), s.constraint.automaton, forced_span_encoder(&s.tok),
      {.forced_spans = s.constraint.forced_spans});
}

//! `constrain`'s type for `Proposer`.
template <class Proposer>
using constrained_request = sd::constrained_proposer<Proposer, sd::automaton_constraint>;

//! The statistics table of a batched run.
inline void print_batch_table(std::FILE* f, std::string const& description,
                              std::string const& verifier, std::vector<served_request> const& all,
                              sd::batch_stats const& s, std::size_t batch,
                              std::string const& speculate, double wall) {
  std::fprintf(f, "\n-- %s; verifier: %s; %zu requests, %zu at a time, speculation %s\n",
               description.c_str(), verifier.c_str(), all.size(), batch, speculate.c_str());
  std::fprintf(f, "  %6s %7s %7s %6s %8s %8s %8s %9s  %s\n", "line", "prompt", "tokens", "steps",
               "drafted", "accepted", "acc.len", "tok/s", "finish");
  std::size_t valid = 0;
  constraint_check const* constrained = nullptr;  // a request's check, naming the constraint
  for (served_request const& r : all) {
    sd::request_stats const& st = r.result.result.stats;
    std::string validity;
    if (r.check) {
      constrained = &*r.check;
      valid += r.check->valid ? 1 : 0;
      validity = r.check->valid ? ", valid" : ", INVALID";
    }
    std::fprintf(f, "  %6zu %7zu %7zu %6zu %8zu %8zu %8.2f %9.1f  %s%s%s%s\n", r.line,
                 st.prompt_tokens, st.generated, st.steps, st.drafted, st.accepted,
                 st.mean_accepted_length(), st.tokens_per_second(),
                 std::string(sd::to_string(r.result.result.reason)).c_str(), validity.c_str(),
                 r.result.failed() ? ": " : "", r.result.error.c_str());
  }
  using detail::format;
  using detail::row;
  std::fprintf(f, "\n");
  row(f, "total",
      format("%zu tokens from %zu requests (%zu failed) in %.2f s", s.committed, s.finished,
             s.failed, wall));
  if (constrained != nullptr) {
    row(f, "constraint", constraint_text(*constrained));
    row(f, "outputs valid", format("%zu of %zu (complete)", valid, all.size()));
  }
  row(f, "throughput",
      format("%.1f committed tokens/s over the steps (%.1f over the run)", s.tokens_per_second(),
             wall > 0.0 ? static_cast<double>(s.committed) / wall : 0.0));
  row(f, "steps",
      format("%zu target forwards, %.2f requests and %.1f rows each (%zu prompt rows in all)",
             s.steps, s.mean_batch(),
             s.steps == 0 ? 0.0 : static_cast<double>(s.rows) / static_cast<double>(s.steps),
             s.prefill_rows));
  row(f, "drafted",
      format("%zu tokens, %zu accepted (%.1f%%); %.2f tokens per request and step", s.drafted,
             s.accepted,
             detail::percent(static_cast<double>(s.accepted), static_cast<double>(s.drafted)),
             s.mean_accepted_length()));
  sd::request_stats depths;  // the requests' acceptance by depth, summed
  for (served_request const& r : all) {
    sd::request_stats const& st = r.result.result.stats;
    auto const add = [](std::vector<std::size_t>& to, std::vector<std::size_t> const& from) {
      if (to.size() < from.size()) to.resize(from.size(), 0);
      for (std::size_t d = 0; d < from.size(); ++d) to[d] += from[d];
    };
    add(depths.drafted_at_depth, st.drafted_at_depth);
    add(depths.accepted_at_depth, st.accepted_at_depth);
  }
  if (std::vector<double> const by_depth = acceptance_by_depth(depths); !by_depth.empty()) {
    std::string line;
    for (std::size_t d = 0; d < by_depth.size(); ++d)
      line += format("%s%zu: %.0f%%", d == 0 ? "" : "  ", d + 1, 100.0 * by_depth[d]);
    row(f, "acceptance by depth", line);
  }
  row(f, "time shares",
      format("forward %.1f%%  propose %.1f%%  other %.1f%%",
             detail::percent(s.forward_seconds, s.seconds),
             detail::percent(s.propose_seconds, s.seconds),
             detail::percent(std::max(0.0, s.seconds - s.forward_seconds - s.propose_seconds),
                             s.seconds)));
}

//! Refuses, before anything runs, a batch that would need more memory than there is: per request,
//! its KV cache at the most positions it may use (its prompt, max_new_tokens and a draft, within
//! the context) and, per step, a draft tree of `nodes` + 1 rows, each with its ancestor-mask row, a
//! logits row of the target (and a q row when `sampled`) and the model's activations; `batch`
//! requests at once, the longest prompt `longest_prompt`. Throws `errc::out_of_memory` with the
//! estimate and what is available.
inline void check_batch_memory(batch_session const& s, std::size_t batch, std::size_t nodes,
                               bool sampled, std::size_t longest_prompt) {
  sd::llama_config const& c = s.weights->config;
  std::uint64_t const rows = nodes + 1;
  std::uint64_t const vocab = static_cast<std::uint64_t>(c.vocab_size);
  std::uint64_t const row_bytes =
      sd::mask_words(rows) * 8 + vocab * 4 * (sampled ? 2 : 1) +
      (4 * static_cast<std::uint64_t>(c.dim) + 2 * static_cast<std::uint64_t>(c.hidden_dim)) * 4;
  std::uint64_t const positions = std::min<std::uint64_t>(
      s.model_options.max_context, longest_prompt + s.config.max_new_tokens + rows);
  std::uint64_t const kv_bytes = positions * static_cast<std::uint64_t>(c.n_layers) *
                                 static_cast<std::uint64_t>(c.kv_dim()) * 2 * 4;
  sd::detail::check_memory(static_cast<std::uint64_t>(batch) * (rows * row_bytes + kv_bytes),
                           "specdec-generate",
                           sd::detail::concat("--prompts with --batch ", batch, " and ", nodes,
                                              " draft nodes per request and step (an estimate)"));
}

//! Serves `prompts` with `proposer`, `verifier` and `speculation` (see the file comment); returns
//! the exit status: 0, or 1 when a request failed.
//! A prompt that could not be encoded has an empty `encoded` entry and its error in `refused`:
//! it fails alone, before the others run.
template <class Proposer, class Verifier>
int serve(batch_session const& s, std::vector<numbered_prompt> const& prompts,
          std::vector<std::vector<sd::token_id>> const& encoded,
          std::vector<std::string> const& refused, Proposer& proposer, Verifier verifier,
          chosen_speculation speculation, std::string const& description,
          std::string const& verifier_name) {
  option_values const& v = s.values;
  bool const json = v.flag(opt::json);
  std::size_t const batch =
      std::min<std::size_t>(static_cast<std::size_t>(v.count(opt::batch)), prompts.size());
  std::string const speculate = v.text(opt::speculate).value_or("full");
  std::size_t longest = 0;
  for (auto const& e : encoded) longest = std::max(longest, e.size());
  check_batch_memory(s, batch, sd::node_budget(proposer, s.config), sd::samples_drafts_v<Proposer>,
                     longest);
  sd::cpu_batched_llama model(s.weights, {.model = s.model_options, .max_slots = batch});
  sd::batch_decoder<sd::cpu_batched_llama, Proposer, Verifier, cli_policy, chosen_speculation>
      decoder(model, proposer, std::move(verifier), std::move(speculation));
  cli_policy const policy(sd::sampler(s.params), s.constraint.automaton);

  prefixed_stream stream(s.tok, prompts, encoded);
  std::vector<served_request> done(prompts.size());
  std::vector<std::uint64_t> ids;
  std::size_t refused_count = 0;
  std::size_t valid = 0;
  auto const finished = [&](std::size_t i, sd::batch_result const& r) {
    done[i].line = prompts[i].line;
    done[i].result = r;
    if (s.constraint) {
      done[i].check = check_output(s.constraint, s.tok, r.result.tokens);
      valid += done[i].check->valid ? 1 : 0;
    }
    if (json) {
      nlohmann::ordered_json j;
      j["line"] = prompts[i].line;
      j["prompt"] = prompts[i].text;
      j["prompt_ids"] = encoded[i];
      sd::token_id const last = encoded[i].empty() ? sd::no_token : encoded[i].back();
      j["text"] = decode_after(s.tok, last, r.result.tokens);
      j["tokens"] = r.result.tokens;
      j["finish_reason"] = sd::to_string(r.result.reason);
      if (r.failed()) j["error"] = r.error;
      if (done[i].check) j["constraint"] = constraint_json(*done[i].check, std::nullopt);
      j["stats"] = stats_json(run_output{r.result, description, verifier_name}, nullptr);
      print_json(j);
      std::fflush(stdout);
    } else {
      std::string what = r.failed() ? "failed: " + r.error
                                    : std::string(sd::to_string(r.result.reason)) + ", " +
                                          std::to_string(r.result.tokens.size()) + " tokens";
      if (done[i].check && !r.failed())
        what += ", output valid: " + validity_text(*done[i].check, r.result.reason);
      stream.end(i, what);
    }
  };
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    if (encoded[i].empty()) {
      sd::batch_result r;
      r.result.reason = sd::finish_reason::failed;
      r.error = refused[i];
      r.code = sd::errc::context_overflow;
      finished(i, r);
      ++refused_count;
      continue;
    }
    sd::decode_config config = s.config;
    config.seed = s.config.seed + prompts[i].line;
    sd::batch_callbacks callbacks;
    if (!json)
      callbacks.on_token = [&stream, i](sd::token_id t) {
        stream.token(i, t);
        return true;
      };
    callbacks.on_finish = [&finished, i](std::uint64_t, sd::batch_result const& r) {
      finished(i, r);
    };
    ids.push_back(decoder.submit(encoded[i], policy, std::move(config), std::move(callbacks)));
  }
  auto const start = std::chrono::steady_clock::now();
  decoder.run();
  double const wall =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (std::uint64_t id : ids) (void)decoder.take(id);

  sd::batch_stats st = decoder.stats();
  st.finished += refused_count;
  st.failed += refused_count;
  if (json) {
    nlohmann::ordered_json total;
    total["strategy"] = s.chosen.name;
    total["description"] = description;
    total["verifier"] = verifier_name;
    total["batch"] = batch;
    total["speculate"] = speculate;
    total["requests"] = st.finished;
    total["failed"] = st.failed;
    total["generated"] = st.committed;
    total["steps"] = st.steps;
    total["mean_batch"] = st.mean_batch();
    total["rows"] = st.rows;
    total["prefill_rows"] = st.prefill_rows;
    total["drafted"] = st.drafted;
    total["accepted"] = st.accepted;
    total["mean_accepted_length"] = st.mean_accepted_length();
    total["tokens_per_second"] = st.tokens_per_second();
    total["forward_seconds"] = st.forward_seconds;
    total["propose_seconds"] = st.propose_seconds;
    total["step_seconds"] = st.seconds;
    total["total_seconds"] = wall;
    total["cpu_target"] = sd::to_string(sd::active_cpu_target());
    if (s.constraint) {
      nlohmann::ordered_json c;
      c["kind"] = s.constraint.kind;
      c["source"] = s.constraint.source;
      c["valid_outputs"] = valid;
      total["constraint"] = std::move(c);
    }
    nlohmann::ordered_json j;
    j["total"] = std::move(total);
    print_json(j);
  } else {
    print_batch_table(stdout, description, verifier_name, done, st, batch, speculate, wall);
  }
  std::fflush(stdout);
  if (st.failed > 0) {
    std::fprintf(stderr, "specdec-generate: %zu of %zu requests failed (see their lines)\n",
                 st.failed, st.finished);
    return 1;
  }
  return 0;
}

//! Serves every prompt of --prompts (see the file comment) with the chosen strategy.
int run_batch(batch_session const& s) {
  option_values const& v = s.values;
  std::vector<numbered_prompt> const prompts = read_prompts(*v.text(opt::prompts));
  std::vector<std::vector<sd::token_id>> encoded(prompts.size());
  std::vector<std::string> refused(prompts.size());
  std::size_t const context = s.model_options.max_context;
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    // A prompt that cannot fit the context is refused before it is encoded (its request fails
    // alone): every token covers at most max_token_length() bytes, which bounds its count.
    std::size_t const at_least = s.tok.min_tokens(prompts[i].text, true);
    if (at_least > context)
      refused[i] =
          sd::detail::concat("a prompt of ", prompts[i].text.size(), " bytes encodes to at least ",
                             at_least, " tokens, more than the context of ", context, " positions");
    else
      encoded[i] = s.tok.encode(prompts[i].text, true);
  }
  bool const greedy = s.params.temperature == 0.0f;
  bool const adaptive = v.text(opt::speculate).value_or("full") == "adaptive";
  // Each request with this strategy's proposer; deterministic candidates are verified greedily at
  // temperature 0, else by the tree verifier (or typical acceptance when asked).
  // Serves with `verifier` (typical acceptance instead when asked) under the chosen speculation
  // policy.
  auto const with_speculation = [&](auto& proposer, auto verifier, std::string const& description,
                                    std::string const& name) {
    auto const go = [&](auto chosen_verifier, std::string const& v_name) {
      return serve(s, prompts, encoded, refused, proposer, std::move(chosen_verifier),
                   adaptive ? chosen_speculation(sd::adaptive_speculation{}) : chosen_speculation(),
                   description, v_name);
    };
    if (s.typical)
      return go(sd::typical_acceptance_verifier(*s.typical), "typical acceptance (lossy)");
    return go(std::move(verifier), name);
  };
  auto const with_verifier = [&](auto& proposer, std::string const& description) {
    if (greedy) return with_speculation(proposer, sd::greedy_verifier{}, description, "greedy");
    return with_speculation(proposer, sd::tree_verifier{}, description, "tree (point masses)");
  };
  if (s.chosen.name == "autoregressive") {
    sd::per_request_proposer<no_draft> proposer([] { return no_draft{}; });
    if (greedy)
      return serve(s, prompts, encoded, refused, proposer, sd::greedy_verifier{},
                   chosen_speculation(0), "autoregressive", "none");
    return serve(s, prompts, encoded, refused, proposer, sd::tree_verifier{}, chosen_speculation(0),
                 "autoregressive", "none");
  }
  if (s.chosen.name == "prompt-lookup") {
    sd::prompt_lookup_config const c = lookup_config(v);
    sd::per_request_proposer<constrained_request<sd::prompt_lookup_proposer>> proposer(
        [&s, c] { return constrain(s, sd::prompt_lookup_proposer(c)); });
    return with_verifier(
        proposer,
        "prompt lookup per request, n-grams " + std::to_string(c.n_max) + ".." +
            std::to_string(c.n_min) + ", depth " + std::to_string(c.k) +
            (c.max_branches > 1 ? ", " + std::to_string(c.max_branches) + " branches" : ""));
  }
  if (s.chosen.name == "rest") {
    // One datastore, read-only, shared by every request's proposer.
    auto const datastore =
        load_datastore(v, static_cast<std::size_t>(s.weights->config.vocab_size));
    sd::rest_config const c = rest_config_of(v);
    sd::per_request_proposer<constrained_request<sd::rest_proposer>> proposer(
        [&s, datastore, c] { return constrain(s, sd::rest_proposer(datastore, c)); });
    return with_verifier(proposer, "REST per request, one shared " +
                                       std::to_string(datastore->size()) +
                                       "-entry datastore, depth " + std::to_string(c.depth) + ", " +
                                       std::to_string(c.max_nodes) + " nodes");
  }
  if (s.chosen.name == "suffix") {
    // One global tree shared by every request's proposer; each has its local tree.
    auto const cache = load_suffix_cache(v, static_cast<std::size_t>(s.weights->config.vocab_size));
    sd::suffix_config const c = suffix_config_of(v);
    std::string const description = suffix_description(c, *cache) + ", per request";
    int const status = [&] {
      sd::per_request_proposer<constrained_request<sd::suffix_proposer>> proposer(
          [&s, cache, c] { return constrain(s, sd::suffix_proposer(cache, c)); });
      return with_verifier(proposer, description);
    }();
    save_suffix_cache(v, *cache, !v.flag(opt::json));
    return status;
  }
  if (s.chosen.name == "draft") {
    // One draft model serves every request from its own slots (one draft forward per draft
    // position for the whole batch).
    auto const draft_weights = std::make_shared<sd::llama_weights const>(
        sd::load_model(*v.text(opt::draft_model), s.access));
    sd::cpu_llama_options options = s.model_options;
    if (v.given(opt::draft_threads)) {
      options.threads = static_cast<std::size_t>(v.count(opt::draft_threads));
      options.pool = nullptr;
    }
    if (v.given(opt::draft_context))
      options.max_context = static_cast<std::size_t>(v.count(opt::draft_context));
    auto const draft_vocab = static_cast<std::size_t>(draft_weights->config.vocab_size);
    if (auto const bridge = draft_bridge(v, s.tok, draft_vocab)) {
      // A draft of another vocabulary: each request's proposer owns an instance of the draft
      // model over the shared weights (its cache), and reads its rows with the plain sampler.
      sd::cross_vocabulary_config const c = cross_config(v);
      std::string const description = cross_description(*bridge, c) + ", per request";
      auto const per_request = [&]<sd::draft_mode M>(auto serve_with) {
        using cross = sd::cross_vocabulary_proposer<sd::cpu_llama, sd::sampler, M>;
        using proposer_type = sd::owning_proposer<sd::cpu_llama, cross>;
        sd::per_request_proposer<proposer_type> proposer([&] {
          return proposer_type(
              std::make_unique<sd::cpu_llama>(draft_weights, options),
              [&](sd::cpu_llama& m) { return cross(m, bridge, sd::sampler(s.params), c); });
        });
        return serve_with(proposer);
      };
      if (c.mode == sd::vocab_mode::string)
        return per_request.template operator()<sd::draft_mode::greedy>(
            [&](auto& p) { return with_verifier(p, description); });
      if (greedy)
        return per_request.template operator()<sd::draft_mode::greedy>([&](auto& p) {
          return with_speculation(p, sd::greedy_verifier{}, description, "greedy");
        });
      return per_request.template operator()<sd::draft_mode::sample>([&](auto& p) {
        return with_speculation(p, sd::speculative_sampling_verifier{}, description,
                                "speculative sampling");
      });
    }
    std::size_t const batch =
        std::min<std::size_t>(static_cast<std::size_t>(v.count(opt::batch)), prompts.size());
    sd::cpu_batched_llama draft(draft_weights, {.model = options, .max_slots = batch});
    sd::draft_model_config const chain = chain_config(v);
    std::size_t const vocab = static_cast<std::size_t>(s.weights->config.vocab_size);
    std::string const description = "draft model serving the batch, " + chain_description(chain);
    auto const with_mode = [&]<sd::draft_mode M>() {
      sd::batched_draft_model_proposer<sd::cpu_batched_llama, sd::sampler, M> proposer(
          draft, vocab, sd::sampler(s.params), chain);
      return with_speculation(proposer, chain_verifier<M>{}, description, chain_verifier_name<M>);
    };
    if (greedy) return with_mode.template operator()<sd::draft_mode::greedy>();
    return with_mode.template operator()<sd::draft_mode::sample>();
  }
  // The other strategies: one single-sequence proposer per request (per_request_proposer),
  // built as a single run builds it (strategies.hpp), so that each request drafts as it would
  // alone.
  if (s.chosen.name == "lookahead") {
    sd::lookahead_config const c = lookahead_config_of(v);
    sd::per_request_proposer<sd::lookahead_proposer> proposer(
        [c] { return sd::lookahead_proposer(c); });
    return with_verifier(proposer, "lookahead per request, " + lookahead_description(c));
  }
  if (s.chosen.name == "jacobi") {
    sd::jacobi_config const c = jacobi_config_of(v);
    sd::per_request_proposer<sd::jacobi_proposer> proposer([c] { return sd::jacobi_proposer(c); });
    return with_speculation(proposer, sd::greedy_verifier{},
                            "Jacobi per request, k = " + std::to_string(c.block), "greedy");
  }
  if (s.chosen.name == "layer-skip") {
    // Each request drafts with the target's layers skipped, on its own slot.
    std::vector<std::int32_t> const layers = skip_layers_of(v, s.weights->config.n_layers);
    sd::draft_model_config const chain = layer_skip_chain(v);
    std::string const description = layer_skip_description(layers, chain) + ", per request";
    auto const with_mode = [&]<sd::draft_mode M>() {
      using proposer_type = sd::layer_skip_proposer<sd::sampler, M>;
      sd::per_request_proposer<proposer_type> proposer([&] {
        return proposer_type({.skip_layers = layers, .draft = chain}, sd::sampler(s.params));
      });
      return with_speculation(proposer, chain_verifier<M>{}, description, chain_verifier_name<M>);
    };
    if (greedy) return with_mode.template operator()<sd::draft_mode::greedy>();
    return with_mode.template operator()<sd::draft_mode::sample>();
  }
  if (s.chosen.name == "sparse-kv") {
    // Each request drafts over a view of its own slot's cache.
    sd::sparse_kv_config const config = sparse_kv_config_of(v);
    std::string const description = sparse_kv_description(config) + ", per request";
    auto const with_mode = [&]<sd::draft_mode M>() {
      using proposer_type = sd::sparse_kv_proposer<sd::sampler, M>;
      sd::per_request_proposer<proposer_type> proposer(
          [&] { return proposer_type(config, sd::sampler(s.params)); });
      return with_speculation(proposer, chain_verifier<M>{}, description, chain_verifier_name<M>);
    };
    if (greedy) return with_mode.template operator()<sd::draft_mode::greedy>();
    return with_mode.template operator()<sd::draft_mode::sample>();
  }
  if (s.chosen.name == "medusa" || s.chosen.name == "hydra") {
    // One runner of the heads, shared by the requests' proposers in turn (it keeps no sequence
    // state); the tree is chosen once, as a single run chooses it (with a single-sequence instance
    // of the target for the measured accuracies).
    lm single = make_lm(device_kind::cpu, sd::weight_dtype::f32, s.weights, s.model_options);
    session one{v,
                s.weights,
                single,
                s.model_options,
                {},
                s.config,
                cli_policy(sd::sampler(s.params), s.constraint.automaton),
                greedy,
                {},
                s.typical,
                s.access};
    std::filesystem::path const dir = heads_directory(v);
    std::string tree_text;
    // `make(runner, tree)` builds one request's proposer.
    auto const with_heads = [&](auto& runner, auto measure, std::string const& name, auto make) {
      sd::sparse_tree const tree = heads_tree(one, runner, dir, measure, tree_text);
      std::string const description = name + ", " + std::to_string(runner.num_heads()) +
                                      " heads, " + tree_text + ", per request";
      using proposer_type = decltype(make(runner, tree));
      sd::per_request_proposer<proposer_type> proposer(
          [&runner, &tree, make] { return make(runner, tree); });
      return with_verifier(proposer, description);
    };
    if (s.chosen.name == "medusa") {
      sd::cpu_medusa_heads runner(std::make_shared<sd::medusa_weights const>(
                                      sd::load_medusa_heads(dir, s.weights->config, s.access)),
                                  {.threads = s.model_options.threads});
      return with_heads(runner, sd::measure_medusa_accuracy<sd::cpu_medusa_heads>, "Medusa",
                        [](sd::cpu_medusa_heads& r, sd::sparse_tree const& t) {
                          return sd::medusa_proposer<sd::cpu_medusa_heads>(r, t);
                        });
    }
    sd::cpu_hydra_heads runner(std::make_shared<sd::hydra_weights const>(
                                   sd::load_hydra_heads(dir, s.weights->config, s.access)),
                               s.weights, {.threads = s.model_options.threads});
    return with_heads(runner, sd::measure_hydra_accuracy<sd::cpu_hydra_heads>, "Hydra",
                      [](sd::cpu_hydra_heads& r, sd::sparse_tree const& t) {
                        return sd::hydra_proposer<sd::cpu_hydra_heads>(r, t);
                      });
  }
  if (s.chosen.name == "eagle") {
    // Each request's proposer owns a runner of the one head (the runner keeps the request's head
    // cache).
    auto const head = load_eagle(v, s.weights, s.access);
    eagle_drafting const drafting = eagle_drafting_of(v, *head);
    using proposer_type =
        sd::owning_proposer<sd::cpu_eagle_head, sd::eagle_proposer<sd::cpu_eagle_head>>;
    sd::cpu_eagle_options const options{
        .threads = s.model_options.threads, .pool = s.model_options.pool, .max_context = context};
    sd::per_request_proposer<proposer_type> proposer([&] {
      return proposer_type(std::make_unique<sd::cpu_eagle_head>(head, options),
                           [&](sd::cpu_eagle_head& h) { return drafting.make(h); });
    });
    return with_verifier(proposer, drafting.description + ", per request");
  }
  if (s.chosen.name == "pard") {
    // Each request's proposer owns a draft model of the one set of weights (its cache holds the
    // request's committed tokens).
    auto const draft_weights = std::make_shared<sd::llama_weights const>(
        sd::load_model(*v.text(opt::draft_model), s.access));
    sd::cpu_llama_options options = s.model_options;
    if (v.given(opt::draft_threads)) {
      options.threads = static_cast<std::size_t>(v.count(opt::draft_threads));
      options.pool = nullptr;
    }
    options.max_context = v.given(opt::draft_context)
                              ? static_cast<std::size_t>(v.count(opt::draft_context))
                              : context;
    sd::parallel_draft_config const c{
        .k = static_cast<std::size_t>(v.count(opt::chain_length)),
        .mask_token = static_cast<sd::token_id>(v.count(opt::mask_token))};
    std::string const description = "parallel draft model (PARD), k = " + std::to_string(c.k) +
                                    " from one forward, mask token " +
                                    std::to_string(c.mask_token) + ", per request";
    auto const vocab = static_cast<std::size_t>(s.weights->config.vocab_size);
    auto const with_mode = [&]<sd::draft_mode M>() {
      using pard_type = sd::parallel_draft_proposer<sd::cpu_llama, sd::sampler, M>;
      using proposer_type = sd::owning_proposer<sd::cpu_llama, pard_type>;
      sd::per_request_proposer<proposer_type> proposer([&] {
        return proposer_type(
            std::make_unique<sd::cpu_llama>(draft_weights, options),
            [&](sd::cpu_llama& m) { return pard_type(m, vocab, sd::sampler(s.params), c); });
      });
      return with_speculation(proposer, chain_verifier<M>{}, description, chain_verifier_name<M>);
    };
    if (greedy) return with_mode.template operator()<sd::draft_mode::greedy>();
    return with_mode.template operator()<sd::draft_mode::sample>();
  }
  if (s.chosen.name == "dflash" || s.chosen.name == "dspark") {
    // Each request's proposer owns a runner of the one drafter (the runner keeps the request's
    // context rows).
    bool const dspark = s.chosen.name == "dspark";
    auto const drafter = load_block(v, s.weights, s.access, dspark);
    sd::block_config const c = block_config_of(v, dspark);
    bool const tree = v.given(opt::block_tree);
    std::string const description = block_description(*drafter, c, dspark, tree) + ", per request";
    sd::cpu_block_drafter_options const options{
        .threads = s.model_options.threads, .pool = s.model_options.pool, .max_context = context};
    auto const with_mode = [&]<sd::draft_mode M, sd::block_shape Shape>() {
      using block_type = sd::block_proposer<sd::cpu_block_drafter, sd::sampler, M, Shape>;
      using proposer_type = sd::owning_proposer<sd::cpu_block_drafter, block_type>;
      sd::per_request_proposer<proposer_type> proposer([&] {
        return proposer_type(
            std::make_unique<sd::cpu_block_drafter>(drafter, options),
            [&](sd::cpu_block_drafter& r) { return block_type(r, sd::sampler(s.params), c); });
      });
      if constexpr (Shape == sd::block_shape::tree)
        return with_verifier(proposer, description);
      else
        return with_speculation(proposer, chain_verifier<M>{}, description, chain_verifier_name<M>);
    };
    if (tree) return with_mode.template operator()<sd::draft_mode::greedy, sd::block_shape::tree>();
    if (greedy)
      return with_mode.template operator()<sd::draft_mode::greedy, sd::block_shape::chain>();
    return with_mode.template operator()<sd::draft_mode::sample, sd::block_shape::chain>();
  }
  throw usage_error("--strategy " + std::string(s.chosen.name) + " cannot serve --prompts");
}

}  // namespace generate
