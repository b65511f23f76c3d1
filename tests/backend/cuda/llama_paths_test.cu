// cuda_llama's two paths and its weight dtypes: the fused small-batch kernels (norm folded into
// the products, RoPE + KV append, SwiGLU and the residual add in their epilogues) give the
// reference path's logits within float tolerance on every kind of forward (decode, chains, a tree
// mask, chosen logits rows, hidden rows, skipped layers); a captured graph replays them bit for bit
// at any cache length; greedy decoding of the fixture is the MANIFEST's on both paths; and f16 /
// bf16 weights stay within a stated distance of f32 (reported) on the fixture and at the
// TinyLlama-1.1B widths.
//
// Tolerances. Paths: |a - b| <= 2e-4 (1 + |b|), the tolerance of the CUDA model against the CPU
// backend (llama_test.cu): both are float32 throughout, only the order of the sums differs.
// Dtypes: the same forward run on the CPU backend with its matrices rounded to f16 / bf16 (what
// the fused path multiplies) differs from float32 by at most 0.0056 (f16) and 0.060 (bf16) in
// |a - b| / (1 + |b|) on the fixture, 0.0037 and 0.030 at the TinyLlama widths; the reference
// path also rounds the products' inputs, which about doubles that. The bounds, 0.03 (f16) and
// 0.25 (bf16), leave a factor of 2 to 5 above it.

#include "support/doctest.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <numeric>
#include <span>
#include <vector>

#include "backend/cuda/cpu_reference.hpp"
#include "backend/cuda/test_util.cuh"
#include "specdec/backend/cuda/llama.cuh"
#include "specdec/core/draft_tree.hpp"
#include "support/files.hpp"
#include "support/llama_shapes.hpp"

namespace {

namespace sd = specdec;
using sd::position_t;
using sd::token_id;

constexpr float paths_tol = 2e-4f;
constexpr double f16_tol = 0.03;
constexpr double bf16_tol = 0.25;

std::vector<position_t> iota_positions(std::size_t first, std::size_t n) {
  std::vector<position_t> p(n);
  std::iota(p.begin(), p.end(), static_cast<position_t>(first));
  return p;
}

// max |a - b| / (1 + |b|).
double max_rel(std::span<float const> a, std::span<float const> b) {
  REQUIRE(a.size() == b.size());
  double worst = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i)
    worst = std::max(worst, std::abs(static_cast<double>(a[i]) - b[i]) / (1.0 + std::abs(b[i])));
  return worst;
}

// One request of the sequence the paths are compared on, with what it asks for.
struct step {
  std::vector<token_id> tokens;
  std::vector<position_t> positions;
  std::vector<std::uint64_t> mask;
  std::size_t mask_stride = 0;
  std::vector<std::int32_t> rows;
  bool want_hidden = false;
  std::int32_t hidden_layer = -1;
  std::vector<std::int32_t> skip;

  [[nodiscard]] sd::forward_request request() const {
    sd::forward_request r;
    r.tokens = tokens;
    r.positions = positions;
    r.mask = mask;
    r.mask_stride = mask_stride;
    r.logits_rows = rows;
    r.want_hidden = want_hidden;
    r.hidden_layer = hidden_layer;
    r.skip_layers = skip;
    return r;
  }
};

// The forwards of a short decode: a prompt of 6, single tokens, a chain of 5, a tree of 8 with
// its mask, chosen logits rows, hidden rows, a skipped layer (each step's cache entries are kept).
std::vector<step> steps(std::int32_t vocab, std::int32_t n_layers) {
  std::vector<step> out;
  std::size_t at = 0;
  auto tok = [&](std::size_t i) { return static_cast<token_id>((i * 37 + 11) % vocab); };
  auto chain = [&](std::size_t n) {
    step s;
    for (std::size_t i = 0; i < n; ++i) s.tokens.push_back(tok(at + i));
    s.positions = iota_positions(at, n);
    at += n;
    return s;
  };
  out.push_back(chain(6));
  for (int i = 0; i < 3; ++i) out.push_back(chain(1));
  out.push_back(chain(5));
  {
    sd::draft_tree t(16);
    t.reset(tok(at));
    auto const a = t.add_node(0, tok(at + 1));
    auto const b = t.add_node(0, tok(at + 2));
    auto const c = t.add_node(a, tok(at + 3));
    t.add_node(a, tok(at + 4));
    auto const e = t.add_node(b, tok(at + 5));
    t.add_node(c, tok(at + 6));
    t.add_node(e, tok(at + 7));
    step s;
    s.tokens.assign(t.tokens().begin(), t.tokens().end());
    for (std::size_t i = 0; i < t.size(); ++i)
      s.positions.push_back(static_cast<position_t>(at) + t.depth(static_cast<sd::node_index>(i)));
    s.mask.assign(t.mask().begin(), t.mask().end());
    s.mask_stride = t.mask_stride();
    at += t.size();
    out.push_back(s);
  }
  {
    step s = chain(4);
    s.rows = {1, 3};
    s.want_hidden = true;
    s.hidden_layer = 1;
    out.push_back(s);
  }
  {
    step s = chain(3);
    s.skip = {n_layers / 2};
    out.push_back(s);
  }
  for (int i = 0; i < 3; ++i) out.push_back(chain(1));
  out.push_back(chain(12));  // beyond the fused kernels: the reference path in every model
  out.push_back(chain(1));
  return out;
}

