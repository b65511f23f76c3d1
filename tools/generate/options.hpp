#pragma once
// specdec-generate's command line: the options, their parsing and checking, and the help text.
// Every mistake on the command line (an unknown flag, a missing or malformed value, a value out
// of its domain, a file that does not exist) throws `usage_error`, which main() turns into a
// one-line message and exit status 2.

#include <charconv>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

namespace generate {

//! A command-line mistake; main() prints it on one line and exits with status 2.
class usage_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

//! Everything the command line sets. Defaults are the documented ones (see `help_text`).
struct options {
  std::string model;                     //!< --model: the target (llama2.c or GGUF)
  std::optional<std::string> tokenizer;  //!< --tokenizer: tokenizer.bin or GGUF vocabulary
  std::optional<std::string> draft;      //!< --draft: the draft model (--strategy draft)
  std::string strategy;  //!< --strategy (default: draft with --draft, else prompt-lookup)
  std::optional<std::string> prompt;       //!< --prompt TEXT
  std::optional<std::string> prompt_file;  //!< --prompt-file FILE
  std::size_t max_new_tokens = 128;        //!< -n
  std::size_t k = 4;                       //!< -k: draft length (tree depth for prompt-lookup)
  bool k_given = false;                    //!< whether -k was on the command line
  bool adaptive = false;                   //!< --adaptive: adapt k within [1, k_max]
  std::optional<std::size_t> k_max;        //!< --k-max (default max(8, k))
  float confidence = 0.0f;                 //!< --confidence: draft confidence cutoff
  std::optional<std::vector<std::int32_t>> skip_layers;  //!< --skip-layers (layer-skip)
  std::size_t ngram_max = 3;                             //!< --ngram (prompt-lookup)
  std::size_t ngram_min = 1;                             //!< --ngram-min (prompt-lookup)
  std::size_t branches = 1;                              //!< --branches (prompt-lookup)
  bool lookup_flag_given = false;                        //!< whether a prompt-lookup flag was given
  std::optional<std::string> datastore;                  //!< --datastore (rest)
  std::size_t lookahead_window = 5;                      //!< --lookahead-window W (lookahead)
  std::size_t lookahead_ngram = 4;                       //!< --lookahead-ngram N (lookahead)
  std::size_t lookahead_guesses = 5;                     //!< --lookahead-guesses G (lookahead)
  bool lookahead_flag_given = false;                     //!< whether a lookahead flag was given
  float temperature = 0.0f;                              //!< --temp (0 = greedy)
  std::int32_t top_k = 0;                                //!< --top-k (0 = off)
  float top_p = 1.0f;                                    //!< --top-p (1 = off)
  float min_p = 0.0f;                                    //!< --min-p (0 = off)
  float repetition_penalty = 1.0f;                       //!< --repetition-penalty (1 = off)
  float frequency_penalty = 0.0f;                        //!< --frequency-penalty (0 = off)
  float presence_penalty = 0.0f;                         //!< --presence-penalty (0 = off)
  std::uint64_t seed = 0;                                //!< --seed
  std::size_t threads = 1;                               //!< --threads
  std::size_t context = 0;                               //!< --context (0 = the model's)
  bool ignore_eos = false;                               //!< --ignore-eos
  std::vector<std::string> stops;                        //!< --stop TEXT (repeatable)
  bool compare = false;                                  //!< --compare
  std::size_t repeat = 1;                                //!< --repeat
  bool json = false;                                     //!< --json
  bool help = false;                                     //!< --help
};

//! The strategy names --strategy accepts, in the order --help lists them (kept in step with the
//! table in strategies.hpp by a check there).
inline constexpr std::string_view strategy_names[] = {
    "autoregressive", "draft", "prompt-lookup", "layer-skip", "rest", "lookahead", "jacobi"};

//! The --help text.
inline std::string help_text() {
  return R"(usage: specdec-generate --model PATH [options] (--prompt TEXT | --prompt-file FILE)

Generates text with speculative decoding on the CPU, streams it as tokens are committed, then
prints statistics. Temperature 0 is greedy decoding, verified token by token (the output equals
plain greedy decoding); above 0 the sampler's distribution is verified losslessly (speculative
sampling for a sampled draft chain, the tree verifier for prompt-lookup candidates).

model:
  --model PATH            the target model (llama2.c checkpoint or GGUF)
  --tokenizer PATH        its vocabulary (llama2.c tokenizer.bin or GGUF); default: the GGUF's
                          own, or tokenizer.bin next to a llama2.c model
  --threads N             CPU threads per forward (default 1)
  --context N             positions of the KV caches (default: the model's seq_len)

strategy:
  --strategy NAME         autoregressive | draft | prompt-lookup | layer-skip | rest |
                          lookahead | jacobi (default: draft when --draft is given, else
                          prompt-lookup)
  -k N                    draft length per step; for prompt-lookup the tree depth (default 4)
  --draft PATH            the draft model of --strategy draft (same vocabulary as the target)
  --skip-layers LIST      layers the layer-skip draft skips, e.g. 2 or 1,3 (default: the middle
                          layer)
  --adaptive              draft and layer-skip: adapt k to acceptance, within [1, --k-max]
  --k-max N               largest adaptive k (default max(8, k))
  --confidence P          draft and layer-skip: stop drafting once the draft's top probability
                          falls below P, in [0, 1] (default 0 = off)
  --ngram N               prompt-lookup: longest n-gram matched, 1..16 (default 3)
  --ngram-min N           prompt-lookup: shortest n-gram matched (default 1)
  --branches N            prompt-lookup: continuations merged into a tree (default 1 = chain)
  --datastore PATH        rest: the retrieval datastore (built by specdec-datastore); -k sets
                          the tree depth (default 8; at most 32 nodes)
  --lookahead-window W    lookahead: Jacobi window width, 1..256 (default 5)
  --lookahead-ngram N     lookahead: n-gram size (window levels + 1), 2..16 (default 4)
  --lookahead-guesses G   lookahead: candidate n-grams verified per step, 0..256 (default 5)
                          (jacobi: -k guesses per step, greedy only)

sampling:
  --temp T                temperature, >= 0 (default 0 = greedy)
  --top-k K               keep the K most likely tokens, >= 0 (default 0 = off)
  --top-p P               nucleus mass, in (0, 1] (default 1 = off)
  --min-p P               drop tokens below P x the top probability, in [0, 1] (default 0)
  --repetition-penalty R  > 0 (default 1 = off)
  --frequency-penalty F   (default 0)
  --presence-penalty F    (default 0)
  --seed S                the request's random stream (default 0)

generation:
  --prompt TEXT           the prompt (BOS is prepended)
  --prompt-file FILE      read the prompt from FILE (one trailing newline is dropped)
  -n N                    most tokens to generate (default 128)
  --stop TEXT             stop once the output contains TEXT (repeatable)
  --ignore-eos            do not stop at the end-of-sequence token

output:
  --compare               also run the autoregressive baseline on the same prompt and report the
                          speedup (and, for greedy decoding, whether the outputs are identical)
  --repeat N              run the request (and with --compare the baseline, alternately) N
                          times and report the run of median time of each (default 1); the
                          text shown is the first run's
  --json                  print one JSON object instead of text and table: text, tokens, stats
  -h, --help              this text

Exit status: 0 on success, 2 for a bad command line (unknown flag, missing or bad value, missing
file), 1 when generation fails (a corrupt model, mismatched vocabularies, ...).
)";
}

