#pragma once
//! \file
//! Drafting with a model of another vocabulary (Timor et al., ICML 2025, arXiv 2502.05202; the
//! "universal assisted generation" of HF transformers; vLLM's token-level intersection).
//!
//! - `vocabulary_bridge`: the target's and the draft's vocabularies matched by the text each token
//!   stands for. Both tokenizers hold their pieces as text (SentencePiece's "▁" already a space,
//!   model/tokenizer.hpp), so a token's text is the same string in either convention: byte tokens
//!   their byte, text pieces their text as it reads after another token, control and unknown
//!   tokens none. Tokens of equal text are paired (byte tokens with byte tokens first, then in id
//!   order, each token at most once); BOS, EOS and the unknown token are paired by role. Each
//!   target token also has its draft tokens: its counterpart, or else its text encoded by the
//!   draft's tokenizer (no BOS, no dummy prefix), or else (a control token without a counterpart)
//!   the draft's unknown token. `padded` serves a draft of the same family whose vocabulary only
//!   differs in size (padding): ids below both sizes are paired with themselves.
//! - `cross_vocabulary_proposer`: a draft model of any vocabulary. The draft reads the committed
//!   text in its own tokenisation: each text run (the text between tokens without text) encoded by
//!   the draft's tokenizer, tokens without text through the bridge (with a `padded` bridge, which
//!   has no tokenizers, or with `token_context`, each committed token is replaced by its draft
//!   tokens, which suits vocabularies that tokenise alike). As the text grows
//!   only the end of the last run is encoded again (from a word start before its last two tokens),
//!   and the draft cache keeps the longest prefix it shares with the new context -- after a step,
//!   the old context and those of its drafts that the target's tokens spell. Two modes:
//!   - `vocab_mode::intersection` (token-level intersection, TLI): the draft's rows are masked to
//!     the tokens the two vocabularies share, its drafts are mapped to their target counterparts
//!     and, when sampling, its q rows are carried into the target's vocabulary (zero outside the
//!     intersection). A draft is then an ordinary chain of target tokens with q rows, and
//!     speculative sampling is exact (each draft is drawn from the q row the verifier reads).
//!   - `vocab_mode::string` (string level): the draft writes k tokens of text freely (greedy),
//!     after token healing: the context's last token, when it is text, is drafted again, the first
//!     draft row masked to the tokens that begin with its text, so that the draft goes on from a
//!     boundary of its own tokenisation rather than after a piece it would have merged on (a
//!     committed " " or " outs" of the target). The text after the committed text is re-tokenised
//!     with the target's tokenizer together with the last `lookbehind` committed tokens (alone when
//!     a token would span the boundary), and the target tokens after the committed ones are
//!     proposed as deterministic candidates. Candidates carry no q rows: the greedy verifier checks
//!     them token by token and the tree verifier treats each as a point mass, which is exact at any
//!     temperature whatever the draft writes.
//!
//! The draft's rows are in its own vocabulary, so the policy given here is the plain sampler (an
//! `incremental_policy`, a constrained one, is refused at compile time: its state reads target
//! tokens); the target's rows keep the decoder's policy, constraint included.
//!
//! One topic, drafting across vocabularies, needs about 650 lines: the bridge, the draft's context
//! in its own tokens and the two modes share every piece of text handling, which splitting would
//! spread over headers that only this proposer reads.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "specdec/core/concepts.hpp"
#include "specdec/core/draft_tree.hpp"
#include "specdec/core/error.hpp"
#include "specdec/core/propose_context.hpp"
#include "specdec/core/types.hpp"
#include "specdec/core/verify_result.hpp"
#include "specdec/model/tokenizer.hpp"
#include "specdec/propose/chain_drafter.hpp"
#include "specdec/sampling/constraint.hpp"

