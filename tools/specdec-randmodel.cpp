// specdec-randmodel: writes a Llama model with random weights (fixed seed; matrices N(0, stddev^2),
// norms 1) of a preset or explicit shape, as a llama2.c checkpoint or a GGUF file, so that the
// real shapes of models that are not at hand can be run and measured.

#include <charconv>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "specdec/model/gguf_writer.hpp"
#include "specdec/model/llama2c.hpp"
#include "specdec/model/load.hpp"
#include "specdec/model/random.hpp"

namespace {

struct preset {
  char const* name;
  std::int32_t dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len;
  bool tied;  // classifier shared with the token embedding, as in the real model
};

constexpr preset presets[] = {
    {"stories260K", 64, 172, 5, 8, 4, 512, 512, true},
    {"stories15M", 288, 768, 6, 6, 6, 32000, 256, true},
    {"stories42M", 512, 1376, 8, 8, 8, 32000, 1024, true},
    {"stories110M", 768, 2048, 12, 12, 12, 32000, 1024, true},
    {"tinyllama-1.1b", 2048, 5632, 22, 32, 4, 32000, 2048, false},
};

void print_help() {
  std::printf(
      "usage: specdec-randmodel [options] -o OUTPUT\n"
      "\n"
      "Writes a Llama model with random weights: every matrix N(0, stddev^2), every RMSNorm "
      "weight\n"
      "1, deterministic in --seed. The format follows --format, or else the output's extension\n"
      "(.gguf: GGUF F32, anything else: llama2.c legacy).\n"
      "\n"
      "shape:\n"
      "  --preset NAME        stories260K, stories15M, stories42M, stories110M, tinyllama-1.1b\n"
      "  --dim N              model width                 (overrides the preset)\n"
      "  --hidden-dim N       SwiGLU inner width\n"
      "  --layers N           transformer layers\n"
      "  --heads N            query heads\n"
      "  --kv-heads N         key/value heads (default: --heads)\n"
      "  --vocab N            vocabulary size\n"
      "  --seq-len N          maximum context length\n"
      "  --rope-theta X       RoPE base (default 10000; GGUF only, llama2.c files do not store "
      "it)\n"
      "  --rms-eps X          RMSNorm epsilon (default 1e-5; GGUF only)\n"
      "  --untied, --tied     a separate classifier, or one tied to the token embedding\n"
      "                       (default: as the preset's model -- tinyllama-1.1b is untied, the\n"
      "                       stories models tied; tied for explicit shapes)\n"
      "weights:\n"
      "  --seed N             random seed (default 1)\n"
      "  --stddev X           standard deviation of the matrices (default 0.02)\n"
      "output:\n"
      "  -o, --output PATH    the file to write (required)\n"
      "  --format F           llama2c (legacy), llama2c-v1, llama2c-q8 (version 2, Q8_0),\n"
      "                       gguf-f32, gguf-f16, gguf-bf16\n"
      "  --tokenizer PATH     embed this vocabulary (tokenizer.bin or GGUF) in a GGUF output;\n"
      "                       its size must equal --vocab\n"
      "  -h, --help           this text\n"
      "\n"
      "Exit status: 0 on success, 2 for bad usage, 1 when the model cannot be built or written.\n");
}

[[noreturn]] void usage_error(std::string const& message) {
  std::fprintf(stderr, "specdec-randmodel: %s (see --help)\n", message.c_str());
  std::exit(2);
}

template <class T>
T parse_number(std::string_view flag, std::string_view text) {
  T value{};
  auto const [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc{} || end != text.data() + text.size()) {
    usage_error(std::string(flag) + " expects a number, got '" + std::string(text) + "'");
  }
  return value;
}

}  // namespace

