// specdec-widen: writes a model that computes another's function in a larger shape
// (include/specdec/model/widen.hpp): every matrix padded with zeros, extra layers identities, the
// RMSNorms rescaled. Its forward streams the bytes of the large shape, so speculation is measured
// where it pays (a memory-bound forward) with the small model's real acceptance. The command line
// is parsed by CLI11 (tools/cli.hpp); --help is generated from the option declarations.

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "cli.hpp"
#include "model_file.hpp"
#include "specdec/model/gguf.hpp"
#include "specdec/model/heads.hpp"
#include "specdec/model/heads_file.hpp"
#include "specdec/model/heads_writer.hpp"
#include "specdec/model/load.hpp"
#include "specdec/model/mapped_file.hpp"
#include "specdec/model/tokenizer.hpp"
#include "specdec/model/widen.hpp"

namespace {

//! The command line's values as CLI11 collects them (numbers are parsed exactly afterwards).
struct raw_options {
  std::string model, output, preset, dim, hidden_dim, n_layers, format, tokenizer;
  std::vector<std::string> heads, heads_out;
  bool no_mmap = false;
};

constexpr char const* help_head =
    "usage: specdec-widen --model PATH (--preset NAME | --dim N --hidden-dim N --layers N) -o "
    "OUTPUT\n"
    "\n"
    "Writes --model widened to a larger shape: every matrix padded with zeros, the extra layers\n"
    "identities, the RMSNorm weights and epsilon rescaled, so that the widened model computes the\n"
    "same function (up to the rounding of longer sums; llama2.c files do not store the epsilon, "
    "so\n"
    "they read back the default one) while its forward reads the bytes of the larger shape. The\n"
    "head size stays: --dim must be a multiple of it, and the key/value heads grow with the query\n"
    "heads. Sizes not given keep the model's. A GGUF output embeds --tokenizer's vocabulary, or a\n"
    "GGUF input's own. Medusa and Hydra heads trained for --model (--heads DIR, each with a\n"
    "--heads-out DIR) are widened with it, for the widened model: the same proposals, at the cost\n"
    "of heads of the larger width (a tree.json beside them is copied).\n";
constexpr char const* help_tail =
    "\nExit status: 0 on success, 2 for bad usage, 1 when the model cannot be read, widened or "
    "written.\n";

void declare(CLI::App& app, raw_options& r) {
  std::string const input = "input", shape = "shape", output = "output";
  app.add_option("--model", r.model, "the model to widen (llama2.c or GGUF; required)")
      ->type_name("PATH")
      ->group(input);
  app.add_flag("--no-mmap", r.no_mmap, "read the model into memory instead of mapping it")
      ->group(input);
  app.add_option(
         "--preset", r.preset,
         "the width, inner width and layers of a real model: " + specdec_cli::model_preset_names())
      ->type_name("NAME")
      ->group(shape);
  app.add_option("--dim", r.dim, "model width (overrides the preset's)")
      ->type_name("N")
      ->group(shape);
  app.add_option("--hidden-dim", r.hidden_dim, "SwiGLU inner width")->type_name("N")->group(shape);
  app.add_option("--layers", r.n_layers, "transformer layers")->type_name("N")->group(shape);
  specdec_cli::declare_model_output(
      app, r.output, r.format, r.tokenizer,
      "embed this vocabulary (tokenizer.bin or GGUF) in a GGUF output", output);
  std::string const heads = "heads";
  app.add_option("--heads", r.heads,
                 "Medusa or Hydra heads of --model (a directory: config.json and the heads' "
                 "safetensors file) to widen too; repeatable")
      ->type_name("DIR")
      ->group(heads);
  app.add_option("--heads-out", r.heads_out,
                 "where the widened heads go, one directory per --heads, in order")
      ->type_name("DIR")
      ->group(heads);
}

//! The kind of the heads in `dir`, by their safetensors file: Medusa or Hydra (a usage_error
//! otherwise).
enum class heads_kind { medusa, hydra };
heads_kind kind_of_heads(std::filesystem::path const& dir) {
  std::error_code ec;
  if (std::filesystem::is_regular_file(dir / specdec::medusa_heads_file, ec))
    return heads_kind::medusa;
  if (std::filesystem::is_regular_file(dir / specdec::hydra_heads_file, ec))
    return heads_kind::hydra;
  throw specdec_cli::usage_error("--heads: '" + dir.string() + "' holds neither " +
                                 specdec::medusa_heads_file + " nor " + specdec::hydra_heads_file +
                                 " (only Medusa and Hydra heads are widened)");
}

//! Widens the heads in `in` for `target` to `dim` into `out` (and copies a tree.json beside
//! them); returns a line saying what was written.
std::string widen_heads(std::filesystem::path const& in, std::filesystem::path const& out,
                        specdec::llama_config const& target, std::size_t dim,
                        specdec::file_access access) {
  namespace fs = std::filesystem;
  bool const medusa = kind_of_heads(in) == heads_kind::medusa;
  if (medusa)
    specdec::write_medusa_heads(
        out, specdec::widen_medusa_heads(specdec::load_medusa_heads(in, target, access), dim));
  else
    specdec::write_hydra_heads(
        out, specdec::widen_hydra_heads(specdec::load_hydra_heads(in, target, access), dim));
  std::error_code ec;
  if (fs::is_regular_file(in / specdec::heads_tree_file, ec)) {
    fs::copy_file(in / specdec::heads_tree_file, out / specdec::heads_tree_file,
                  fs::copy_options::overwrite_existing, ec);
    if (ec)
      throw specdec::error(
          specdec::errc::io,
          "cannot copy '" + (in / specdec::heads_tree_file).string() + "': " + ec.message());
  }
  return "wrote " + out.string() + ": " + (medusa ? "Medusa" : "Hydra") + " heads, dim " +
         std::to_string(target.dim) + " -> " + std::to_string(dim);
}

//! Reads --model, widens it and writes -o; returns the exit status. A command-line mistake is a
//! usage_error, also a shape the model cannot take (known once the model is read).
int run(int argc, char** argv) {
  using specdec_cli::usage_error;
  CLI::App app("", "specdec-widen");
  raw_options r;
  declare(app, r);
  if (!specdec_cli::parse_command_line(app, argc, argv, help_head, help_tail)) return 0;
  auto const given = [&](char const* name) { return app.get_option(name)->count() > 0; };
  if (!given("--model")) throw usage_error("no model to widen (--model PATH)");
  if (!given("--output")) throw usage_error("no output file (-o PATH)");
  specdec::widen_shape shape;
  if (given("--preset")) {
    specdec_cli::model_preset const& p = specdec_cli::find_model_preset(r.preset);
    shape = {.dim = p.dim, .hidden_dim = p.hidden_dim, .n_layers = p.n_layers};
  } else if (!given("--dim") && !given("--hidden-dim") && !given("--layers")) {
    throw usage_error("no shape: give --preset NAME, or --dim, --hidden-dim and/or --layers");
  }
  for (auto const& [name, text, field] :
       {std::tuple{"--dim", &r.dim, &shape.dim},
        std::tuple{"--hidden-dim", &r.hidden_dim, &shape.hidden_dim},
        std::tuple{"--layers", &r.n_layers, &shape.n_layers}}) {
    if (!given(name)) continue;
    *field = specdec_cli::parse_number<std::int32_t>(name, *text);
    if (*field <= 0) throw usage_error(std::string(name) + " must be positive");
  }
  std::filesystem::path const in_path(r.model), out_path(r.output);
  std::error_code ec;
  if (!std::filesystem::is_regular_file(in_path, ec))
    throw usage_error("--model: no such file '" + r.model + "'");
  std::optional<std::string> format;
  if (given("--format")) format = r.format;
  std::string const fmt = specdec_cli::model_output_format(format, out_path);
  bool const gguf = specdec_cli::is_gguf_format(fmt);
  if (given("--tokenizer") && !gguf) throw usage_error("--tokenizer only applies to GGUF output");
  if (r.heads.size() != r.heads_out.size())
    throw usage_error("each --heads DIR needs its --heads-out DIR (" +
                      std::to_string(r.heads.size()) + " --heads, " +
                      std::to_string(r.heads_out.size()) + " --heads-out)");
  for (std::string const& dir : r.heads) {
    if (!std::filesystem::is_directory(dir, ec))
      throw usage_error("--heads: no such directory '" + dir + "'");
    (void)kind_of_heads(dir);
  }

  auto const start = std::chrono::steady_clock::now();
  specdec::file_access const access =
      r.no_mmap ? specdec::file_access::read : specdec::file_access::map;
  specdec::llama_weights const model = specdec::load_model(in_path, access);
  specdec::llama_config const& c = model.config;
  specdec::llama_config widened;
  try {
    widened = specdec::widened_config(c, shape);
  } catch (specdec::error const& e) {
    throw usage_error(e.what());
  }
  // The vocabulary of a GGUF output: --tokenizer's, else a GGUF input's own.
  std::optional<specdec::tokenizer> vocabulary;
  if (gguf && given("--tokenizer")) {
    vocabulary = specdec::load_tokenizer(in_path, std::filesystem::path(r.tokenizer));
  } else if (gguf && specdec::detect_model_format(in_path) == specdec::model_format::gguf) {
    specdec::gguf_file const file(in_path);
    if (file.contains("tokenizer.ggml.tokens")) vocabulary = specdec::tokenizer::from_gguf(file);
  }
  specdec::llama_weights const wide = specdec::widen_llama(model, shape);
  specdec_cli::write_model(out_path, wide, fmt, vocabulary ? &*vocabulary : nullptr);
  double const seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf(
      "wrote %s (%s): dim %d -> %d, hidden_dim %d -> %d, n_layers %d -> %d, n_heads %d -> %d, "
      "n_kv_heads %d -> %d, %zu -> %zu parameters, %ju bytes%s, %.1f s\n",
      out_path.string().c_str(), fmt.c_str(), c.dim, widened.dim, c.hidden_dim, widened.hidden_dim,
      c.n_layers, widened.n_layers, c.n_heads, widened.n_heads, c.n_kv_heads, widened.n_kv_heads,
      c.parameter_count(), widened.parameter_count(),
      static_cast<std::uintmax_t>(std::filesystem::file_size(out_path)),
      vocabulary ? ", with its vocabulary" : "", seconds);
  for (std::size_t i = 0; i < r.heads.size(); ++i)
    std::printf("%s\n", widen_heads(r.heads[i], r.heads_out[i], c,
                                    static_cast<std::size_t>(widened.dim), access)
                            .c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (specdec_cli::usage_error const& e) {
    std::fprintf(stderr, "specdec-widen: %s (see --help)\n",
                 specdec_cli::one_line(e.what()).c_str());
    return 2;
  } catch (std::exception const& e) {
    std::fprintf(stderr, "specdec-widen: %s\n", specdec_cli::one_line(e.what()).c_str());
    return 1;
  }
}
