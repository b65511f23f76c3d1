#pragma once
// specdec-generate's output after generation: the statistics table, and the "stats" member of
// the --json object (nlohmann/json, members in a fixed order).

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "generate/strategies.hpp"
#include "specdec/core/cpu_target.hpp"
#include "specdec/core/stats.hpp"
#include "specdec/core/types.hpp"
#include "specdec/decode/common.hpp"
#include "specdec/model/tokenizer.hpp"

namespace generate {

//! The text of `tokens` following `previous` (as streamed: the first piece may drop its leading
//! space after BOS).
inline std::string decode_after(sd::tokenizer const& tok, sd::token_id previous,
                                std::span<sd::token_id const> tokens) {
  std::string text;
  for (sd::token_id t : tokens) {
    text += tok.decode(previous, t);
    previous = t;
  }
  return text;
}

//! The text of `tokens` up to the first control token (an end-of-text token): the output as a
//! constraint reads it (`token_vocabulary::of`: a first piece keeps its leading space, which the
//! streamed text drops right after BOS).
inline std::string output_text(sd::tokenizer const& tok, std::span<sd::token_id const> tokens) {
  std::size_t n = 0;
  while (n < tokens.size() && tok.type(tokens[n]) != sd::token_type::control) ++n;
  return decode_after(tok, sd::no_token, tokens.first(n));
}

//! Whether an output satisfies the run's constraint (--regex, --json-schema).
struct constraint_check {
  std::string kind;    //!< "regex" or "json_schema"
  std::string source;  //!< the pattern, or the schema file's path
  bool valid = false;  //!< the whole text matches the constraint (complete)
  bool json = false;   //!< the text parses as JSON
};

//! Checks the output `tokens` against `c` (which applies).
inline constraint_check check_output(output_constraint const& c, sd::tokenizer const& tok,
                                     std::span<sd::token_id const> tokens) {
  std::string const text = output_text(tok, tokens);
  return {.kind = c.kind,
          .source = c.source,
          .valid = c.automaton->matches(text),
          .json = nlohmann::json::accept(text)};
}

//! The constraint in words: regex "PATTERN" or JSON schema FILE.
inline std::string constraint_text(constraint_check const& c) {
  if (c.kind == "regex") return "regex \"" + c.source + "\"";
  return "JSON schema " + c.source;
}

//! Whether the output is valid, in words: "yes (complete, parses as JSON)", "no (incomplete:
//! -n or the context ended it first)".
inline std::string validity_text(constraint_check const& c, sd::finish_reason reason) {
  if (!c.valid && reason == sd::finish_reason::constraint_incomplete)
    return "no (incomplete: -n or the context ended it first)";
  if (!c.valid) return "no (incomplete: " + std::string(sd::to_string(reason)) + ")";
  if (c.kind != "json_schema") return "yes (complete)";
  return c.json ? "yes (complete, parses as JSON)" : "yes (complete) but it does not parse as JSON";
}

//! The "constraint" member of --json: {"kind", "source", "valid", "json"}, and the constrained
//! proposer's "forced_steps" and "pruned_nodes" when the run's proposer was wrapped (`drafts`).
inline nlohmann::ordered_json constraint_json(constraint_check const& c,
                                              std::optional<constrained_drafts> const& drafts) {
  nlohmann::ordered_json o;
  o["kind"] = c.kind;
  o["source"] = c.source;
  o["valid"] = c.valid;
  o["json"] = c.json;
  if (drafts) {
    o["forced_steps"] = drafts->forced_steps;
    o["pruned_nodes"] = drafts->pruned_nodes;
  }
  return o;
}

//! One JSON value on one line of stdout; invalid UTF-8 (byte-fallback tokens can split a
//! character) becomes U+FFFD.
inline void print_json(nlohmann::ordered_json const& j) {
  std::string const text = j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::fputc('\n', stdout);
}

//! The autoregressive baseline of --compare and how it compares.
struct comparison {
  run_output baseline;                    //!< the baseline's request
  std::optional<bool> identical;          //!< greedy only: whether the tokens are the same
  std::optional<std::size_t> first_diff;  //!< greedy only: first differing index, if any
  [[nodiscard]] double speedup(sd::request_stats const& s) const noexcept {
    double const base = baseline.result.stats.tokens_per_second();
    return base > 0.0 ? s.tokens_per_second() / base : 0.0;
  }
};

//! The run of median total time among `runs` (not empty; of an even count, the slower of the two
//! middle ones). Runs of one request differ only in their timings: the tokens are the same.
inline run_output median_run(std::vector<run_output> runs) {
  auto const mid = runs.begin() + static_cast<std::ptrdiff_t>(runs.size() / 2);
  std::nth_element(runs.begin(), mid, runs.end(), [](run_output const& a, run_output const& b) {
    return a.result.stats.total_seconds < b.result.stats.total_seconds;
  });
  return std::move(*mid);
}

//! A throughput over timed runs: the median run's and the spread (min-max).
struct spread {
  double median = 0.0;  //!< tokens/s of the run of median time (`median_run`)
  double min = 0.0;     //!< the slowest run's tokens/s
  double max = 0.0;     //!< the fastest run's tokens/s
};

//! The timed runs of a request and of its baseline (--repeat, --compare): how many, after how
//! many untimed warm-up runs of each, and the median and the spread of each one's throughput.
struct timing {
  std::size_t runs = 1;                              //!< timed runs of each
  std::size_t warmup = 0;                            //!< untimed warm-up runs of each before them
  spread tokens_per_second;                          //!< the request's
  std::optional<spread> baseline_tokens_per_second;  //!< the baseline's (--compare)
  //! The speedup: the ratio of the medians, and its spread over the pairs of runs made one
  //! after the other (--compare).
  std::optional<spread> speedup;
};

//! The throughputs of `runs` (not empty) as a spread around the run of median time.
inline spread throughput_spread(std::vector<run_output> const& runs) {
  spread s;
  s.median = median_run(runs).result.stats.tokens_per_second();
  s.min = s.max = s.median;
  for (run_output const& r : runs) {
    s.min = std::min(s.min, r.result.stats.tokens_per_second());
    s.max = std::max(s.max, r.result.stats.tokens_per_second());
  }
  return s;
}

//! The timing of `runs` and, when not empty, of `baselines` (one per run, made alternately).
inline timing summarize_timing(std::vector<run_output> const& runs,
                               std::vector<run_output> const& baselines, std::size_t warmup) {
  timing t;
  t.runs = runs.size();
  t.warmup = warmup;
  t.tokens_per_second = throughput_spread(runs);
  if (!baselines.empty()) {
    t.baseline_tokens_per_second = throughput_spread(baselines);
    spread sp;
    sp.median = t.baseline_tokens_per_second->median > 0.0
                    ? t.tokens_per_second.median / t.baseline_tokens_per_second->median
                    : 0.0;
    bool first = true;
    for (std::size_t i = 0; i < runs.size() && i < baselines.size(); ++i) {
      double const b = baselines[i].result.stats.tokens_per_second();
      double const r = b > 0.0 ? runs[i].result.stats.tokens_per_second() / b : 0.0;
      sp.min = first ? r : std::min(sp.min, r);
      sp.max = first ? r : std::max(sp.max, r);
      first = false;
    }
    t.speedup = sp;
  }
  return t;
}

//! Compares `run` with its baseline; `greedy` says whether identical outputs are required.
inline comparison compare_runs(run_output const& run, run_output baseline, bool greedy) {
  comparison c{std::move(baseline), std::nullopt, std::nullopt};
  if (greedy) {
    auto const& a = run.result.tokens;
    auto const& b = c.baseline.result.tokens;
    c.identical = a == b;
    if (!*c.identical) {
      std::size_t i = 0;
      while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
      c.first_diff = i;
    }
  }
  return c;
}

//! Acceptance at depth d + 1: of the steps whose draft reached that depth, the share whose
//! accepted path reached it.
inline std::vector<double> acceptance_by_depth(sd::request_stats const& s) {
  std::vector<double> out;
  for (std::size_t d = 0; d < s.drafted_at_depth.size(); ++d) {
    std::size_t const acc = d < s.accepted_at_depth.size() ? s.accepted_at_depth[d] : 0;
    out.push_back(s.drafted_at_depth[d] == 0
                      ? 0.0
                      : static_cast<double>(acc) / static_cast<double>(s.drafted_at_depth[d]));
  }
  return out;
}

namespace detail {

inline double percent(double part, double whole) noexcept {
  return whole > 0.0 ? 100.0 * part / whole : 0.0;
}

inline void row(std::FILE* f, char const* label, std::string const& value) {
  std::fprintf(f, "  %-22s %s\n", label, value.c_str());
}

template <class... Args>
std::string format(char const* fmt, Args... args) {
  char buf[256];
  std::snprintf(buf, sizeof buf, fmt, args...);
  return buf;
}

}  // namespace detail

//! Prints the statistics table of `run` (and of the comparison, of the timed runs when there
//! were several or a warm-up, and of its output's constraint `check`) to `f`.
inline void print_table(std::FILE* f, run_output const& run, comparison const* cmp,
                        timing const* t = nullptr, constraint_check const* check = nullptr) {
  using detail::format;
  using detail::row;
  sd::request_stats const& s = run.result.stats;
  std::fprintf(f, "\n-- %s; verifier: %s\n", run.description.c_str(), run.verifier.c_str());
  row(f, "prompt", format("%zu tokens", s.prompt_tokens));
  row(f, "generated",
      format("%zu tokens (%s)", s.generated,
             std::string(sd::to_string(run.result.reason)).c_str()));
  if (check != nullptr) {
    row(f, "constraint", constraint_text(*check));
    row(f, "output valid", validity_text(*check, run.result.reason));
    if (run.constrained)
      row(f, "constrained drafts",
          format("%zu steps drafted a forced span, %zu draft nodes pruned",
                 run.constrained->forced_steps, run.constrained->pruned_nodes));
  }
  row(f, "steps", format("%zu target forwards after the prefill", s.steps));
  row(f, "drafted",
      format("%zu tokens (%.2f per step, largest tree %zu)", s.drafted, s.mean_tree_size(),
             s.max_tree_size));
  if (s.aux_tokens != 0)
    row(f, "auxiliary",
        format("%zu tokens scored beside the trees (%.2f per step)", s.aux_tokens,
               static_cast<double>(s.aux_tokens) / static_cast<double>(s.steps)));
  row(f, "accepted", format("%zu tokens", s.accepted));
  row(f, "acceptance rate", format("%.1f%% of drafted tokens", 100.0 * s.acceptance_rate()));
  std::vector<double> const by_depth = acceptance_by_depth(s);
  if (!by_depth.empty()) {
    std::string line;
    for (std::size_t d = 0; d < by_depth.size(); ++d) {
      if (d > 0 && d % 8 == 0) line += "\n                         ";
      line += format("%s%zu: %.0f%%", d % 8 == 0 ? "" : "  ", d + 1, 100.0 * by_depth[d]);
    }
    row(f, "acceptance by depth", line);
  }
  row(f, "mean accepted length",
      format("%.2f tokens per step (accepted + 1)", s.mean_accepted_length()));
  bool const spreads = t != nullptr && (t->runs > 1 || t->warmup > 0);
  auto const spread_row = [&](spread const& sp, char const* what) {
    row(f, "",
        format("%s of %zu runs%s; min-max %.1f-%.1f tokens/s", what, t->runs,
               t->warmup > 0 ? " after a warm-up run" : "", sp.min, sp.max));
  };
  row(f, "throughput",
      format("%.1f tokens/s (%.2f ms in all)", s.tokens_per_second(), 1e3 * s.total_seconds));
  if (spreads) spread_row(t->tokens_per_second, "median");
  double const total = s.total_seconds;
  double const other = total - s.prefill_seconds - s.propose_seconds - s.score_seconds -
                       s.verify_seconds - s.commit_seconds;
  row(f, "time shares",
      format("propose %.1f%%  score %.1f%%  verify %.1f%%  commit %.1f%%",
             detail::percent(s.propose_seconds, total), detail::percent(s.score_seconds, total),
             detail::percent(s.verify_seconds, total), detail::percent(s.commit_seconds, total)));
  row(f, "",
      format("prefill %.1f%% (%.2f ms)  other %.1f%%", detail::percent(s.prefill_seconds, total),
             1e3 * s.prefill_seconds, detail::percent(std::max(other, 0.0), total)));
  if (cmp != nullptr) {
    sd::request_stats const& b = cmp->baseline.result.stats;
    row(f, "baseline",
        format("autoregressive: %zu tokens, %.1f tokens/s (%.2f ms in all)", b.generated,
               b.tokens_per_second(), 1e3 * b.total_seconds));
    if (spreads && t->baseline_tokens_per_second)
      spread_row(*t->baseline_tokens_per_second, "median");
    if (spreads && t->speedup)
      row(f, "speedup",
          format("%.2fx (ratio of the medians; per pair of runs %.2f-%.2fx)", cmp->speedup(s),
                 t->speedup->min, t->speedup->max));
    else
      row(f, "speedup", format("%.2fx", cmp->speedup(s)));
    if (cmp->identical.has_value()) {
      row(f, "outputs identical",
          *cmp->identical
              ? std::string("yes (greedy)")
              : format("NO: first difference at generated token %zu", cmp->first_diff.value_or(0)));
    } else {
      row(f, "outputs identical", "not expected (sampling; both follow the same distribution)");
    }
  }
}

//! A spread as JSON: {"median", "min", "max"}.
inline nlohmann::ordered_json spread_json(spread const& s) {
  nlohmann::ordered_json o;
  o["median"] = s.median;
  o["min"] = s.min;
  o["max"] = s.max;
  return o;
}

//! The "timing" member of --json: the timed runs, the warm-up runs, and the median and spread of
//! each throughput (and of the speedup with --compare).
inline nlohmann::ordered_json timing_json(timing const& t) {
  nlohmann::ordered_json o;
  o["runs"] = t.runs;
  o["warmup_runs"] = t.warmup;
  o["tokens_per_second"] = spread_json(t.tokens_per_second);
  if (t.baseline_tokens_per_second)
    o["baseline_tokens_per_second"] = spread_json(*t.baseline_tokens_per_second);
  if (t.speedup) o["speedup"] = spread_json(*t.speedup);
  return o;
}

//! The "stats" member of --json.
inline nlohmann::ordered_json stats_json(run_output const& run, comparison const* cmp) {
  sd::request_stats const& s = run.result.stats;
  nlohmann::ordered_json o;
  o["prompt_tokens"] = s.prompt_tokens;
  o["generated"] = s.generated;
  o["steps"] = s.steps;
  o["drafted"] = s.drafted;
  o["accepted"] = s.accepted;
  o["aux_tokens"] = s.aux_tokens;
  o["acceptance_rate"] = s.acceptance_rate();
  o["drafted_at_depth"] = s.drafted_at_depth;
  o["accepted_at_depth"] = s.accepted_at_depth;
  o["acceptance_by_depth"] = acceptance_by_depth(s);
  o["mean_accepted_length"] = s.mean_accepted_length();
  o["max_tree_size"] = s.max_tree_size;
  o["tokens_per_second"] = s.tokens_per_second();
  o["prefill_seconds"] = s.prefill_seconds;
  o["propose_seconds"] = s.propose_seconds;
  o["score_seconds"] = s.score_seconds;
  o["verify_seconds"] = s.verify_seconds;
  o["commit_seconds"] = s.commit_seconds;
  o["total_seconds"] = s.total_seconds;
  o["cpu_target"] = sd::to_string(sd::active_cpu_target());
  if (cmp != nullptr) {
    o["baseline_tokens_per_second"] = cmp->baseline.result.stats.tokens_per_second();
    o["baseline_total_seconds"] = cmp->baseline.result.stats.total_seconds;
    o["speedup"] = cmp->speedup(s);
    if (cmp->identical.has_value()) o["outputs_identical"] = *cmp->identical;
  }
  return o;
}

}  // namespace generate
