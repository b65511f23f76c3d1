// Losslessness of the verifiers, tested at the distribution level: for each configuration
// (verifier x policy x draft quality x vocabulary x tree shape) we run many independent
// verification steps against a toy target (a fixed function from history to logits) and compare
// the empirical distribution of the emitted tokens with the target policy's exact distribution:
// the first token, and the first two tokens (when only one token was emitted, the second is drawn
// from the target policy given the first, as the next step of the decoder would).
//
// Threshold: a configuration fails when a chi-square goodness-of-fit test (cells with expected
// count < 5 pooled) gives p < 1e-5, or when any emitted token has target probability 0. With the
// fixed seeds below every configuration is deterministic. The same harness rejects typical
// acceptance (lossy), which shows the test has power.
//
// Greedy policies are checked exactly instead: every emitted token must be on the target's greedy
// path.

#include "support/doctest.hpp"

#include <cstdint>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "harness.hpp"
#include "specdec/sampling/draw.hpp"
#include "specdec/sampling/policy.hpp"
#include "specdec/verify/greedy.hpp"
#include "specdec/verify/speculative_sampling.hpp"
#include "specdec/verify/tree_sampling.hpp"
#include "specdec/verify/typical_acceptance.hpp"

namespace {

using namespace verify_test;
using specdec::draft_tree;
using specdec::matrix_view;
using specdec::philox;
using specdec::sampler;
using specdec::verify_result;

constexpr double alpha = 1e-5;  // chi-square threshold: fail when p < alpha

#if defined(__SANITIZE_ADDRESS__)
constexpr std::size_t trial_divisor = 4;  // the test stays valid at any count; only power drops
#else
constexpr std::size_t trial_divisor = 1;
#endif

// The tree shapes drafted in the tests.
enum class shape {
  chain_q,       // a chain of 3 tokens each drawn from q (draft-model sampling)
  chain_points,  // a chain of 3 deterministic candidates (prompt lookup)
  tree_points,   // 3 candidates at the root, 2 under the first, 1 under that (depth 3)
  tree_q,        // 3 children i.i.d. from q at the root, 2 i.i.d. under each (depth 2)
};

char const* to_string(shape s) {
  switch (s) {
    case shape::chain_q:
      return "chain with q";
    case shape::chain_points:
      return "chain of point masses";
    case shape::tree_points:
      return "tree of point masses";
    case shape::tree_q:
      return "tree with q (i.i.d. children)";
  }
  return "?";
}

// Builds trees and target rows for one configuration, caching per-path quantities.
class simulator {
 public:
  simulator(sampler const& policy, toy_target target, draft_kind kind, shape s)
      : policy_(policy), target_(target), kind_(kind), shape_(s), tree_(32) {
    std::size_t const v = target_.vocab;
    history_ = {static_cast<token_id>(1 % v), static_cast<token_id>(2 % v),
                static_cast<token_id>(0)};
    if (shape_ == shape::chain_q || shape_ == shape::tree_q) tree_.enable_q(v);
    rows_.resize(32 * v);
  }

  std::vector<token_id> const& history() const { return history_; }

  // Target distribution (policy applied) after history + path.
  std::vector<double> const& p(std::vector<token_id> const& path) {
    auto [it, fresh] = p_cache_.try_emplace(key(path));
    if (fresh) it->second = policy_distribution(policy_, target_, full(path));
    return it->second;
  }