namespace specdec {

//! The target's and a draft's vocabularies matched by text (see the file comment).
class vocabulary_bridge {
 public:
  //! The bridge between the vocabularies of `target` and `draft` (both kept, for the string
  //! mode). Throws `errc::invalid_argument` when they share no token.
  [[nodiscard]] static vocabulary_bridge between(tokenizer const& target, tokenizer const& draft) {
    vocabulary_bridge b(static_cast<std::size_t>(target.vocab_size()),
                        static_cast<std::size_t>(draft.vocab_size()));
    b.target_tok_ = std::make_shared<tokenizer const>(target);
    b.draft_tok_ = std::make_shared<tokenizer const>(draft);
    b.target_text_.resize(b.target_vocab_);
    for (std::size_t t = 0; t < b.target_vocab_; ++t)
      b.target_text_[t] = token_text(target, static_cast<token_id>(t));
    // Specials by role.
    for (auto [t, d] : {std::pair{target.bos(), draft.bos()}, std::pair{target.eos(), draft.eos()},
                        std::pair{target.unk(), draft.unk()}})
      if (t != no_token && d != no_token) b.pair(t, d);
    // Text tokens: byte tokens with byte tokens first, then any token of the same text, lowest
    // unpaired id first.
    std::unordered_map<std::string_view, std::vector<token_id>> by_text;
    std::vector<std::string> draft_text(b.draft_vocab_);
    for (std::size_t d = 0; d < b.draft_vocab_; ++d) {
      draft_text[d] = token_text(draft, static_cast<token_id>(d));
      if (!draft_text[d].empty()) by_text[draft_text[d]].push_back(static_cast<token_id>(d));
    }
    for (bool const bytes_only : {true, false}) {
      for (std::size_t t = 0; t < b.target_vocab_; ++t) {
        auto const tid = static_cast<token_id>(t);
        if (b.draft_of_[t] != no_token || b.target_text_[t].empty()) continue;
        bool const is_byte = target.type(tid) == token_type::byte;
        if (bytes_only && !is_byte) continue;
        auto const it = by_text.find(b.target_text_[t]);
        if (it == by_text.end()) continue;
        for (token_id const d : it->second) {
          if (b.target_of_[static_cast<std::size_t>(d)] != no_token) continue;
          if (bytes_only && draft.type(d) != token_type::byte) continue;
          b.pair(tid, d);
          break;
        }
      }
    }
    token_id const fallback = draft.unk() != no_token ? draft.unk() : 0;
    b.finish([&](std::size_t t, std::vector<token_id>& out) {
      if (!b.target_text_[t].empty()) {
        std::vector<token_id> const ids = draft.encode(b.target_text_[t], false, false);
        out.insert(out.end(), ids.begin(), ids.end());
      }
      if (out.empty()) out.push_back(fallback);
    });
    return b;
  }

  //! The bridge to a draft of the same family whose vocabulary differs in size only (padding):
  //! ids below both sizes are paired with themselves; a target id the draft lacks reads as
  //! `fallback` (a draft id). No tokenizer is kept (the string mode needs `between`). Throws
  //! `errc::invalid_argument` for an empty vocabulary or a fallback outside the draft's.
  [[nodiscard]] static vocabulary_bridge padded(std::size_t target_vocab, std::size_t draft_vocab,
                                                token_id fallback = 0) {
    SPECDEC_CHECK(fallback >= 0 && static_cast<std::size_t>(fallback) < draft_vocab,
                  invalid_argument, "vocabulary_bridge::padded: fallback token ", fallback,
                  " is outside the draft's vocabulary of ", draft_vocab);
    vocabulary_bridge b(target_vocab, draft_vocab);
    for (std::size_t t = 0; t < std::min(target_vocab, draft_vocab); ++t)
      b.pair(static_cast<token_id>(t), static_cast<token_id>(t));
    b.finish([&](std::size_t, std::vector<token_id>& out) { out.push_back(fallback); });
    return b;
  }

