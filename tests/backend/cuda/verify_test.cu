// The CUDA verifiers against the host verifiers (verify/*.hpp) on odd vocabularies and batch
// sizes: identical accepted paths, tokens and generator offsets for the same Philox inputs,
// except decisions within float rounding of their thresholds, which are counted and reported.

#include "support/doctest.hpp"

#include <algorithm>
#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "backend/cuda/host_verifiers.hpp"
#include "backend/cuda/test_util.cuh"
#include "specdec/backend/cuda/policy.cuh"
#include "specdec/backend/cuda/sampling.cuh"
#include "specdec/backend/cuda/verify.cuh"
#include "specdec/core/draft_tree.hpp"
#include "specdec/sampling/policy.hpp"

namespace {

using specdec::draft_tree;
using specdec::node_index;
using specdec::philox;
using specdec::token_id;
using specdec::verify_result;

enum class shape { chain, tree };

// A batch of trees with their target logits (rows in tree order) and histories.
struct batch_data {
  std::size_t vocab = 0;
  std::vector<draft_tree> trees;
  std::vector<float> logits;  // [total nodes, vocab]
  std::vector<std::vector<token_id>> histories;
  std::vector<std::int32_t> cu;
};

std::vector<float> softmax_of(std::span<float const> l) {
  float m = -INFINITY;
  for (float v : l) m = std::max(m, v);
  std::vector<float> p(l.size());
  double s = 0.0;
  for (std::size_t i = 0; i < l.size(); ++i) s += (p[i] = std::exp(l[i] - m));
  for (auto& v : p) v = static_cast<float>(v / s);
  return p;
}

token_id argmax_of(std::span<float const> l) {
  return static_cast<token_id>(std::max_element(l.begin(), l.end()) - l.begin());
}

// Draws from p with a uniform (inverse CDF).
token_id draw(std::vector<float> const& p, float u) {
  double s = 0.0;
  for (float v : p) s += v;
  double c = 0.0;
  for (std::size_t i = 0; i < p.size(); ++i) {
    c += p[i];
    if (c > u * s && p[i] > 0.0f) return static_cast<token_id>(i);
  }
  return static_cast<token_id>(p.size() - 1);
}

// Builds `batch` trees of about `nodes` nodes (chains: exactly nodes - 1 drafts). With q rows,
// children are drawn i.i.d. from q = softmax(target row + noise) (so acceptance is frequent);
// without, the first child is the row's argmax with probability 0.6 and the others are random.
batch_data make_batch(std::size_t vocab, std::size_t batch, std::size_t nodes, shape s, bool with_q,
                      std::uint32_t seed) {
  batch_data d;
  d.vocab = vocab;
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> unif(0.0f, 1.0f);
  std::uniform_int_distribution<token_id> tok(0, static_cast<token_id>(vocab - 1));
  std::normal_distribution<float> noise(0.0f, 0.7f);
  d.cu.push_back(0);
  for (std::size_t b = 0; b < batch; ++b) {
    // Target rows for up to `nodes` nodes (generated before the tree: rows depend on node only).
    std::vector<float> rows = cuda_test::random_logits(
        nodes, vocab, seed * 7919u + static_cast<std::uint32_t>(b), 2.0f, (b % 3) == 0);
    draft_tree t(nodes);
    t.reset(tok(gen));
    if (with_q) t.enable_q(vocab);
    std::vector<std::size_t> frontier{0};
    for (std::size_t at = 0; at < t.size() && t.size() < nodes; ++at) {
      auto const node = static_cast<node_index>(at);
      std::span<float const> row(rows.data() + at * vocab, vocab);
      std::size_t children = s == shape::chain ? 1 : 1 + gen() % 3;
      if (s == shape::tree && at > 0 && unif(gen) < 0.3f) children = 0;
      children = std::min(children, nodes - t.size());
      if (children == 0) continue;
      std::vector<float> q;
      if (with_q) {
        std::vector<float> l(row.begin(), row.end());
        for (auto& v : l) v += noise(gen);
        q = softmax_of(l);
        std::copy(q.begin(), q.end(), t.q_row(node).begin());
      }
      for (std::size_t c = 0; c < children; ++c) {
        token_id x;
        if (with_q) {
          x = draw(q, unif(gen));
        } else {
          x = (c == 0 && unif(gen) < 0.6f) ? argmax_of(row) : tok(gen);
          if (t.find_child(node, x) >= 0) continue;
        }
        t.add_node(node, x);
      }
      if (s == shape::chain && t.num_children(node) == 0) break;
    }
    d.logits.insert(d.logits.end(), rows.begin(),
                    rows.begin() + static_cast<std::ptrdiff_t>(t.size() * vocab));
    std::vector<token_id> h;
    for (std::size_t i = 0; i < 20 + b % 5; ++i) h.push_back(tok(gen));
    h.push_back(t.root());
    d.histories.push_back(std::move(h));
    d.trees.push_back(std::move(t));
    d.cu.push_back(
        static_cast<std::int32_t>(d.cu.back() + static_cast<std::int32_t>(d.trees.back().size())));
  }
  return d;
}

// History + the path to `node` (root excluded, node included), as a penalty-aware policy sees it.
std::vector<token_id> path_history(std::vector<token_id> const& committed, draft_tree const& t,
                                   node_index node) {
  std::vector<token_id> path;
  for (node_index a = node; a > 0; a = t.parent(a)) path.insert(path.begin(), t.token(a));
  std::vector<token_id> h = committed;
  h.insert(h.end(), path.begin(), path.end());
  return h;
}

struct tally {
  std::size_t sequences = 0;
  std::size_t exact = 0;
  std::size_t rounding = 0;
};

// Runs host and device on `d` and compares; mismatches must sit within rounding (margin < 1e-5).
template <class HostVerifier, class Policy>
tally compare(batch_data const& d, HostVerifier& host, Policy const& policy,
              specdec::cuda::device_policy const& dpol, specdec::cuda::verify_kind kind,
              bool as_probs, std::uint64_t seed) {
  std::size_t const batch = d.trees.size();
  std::size_t const rows = static_cast<std::size_t>(d.cu.back());
  std::vector<draft_tree const*> ptrs;
  for (auto const& t : d.trees) ptrs.push_back(&t);
  std::vector<std::span<token_id const>> hist;
  for (auto const& h : d.histories) hist.emplace_back(h);
  std::vector<philox> rng_host, rng_dev;
  for (std::size_t b = 0; b < batch; ++b) rng_host.emplace_back(seed, b, 1000 * b + 17);
  rng_dev = rng_host;
  std::vector<philox> const rng_start = rng_host;
  std::vector<verify_result> out_host(batch), out_dev(batch);

  // Target rows as the host sees them (logits, or the policy's distributions).
  std::vector<float> target = d.logits;
  if (as_probs) {
    for (std::size_t b = 0; b < batch; ++b) {
      for (std::size_t i = 0; i < d.trees[b].size(); ++i) {
        std::size_t const r = static_cast<std::size_t>(d.cu[b]) + i;
        std::span<float const> in(d.logits.data() + r * d.vocab, d.vocab);
        std::span<float> o(target.data() + r * d.vocab, d.vocab);
        policy.distribution(
            in, path_history(d.histories[b], d.trees[b], static_cast<node_index>(i)), o);
      }
    }
  }
  specdec::matrix_view<float const> view(target.data(), rows, d.vocab);
  if (as_probs) {
    host.verify_probs_batch(ptrs, view, d.cu, rng_host, out_host);
  } else {
    host.verify_batch(ptrs, view, d.cu, policy, hist, rng_host, out_host);
  }
  auto dev_target = cuda_test::upload(target);
  specdec::cuda::cuda_verifier dev(static_cast<std::int32_t>(d.vocab),
                                   static_cast<std::int32_t>(rows));
  dev.verify(kind, ptrs, dev_target.data(), static_cast<std::int64_t>(d.vocab), as_probs, dpol,
             hist, rng_dev, out_dev);

  tally t;
  t.sequences = batch;
  for (std::size_t b = 0; b < batch; ++b) {
    CHECK(rng_dev[b].offset() == rng_host[b].offset());
    if (cuda_test::same_result(out_host[b], out_dev[b])) {
      ++t.exact;
      continue;
    }
    // A disagreement: it must be a decision within rounding of its threshold.
    std::vector<std::vector<float>> p(d.trees[b].size(), std::vector<float>(d.vocab));
    for (std::size_t i = 0; i < d.trees[b].size(); ++i) {
      std::size_t const r = static_cast<std::size_t>(d.cu[b]) + i;
      std::span<float const> in(target.data() + r * d.vocab, d.vocab);
      if (as_probs)
        std::copy(in.begin(), in.end(), p[i].begin());
      else
        policy.distribution(
            in, path_history(d.histories[b], d.trees[b], static_cast<node_index>(i)), p[i]);
    }
    double const margin = cuda_test::walk_margin(d.trees[b], p, rng_start[b], out_host[b]);
    INFO("sequence " << b << ": host accepted " << out_host[b].num_accepted() << " bonus "
                     << out_host[b].bonus() << ", device accepted " << out_dev[b].num_accepted()
                     << " bonus " << out_dev[b].bonus() << ", decision margin " << margin);
    CHECK(margin < 1e-5);
    ++t.rounding;
  }
  return t;
}

void report(char const* what, tally const& t) {
  MESSAGE(std::string(what) << ": " << t.sequences << " sequences, " << t.exact << " identical, "
                            << t.rounding << " within rounding");
}

}  // namespace

