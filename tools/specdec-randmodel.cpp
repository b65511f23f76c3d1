// specdec-randmodel: writes a Llama model with random weights (fixed seed; matrices N(0, stddev^2),
// norms 1) of a preset or explicit shape, as a llama2.c checkpoint or a GGUF file, so that the
// real shapes of models that are not at hand can be run and measured. The command line is parsed
// by CLI11 (tools/cli.hpp); --help is generated from the option declarations.

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "cli.hpp"
#include "model_file.hpp"
#include "specdec/model/load.hpp"
#include "specdec/model/random.hpp"

namespace {

//! Exits with status 2 and `message` on one line.
[[noreturn]] void usage_error(std::string const& message) {
  std::fprintf(stderr, "specdec-randmodel: %s (see --help)\n",
               specdec_cli::one_line(message).c_str());
  std::exit(2);
}

//! f(), or exit status 2 with the message of the usage_error it throws.
template <class F>
auto checked(F&& f) {
  try {
    return f();
  } catch (specdec_cli::usage_error const& e) {
    usage_error(e.what());
  }
}

//! The command line's values as CLI11 collects them (numbers are parsed exactly afterwards).
struct raw_options {
  std::string preset, format, output, tokenizer, rope_theta, rms_eps, seed, stddev;
  std::string dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab, seq_len;
  bool tied = false, untied = false;
};

//! The --help text before and after the options.
constexpr char const* help_head =
    "usage: specdec-randmodel [options] -o OUTPUT\n"
    "\n"
    "Writes a Llama model with random weights: every matrix N(0, stddev^2), every RMSNorm weight "
    "1,\ndeterministic in --seed. The format follows --format, or else the output's extension "
    "(.gguf: GGUF\nF32, anything else: llama2.c legacy).\n";
constexpr char const* help_tail =
    "\nExit status: 0 on success, 2 for bad usage, 1 when the model cannot be built or written.\n";

//! Declares every option (its help is the --help text) on `app`, bound to `r`.
void declare(CLI::App& app, raw_options& r) {
  std::string const preset_names = specdec_cli::model_preset_names();
  std::string const shape = "shape", weights = "weights", output = "output";
  app.add_option("--preset", r.preset, preset_names)->type_name("NAME")->group(shape);
  app.add_option("--dim", r.dim, "model width (overrides the preset)")
      ->type_name("N")
      ->group(shape);
  app.add_option("--hidden-dim", r.hidden_dim, "SwiGLU inner width")->type_name("N")->group(shape);
  app.add_option("--layers", r.n_layers, "transformer layers")->type_name("N")->group(shape);
  app.add_option("--heads", r.n_heads, "query heads")->type_name("N")->group(shape);
  app.add_option("--kv-heads", r.n_kv_heads, "key/value heads (default: --heads)")
      ->type_name("N")
      ->group(shape);
  app.add_option("--vocab", r.vocab, "vocabulary size")->type_name("N")->group(shape);
  app.add_option("--seq-len", r.seq_len, "maximum context length")->type_name("N")->group(shape);
  app.add_option("--rope-theta", r.rope_theta,
                 "RoPE base (GGUF only, llama2.c files do not store it)")
      ->type_name("X")
      ->default_val("10000")
      ->group(shape);
  app.add_option("--rms-eps", r.rms_eps, "RMSNorm epsilon (GGUF only)")
      ->type_name("X")
      ->default_val("1e-5")
      ->group(shape);
  app.add_flag("--untied", r.untied,
               "a separate classifier (default: as the preset's model -- tinyllama-1.1b is "
               "untied, the stories models tied; tied for explicit shapes; not with --tied)")
      ->multi_option_policy(CLI::MultiOptionPolicy::Throw)
      ->group(shape);
  app.add_flag("--tied", r.tied, "a classifier tied to the token embedding")
      ->multi_option_policy(CLI::MultiOptionPolicy::Throw)
      ->excludes("--untied")
      ->group(shape);
  app.add_option("--seed", r.seed, "random seed")->type_name("N")->default_val("1")->group(weights);
  app.add_option("--stddev", r.stddev, "standard deviation of the matrices")
      ->type_name("X")
      ->default_val("0.02")
      ->group(weights);
  specdec_cli::declare_model_output(
      app, r.output, r.format, r.tokenizer,
      "embed this vocabulary (tokenizer.bin or GGUF) in a GGUF output; its size must "
      "equal --vocab",
      output);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("", "specdec-randmodel");
  raw_options r;
  declare(app, r);
  if (!checked(
          [&] { return specdec_cli::parse_command_line(app, argc, argv, help_head, help_tail); }))
    return 0;
  auto const given = [&](char const* name) { return app.get_option(name)->count() > 0; };
  auto const shape_number = [&](char const* name,
                                std::string const& text) -> std::optional<std::int32_t> {
    if (!given(name)) return std::nullopt;
    return checked([&] { return specdec_cli::parse_number<std::int32_t>(name, text); });
  };
  std::optional<std::string> preset_name, format, output, tokenizer_path;
  if (given("--preset")) preset_name = r.preset;
  if (given("--format")) format = r.format;
  if (given("--output")) output = r.output;
  if (given("--tokenizer")) tokenizer_path = r.tokenizer;
  std::optional<std::int32_t> const dim = shape_number("--dim", r.dim);
  std::optional<std::int32_t> const hidden_dim = shape_number("--hidden-dim", r.hidden_dim);
  std::optional<std::int32_t> const n_layers = shape_number("--layers", r.n_layers);
  std::optional<std::int32_t> const n_heads = shape_number("--heads", r.n_heads);
  std::optional<std::int32_t> const n_kv_heads = shape_number("--kv-heads", r.n_kv_heads);
  std::optional<std::int32_t> const vocab = shape_number("--vocab", r.vocab);
  std::optional<std::int32_t> const seq_len = shape_number("--seq-len", r.seq_len);
  float const rope_theta =
      checked([&] { return specdec_cli::parse_number<float>("--rope-theta", r.rope_theta); });
  float const rms_eps =
      checked([&] { return specdec_cli::parse_number<float>("--rms-eps", r.rms_eps); });
  float const stddev =
      checked([&] { return specdec_cli::parse_number<float>("--stddev", r.stddev); });
  std::uint64_t const seed =
      checked([&] { return specdec_cli::parse_number<std::uint64_t>("--seed", r.seed); });
  std::optional<bool> tied;
  if (r.tied) tied = true;
  if (r.untied) tied = false;
  if (!output) usage_error("no output file (-o PATH)");
  if (!(stddev > 0.0f)) usage_error("--stddev must be positive");

  specdec::llama_config c;
  if (preset_name) {
    specdec_cli::model_preset const* const found =
        checked([&] { return &specdec_cli::find_model_preset(*preset_name); });
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
      checked([&] { return specdec_cli::model_output_format(format, out_path); });
  bool const gguf = specdec_cli::is_gguf_format(fmt);
  if (tokenizer_path && !gguf) usage_error("--tokenizer only applies to GGUF output");
  for (char const* name : {"--rope-theta", "--rms-eps"})
    if (given(name) && !gguf)
      usage_error(std::string(name) +
                  " only applies to GGUF output (llama2.c files do not store it)");

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
    specdec_cli::write_model(out_path, weights, fmt, vocabulary ? &*vocabulary : nullptr);
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