  [[nodiscard]] std::size_t target_vocab() const noexcept { return target_vocab_; }
  [[nodiscard]] std::size_t draft_vocab() const noexcept { return draft_vocab_; }
  //! Number of paired tokens (the intersection).
  [[nodiscard]] std::size_t shared() const noexcept { return pairs_.size(); }
  //! The (draft, target) pairs, in draft id order.
  [[nodiscard]] std::span<std::pair<token_id, token_id> const> pairs() const noexcept {
    return pairs_;
  }
  //! The target counterpart of draft token `d`, or `no_token`. Throws `errc::out_of_range`.
  [[nodiscard]] token_id target_of(token_id d) const {
    SPECDEC_CHECK(d >= 0 && static_cast<std::size_t>(d) < draft_vocab_, out_of_range,
                  "vocabulary_bridge: draft token ", d, " is outside the draft's vocabulary of ",
                  draft_vocab_);
    return target_of_[static_cast<std::size_t>(d)];
  }
  //! The draft counterpart of target token `t`, or `no_token`. Throws `errc::out_of_range`.
  [[nodiscard]] token_id draft_of(token_id t) const {
    check_target(t);
    return draft_of_[static_cast<std::size_t>(t)];
  }
  //! What the draft reads for target token `t` (see the file comment). Throws
  //! `errc::out_of_range`.
  [[nodiscard]] std::span<token_id const> draft_tokens(token_id t) const {
    check_target(t);
    auto const i = static_cast<std::size_t>(t);
    return std::span<token_id const>(draft_ids_)
        .subspan(offsets_[i], offsets_[i + 1] - offsets_[i]);
  }
  //! Appends the draft tokens of every token of `target_tokens` to `out`.
  void translate(std::span<token_id const> target_tokens, std::vector<token_id>& out) const {
    for (token_id const t : target_tokens) {
      std::span<token_id const> const d = draft_tokens(t);
      out.insert(out.end(), d.begin(), d.end());
    }
  }
  //! The draft tokens that have a target counterpart, as a bitmask over the draft's vocabulary
  //! (bit d of word d / 64).
  [[nodiscard]] std::span<std::uint64_t const> shared_mask() const noexcept { return mask_; }
  //! The tokenizers (null for a `padded` bridge).
  [[nodiscard]] tokenizer const* target_tokenizer() const noexcept { return target_tok_.get(); }
  [[nodiscard]] tokenizer const* draft_tokenizer() const noexcept { return draft_tok_.get(); }
  //! The text token `id` of `tok` stands for, as it reads after another token: a byte token its
  //! byte, a text piece its text; none for control, unknown and unused tokens. Valid as long as
  //! `tok`.
  [[nodiscard]] static std::string_view token_text(tokenizer const& tok, token_id id) {
    token_type const type = tok.type(id);
    if (type == token_type::control || type == token_type::unknown || type == token_type::unused)
      return {};
    return tok.decode(no_token, id);
  }
  //! The text of target token `t` as it reads after another token (empty without a tokenizer).
  [[nodiscard]] std::string_view target_text(token_id t) const {
    check_target(t);
    return target_text_.empty() ? std::string_view() : target_text_[static_cast<std::size_t>(t)];
  }

 private:
  vocabulary_bridge(std::size_t target_vocab, std::size_t draft_vocab)
      : target_vocab_(target_vocab),
        draft_vocab_(draft_vocab),
        target_of_(draft_vocab, no_token),
        draft_of_(target_vocab, no_token) {
    SPECDEC_CHECK(target_vocab > 0 && draft_vocab > 0, invalid_argument,
                  "vocabulary_bridge: an empty vocabulary (target ", target_vocab, ", draft ",
                  draft_vocab, " tokens)");
  }

  void pair(token_id t, token_id d) {
    if (draft_of_[static_cast<std::size_t>(t)] != no_token ||
        target_of_[static_cast<std::size_t>(d)] != no_token)
      return;  // each token at most once
    draft_of_[static_cast<std::size_t>(t)] = d;
    target_of_[static_cast<std::size_t>(d)] = t;
  }

  void check_target(token_id t) const {
    SPECDEC_CHECK(t >= 0 && static_cast<std::size_t>(t) < target_vocab_, out_of_range,
                  "vocabulary_bridge: target token ", t, " is outside the target's vocabulary of ",
                  target_vocab_);
  }

