// specdec-generate: speculative generation on the CPU or a CUDA device (--device, --dtype;
// tools/generate/models.hpp) with a choice of strategy (the table in
// tools/generate/strategies.hpp), streaming the text as tokens are committed, then a statistics
// table; --compare adds the autoregressive baseline and the speedup, --json prints one JSON object
// instead, --stream-json a JSON line per token then that object, --report a picture of the run.
// --regex PATTERN or --json-schema FILE constrains the output of every strategy (the decoders'
// policy masks each row to the tokens the constraint allows; tools/generate/strategies.hpp), and
// the statistics say whether the output is valid.
// --prompts FILE --batch N serves every prompt of a JSON Lines file as concurrent requests
// (tools/generate/batch.hpp). See docs/generate.md and --help.
//
// Exit status: 0 on success; 2 for a bad command line (tools/generate/options.hpp); 1 for a
// failure at run time (a specdec::error or any other exception), each with a one-line message on
// stderr.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <new>
#include <optional>
#include <span>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "generate/batch.hpp"
#include "generate/option.hpp"
#include "generate/options.hpp"
#include "generate/picture.hpp"
#include "generate/report.hpp"
#include "generate/strategies.hpp"
#include "specdec/backend/cpu/llama.hpp"
#include "specdec/backend/cpu/thread_pool.hpp"
#include "specdec/core/cpu_target.hpp"
#include "specdec/core/error.hpp"
#include "specdec/model/load.hpp"
#include "specdec/model/mapped_file.hpp"
#include "specdec/model/tokenizer.hpp"
#include "specdec/sampling/automaton_constraint.hpp"
#include "specdec/sampling/json_schema.hpp"
#include "specdec/sampling/policy.hpp"
#include "specdec/sampling/regex.hpp"

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

//! The log-probability of `token` under the softmax of `logits`, and the `top` most likely tokens
//! of the row with theirs (ties: the lower id first), as --logprobs reports them.
nlohmann::ordered_json logprobs_json(sd::tokenizer const& tok, std::span<float const> logits,
                                     sd::token_id token, std::size_t top) {
  float const hi = *std::max_element(logits.begin(), logits.end());
  double sum = 0.0;
  for (float l : logits) sum += std::exp(static_cast<double>(l) - static_cast<double>(hi));
  double const lse = static_cast<double>(hi) + std::log(sum);
  auto const logprob = [&](sd::token_id t) {
    return static_cast<double>(logits[static_cast<std::size_t>(t)]) - lse;
  };
  nlohmann::ordered_json o;
  o["logprob"] = logprob(token);
  nlohmann::ordered_json& list = o["top"] = nlohmann::ordered_json::array();
  std::vector<sd::token_id> ids(logits.size());
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<sd::token_id>(i);
  std::size_t const n = std::min(top, ids.size());
  std::partial_sort(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(n), ids.end(),
                    [&](sd::token_id a, sd::token_id b) {
                      float const la = logits[static_cast<std::size_t>(a)];
                      float const lb = logits[static_cast<std::size_t>(b)];
                      return la > lb || (la == lb && a < b);
                    });
  for (std::size_t i = 0; i < n; ++i) {
    nlohmann::ordered_json e;
    e["token"] = ids[i];
    e["text"] = std::string(tok.decode(sd::no_token, ids[i]));
    e["logprob"] = logprob(ids[i]);
    list.push_back(std::move(e));
  }
  return o;
}

//! What the observed run (the first one) records and streams: the text or one JSON line per
//! token as tokens are committed, the tokens' log-probabilities, and each step for --report.
class observation {
 public:
  observation(option_values const& v, sd::tokenizer const& tok, std::string const& prompt_text,
              sd::token_id last_prompt_token)
      : tok_(&tok),
        text_(tok, prompt_text, last_prompt_token),
        previous_(last_prompt_token),
        text_mode_(!v.flag(opt::json) && !v.flag(opt::stream_json)),
        stream_json_(v.flag(opt::stream_json)),
        logprobs_(v.given(opt::logprobs)),
        top_(static_cast<std::size_t>(v.count(opt::logprobs))),
        steps_(v.given(opt::report)) {}

  //! The observer of the first run.
  sd::request_observer observer() {
    sd::request_observer o;
    o.on_token = [this](sd::token_event const& e) { return on_token(e); };
    if (steps_) o.on_step = [this](sd::step_event const& e) { on_step(e); };
    return o;
  }

  //! Ends the streamed text (the prompt alone when no token came).
  void finish() {
    if (text_mode_) text_.finish();
    std::fflush(stdout);
  }

  //! Each generated token's --logprobs member, in order.
  [[nodiscard]] nlohmann::ordered_json const& logprobs() const noexcept { return logprobs_json_; }

