// The CUDA Llama model: concept conformance, the stories260K greedy reference, tree forwards
// against the CPU backend and against path-by-path forwards, cache truncate / keep_path, hidden
// states, skipped layers, and bad input.

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
#include "specdec/backend/cuda/kv_cache.cuh"
#include "specdec/backend/cuda/llama.cuh"
#include "specdec/core/concepts.hpp"
#include "specdec/core/draft_tree.hpp"
#include "support/files.hpp"
#include "support/llama_shapes.hpp"

namespace {

namespace sd = specdec;
using sd::position_t;
using sd::token_id;

static_assert(sd::causal_lm<sd::cuda_llama>);
static_assert(sd::kv_cache<sd::cuda_kv_cache>);

// Relative tolerance of CUDA logits against the CPU backend (float32 both; different summation
// orders in the matrix products and attention): |a - b| <= tol * (1 + |b|).
constexpr float logits_tol = 2e-4f;

std::vector<token_id> read_ids(std::filesystem::path const& p) {
  std::ifstream in(p);
  REQUIRE_MESSAGE(in.good(), "cannot read " << p);
  std::vector<token_id> ids;
  for (token_id t; in >> t;) ids.push_back(t);
  return ids;
}

std::vector<position_t> iota_positions(std::size_t first, std::size_t n) {
  std::vector<position_t> p(n);
  std::iota(p.begin(), p.end(), static_cast<position_t>(first));
  return p;
}

token_id argmax(std::span<float const> row) {
  return static_cast<token_id>(std::max_element(row.begin(), row.end()) - row.begin());
}

float max_rel_diff(std::span<float const> a, std::span<float const> b) {
  REQUIRE(a.size() == b.size());
  float worst = 0.0f;
  for (std::size_t i = 0; i < a.size(); ++i)
    worst = std::max(worst, std::abs(a[i] - b[i]) / (1.0f + std::abs(b[i])));
  return worst;
}

void prefill(sd::cuda_llama& m, std::span<token_id const> prefix, sd::forward_result& out) {
  auto const pos = iota_positions(0, prefix.size());
  sd::forward_request req;
  req.tokens = prefix;
  req.positions = pos;
  m.forward(req, out);
}

// A small tree over `base` committed tokens: node tokens, parents, mask and positions.
struct tree_batch {
  sd::draft_tree tree;
  std::vector<position_t> positions;
};

tree_batch make_tree(std::size_t base, std::int32_t vocab) {
  tree_batch t{sd::draft_tree(16), {}};
  t.tree.reset(7 % vocab);
  auto const a = t.tree.add_node(0, 11 % vocab);
  auto const b = t.tree.add_node(0, 13 % vocab);
  auto const c = t.tree.add_node(a, 17 % vocab);
  t.tree.add_node(a, 19 % vocab);
  auto const e = t.tree.add_node(b, 23 % vocab);
  t.tree.add_node(c, 29 % vocab);
  t.tree.add_node(e, 31 % vocab);
  t.tree.add_node(e, 37 % vocab);
  for (std::size_t i = 0; i < t.tree.size(); ++i)
    t.positions.push_back(static_cast<position_t>(base) +
                          t.tree.depth(static_cast<sd::node_index>(i)));
  return t;
}

sd::forward_request tree_request(tree_batch const& t) {
  sd::forward_request req;
  req.tokens = t.tree.tokens();
  req.positions = t.positions;
  req.mask = t.tree.mask();
  req.mask_stride = t.tree.mask_stride();
  return req;
}

}  // namespace

TEST_CASE("cuda_llama: stories260K greedy decoding reproduces the reference ids (.bin and .gguf)") {
  cuda_test::require_device();
  auto const dir = test_support::model_dir();
  auto const ref = read_ids(dir / "reference_greedy_once_upon_a_time.ids");
  REQUIRE(ref.size() == 256);
  for (char const* file : {"stories260K.bin", "stories260K.gguf"}) {
    INFO(file);
    auto const w = cuda_test::load_weights(dir / file);
    // The GGUF export declares a 128-token context; RoPE positions run to 256 here, as in the
    // reference, so the cache is sized explicitly.
    sd::cuda_llama m(w, {.max_context = 512});
    CHECK(m.vocab_size() == 512);
    CHECK(m.max_context() == 512);
    std::vector<token_id> seq{1, 403, 407, 261, 378};  // BOS + encode("Once upon a time")
    std::vector<std::int32_t> const last{4};
    auto const pos = iota_positions(0, seq.size());
    sd::forward_request req;
    req.tokens = seq;
    req.positions = pos;
    req.logits_rows = last;
    sd::forward_result out;
    m.forward(req, out);  // prefill in one batched forward
    REQUIRE(out.logits_count == 1);
    while (seq.size() < 257) {
      token_id const next = argmax(out.logits_view().row(0));
      seq.push_back(next);
      if (seq.size() == 257) break;
      token_id const tok[1] = {next};
      position_t const p[1] = {static_cast<position_t>(seq.size() - 1)};
      sd::forward_request step;
      step.tokens = tok;
      step.positions = p;
      m.forward(step, out);
    }
    std::vector<token_id> const got(seq.begin() + 1, seq.end());
    CHECK(got == ref);
    CHECK(m.cache().size() == 256);
  }
}