int main(int argc, char** argv) {
  std::optional<std::string> preset_name, format, output, tokenizer_path;
  std::optional<std::int32_t> dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab, seq_len;
  float rope_theta = 10000.0f, rms_eps = 1e-5f, stddev = 0.02f;
  std::uint64_t seed = 1;
  std::optional<bool> tied;

  std::vector<std::string_view> const args(argv + 1, argv + argc);
  for (std::size_t i = 0; i < args.size(); ++i) {
    std::string_view const flag = args[i];
    auto const value = [&]() -> std::string_view {
      if (i + 1 >= args.size()) usage_error(std::string(flag) + " needs a value");
      return args[++i];
    };
    auto const int_value = [&] { return parse_number<std::int32_t>(flag, value()); };
    if (flag == "-h" || flag == "--help") {
      print_help();
      return 0;
    } else if (flag == "--preset") {
      preset_name = value();
    } else if (flag == "--dim") {
      dim = int_value();
    } else if (flag == "--hidden-dim") {
      hidden_dim = int_value();
    } else if (flag == "--layers") {
      n_layers = int_value();
    } else if (flag == "--heads") {
      n_heads = int_value();
    } else if (flag == "--kv-heads") {
      n_kv_heads = int_value();
    } else if (flag == "--vocab") {
      vocab = int_value();
    } else if (flag == "--seq-len") {
      seq_len = int_value();
    } else if (flag == "--rope-theta") {
      rope_theta = parse_number<float>(flag, value());
    } else if (flag == "--rms-eps") {
      rms_eps = parse_number<float>(flag, value());
    } else if (flag == "--untied") {
      tied = false;
    } else if (flag == "--tied") {
      tied = true;
    } else if (flag == "--seed") {
      seed = parse_number<std::uint64_t>(flag, value());
    } else if (flag == "--stddev") {
      stddev = parse_number<float>(flag, value());
    } else if (flag == "-o" || flag == "--output") {
      output = value();
    } else if (flag == "--format") {
      format = value();
    } else if (flag == "--tokenizer") {
      tokenizer_path = value();
    } else {
      usage_error("unknown option '" + std::string(flag) + "'");
    }
  }
  if (!output) usage_error("no output file (-o PATH)");
  if (!(stddev > 0.0f)) usage_error("--stddev must be positive");

  specdec::llama_config c;
  if (preset_name) {
    preset const* found = nullptr;
    for (auto const& p : presets) {
      if (*preset_name == p.name) found = &p;
    }
    if (found == nullptr) usage_error("unknown preset '" + *preset_name + "'");
    c.dim = found->dim;
    c.hidden_dim = found->hidden_dim;
    c.n_layers = found->n_layers;
    c.n_heads = found->n_heads;
    c.n_kv_heads = found->n_kv_heads;
    c.vocab_size = found->vocab_size;
    c.seq_len = found->seq_len;
    c.shared_classifier = found->tied;
  } else if (!dim || !hidden_dim || !n_layers || !n_heads || !vocab || !seq_len) {
    usage_error(
        "give --preset or all of --dim, --hidden-dim, --layers, --heads, --vocab, --seq-len");
  }
  if (dim) c.dim = *dim;
  if (hidden_dim) c.hidden_dim = *hidden_dim;
  if (n_layers) c.n_layers = *n_layers;
  if (n_heads) c.n_heads = *n_heads;
  c.n_kv_heads = n_kv_heads ? *n_kv_heads : (n_heads || !preset_name ? c.n_heads : c.n_kv_heads);
  if (vocab) c.vocab_size = *vocab;
  if (seq_len) c.seq_len = *seq_len;
  c.rope_theta = rope_theta;
  c.rms_eps = rms_eps;
  if (tied) c.shared_classifier = *tied;

  std::filesystem::path const out_path(*output);
  std::string const fmt =
      format ? *format : (out_path.extension() == ".gguf" ? "gguf-f32" : "llama2c");
  bool const gguf = fmt.rfind("gguf-", 0) == 0;
  if (fmt != "llama2c" && fmt != "llama2c-v1" && fmt != "llama2c-q8" && fmt != "gguf-f32" &&
      fmt != "gguf-f16" && fmt != "gguf-bf16") {
    usage_error("unknown format '" + fmt + "'");
  }
  if (tokenizer_path && !gguf) usage_error("--tokenizer only applies to GGUF output");

  try {
    c.validate("specdec-randmodel");
  } catch (specdec::error const& e) {
    usage_error(e.what());
  }

  try {
    auto const start = std::chrono::steady_clock::now();
    std::optional<specdec::tokenizer> vocabulary;
    if (tokenizer_path) {
      std::filesystem::path const tp(*tokenizer_path);
      vocabulary = specdec::detect_model_format(tp) == specdec::model_format::gguf
                       ? specdec::tokenizer::from_gguf(specdec::gguf_file(tp))
                       : specdec::tokenizer::load_llama2c(tp, c.vocab_size);
      if (vocabulary->vocab_size() != c.vocab_size) {
        usage_error("the vocabulary has " + std::to_string(vocabulary->vocab_size()) +
                    " tokens but --vocab is " + std::to_string(c.vocab_size));
      }
    }
    auto const weights = specdec::make_random_llama(c, seed, stddev);
    if (fmt == "llama2c") {
      specdec::write_llama2c(out_path, weights, specdec::llama2c_format::legacy);
    } else if (fmt == "llama2c-v1") {
      specdec::write_llama2c(out_path, weights, specdec::llama2c_format::v1);
    } else if (fmt == "llama2c-q8") {
      specdec::write_llama2c(out_path, weights, specdec::llama2c_format::v2_q8_0);
    } else {
      auto const type = fmt == "gguf-f32"   ? specdec::gguf_type::f32
                        : fmt == "gguf-f16" ? specdec::gguf_type::f16
                                            : specdec::gguf_type::bf16;
      specdec::write_gguf(out_path, weights, vocabulary ? &*vocabulary : nullptr, type);
    }
    double const seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf(
        "wrote %s (%s): dim %d, hidden_dim %d, n_layers %d, n_heads %d, n_kv_heads %d, "
        "vocab_size %d, seq_len %d, %s classifier, %zu parameters, %ju bytes, seed %ju, %.1f s\n",
        out_path.string().c_str(), fmt.c_str(), c.dim, c.hidden_dim, c.n_layers, c.n_heads,
        c.n_kv_heads, c.vocab_size, c.seq_len, c.shared_classifier ? "tied" : "untied",
        c.parameter_count(), static_cast<std::uintmax_t>(std::filesystem::file_size(out_path)),
        static_cast<std::uintmax_t>(seed), seconds);
  } catch (std::exception const& e) {
    std::fprintf(stderr, "specdec-randmodel: %s\n", e.what());
    return 1;
  }
  return 0;
}