TEST_CASE("cuda greedy verification equals greedy_verifier (chains and trees)") {
  cuda_test::require_device();
  specdec::greedy_verifier host;
  specdec::sampling_params gp;
  gp.temperature = 0.0f;
  specdec::sampler const policy(gp);
  specdec::cuda::device_sampler const dpol(gp);
  tally total;
  for (std::size_t vocab : cuda_test::vocabs()) {
    for (std::size_t batch : cuda_test::batches()) {
      if (vocab == 128256 && batch == 64) continue;  // covered by the chain test below
      for (shape s : {shape::chain, shape::tree}) {
        auto const d = make_batch(vocab, batch, s == shape::chain ? 5 : 24, s, false,
                                  static_cast<std::uint32_t>(vocab + batch));
        tally const t =
            compare(d, host, policy, dpol.policy(), specdec::cuda::verify_kind::greedy, false, 3);
        CHECK(t.rounding == 0);  // argmax has no rounding
        total.sequences += t.sequences;
        total.exact += t.exact;
      }
    }
  }
  auto const d = cuda_test::quick() ? make_batch(32000, 7, 5, shape::chain, false, 99)
                                    : make_batch(128256, 64, 5, shape::chain, false, 99);
  tally const t =
      compare(d, host, policy, dpol.policy(), specdec::cuda::verify_kind::greedy, false, 3);
  CHECK(t.rounding == 0);
  total.sequences += t.sequences;
  total.exact += t.exact;
  report("greedy", total);
}

