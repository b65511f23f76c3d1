// specdec-datastore: builds a REST datastore (include/specdec/propose/rest_datastore.hpp) from
// text files, JSONL fields and/or text sampled from the model itself, tokenised with the model's
// tokenizer; or describes and checks an existing one (--info). See docs/strategies/rest.md and
// --help.
//
// Exit status: 0 on success; 2 for a bad command line; 1 for a failure at run time (a file that
// cannot be read, a malformed JSONL line, a specdec::error), each with a one-line message on
// stderr.

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

#include "specdec/backend/cpu/llama.hpp"
#include "specdec/core/error.hpp"
#include "specdec/decode/autoregressive.hpp"
#include "specdec/model/load.hpp"
#include "specdec/model/tokenizer.hpp"
#include "specdec/propose/rest_datastore.hpp"
#include "specdec/sampling/policy.hpp"

namespace {

namespace sd = specdec;

//! A command-line mistake (exit status 2).
struct usage_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

constexpr char const* help_text =
    R"(usage: specdec-datastore --model PATH [--tokenizer PATH] --output PATH [sources...]
       specdec-datastore --info PATH

Builds a REST retrieval datastore (token corpus + suffix array, a versioned, checksummed file that
specdec-generate --strategy rest --datastore PATH memory-maps) from any mix of sources:

  --text FILE          a text file; each paragraph (text between blank lines) is one document
  --jsonl FILE         a JSONL file: one JSON object per line; the value of --field in each line
                       (a string, or an array of strings: one document each) is a document
  --field NAME         the JSONL field to read (default "text"; applies to every --jsonl)
  --generate N         also sample N documents from the model itself, after BOS
  --generate-tokens L  tokens per generated document (default 256; ends early at EOS)
  --temperature T      sampling temperature for --generate (default 1.0)
  --top-p P            nucleus sampling for --generate (default 0.9)
  --seed S             seed of the first generated document (then S + 1, ...; default 1)
  --threads N          threads of the model for --generate (default 1)

Other options:
  --model PATH         the model (llama2.c .bin or GGUF): its vocabulary size bounds the ids,
                       and it generates for --generate
  --tokenizer PATH     the tokenizer (llama2.c tokenizer.bin; default: the GGUF's own, or
                       tokenizer.bin next to a llama2.c model)
  --output PATH        where to write the datastore
  --info PATH          load PATH (verifying the checksum and every index) and describe it
  --help               this text

Example (the stories260K fixture and the TinyStories stories):
  specdec-datastore --model stories260K.bin --tokenizer tok512.bin \
      --jsonl tinystories_prompts.jsonl --field story --generate 200 --output stories.sdrest
)";

//! Parsed command line.
struct options {
  std::optional<std::string> model, tokenizer, output, info;
  std::vector<std::string> text, jsonl;
  std::string field = "text";
  std::size_t generate = 0, generate_tokens = 256, threads = 1;
  float temperature = 1.0f, top_p = 0.9f;
  std::uint64_t seed = 1;
};

std::size_t parse_count(std::string const& flag, std::string const& v) {
  std::size_t used = 0;
  unsigned long long n = 0;
  try {
    n = std::stoull(v, &used);
  } catch (std::exception const&) {
    used = 0;
  }
  if (used != v.size() || v.empty() || v[0] == '-')
    throw usage_error(flag + ": expected a non-negative integer, got '" + v + "'");
  return static_cast<std::size_t>(n);
}

float parse_float(std::string const& flag, std::string const& v) {
  std::size_t used = 0;
  float x = 0.0f;
  try {
    x = std::stof(v, &used);
  } catch (std::exception const&) {
    used = 0;
  }
  if (used != v.size() || v.empty())
    throw usage_error(flag + ": expected a number, got '" + v + "'");
  return x;
}

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    std::string const a = argv[i];
    if (a == "--help" || a == "-h") {
      std::fputs(help_text, stdout);
      std::exit(0);
    }
    if (i + 1 >= argc) throw usage_error(a + ": missing value (or unknown flag); see --help");
    std::string const v = argv[++i];
    if (a == "--model")
      o.model = v;
    else if (a == "--tokenizer")
      o.tokenizer = v;
    else if (a == "--output")
      o.output = v;
    else if (a == "--info")
      o.info = v;
    else if (a == "--text")
      o.text.push_back(v);
    else if (a == "--jsonl")
      o.jsonl.push_back(v);
    else if (a == "--field")
      o.field = v;
    else if (a == "--generate")
      o.generate = parse_count(a, v);
    else if (a == "--generate-tokens")
      o.generate_tokens = parse_count(a, v);
    else if (a == "--threads")
      o.threads = parse_count(a, v);
    else if (a == "--seed")
      o.seed = parse_count(a, v);
    else if (a == "--temperature")
      o.temperature = parse_float(a, v);
    else if (a == "--top-p")
      o.top_p = parse_float(a, v);
    else
      throw usage_error("unknown flag '" + a + "'; see --help");
  }
  if (o.info) {
    if (o.model || o.output || !o.text.empty() || !o.jsonl.empty() || o.generate != 0)
      throw usage_error("--info takes no other flag");
    return o;
  }
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

//! A minimal JSON reader for one JSONL line: finds a top-level field and returns its strings (a
//! string value, or the strings of an array value); other values are skipped. Throws
//! std::runtime_error with the byte offset on malformed JSON.
class json_line {
 public:
  explicit json_line(std::string_view text) : s_(text) {}

