#pragma once
//! \file
//! Reference verifiers: slow, obviously-correct versions of every verifier in verify/, written as
//! the textbook rules in double precision with plain loops, whole-row vectors and no shortcuts.
//! They follow the same RNG contract as the optimised verifiers (word offset() + j for the test
//! of node j >= 1, word offset() + 0 for the final draw, then advance by tree.size()), so that for
//! the same Philox inputs they make the same decisions except where a decision lies within
//! rounding of its threshold; `verify_trace` records how close the closest decision came.
//!
//! The general rule used for every sampling verifier: at a node with target distribution p, each
//! child x (insertion order) is tested against its draft distribution q (the node's q row, or the
//! one-hot at x for deterministic candidates): accept iff u < p(x) / q(x) (p(x) / 0 = +inf when
//! p(x) > 0, and 0 when p(x) = 0); on rejection p := norm(max(p - q, 0)) unless that is all zero.
//! If no child is accepted the token is drawn from p; at a leaf the bonus is drawn from p.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <utility>
#include <vector>

#include "specdec/core/concepts.hpp"
#include "specdec/core/draft_tree.hpp"
#include "specdec/core/error.hpp"
#include "specdec/core/philox.hpp"
#include "specdec/core/types.hpp"
#include "specdec/core/verify_result.hpp"
#include "specdec/core/views.hpp"
#include "specdec/reference/sampling.hpp"
#include "specdec/sampling/params.hpp"

namespace specdec::reference {

//! One distribution per tree node, in double: [tree.size()][vocab].
using distribution_rows = std::vector<std::vector<double>>;

//! How close the decisions of one reference verification came to their thresholds.
struct verify_trace {
  //! The smallest margin over all decisions: |u - p/q| for acceptance tests with p/q < 1; for
  //! draws the distance from u * total to the nearest boundary of the drawn token's CDF interval,
  //! divided by the total; |p(x) - threshold| for typical acceptance. +inf when no decision was
  //! close to a threshold in any of these senses.
  double min_margin = std::numeric_limits<double>::infinity();

  //! Records one decision's margin.
  void note(double margin) noexcept { min_margin = std::min(min_margin, margin); }
};

//! The policy's distribution for every node: row i from `logits` row i with `history` extended by
//! the path to node i (root excluded), converted to double.
template <sampling_policy Policy>
[[nodiscard]] distribution_rows target_distributions(draft_tree const& tree,
                                                     matrix_view<float const> logits,
                                                     Policy const& policy,
                                                     std::span<token_id const> history) {
  SPECDEC_CHECK(logits.rows() == tree.size(), invalid_argument, "reference: ", logits.rows(),
                " logits rows for a tree of ", tree.size(), " nodes");
  distribution_rows out(tree.size());
  std::vector<float> probs(logits.cols());
  for (std::size_t i = 0; i < tree.size(); ++i) {
    std::vector<token_id> path;
    for (auto a = static_cast<node_index>(i); a > 0; a = tree.parent(a))
      path.push_back(tree.token(a));
    std::vector<token_id> h(history.begin(), history.end());
    h.insert(h.end(), path.rbegin(), path.rend());
    policy.distribution(logits.row(i), h, probs);
    out[i].assign(probs.begin(), probs.end());
  }
  return out;
}

//! The reference sampling path as a `sampling_policy`: every call goes through
//! reference/sampling.hpp (double precision, full sorts). With it the reference verifiers are
//! reference end to end (the benchmarks' yardstick); the tests mostly pass the fast policy instead
//! so that both sides see bit-identical distributions.
class policy {
 public:
  //! Validates `params`.
  explicit policy(sampling_params params) : params_(std::move(params)) { params_.validate(); }

  //! `reference_distribution`, rounded to float.
  void distribution(std::span<float const> logits, std::span<token_id const> history,
                    std::span<float> probs) const {
    std::vector<double> const d = reference_distribution(params_, logits, history);
    SPECDEC_CHECK(probs.size() == d.size(), invalid_argument, "reference::policy: ", probs.size(),
                  " probabilities for ", d.size(), " logits");
    for (std::size_t i = 0; i < d.size(); ++i) probs[i] = static_cast<float>(d[i]);
  }
  //! `reference_sample` with one word of `rng`.
  [[nodiscard]] token_id sample(std::span<float const> probs, philox& rng) const {
    std::vector<double> const d(probs.begin(), probs.end());
    return reference_sample(d, static_cast<double>(rng.uniform()));
  }
  //! Temperature 0.
  [[nodiscard]] bool is_greedy() const noexcept { return params_.temperature == 0.0f; }
  //! `reference_greedy_token`.
  [[nodiscard]] token_id greedy_token(std::span<float const> logits,
                                      std::span<token_id const> history) const {
    return reference_greedy_token(params_, logits, history);
  }
  //! The parameters.
  [[nodiscard]] sampling_params const& params() const noexcept { return params_; }