  //! The pair list, the mask and every target token's draft tokens (`unpaired(t, out)` appends
  //! those of an unpaired token).
  template <class Unpaired>
  void finish(Unpaired unpaired) {
    mask_.assign((draft_vocab_ + 63) / 64, 0);
    for (std::size_t d = 0; d < draft_vocab_; ++d) {
      if (target_of_[d] == no_token) continue;
      pairs_.emplace_back(static_cast<token_id>(d), target_of_[d]);
      mask_[d / 64] |= std::uint64_t{1} << (d % 64);
    }
    SPECDEC_CHECK(!pairs_.empty(), invalid_argument, "vocabulary_bridge: the target's vocabulary (",
                  target_vocab_, " tokens) and the draft's (", draft_vocab_,
                  " tokens) share no token");
    offsets_.reserve(target_vocab_ + 1);
    offsets_.push_back(0);
    for (std::size_t t = 0; t < target_vocab_; ++t) {
      if (draft_of_[t] != no_token)
        draft_ids_.push_back(draft_of_[t]);
      else
        unpaired(t, draft_ids_);
      offsets_.push_back(draft_ids_.size());
    }
  }

  std::size_t target_vocab_, draft_vocab_;
  std::vector<token_id> target_of_;  // [draft vocab]
  std::vector<token_id> draft_of_;   // [target vocab]
  std::vector<std::pair<token_id, token_id>> pairs_;
  std::vector<std::uint64_t> mask_;
  std::vector<std::size_t> offsets_;  // [target vocab + 1] into draft_ids_
  std::vector<token_id> draft_ids_;
  std::vector<std::string> target_text_;  // [target vocab], empty for `padded`
  std::shared_ptr<tokenizer const> target_tok_, draft_tok_;
};

//! How a draft of another vocabulary proposes (see the file comment).
enum class vocab_mode {
  intersection,  //!< drafts in the shared tokens, with q rows when sampling (TLI)
  string,        //!< free text re-tokenised by the target's tokenizer, as candidates
};

//! Configuration of `cross_vocabulary_proposer`.
struct cross_vocabulary_config {
  //! The draft's chain: k draft tokens per step (in the string mode, tokens of the draft's
  //! vocabulary; adaptive k and the confidence cutoff are for the intersection mode).
  draft_model_config draft = {};
  vocab_mode mode = vocab_mode::intersection;
  //! The draft reads each committed token as its draft tokens (the bridge's `draft_tokens`), for
  //! vocabularies that tokenise alike, instead of the committed text in its own tokenisation.
  bool token_context = false;
  //! String mode: committed target tokens re-tokenised with the draft's text (0: the draft's
  //! text alone).
  std::size_t lookbehind = 4;
  //! String mode: the most target tokens proposed per step (>= 1; the node budget).
  std::size_t max_target_tokens = 8;

  //! Throws `errc::invalid_argument` naming the field out of its domain.
  void validate() const {
    draft.validate();
    if (mode != vocab_mode::string) return;
    SPECDEC_CHECK(!draft.adaptive, invalid_argument,
                  "cross_vocabulary_config: adaptive k is for the intersection mode");
    SPECDEC_CHECK(max_target_tokens >= 1 && max_target_tokens < max_tree_nodes, invalid_argument,
                  "cross_vocabulary_config: max_target_tokens = ", max_target_tokens,
                  " is outside [1, ", max_tree_nodes - 1, "]");
  }
};

namespace detail {

//! A mask for the next draft row only (token healing, see `cross_vocabulary_proposer`): armed
//! by the proposer before a step, used and disarmed by the first row the policy reads.
struct next_row_mask {
  std::vector<std::uint64_t> words;
  bool armed = false;
};

//! A policy over the draft's rows, masked to the tokens the draft shares with the target (no mask:
//! the policy as it is), the first row after `heal` is armed masked by it instead.
template <sampling_policy Policy>
class shared_tokens_policy {
 public:
  shared_tokens_policy(Policy policy, std::span<std::uint64_t const> mask,
                       std::shared_ptr<next_row_mask> heal)
      : policy_(std::move(policy)), mask_(mask), heal_(std::move(heal)) {}

  void distribution(std::span<float const> logits, token_history history,
                    std::span<float> probs) const {
    std::span<std::uint64_t const> const mask = take(logits.size());
    if (mask.empty()) return policy_.distribution(logits, history, probs);
    check_row_shapes(logits, probs, "cross_vocabulary_proposer");
    masked_distribution(policy_, logits, mask, history, probs);
  }
  [[nodiscard]] token_id greedy_token(std::span<float const> logits, token_history history) const {
    std::span<std::uint64_t const> const mask = take(logits.size());
    if (mask.empty()) return policy_.greedy_token(logits, history);
    return masked_greedy_token(policy_, logits, mask, history);
  }
  [[nodiscard]] token_id sample(std::span<float const> probs, philox& rng) const {
    return policy_.sample(probs, rng);
  }
  [[nodiscard]] bool is_greedy() const noexcept { return policy_.is_greedy(); }