TEST_CASE("cuda greedy verification with logit bias and penalties over history + path") {
  cuda_test::require_device();
  specdec::greedy_verifier host;
  specdec::sampling_params gp;
  gp.temperature = 0.0f;
  gp.repetition_penalty = 1.3f;
  gp.frequency_penalty = 0.4f;
  gp.presence_penalty = 0.2f;
  gp.logit_bias = {{5, 2.5f}, {7, -INFINITY}, {5, 1.0f}};
  specdec::sampler const policy(gp);
  specdec::cuda::device_sampler const dpol(gp);
  for (std::size_t vocab : {std::size_t{111}, std::size_t{32000}}) {
    auto const d = make_batch(vocab, 7, 24, shape::tree, false, 5);
    tally const t =
        compare(d, host, policy, dpol.policy(), specdec::cuda::verify_kind::greedy, false, 4);
    CHECK(t.exact == t.sequences);
  }
}

TEST_CASE("cuda speculative sampling on chains equals speculative_sampling_verifier") {
  cuda_test::require_device();
  specdec::speculative_sampling_verifier host;
  tally total;
  for (float temperature : {1.0f, 0.7f}) {
    specdec::sampling_params sp;
    sp.temperature = temperature;
    specdec::sampler const policy(sp);
    specdec::cuda::device_sampler const dpol(sp);
    for (std::size_t vocab : cuda_test::vocabs()) {
      for (std::size_t batch : cuda_test::batches()) {
        for (std::size_t k : {std::size_t{4}, std::size_t{8}}) {
          if (vocab == 128256 && batch == 64 && k == 8) continue;
          auto const d = make_batch(vocab, batch, k + 1, shape::chain, true,
                                    static_cast<std::uint32_t>(vocab * 3 + batch + k));
          tally const t = compare(d, host, policy, dpol.policy(),
                                  specdec::cuda::verify_kind::sampling, false, 11 + k);
          total.sequences += t.sequences;
          total.exact += t.exact;
          total.rounding += t.rounding;
        }
      }
    }
  }
  report("speculative sampling (chains, logits)", total);
}