namespace detail {

//! Parses all of `text` as a T, or throws a usage_error naming `flag`.
template <class T>
T parse_number(std::string_view flag, std::string_view text) {
  T value{};
  auto const [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc{} || end != text.data() + text.size())
    throw usage_error(std::string(flag) + " expects " +
                      (std::is_floating_point_v<T> ? "a number" : "a non-negative integer") +
                      ", got '" + std::string(text) + "'");
  if constexpr (std::is_floating_point_v<T>) {
    if (!std::isfinite(value))
      throw usage_error(std::string(flag) + " expects a finite number, got '" + std::string(text) +
                        "'");
  }
  return value;
}

//! A float flag whose value must lie in [lo, hi] (or (lo, hi] when `open_low`).
inline float parse_in(std::string_view flag, std::string_view text, float lo, float hi,
                      bool open_low, std::string_view domain) {
  float const v = parse_number<float>(flag, text);
  if (v < lo || v > hi || (open_low && v == lo))
    throw usage_error(std::string(flag) + " must be " + std::string(domain) + ", got '" +
                      std::string(text) + "'");
  return v;
}

//! An integer flag whose value must lie in [lo, hi].
inline std::size_t parse_count(std::string_view flag, std::string_view text, std::size_t lo,
                               std::size_t hi) {
  if (!text.empty() && text.front() == '-')
    throw usage_error(std::string(flag) + " must be in [" + std::to_string(lo) + ", " +
                      std::to_string(hi) + "], got '" + std::string(text) + "'");
  auto const v = parse_number<std::size_t>(flag, text);
  if (v < lo || v > hi)
    throw usage_error(std::string(flag) + " must be in [" + std::to_string(lo) + ", " +
                      std::to_string(hi) + "], got '" + std::string(text) + "'");
  return v;
}

//! "2" or "1,3,5": non-negative layer indices separated by commas.
inline std::vector<std::int32_t> parse_layers(std::string_view flag, std::string_view text) {
  std::vector<std::int32_t> layers;
  std::size_t start = 0;
  while (true) {
    std::size_t const comma = text.find(',', start);
    std::string_view const item = text.substr(
        start, comma == std::string_view::npos ? std::string_view::npos : comma - start);
    if (item.empty() || item.front() == '-')
      throw usage_error(std::string(flag) +
                        " expects non-negative layer numbers separated by commas, got '" +
                        std::string(text) + "'");
    layers.push_back(static_cast<std::int32_t>(parse_count(flag, item, 0, 4095)));
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return layers;
}

//! Throws a usage_error unless `path` names an existing regular file.
inline void require_file(std::string_view flag, std::string const& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec))
    throw usage_error(std::string(flag) + ": no such file '" + path + "'");
}

}  // namespace detail