 private:
  //! The mask of this row (checked against its size), or none.
  std::span<std::uint64_t const> take(std::size_t vocab) const {
    std::span<std::uint64_t const> mask = mask_;
    if (heal_ && heal_->armed) {
      heal_->armed = false;
      mask = heal_->words;
    }
    SPECDEC_CHECK(mask.empty() || (vocab + 63) / 64 == mask.size(), invalid_argument,
                  "cross_vocabulary_proposer: a draft row of ", vocab,
                  " logits for a draft vocabulary of ", mask.size() * 64, " tokens at most");
    return mask;
  }

  Policy policy_;
  std::span<std::uint64_t const> mask_;  // into the bridge, which the proposer holds
  std::shared_ptr<next_row_mask> heal_;  // the proposer's (shared: the proposer may move)
};

}  // namespace detail

//! Drafts chains with a causal language model of another vocabulary (see the file comment).
//!
//! \tparam DraftModel a `causal_lm`; held by reference, its cache belongs to this proposer.
//! \tparam Policy     a `sampling_policy` for the draft's rows (not incremental); owned.
//! \tparam Mode       greedy candidates or sampled drafts with q rows (the string mode: greedy).
template <causal_lm DraftModel, sampling_policy Policy, draft_mode Mode = draft_mode::greedy>
class cross_vocabulary_proposer {
  static_assert(!incremental_policy<Policy>,
                "cross_vocabulary_proposer: the draft's rows are in the draft's vocabulary; give "
                "it the plain policy (the target's rows keep the decoder's, constraint included)");

 public:
  static constexpr bool produces_trees = false;                       //!< always a chain
  static constexpr bool samples_drafts = Mode == draft_mode::sample;  //!< q rows when sampling
  static constexpr bool needs_target_hidden = false;  //!< the draft runs on tokens only

  //! A proposer drafting with `draft` (which must outlive it) through `bridge`. Throws
  //! `errc::invalid_argument` for a null bridge, a draft whose vocabulary is not the bridge's, an
  //! invalid `config`, the string mode without the bridge's tokenizers or with sampled drafts.
  cross_vocabulary_proposer(DraftModel& draft, std::shared_ptr<vocabulary_bridge const> bridge,
                            Policy policy, cross_vocabulary_config config = {})
      : draft_(&draft),
        bridge_(checked(std::move(bridge), draft, config)),
        config_(config),
        heal_(std::make_shared<detail::next_row_mask>()),
        drafter_(config.draft,
                 detail::shared_tokens_policy<Policy>(std::move(policy),
                                                      config.mode == vocab_mode::intersection
                                                          ? bridge_->shared_mask()
                                                          : std::span<std::uint64_t const>(),
                                                      heal_),
                 {}) {
    if (config_.mode == vocab_mode::string) index_draft_texts();
  }

  //! Starts a sequence (see `proposer`).
  void begin(std::span<token_id const> prompt) {
    held_.clear();
    ends_.clear();
    draft_ctx_.clear();
    run_text_.clear();
    run_offsets_.clear();
    encoded_ = 0;
    drafter_.begin(*draft_, prompt);
  }

  //! Drafts under ctx.tokens.back() (see the file comment).
  void propose(propose_context const& ctx, draft_tree& tree) {
    SPECDEC_CHECK(!ctx.tokens.empty(), invalid_argument,
                  "cross_vocabulary_proposer: propose with no committed tokens");
    if (inner_.capacity() < tree.capacity()) inner_.reserve(tree.capacity());
    if (config_.token_context || bridge_->draft_tokenizer() == nullptr)
      translate(ctx.tokens);
    else
      string_context(ctx.tokens);
    // The draft cache keeps the longest prefix it shares with the new context (after an accepted
    // step: the old context and the drafts that stand).
    std::span<token_id const> const cached = drafter_.cached_tokens();
    auto const [a, b] =
        std::mismatch(cached.begin(), cached.end(), draft_ctx_.begin(), draft_ctx_.end());
    drafter_.keep(*draft_, static_cast<std::size_t>(a - cached.begin()));
    if (config_.mode == vocab_mode::intersection)
      propose_intersection(ctx, tree);
    else
      propose_string(ctx, tree);
  }