TEST_CASE("cuda verification of given probabilities equals verify_probs") {
  cuda_test::require_device();
  specdec::sampling_params sp;
  specdec::sampler const policy(sp);
  specdec::cuda::device_sampler const dpol(sp);
  tally total;
  {
    specdec::speculative_sampling_verifier host;
    for (std::size_t vocab : {std::size_t{111}, std::size_t{128256}}) {
      auto const d = make_batch(vocab, 16, 5, shape::chain, true, 21);
      tally const t =
          compare(d, host, policy, dpol.policy(), specdec::cuda::verify_kind::sampling, true, 23);
      total.sequences += t.sequences;
      total.exact += t.exact;
      total.rounding += t.rounding;
    }
  }
  {
    specdec::tree_verifier host;
    for (bool q : {false, true}) {
      auto const d = make_batch(32000, 7, 24, shape::tree, q, 29);
      tally const t =
          compare(d, host, policy, dpol.policy(), specdec::cuda::verify_kind::sampling, true, 31);
      total.sequences += t.sequences;
      total.exact += t.exact;
      total.rounding += t.rounding;
    }
  }
  report("given probabilities", total);
}

TEST_CASE("cuda tree verification equals tree_verifier (point masses and sampled children)") {
  cuda_test::require_device();
  specdec::tree_verifier host;
  specdec::sampling_params sp;
  sp.temperature = 0.9f;
  specdec::sampler const policy(sp);
  specdec::cuda::device_sampler const dpol(sp);
  tally det, sampled;
  for (std::size_t vocab : cuda_test::vocabs()) {
    for (std::size_t batch : cuda_test::batches()) {
      std::size_t const nodes = vocab == 128256 && batch == 64 ? 16 : 64;
      for (bool q : {false, true}) {
        auto const d = make_batch(vocab, batch, nodes, shape::tree, q,
                                  static_cast<std::uint32_t>(vocab + 7 * batch + (q ? 1 : 0)));
        tally const t = compare(d, host, policy, dpol.policy(),
                                specdec::cuda::verify_kind::sampling, false, 41);
        tally& into = q ? sampled : det;
        into.sequences += t.sequences;
        into.exact += t.exact;
        into.rounding += t.rounding;
      }
    }
  }
  report("tree verification, point masses", det);
  report("tree verification, sampled children", sampled);
}