TEST_CASE("cuda_llama: a tree forward equals the CPU backend and path-by-path forwards") {
  cuda_test::require_device();
  auto const dir = test_support::model_dir();
  std::vector<std::shared_ptr<sd::llama_weights const>> models{
      cuda_test::load_weights(dir / "stories260K.bin"),
      cuda_test::random_weights(test_support::shapes::cuda_gqa(), 5, 0.1f)};
  for (auto const& w : models) {
    std::int32_t const vocab = w->config.vocab_size;
    std::vector<token_id> const prefix{1,          40 % vocab, 41 % vocab,
                                       42 % vocab, 43 % vocab, 44 % vocab};
    tree_batch const t = make_tree(prefix.size(), vocab);
    sd::forward_request const req = tree_request(t);
    sd::cuda_llama m(w);
    sd::forward_result pre, got;
    prefill(m, prefix, pre);
    m.forward(req, got);
    CHECK(m.cache().size() == prefix.size() + t.tree.size());
    REQUIRE(got.logits_count == t.tree.size());

    // Against the CPU backend (same request after the same prefix).
    sd::forward_result const cpu = cuda_test::cpu_forward(w, prefix, req);
    float const d = max_rel_diff(got.logits, cpu.logits);
    MESSAGE("tree forward vs CPU backend (vocab " << vocab << "): max relative difference " << d);
    CHECK(d <= logits_tol);

    // Against each root-to-node path run on its own (causal) after the prefix.
    for (std::size_t i = 0; i < t.tree.size(); ++i) {
      std::vector<token_id> path;
      for (auto a = static_cast<sd::node_index>(i); a >= 0; a = t.tree.parent(a))
        path.insert(path.begin(), t.tree.token(a));
      sd::cuda_llama single(w);
      sd::forward_result tmp, one;
      prefill(single, prefix, tmp);
      auto const pos = iota_positions(prefix.size(), path.size());
      std::vector<std::int32_t> const last{static_cast<std::int32_t>(path.size() - 1)};
      sd::forward_request pr;
      pr.tokens = path;
      pr.positions = pos;
      pr.logits_rows = last;
      single.forward(pr, one);
      CHECK(max_rel_diff(got.logits_view().row(i), one.logits_view().row(0)) <= logits_tol);
    }
  }
}

TEST_CASE("cuda_llama: keep_path and truncate then forward equal recomputing from scratch") {
  cuda_test::require_device();
  auto const dir = test_support::model_dir();
  auto const w = cuda_test::load_weights(dir / "stories260K.bin");
  std::vector<token_id> const prefix{1, 403, 407, 261, 378};
  tree_batch const t = make_tree(prefix.size(), 512);
  sd::cuda_llama m(w);
  sd::forward_result out;
  prefill(m, prefix, out);
  m.forward(tree_request(t), out);
  // Keep the path root -> b -> e -> node 8 (nodes 0, 2, 5, 8).
  std::vector<std::int32_t> const keep{0, 2, 5, 8};
  m.cache().keep_path(prefix.size(), keep);
  CHECK(m.cache().size() == prefix.size() + keep.size());
  std::vector<token_id> full = prefix;
  for (auto k : keep) full.push_back(t.tree.token(k));
  token_id const next[1] = {99};
  position_t const npos[1] = {static_cast<position_t>(full.size())};
  sd::forward_request step;
  step.tokens = next;
  step.positions = npos;
  sd::forward_result a, b;
  m.forward(step, a);
  sd::cuda_llama fresh(w);
  prefill(fresh, full, b);
  fresh.forward(step, b);
  CHECK(max_rel_diff(a.logits, b.logits) <= logits_tol);

  // truncate back to the prefix + 2 and continue.
  m.cache().truncate(prefix.size() + 2);
  sd::forward_result c, e;
  position_t const p2[1] = {static_cast<position_t>(prefix.size() + 2)};
  step.positions = p2;
  m.forward(step, c);
  std::vector<token_id> shorter(full.begin(),
                                full.begin() + static_cast<std::ptrdiff_t>(prefix.size() + 2));
  sd::cuda_llama fresh2(w);
  prefill(fresh2, shorter, e);
  fresh2.forward(step, e);
  CHECK(max_rel_diff(c.logits, e.logits) <= logits_tol);
}