  //! Every step for --report, with the tokens each committed (`emitted`).
  [[nodiscard]] std::vector<step_record> steps() const {
    std::vector<step_record> out = records_;
    if (out.empty())  // the baseline: one token per step, nothing drafted
      out.resize(emitted_.size());
    for (std::size_t i = 0; i < out.size() && i < emitted_.size(); ++i)
      out[i].emitted = emitted_[i];
    return out;
  }

 private:
  bool on_token(sd::token_event const& e) {
    if (text_mode_) (void)text_(e.token);
    nlohmann::ordered_json lp;
    if (logprobs_) {
      lp = logprobs_json(*tok_, e.logits, e.token, top_);
      nlohmann::ordered_json entry;
      entry["token"] = e.token;
      entry["text"] = std::string(tok_->decode(previous_, e.token));
      entry["logprob"] = lp["logprob"];
      entry["top"] = lp["top"];
      logprobs_json_.push_back(std::move(entry));
    }
    if (stream_json_) {
      nlohmann::ordered_json line;
      line["event"] = "token";
      line["index"] = e.index;
      line["token"] = e.token;
      line["text"] = std::string(tok_->decode(previous_, e.token));
      line["step"] = e.step;
      line["depth"] = e.depth;
      line["drafted"] = e.drafted;
      if (logprobs_) {
        line["logprob"] = lp["logprob"];
        line["top"] = lp["top"];
      }
      print_json(line);
      std::fflush(stdout);
    }
    if (emitted_.size() <= e.step) emitted_.resize(e.step + 1, 0);
    ++emitted_[e.step];
    previous_ = e.token;
    return true;
  }

  void on_step(sd::step_event const& e) { records_.push_back(record_step(*e.tree, *e.result)); }

  sd::tokenizer const* tok_;
  text_stream text_;
  sd::token_id previous_;
  bool text_mode_, stream_json_, logprobs_;
  std::size_t top_;
  bool steps_;
  nlohmann::ordered_json logprobs_json_ = nlohmann::ordered_json::array();
  std::vector<std::size_t> emitted_;  // [step] tokens committed
  std::vector<step_record> records_;
};

//! Writes the --report picture of `out` to `path` (.svg or .html).
void write_report(std::string const& path, run_output const& out, std::vector<step_record> steps,
                  option_values const& v, sd::tokenizer const& tok) {
  run_picture p;
  sd::request_stats const& s = out.result.stats;
  p.title = out.description;
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "verifier: %s; %zu tokens in %zu steps; mean accepted length %.2f; acceptance "
                "rate %.1f%%",
                out.verifier.c_str(), s.generated, s.steps, s.mean_accepted_length(),
                100.0 * s.acceptance_rate());
  p.subtitle = buf;
  p.acceptance_by_depth = acceptance_by_depth(s);
  p.drafted_at_depth = s.drafted_at_depth;
  p.steps = std::move(steps);
  p.shown_step = default_shown_step(p.steps);
  if (v.given(opt::report_step)) {
    auto const asked = static_cast<std::size_t>(v.count(opt::report_step));
    if (asked < p.steps.size()) {
      p.shown_step = asked;
    } else {
      std::fprintf(stderr,
                   "specdec-generate: warning: --report-step %zu is beyond the run's %zu steps; "
                   "the report draws step %zu\n",
                   asked, p.steps.size(), p.shown_step);
    }
  }
  p.text = [&tok](sd::token_id t) { return std::string(tok.decode(sd::no_token, t)); };
  std::string const doc =
      std::filesystem::path(path).extension() == ".html" ? render_html(p) : render_svg(p);
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  file << doc;
  file.close();
  if (!file) throw std::runtime_error("--report: cannot write '" + path + "'");
}

//! The output constraint of --regex or --json-schema over `tok`'s vocabulary, or none. A bad
//! pattern or schema throws the compiler's `specdec::error`, which says where.
output_constraint load_constraint(option_values const& v, sd::tokenizer const& tok) {
  output_constraint c;
  auto const pattern = v.text(opt::regex);
  auto const schema = v.text(opt::json_schema);
  if (!pattern && !schema) return c;
  c.forced_spans = !v.flag(opt::no_forced_spans);
  auto const vocabulary =
      std::make_shared<sd::token_vocabulary const>(sd::token_vocabulary::of(tok));
  if (pattern) {
    c.kind = "regex";
    c.source = *pattern;
    c.automaton = sd::regex_constraint(*pattern, vocabulary);
    return c;
  }
  c.kind = "json_schema";
  c.source = *schema;
  std::ifstream in(*schema, std::ios::binary);
  if (!in) throw std::runtime_error("--json-schema: cannot read '" + *schema + "'");
  std::string const text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::string const layout = v.text(opt::json_whitespace).value_or("spaced");
  sd::json_schema_options options;
  options.whitespace = layout == "compact"    ? sd::json_whitespace::compact
                       : layout == "flexible" ? sd::json_whitespace::flexible
                                              : sd::json_whitespace::spaced;
  c.automaton = sd::json_schema_constraint(text, vocabulary, options);
  return c;
}