TEST_CASE("cuda verification under truncating and penalising policies") {
  cuda_test::require_device();
  tally total;
  std::vector<specdec::sampling_params> params(4);
  params[0].top_k = 50;
  params[1].top_p = 0.9f;
  params[2].min_p = 0.05f;
  params[2].temperature = 0.8f;
  params[3].top_k = 40;
  params[3].top_p = 0.95f;
  params[3].repetition_penalty = 1.2f;
  params[3].frequency_penalty = 0.3f;
  params[3].presence_penalty = 0.1f;
  params[3].logit_bias = {{3, 1.5f}};
  for (auto const& sp : params) {
    specdec::sampler const policy(sp);
    specdec::cuda::device_sampler const dpol(sp);
    specdec::speculative_sampling_verifier chain_host;
    specdec::tree_verifier tree_host;
    for (std::size_t vocab : {std::size_t{111}, std::size_t{32000}}) {
      auto const c = make_batch(vocab, 7, 5, shape::chain, true, 51);
      tally t = compare(c, chain_host, policy, dpol.policy(), specdec::cuda::verify_kind::sampling,
                        false, 53);
      total.sequences += t.sequences;
      total.exact += t.exact;
      total.rounding += t.rounding;
      auto const tr = make_batch(vocab, 7, 24, shape::tree, false, 57);
      t = compare(tr, tree_host, policy, dpol.policy(), specdec::cuda::verify_kind::sampling, false,
                  59);
      total.sequences += t.sequences;
      total.exact += t.exact;
      total.rounding += t.rounding;
    }
  }
  report("truncating / penalising policies", total);
}

TEST_CASE("cuda verification reports bad input as specdec::error and leaves generators alone") {
  cuda_test::require_device();
  specdec::sampling_params sp;
  specdec::cuda::device_sampler const dpol(sp);
  auto d = make_batch(111, 3, 5, shape::chain, true, 61);
  std::vector<draft_tree const*> ptrs;
  for (auto const& t : d.trees) ptrs.push_back(&t);
  std::vector<std::span<token_id const>> hist;
  for (auto const& h : d.histories) hist.emplace_back(h);
  std::vector<philox> rngs{philox(1, 0, 5), philox(1, 1, 5), philox(1, 2, 5)};
  std::vector<verify_result> out(3);
  specdec::cuda::cuda_verifier dev(111, 64);
  // NaN in the root row of sequence 1 (a row every walk reads).
  auto bad = d.logits;
  bad[static_cast<std::size_t>(d.cu[1]) * 111 + 4] = NAN;
  auto dbad = cuda_test::upload(bad);
  CHECK_THROWS_AS(dev.verify(specdec::cuda::verify_kind::sampling, ptrs, dbad.data(), 111, false,
                             dpol.policy(), hist, rngs, out),
                  specdec::error);
  CHECK(rngs[0].offset() == 5);
  // A token outside the vocabulary.
  auto good = cuda_test::upload(d.logits);
  std::vector<token_id> tokens(d.trees[2].tokens().begin(), d.trees[2].tokens().end());
  std::vector<node_index> parents(d.trees[2].parents().begin(), d.trees[2].parents().end());
  tokens[1] = 111;
  draft_tree const oob = draft_tree::from_parents(tokens, parents);
  std::vector<philox> r2{philox(1), philox(2)};
  std::vector<verify_result> o2(2);
  specdec::sampling_params gp;
  gp.temperature = 0.0f;
  specdec::cuda::device_sampler const greedy(gp);
  std::vector<draft_tree> plain;
  plain.push_back(draft_tree::chain(d.trees[0].root(), std::vector<token_id>{1, 2, 3, 4}));
  plain.push_back(oob);
  std::vector<draft_tree const*> p3{&plain[0], &plain[1]};
  CHECK_THROWS_AS(
      dev.verify(specdec::cuda::verify_kind::greedy, p3, good.data(), 111, false, greedy.policy(),
                 std::span<std::span<token_id const> const>(hist.data(), 2), r2, o2),
      specdec::error);
  CHECK(r2[0].offset() == 0);
}