 private:
  sampling_params params_;
};

//! `reference_distribution` of every node, in double, without rounding to float.
[[nodiscard]] inline distribution_rows target_distributions(draft_tree const& tree,
                                                            matrix_view<float const> logits,
                                                            policy const& ref_policy,
                                                            std::span<token_id const> history) {
  SPECDEC_CHECK(logits.rows() == tree.size(), invalid_argument, "reference: ", logits.rows(),
                " logits rows for a tree of ", tree.size(), " nodes");
  distribution_rows out(tree.size());
  for (std::size_t i = 0; i < tree.size(); ++i) {
    std::vector<token_id> path;
    for (auto a = static_cast<node_index>(i); a > 0; a = tree.parent(a))
      path.push_back(tree.token(a));
    std::vector<token_id> h(history.begin(), history.end());
    h.insert(h.end(), path.rbegin(), path.rend());
    out[i] = reference_distribution(ref_policy.params(), logits.row(i), h);
  }
  return out;
}

//! Rows of a float matrix in double.
[[nodiscard]] inline distribution_rows to_double(matrix_view<float const> rows) {
  distribution_rows out(rows.rows());
  for (std::size_t i = 0; i < rows.rows(); ++i)
    out[i].assign(rows.row(i).begin(), rows.row(i).end());
  return out;
}

//! Inverse-CDF draw: the first index with w > 0 whose running sum exceeds u * sum(w); the last
//! index with w > 0 when rounding leaves that unreached; throws when no weight is positive.
[[nodiscard]] inline token_id draw(std::vector<double> const& w, double u, verify_trace* trace) {
  double total = 0.0;
  for (double x : w) {
    SPECDEC_CHECK(std::isfinite(x), numerical, "reference: a weight is ", x);
    if (x > 0.0) total += x;
  }
  SPECDEC_CHECK(total > 0.0, numerical, "reference: a distribution has no mass");
  double const target = u * total;
  double cum = 0.0;
  std::size_t last = w.size();
  for (std::size_t i = 0; i < w.size(); ++i) {
    if (!(w[i] > 0.0)) continue;
    double const before = cum;
    cum += w[i];
    last = i;
    if (cum > target) {
      if (trace) trace->note(std::min(target - before, cum - target) / total);
      return static_cast<token_id>(i);
    }
  }
  if (trace) trace->note(0.0);
  return static_cast<token_id>(last);
}

//! Greedy verification: walk while the child matching the policy's greedy token exists.
template <sampling_policy Policy>
[[nodiscard]] verify_result greedy(draft_tree const& tree, matrix_view<float const> logits,
                                   Policy const& policy, std::span<token_id const> history,
                                   philox& rng) {
  SPECDEC_CHECK(logits.rows() == tree.size(), invalid_argument,
                "reference::greedy: ", logits.rows(), " rows for ", tree.size(), " nodes");
  verify_result out;
  node_index node = 0;
  std::vector<token_id> h(history.begin(), history.end());
  for (;;) {
    token_id const g = policy.greedy_token(logits.row(static_cast<std::size_t>(node)), h);
    out.tokens.push_back(g);
    node_index next = -1;
    for (node_index c = tree.first_child(node); c >= 0; c = tree.next_sibling(c)) {
      if (tree.token(c) == g) {
        next = c;
        break;
      }
    }
    if (next < 0) break;
    out.accepted_nodes.push_back(next);
    h.push_back(g);
    node = next;
  }
  rng.skip(tree.size());
  return out;
}

//! Greedy verification over distribution rows: the argmax (lowest id on ties) of each row.
[[nodiscard]] inline verify_result greedy(draft_tree const& tree, distribution_rows const& p,
                                          philox& rng) {
  verify_result out;
  node_index node = 0;
  for (;;) {
    auto const& row = p[static_cast<std::size_t>(node)];
    auto const g = static_cast<token_id>(std::max_element(row.begin(), row.end()) - row.begin());
    out.tokens.push_back(g);
    node_index next = -1;
    for (node_index c = tree.first_child(node); c >= 0; c = tree.next_sibling(c)) {
      if (tree.token(c) == g) {
        next = c;
        break;
      }
    }
    if (next < 0) break;
    out.accepted_nodes.push_back(next);
    node = next;
  }
  rng.skip(tree.size());
  return out;
}

//! Sampling verification of any tree (the general rule in the file comment): q rows when the tree
//! has them, point masses otherwise. `p` holds the target distribution of every node.
[[nodiscard]] inline verify_result tree_sampling(draft_tree const& tree, distribution_rows const& p,
                                                 philox& rng, verify_trace* trace = nullptr) {
  SPECDEC_CHECK(p.size() == tree.size(), invalid_argument, "reference::tree_sampling: ", p.size(),
                " rows for ", tree.size(), " nodes");
  std::size_t const vocab = p.empty() ? 0 : p[0].size();
  double const u0 = static_cast<double>(rng.uniform_at(0));
  verify_result out;
  node_index node = 0;
  for (;;) {
    std::vector<double> cur = p[static_cast<std::size_t>(node)];
    node_index accepted = -1;
    for (node_index c = tree.first_child(node); c >= 0; c = tree.next_sibling(c)) {
      auto const x = static_cast<std::size_t>(tree.token(c));
      std::vector<double> q(vocab, 0.0);
      if (tree.has_q()) {
        auto const row = tree.q_row(node);
        for (std::size_t i = 0; i < vocab; ++i) q[i] = static_cast<double>(row[i]);
      } else {
        q[x] = 1.0;
      }
      double ratio = 0.0;
      if (q[x] > 0.0)
        ratio = cur[x] / q[x];
      else
        ratio = cur[x] > 0.0 ? std::numeric_limits<double>::infinity() : 0.0;
      double const u = static_cast<double>(rng.uniform_at(static_cast<std::uint64_t>(c)));
      if (ratio < 1.0 && trace) trace->note(std::abs(u - ratio));
      if (u < ratio) {
        accepted = c;
        break;
      }
      std::vector<double> r(vocab);
      double sum = 0.0;
      for (std::size_t i = 0; i < vocab; ++i) {
        r[i] = std::max(cur[i] - q[i], 0.0);
        sum += r[i];
      }
      if (sum > 0.0)
        for (std::size_t i = 0; i < vocab; ++i) cur[i] = r[i] / sum;
    }
    if (accepted < 0) {
      out.tokens.push_back(draw(cur, u0, trace));
      break;
    }
    out.accepted_nodes.push_back(accepted);
    out.tokens.push_back(tree.token(accepted));
    node = accepted;
  }
  rng.skip(tree.size());
  return out;
}

//! Speculative sampling of a chain: `tree_sampling` restricted to chains.
[[nodiscard]] inline verify_result speculative_sampling(draft_tree const& tree,
                                                        distribution_rows const& p, philox& rng,
                                                        verify_trace* trace = nullptr) {
  SPECDEC_CHECK(tree.is_chain(), invalid_argument, "reference::speculative_sampling: not a chain");
  return tree_sampling(tree, p, rng, trace);
}

//! Typical acceptance with thresholds min(epsilon, delta * exp(-H(p))): the path to the deepest
//! reached node (lowest index on ties), bonus drawn from p there.
[[nodiscard]] inline verify_result typical_acceptance(draft_tree const& tree,
                                                      distribution_rows const& p, double epsilon,
                                                      double delta, philox& rng,
                                                      verify_trace* trace = nullptr) {
  SPECDEC_CHECK(p.size() == tree.size(), invalid_argument,
                "reference::typical_acceptance: ", p.size(), " rows for ", tree.size(), " nodes");
  std::vector<bool> reached(tree.size(), false);
  reached[0] = true;
  node_index best = 0;
  for (std::size_t i = 0; i < tree.size(); ++i) {
    if (!reached[i]) continue;
    auto const v = static_cast<node_index>(i);
    if (tree.depth(v) > tree.depth(best)) best = v;
    double h = 0.0;
    for (double x : p[i])
      if (x > 0.0) h -= x * std::log(x);
    double const thr = std::min(epsilon, delta * std::exp(-h));
    for (node_index c = tree.first_child(v); c >= 0; c = tree.next_sibling(c)) {
      double const px = p[i][static_cast<std::size_t>(tree.token(c))];
      if (trace) trace->note(std::abs(px - thr));
      if (px > thr) reached[static_cast<std::size_t>(c)] = true;
    }
  }
  verify_result out;
  std::vector<node_index> path;
  for (node_index a = best; a > 0; a = tree.parent(a)) path.push_back(a);
  for (auto it = path.rbegin(); it != path.rend(); ++it) {
    out.accepted_nodes.push_back(*it);
    out.tokens.push_back(tree.token(*it));
  }
  out.tokens.push_back(
      draw(p[static_cast<std::size_t>(best)], static_cast<double>(rng.uniform_at(0)), trace));
  rng.skip(tree.size());
  return out;
}

}  // namespace specdec::reference
