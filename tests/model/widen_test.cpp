// widen_llama (model/widen.hpp): the stories260K fixture padded to larger shapes computes the same
// function. Logits over every fixture prompt agree with the original's within a stated tolerance
// (the difference is the rounding of longer sums), greedy decoding emits the same tokens, written
// as GGUF (which stores the rescaled epsilon) and as llama2.c (which does not) the model reads
// back and still does; bad shapes are refused with errors that name them.
#include "specdec/model/widen.hpp"

#include "support/doctest.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <numeric>
#include <string>
#include <vector>

#include "specdec/backend/cpu/heads.hpp"
#include "specdec/backend/cpu/llama.hpp"
#include "specdec/core/forward.hpp"
#include "specdec/decode/autoregressive.hpp"
#include "specdec/model/gguf_writer.hpp"
#include "specdec/model/heads.hpp"
#include "specdec/model/heads_file.hpp"
#include "specdec/model/heads_writer.hpp"
#include "specdec/model/llama2c.hpp"
#include "specdec/model/load.hpp"
#include "specdec/sampling/policy.hpp"
#include "support/errors.hpp"
#include "support/files.hpp"
#include "support/fixture.hpp"

namespace sd = specdec;

namespace {

// The last row's outputs after a causal forward of `tokens` from position 0 (with the final
// hidden row when `hidden`).
sd::forward_result last_row(sd::cpu_llama& m, std::vector<sd::token_id> const& tokens,
                            bool hidden = false) {
  m.cache().truncate(0);
  std::vector<sd::position_t> positions(tokens.size());
  std::iota(positions.begin(), positions.end(), sd::position_t{0});
  std::int32_t const last = static_cast<std::int32_t>(tokens.size() - 1);
  sd::forward_request req;
  req.tokens = tokens;
  req.positions = positions;
  req.logits_rows = std::span<std::int32_t const>(&last, 1);
  req.want_hidden = hidden;
  sd::forward_result out;
  m.forward(req, out);
  REQUIRE(out.logits_count == 1);
  return out;
}

// The last row's logits.
std::vector<float> last_logits(sd::cpu_llama& m, std::vector<sd::token_id> const& tokens) {
  return last_row(m, tokens).logits;
}

// Greedy tokens after `prompt`, `n` of them.
std::vector<sd::token_id> greedy_tokens_of(sd::cpu_llama& m,
                                           std::vector<sd::token_id> const& prompt, std::size_t n) {
  m.cache().truncate(0);
  sd::decode_config config;
  config.max_new_tokens = n;
  sd::autoregressive_decoder ar(m, sd::greedy{}, config);
  return ar.generate(prompt).tokens;
}

// The largest |a - b| over two rows, and the largest |a|.
struct row_gap {
  float gap = 0.0f, scale = 0.0f;
};
row_gap logits_gap(std::vector<float> const& a, std::vector<float> const& b) {
  REQUIRE(a.size() == b.size());
  row_gap g;
  for (std::size_t i = 0; i < a.size(); ++i) {
    g.gap = std::max(g.gap, std::abs(a[i] - b[i]));
    g.scale = std::max(g.scale, std::abs(a[i]));
  }
  return g;
}

sd::cpu_llama single_threaded(std::shared_ptr<sd::llama_weights const> w) {
  return sd::cpu_llama(std::move(w), {.threads = 1});
}

}  // namespace

TEST_CASE("widen: the widened configuration keeps the head size and the query/key-value ratio") {
  sd::llama_config const& c = fixture::stories260k()->config;  // dim 64, 8 heads, 4 kv heads
  sd::llama_config const n =
      sd::widened_config(c, {.dim = 768, .hidden_dim = 2048, .n_layers = 12});
  CHECK(n.dim == 768);
  CHECK(n.hidden_dim == 2048);
  CHECK(n.n_layers == 12);
  CHECK(n.head_size() == c.head_size());
  CHECK(n.n_heads == 96);
  CHECK(n.n_kv_heads == 48);
  CHECK(n.vocab_size == c.vocab_size);
  CHECK(n.seq_len == c.seq_len);
  CHECK(n.shared_classifier == c.shared_classifier);
  CHECK(n.rms_eps == doctest::Approx(c.rms_eps * 64.0f / 768.0f));
  // 0 keeps the model's own size.
  sd::llama_config const same = sd::widened_config(c, {});
  CHECK(same.dim == c.dim);
  CHECK(same.n_layers == c.n_layers);
  CHECK(same.rms_eps == c.rms_eps);
}