TEST_CASE("cuda verification: padded layout equals ragged layout") {
  cuda_test::require_device();
  std::size_t const vocab = 32000, batch = 8, nodes = 5;
  auto const d = make_batch(vocab, batch, nodes, shape::chain, true, 71);
  for (auto const& t : d.trees) REQUIRE(t.size() == nodes);
  specdec::sampling_params sp;
  specdec::cuda::device_sampler const dpol(sp);
  std::vector<token_id> tokens;
  std::vector<float> q;
  for (auto const& t : d.trees) {
    tokens.insert(tokens.end(), t.tokens().begin(), t.tokens().end());
    auto const rows = t.q_rows();
    q.insert(q.end(), rows.data(), rows.data() + rows.rows() * vocab);
  }
  auto dl = cuda_test::upload(d.logits);
  auto dt = cuda_test::upload(tokens);
  auto dq = cuda_test::upload(q);
  auto dcu = cuda_test::upload(d.cu);
  std::vector<philox> rngs;
  for (std::size_t b = 0; b < batch; ++b) rngs.emplace_back(9, b, 3);
  specdec::cuda::sampling_workspace ws(static_cast<std::int32_t>(vocab), 64);
  std::vector<std::vector<std::int32_t>> results;
  for (bool padded : {false, true}) {
    auto drng = cuda_test::upload(rngs);
    specdec::cuda::device_buffer<std::int32_t> num(batch), nodes_out(batch * nodes), flags(batch);
    specdec::cuda::device_buffer<token_id> out(batch * nodes);
    flags.zero();
    out.zero();
    specdec::cuda::verify_inputs in;
    in.layout =
        padded ? specdec::cuda::ragged_layout::padded(static_cast<std::int32_t>(batch),
                                                      static_cast<std::int32_t>(nodes))
               : specdec::cuda::ragged_layout::ragged(dcu.data(), static_cast<std::int32_t>(batch),
                                                      static_cast<std::int32_t>(batch * nodes),
                                                      static_cast<std::int32_t>(nodes));
    in.vocab = static_cast<std::int32_t>(vocab);
    in.target = dl.data();
    in.target_stride = static_cast<std::int64_t>(vocab);
    in.tokens = dt.data();
    in.q = dq.data();
    in.q_stride = static_cast<std::int64_t>(vocab);
    in.rng = drng.data();
    in.num_accepted = num.data();
    in.accepted_nodes = nodes_out.data();
    in.out_tokens = out.data();
    in.error_flags = flags.data();
    specdec::cuda::throw_if_failed(specdec::cuda::launch_verify(in, dpol.policy(), ws, nullptr),
                                   "test");
    SPECDEC_CUDA_CHECK(cudaDeviceSynchronize());
    auto r = cuda_test::download(num, batch);
    auto o = cuda_test::download(out, batch * nodes);
    auto f = cuda_test::download(flags, batch);
    for (auto v : f) CHECK(v == 0);
    r.insert(r.end(), o.begin(), o.end());
    results.push_back(r);
  }
  CHECK(results[0] == results[1]);
}