  //! Adapts k (intersection mode). The draft cache is rolled back by the next `propose`.
  void accept(verify_result const& result) {
    if (config_.mode == vocab_mode::intersection) drafter_.accept(*draft_, result);
  }

  //! The node budget: the longest chain one `propose` can draft.
  [[nodiscard]] std::size_t max_nodes() const noexcept {
    return config_.mode == vocab_mode::intersection ? drafter_.max_nodes()
                                                    : config_.max_target_tokens;
  }
  //! The draft length of the next step (draft tokens; before the context and max_nodes limits).
  [[nodiscard]] std::size_t current_k() const noexcept { return drafter_.current_k(); }
  //! Positions held in the draft model's cache.
  [[nodiscard]] std::size_t cached_positions() const noexcept { return drafter_.cached(); }
  //! The draft's context of the last step (draft tokens, the root's included).
  [[nodiscard]] std::span<token_id const> draft_context() const noexcept { return draft_ctx_; }
  [[nodiscard]] DraftModel& draft() const noexcept { return *draft_; }
  [[nodiscard]] vocabulary_bridge const& bridge() const noexcept { return *bridge_; }
  [[nodiscard]] cross_vocabulary_config const& config() const noexcept { return config_; }

 private:
  static std::shared_ptr<vocabulary_bridge const> checked(
      std::shared_ptr<vocabulary_bridge const> bridge, DraftModel const& draft,
      cross_vocabulary_config const& config) {
    SPECDEC_CHECK(bridge != nullptr, invalid_argument, "cross_vocabulary_proposer: no bridge");
    SPECDEC_CHECK(static_cast<std::size_t>(draft.vocab_size()) == bridge->draft_vocab(),
                  invalid_argument, "cross_vocabulary_proposer: the draft model's vocabulary (",
                  draft.vocab_size(), " tokens) is not the bridge's (", bridge->draft_vocab(),
                  " tokens)");
    config.validate();
    if (config.mode == vocab_mode::string) {
      SPECDEC_CHECK(bridge->target_tokenizer() != nullptr && bridge->draft_tokenizer() != nullptr,
                    invalid_argument,
                    "cross_vocabulary_proposer: the string mode needs both tokenizers (a bridge "
                    "made by vocabulary_bridge::between)");
      SPECDEC_CHECK(Mode == draft_mode::greedy, invalid_argument,
                    "cross_vocabulary_proposer: the string mode proposes candidates without q "
                    "rows (draft_mode::greedy; they are verified exactly at any temperature)");
    }
    return bridge;
  }

  //! The draft's context for the committed `tokens`, each replaced by its draft tokens: kept
  //! from the last step for the tokens translated then.
  void translate(std::span<token_id const> tokens) {
    auto const [a, b] = std::mismatch(held_.begin(), held_.end(), tokens.begin(), tokens.end());
    auto const same = static_cast<std::size_t>(a - held_.begin());
    held_.resize(same);
    ends_.resize(same);
    draft_ctx_.resize(same == 0 ? 0 : ends_.back());
    for (std::size_t i = same; i < tokens.size(); ++i) {
      bridge_->translate(tokens.subspan(i, 1), draft_ctx_);
      held_.push_back(tokens[i]);
      ends_.push_back(draft_ctx_.size());
    }
  }

