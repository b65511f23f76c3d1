// specdec-generate: speculative generation on the CPU with a choice of strategy (the table in
// tools/generate/strategies.hpp), streaming the text as tokens are committed, then a statistics
// table; --compare adds the autoregressive baseline and the speedup, --json prints one JSON object
// instead. See docs/generate.md and --help.
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

#include <nlohmann/json.hpp>

#include "generate/option.hpp"
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

using specdec_cli::one_line;

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
sd::tokenizer load_vocabulary(option_values const& v) {
  std::string const model = *v.text(opt::model);
  std::optional<std::filesystem::path> path;
  if (auto const tokenizer = v.text(opt::tokenizer)) {
    path = *tokenizer;
  } else if (sd::detect_model_format(model) != sd::model_format::gguf) {
    auto const beside = std::filesystem::path(model).parent_path() / "tokenizer.bin";
    std::error_code ec;
    if (!std::filesystem::is_regular_file(beside, ec))
      throw usage_error("no tokenizer: pass --tokenizer PATH (there is no tokenizer.bin next to '" +
                        model + "')");
  }
  return sd::load_tokenizer(model, path);
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
    // A control token decodes to an empty piece whose data() may be null, which fwrite must not
    // be given.
    std::string_view const piece = tok_->decode(previous_, t);
    if (!piece.empty()) std::fwrite(piece.data(), 1, piece.size(), stdout);
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

//! One JSON document on stdout; invalid UTF-8 (byte-fallback tokens can split a character)
//! becomes U+FFFD.
void print_json(nlohmann::ordered_json const& j) {
  std::string const text = j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::fputc('\n', stdout);
}

int run(command_line const& cmd) {
  // Everything the command line names is checked before any work; what remains can only fail at
  // run time (corrupt files, mismatched vocabularies, a prompt beyond the context).
  option_values const& v = cmd.values;
  strategy const& chosen = *cmd.chosen;
  auto const weights =
      std::make_shared<sd::llama_weights const>(sd::load_model(*v.text(opt::model)));
  sd::tokenizer const tok = load_vocabulary(v);

  auto const prompt_file = v.text(opt::prompt_file);
  std::string const prompt_text =
      prompt_file ? read_prompt_file(*prompt_file) : *v.text(opt::prompt);
  std::vector<sd::token_id> const prompt = tok.encode(prompt_text, true);

  sd::sampling_params params;
  params.temperature = v.real(opt::temperature);
  params.top_k = static_cast<std::int32_t>(v.count(opt::top_k));
  params.top_p = v.real(opt::top_p);
  params.min_p = v.real(opt::min_p);
  params.repetition_penalty = v.real(opt::repetition_penalty);
  params.frequency_penalty = v.real(opt::frequency_penalty);
  params.presence_penalty = v.real(opt::presence_penalty);

  // No node cap: each strategy's proposer sets the node budget of its steps.
  sd::decode_config config;
  config.max_new_tokens = static_cast<std::size_t>(v.count(opt::max_new_tokens));
  if (!v.flag(opt::ignore_eos)) config.eos_tokens = tok.end_of_text();
  config.seed = v.count(opt::seed);
  config.stop_strings = v.texts(opt::stop);
  if (!config.stop_strings.empty())
    config.piece = [&tok](sd::token_id p, sd::token_id t) { return std::string(tok.decode(p, t)); };

  sd::cpu_llama_options const model_options{
      .threads = static_cast<std::size_t>(v.count(opt::threads)),
      .max_context = static_cast<std::size_t>(v.count(opt::context))};
  sd::cpu_llama target(weights, model_options);
  session s{v,
            weights,
            target,
            model_options,
            prompt,
            config,
            sd::sampler(params),
            params.temperature == 0.0f,
            {}};
  bool const json = v.flag(opt::json), compare = v.flag(opt::compare);
  auto const repeat = static_cast<std::size_t>(v.count(opt::repeat));
  // The callback holds the stream by pointer: the decoder copies the std::function.
  text_stream stream(tok, prompt_text, prompt.back());
  if (!json) s.on_token = [&stream](sd::token_id t) { return stream(t); };

  std::vector<run_output> runs{chosen.run(s)};
  if (!json) stream.finish();
  s.on_token = {};
  std::vector<run_output> baselines;
  if (compare) baselines.push_back(run_autoregressive(s));
  // --repeat: further runs, alternating with the baseline's, so that both see the same machine.
  for (std::size_t r = 1; r < repeat; ++r) {
    runs.push_back(chosen.run(s));
    if (compare) baselines.push_back(run_autoregressive(s));
  }
  run_output const out = median_run(std::move(runs));

  std::optional<comparison> cmp;
  if (compare) cmp = compare_runs(out, median_run(std::move(baselines)), s.greedy);
  comparison const* const c = cmp ? &*cmp : nullptr;

  if (json) {
    nlohmann::ordered_json j;
    j["strategy"] = chosen.name;
    j["description"] = out.description;
    j["verifier"] = out.verifier;
    j["prompt"] = prompt_text;
    j["prompt_ids"] = prompt;
    j["text"] = decode_after(tok, prompt.back(), out.result.tokens);
    j["tokens"] = out.result.tokens;
    j["finish_reason"] = sd::to_string(out.result.reason);
    j["stats"] = stats_json(out, c);
    j["repeat"] = repeat;
    if (c != nullptr) {
      auto const& b = c->baseline.result;
      nlohmann::ordered_json& base = j["baseline"];
      base["text"] = decode_after(tok, prompt.back(), b.tokens);
      base["tokens"] = b.tokens;
      base["finish_reason"] = sd::to_string(b.reason);
      base["tokens_per_second"] = b.stats.tokens_per_second();
    }
    print_json(j);
  } else {
    print_table(stdout, out, c);
    if (repeat > 1)
      std::printf("  (timings: the run of median time of %zu%s)\n", repeat,
                  c != nullptr ? ", for each, run alternately" : "");
  }
  std::fflush(stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  command_line cmd;
  try {
    cmd = parse_command_line(argc, argv);
  } catch (usage_error const& e) {
    std::fprintf(stderr, "specdec-generate: %s (see --help)\n", one_line(e.what()).c_str());
    return 2;
  }
  if (cmd.help) {
    std::fputs(help_text().c_str(), stdout);
    return 0;
  }
  try {
    return run(cmd);
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
