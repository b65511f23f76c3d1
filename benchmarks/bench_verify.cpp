// Verifier microbenchmarks: every verifier at vocab 32000, 128256 and 151936, on chains of
// k = 1, 4, 8 and on trees of 16 and 64 nodes, for one sequence and for a ragged batch of 32,
// through the logits entry point (with the sampling policy) and the probability entry point
// (rows already distributions, as an engine with a fused softmax has them).
//
// Counters (per benchmark, measured in the same run):
//   ns_per_row   time per target row the verifier had to process (rows on the accepted path)
//   GB/s         bytes it must read (those rows' logits, plus the q row where a rejection
//                needs the residual; for the probability entry point only the rows of the final
//                draw) over its time
//   x_memcpy     its time over a memcpy of those bytes (the bandwidth floor)
//   ref_speedup  time of the reference implementation (reference/verify.hpp with the reference
//                sampling path, double precision; single sequences only) over its time
//   accepted     draft tokens accepted per sequence
//
// Bars: chain verification with given probabilities at k = 4, vocab 128256 within 3x of memcpy;
// every verifier >= 10x faster than its reference at vocab 128256.

#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "specdec/reference/verify.hpp"
#include "specdec/sampling/policy.hpp"
#include "specdec/verify/greedy.hpp"
#include "specdec/verify/speculative_sampling.hpp"
#include "specdec/verify/tree_sampling.hpp"
#include "specdec/verify/typical_acceptance.hpp"

namespace {

using specdec::draft_tree;
using specdec::matrix_view;
using specdec::node_index;
using specdec::philox;
using specdec::token_id;
using specdec::verify_result;
using clock_type = std::chrono::steady_clock;

std::uint64_t mix(std::uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return x;
}
float unit(std::uint64_t h) {
  return static_cast<float>(h >> 40) * (1.0f / 16777216.0f);
}

enum class which { greedy, speculative, tree, typical };
enum class entry { logits, probs };

// One sequence's inputs.
struct sequence {
  draft_tree tree{1};
  std::vector<token_id> history;
};

// A batch of sequences with their rows, built once per benchmark.
struct workload {
  std::size_t vocab = 0;
  std::vector<sequence> seqs;
  std::vector<float> logits;  // [rows, vocab]
  std::vector<float> probs;   // [rows, vocab], the policy's distributions
  std::vector<std::int32_t> cu{0};
  std::vector<draft_tree const*> trees;
  std::vector<std::span<token_id const>> histories;