TEST_CASE("widen: shapes it cannot take are refused, saying why") {
  sd::llama_config const& c = fixture::stories260k()->config;
  test_support::check_error([&] { (void)sd::widened_config(c, {.dim = 32}); },
                            sd::errc::invalid_argument, "smaller than the model's");
  test_support::check_error([&] { (void)sd::widened_config(c, {.n_layers = 4}); },
                            sd::errc::invalid_argument, "smaller than the model's");
  test_support::check_error([&] { (void)sd::widened_config(c, {.dim = 100}); },
                            sd::errc::invalid_argument,
                            "not a multiple of the model's head size 8");
  // 72 / 8 = 9 heads: not a multiple of the 2 query heads per key/value head.
  test_support::check_error([&] { (void)sd::widened_config(c, {.dim = 72}); },
                            sd::errc::invalid_argument, "query heads per key/value head");
  test_support::check_error([&] { (void)sd::widened_config(c, {.dim = 1 << 26}); },
                            sd::errc::invalid_argument, "absurd dimensions");
  sd::llama_weights incomplete = *fixture::stories260k();
  incomplete.layers[1].w2 = nullptr;
  test_support::check_error([&] { (void)sd::widen_llama(incomplete, {.dim = 128}); },
                            sd::errc::invalid_argument, "null tensors");
}

TEST_CASE("widen: the fixture widened computes the same logits and greedy tokens on every prompt") {
  auto const original = fixture::stories260k();
  auto const wide = std::make_shared<sd::llama_weights const>(
      sd::widen_llama(*original, {.dim = 128, .hidden_dim = 256, .n_layers = 7}));
  CHECK(wide->config.n_kv_heads == 8);
  sd::cpu_llama a = single_threaded(original), b = single_threaded(wide);
  // Logits of the order of 10; sums of up to 256 terms in another order: 1e-4 relative is far
  // above their rounding and far below any real difference.
  float worst = 0.0f;
  for (auto const& prompt : fixture::encoded_prompts()) {
    row_gap const g = logits_gap(last_logits(a, prompt), last_logits(b, prompt));
    CHECK(g.gap <= 1e-4f * std::max(1.0f, g.scale));
    worst = std::max(worst, g.gap);
    CHECK(greedy_tokens_of(a, prompt, 48) == greedy_tokens_of(b, prompt, 48));
  }
  MESSAGE("largest logit difference over the 14 prompts: " << worst);
}

TEST_CASE("widen: at the stories110M shape the fixture's greedy reference is unchanged") {
  // 313 MB of float32: the shape the memory-bound benchmarks use.
  auto const wide = std::make_shared<sd::llama_weights const>(
      sd::widen_llama(*fixture::stories260k(), {.dim = 768, .hidden_dim = 2048, .n_layers = 12}));
  CHECK(wide->config.parameter_count() > 75'000'000);
  sd::cpu_llama m = single_threaded(wide);
  std::vector<sd::token_id> const ref = fixture::reference_continuation();
  std::vector<sd::token_id> const out = greedy_tokens_of(m, fixture::once_upon_a_time(), 24);
  CHECK(out == std::vector<sd::token_id>(ref.begin(), ref.begin() + 24));
}

TEST_CASE("widen: written as GGUF or llama2.c, the widened model reads back and decodes the same") {
  auto const original = fixture::stories260k();
  sd::llama_weights const wide =
      sd::widen_llama(*original, {.dim = 96, .hidden_dim = 200, .n_layers = 6});
  test_support::temp_dir const dir;
  sd::cpu_llama a = single_threaded(original);
  std::vector<sd::token_id> const prompt = fixture::once_upon_a_time();
  std::vector<sd::token_id> const expected = greedy_tokens_of(a, prompt, 64);

  std::filesystem::path const gguf = dir.file("wide.gguf");
  sd::write_gguf(gguf, wide, nullptr, sd::gguf_type::f32);
  auto const from_gguf = std::make_shared<sd::llama_weights const>(sd::load_model(gguf));
  CHECK(from_gguf->config.rms_eps == wide.config.rms_eps);  // GGUF stores the rescaled epsilon
  sd::cpu_llama g = single_threaded(from_gguf);
  CHECK(greedy_tokens_of(g, prompt, 64) == expected);

  // llama2.c stores no epsilon: the default one comes back, a difference of the order of 1e-5
  // in the normalisation, which leaves the greedy tokens as they are.
  std::filesystem::path const bin = dir.file("wide.bin");
  sd::write_llama2c(bin, wide);
  auto const from_bin = std::make_shared<sd::llama_weights const>(sd::load_model(bin));
  CHECK(from_bin->config.dim == 96);
  CHECK(from_bin->config.n_kv_heads == 6);
  sd::cpu_llama l = single_threaded(from_bin);
  CHECK(greedy_tokens_of(l, prompt, 64) == expected);
}

