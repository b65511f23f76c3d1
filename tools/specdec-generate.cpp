// specdec-generate: speculative generation on the CPU with a choice of strategy (autoregressive,
// draft model, prompt lookup, layer skip), streaming the text as tokens are committed, then a
// statistics table; --compare adds the autoregressive baseline and the speedup, --json prints one
// JSON object instead. See docs/generate.md and --help.
//
// Exit status: 0 on success; 2 for a bad command line (tools/generate/options.hpp); 1 for a
// failure at run time (a specdec::error or any other exception), each with a one-line message on
// stderr.

#include <chrono>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "generate/json.hpp"
#include "generate/options.hpp"
#include "generate/report.hpp"
#include "generate/strategies.hpp"
#include "specdec/backend/cpu/llama.hpp"
#include "specdec/core/error.hpp"
#include "specdec/model/load.hpp"
#include "specdec/model/tokenizer.hpp"
#include "specdec/sampling/policy.hpp"

namespace {

namespace sd = specdec;
using namespace generate;

//! `message` on one line (newlines become spaces).
std::string one_line(std::string message) {
  for (char& c : message)
    if (c == '\n' || c == '\r') c = ' ';
  return message;
}

//! Reads `path` whole, dropping one trailing newline ("\n" or "\r\n").
std::string read_prompt_file(std::string const& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw usage_error("--prompt-file: cannot read '" + path + "'");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (!text.empty() && text.back() == '\n') text.pop_back();
  if (!text.empty() && text.back() == '\r') text.pop_back();
  return text;
}

//! The vocabulary: --tokenizer, else the GGUF's own or tokenizer.bin beside a llama2.c model (a
//! missing one is a command-line mistake).
sd::tokenizer load_vocabulary(options const& o) {
  std::optional<std::filesystem::path> path;
  if (o.tokenizer) {
    path = *o.tokenizer;
  } else if (sd::detect_model_format(o.model) != sd::model_format::gguf) {
    auto const beside = std::filesystem::path(o.model).parent_path() / "tokenizer.bin";
    std::error_code ec;
    if (!std::filesystem::is_regular_file(beside, ec))
      throw usage_error("no tokenizer: pass --tokenizer PATH (there is no tokenizer.bin next to '" +
                        o.model + "')");
  }
  return sd::load_tokenizer(o.model, path);
}

//! The text of `tokens` following `previous` (as streamed: the first piece may drop its leading
//! space after BOS).
std::string decode_after(sd::tokenizer const& tok, sd::token_id previous,
                         std::span<sd::token_id const> tokens) {
  std::string text;
  for (sd::token_id t : tokens) {
    text += tok.decode(previous, t);
    previous = t;
  }
  return text;
}

//! Streams committed tokens to stdout after the prompt text (written with the first token, so
//! that a request failing before its first token leaves stdout empty), flushing at most every
//! 25 ms (a flush per token would cost more than a forward of a small model).
class text_stream {
 public:
  text_stream(sd::tokenizer const& tok, std::string const& prompt, sd::token_id previous)
      : tok_(&tok), prompt_(&prompt), previous_(previous) {}

  bool operator()(sd::token_id t) {
    if (!started_) start();
    std::string_view const piece = tok_->decode(previous_, t);
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    previous_ = t;
    auto const now = std::chrono::steady_clock::now();
    if (now - last_flush_ > std::chrono::milliseconds(25)) {
      std::fflush(stdout);
      last_flush_ = now;
    }
    return true;
  }

  //! Writes the prompt text if no token did, then ends the line.
  void finish() {
    if (!started_) start();
    std::fputc('\n', stdout);
    std::fflush(stdout);
  }

 private:
  void start() {
    std::fwrite(prompt_->data(), 1, prompt_->size(), stdout);
    started_ = true;
  }