// Chains given without parents (the launcher's "null = chains"), from logits under a plain
// temperature, take the one-launch kernel of chain_verify.cuh (rows shared by a cluster of blocks
// on capability 9.0): its results against the host verifiers (speculative sampling with q rows,
// point masses without), mismatches only within rounding; bad input flagged as the walk flags it.
TEST_CASE("cuda chain verification in one launch equals the host verifiers") {
  cuda_test::require_device();
  namespace sc = specdec::cuda;
  tally with_q_total, point_total;
  for (bool with_q : {true, false}) {
    for (float temperature : {1.0f, 0.7f}) {
      specdec::sampling_params sp;
      sp.temperature = temperature;
      specdec::sampler const policy(sp);
      sc::device_sampler const dpol(sp);
      for (std::size_t vocab : cuda_test::vocabs()) {
        for (std::size_t batch : cuda_test::batches()) {
          for (std::size_t k : {std::size_t{1}, std::size_t{4}, std::size_t{8}}) {
            if (vocab == 128256 && batch == 64 && k == 8) continue;
            auto const d = make_batch(vocab, batch, k + 1, shape::chain, with_q,
                                      static_cast<std::uint32_t>(vocab * 7 + batch + k));
            std::size_t const rows = static_cast<std::size_t>(d.cu.back());
            std::vector<token_id> tokens;
            std::vector<float> q(with_q ? rows * vocab : 0);
            std::int32_t max_rows = 0;
            for (std::size_t b = 0; b < batch; ++b) {
              draft_tree const& t = d.trees[b];
              tokens.insert(tokens.end(), t.tokens().begin(), t.tokens().end());
              max_rows = std::max(max_rows, static_cast<std::int32_t>(t.size()));
              if (with_q)
                for (std::size_t i = 0; i < t.size(); ++i) {
                  auto const row = t.q_rows().row(i);
                  std::copy(row.begin(), row.end(),
                            q.begin() + static_cast<std::ptrdiff_t>(
                                            (static_cast<std::size_t>(d.cu[b]) + i) * vocab));
                }
            }
            std::vector<philox> rngs;
            for (std::size_t b = 0; b < batch; ++b) rngs.emplace_back(23 + k, b, 100 * b + 3);
            auto dl = cuda_test::upload(d.logits);
            auto dt = cuda_test::upload(tokens);
            auto dcu = cuda_test::upload(d.cu);
            auto drng = cuda_test::upload(rngs);
            auto dq = cuda_test::upload(q);
            sc::device_buffer<std::int32_t> num(batch), nodes(rows), flags(batch);
            sc::device_buffer<token_id> out(rows);
            flags.zero();
            sc::verify_inputs in;
            in.layout = sc::ragged_layout::ragged(dcu.data(), static_cast<std::int32_t>(batch),
                                                  static_cast<std::int32_t>(rows), max_rows);
            in.vocab = static_cast<std::int32_t>(vocab);
            in.target = dl.data();
            in.target_stride = static_cast<std::int64_t>(vocab);
            in.tokens = dt.data();
            in.q = with_q ? dq.data() : nullptr;
            in.q_stride = static_cast<std::int64_t>(vocab);
            in.rng = drng.data();
            in.num_accepted = num.data();
            in.accepted_nodes = nodes.data();
            in.out_tokens = out.data();
            in.error_flags = flags.data();
            REQUIRE(sc::chain_verify_applies(in, dpol.policy()));
            sc::sampling_workspace ws(static_cast<std::int32_t>(vocab),
                                      static_cast<std::int32_t>(rows));
            sc::throw_if_failed(sc::launch_verify(in, dpol.policy(), ws, nullptr), "test");
            auto const got_num = cuda_test::download(num, batch);
            auto const got_nodes = cuda_test::download(nodes, rows);
            auto const got_out = cuda_test::download(out, rows);
            auto const got_rng = cuda_test::download(drng, batch, philox(0));
            for (auto f : cuda_test::download(flags, batch)) CHECK(f == 0);
            // The host.
            std::vector<draft_tree const*> ptrs;
            for (auto const& t : d.trees) ptrs.push_back(&t);
            std::vector<std::span<token_id const>> hist;
            for (auto const& h : d.histories) hist.emplace_back(h);
            std::vector<philox> rng_host = rngs;
            std::vector<verify_result> want(batch);
            specdec::matrix_view<float const> view(d.logits.data(), rows, vocab);
            if (with_q) {
              specdec::speculative_sampling_verifier host;
              host.verify_batch(ptrs, view, d.cu, policy, hist, rng_host, want);
            } else {
              specdec::tree_verifier host;
              host.verify_batch(ptrs, view, d.cu, policy, hist, rng_host, want);
            }
            tally& t = with_q ? with_q_total : point_total;
            for (std::size_t b = 0; b < batch; ++b) {
              ++t.sequences;
              CHECK(got_rng[b].offset() == rng_host[b].offset());
              verify_result dev;
              auto const first = static_cast<std::size_t>(d.cu[b]);
              auto const m = static_cast<std::size_t>(got_num[b]);
              dev.accepted_nodes.assign(got_nodes.begin() + static_cast<std::ptrdiff_t>(first),
                                        got_nodes.begin() + static_cast<std::ptrdiff_t>(first + m));
              dev.tokens.assign(got_out.begin() + static_cast<std::ptrdiff_t>(first),
                                got_out.begin() + static_cast<std::ptrdiff_t>(first + m + 1));
              if (cuda_test::same_result(want[b], dev)) {
                ++t.exact;
                continue;
              }
              std::vector<std::vector<float>> p(d.trees[b].size(), std::vector<float>(vocab));
              for (std::size_t i = 0; i < d.trees[b].size(); ++i)
                policy.distribution(
                    std::span<float const>(d.logits.data() + (first + i) * vocab, vocab), {}, p[i]);
              double const margin = cuda_test::walk_margin(d.trees[b], p, rngs[b], want[b]);
              INFO("vocab " << vocab << ", batch " << batch << ", k " << k << ", q " << with_q
                            << ", sequence " << b << ": decision margin " << margin);
              CHECK(margin < 1e-5);
              ++t.rounding;
            }
          }
        }
      }
    }
  }
  report("chain verification in one launch, q rows", with_q_total);
  report("chain verification in one launch, point masses", point_total);
}