// Runs `steps` on `m`, returning every result.
std::vector<sd::forward_result> run_steps(sd::cuda_llama& m, std::vector<step> const& all) {
  std::vector<sd::forward_result> out(all.size());
  m.reset();
  for (std::size_t i = 0; i < all.size(); ++i) m.forward(all[i].request(), out[i]);
  return out;
}

// Greedy decoding of `n` tokens after BOS + "Once upon a time" (the MANIFEST's reference).
std::vector<token_id> greedy_ids(sd::cuda_llama& m, std::size_t n) {
  std::vector<token_id> seq{1, 403, 407, 261, 378};
  m.reset();
  sd::forward_result out;
  {
    auto const pos = iota_positions(0, seq.size());
    std::vector<std::int32_t> const last{static_cast<std::int32_t>(seq.size() - 1)};
    sd::forward_request req;
    req.tokens = seq;
    req.positions = pos;
    req.logits_rows = last;
    m.forward(req, out);
  }
  while (seq.size() < n + 1) {
    std::span<float const> const row = out.logits_view().row(0);
    auto const next = static_cast<token_id>(std::max_element(row.begin(), row.end()) - row.begin());
    seq.push_back(next);
    token_id const t[1] = {next};
    position_t const p[1] = {static_cast<position_t>(seq.size() - 1)};
    sd::forward_request req;
    req.tokens = t;
    req.positions = p;
    m.forward(req, out);
  }
  return std::vector<token_id>(seq.begin() + 1, seq.end());
}

}  // namespace

TEST_CASE("cuda_llama: the fused kernels and their graphs give the reference path's forwards") {
  cuda_test::require_device();
  auto const dir = test_support::model_dir();
  std::vector<std::shared_ptr<sd::llama_weights const>> const models{
      cuda_test::load_weights(dir / "stories260K.bin"),
      cuda_test::random_weights(test_support::shapes::cuda_gqa(), 5, 0.1f)};
  for (auto const& w : models) {
    sd::llama_config const& c = w->config;
    CAPTURE(c.dim);
    REQUIRE(sd::cuda::fused_supported(c.dim, c.hidden_dim, c.kv_dim()));
    std::vector<step> const all = steps(c.vocab_size, c.n_layers);
    sd::cuda_llama reference(w, {.fused = false});
    sd::cuda_llama eager(w, {.graphs = false});
    sd::cuda_llama graphs(w);
    CHECK_FALSE(reference.fused_for(1, 1));
    CHECK(eager.fused_for(8, 8));
    CHECK_FALSE(eager.fused_for(9, 1));
    auto const want = run_steps(reference, all);
    auto const fused = run_steps(eager, all);
    auto const replayed = run_steps(graphs, all);
    std::size_t const captured = graphs.graphs_captured();
    CHECK(captured > 0);
    CHECK(eager.graphs_captured() == 0);
    // Running the steps again replays the graphs captured the first time (the single tokens
    // already replayed at three cache lengths).
    auto const again = run_steps(graphs, all);
    CHECK(graphs.graphs_captured() == captured);
    double worst = 0.0;
    for (std::size_t i = 0; i < all.size(); ++i) {
      CAPTURE(i);
      REQUIRE(fused[i].logits.size() == want[i].logits.size());
      double const d = max_rel(fused[i].logits, want[i].logits);
      worst = std::max(worst, d);
      CHECK(d <= paths_tol);
      CHECK(max_rel(fused[i].hidden, want[i].hidden) <= paths_tol);
      CHECK(max_rel(fused[i].layer_hidden, want[i].layer_hidden) <= paths_tol);
      // The same kernels with the same parameters: bit for bit, captured or not.
      CHECK(replayed[i].logits == fused[i].logits);
      CHECK(replayed[i].hidden == fused[i].hidden);
      CHECK(replayed[i].layer_hidden == fused[i].layer_hidden);
      CHECK(again[i].logits == fused[i].logits);
    }
    MESSAGE("fused vs reference path (dim " << c.dim << "): max relative difference " << worst
                                            << "; " << captured << " graphs captured");
  }
}

TEST_CASE("cuda_llama: greedy decoding of the fixture is the MANIFEST's on both paths") {
  cuda_test::require_device();
  auto const dir = test_support::model_dir();
  std::ifstream in(dir / "reference_greedy_once_upon_a_time.ids");
  std::vector<token_id> ref;
  for (token_id t; in >> t;) ref.push_back(t);
  REQUIRE(ref.size() == 256);
  auto const w = cuda_test::load_weights(dir / "stories260K.bin");
  sd::cuda_llama reference(w, {.max_context = 512, .fused = false});
  sd::cuda_llama fused(w, {.max_context = 512});
  CHECK(greedy_ids(reference, 256) == ref);
  CHECK(greedy_ids(fused, 256) == ref);
  CHECK(fused.graphs_captured() >= 1);
}

