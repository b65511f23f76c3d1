// specdec-datastore: builds a REST datastore (include/specdec/propose/rest_datastore.hpp) from
// text files, JSONL fields and/or text sampled from the model itself, tokenised with the model's
// tokenizer; or describes and checks an existing one (--info). See docs/strategies/rest.md and
// --help.
//
// Exit status: 0 on success; 2 for a bad command line (CLI11, tools/cli.hpp); 1 for a failure at
// run time (a file that cannot be read, a malformed JSONL line, a specdec::error), each with a
// one-line message on stderr. JSONL lines are read with nlohmann/json.

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli.hpp"
#include "specdec/backend/cpu/llama.hpp"
#include "specdec/core/error.hpp"
#include "specdec/decode/autoregressive.hpp"
#include "specdec/model/load.hpp"
#include "specdec/model/tokenizer.hpp"
#include "specdec/propose/rest_datastore.hpp"
#include "specdec/sampling/policy.hpp"

namespace {

namespace sd = specdec;
using specdec_cli::parse_number;
using specdec_cli::usage_error;

//! Parsed command line.
struct options {
  std::optional<std::string> model, tokenizer, output, info;
  std::vector<std::string> text, jsonl;
  std::string field = "text";
  std::size_t generate = 0, generate_tokens = 256, threads = 1;
  float temperature = 1.0f, top_p = 0.9f;
  std::uint64_t seed = 1;
};

//! The command line's values as CLI11 collects them (numbers are parsed exactly afterwards).
struct raw_options {
  std::string model, tokenizer, output, info, field, generate, generate_tokens, temperature, top_p,
      seed, threads;
  std::vector<std::string> text, jsonl;
};

//! The --help text before and after the options.
constexpr char const* help_head =
    "usage: specdec-datastore --model PATH [--tokenizer PATH] --output PATH [sources...]\n"
    "       specdec-datastore --info PATH\n"
    "\n"
    "Builds a REST retrieval datastore (token corpus + suffix array, a versioned, checksummed file "
    "that\nspecdec-generate --strategy rest --datastore PATH memory-maps) from any mix of sources, "
    "tokenised\nwith the model's tokenizer; or loads one, checks it and describes it (--info).\n";
constexpr char const* help_tail =
    "\nExample (the stories260K fixture and the TinyStories stories):\n"
    "  specdec-datastore --model stories260K.bin --tokenizer tok512.bin \\\n"
    "      --jsonl tinystories_prompts.jsonl --field story --generate 200 --output stories.sdrest\n"
    "\nExit status: 0 on success, 2 for a bad command line (unknown or repeated option, missing "
    "or bad\nvalue), 1 when the datastore cannot be built, written or read.\n";

//! Declares every option (its help is the --help text) on `app`, bound to `r`.
void declare(CLI::App& app, raw_options& r) {
  std::string const sources = "sources", other = "other options";
  app.add_option("--text", r.text,
                 "a text file; each paragraph (text between blank lines) is one document "
                 "(repeatable)")
      ->type_name("FILE")
      ->allow_extra_args(false)
      ->group(sources);
  app.add_option("--jsonl", r.jsonl,
                 "a JSONL file: one JSON object per line; the value of --field in each line (a "
                 "string, or an array of strings: one document each) is a document (repeatable)")
      ->type_name("FILE")
      ->allow_extra_args(false)
      ->group(sources);
  app.add_option("--field", r.field, "the JSONL field to read (applies to every --jsonl)")
      ->type_name("NAME")
      ->default_val("text")
      ->group(sources);
  app.add_option("--generate", r.generate,
                 "also sample N documents from the model itself, after BOS")
      ->type_name("N")
      ->default_val("0")
      ->group(sources);
  app.add_option("--generate-tokens", r.generate_tokens,
                 "tokens per generated document (ends early at the end of a text: BOS or EOS for "
                 "llama2.c models)")
      ->type_name("L")
      ->default_val("256")
      ->group(sources);
  app.add_option("--temperature", r.temperature, "sampling temperature for --generate")
      ->type_name("T")
      ->default_val("1.0")
      ->group(sources);
  app.add_option("--top-p", r.top_p, "nucleus sampling for --generate")
      ->type_name("P")
      ->default_val("0.9")
      ->group(sources);
  app.add_option("--seed", r.seed, "seed of the first generated document (then S + 1, ...)")
      ->type_name("S")
      ->default_val("1")
      ->group(sources);
  app.add_option("--threads", r.threads, "threads of the model for --generate")
      ->type_name("N")
      ->default_val("1")
      ->group(sources);
  app.add_option("--model", r.model,
                 "the model (llama2.c .bin or GGUF): its vocabulary size bounds the ids, and it "
                 "generates for --generate")
      ->type_name("PATH")
      ->group(other);
  app.add_option("--tokenizer", r.tokenizer,
                 "the tokenizer (llama2.c tokenizer.bin; default: the GGUF's own, or "
                 "tokenizer.bin next to a llama2.c model)")
      ->type_name("PATH")
      ->group(other);
  app.add_option("--output", r.output, "where to write the datastore")
      ->type_name("PATH")
      ->group(other);
  app.add_option("--info", r.info,
                 "load PATH (verifying the checksum and every index) and describe it")
      ->type_name("PATH")
      ->group(other);
}

//! Parses and checks argv; returns no options when --help was given (after printing it).
std::optional<options> parse(int argc, char** argv) {
  CLI::App app("", "specdec-datastore");
  raw_options r;
  declare(app, r);
  if (!specdec_cli::parse_command_line(app, argc, argv, help_head, help_tail)) return std::nullopt;
  auto const given = [&](char const* name) { return app.get_option(name)->count() > 0; };
  options o;
  if (given("--model")) o.model = r.model;
  if (given("--tokenizer")) o.tokenizer = r.tokenizer;
  if (given("--output")) o.output = r.output;
  if (given("--info")) o.info = r.info;
  o.text = r.text;
  o.jsonl = r.jsonl;
  o.field = r.field;
  o.generate = parse_number<std::size_t>("--generate", r.generate);
  o.generate_tokens = parse_number<std::size_t>("--generate-tokens", r.generate_tokens);
  o.threads = parse_number<std::size_t>("--threads", r.threads);
  o.seed = parse_number<std::uint64_t>("--seed", r.seed);
  o.temperature = parse_number<float>("--temperature", r.temperature);
  o.top_p = parse_number<float>("--top-p", r.top_p);
  if (o.info) {
    for (CLI::Option const* opt : app.get_options())
      if (opt->count() > 0 && opt->get_name() != "--info")
        throw usage_error("--info takes no other option (" + opt->get_name() + " given)");
    return o;
  }
  // Options that would change nothing are refused, naming what they apply to.
  for (char const* name : {"--generate-tokens", "--temperature", "--top-p", "--seed", "--threads"})
    if (given(name) && o.generate == 0)
      throw usage_error(std::string(name) + " applies to --generate only");
  if (given("--field") && o.jsonl.empty()) throw usage_error("--field applies to --jsonl only");
  if (!o.model) throw usage_error("--model is required (its tokenizer and vocabulary)");
  if (!o.output) throw usage_error("--output is required");
  if (o.text.empty() && o.jsonl.empty() && o.generate == 0)
    throw usage_error("no source: give --text, --jsonl and/or --generate");
  if (o.threads == 0) throw usage_error("--threads must be at least 1");
  if (o.generate != 0 && o.generate_tokens == 0)
    throw usage_error("--generate-tokens must be at least 1");
  if (!(o.temperature >= 0.0f) || !(o.top_p > 0.0f && o.top_p <= 1.0f))
    throw usage_error("--temperature must be >= 0 and --top-p in (0, 1]");
  return o;
}

//! The strings of top-level member `name` of the JSON object `line`: its value when a string, the
//! strings of its value when an array (other elements are skipped), else none. Throws
//! std::runtime_error for a line that is not one JSON object.
std::vector<std::string> field_strings(std::string const& line, std::string const& name) {
  nlohmann::json const j = nlohmann::json::parse(line);
  if (!j.is_object()) throw std::runtime_error("not a JSON object");
  std::vector<std::string> out;
  auto const it = j.find(name);
  if (it == j.end()) return out;
  if (it->is_string()) {
    out.push_back(it->get<std::string>());
  } else if (it->is_array()) {
    for (nlohmann::json const& e : *it)
      if (e.is_string()) out.push_back(e.get<std::string>());
  }
  return out;
}

std::string read_file(std::string const& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read '" + path + "'");
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

//! The paragraphs of `text` (split at blank lines; each trimmed of surrounding newlines).
std::vector<std::string_view> paragraphs(std::string_view text) {
  std::vector<std::string_view> out;
  std::size_t start = 0;
  while (start < text.size()) {
    std::size_t end = text.find("\n\n", start);
    if (end == std::string_view::npos) end = text.size();
    std::string_view p = text.substr(start, end - start);
    while (!p.empty() && (p.front() == '\n' || p.front() == '\r')) p.remove_prefix(1);
    while (!p.empty() && (p.back() == '\n' || p.back() == '\r')) p.remove_suffix(1);
    if (!p.empty()) out.push_back(p);
    start = end + 2;
  }
  return out;
}

int info(std::string const& path) {
  auto const t0 = std::chrono::steady_clock::now();
  sd::rest_datastore const ds = sd::rest_datastore::load(path);
  double const seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("datastore   %s\n", path.c_str());
  std::printf("format      version %u\n", sd::rest_datastore::format_version);
  std::printf("vocabulary  %zu ids\n", ds.vocab_size());
  std::printf("documents   %zu\n", ds.num_documents());
  std::printf("corpus      %zu entries (%zu tokens + separators)\n", ds.size(),
              ds.size() - ds.num_documents());
  std::printf("memory      %.1f MiB mapped\n", static_cast<double>(ds.memory_bytes()) / 1048576.0);
  std::printf("checked     in %.3f s (checksum and every index)\n", seconds);
  return 0;
}

int build(options const& o) {
  sd::tokenizer const tok = sd::load_tokenizer(
      *o.model, o.tokenizer ? std::optional<std::filesystem::path>(*o.tokenizer) : std::nullopt);
  auto const weights = std::make_shared<sd::llama_weights const>(sd::load_model(*o.model));
  std::size_t const vocab = static_cast<std::size_t>(weights->config.vocab_size);
  if (static_cast<std::size_t>(tok.vocab_size()) > vocab)
    throw std::runtime_error("the tokenizer has " + std::to_string(tok.vocab_size()) +
                             " tokens but the model only " + std::to_string(vocab));
  sd::rest_datastore_builder builder(vocab);
  auto const add_text = [&](std::string_view text) {
    // Encode in pieces of at most 1 MiB, cut at line ends (tokenisation restarts at each piece).
    std::vector<sd::token_id> doc;
    while (!text.empty()) {
      std::size_t cut = text.size();
      if (cut > (std::size_t{1} << 20)) {
        cut = text.rfind('\n', std::size_t{1} << 20);
        cut = cut == std::string_view::npos || cut == 0 ? (std::size_t{1} << 20) : cut + 1;
      }
      auto const ids = tok.encode(text.substr(0, cut), false);
      doc.insert(doc.end(), ids.begin(), ids.end());
      text.remove_prefix(cut);
    }
    builder.add(doc);
  };

  std::size_t text_docs = 0, jsonl_docs = 0, generated_docs = 0, skipped = 0;
  for (auto const& path : o.text) {
    std::string const text = read_file(path);
    for (std::string_view p : paragraphs(text)) {
      add_text(p);
      ++text_docs;
    }
  }
  for (auto const& path : o.jsonl) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw std::runtime_error("cannot read '" + path + "'");
    std::string line;
    std::size_t number = 0, lines = 0, with_field = 0;
    while (std::getline(in, line)) {
      ++number;
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      ++lines;
      std::vector<std::string> values;
      try {
        values = field_strings(line, o.field);
      } catch (std::exception const& e) {
        throw std::runtime_error(path + ":" + std::to_string(number) +
                                 ": malformed JSON: " + e.what());
      }
      if (values.empty()) ++skipped;
      if (!values.empty()) ++with_field;
      for (auto const& v : values) {
        add_text(v);
        ++jsonl_docs;
      }
    }
    if (lines > 0 && with_field == 0)
      throw std::runtime_error(path + ": none of its " + std::to_string(lines) +
                               " lines has a string field '" + o.field +
                               "' (choose the field with --field)");
  }
  if (o.generate != 0) {
    sd::cpu_llama model(weights, {.threads = o.threads});
    sd::sampling_params params;
    params.temperature = o.temperature;
    params.top_p = o.top_p;
    sd::decode_config config;
    config.max_new_tokens = o.generate_tokens;
    config.eos_tokens = tok.end_of_text();
    std::vector<sd::token_id> const bos{tok.bos() == sd::no_token ? 0 : tok.bos()};
    sd::autoregressive_decoder ar(model, sd::sampler(params), config);
    for (std::size_t i = 0; i < o.generate; ++i) {
      ar.config().seed = o.seed + i;
      builder.add(ar.generate(bos).tokens);
      ++generated_docs;
    }
  }
  std::size_t const entries = builder.size(), documents = builder.num_documents();
  if (entries == 0) throw std::runtime_error("the sources hold no text");
  auto const t0 = std::chrono::steady_clock::now();
  sd::rest_datastore const ds = builder.build();
  double const build_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  auto const t1 = std::chrono::steady_clock::now();
  ds.save(*o.output);
  double const save_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  std::printf("documents   %zu (text %zu, jsonl %zu, generated %zu)", documents, text_docs,
              jsonl_docs, generated_docs);
  if (skipped != 0)
    std::printf("; %zu JSONL lines without a string '%s'", skipped, o.field.c_str());
  std::printf("\ncorpus      %zu tokens + %zu separators, vocabulary %zu\n", entries - documents,
              documents, vocab);
  std::printf("suffix arr  built in %.3f s (%.2f M entries/s)\n", build_seconds,
              static_cast<double>(entries) / std::max(build_seconds, 1e-9) / 1e6);
  std::printf("written     %s (%.1f MiB, %.3f s)\n", o.output->c_str(),
              static_cast<double>(std::filesystem::file_size(*o.output)) / 1048576.0, save_seconds);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::optional<options> o;
  try {
    o = parse(argc, argv);
  } catch (usage_error const& e) {
    std::fprintf(stderr, "specdec-datastore: %s (see --help)\n",
                 specdec_cli::one_line(e.what()).c_str());
    return 2;
  }
  if (!o) return 0;  // --help
  try {
    return o->info ? info(*o->info) : build(*o);
  } catch (std::exception const& e) {
    std::fprintf(stderr, "specdec-datastore: %s\n", specdec_cli::one_line(e.what()).c_str());
    return 1;
  }
}