TEST_CASE("cuda chain verification in one launch flags bad input and leaves generators alone") {
  cuda_test::require_device();
  namespace sc = specdec::cuda;
  specdec::sampling_params sp;
  sc::device_sampler const dpol(sp);
  constexpr std::int32_t vocab = 111, n = 4;
  std::vector<float> logits = cuda_test::random_logits(3 * n, vocab, 5, 2.0f, true);
  logits[static_cast<std::size_t>(n * vocab + 7)] = NAN;  // sequence 1's root row
  std::vector<token_id> tokens(3 * n, 3);
  tokens[2 * n + 2] = vocab;  // sequence 2: a token outside the vocabulary
  std::vector<philox> const rngs{philox(1, 0, 5), philox(1, 1, 5), philox(1, 2, 5)};
  auto dl = cuda_test::upload(logits);
  auto dt = cuda_test::upload(tokens);
  auto drng = cuda_test::upload(rngs);
  sc::device_buffer<std::int32_t> num(3), nodes(3 * n), flags(3);
  sc::device_buffer<token_id> out(3 * n);
  flags.zero();
  sc::verify_inputs in;
  in.layout = sc::ragged_layout::padded(3, n);
  in.vocab = vocab;
  in.target = dl.data();
  in.target_stride = vocab;
  in.tokens = dt.data();
  in.rng = drng.data();
  in.num_accepted = num.data();
  in.accepted_nodes = nodes.data();
  in.out_tokens = out.data();
  in.error_flags = flags.data();
  sc::throw_if_failed(sc::launch_verify_chain(in, dpol.policy(), nullptr), "test");
  auto const f = cuda_test::download(flags, 3);
  auto const after = cuda_test::download(drng, 3, philox(0));
  CHECK(f[0] == 0);
  CHECK(f[1] == sc::non_finite_logit);
  CHECK(f[2] == sc::token_out_of_range);
  CHECK(after[0].offset() == 5 + n);
  CHECK(after[1].offset() == 5);
  CHECK(after[2].offset() == 5);
  // Inputs it does not take.
  sc::verify_inputs trees = in;
  trees.parents = nodes.data();
  CHECK(sc::launch_verify_chain(trees, dpol.policy(), nullptr).code ==
        sc::status::invalid_argument);
  specdec::sampling_params topk;
  topk.top_k = 5;
  sc::device_sampler const truncating(topk);
  CHECK(sc::launch_verify_chain(in, truncating.policy(), nullptr).code ==
        sc::status::invalid_argument);
}