  // Builds this trial's tree (random children drawn with `draft_rng`) and its target rows.
  draft_tree const& build(philox& draft_rng) {
    tree_.reset(history_.back());
    switch (shape_) {
      case shape::chain_q: {
        node_index node = 0;
        std::vector<token_id> path;
        for (int d = 0; d < 3; ++d) {
          token_id const x = draw_child(node, path, draft_rng);
          node = tree_.add_node(node, x);
          path.push_back(x);
        }
        break;
      }
      case shape::chain_points: {
        node_index node = 0;
        std::vector<token_id> path;
        for (int d = 0; d < 3; ++d) {
          token_id const x = candidates(path, 1)[0];
          node = tree_.add_node(node, x);
          path.push_back(x);
        }
        break;
      }
      case shape::tree_points: {
        auto const c0 = candidates({}, 3);
        node_index first = -1;
        for (token_id x : c0) {
          node_index const n = tree_.add_node(0, x);
          if (first < 0) first = n;
        }
        auto const c1 = candidates({c0[0]}, 2);
        node_index second = -1;
        for (token_id x : c1) {
          node_index const n = tree_.add_node(first, x);
          if (second < 0) second = n;
        }
        auto const c2 = candidates({c0[0], c1[0]}, 1);
        tree_.add_node(second, c2[0]);
        break;
      }
      case shape::tree_q: {
        std::vector<node_index> level;
        for (int i = 0; i < 3; ++i)
          level.push_back(tree_.add_node(0, draw_child(0, {}, draft_rng)));
        for (node_index n : level) {
          std::vector<token_id> const path{tree_.token(n)};
          for (int i = 0; i < 2; ++i) tree_.add_node(n, draw_child(n, path, draft_rng));
        }
        break;
      }
    }
    std::size_t const v = target_.vocab;
    for (std::size_t i = 0; i < tree_.size(); ++i) {
      std::vector<token_id> path;
      for (auto a = static_cast<node_index>(i); a > 0; a = tree_.parent(a))
        path.insert(path.begin(), tree_.token(a));
      auto [it, fresh] = logits_cache_.try_emplace(key(path));
      if (fresh) it->second = target_.logits(full(path));
      std::copy(it->second.begin(), it->second.end(),
                rows_.begin() + static_cast<std::ptrdiff_t>(i * v));
    }
    return tree_;
  }

  matrix_view<float const> rows() const {
    return matrix_view<float const>(rows_.data(), tree_.size(), target_.vocab);
  }

 private:
  static std::uint64_t key(std::vector<token_id> const& path) {
    std::uint64_t k = path.size();
    for (token_id t : path) k = k * 131 + static_cast<std::uint64_t>(t) + 1;
    return k;
  }
  std::vector<token_id> full(std::vector<token_id> const& path) const {
    std::vector<token_id> h = history_;
    h.insert(h.end(), path.begin(), path.end());
    return h;
  }
  std::vector<float> const& q(std::vector<token_id> const& path) {
    auto [it, fresh] = q_cache_.try_emplace(key(path));
    if (fresh) {
      auto const qd = draft_q(kind_, p(path), mix(key(path) + 991));
      it->second.assign(qd.begin(), qd.end());
    }
    return it->second;
  }
  token_id draw_child(node_index node, std::vector<token_id> const& path, philox& rng) {
    auto const& qrow = q(path);
    std::copy(qrow.begin(), qrow.end(), tree_.q_row(node).begin());
    return specdec::sample_from(qrow, rng.uniform());
  }
  std::vector<token_id> candidates(std::vector<token_id> const& path, std::size_t count) {
    return draft_candidates(kind_, p(path), count, mix(key(path) + 77));
  }