// --verbose: the set-up, to stderr (the CPU target, the targets compiled and supported, threads).
void print_setup(option_values const& v) {
  std::string compiled, supported;
  auto const add = [](std::string& list, sd::cpu_target t) {
    list += (list.empty() ? "" : " ") + std::string(sd::to_string(t));
  };
  for (sd::cpu_target t : sd::all_cpu_targets) {
    if (sd::cpu_target_compiled(t)) add(compiled, t);
    if (sd::cpu_target_supported(t)) add(supported, t);
  }
  std::fprintf(stderr,
               "specdec-generate: cpu target %s (compiled: %s; this CPU runs: %s), threads %llu, "
               "device %s\n",
               std::string(sd::to_string(sd::active_cpu_target())).c_str(), compiled.c_str(),
               supported.c_str(), static_cast<unsigned long long>(v.count(opt::threads)),
               v.text(opt::device).value_or("cpu").c_str());
}

int run(command_line const& cmd) {
  // Everything the command line names is checked before any work; what remains can only fail at
  // run time (corrupt files, mismatched vocabularies, a prompt beyond the context).
  option_values const& v = cmd.values;
  strategy const& chosen = *cmd.chosen;
  device_kind const device =
      v.text(opt::device).value_or("cpu") == "cuda" ? device_kind::cuda : device_kind::cpu;
  sd::weight_dtype const dtype =
      sd::parse_weight_dtype(v.text(opt::dtype).value_or("f32")).value_or(sd::weight_dtype::f32);
  if (device == device_kind::cuda) require_cuda_device();  // before any file is read
  // The CPU kernels' target, before any model is built (a model keeps the one it was built with).
  if (auto const target = v.text(opt::cpu_target))
    sd::set_cpu_target(sd::parse_cpu_target(*target));
  if (v.flag(opt::verbose)) print_setup(v);
  sd::file_access const access =
      v.flag(opt::no_mmap) ? sd::file_access::read : sd::file_access::map;
  auto const weights =
      std::make_shared<sd::llama_weights const>(sd::load_model(*v.text(opt::model), access));
  sd::tokenizer const tok = load_vocabulary(v);
  output_constraint const constraint = load_constraint(v, tok);

  // The context: --context may exceed what the model was trained on (its seq_len), with a
  // warning; the KV cache grows with the positions used, not with the context.
  auto const trained = static_cast<std::size_t>(weights->config.seq_len);
  std::size_t const context =
      v.given(opt::context) ? static_cast<std::size_t>(v.count(opt::context)) : trained;
  if (context > trained)
    std::fprintf(stderr,
                 "specdec-generate: warning: --context %zu is beyond the %zu positions the model "
                 "was trained on; its output past them may degrade\n",
                 context, trained);
  // More threads than cores only take turns on them (the pool then sleeps rather than spins, but
  // every fork-join step still waits for the slowest of its threads).
  for (option_spec const* spec : {&opt::threads, &opt::draft_threads}) {
    std::size_t const cores = sd::available_cores();
    if (v.given(*spec) && v.count(*spec) > cores)
      std::fprintf(stderr,
                   "specdec-generate: warning: %s %llu exceeds the %zu cores available; the "
                   "threads will take turns on them, slower than %zu threads\n",
                   std::string(spec->flag).c_str(), static_cast<unsigned long long>(v.count(*spec)),
                   cores, cores);
  }

  sd::sampling_params params;
  params.temperature = v.real(opt::temperature);
  params.top_k = static_cast<std::int32_t>(v.count(opt::top_k));
  params.top_p = v.real(opt::top_p);
  params.min_p = v.real(opt::min_p);
  params.repetition_penalty = v.real(opt::repetition_penalty);
  params.frequency_penalty = v.real(opt::frequency_penalty);
  params.presence_penalty = v.real(opt::presence_penalty);
  params.penalty_last_n = static_cast<std::size_t>(v.count(opt::repeat_last_n));

  // No node cap: each strategy's proposer sets the node budget of its steps.
  sd::decode_config config;
  config.max_new_tokens = static_cast<std::size_t>(v.count(opt::max_new_tokens));
  if (!v.flag(opt::ignore_eos)) config.eos_tokens = tok.end_of_text();
  config.seed = v.count(opt::seed);
  config.stop_strings = v.texts(opt::stop);
  if (!config.stop_strings.empty())
    config.piece = [&tok](sd::token_id p, sd::token_id t) { return std::string(tok.decode(p, t)); };

  sd::cpu_llama_options const model_options{
      .threads = static_cast<std::size_t>(v.count(opt::threads)), .max_context = context};
  std::optional<sd::typical_acceptance_params> typical;
  if (v.text(opt::verifier).value_or("auto") == "typical")
    typical = sd::typical_acceptance_params{.epsilon = v.real(opt::typical_epsilon),
                                            .delta = v.real(opt::typical_delta)};
  if (v.given(opt::prompts)) {  // many prompts as concurrent requests (generate/batch.hpp)
    if (device == device_kind::cuda)
      throw usage_error("--prompts serves its requests on the CPU backend; drop --device cuda");
    return run_batch(
        {v, chosen, weights, tok, model_options, params, config, typical, access, constraint});
  }

  auto const prompt_file = v.text(opt::prompt_file);
  std::string const prompt_text =
      prompt_file ? read_prompt_file(*prompt_file) : *v.text(opt::prompt);
  // A prompt that cannot fit the context is refused before it is encoded: every token covers at
  // most max_token_length() bytes, which bounds its token count from below.
  std::size_t const at_least = tok.min_tokens(prompt_text, true);
  SPECDEC_CHECK(at_least <= context, context_overflow, "a prompt of ", prompt_text.size(),
                " bytes encodes to at least ", at_least, " tokens, more than the context of ",
                context, " positions");
  std::vector<sd::token_id> const prompt = tok.encode(prompt_text, true);

  lm target = make_lm(device, dtype, weights, model_options);
  session s{v,
            weights,
            target,
            model_options,
            prompt,
            config,
            cli_policy(sd::sampler(params), constraint.automaton),
            params.temperature == 0.0f,
            {},
            std::nullopt,
            access,
            device,
            dtype};
  s.typical = typical;
  s.constraint = constraint;
  s.tok = &tok;
  if (v.text(opt::speculate).value_or("full") == "adaptive")
    s.speculation = chosen_speculation(sd::adaptive_speculation{});
  bool const json = v.flag(opt::json), stream_json = v.flag(opt::stream_json);
  bool const compare = v.flag(opt::compare);
  auto const repeat = static_cast<std::size_t>(v.count(opt::repeat));

  // The first run streams and is observed. With --compare or --repeat it is a warm-up, and the
  // timed runs follow (the baseline's warm-up, then the request and the baseline alternately, so
  // that both see the same machine); else it is the measurement.
  observation obs(v, tok, prompt_text, prompt.back());
  s.observer = obs.observer();
  run_output first = chosen.run(s);
  obs.finish();
  s.observer = {};
  std::vector<run_output> runs, baselines;
  std::size_t warmup = 0;
  if (!compare && repeat == 1) {
    runs.push_back(std::move(first));
  } else {
    warmup = 1;
    if (compare) (void)run_autoregressive(s);
    for (std::size_t r = 0; r < repeat; ++r) {
      runs.push_back(chosen.run(s));
      if (compare) baselines.push_back(run_autoregressive(s));
    }
  }
  timing const times = summarize_timing(runs, baselines, warmup);
  run_output const out = median_run(std::move(runs));

  std::optional<comparison> cmp;
  if (compare) cmp = compare_runs(out, median_run(std::move(baselines)), s.greedy);
  comparison const* const c = cmp ? &*cmp : nullptr;
  std::optional<constraint_check> check;
  if (constraint) check = check_output(constraint, tok, out.result.tokens);

  if (json || stream_json) {
    nlohmann::ordered_json j;
    if (stream_json) j["event"] = "done";
    j["strategy"] = chosen.name;
    j["description"] = out.description;
    j["verifier"] = out.verifier;
    j["prompt"] = prompt_text;
    j["prompt_ids"] = prompt;
    j["text"] = decode_after(tok, prompt.back(), out.result.tokens);
    j["tokens"] = out.result.tokens;
    j["finish_reason"] = sd::to_string(out.result.reason);
    if (check) j["constraint"] = constraint_json(*check, out.constrained);
    j["stats"] = stats_json(out, c);
    j["timing"] = timing_json(times);
    j["repeat"] = repeat;
    if (v.given(opt::logprobs)) j["logprobs"] = obs.logprobs();
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
    print_table(stdout, out, c, &times, check ? &*check : nullptr);
    if (warmup > 0)
      std::printf("  (timings: the run of median time of %zu%s, after a warm-up run%s)\n", repeat,
                  c != nullptr ? ", for each, run alternately" : "",
                  c != nullptr ? " of each" : "");
  }
  std::fflush(stdout);
  if (auto const file = v.text(opt::report)) write_report(*file, out, obs.steps(), v, tok);
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
  } catch (std::bad_alloc const&) {
    std::fflush(stdout);
    std::fprintf(stderr, "specdec-generate: out of memory (an allocation failed)\n");
    return 1;
  } catch (std::exception const& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "specdec-generate: %s\n", one_line(e.what()).c_str());
    return 1;
  }
}