  [[nodiscard]] std::size_t rows() const { return static_cast<std::size_t>(cu.back()); }
  [[nodiscard]] matrix_view<float const> seq_rows(std::vector<float> const& m,
                                                  std::size_t b) const {
    return matrix_view<float const>(m.data() + static_cast<std::size_t>(cu[b]) * vocab,
                                    seqs[b].tree.size(), vocab);
  }
};

// A realistic logits row: N(0, 2)-like noise plus a few spikes.
void fill_row(float* row, std::size_t vocab, std::uint64_t seed) {
  for (std::size_t v = 0; v < vocab; ++v) {
    std::uint64_t const h = mix(seed * 0x9e3779b97f4a7c15ULL + v);
    float const a = unit(h), b = unit(mix(h)), c = unit(mix(h + 1)), d = unit(mix(h + 2));
    row[v] = 2.0f * (a + b + c + d - 2.0f) * 1.7f;
  }
  for (int s = 0; s < 8; ++s) row[mix(seed + 100 + static_cast<std::uint64_t>(s)) % vocab] += 9.0f;
}

// Tree shapes: a chain of `k` drafts, or a tree of `n` nodes with fan-out 4, 3, 2, 1, 1, ... by
// depth (filled breadth first).
draft_tree make_shape(bool chain, std::size_t size, std::size_t vocab, bool with_q,
                      std::uint64_t seed) {
  std::size_t const nodes = chain ? size + 1 : size;
  draft_tree t(nodes);
  if (with_q) t.enable_q(vocab);
  t.reset(static_cast<token_id>(mix(seed) % vocab));
  static constexpr int fanout[] = {4, 3, 2, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
  std::size_t at = 0;
  while (t.size() < nodes) {
    auto const parent = static_cast<node_index>(at);
    int const f =
        chain ? 1 : fanout[std::min<std::size_t>(static_cast<std::size_t>(t.depth(parent)), 15)];
    for (int c = 0; c < f && t.size() < nodes; ++c) {
      token_id tok = 0;
      do {
        tok = static_cast<token_id>(mix(seed + t.size() * 7919 + static_cast<std::uint64_t>(c)) %
                                    vocab);
        seed += 1;
      } while (t.find_child(parent, tok) >= 0);
      t.add_node(parent, tok);
    }
    ++at;
  }
  return t;
}

// Builds `batch` sequences. Along the first-child path every target row strongly prefers the
// child, so the walk goes deep (the usual, expensive case); `reject_first` makes the first draft
// impossible under the target instead (p = 0), so verification stops at the root.
template <class Policy>
workload make_workload(std::size_t vocab, bool chain, std::size_t size, std::size_t batch,
                       bool with_q, bool reject_first, Policy const& policy) {
  workload w;
  w.vocab = vocab;
  w.seqs.resize(batch);
  std::size_t total = 0;
  for (std::size_t b = 0; b < batch; ++b) {
    // Ragged: sizes vary around `size` in a batch.
    auto const ragged = static_cast<std::int64_t>(size) - static_cast<std::int64_t>(b % 3) +
                        static_cast<std::int64_t>(b % 2);
    std::size_t const sz =
        batch == 1 ? size : static_cast<std::size_t>(std::max<std::int64_t>(1, ragged));
    w.seqs[b].tree =
        make_shape(chain, chain ? sz : std::max<std::size_t>(sz, 2), vocab, with_q, 1000 + b);
    total += w.seqs[b].tree.size();
    w.cu.push_back(static_cast<std::int32_t>(total));
  }
  w.logits.resize(total * vocab);
  w.probs.resize(total * vocab);
  for (std::size_t b = 0; b < batch; ++b) {
    auto& s = w.seqs[b];
    for (int i = 0; i < 12; ++i)
      s.history.push_back(
          static_cast<token_id>(mix(b * 31 + static_cast<std::uint64_t>(i)) % vocab));
    s.history.push_back(s.tree.root());
    for (std::size_t i = 0; i < s.tree.size(); ++i) {
      float* row = w.logits.data() + (static_cast<std::size_t>(w.cu[b]) + i) * vocab;
      fill_row(row, vocab, b * 7777 + i);
      auto const node = static_cast<node_index>(i);
      node_index const first = s.tree.first_child(node);
      if (first >= 0) {
        float const mx = *std::max_element(row, row + vocab);
        row[static_cast<std::size_t>(s.tree.token(first))] = mx + 6.0f;
        if (reject_first && i == 0)
          row[static_cast<std::size_t>(s.tree.token(first))] =
              -std::numeric_limits<float>::infinity();
      }
    }
  }
  // q rows: the draft's distribution, the target's own distribution with a flatter temperature.
  specdec::sampling_params qp;
  qp.temperature = 1.3f;
  specdec::sampler const draft_policy(qp);
  for (std::size_t b = 0; b < batch; ++b) {
    auto& s = w.seqs[b];
    auto const rows = w.seq_rows(w.logits, b);
    for (std::size_t i = 0; i < s.tree.size(); ++i) {
      std::vector<token_id> h = s.history;
      std::vector<token_id> path;
      for (auto a = static_cast<node_index>(i); a > 0; a = s.tree.parent(a))
        path.push_back(s.tree.token(a));
      h.insert(h.end(), path.rbegin(), path.rend());
      float* p = w.probs.data() + (static_cast<std::size_t>(w.cu[b]) + i) * vocab;
      policy.distribution(rows.row(i), h, std::span<float>(p, vocab));
      if (with_q)
        draft_policy.distribution(rows.row(i), h, s.tree.q_row(static_cast<node_index>(i)));
    }
  }
  for (auto const& s : w.seqs) {
    w.trees.push_back(&s.tree);
    w.histories.emplace_back(s.history);
  }
  return w;
}

template <class V>
void verify_one(V& v, workload const& w, std::size_t b, entry e, specdec::sampler const& policy,
                philox& rng, verify_result& out) {
  if (e == entry::logits)
    v.verify(w.seqs[b].tree, w.seq_rows(w.logits, b), policy, w.seqs[b].history, rng, out);
  else
    v.verify_probs(w.seqs[b].tree, w.seq_rows(w.probs, b), rng, out);
}

// The rows (and bytes) a verifier must read for the outcome `out` of sequence `s`.
struct must_read {
  std::size_t rows = 0;   // target rows processed (accepted path + the last node)
  std::size_t bytes = 0;  // bytes that must be read
};
must_read bytes_for(sequence const& s, verify_result const& out, std::size_t vocab, entry e,
                    which kind) {
  must_read m;
  m.rows = out.num_accepted() + 1;
  node_index const last = out.last_node();
  bool const residual_q = s.tree.has_q() && s.tree.num_children(last) > 0 &&
                          kind != which::greedy && kind != which::typical;
  std::size_t const row = vocab * sizeof(float);
  if (e == entry::logits)
    m.bytes = m.rows * row + (residual_q ? row : 0);
  else
    m.bytes = kind == which::greedy ? m.rows * row : row + (residual_q ? row : 0);
  return m;
}

double memcpy_seconds(std::size_t bytes) {
  static std::vector<char> src, dst;
  if (src.size() < bytes) {
    src.assign(bytes, 1);
    dst.assign(bytes, 0);
  }
  double best = 1e30;
  for (int rep = 0; rep < 30; ++rep) {
    auto const t0 = clock_type::now();
    std::memcpy(dst.data(), src.data(), bytes);
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
    best = std::min(best, std::chrono::duration<double>(clock_type::now() - t0).count());
  }
  return best;
}

// The reference on one sequence, reference sampling path included.
verify_result reference_one(which kind, sequence const& s, matrix_view<float const> logits,
                            matrix_view<float const> probs, entry e,
                            specdec::reference::policy const& ref_policy, philox& rng) {
  namespace ref = specdec::reference;
  if (kind == which::greedy) {
    if (e == entry::logits) return ref::greedy(s.tree, logits, ref_policy, s.history, rng);
    return ref::greedy(s.tree, ref::to_double(probs), rng);
  }
  auto const p = e == entry::logits
                     ? ref::target_distributions(s.tree, logits, ref_policy, s.history)
                     : ref::to_double(probs);
  if (kind == which::typical) return ref::typical_acceptance(s.tree, p, 0.09, 0.3, rng);
  return ref::tree_sampling(s.tree, p, rng);
}

template <class V>
void run(benchmark::State& state, which kind, entry e, bool chain, bool with_q, bool reject_first) {
  auto const vocab = static_cast<std::size_t>(state.range(0));
  auto const size = static_cast<std::size_t>(state.range(1));
  auto const batch = static_cast<std::size_t>(state.range(2));
  specdec::sampling_params params;
  params.temperature = kind == which::greedy ? 0.0f : 0.8f;
  specdec::sampler const policy(params);
  workload const w = make_workload(vocab, chain, size, batch, with_q, reject_first, policy);
  V v;
  std::vector<philox> rngs;
  for (std::size_t b = 0; b < batch; ++b) rngs.emplace_back(42, b);
  std::vector<verify_result> out(batch);
  // Warm-up, and the outcome (deterministic: every iteration starts from the same words).
  must_read total;
  std::size_t accepted = 0;
  for (std::size_t b = 0; b < batch; ++b) {
    philox r = rngs[b];
    verify_one(v, w, b, e, policy, r, out[b]);
    must_read const m = bytes_for(w.seqs[b], out[b], vocab, e, kind);
    total.rows += m.rows;
    total.bytes += m.bytes;
    accepted += out[b].num_accepted();
  }
  std::vector<philox> work = rngs;
  auto const step = [&] {
    std::copy(rngs.begin(), rngs.end(), work.begin());
    if (batch == 1) {
      verify_one(v, w, 0, e, policy, work[0], out[0]);
    } else if (e == entry::logits) {
      v.verify_batch(w.trees, matrix_view<float const>(w.logits.data(), w.rows(), vocab), w.cu,
                     policy, w.histories, work, out);
    } else {
      v.verify_probs_batch(w.trees, matrix_view<float const>(w.probs.data(), w.rows(), vocab), w.cu,
                           work, out);
    }
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  };
  for (auto _ : state) step();
  // Ratios from the fastest of repeated runs on each side: robust on a shared, noisy machine.
  double seconds = 1e30;
  for (int rep = 0; rep < 30; ++rep) {
    auto const t0 = clock_type::now();
    step();
    seconds = std::min(seconds, std::chrono::duration<double>(clock_type::now() - t0).count());
  }
  state.counters["ns_per_row"] = seconds * 1e9 / static_cast<double>(total.rows);
  state.counters["GB/s"] = static_cast<double>(total.bytes) / seconds * 1e-9;
  state.counters["x_memcpy"] = seconds / memcpy_seconds(total.bytes);
  state.counters["accepted"] = static_cast<double>(accepted) / static_cast<double>(batch);
  if (batch == 1) {
    specdec::reference::policy const ref_policy(params);
    double best = 1e30;
    for (int rep = 0; rep < 2; ++rep) {
      philox r = rngs[0];
      auto const r0 = clock_type::now();
      verify_result const slow = reference_one(kind, w.seqs[0], w.seq_rows(w.logits, 0),
                                               w.seq_rows(w.probs, 0), e, ref_policy, r);
      benchmark::DoNotOptimize(slow.tokens.data());
      best = std::min(best, std::chrono::duration<double>(clock_type::now() - r0).count());
    }
    state.counters["ref_speedup"] = best / seconds;
  }
}

constexpr std::int64_t vocabs[] = {32000, 128256, 151936};

void chain_args(benchmark::internal::Benchmark* b) {
  for (auto v : vocabs)
    for (std::int64_t k : {1, 4, 8})
      for (std::int64_t batch : {1, 32}) b->Args({v, k, batch});
  b->ArgNames({"vocab", "k", "batch"})->Unit(benchmark::kMicrosecond);
}
void tree_args(benchmark::internal::Benchmark* b) {
  for (auto v : vocabs)
    for (std::int64_t n : {16, 64})
      for (std::int64_t batch : {1, 32}) b->Args({v, n, batch});
  b->ArgNames({"vocab", "nodes", "batch"})->Unit(benchmark::kMicrosecond);
}
void bar_args(benchmark::internal::Benchmark* b) {
  b->Args({128256, 4, 1})->ArgNames({"vocab", "k", "batch"})->Unit(benchmark::kMicrosecond);
}

// Greedy verification (greedy policy), chains and trees.
void BM_greedy_chain(benchmark::State& s) {
  run<specdec::greedy_verifier>(s, which::greedy, entry::logits, true, false, false);
}
void BM_greedy_tree(benchmark::State& s) {
  run<specdec::greedy_verifier>(s, which::greedy, entry::logits, false, false, false);
}
// Speculative sampling of sampled chains (q rows), temperature 0.8.
void BM_speculative_chain(benchmark::State& s) {
  run<specdec::speculative_sampling_verifier>(s, which::speculative, entry::logits, true, true,
                                              false);
}
void BM_speculative_chain_probs(benchmark::State& s) {
  run<specdec::speculative_sampling_verifier>(s, which::speculative, entry::probs, true, true,
                                              false);
}
void BM_speculative_chain_probs_reject_first(benchmark::State& s) {
  run<specdec::speculative_sampling_verifier>(s, which::speculative, entry::probs, true, true,
                                              true);
}
// Tree verification: point masses and i.i.d. sampled children.
void BM_tree_points(benchmark::State& s) {
  run<specdec::tree_verifier>(s, which::tree, entry::logits, false, false, false);
}
void BM_tree_sampled(benchmark::State& s) {
  run<specdec::tree_verifier>(s, which::tree, entry::logits, false, true, false);
}
void BM_tree_sampled_probs(benchmark::State& s) {
  run<specdec::tree_verifier>(s, which::tree, entry::probs, false, true, false);
}
// Typical acceptance.
void BM_typical_tree(benchmark::State& s) {
  run<specdec::typical_acceptance_verifier>(s, which::typical, entry::logits, false, false, false);
}
void BM_typical_chain(benchmark::State& s) {
  run<specdec::typical_acceptance_verifier>(s, which::typical, entry::logits, true, false, false);
}

BENCHMARK(BM_speculative_chain_probs)->Apply(chain_args);
BENCHMARK(BM_speculative_chain_probs_reject_first)->Apply(bar_args);
BENCHMARK(BM_speculative_chain)->Apply(chain_args);
BENCHMARK(BM_greedy_chain)->Apply(chain_args);
BENCHMARK(BM_greedy_tree)->Apply(tree_args);
BENCHMARK(BM_tree_points)->Apply(tree_args);
BENCHMARK(BM_tree_sampled)->Apply(tree_args);
BENCHMARK(BM_tree_sampled_probs)->Apply(tree_args);
BENCHMARK(BM_typical_chain)->Apply(chain_args);
BENCHMARK(BM_typical_tree)->Apply(tree_args);

}  // namespace

BENCHMARK_MAIN();