  sampler const& policy_;
  toy_target target_;
  draft_kind kind_;
  shape shape_;
  draft_tree tree_;
  std::vector<token_id> history_;
  std::vector<float> rows_;
  std::unordered_map<std::uint64_t, std::vector<double>> p_cache_;
  std::unordered_map<std::uint64_t, std::vector<float>> q_cache_;
  std::unordered_map<std::uint64_t, std::vector<float>> logits_cache_;
};

struct outcome {
  chi_square_result first;
  chi_square_result pair;
};

// Runs `trials` verification steps and tests the emitted first token and first two tokens.
template <class Verifier>
outcome run_config(Verifier& verifier, sampler const& policy, toy_target const& target,
                   draft_kind kind, shape s, std::size_t trials, std::uint64_t seed) {
  simulator sim(policy, target, kind, s);
  std::size_t const v = target.vocab;
  std::vector<std::uint64_t> first(v, 0), pair(v * v, 0);
  philox verify_rng(seed, 0);
  philox draft_rng(seed, 1);
  verify_result out;
  for (std::size_t t = 0; t < trials; ++t) {
    draft_tree const& tree = sim.build(draft_rng);
    verifier.verify(tree, sim.rows(), policy, sim.history(), verify_rng, out);
    auto const x1 = static_cast<std::size_t>(out.tokens[0]);
    std::size_t x2 = 0;
    if (out.tokens.size() >= 2) {
      x2 = static_cast<std::size_t>(out.tokens[1]);
    } else {
      auto const& p2 = sim.p({out.tokens[0]});
      std::vector<float> const p2f(p2.begin(), p2.end());
      x2 = static_cast<std::size_t>(specdec::sample_from(p2f, draft_rng.uniform()));
    }
    ++first[x1];
    ++pair[x1 * v + x2];
  }
  auto const& p1 = sim.p({});
  std::vector<double> joint(v * v, 0.0);
  for (std::size_t a = 0; a < v; ++a) {
    if (p1[a] == 0.0) continue;
    auto const& p2 = sim.p({static_cast<token_id>(a)});
    for (std::size_t b = 0; b < v; ++b) joint[a * v + b] = p1[a] * p2[b];
  }
  return {chi_square(first, p1), chi_square(pair, joint)};
}

// Exact check for greedy policies: every emitted token is on the target's greedy path.
template <class Verifier>
void check_greedy_exact(Verifier& verifier, sampler const& policy, toy_target const& target,
                        draft_kind kind, shape s, std::size_t trials, std::uint64_t seed,
                        std::string const& label) {
  simulator sim(policy, target, kind, s);
  philox verify_rng(seed, 0);
  philox draft_rng(seed, 1);
  verify_result out;
  std::size_t mismatches = 0;
  for (std::size_t t = 0; t < trials; ++t) {
    draft_tree const& tree = sim.build(draft_rng);
    verifier.verify(tree, sim.rows(), policy, sim.history(), verify_rng, out);
    std::vector<token_id> h = sim.history();
    for (token_id tok : out.tokens) {
      auto const logits = target.logits(h);
      token_id const g = policy.greedy_token(logits, h);
      if (tok != g) ++mismatches;
      h.push_back(g);
    }
  }
  INFO(label);
  CHECK(mismatches == 0);
}

struct config {
  std::size_t vocab;
  std::size_t policy;  // index into all_policies()
  draft_kind kind;
  shape s;
};

template <class Verifier>
void run_matrix(Verifier& verifier, std::string const& verifier_name,
                std::vector<config> const& cfgs, std::size_t trials) {
  auto const policies = all_policies();
  std::uint64_t seed = 1000;
  for (auto const& c : cfgs) {
    ++seed;
    toy_target const target{c.vocab, 3 + c.vocab};
    sampler const policy(policies[c.policy].params);
    std::string const label = verifier_name + ", " + policies[c.policy].name + ", " +
                              to_string(c.kind) + " drafts, " + to_string(c.s) + ", vocab " +
                              std::to_string(c.vocab);
    if (policy.is_greedy()) {
      check_greedy_exact(verifier, policy, target, c.kind, c.s, 2000, seed, label);
      continue;
    }
    auto const r = run_config(verifier, policy, target, c.kind, c.s, trials / trial_divisor, seed);
    INFO(label);
    INFO("first token: " << r.first.describe());
    INFO("first two tokens: " << r.pair.describe());
    CHECK(r.first.impossible == 0);
    CHECK(r.pair.impossible == 0);
    CHECK(r.first.p_value >= alpha);
    CHECK(r.pair.p_value >= alpha);
  }
}

// Every policy x every draft quality for one vocabulary and shape.
std::vector<config> full_matrix(std::size_t vocab, shape s) {
  std::vector<config> out;
  for (std::size_t p = 0; p < all_policies().size(); ++p)
    for (draft_kind k : {draft_kind::good, draft_kind::bad, draft_kind::adversarial})
      out.push_back({vocab, p, k, s});
  return out;
}

constexpr std::size_t trials = 100000;

}  // namespace