//! Parses argv[1..] (the arguments after the program name). Throws `usage_error` for any mistake;
//! checks that every named file exists. Returns with `help` set as soon as -h/--help is seen.
inline options parse_options(std::span<char const* const> args) {
  options o;
  for (std::size_t i = 0; i < args.size(); ++i) {
    std::string_view const flag = args[i];
    auto const value = [&]() -> std::string_view {
      if (i + 1 >= args.size()) throw usage_error(std::string(flag) + " needs a value");
      return args[++i];
    };
    constexpr float inf = std::numeric_limits<float>::infinity();
    if (flag == "-h" || flag == "--help") {
      o.help = true;
      return o;
    } else if (flag == "--model") {
      o.model = value();
    } else if (flag == "--tokenizer") {
      o.tokenizer = value();
    } else if (flag == "--draft") {
      o.draft = value();
    } else if (flag == "--strategy") {
      o.strategy = value();
      bool known = false;
      for (std::string_view s : strategy_names) known = known || s == o.strategy;
      if (!known)
        throw usage_error("unknown strategy '" + o.strategy +
                          "' (autoregressive, draft, prompt-lookup, layer-skip, rest, "
                          "lookahead, jacobi)");
    } else if (flag == "--prompt") {
      o.prompt = value();
    } else if (flag == "--prompt-file") {
      o.prompt_file = value();
    } else if (flag == "-n") {
      o.max_new_tokens = detail::parse_count(flag, value(), 0, std::size_t{1} << 24);
    } else if (flag == "-k") {
      o.k = detail::parse_count(flag, value(), 1, 4095);
      o.k_given = true;
    } else if (flag == "--adaptive") {
      o.adaptive = true;
    } else if (flag == "--k-max") {
      o.k_max = detail::parse_count(flag, value(), 1, 4095);
    } else if (flag == "--confidence") {
      o.confidence = detail::parse_in(flag, value(), 0.0f, 1.0f, false, "in [0, 1]");
    } else if (flag == "--skip-layers") {
      o.skip_layers = detail::parse_layers(flag, value());
    } else if (flag == "--ngram") {
      o.ngram_max = detail::parse_count(flag, value(), 1, 16);
      o.lookup_flag_given = true;
    } else if (flag == "--ngram-min") {
      o.ngram_min = detail::parse_count(flag, value(), 1, 16);
      o.lookup_flag_given = true;
    } else if (flag == "--branches") {
      o.branches = detail::parse_count(flag, value(), 1, 4095);
      o.lookup_flag_given = true;
    } else if (flag == "--datastore") {
      o.datastore = value();
    } else if (flag == "--lookahead-window") {
      o.lookahead_window = detail::parse_count(flag, value(), 1, 256);
      o.lookahead_flag_given = true;
    } else if (flag == "--lookahead-ngram") {
      o.lookahead_ngram = detail::parse_count(flag, value(), 2, 16);
      o.lookahead_flag_given = true;
    } else if (flag == "--lookahead-guesses") {
      o.lookahead_guesses = detail::parse_count(flag, value(), 0, 256);
      o.lookahead_flag_given = true;
    } else if (flag == "--temp" || flag == "--temperature") {
      o.temperature = detail::parse_in(flag, value(), 0.0f, inf, false, ">= 0");
    } else if (flag == "--top-k") {
      o.top_k = static_cast<std::int32_t>(
          detail::parse_count(flag, value(), 0, std::numeric_limits<std::int32_t>::max()));
    } else if (flag == "--top-p") {
      o.top_p = detail::parse_in(flag, value(), 0.0f, 1.0f, true, "in (0, 1]");
    } else if (flag == "--min-p") {
      o.min_p = detail::parse_in(flag, value(), 0.0f, 1.0f, false, "in [0, 1]");
    } else if (flag == "--repetition-penalty") {
      o.repetition_penalty = detail::parse_in(flag, value(), 0.0f, inf, true, "> 0");
    } else if (flag == "--frequency-penalty") {
      o.frequency_penalty = detail::parse_number<float>(flag, value());
    } else if (flag == "--presence-penalty") {
      o.presence_penalty = detail::parse_number<float>(flag, value());
    } else if (flag == "--seed") {
      std::string_view const v = value();
      if (!v.empty() && v.front() == '-')
        throw usage_error("--seed expects a non-negative integer, got '" + std::string(v) + "'");
      o.seed = detail::parse_number<std::uint64_t>(flag, v);
    } else if (flag == "--threads") {
      o.threads = detail::parse_count(flag, value(), 1, 1024);
    } else if (flag == "--context") {
      o.context = detail::parse_count(flag, value(), 1, std::size_t{1} << 24);
    } else if (flag == "--ignore-eos") {
      o.ignore_eos = true;
    } else if (flag == "--stop") {
      std::string_view const v = value();
      if (v.empty()) throw usage_error("--stop needs a non-empty text");
      o.stops.emplace_back(v);
    } else if (flag == "--compare") {
      o.compare = true;
    } else if (flag == "--repeat") {
      o.repeat = detail::parse_count(flag, value(), 1, 1000);
    } else if (flag == "--json") {
      o.json = true;
    } else {
      throw usage_error("unknown option '" + std::string(flag) + "'");
    }
  }

  if (o.strategy.empty()) o.strategy = o.draft ? "draft" : "prompt-lookup";
  if (o.model.empty()) throw usage_error("no model (--model PATH)");
  if (o.prompt.has_value() == o.prompt_file.has_value())
    throw usage_error(o.prompt ? "give --prompt or --prompt-file, not both"
                               : "no prompt (--prompt TEXT or --prompt-file FILE)");
  if (o.strategy == "draft" && !o.draft)
    throw usage_error("--strategy draft needs a draft model (--draft PATH)");
  if (o.strategy != "draft" && o.draft)
    throw usage_error("--draft applies to --strategy draft only");
  if (o.strategy != "layer-skip" && o.skip_layers)
    throw usage_error("--skip-layers applies to --strategy layer-skip only");
  if (o.strategy != "prompt-lookup" && o.lookup_flag_given)
    throw usage_error("--ngram, --ngram-min and --branches apply to --strategy prompt-lookup only");
  if (o.strategy == "rest" && !o.datastore)
    throw usage_error(
        "--strategy rest needs a datastore (--datastore PATH; see specdec-datastore)");
  if (o.strategy != "rest" && o.datastore)
    throw usage_error("--datastore applies to --strategy rest only");
  if (o.strategy != "lookahead" && o.lookahead_flag_given)
    throw usage_error(
        "--lookahead-window, --lookahead-ngram and --lookahead-guesses apply to --strategy "
        "lookahead only");
  if (o.strategy == "jacobi" && o.temperature > 0.0f)
    throw usage_error("--strategy jacobi is greedy decoding only (--temp 0)");
  if (o.ngram_min > o.ngram_max)
    throw usage_error("--ngram-min " + std::to_string(o.ngram_min) + " exceeds --ngram " +
                      std::to_string(o.ngram_max));
  bool const chain_model = o.strategy == "draft" || o.strategy == "layer-skip";
  if (!chain_model && (o.adaptive || o.k_max || o.confidence > 0.0f))
    throw usage_error(
        "--adaptive, --k-max and --confidence apply to --strategy draft and "
        "layer-skip only");
  if (o.k_max && !o.adaptive) throw usage_error("--k-max needs --adaptive");
  if (o.k_max && *o.k_max < o.k)
    throw usage_error("--k-max " + std::to_string(*o.k_max) + " is below -k " +
                      std::to_string(o.k));
  if (o.strategy == "prompt-lookup" && o.k * o.branches >= 4096)
    throw usage_error("-k x --branches must stay below 4096 draft nodes");

  detail::require_file("--model", o.model);
  if (o.tokenizer) detail::require_file("--tokenizer", *o.tokenizer);
  if (o.draft) detail::require_file("--draft", *o.draft);
  if (o.datastore) detail::require_file("--datastore", *o.datastore);
  if (o.prompt_file) detail::require_file("--prompt-file", *o.prompt_file);
  return o;
}

}  // namespace generate
