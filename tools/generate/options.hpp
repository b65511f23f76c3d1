#pragma once
// specdec-generate's command line: the general options (model, sampling, generation, output), the
// parsing of them and of the strategies' own options (strategies.hpp) with CLI11, the checks, and
// the --help text. Every option is declared once (an `option_spec`); the parser, the checks and
// --help read the declarations.
//
// The rules, in the order they are checked (each mistake throws `usage_error`: exit status 2):
// 1. an unknown option, a missing value, an option other than --stop given twice;
// 2. an unknown --strategy; an option of another strategy than the chosen one;
// 3. a value that is not a number or lies outside its domain;
// 4. no model; no prompt or two; a required option of the strategy missing; --temp > 0 with a
//    greedy-only strategy; an option that applies to sampling only (`sampling_only`: --top-k,
//    --top-p, --min-p, --seed; --verifier typical) at --temp 0, where it cannot change the output
//    (the penalties do change greedy decoding and apply at any temperature); an option that needs
//    another (`check_general`: --repeat-last-n a penalty, --logprobs JSON output, --report-step
//    --report, the typical verifier's parameters --verifier typical, --json-whitespace
//    --json-schema, --no-forced-spans a constraint; --json and --stream-json exclude each other,
//    and so do --regex and --json-schema, and a constraint and --ignore-eos); the strategy's own
//    checks;
// 5. a file that does not exist.

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <iterator>
#include <limits>
#include <map>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "cli.hpp"
#include "generate/option.hpp"
#include "generate/strategies.hpp"
#include "specdec/core/cpu_target.hpp"