TEST_CASE("speculative sampling is lossless: every policy x draft quality (vocab 3 and 17)") {
  specdec::speculative_sampling_verifier v;
  run_matrix(v, "speculative_sampling_verifier", full_matrix(3, shape::chain_q), trials);
  run_matrix(v, "speculative_sampling_verifier", full_matrix(17, shape::chain_q), trials);
}

TEST_CASE("speculative sampling is lossless: every policy x draft quality (vocab 111)") {
  specdec::speculative_sampling_verifier v;
  run_matrix(v, "speculative_sampling_verifier", full_matrix(111, shape::chain_q), trials);
}

TEST_CASE(
    "speculative sampling of point-mass chains is lossless: every policy x draft (3, 17, 111)") {
  specdec::speculative_sampling_verifier v;
  for (std::size_t vocab : {3u, 17u, 111u})
    run_matrix(v, "speculative_sampling_verifier", full_matrix(vocab, shape::chain_points), trials);
}

TEST_CASE("tree verification of point masses is lossless: every policy x draft (vocab 3, 17)") {
  specdec::tree_verifier v;
  run_matrix(v, "tree_verifier", full_matrix(3, shape::tree_points), trials);
  run_matrix(v, "tree_verifier", full_matrix(17, shape::tree_points), trials);
}

TEST_CASE("tree verification of point masses is lossless: every policy x draft (vocab 111)") {
  specdec::tree_verifier v;
  run_matrix(v, "tree_verifier", full_matrix(111, shape::tree_points), trials);
}

TEST_CASE("tree verification of sampled children is lossless: every policy x draft (vocab 3, 17)") {
  specdec::tree_verifier v;
  run_matrix(v, "tree_verifier", full_matrix(3, shape::tree_q), trials);
  run_matrix(v, "tree_verifier", full_matrix(17, shape::tree_q), trials);
}

TEST_CASE("tree verification of sampled children is lossless: every policy x draft (vocab 111)") {
  specdec::tree_verifier v;
  run_matrix(v, "tree_verifier", full_matrix(111, shape::tree_q), trials);
}

TEST_CASE("greedy verification emits exactly the target's greedy path") {
  specdec::greedy_verifier v;
  auto const policies = all_policies();
  std::uint64_t seed = 77;
  for (std::size_t vocab : {3u, 17u, 111u}) {
    for (shape s : {shape::chain_q, shape::chain_points, shape::tree_points, shape::tree_q}) {
      for (draft_kind k : {draft_kind::good, draft_kind::bad, draft_kind::adversarial}) {
        toy_target const target{vocab, 3 + vocab};
        sampler const policy(policies[0].params);
        check_greedy_exact(v, policy, target, k, s, 300, ++seed,
                           "greedy_verifier, vocab " + std::to_string(vocab) + ", " + to_string(s) +
                               ", " + to_string(k));
      }
    }
  }
  // With a repetition penalty (greedy_token sees the path) the path is still exact.
  specdec::sampling_params rp;
  rp.temperature = 0.0f;
  rp.repetition_penalty = 1.8f;
  sampler const policy(rp);
  check_greedy_exact(v, policy, toy_target{17, 20}, draft_kind::good, shape::tree_points, 300, 5,
                     "greedy_verifier with repetition penalty");
  specdec::typical_acceptance_verifier tv;
  check_greedy_exact(tv, policy, toy_target{17, 20}, draft_kind::good, shape::tree_q, 300, 6,
                     "typical_acceptance_verifier, greedy policy");
}

TEST_CASE("the harness has power: typical acceptance (lossy) fails the same test") {
  specdec::typical_acceptance_verifier v;
  auto const policies = all_policies();
  sampler const policy(policies[2].params);  // temperature 1.0
  toy_target const target{17, 20};
  auto const r = run_config(v, policy, target, draft_kind::good, shape::tree_points,
                            20000 / trial_divisor, 4242);
  INFO("first token: " << r.first.describe());
  INFO("first two tokens: " << r.pair.describe());
  CHECK((r.first.p_value < alpha || r.pair.p_value < alpha));
}
