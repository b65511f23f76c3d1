#pragma once
// Random verification inputs: trees (chains or multi-child, with or without q rows), target
// logits rows that sometimes favour a drafted child (so that walks go deep), histories, policies.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include "harness.hpp"
#include "specdec/core/draft_tree.hpp"
#include "specdec/core/philox.hpp"
#include "specdec/sampling/draw.hpp"
#include "specdec/sampling/policy.hpp"

namespace verify_test {

struct random_case {
  std::size_t vocab = 0;
  specdec::draft_tree tree{1};
  std::vector<float> logits;  // [tree.size(), vocab]
  std::vector<token_id> history;
  specdec::sampling_params params;

  [[nodiscard]] specdec::matrix_view<float const> rows() const {
    return specdec::matrix_view<float const>(logits.data(), tree.size(), vocab);
  }
};

class case_generator {
 public:
  explicit case_generator(std::uint64_t seed) : rng_(seed, 7) {}

  std::uint32_t below(std::uint32_t n) { return n == 0 ? 0 : rng_.next_u32() % n; }
  double uniform() { return static_cast<double>(rng_.uniform()); }
  double normal() {
    double const a = uniform() + 1e-9, b = uniform();
    return std::sqrt(-2.0 * std::log(a)) * std::cos(6.283185307179586 * b);
  }

  // A random distribution over `vocab` tokens (some exact zeros when vocab > 2).
  std::vector<float> distribution(std::size_t vocab) {
    std::vector<double> w(vocab);
    double s = 0.0;
    for (auto& x : w) {
      x = (vocab > 2 && below(5) == 0) ? 0.0 : std::exp(2.0 * normal());
      s += x;
    }
    if (s == 0.0) {
      w[below(static_cast<std::uint32_t>(vocab))] = 1.0;
      s = 1.0;
    }
    std::vector<float> out(vocab);
    for (std::size_t i = 0; i < vocab; ++i) out[i] = static_cast<float>(w[i] / s);
    return out;
  }

  specdec::sampling_params policy() {
    specdec::sampling_params p;
    switch (below(9)) {
      case 0:
        p.temperature = 0.0f;
        break;
      case 1:
        p.temperature = 0.7f;
        break;
      case 2:
        break;
      case 3:
        p.top_k = 5;
        break;
      case 4:
        p.top_p = 0.9f;
        break;
      case 5:
        p.min_p = 0.05f;
        break;
      case 6:
        p.repetition_penalty = 1.8f;
        break;
      case 7:
        p.temperature = 0.8f;
        p.top_k = 20;
        p.top_p = 0.8f;
        p.presence_penalty = 0.5f;
        break;
      default:
        p.temperature = 0.0f;
        p.repetition_penalty = 1.3f;
        break;
    }
    return p;
  }

  random_case make(std::size_t vocab, std::size_t nodes, bool chain, bool with_q) {
    random_case c;
    c.vocab = vocab;
    c.params = policy();
    c.tree = specdec::draft_tree(nodes);
    if (with_q) c.tree.enable_q(vocab);
    auto const root = static_cast<token_id>(below(static_cast<std::uint32_t>(vocab)));
    c.tree.reset(root);
    std::size_t const hlen = below(5);
    for (std::size_t i = 0; i < hlen; ++i)
      c.history.push_back(static_cast<token_id>(below(static_cast<std::uint32_t>(vocab))));
    c.history.push_back(root);
    if (with_q) set_q(c.tree, 0, vocab);
    for (std::size_t i = 1; i < nodes; ++i) {
      auto const size = static_cast<std::uint32_t>(c.tree.size());
      auto parent = static_cast<node_index>(chain ? size - 1 : below(size));
      if (!chain && below(3) == 0) parent = static_cast<node_index>(size - 1);  // deeper trees
      token_id token = 0;
      bool placed = false;
      for (int attempt = 0; attempt < 8 && !placed; ++attempt) {
        if (with_q && below(10) != 0) {
          token = specdec::sample_from(c.tree.q_row(parent), rng_.uniform());
        } else {
          token = static_cast<token_id>(below(static_cast<std::uint32_t>(vocab)));
        }
        placed = with_q || c.tree.find_child(parent, token) < 0;
      }
      if (!placed) {
        if (chain) break;
        continue;
      }
      node_index const n = c.tree.add_node(parent, token);
      if (with_q) set_q(c.tree, n, vocab);
    }
    std::size_t const n = c.tree.size();
    c.logits.resize(n * vocab);
    double const scale = 0.5 + 3.0 * uniform();
    for (std::size_t i = 0; i < n; ++i) {
      float* row = c.logits.data() + i * vocab;
      for (std::size_t v = 0; v < vocab; ++v)
        row[v] = (vocab > 1 && below(10) == 0) ? -std::numeric_limits<float>::infinity()
                                               : static_cast<float>(scale * normal());
      row[below(static_cast<std::uint32_t>(vocab))] = static_cast<float>(scale * normal());
      // Favour a child half of the time so that walks go deep.
      auto const node = static_cast<node_index>(i);
      if (c.tree.num_children(node) > 0 && below(2) == 0) {
        node_index child = c.tree.first_child(node);
        for (std::uint32_t k = below(static_cast<std::uint32_t>(c.tree.num_children(node))); k > 0;
             --k)
          child = c.tree.next_sibling(child);
        row[static_cast<std::size_t>(c.tree.token(child))] = static_cast<float>(scale * 3.0);
      }
    }
    return c;
  }

 private:
  void set_q(specdec::draft_tree& tree, node_index n, std::size_t vocab) {
    auto const q = distribution(vocab);
    std::copy(q.begin(), q.end(), tree.q_row(n).begin());
  }

  specdec::philox rng_;
};

}  // namespace verify_test