TEST_CASE("cuda_llama: f16 and bf16 weights stay near f32 (fixture, TinyLlama widths)") {
  cuda_test::require_device();
  auto const dir = test_support::model_dir();
  // TinyLlama-1.1B's widths (dim 2048, hidden 5632, 32 heads over 4 kv heads, vocab 32000) with
  // 2 of its 22 layers: random weights (std 0.02), as the benchmarks' shape.
  sd::llama_config tiny;
  tiny.dim = 2048;
  tiny.hidden_dim = 5632;
  tiny.n_layers = 2;
  tiny.n_heads = 32;
  tiny.n_kv_heads = 4;
  tiny.vocab_size = 32000;
  tiny.seq_len = 256;
  tiny.shared_classifier = false;
  struct model_case {
    char const* name;
    std::shared_ptr<sd::llama_weights const> w;
  };
  std::vector<model_case> const models{
      {"fixture", cuda_test::load_weights(dir / "stories260K.bin")},
      {"TinyLlama widths", cuda_test::random_weights(tiny, 5, 0.02f)}};
  for (model_case const& mc : models) {
    std::int32_t const vocab = mc.w->config.vocab_size;
    // A prompt of 59 tokens, then a chain of 5 (the fused path) and one of 12 (the reference).
    std::vector<token_id> prompt(59);
    for (std::size_t i = 0; i < prompt.size(); ++i)
      prompt[i] = static_cast<token_id>((i * 7919 + 1) % static_cast<std::size_t>(vocab));
    auto const run = [&](sd::cuda_llama& m) {
      std::vector<float> logits;
      m.reset();
      sd::forward_result out;
      auto const pos = iota_positions(0, prompt.size());
      m.forward({.tokens = prompt, .positions = pos}, out);
      logits.insert(logits.end(), out.logits.begin(), out.logits.end());
      for (std::size_t n : {5u, 12u}) {
        std::vector<token_id> const t(prompt.begin(), prompt.begin() + static_cast<long>(n));
        auto const p = iota_positions(m.cache().size(), n);
        m.forward({.tokens = t, .positions = p}, out);
        logits.insert(logits.end(), out.logits.begin(), out.logits.end());
      }
      return logits;
    };
    sd::cuda_llama f32(mc.w);
    std::vector<float> const want = run(f32);
    for (sd::weight_dtype t : {sd::weight_dtype::f16, sd::weight_dtype::bf16}) {
      for (bool fused : {true, false}) {
        sd::cuda_llama m(mc.w, {.dtype = t, .fused = fused});
        CHECK(m.dtype() == t);
        CHECK(m.weight_bytes() < f32.weight_bytes() / 2 + f32.weight_bytes() / 16);
        std::vector<float> const got = run(m);
        double const d = max_rel(got, want);
        double max_abs = 0.0;
        for (std::size_t i = 0; i < got.size(); ++i)
          max_abs = std::max(max_abs, std::abs(static_cast<double>(got[i]) - want[i]));
        MESSAGE(mc.name << ", " << sd::to_string(t) << (fused ? " fused" : " reference")
                        << " path: logits vs f32: max |diff| " << max_abs
                        << ", max |diff| / (1 + |f32|) " << d);
        CHECK(d <= (t == sd::weight_dtype::f16 ? f16_tol : bf16_tol));
      }
    }
  }
}

TEST_CASE("cuda_llama: device results, bad options and the step bytes") {
  cuda_test::require_device();
  auto const w = cuda_test::load_weights(test_support::model_file("stories260K.bin"));
  sd::cuda_llama m(w);
  std::vector<token_id> const t{1, 403, 407};
  auto const p = iota_positions(0, t.size());
  sd::cuda_forward_result dev;
  m.forward({.tokens = t, .positions = p}, dev);
  CHECK(dev.logits_count == 3);
  CHECK(dev.vocab == 512);
  CHECK(dev.logits_view().rows() == 3);
  // The same logits as a host result at the same cache length.
  std::vector<float> host(3 * 512);
  // The forward does not wait for the device, and the model's stream does not synchronise with
  // the legacy stream that cudaMemcpy runs on.
  SPECDEC_CUDA_CHECK(cudaStreamSynchronize(m.stream()));
  SPECDEC_CUDA_CHECK(cudaMemcpy(host.data(), dev.logits.data(), host.size() * sizeof(float),
                                cudaMemcpyDeviceToHost));
  m.reset();
  sd::forward_result out;
  m.forward({.tokens = t, .positions = p}, out);
  CHECK(out.logits == host);
  // A device result carries no hidden rows.
  CHECK_THROWS_AS(m.forward({.tokens = t, .positions = p, .want_hidden = true}, dev), sd::error);
  // The tied fixture: a step reads every weight.
  CHECK(m.step_bytes() == m.weight_bytes());
}