  void propose_intersection(propose_context const& ctx, draft_tree& tree) {
    propose_context inner_ctx = ctx;
    inner_ctx.tokens = draft_ctx_;
    drafter_.propose(*draft_, inner_ctx, inner_);
    tree.reset(ctx.tokens.back());
    if constexpr (Mode == draft_mode::sample) {
      if (tree.q_vocab() != bridge_->target_vocab()) tree.enable_q(bridge_->target_vocab());
    } else {
      if (tree.has_q()) tree.enable_q(0);
    }
    for (std::size_t i = 1; i < inner_.size(); ++i) {
      auto const node = static_cast<node_index>(i);
      node_index const parent = inner_.parent(node);
      token_id const t = bridge_->target_of(inner_.token(node));
      SPECDEC_CHECK(t != no_token, internal, "cross_vocabulary_proposer: draft token ",
                    inner_.token(node), " has no target counterpart");
      if constexpr (Mode == draft_mode::sample) {
        std::span<float const> const q = inner_.q_row(parent);
        std::span<float> const out = tree.q_row(parent);
        std::fill(out.begin(), out.end(), 0.0f);
        for (auto const& [d, target] : bridge_->pairs())
          out[static_cast<std::size_t>(target)] = q[static_cast<std::size_t>(d)];
      }
      tree.add_node(parent, t);
    }
  }

  //! The draft's context for the committed `tokens` in its own tokenisation: each text run (the
  //! text between tokens without text) encoded by the draft's tokenizer, the tokens without text
  //! through the bridge. When `tokens` extends the last step's, only the end of the last run is
  //! encoded again, from its last token that starts a word (a space) before its last two tokens.
  void string_context(std::span<token_id const> tokens) {
    std::size_t const held = held_.size();
    bool const extends =
        held > 0 && held <= tokens.size() && std::equal(held_.begin(), held_.end(), tokens.begin());
    if (!extends) {
      held_.clear();
      draft_ctx_.clear();
      run_text_.clear();
      run_offsets_.clear();
      encoded_ = 0;
    }
    bool mended = false;
    auto const mend = [&] {  // takes back the end of the last run, to encode it with what follows
      mended = true;
      std::size_t const n = run_offsets_.size();
      if (n == 0) return;
      std::size_t r = n < 2 ? 0 : n - 2;
      while (r > 0 && run_text_[run_offsets_[r]] != ' ') --r;
      draft_ctx_.resize(draft_ctx_.size() - (n - r));
      encoded_ = run_offsets_[r];
      run_offsets_.resize(r);
    };
    auto const flush = [&] {  // encodes the run's text after its kept tokens
      if (encoded_ >= run_text_.size()) return;
      std::vector<token_id> const ids = bridge_->draft_tokenizer()->encode(
          std::string_view(run_text_).substr(encoded_), false, false);
      for (token_id const d : ids) {
        run_offsets_.push_back(encoded_);
        encoded_ += text_of_draft(d).size();
        draft_ctx_.push_back(d);
      }
    };
    for (std::size_t i = extends ? held : 0; i < tokens.size(); ++i) {
      std::string_view const piece = bridge_->target_text(tokens[i]);
      if (!piece.empty()) {
        if (!mended) mend();
        run_text_ += piece;
        continue;
      }
      flush();
      bridge_->translate(tokens.subspan(i, 1), draft_ctx_);
      run_text_.clear();
      run_offsets_.clear();
      encoded_ = 0;
      mended = true;  // a new run: nothing to take back
    }
    flush();
    held_.insert(held_.end(), tokens.begin() + static_cast<std::ptrdiff_t>(extends ? held : 0),
                 tokens.end());
  }

  //! The text tokens of the draft's vocabulary in the order of their text (token healing finds
  //! the tokens that begin with a text as one range of it).
  void index_draft_texts() {
    auto const vocab = static_cast<std::size_t>(bridge_->draft_vocab());
    for (std::size_t d = 0; d < vocab; ++d)
      if (!text_of_draft(static_cast<token_id>(d)).empty())
        by_text_.push_back(static_cast<token_id>(d));
    std::stable_sort(by_text_.begin(), by_text_.end(),
                     [&](token_id x, token_id y) { return text_of_draft(x) < text_of_draft(y); });
    heal_->words.assign((vocab + 63) / 64, 0);
  }

  //! Arms the mask of the draft tokens whose text begins with `text` for the next draft row.
  void arm_healing(std::string_view text) {
    std::fill(heal_->words.begin(), heal_->words.end(), 0);
    auto it =
        std::lower_bound(by_text_.begin(), by_text_.end(), text,
                         [&](token_id d, std::string_view t) { return text_of_draft(d) < t; });
    for (; it != by_text_.end() && text_of_draft(*it).starts_with(text); ++it)
      heal_->words[static_cast<std::size_t>(*it) / 64] |= std::uint64_t{1}
                                                          << (static_cast<std::size_t>(*it) % 64);
    heal_->armed = true;
  }