namespace generate {

//! The general options (those of every strategy).
namespace opt {

inline constexpr option_spec model{.flag = "--model",
                                   .value_name = "PATH",
                                   .kind = value_kind::file,
                                   .help = "the target model (llama2.c checkpoint or GGUF)",
                                   .required = true};
inline constexpr option_spec tokenizer{
    .flag = "--tokenizer",
    .value_name = "PATH",
    .kind = value_kind::file,
    .help = "its vocabulary (llama2.c tokenizer.bin or GGUF)",
    .default_text = "the GGUF's own, or tokenizer.bin next to a llama2.c model"};
inline constexpr option_spec threads{.flag = "--threads",
                                     .value_name = "N",
                                     .kind = value_kind::count,
                                     .help = "CPU threads per forward",
                                     .count_lo = 1,
                                     .count_hi = 1024,
                                     .count_default = 1};
inline constexpr option_spec context{.flag = "--context",
                                     .value_name = "N",
                                     .kind = value_kind::count,
                                     .help = "positions of the KV caches",
                                     .default_text = "the model's seq_len",
                                     .count_lo = 1,
                                     .count_hi = std::uint64_t{1} << 24};
inline constexpr option_spec device{
    .flag = "--device",
    .value_name = "NAME",
    .kind = value_kind::text,
    .help =
        "where the models run: 'cpu', or 'cuda' (the current CUDA device; needs a build with "
        "CUDA)",
    .default_text = "cpu"};
inline constexpr option_spec dtype{
    .flag = "--dtype",
    .value_name = "TYPE",
    .kind = value_kind::text,
    .help =
        "the models' matrices on the device: 'f32', 'f16' or 'bf16' (products accumulate in "
        "f32; f16 and bf16 need --device cuda)",
    .default_text = "f32"};
inline constexpr option_spec cpu_target{
    .flag = "--cpu-target",
    .value_name = "NAME",
    .kind = value_kind::text,
    .help =
        "the instruction set of the CPU kernels: 'baseline' (the build's flags), 'avx2' or "
        "'avx512' (the build and the CPU must have it)",
    .default_text = "SPECDEC_CPU_TARGET, else the best this CPU and build have"};
// --no-mmap (`no_mmap`) is declared with the strategies (generate/strategies.hpp), which read
// their head and datastore files as it says.
inline constexpr option_spec strategy{.flag = "--strategy",
                                      .value_name = "NAME",
                                      .kind = value_kind::text,
                                      .help = "one of the strategies below"};

inline constexpr option_spec temperature{.flag = "--temp",
                                         .alias = "--temperature",
                                         .value_name = "T",
                                         .kind = value_kind::real,
                                         .help = "temperature (0 = greedy decoding)",
                                         .real_lo = 0.0f,
                                         .real_default = 0.0f};
inline constexpr option_spec top_k{.flag = "--top-k",
                                   .value_name = "K",
                                   .kind = value_kind::count,
                                   .help = "keep the K most likely tokens (0 = off)",
                                   .count_lo = 0,
                                   .count_hi = std::numeric_limits<std::int32_t>::max(),
                                   .count_default = 0,
                                   .sampling_only = true};
inline constexpr option_spec top_p{.flag = "--top-p",
                                   .value_name = "P",
                                   .kind = value_kind::real,
                                   .help = "keep the most likely tokens up to mass P (1 = off)",
                                   .real_lo = 0.0f,
                                   .real_hi = 1.0f,
                                   .open_low = true,
                                   .real_default = 1.0f,
                                   .sampling_only = true};
inline constexpr option_spec min_p{.flag = "--min-p",
                                   .value_name = "P",
                                   .kind = value_kind::real,
                                   .help = "drop tokens below P x the top probability (0 = off)",
                                   .real_lo = 0.0f,
                                   .real_hi = 1.0f,
                                   .real_default = 0.0f,
                                   .sampling_only = true};
inline constexpr option_spec repetition_penalty{
    .flag = "--repetition-penalty",
    .value_name = "R",
    .kind = value_kind::real,
    .help =
        "divides the positive logits of tokens in the history by R, multiplies the negative "
        "ones (1 = off)",
    .real_lo = 0.0f,
    .open_low = true,
    .real_default = 1.0f};
inline constexpr option_spec frequency_penalty{
    .flag = "--frequency-penalty",
    .value_name = "F",
    .kind = value_kind::real,
    .help = "subtracted from a token's logit once per occurrence in the history (0 = off)",
    .real_default = 0.0f};
inline constexpr option_spec presence_penalty{
    .flag = "--presence-penalty",
    .value_name = "F",
    .kind = value_kind::real,
    .help = "subtracted from the logit of every token present in the history (0 = off)",
    .real_default = 0.0f};
inline constexpr option_spec repeat_last_n{
    .flag = "--repeat-last-n",
    .value_name = "N",
    .kind = value_kind::count,
    .help = "the penalties count only the last N tokens (0 = the whole history); needs a penalty",
    .count_lo = 0,
    .count_hi = std::uint64_t{1} << 24,
    .count_default = 0};
inline constexpr option_spec verifier{
    .flag = "--verifier",
    .value_name = "NAME",
    .kind = value_kind::text,
    .help =
        "'auto' (lossless: the verifier the strategy and temperature call for) or 'typical' "
        "(Medusa's typical acceptance: lossy, longer accepted paths)",
    .default_text = "auto"};
inline constexpr option_spec typical_epsilon{
    .flag = "--typical-epsilon",
    .value_name = "E",
    .kind = value_kind::real,
    .help = "typical acceptance: accept p(x) > min(E, D exp(-H(p))); needs --verifier typical",
    .real_lo = 0.0f,
    .real_hi = 1.0f,
    .open_high = true,
    .real_default = 0.09f};
inline constexpr option_spec typical_delta{
    .flag = "--typical-delta",
    .value_name = "D",
    .kind = value_kind::real,
    .help = "typical acceptance: the entropy-scaled threshold D; needs --verifier typical",
    .real_lo = 0.0f,
    .real_default = 0.3f};
inline constexpr option_spec seed{.flag = "--seed",
                                  .value_name = "S",
                                  .kind = value_kind::count,
                                  .help = "the request's random stream",
                                  .count_default = 0,
                                  .sampling_only = true};

inline constexpr option_spec prompt{.flag = "--prompt",
                                    .value_name = "TEXT",
                                    .kind = value_kind::text,
                                    .help = "the prompt (BOS is prepended)"};
inline constexpr option_spec prompt_file{
    .flag = "--prompt-file",
    .value_name = "FILE",
    .kind = value_kind::file,
    .help = "read the prompt from FILE (one trailing newline is dropped)"};
inline constexpr option_spec max_new_tokens{.flag = "-n",
                                            .value_name = "N",
                                            .kind = value_kind::count,
                                            .help = "most tokens to generate",
                                            .count_lo = 0,
                                            .count_hi = std::uint64_t{1} << 24,
                                            .count_default = 128};
inline constexpr option_spec stop{.flag = "--stop",
                                  .value_name = "TEXT",
                                  .kind = value_kind::text,
                                  .help = "stop once the output contains TEXT",
                                  .repeatable = true,
                                  .non_empty = true};
inline constexpr option_spec ignore_eos{
    .flag = "--ignore-eos",
    .help =
        "do not stop at the model's end-of-text tokens (llama2.c models: BOS and EOS; GGUF: EOS, "
        "end of turn, end of message)"};

inline constexpr option_spec regex{
    .flag = "--regex",
    .value_name = "PATTERN",
    .kind = value_kind::text,
    .help =
        "constrain the output to match PATTERN in full (a subset of ECMAScript: no "
        "backreferences, lookaround or word boundaries); it ends at an end-of-text token once "
        "complete",
    .non_empty = true};
inline constexpr option_spec json_schema{
    .flag = "--json-schema",
    .value_name = "FILE",
    .kind = value_kind::file,
    .help =
        "constrain the output to a JSON value that the JSON Schema in FILE accepts; it ends at "
        "an end-of-text token once complete"};
inline constexpr option_spec json_whitespace{
    .flag = "--json-whitespace",
    .value_name = "NAME",
    .kind = value_kind::text,
    .help =
        "the layout --json-schema allows: 'compact' (no whitespace), 'spaced' (a space after "
        "each comma and colon, as Python's json.dumps) or 'flexible' (up to 2 spaces, tabs or "
        "newlines around every structural character)",
    .default_text = "spaced"};
inline constexpr option_spec no_forced_spans{
    .flag = "--no-forced-spans",
    .help =
        "with --regex or --json-schema: never draft the text the constraint forces (keys, "
        "punctuation, literal parts) in place of the strategy's own draft"};

inline constexpr option_spec compare{
    .flag = "--compare",
    .help =
        "also run the autoregressive baseline on the same prompt and report the speedup "
        "(and, for greedy decoding, whether the outputs are identical)"};
inline constexpr option_spec repeat{
    .flag = "--repeat",
    .value_name = "N",
    .kind = value_kind::count,
    .help =
        "time N runs of the request (with --compare, N of the baseline too, alternately), after "
        "one warm-up run of each, and report the median and the spread (min-max) of each; "
        "the text shown is the warm-up run's",
    .count_lo = 1,
    .count_hi = 1000,
    .count_default = 1};
inline constexpr option_spec verbose{
    .flag = "--verbose",
    .help =
        "print the set-up to stderr before generating: the CPU target of the kernels (and the "
        "targets compiled and supported), the threads, the device"};
inline constexpr option_spec json{
    .flag = "--json",
    .help = "print one JSON object instead of text and table: text, tokens, stats"};
inline constexpr option_spec stream_json{
    .flag = "--stream-json",
    .help =
        "print one JSON line per committed token (its step, its depth in the draft, drafted "
        "or bonus) as it is committed, then one line with what --json prints"};
inline constexpr option_spec logprobs{
    .flag = "--logprobs",
    .value_name = "N",
    .kind = value_kind::count,
    .help =
        "with --json or --stream-json: each generated token's log-probability under the "
        "target's logits, and the N most likely tokens of its row",
    .count_lo = 0,
    .count_hi = 64,
    .count_default = 0};
inline constexpr option_spec report{
    .flag = "--report",
    .value_name = "FILE",
    .kind = value_kind::text,
    .help =
        "write a picture of the run to FILE.svg or FILE.html (self-contained): acceptance by "
        "depth, tokens per step, the draft tree of one step",
    .non_empty = true};
inline constexpr option_spec report_step{
    .flag = "--report-step",
    .value_name = "N",
    .kind = value_kind::count,
    .help = "the step whose draft tree --report draws (0 = the first)",
    .default_text = "the step with the longest accepted path, then the largest tree"};

inline constexpr option_spec prompts{
    .flag = "--prompts",
    .value_name = "FILE",
    .kind = value_kind::file,
    .help =
        "serve every prompt of a JSON Lines file (each line's \"prompt\", else the first of its "
        "\"turns\") as concurrent requests, streaming each one's text after its line number; "
        "request i (line L) has seed --seed + L"};
inline constexpr option_spec batch{.flag = "--batch",
                                   .value_name = "N",
                                   .kind = value_kind::count,
                                   .help = "requests decoded at once (needs --prompts)",
                                   .count_lo = 1,
                                   .count_hi = 1024,
                                   .count_default = 8};
inline constexpr option_spec speculate{
    .flag = "--speculate",
    .value_name = "POLICY",
    .kind = value_kind::text,
    .help =
        "draft lengths: 'full' (each step drafts the proposer's whole budget) or 'adaptive' (per "
        "step, the lengths that maximise committed tokens per second, from the target's forward "
        "cost measured at start-up and each request's acceptance; none where speculation "
        "cannot pay)",
    .default_text = "full"};

}  // namespace opt

//! A titled group of general options, as --help shows them.
struct option_group {
  std::string_view title = {};                       //!< "model:", ...
  std::span<option_spec const* const> options = {};  //!< in --help order
  std::string_view note = {};                        //!< a line after the options, or empty
};

//! The general options by group.
namespace general_options {
inline constexpr option_spec const* model[] = {&opt::model,      &opt::tokenizer, &opt::device,
                                               &opt::dtype,      &opt::threads,   &opt::context,
                                               &opt::cpu_target, &opt::no_mmap};
inline constexpr option_spec const* sampling[] = {&opt::temperature,
                                                  &opt::top_k,
                                                  &opt::top_p,
                                                  &opt::min_p,
                                                  &opt::repetition_penalty,
                                                  &opt::frequency_penalty,
                                                  &opt::presence_penalty,
                                                  &opt::repeat_last_n,
                                                  &opt::seed,
                                                  &opt::verifier,
                                                  &opt::typical_epsilon,
                                                  &opt::typical_delta};
inline constexpr option_spec const* generation[] = {
    &opt::prompt, &opt::prompt_file, &opt::max_new_tokens, &opt::stop, &opt::ignore_eos};
inline constexpr option_spec const* constraint[] = {&opt::regex, &opt::json_schema,
                                                    &opt::json_whitespace, &opt::no_forced_spans};
inline constexpr option_spec const* output[] = {&opt::compare,     &opt::repeat,   &opt::json,
                                                &opt::stream_json, &opt::logprobs, &opt::report,
                                                &opt::report_step, &opt::verbose};
inline constexpr option_spec const* serving[] = {&opt::prompts, &opt::batch, &opt::speculate};
}  // namespace general_options

//! The general options' groups, in --help order (the strategy group, --strategy and the
//! strategies' options, comes after the first).
inline constexpr option_group general_groups[] = {
    {"model:", general_options::model, {}},
    {"sampling:", general_options::sampling,
     "at --temp 0 decoding is greedy: the options marked 'needs --temp > 0' cannot change the "
     "output there and are refused; the penalties change greedy decoding too"},
    {"generation:", general_options::generation, {}},
    {"constrained output:", general_options::constraint,
     "every strategy decodes under the constraint (each row's distribution masked to the tokens "
     "it allows; verification stays exact); not with --ignore-eos; the statistics say whether "
     "the output is valid (complete)"},
    {"output:", general_options::output, {}},
    {"serving (many prompts as concurrent requests):", general_options::serving,
     "with --prompts: --json prints one object per request (as each ends) and a total; "
     "--compare, --repeat, --stream-json, --logprobs and --report do not apply"}};

//! The strategy when --strategy is not given and no strategy's required options are.
inline constexpr std::string_view fallback_strategy = "prompt-lookup";

//! A parsed and checked command line.
struct command_line {
  option_values values;                        //!< every option given, parsed and checked
  generate::strategy const* chosen = nullptr;  //!< the strategy
  bool help = false;                           //!< -h/--help: nothing else was checked
};

//! Every option, general ones first, then the strategies' (a flag declared by several strategies
//! appears once per declaration).
inline std::vector<option_spec const*> all_options() {
  std::vector<option_spec const*> all;
  for (option_group const& g : general_groups)
    all.insert(all.end(), g.options.begin(), g.options.end());
  all.push_back(&opt::strategy);
  for (generate::strategy const& s : strategies)
    all.insert(all.end(), s.options.begin(), s.options.end());
  return all;
}

//! The default strategy: of those whose required options are all given (draft with --draft, pard
//! with --draft and --mask-token, rest with --datastore), the one that requires the most, the
//! first on a tie; else `fallback_strategy`.
inline generate::strategy const& default_strategy(
    std::map<std::string_view, std::vector<std::string>> const& raw) {
  generate::strategy const* best = nullptr;
  std::size_t best_count = 0;
  for (generate::strategy const& s : strategies) {
    std::size_t count = 0;
    bool all = true;
    for (option_spec const* o : s.options) {
      if (!o->required) continue;
      ++count;
      all = all && raw.contains(o->flag);
    }
    if (count > 0 && all && count > best_count) {
      best = &s;
      best_count = count;
    }
  }
  return best != nullptr ? *best : *find_strategy(fallback_strategy);
}

//! "draft with --draft, rest with --datastore, else prompt-lookup": the default strategy in words.
inline std::string default_strategy_text() {
  std::string text;
  std::vector<std::string> listed;  // required options already named (the first strategy wins)
  for (generate::strategy const& s : strategies) {
    std::string required;
    for (option_spec const* o : s.options)
      if (o->required) required += (required.empty() ? "" : " and ") + std::string(o->flag);
    if (required.empty() || std::find(listed.begin(), listed.end(), required) != listed.end())
      continue;
    listed.push_back(required);
    text += std::string(s.name) + " with " + required + ", ";
  }
  return text + "else " + std::string(fallback_strategy);
}

//! "draft and layer-skip": the strategies that declare an option named `flag`.
inline std::string strategies_with(std::string_view flag) {
  std::vector<std::string_view> names;
  for (generate::strategy const& s : strategies)
    if (find_option(s, flag) != nullptr) names.push_back(s.name);
  std::string text;
  for (std::size_t i = 0; i < names.size(); ++i) {
    if (i > 0) text += i + 1 == names.size() ? " and " : ", ";
    text += names[i];
  }
  return text;
}

//! The --help text.
inline std::string help_text() {
  std::string out =
      "usage: specdec-generate --model PATH [options] (--prompt TEXT | --prompt-file FILE | "
      "--prompts FILE)\n"
      "\n"
      "Generates text with speculative decoding on the CPU, streams it as tokens are committed, "
      "then\n"
      "prints statistics. Temperature 0 is greedy decoding, verified token by token (the output "
      "equals\n"
      "plain greedy decoding); above 0 the sampler's distribution is verified losslessly "
      "(speculative\n"
      "sampling for a sampled draft chain, the tree verifier for deterministic candidates).\n";
  auto const group = [&](option_group const& g) {
    out += "\n" + std::string(g.title) + "\n";
    for (option_spec const* o : g.options) out += help_lines(*o);
    if (!g.note.empty()) out += help_row("", std::string(g.note));
  };
  group(general_groups[0]);

  out += "\nstrategy:\n";
  out += help_row("  --strategy NAME",
                  std::string(opt::strategy.help) + " (default: " + default_strategy_text() + ")");
  out += help_row("",
                  "the options under a strategy are refused with any other; each strategy's "
                  "proposer sets how many draft nodes a step scores");
  for (generate::strategy const& s : strategies) {
    out += help_row("  " + std::string(s.name),
                    std::string(s.help) + (s.greedy_only ? " (greedy only: --temp 0)" : ""));
    for (option_spec const* o : s.options) out += help_lines(*o, 4);
  }

  for (std::size_t g = 1; g < std::size(general_groups); ++g) group(general_groups[g]);
  out += help_row("  -h, --help", "this text");
  out +=
      "\nExit status: 0 on success, 2 for a bad command line (unknown or repeated option, missing "
      "or bad\nvalue, an option of another strategy, missing file), 1 when generation fails (a "
      "corrupt model,\nmismatched vocabularies, ...).\n";
  return out;
}

//! The rules between general options, each an option that would otherwise do nothing or
//! contradict another: refused, naming what it needs.
inline void check_general(std::map<std::string_view, std::vector<std::string>> const& raw,
                          option_values const& v, generate::strategy const& chosen) {
  auto const given = [&](option_spec const& o) { return raw.contains(o.flag); };
  std::string const device = v.text(opt::device).value_or("cpu");
  if (device != "cpu" && device != "cuda")
    throw usage_error("unknown device '" + device + "' (cpu, cuda)");
  std::string const dtype = v.text(opt::dtype).value_or("f32");
  if (!specdec::parse_weight_dtype(dtype))
    throw usage_error("unknown dtype '" + dtype + "' (f32, f16, bf16)");
  if (dtype != "f32" && device != "cuda")
    throw usage_error("--dtype " + dtype +
                      " needs --device cuda (the CPU backend computes in float32)");
  if (auto const target = v.text(opt::cpu_target)) {
    specdec::cpu_target t{};
    try {
      t = specdec::parse_cpu_target(*target);
    } catch (specdec::error const&) {
      throw usage_error("unknown CPU target '" + *target + "' (baseline, avx2, avx512)");
    }
    if (!specdec::cpu_target_compiled(t))
      throw usage_error("--cpu-target " + *target +
                        " is not compiled in this build (its flags fix the target)");
    if (!specdec::cpu_target_supported(t))
      throw usage_error("--cpu-target " + *target + ": this CPU cannot run it");
  }
  if (given(opt::json) && given(opt::stream_json))
    throw usage_error("give --json or --stream-json, not both");
  if (given(opt::logprobs) && !given(opt::json) && !given(opt::stream_json))
    throw usage_error("--logprobs applies to --json and --stream-json output only");
  bool const penalties = v.real(opt::repetition_penalty) != 1.0f ||
                         v.real(opt::frequency_penalty) != 0.0f ||
                         v.real(opt::presence_penalty) != 0.0f;
  if (given(opt::repeat_last_n) && !penalties)
    throw usage_error(
        "--repeat-last-n applies to the penalties only: give --repetition-penalty, "
        "--frequency-penalty or --presence-penalty");
  std::string const verifier = v.text(opt::verifier).value_or("auto");
  if (verifier != "auto" && verifier != "typical")
    throw usage_error("unknown verifier '" + verifier + "' (auto, typical)");
  if (verifier == "typical" && v.real(opt::temperature) == 0.0f)
    throw usage_error(
        "--verifier typical applies to sampling only (--temp > 0): at --temp 0 it accepts "
        "what greedy verification accepts");
  if (verifier == "typical" && chosen.name == "autoregressive")
    throw usage_error("--verifier applies to speculative strategies only (not autoregressive)");
  for (option_spec const* o : {&opt::typical_epsilon, &opt::typical_delta})
    if (given(*o) && verifier != "typical")
      throw usage_error(std::string(o->flag) + " applies to --verifier typical only");
  if (given(opt::regex) && given(opt::json_schema))
    throw usage_error("give --regex or --json-schema, not both");
  bool const constrained = given(opt::regex) || given(opt::json_schema);
  if (given(opt::json_whitespace)) {
    if (!given(opt::json_schema))
      throw usage_error("--json-whitespace applies to --json-schema only");
    std::string const layout = *v.text(opt::json_whitespace);
    if (layout != "compact" && layout != "spaced" && layout != "flexible")
      throw usage_error("unknown --json-whitespace '" + layout + "' (compact, spaced, flexible)");
  }
  if (given(opt::no_forced_spans) && !constrained)
    throw usage_error("--no-forced-spans applies to --regex and --json-schema only");
  if (given(opt::ignore_eos) && constrained)
    throw usage_error(
        std::string(given(opt::regex) ? "--regex" : "--json-schema") +
        " ends the output at an end-of-text token once it is complete: --ignore-eos cannot "
        "apply");
  if (given(opt::report_step) && !given(opt::report))
    throw usage_error("--report-step applies to --report only");
  if (given(opt::prompts)) {
    for (option_spec const* o :
         {&opt::compare, &opt::repeat, &opt::stream_json, &opt::logprobs, &opt::report})
      if (given(*o))
        throw usage_error(std::string(o->flag) + " does not apply to --prompts (batched serving)");
    if (given(opt::adaptive))
      throw usage_error(
          "--adaptive does not apply to --prompts: --speculate adaptive chooses each request's "
          "draft length per step");
  } else {
    if (given(opt::batch)) throw usage_error("--batch applies to --prompts only");
  }
  std::string const speculate = v.text(opt::speculate).value_or("full");
  if (speculate != "full" && speculate != "adaptive")
    throw usage_error("unknown --speculate policy '" + speculate + "' (full, adaptive)");
  if (auto const file = v.text(opt::report)) {
    auto const ext = std::filesystem::path(*file).extension();
    if (ext != ".svg" && ext != ".html")
      throw usage_error("--report: '" + *file + "' must end in .svg or .html");
  }
}

//! Parses and checks argv (program name first), in the order of the file comment. Returns with
//! `help` set, and nothing else checked, when -h/--help is given.
inline command_line parse_command_line(int argc, char const* const* argv) {
  std::vector<option_spec const*> const all = all_options();
  // One CLI11 option per flag; every occurrence's value is kept, to refuse repeats ourselves.
  CLI::App app("specdec-generate");
  std::map<std::string_view, std::vector<std::string>> raw;
  std::map<std::string_view, CLI::Option*> cli;
  std::map<std::string_view, option_spec const*> first;
  for (option_spec const* o : all) {
    auto const [it, added] = first.try_emplace(o->flag, o);
    if (!added) {
      if ((it->second->kind == value_kind::flag) != (o->kind == value_kind::flag))
        throw std::logic_error("specdec-generate: option " + std::string(o->flag) +
                               " is declared both with and without a value");
      continue;
    }
    std::string names(o->flag);
    if (!o->alias.empty()) names += "," + std::string(o->alias);
    if (o->kind == value_kind::flag)
      cli[o->flag] = app.add_flag(names);
    else
      cli[o->flag] = app.add_option(names, raw[o->flag])->allow_extra_args(false);
  }
  command_line cmd;
  try {
    app.parse(argc, argv);
  } catch (CLI::CallForHelp const&) {
    cmd.help = true;
    return cmd;
  } catch (CLI::ParseError const& e) {
    specdec_cli::rethrow(e, app);
  }
  // Flags given: their count, for the repeat check and the lookups below.
  for (auto const& [flag, option] : cli)
    if (first.at(flag)->kind == value_kind::flag && option->count() > 0)
      raw[flag] = std::vector<std::string>(option->count());
  std::erase_if(raw, [](auto const& entry) { return entry.second.empty(); });

  // 1. Repeats.
  for (auto const& [flag, values] : raw)
    if (values.size() > 1 && !first.at(flag)->repeatable)
      throw usage_error(std::string(flag) + " is given more than once");

  // 2. The strategy, and the options it does not declare.
  if (raw.contains(opt::strategy.flag)) {
    std::string const& name = raw.at(opt::strategy.flag).front();
    cmd.chosen = find_strategy(name);
    if (cmd.chosen == nullptr) {
      std::string names;
      for (generate::strategy const& s : strategies)
        names += (names.empty() ? "" : ", ") + std::string(s.name);
      throw usage_error("unknown strategy '" + name + "' (" + names + ")");
    }
  } else {
    cmd.chosen = &default_strategy(raw);
  }
  generate::strategy const& chosen = *cmd.chosen;
  std::vector<option_spec const*> specs;  // what applies: general options, the strategy's
  for (option_group const& g : general_groups)
    specs.insert(specs.end(), g.options.begin(), g.options.end());
  specs.push_back(&opt::strategy);
  specs.insert(specs.end(), chosen.options.begin(), chosen.options.end());
  for (option_spec const* o : all) {
    if (!raw.contains(o->flag)) continue;
    bool applies = false;
    for (option_spec const* s : specs) applies = applies || s->flag == o->flag;
    if (!applies)
      throw usage_error(std::string(o->flag) + " applies to --strategy " +
                        strategies_with(o->flag) + " only (not " + std::string(chosen.name) + ")");
  }

  // 3. The values (files are checked last).
  for (option_spec const* o : specs)
    if (raw.contains(o->flag) && o->kind != value_kind::file)
      cmd.values.set(*o, parse_value(*o, raw.at(o->flag)));

  // 4. What is missing, and the rules between options.
  option_values const& v = cmd.values;
  if (!raw.contains(opt::model.flag)) throw usage_error("no model (--model PATH)");
  std::size_t const prompt_sources = (raw.contains(opt::prompt.flag) ? 1 : 0) +
                                     (raw.contains(opt::prompt_file.flag) ? 1 : 0) +
                                     (raw.contains(opt::prompts.flag) ? 1 : 0);
  if (prompt_sources == 0)
    throw usage_error("no prompt (--prompt TEXT, --prompt-file FILE or --prompts FILE)");
  if (prompt_sources > 1)
    throw usage_error(raw.contains(opt::prompts.flag)
                          ? "give --prompts or a single prompt (--prompt, --prompt-file), not both"
                          : "give --prompt or --prompt-file, not both");
  for (option_spec const* o : chosen.options)
    if (o->required && !raw.contains(o->flag))
      throw usage_error("--strategy " + std::string(chosen.name) + " needs " +
                        std::string(o->flag) + " " + std::string(o->value_name) + ": " +
                        std::string(o->help));
  bool const greedy = v.real(opt::temperature) == 0.0f;
  if (chosen.greedy_only && !greedy)
    throw usage_error("--strategy " + std::string(chosen.name) +
                      " is greedy decoding only (--temp 0)");
  if (greedy)
    for (option_spec const* o : specs)
      if (o->sampling_only && raw.contains(o->flag))
        throw usage_error(std::string(o->flag) +
                          " applies to sampling only (--temp > 0): at --temp 0 decoding is "
                          "greedy and it cannot change the output");
  check_general(raw, v, chosen);
  if (chosen.check != nullptr) chosen.check(v);

  // 5. Files.
  for (option_spec const* o : specs)
    if (raw.contains(o->flag) && o->kind == value_kind::file)
      cmd.values.set(*o, parse_value(*o, raw.at(o->flag)));
  return cmd;
}

}  // namespace generate