TEST_CASE("cuda_llama: hidden states, logits rows and skipped layers match the CPU backend") {
  cuda_test::require_device();
  auto const dir = test_support::model_dir();
  auto const w = cuda_test::load_weights(dir / "stories260K.bin");
  std::vector<token_id> const prefix{1, 403, 407};
  std::vector<token_id> const toks{261, 378, 300};
  std::vector<token_id> all = prefix;
  all.insert(all.end(), toks.begin(), toks.end());
  auto const pos = iota_positions(prefix.size(), toks.size());
  auto const ppos = iota_positions(0, prefix.size());
  auto const apos = iota_positions(0, all.size());
  std::vector<std::int32_t> const rows{2, 0};
  std::vector<std::int32_t> const arows{static_cast<std::int32_t>(prefix.size() + 2),
                                        static_cast<std::int32_t>(prefix.size())};
  std::vector<std::int32_t> const skip{1, 3};
  std::size_t const dim = static_cast<std::size_t>(w->config.dim);
  for (bool skipping : {false, true}) {
    INFO("skip layers: " << skipping);
    std::span<std::int32_t const> const sk =
        skipping ? std::span<std::int32_t const>(skip) : std::span<std::int32_t const>();
    // CUDA: the prefix, then the batch (a cache always sees the same skip set).
    sd::cuda_llama m(w);
    sd::forward_result pre, got;
    sd::forward_request p;
    p.tokens = prefix;
    p.positions = ppos;
    p.skip_layers = sk;
    m.forward(p, pre);
    sd::forward_request req;
    req.tokens = toks;
    req.positions = pos;
    req.logits_rows = rows;
    req.want_hidden = true;
    req.hidden_layer = 2;
    req.skip_layers = sk;
    m.forward(req, got);
    // CPU: the whole sequence in one causal forward with the same rows.
    sd::forward_request r2 = req;
    r2.tokens = all;
    r2.positions = apos;
    r2.logits_rows = arows;
    sd::forward_result const cpu = cuda_test::cpu_forward(w, {}, r2);
    REQUIRE(got.logits_count == 2);
    CHECK(max_rel_diff(got.logits, cpu.logits) <= logits_tol);
    REQUIRE(got.hidden.size() == toks.size() * dim);
    REQUIRE(cpu.hidden.size() == all.size() * dim);
    CHECK(
        max_rel_diff(got.hidden, std::span<float const>(cpu.hidden).subspan(prefix.size() * dim)) <=
        logits_tol);
    CHECK(max_rel_diff(got.layer_hidden,
                       std::span<float const>(cpu.layer_hidden).subspan(prefix.size() * dim)) <=
          logits_tol);
  }
}

TEST_CASE("cuda_llama: bad input is reported as specdec::error") {
  cuda_test::require_device();
  auto const dir = test_support::model_dir();
  auto const w = cuda_test::load_weights(dir / "stories260K.bin");
  sd::cuda_llama m(w, {.max_context = 8});
  sd::forward_result out;
  std::vector<token_id> tok{1, 2};
  std::vector<position_t> pos{0, 1};
  sd::forward_request req;
  req.tokens = tok;
  req.positions = pos;
  tok[1] = 512;
  CHECK_THROWS_AS(m.forward(req, out), sd::error);
  tok[1] = 2;
  pos[1] = 8;
  CHECK_THROWS_AS(m.forward(req, out), sd::error);
  pos[1] = 1;
  std::vector<std::uint64_t> mask{1};
  req.mask = mask;
  req.mask_stride = 1;  // one word per row but the mask holds one row only
  CHECK_THROWS_AS(m.forward(req, out), sd::error);
  req.mask = {};
  req.mask_stride = 0;
  m.forward(req, out);
  CHECK(m.cache().size() == 2);
  std::vector<token_id> many(7, 3);
  auto const mpos = iota_positions(2, 7);
  sd::forward_request big;
  big.tokens = many;
  big.positions = mpos;
  CHECK_THROWS_AS(m.forward(big, out), sd::error);  // 2 + 7 > 8
  std::vector<std::int32_t> const bad_keep{1, 0};
  CHECK_THROWS_AS(m.cache().keep_path(0, bad_keep), sd::error);
  std::vector<std::int32_t> const far{5};
  CHECK_THROWS_AS(m.cache().keep_path(0, far), sd::error);
  CHECK_THROWS_AS(m.cache().truncate(3), sd::error);
  CHECK(m.cache().size() == 2);
  m.reset();
  CHECK(m.cache().size() == 0);
}