// The final hidden row of the last token of `tokens` (a causal forward from position 0).
std::vector<float> final_hidden_of(sd::cpu_llama& m, std::vector<sd::token_id> const& tokens) {
  sd::forward_result const out = last_row(m, tokens, true);
  std::size_t const d = m.hidden_size();
  return {out.hidden.end() - static_cast<std::ptrdiff_t>(d), out.hidden.end()};
}

// The fixture's trained Medusa and Hydra heads widened with the model (written and read back)
// give the original heads' logits on the widened model's hidden rows, whose extra coordinates are
// zero.
TEST_CASE("widen: Medusa and Hydra heads widened with the model give the same logits") {
  auto const original = fixture::stories260k();
  auto const wide = std::make_shared<sd::llama_weights const>(
      sd::widen_llama(*original, {.dim = 128, .hidden_dim = 256, .n_layers = 7}));
  auto const medusa = std::make_shared<sd::medusa_weights const>(sd::load_medusa_heads(
      test_support::source_file("tools/heads/medusa/config.json").parent_path(), original->config));
  auto const hydra = std::make_shared<sd::hydra_weights const>(sd::load_hydra_heads(
      test_support::source_file("tools/heads/hydra/config.json").parent_path(), original->config));
  test_support::temp_dir dir;
  sd::write_medusa_heads(dir.file("medusa"), sd::widen_medusa_heads(*medusa, 128));
  sd::write_hydra_heads(dir.file("hydra"), sd::widen_hydra_heads(*hydra, 128));
  auto const wide_medusa = std::make_shared<sd::medusa_weights const>(
      sd::load_medusa_heads(dir.file("medusa"), wide->config));
  auto const wide_hydra = std::make_shared<sd::hydra_weights const>(
      sd::load_hydra_heads(dir.file("hydra"), wide->config));
  CHECK(wide_medusa->dim == 128);
  CHECK(wide_medusa->heads.size() == medusa->heads.size());
  CHECK(wide_hydra->heads.size() == hydra->heads.size());
  CHECK(sd::read_hydra_config(dir.file("hydra") / sd::heads_config_file).hidden_size == 128);

  sd::cpu_llama a = single_threaded(original), b = single_threaded(wide);
  sd::cpu_medusa_heads medusa_a(medusa), medusa_b(wide_medusa);
  sd::cpu_hydra_heads hydra_a(hydra, original), hydra_b(wide_hydra, wide);
  std::size_t const v = 512, k_medusa = medusa->heads.size(), k_hydra = hydra->heads.size();
  std::vector<float> la(k_medusa * v), lb(k_medusa * v);
  float worst = 0.0f;
  for (auto const& prompt : fixture::encoded_prompts()) {
    std::vector<float> const ha = final_hidden_of(a, prompt), hb = final_hidden_of(b, prompt);
    REQUIRE(ha.size() == 64);
    REQUIRE(hb.size() == 128);
    CHECK(std::all_of(hb.begin() + 64, hb.end(), [](float x) { return x == 0.0f; }));
    medusa_a.run(ha, sd::matrix_view<float>(la.data(), k_medusa, v));
    medusa_b.run(hb, sd::matrix_view<float>(lb.data(), k_medusa, v));
    row_gap const g = logits_gap(la, lb);
    CHECK(g.gap <= 1e-4f * std::max(1.0f, g.scale));
    worst = std::max(worst, g.gap);
    // Hydra head i on the path of the prompt's last i + 1 tokens.
    for (std::size_t i = 0; i < k_hydra && i + 1 <= prompt.size(); ++i) {
      CAPTURE(i);
      std::vector<sd::token_id> const path(prompt.end() - static_cast<std::ptrdiff_t>(i + 1),
                                           prompt.end());
      std::vector<float> ya(v), yb(v);
      sd::matrix_view<sd::token_id const> const paths(path.data(), 1, i + 1);
      hydra_a.run(i, ha, paths, sd::matrix_view<float>(ya.data(), 1, v));
      hydra_b.run(i, hb, paths, sd::matrix_view<float>(yb.data(), 1, v));
      row_gap const h = logits_gap(ya, yb);
      CHECK(h.gap <= 1e-4f * std::max(1.0f, h.scale));
      worst = std::max(worst, h.gap);
    }
  }
  MESSAGE("largest head logit difference over the 14 prompts: " << worst);
  CHECK_THROWS_AS((void)sd::widen_medusa_heads(*medusa, 32), sd::error);
}