  void propose_string(propose_context const& ctx, draft_tree& tree) {
    tree.reset(ctx.tokens.back());
    if (tree.has_q()) tree.enable_q(0);
    std::size_t const budget =
        std::min({ctx.max_nodes, config_.max_target_tokens, tree.capacity() - 1});
    if (budget == 0 || draft_ctx_.empty()) return;
    // Token healing: the context's last token, when it is text, is drafted again -- the draft's
    // first token must begin with its text -- so that the draft continues from a token boundary
    // of its own rather than after a piece its tokenisation would have merged on.
    std::string_view healed;
    std::size_t context = draft_ctx_.size();
    if (context >= 2 && !run_offsets_.empty()) {
      healed = text_of_draft(draft_ctx_.back());
      --context;
      arm_healing(healed);
    }
    propose_context inner_ctx = ctx;
    inner_ctx.tokens = std::span<token_id const>(draft_ctx_).first(context);
    inner_ctx.max_nodes = config_.draft.k;
    drafter_.propose(*draft_, inner_ctx, inner_);
    heal_->armed = false;
    // The draft's text after the committed text, up to its first token without text.
    std::string drafted;
    token_id end = no_token;
    bool ended = false;
    for (std::size_t i = 1; i < inner_.size(); ++i) {
      token_id const d = inner_.token(static_cast<node_index>(i));
      std::string_view const piece = text_of_draft(d);
      if (piece.empty()) {  // an end of text ends the proposal, another token only the text
        std::vector<token_id> const& ends = bridge_->draft_tokenizer()->end_of_text();
        ended = std::find(ends.begin(), ends.end(), d) != ends.end();
        if (ended) end = bridge_->target_of(d);
        break;
      }
      drafted += piece;
    }
    if (!drafted.starts_with(healed)) return;  // the healed row had no allowed token
    drafted.erase(0, healed.size());
    // Re-tokenise the last committed tokens' text with it; propose what follows them (the draft's
    // text alone when a token spans the boundary).
    tokenizer const& target = *bridge_->target_tokenizer();
    std::size_t const first = ctx.tokens.size() - std::min(config_.lookbehind, ctx.tokens.size());
    std::string window;
    for (std::size_t i = first; i < ctx.tokens.size(); ++i)
      window += bridge_->target_text(ctx.tokens[i]);
    std::size_t const committed = window.size();
    window += drafted;
    std::vector<token_id> ids = target.encode(window, false, false);
    std::size_t length = 0, i = 0;
    while (i < ids.size() && length < committed) length += target.decode(no_token, ids[i++]).size();
    if (length != committed) {
      ids = target.encode(drafted, false, false);
      i = 0;
    }
    std::size_t const n = std::min(ids.size() - i, budget);
    node_index parent = 0;
    for (std::size_t p = 0; p < n; ++p) parent = tree.add_node(parent, ids[i + p]);
    if (ended && end != no_token && n == ids.size() - i && n < budget) tree.add_node(parent, end);
  }

  std::string_view text_of_draft(token_id d) const {
    return vocabulary_bridge::token_text(*bridge_->draft_tokenizer(), d);
  }

  DraftModel* draft_;
  std::shared_ptr<vocabulary_bridge const> bridge_;
  cross_vocabulary_config config_;
  std::shared_ptr<detail::next_row_mask> heal_;  // string: the healed row's mask
  detail::chain_drafter<DraftModel, detail::shared_tokens_policy<Policy>, Mode> drafter_;
  draft_tree inner_;                      // the step's chain in the draft's vocabulary
  std::vector<token_id> held_;            // the committed target tokens the context stands for
  std::vector<std::size_t> ends_;         // intersection: the context's size after each of them
  std::vector<token_id> draft_ctx_;       // the draft's context
  std::string run_text_;                  // string: the text of the context's last run
  std::vector<std::size_t> run_offsets_;  // string: where each of its draft tokens starts
  std::size_t encoded_ = 0;               // string: the bytes of the run those tokens cover
  std::vector<token_id> by_text_;         // string: text tokens of the draft, by text
};

}  // namespace specdec