  //! The strings of top-level field `name` (empty when absent or not a string / array).
  std::vector<std::string> field(std::string_view name) {
    std::vector<std::string> out;
    ws();
    expect('{');
    ws();
    if (peek() == '}') return out;
    for (;;) {
      ws();
      std::string const key = string();
      ws();
      expect(':');
      ws();
      if (key == name) {
        if (peek() == '"') {
          out.push_back(string());
        } else if (peek() == '[') {
          ++i_;
          ws();
          if (peek() != ']') {
            for (;;) {
              ws();
              if (peek() == '"')
                out.push_back(string());
              else
                skip_value();
              ws();
              if (peek() == ',') {
                ++i_;
                continue;
              }
              break;
            }
          }
          expect(']');
        } else {
          skip_value();
        }
      } else {
        skip_value();
      }
      ws();
      if (peek() == ',') {
        ++i_;
        continue;
      }
      expect('}');
      return out;
    }
  }

 private:
  [[noreturn]] void fail(std::string const& what) const {
    throw std::runtime_error(what + " at byte " + std::to_string(i_));
  }
  char peek() const { return i_ < s_.size() ? s_[i_] : '\0'; }
  void ws() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\r' || s_[i_] == '\n'))
      ++i_;
  }
  void expect(char c) {
    if (peek() != c) fail(std::string("expected '") + c + "'");
    ++i_;
  }
  unsigned hex4() {
    if (i_ + 4 > s_.size()) fail("truncated \\u escape");
    unsigned v = 0;
    for (int k = 0; k < 4; ++k) {
      char const c = s_[i_++];
      v <<= 4;
      if (c >= '0' && c <= '9')
        v |= static_cast<unsigned>(c - '0');
      else if (c >= 'a' && c <= 'f')
        v |= static_cast<unsigned>(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F')
        v |= static_cast<unsigned>(c - 'A' + 10);
      else
        fail("bad \\u escape");
    }
    return v;
  }
  static void utf8(std::string& out, unsigned cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }
  std::string string() {
    expect('"');
    std::string out;
    for (;;) {
      if (i_ >= s_.size()) fail("unterminated string");
      char const c = s_[i_++];
      if (c == '"') return out;
      if (c != '\\') {
        out += c;
        continue;
      }
      if (i_ >= s_.size()) fail("unterminated escape");
      char const e = s_[i_++];
      switch (e) {
        case '"':
          out += '"';
          break;
        case '\\':
          out += '\\';
          break;
        case '/':
          out += '/';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'u': {
          unsigned cp = hex4();
          if (cp >= 0xD800 && cp < 0xDC00 && i_ + 6 <= s_.size() && s_[i_] == '\\' &&
              s_[i_ + 1] == 'u') {
            i_ += 2;
            unsigned const lo = hex4();
            if (lo >= 0xDC00 && lo < 0xE000)
              cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            else
              fail("unpaired surrogate");
          }
          utf8(out, cp);
          break;
        }
        default:
          fail(std::string("bad escape '\\") + e + "'");
      }
    }
  }
  void skip_value() {
    char const c = peek();
    if (c == '"') {
      (void)string();
    } else if (c == '{' || c == '[') {
      char const close = c == '{' ? '}' : ']';
      ++i_;
      ws();
      if (peek() == close) {
        ++i_;
        return;
      }
      for (;;) {
        ws();
        if (close == '}') {
          (void)string();
          ws();
          expect(':');
          ws();
        }
        skip_value();
        ws();
        if (peek() == ',') {
          ++i_;
          continue;
        }
        expect(close);
        return;
      }
    } else {
      std::size_t const start = i_;
      while (i_ < s_.size() && s_[i_] != ',' && s_[i_] != '}' && s_[i_] != ']' && s_[i_] != ' ' &&
             s_[i_] != '\t' && s_[i_] != '\r' && s_[i_] != '\n')
        ++i_;
      if (i_ == start) fail("expected a value");
    }
  }

  std::string_view s_;
  std::size_t i_ = 0;
};

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
    std::size_t number = 0;
    while (std::getline(in, line)) {
      ++number;
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      std::vector<std::string> values;
      try {
        values = json_line(line).field(o.field);
      } catch (std::runtime_error const& e) {
        throw std::runtime_error(path + ":" + std::to_string(number) +
                                 ": malformed JSON: " + e.what());
      }
      if (values.empty()) ++skipped;
      for (auto const& v : values) {
        add_text(v);
        ++jsonl_docs;
      }
    }
  }
  if (o.generate != 0) {
    sd::cpu_llama model(weights, {.threads = o.threads});
    sd::sampling_params params;
    params.temperature = o.temperature;
    params.top_p = o.top_p;
    sd::decode_config config;
    config.max_new_tokens = o.generate_tokens;
    config.eos_token = tok.eos();
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

std::string one_line(std::string message) {
  for (char& c : message)
    if (c == '\n' || c == '\r') c = ' ';
  return message;
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  try {
    o = parse(argc, argv);
  } catch (usage_error const& e) {
    std::fprintf(stderr, "specdec-datastore: %s\n", one_line(e.what()).c_str());
    return 2;
  }
  try {
    return o.info ? info(*o.info) : build(o);
  } catch (std::exception const& e) {
    std::fprintf(stderr, "specdec-datastore: %s\n", one_line(e.what()).c_str());
    return 1;
  }
}