  sd::tokenizer const* tok_;
  std::string const* prompt_;
  sd::token_id previous_;
  bool started_ = false;
  std::chrono::steady_clock::time_point last_flush_ = std::chrono::steady_clock::now();
};

int run(options const& o) {
  // Everything the command line names is checked before any work; what remains can only fail at
  // run time (corrupt files, mismatched vocabularies, a prompt beyond the context).
  auto const weights = std::make_shared<sd::llama_weights const>(sd::load_model(o.model));
  sd::tokenizer const tok = load_vocabulary(o);
  std::int32_t const layers = weights->config.n_layers;
  options opt = o;
  if (opt.strategy == "layer-skip") {
    if (!opt.skip_layers) opt.skip_layers = std::vector<std::int32_t>{layers / 2};
    for (std::int32_t l : *opt.skip_layers)
      if (l >= layers)
        throw usage_error("--skip-layers: layer " + std::to_string(l) + " is beyond the model's " +
                          std::to_string(layers) + " layers (0.." + std::to_string(layers - 1) +
                          ")");
  }

  std::string const prompt_text = opt.prompt ? *opt.prompt : read_prompt_file(*opt.prompt_file);
  std::vector<sd::token_id> const prompt = tok.encode(prompt_text, true);

  sd::sampling_params params;
  params.temperature = opt.temperature;
  params.top_k = opt.top_k;
  params.top_p = opt.top_p;
  params.min_p = opt.min_p;
  params.repetition_penalty = opt.repetition_penalty;
  params.frequency_penalty = opt.frequency_penalty;
  params.presence_penalty = opt.presence_penalty;

  sd::decode_config config;
  config.max_new_tokens = opt.max_new_tokens;
  config.eos_token = opt.ignore_eos ? sd::no_token : tok.eos();
  config.seed = opt.seed;
  config.stop_strings = opt.stops;
  if (!opt.stops.empty())
    config.piece = [&tok](sd::token_id p, sd::token_id t) { return std::string(tok.decode(p, t)); };

  sd::cpu_llama target(weights, {.threads = opt.threads, .max_context = opt.context});
  session s{opt, weights, target, prompt, config, sd::sampler(params), {}};
  // The callback holds the stream by pointer: the decoder copies the std::function.
  text_stream stream(tok, prompt_text, prompt.back());
  if (!opt.json) s.on_token = [&stream](sd::token_id t) { return stream(t); };

  strategy const& chosen = find_strategy(opt.strategy);
  std::vector<run_output> runs{chosen.run(s)};
  if (!opt.json) stream.finish();
  s.on_token = {};
  std::vector<run_output> baselines;
  if (opt.compare) baselines.push_back(run_autoregressive(s));
  // --repeat: further runs, alternating with the baseline's, so that both see the same machine.
  for (std::size_t r = 1; r < opt.repeat; ++r) {
    runs.push_back(chosen.run(s));
    if (opt.compare) baselines.push_back(run_autoregressive(s));
  }
  run_output const out = median_run(std::move(runs));

  std::optional<comparison> cmp;
  if (opt.compare) cmp = compare_runs(out, median_run(std::move(baselines)), s.greedy());
  comparison const* const c = cmp ? &*cmp : nullptr;

  if (opt.json) {
    json_object j;
    j.text("strategy", opt.strategy)
        .text("description", out.description)
        .text("verifier", out.verifier)
        .text("prompt", prompt_text)
        .raw("prompt_ids", json_int_array(std::span<sd::token_id const>(prompt)))
        .text("text", decode_after(tok, prompt.back(), out.result.tokens))
        .raw("tokens", json_int_array(std::span<sd::token_id const>(out.result.tokens)))
        .text("finish_reason", sd::to_string(out.result.reason))
        .raw("stats", stats_json(out, c))
        .number("repeat", static_cast<double>(opt.repeat));
    if (c != nullptr) {
      auto const& b = c->baseline.result;
      j.raw("baseline", json_object()
                            .text("text", decode_after(tok, prompt.back(), b.tokens))
                            .raw("tokens", json_int_array(std::span<sd::token_id const>(b.tokens)))
                            .text("finish_reason", sd::to_string(b.reason))
                            .number("tokens_per_second", b.stats.tokens_per_second())
                            .str());
    }
    std::string const text = j.str() + "\n";
    std::fwrite(text.data(), 1, text.size(), stdout);
  } else {
    print_table(stdout, out, c);
    if (opt.repeat > 1)
      std::printf("  (timings: the run of median time of %zu%s)\n", opt.repeat,
                  c != nullptr ? ", for each, run alternately" : "");
  }
  std::fflush(stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  try {
    o = parse_options(std::span<char const* const>(argv + 1, static_cast<std::size_t>(argc - 1)));
  } catch (usage_error const& e) {
    std::fprintf(stderr, "specdec-generate: %s (see --help)\n", one_line(e.what()).c_str());
    return 2;
  }
  if (o.help) {
    std::fputs(help_text().c_str(), stdout);
    return 0;
  }
  try {
    return run(o);
  } catch (usage_error const& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "specdec-generate: %s (see --help)\n", one_line(e.what()).c_str());
    return 2;
  } catch (std::exception const& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "specdec-generate: %s\n", one_line(e.what()).c_str());
    return 1;
  }
}
