// Drafting with another vocabulary: the bridge between two vocabularies against a slow
// reference, the errors, and the proposer in both modes on the stories260K fixture -- greedy
// output identical to autoregressive decoding (alone and batched), a draft that computes the
// target's own function in a permuted vocabulary accepted whole, and sampled output distributed as
// autoregressive sampling (chi-square, with power: q rows carried to the wrong tokens fail it).
#include "specdec/propose/cross_vocabulary.hpp"

#include "support/doctest.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "decode/one_thread.hpp"
#include "decode/sampling_check.hpp"
#include "propose/context.hpp"
#include "specdec/backend/cpu/batched_llama.hpp"
#include "specdec/backend/cpu/llama.hpp"
#include "specdec/core/concepts.hpp"
#include "specdec/decode/autoregressive.hpp"
#include "specdec/decode/batch_decoder.hpp"
#include "specdec/decode/speculative_decoder.hpp"
#include "specdec/model/random.hpp"
#include "specdec/propose/draft_model.hpp"
#include "specdec/propose/per_request.hpp"
#include "specdec/sampling/policy.hpp"
#include "specdec/verify/greedy.hpp"
#include "specdec/verify/speculative_sampling.hpp"
#include "specdec/verify/tree_sampling.hpp"
#include "support/errors.hpp"
#include "support/fixture.hpp"

namespace sd = specdec;

namespace cross_test {

using greedy_cross = sd::cross_vocabulary_proposer<sd::cpu_llama, sd::greedy>;
using sampled_cross =
    sd::cross_vocabulary_proposer<sd::cpu_llama, sd::sampler, sd::draft_mode::sample>;
static_assert(sd::proposer<greedy_cross>);
static_assert(sd::proposer<sampled_cross>);
static_assert(!sd::samples_drafts_v<greedy_cross>);
static_assert(sd::samples_drafts_v<sampled_cross>);

// The pieces, scores and types of a tokenizer, to build another from.
struct vocabulary {
  std::vector<std::string> pieces;
  std::vector<float> scores;
  std::vector<sd::token_type> types;

  static vocabulary of(sd::tokenizer const& tok) {
    vocabulary v;
    for (sd::token_id t = 0; t < tok.vocab_size(); ++t) {
      v.types.push_back(tok.type(t));
      v.scores.push_back(tok.score(t));
      v.pieces.emplace_back(tok.piece(t));
    }
    return v;
  }
  sd::tokenizer make(sd::tokenizer const& like) const {
    return sd::tokenizer(pieces, scores, types, like.bos(), like.eos(), like.unk());
  }
};

// tok512 with its merged pieces (ids 259..) in another order: perm[d] is the tok512 id of draft id
// d (the specials and byte tokens keep their ids).
std::vector<sd::token_id> merge_permutation(std::size_t vocab, unsigned seed) {
  std::vector<sd::token_id> perm(vocab);
  std::iota(perm.begin(), perm.end(), 0);
  std::mt19937 g(seed);
  std::shuffle(perm.begin() + 259, perm.end(), g);
  return perm;
}

sd::tokenizer permuted_tokenizer(std::vector<sd::token_id> const& perm) {
  sd::tokenizer const& tok = fixture::tok512();
  vocabulary const v = vocabulary::of(tok);
  vocabulary p = v;
  for (std::size_t d = 0; d < perm.size(); ++d) {
    auto const t = static_cast<std::size_t>(perm[d]);
    p.pieces[d] = v.pieces[t];
    p.scores[d] = v.scores[t];
    p.types[d] = v.types[t];
  }
  return p.make(tok);
}

// stories260K in the permuted vocabulary: the same function of the text.
std::shared_ptr<sd::llama_weights const> permuted_model(std::vector<sd::token_id> const& perm) {
  auto const& w = fixture::stories260k();
  REQUIRE(w->classifier == w->token_embedding);  // tied: one matrix to permute
  auto const dim = static_cast<std::size_t>(w->config.dim);
  auto rows = std::make_shared<std::vector<float>>(perm.size() * dim);
  for (std::size_t d = 0; d < perm.size(); ++d)
    std::copy_n(w->token_embedding + static_cast<std::size_t>(perm[d]) * dim, dim,
                rows->data() + d * dim);
  auto out = std::make_shared<sd::llama_weights>(*w);
  out->storage =
      std::make_shared<std::pair<std::shared_ptr<void const>, std::shared_ptr<std::vector<float>>>>(
          w->storage, rows);
  out->token_embedding = rows->data();
  out->classifier = rows->data();
  return out;
}

// tok512 with `replaced` merged pieces given texts of their own (so the intersection misses them on
// both sides) -- a tokenizer of another vocabulary for a random draft.
sd::tokenizer altered_tokenizer(std::size_t replaced) {
  sd::tokenizer const& tok = fixture::tok512();
  vocabulary v = vocabulary::of(tok);
  for (std::size_t i = 0; i < replaced; ++i) v.pieces[260 + 6 * i] = "qz" + std::to_string(i);
  v.pieces.push_back(" wonderful");  // a longer vocabulary, with a piece the target lacks
  v.scores.push_back(-1.0f);
  v.types.push_back(sd::token_type::normal);
  return v.make(tok);
}

// The bridge from tok512 to `draft`.
std::shared_ptr<sd::vocabulary_bridge const> bridge_to(sd::tokenizer const& draft) {
  return std::make_shared<sd::vocabulary_bridge const>(
      sd::vocabulary_bridge::between(fixture::tok512(), draft));
}

// A random-weight draft (the fixture's draft shape) over the vocabulary of `tok`.
std::shared_ptr<sd::llama_weights const> random_model(sd::tokenizer const& tok) {
  sd::llama_config shape = test_support::shapes::fixture_draft();
  shape.vocab_size = tok.vocab_size();
  return std::make_shared<sd::llama_weights const>(sd::make_random_llama(shape, 13, 0.5f));
}

// The pairing rule written plainly: specials by role, then byte tokens with byte tokens, then
// equal texts, the lowest unpaired ids first.
std::vector<sd::token_id> reference_pairing(sd::tokenizer const& target,
                                            sd::tokenizer const& draft) {
  auto const text = [](sd::tokenizer const& tok, sd::token_id id) -> std::string {
    sd::token_type const type = tok.type(id);
    if (type == sd::token_type::control || type == sd::token_type::unknown ||
        type == sd::token_type::unused)
      return {};
    return std::string(tok.decode(sd::no_token, id));
  };
  std::vector<sd::token_id> draft_of(static_cast<std::size_t>(target.vocab_size()), sd::no_token);
  std::vector<bool> taken(static_cast<std::size_t>(draft.vocab_size()), false);
  auto const pair = [&](sd::token_id t, sd::token_id d) {
    draft_of[static_cast<std::size_t>(t)] = d;
    taken[static_cast<std::size_t>(d)] = true;
  };
  for (auto [t, d] : {std::pair{target.bos(), draft.bos()}, std::pair{target.eos(), draft.eos()},
                      std::pair{target.unk(), draft.unk()}})
    if (t != sd::no_token && d != sd::no_token) pair(t, d);
  for (int pass = 0; pass < 2; ++pass) {
    for (sd::token_id t = 0; t < target.vocab_size(); ++t) {
      if (draft_of[static_cast<std::size_t>(t)] != sd::no_token || text(target, t).empty())
        continue;
      bool const byte = target.type(t) == sd::token_type::byte;
      if (pass == 0 && !byte) continue;
      for (sd::token_id d = 0; d < draft.vocab_size(); ++d) {
        if (taken[static_cast<std::size_t>(d)] || text(draft, d) != text(target, t)) continue;
        if (pass == 0 && draft.type(d) != sd::token_type::byte) continue;
        pair(t, d);
        break;
      }
    }
  }
  return draft_of;
}

void check_bridge(sd::tokenizer const& target, sd::tokenizer const& draft) {
  auto const bridge = sd::vocabulary_bridge::between(target, draft);
  std::vector<sd::token_id> const want = reference_pairing(target, draft);
  std::size_t shared = 0;
  for (sd::token_id t = 0; t < target.vocab_size(); ++t) {
    CAPTURE(t);
    sd::token_id const d = want[static_cast<std::size_t>(t)];
    CHECK(bridge.draft_of(t) == d);
    if (d != sd::no_token) {
      ++shared;
      CHECK(bridge.target_of(d) == t);
      CHECK(
          std::vector<sd::token_id>(bridge.draft_tokens(t).begin(), bridge.draft_tokens(t).end()) ==
          std::vector<sd::token_id>{d});
      continue;
    }
    // Unpaired: the text encoded by the draft's tokenizer, which reads as the same text.
    std::string const text(bridge.target_text(t));
    std::vector<sd::token_id> const ids(bridge.draft_tokens(t).begin(),
                                        bridge.draft_tokens(t).end());
    REQUIRE_FALSE(ids.empty());
    if (text.empty()) {
      CHECK(ids == std::vector<sd::token_id>{draft.unk()});
    } else {
      CHECK(ids == draft.encode(text, false, false));
      std::string back;
      for (sd::token_id id : ids) back += draft.decode(sd::no_token, id);
      CHECK(back == text);
    }
  }
  CHECK(bridge.shared() == shared);
  for (sd::token_id d = 0; d < draft.vocab_size(); ++d) {
    bool const in =
        ((bridge.shared_mask()[static_cast<std::size_t>(d) / 64] >> (d % 64)) & 1u) != 0;
    CHECK(in == (bridge.target_of(d) != sd::no_token));
  }
}

// Greedy speculative decoding with `p` equals greedy autoregressive decoding on `prompts`;
// returns the totals.
template <class Proposer>
sd::request_stats check_greedy(Proposer& p, std::vector<std::vector<sd::token_id>> const& prompts,
                               std::size_t new_tokens = 64) {
  sd::cpu_llama target(fixture::stories260k(), decode_test::one_thread());
  sd::decode_config config;
  config.max_new_tokens = new_tokens;
  config.max_draft_nodes = 16;
  sd::autoregressive_decoder ar(target, sd::greedy{}, config);
  sd::speculative_decoder dec(target, p, sd::greedy_verifier{}, sd::greedy{}, config);
  sd::request_stats totals;
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    CAPTURE(i);
    auto const want = ar.generate(prompts[i]);
    auto const got = dec.generate(prompts[i]);
    CHECK(got.tokens == want.tokens);
    totals.steps += got.stats.steps;
    totals.drafted += got.stats.drafted;
    totals.accepted += got.stats.accepted;
  }
  return totals;
}

std::vector<std::vector<sd::token_id>> some_prompts(std::size_t n) {
  auto prompts = fixture::encoded_prompts();
  prompts.resize(std::min(n, prompts.size()));
  prompts.push_back(fixture::once_upon_a_time());
  return prompts;
}

// A proposer whose q rows are not the distributions its drafts were drawn from: each row's mass
// on the tokens below 300 is weighted 16 times (renormalised), as a bridge that carried q to the
// wrong tokens would leave them. The chi-square test must catch it.
class skewed_q {
 public:
  static constexpr bool produces_trees = false;
  static constexpr bool samples_drafts = true;
  explicit skewed_q(sampled_cross& inner) : inner_(&inner) {}
  void begin(std::span<sd::token_id const> prompt) { inner_->begin(prompt); }
  void propose(sd::propose_context const& ctx, sd::draft_tree& tree) {
    inner_->propose(ctx, tree);
    for (std::size_t i = 0; i + 1 < tree.size(); ++i) {
      std::span<float> const q = tree.q_row(static_cast<sd::node_index>(i));
      double sum = 0.0;
      for (std::size_t t = 0; t < q.size(); ++t) sum += (q[t] *= t < 300 ? 16.0f : 1.0f);
      for (float& x : q) x = static_cast<float>(x / sum);
    }
  }
  void accept(sd::verify_result const& r) { inner_->accept(r); }
  [[nodiscard]] std::size_t max_nodes() const { return inner_->max_nodes(); }

 private:
  sampled_cross* inner_;
};

}  // namespace cross_test

TEST_CASE("vocabulary_bridge: pairs tokens by text, as the plain reference does") {
  using namespace cross_test;
  sd::tokenizer const& tok = fixture::tok512();
  auto const perm = merge_permutation(static_cast<std::size_t>(tok.vocab_size()), 7);
  sd::tokenizer const permuted = permuted_tokenizer(perm);
  sd::tokenizer const altered = altered_tokenizer(20);
  check_bridge(tok, permuted);
  check_bridge(tok, altered);
  check_bridge(altered, tok);
  // The permutation is recovered exactly: every token paired with its image.
  auto const bridge = sd::vocabulary_bridge::between(tok, permuted);
  CHECK(bridge.shared() == static_cast<std::size_t>(tok.vocab_size()));
  for (std::size_t d = 0; d < perm.size(); ++d)
    CHECK(bridge.target_of(static_cast<sd::token_id>(d)) == perm[d]);
  // The altered vocabulary: 20 replaced pieces and one new piece are outside the intersection.
  auto const partial = sd::vocabulary_bridge::between(tok, altered);
  CHECK(partial.shared() == static_cast<std::size_t>(tok.vocab_size()) - 20);
  CHECK(partial.target_of(512) == sd::no_token);
  // Translation: the draft reads the target's text.
  std::vector<sd::token_id> const prompt =
      tok.encode("Once upon a time, a wonderful bird sang.", true);
  std::vector<sd::token_id> translated;
  partial.translate(prompt, translated);
  CHECK(altered.decode(translated) == tok.decode(prompt));

  // A padded vocabulary: the same ids, the rest read as the fallback.
  auto const padded = sd::vocabulary_bridge::padded(520, 512, 0);
  CHECK(padded.shared() == 512);
  CHECK(padded.draft_of(511) == 511);
  CHECK(padded.draft_of(515) == sd::no_token);
  CHECK(std::vector<sd::token_id>(padded.draft_tokens(515).begin(),
                                  padded.draft_tokens(515).end()) == std::vector<sd::token_id>{0});
  CHECK(padded.target_tokenizer() == nullptr);
  auto const smaller = sd::vocabulary_bridge::padded(500, 512, 3);
  CHECK(smaller.target_of(505) == sd::no_token);
  CHECK(smaller.shared() == 500);
}

TEST_CASE("vocabulary_bridge and cross_vocabulary_proposer: bad input is refused clearly") {
  using namespace cross_test;
  sd::tokenizer const& tok = fixture::tok512();
  // Vocabularies that share nothing: no specials, other texts.
  sd::tokenizer const a({"x", "y"}, {0.0f, 0.0f}, {sd::token_type::normal, sd::token_type::normal},
                        sd::no_token, sd::no_token, sd::no_token);
  sd::tokenizer const b({"u", "v", "w"}, {0.0f, 0.0f, 0.0f},
                        {sd::token_type::normal, sd::token_type::normal, sd::token_type::normal},
                        sd::no_token, sd::no_token, sd::no_token);
  test_support::check_error([&] { (void)sd::vocabulary_bridge::between(a, b); },
                            sd::errc::invalid_argument, "share no token");
  test_support::check_error([&] { (void)sd::vocabulary_bridge::padded(10, 8, 8); },
                            sd::errc::invalid_argument, "fallback token 8");
  test_support::check_error([&] { (void)sd::vocabulary_bridge::padded(0, 8, 0); },
                            sd::errc::invalid_argument, "empty vocabulary");
  auto const bridge = std::make_shared<sd::vocabulary_bridge const>(
      sd::vocabulary_bridge::between(tok, altered_tokenizer(3)));
  test_support::check_error([&] { (void)bridge->draft_tokens(512); }, sd::errc::out_of_range,
                            "target token 512");
  test_support::check_error([&] { (void)bridge->target_of(-1); }, sd::errc::out_of_range,
                            "draft token -1");

  sd::cpu_llama wrong(fixture::random_draft(), decode_test::one_thread());  // 512 tokens, not 513
  test_support::check_error([&] { greedy_cross p(wrong, bridge, sd::greedy{}); },
                            sd::errc::invalid_argument, "is not the bridge's (513 tokens)");
  test_support::check_error([&] { greedy_cross p(wrong, nullptr, sd::greedy{}); },
                            sd::errc::invalid_argument, "no bridge");
  sd::cpu_llama draft(fixture::random_draft(), decode_test::one_thread());
  auto const padded =
      std::make_shared<sd::vocabulary_bridge const>(sd::vocabulary_bridge::padded(512, 512));
  test_support::check_error(
      [&] { greedy_cross p(draft, padded, sd::greedy{}, {.mode = sd::vocab_mode::string}); },
      sd::errc::invalid_argument, "needs both tokenizers");
  auto const same = bridge_to(tok);
  test_support::check_error(
      [&] {
        sampled_cross p(draft, same, sd::sampler(sd::sampling_params{}),
                        {.mode = sd::vocab_mode::string});
      },
      sd::errc::invalid_argument, "draft_mode::greedy");
  test_support::check_error(
      [&] {
        greedy_cross p(draft, same, sd::greedy{},
                       {.draft = {.adaptive = true}, .mode = sd::vocab_mode::string});
      },
      sd::errc::invalid_argument, "adaptive k is for the intersection mode");
  test_support::check_error(
      [&] {
        greedy_cross p(draft, same, sd::greedy{},
                       {.mode = sd::vocab_mode::string, .max_target_tokens = 0});
      },
      sd::errc::invalid_argument, "max_target_tokens = 0");
  // A committed token outside the target's vocabulary.
  greedy_cross p(draft, same, sd::greedy{});
  sd::draft_tree tree;
  std::vector<sd::token_id> const bad{1, 600};
  p.begin(bad);
  test_support::check_error([&] { p.propose(propose_test::make_ctx(bad, 4), tree); },
                            sd::errc::out_of_range, "target token 600");
}

TEST_CASE("cross_vocabulary_proposer: the target's own function in another vocabulary") {
  using namespace cross_test;
  sd::tokenizer const& tok = fixture::tok512();
  auto const perm = merge_permutation(static_cast<std::size_t>(tok.vocab_size()), 7);
  auto const bridge = bridge_to(permuted_tokenizer(perm));
  sd::cpu_llama draft(permuted_model(perm), decode_test::one_thread());
  auto const prompts = some_prompts(4);

  SUBCASE("intersection, the committed tokens read one by one: every draft accepted") {
    greedy_cross p(draft, bridge, sd::greedy{}, {.draft = {.k = 4}, .token_context = true});
    auto const s = check_greedy(p, prompts);
    CHECK(s.drafted > 0);
    CHECK(s.accepted == s.drafted);
  }
  SUBCASE("intersection, the committed text in the draft's own tokens") {
    greedy_cross p(draft, bridge, sd::greedy{}, {.draft = {.k = 4}});
    auto const s = check_greedy(p, prompts);
    MESSAGE("intersection, text context, the target's own function: " << s.acceptance_rate()
                                                                      << " accepted");
    CHECK(s.acceptance_rate() > 0.9);
  }
  SUBCASE("string: the draft's text re-tokenised, nearly every candidate accepted") {
    greedy_cross p(draft, bridge, sd::greedy{},
                   {.draft = {.k = 5}, .mode = sd::vocab_mode::string});
    auto const s = check_greedy(p, prompts);
    CHECK(s.drafted > 0);
    MESSAGE("string mode, the target's own function: " << s.acceptance_rate() << " accepted, "
                                                       << s.mean_accepted_length()
                                                       << " tokens per step");
    CHECK(s.acceptance_rate() > 0.9);
  }
}

TEST_CASE("cross_vocabulary_proposer: the draft reads the committed text in its own tokens") {
  using namespace cross_test;
  sd::tokenizer const& tok = fixture::tok512();
  sd::tokenizer const altered = altered_tokenizer(20);
  auto const bridge = bridge_to(altered);
  sd::cpu_llama draft(random_model(altered), decode_test::one_thread());
  // The reference text, committed a few tokens at a time (as steps commit them), then a history
  // that does not extend the last one.
  std::vector<sd::token_id> text = fixture::reference_ids();
  text.insert(text.begin(), 1);
  std::mt19937 g(5);
  for (sd::vocab_mode const mode : {sd::vocab_mode::intersection, sd::vocab_mode::string}) {
    greedy_cross p(draft, bridge, sd::greedy{}, {.draft = {.k = 2}, .mode = mode});
    p.begin(std::span(text).first(5));
    sd::draft_tree tree;
    std::vector<std::size_t> ends;
    for (std::size_t n = 5; n < text.size(); n += 1 + g() % 6) ends.push_back(n);
    ends.push_back(40);
    for (std::size_t const n : ends) {
      CAPTURE(n);
      std::span<sd::token_id const> const committed = std::span(text).first(n);
      p.propose(propose_test::make_ctx(committed, 4), tree);
      std::vector<sd::token_id> const got(p.draft_context().begin(), p.draft_context().end());
      // The text after BOS, as the tokens read after another token (the dummy prefix included).
      std::string const written = tok.decode(committed.subspan(1));
      std::vector<sd::token_id> const want = altered.encode(written, true, false);
      CHECK(got == want);
      CHECK(altered.decode(got) == tok.decode(committed));
      CHECK(tree.size() >= 1);
    }
  }
}

TEST_CASE("cross_vocabulary_proposer: greedy output equals autoregressive with a random draft") {
  using namespace cross_test;
  sd::tokenizer const altered = altered_tokenizer(20);
  auto const bridge = bridge_to(altered);
  sd::cpu_llama draft(random_model(altered), decode_test::one_thread());
  auto const prompts = some_prompts(3);
  greedy_cross tli(draft, bridge, sd::greedy{},
                   {.draft = {.k = 2, .adaptive = true, .k_min = 1, .k_max = 5}});
  greedy_cross text(draft, bridge, sd::greedy{},
                    {.draft = {.k = 3}, .mode = sd::vocab_mode::string, .lookbehind = 2});
  CHECK(check_greedy(tli, prompts).drafted > 0);
  CHECK(check_greedy(text, prompts).steps > 0);
}

TEST_CASE("cross_vocabulary_proposer: one per request in a batch, as alone") {
  using namespace cross_test;
  sd::tokenizer const& tok = fixture::tok512();
  auto const perm = merge_permutation(static_cast<std::size_t>(tok.vocab_size()), 9);
  auto const bridge = bridge_to(permuted_tokenizer(perm));
  auto const draft_weights = permuted_model(perm);
  using owning = sd::owning_proposer<sd::cpu_llama, greedy_cross>;
  auto const make = [&](sd::vocab_mode mode) {
    return sd::per_request_proposer<owning>([&, mode] {
      return owning(std::make_unique<sd::cpu_llama>(draft_weights, decode_test::one_thread()),
                    [&](sd::cpu_llama& m) {
                      return greedy_cross(m, bridge, sd::greedy{},
                                          {.draft = {.k = 3}, .mode = mode});
                    });
    });
  };
  auto const prompts = some_prompts(4);
  sd::decode_config config;
  config.max_new_tokens = 48;
  sd::cpu_llama single(fixture::stories260k(), decode_test::one_thread());
  sd::autoregressive_decoder ar(single, sd::greedy{}, config);
  for (sd::vocab_mode const mode : {sd::vocab_mode::intersection, sd::vocab_mode::string}) {
    CAPTURE(static_cast<int>(mode));
    auto proposer = make(mode);
    sd::cpu_batched_llama target(fixture::stories260k(),
                                 {.model = decode_test::one_thread(), .max_slots = 3});
    sd::batch_decoder<sd::cpu_batched_llama, decltype(proposer), sd::greedy_verifier, sd::greedy>
        decoder(target, proposer);
    std::vector<std::size_t> ids;
    for (auto const& prompt : prompts) ids.push_back(decoder.submit(prompt, sd::greedy{}, config));
    decoder.run();
    for (std::size_t i = 0; i < prompts.size(); ++i) {
      auto const r = decoder.take(ids[i]);
      REQUIRE(r.has_value());
      CHECK(r->result.tokens == ar.generate(prompts[i]).tokens);
    }
    CHECK(decoder.stats().accepted > 0);
  }
}

TEST_CASE(
    "cross_vocabulary_proposer: sampled output matches autoregressive sampling (chi-square)") {
  using namespace cross_test;
  using sampling_check::check_counts;
  sd::tokenizer const& tok = fixture::tok512();
  auto const perm = merge_permutation(static_cast<std::size_t>(tok.vocab_size()), 7);
  auto const bridge = bridge_to(permuted_tokenizer(perm));
  sd::cpu_llama draft(permuted_model(perm), decode_test::one_thread());
  // Another draft, of an altered vocabulary and random weights: drafts mostly rejected, and draft
  // tokens outside the intersection.
  sd::tokenizer const altered = altered_tokenizer(40);
  auto const partial = bridge_to(altered);
  sd::cpu_llama random(random_model(altered), decode_test::one_thread());
  std::vector<sd::token_id> const prompt{1, 399};
  static auto const joint = sampling_check::exact_joint(fixture::stories260k(), prompt);
  sd::cpu_llama target(fixture::stories260k(), decode_test::one_thread());
  auto const policy = sampling_check::target_policy();

  // Samples the pairs with `p` and `verifier` and checks them against the joint.
  auto const sampled = [&](auto& p, auto verifier, char const* what) {
    sd::speculative_decoder dec(target, p, verifier, policy, sampling_check::two_tokens());
    sd::request_stats s;
    check_counts(sampling_check::sample_pairs(dec, prompt, &s), joint, sampling_check::trials,
                 what);
    return s;
  };
  SUBCASE("intersection, sampled drafts with q rows, speculative sampling") {
    sampled_cross p(draft, bridge, policy, {.draft = {.k = 3}});
    sd::request_stats const s =
        sampled(p, sd::speculative_sampling_verifier{}, "intersection, the target's function");
    CHECK(s.accepted > s.drafted / 2);  // a draft this good: the test bites
  }
  SUBCASE("intersection, a random draft of an altered vocabulary") {
    sampled_cross p(random, partial, policy, {.draft = {.k = 3}});
    CHECK(sampled(p, sd::speculative_sampling_verifier{}, "intersection, random draft").drafted >
          0);
  }
  SUBCASE("string mode, candidates, tree verifier (point masses)") {
    sd::cross_vocabulary_proposer<sd::cpu_llama, sd::sampler> p(
        draft, bridge, policy, {.draft = {.k = 3}, .mode = sd::vocab_mode::string});
    CHECK(sampled(p, sd::tree_verifier{}, "string mode").accepted > 0);
  }
  SUBCASE("power: q rows that are not the drafts' distributions are caught") {
    sampled_cross inner(draft, bridge, policy, {.draft = {.k = 3}});
    skewed_q p(inner);
    sd::speculative_decoder dec(target, p, sd::speculative_sampling_verifier{}, policy,
                                sampling_check::two_tokens());
    auto const counts = sampling_check::sample_pairs(dec, prompt);
    auto const [stat, cells] = sampling_check::chi2(counts, joint, sampling_check::trials);
    double const limit = sampling_check::chi2_threshold(static_cast<double>(cells - 1));
    MESSAGE("skewed q rows: chi2 = " << stat << " over " << cells << " cells, limit " << limit);
    CHECK(stat > limit);
  }
}

TEST_CASE("cross_vocabulary_proposer: the trained draft of another vocabulary, every prompt") {
  using namespace cross_test;
  // Greedy output equals autoregressive on every TinyStories prompt in both modes; the tokens per
  // target forward of the better mode reach 80% of the same-vocabulary draft's (same shape, same
  // recipe; tools/draft/cross/README.md).
  auto const bridge = std::make_shared<sd::vocabulary_bridge const>(
      sd::vocabulary_bridge::between(fixture::tok512(), fixture::tok1024()));
  sd::cpu_llama cross(fixture::cross_draft(), decode_test::one_thread());
  sd::cpu_llama same(fixture::same_vocab_draft(), decode_test::one_thread());
  std::vector<std::vector<sd::token_id>> const prompts = fixture::encoded_prompts();
  greedy_cross tli(cross, bridge, sd::greedy{}, {.draft = {.k = 4}});
  greedy_cross text(cross, bridge, sd::greedy{},
                    {.draft = {.k = 4}, .mode = sd::vocab_mode::string});
  sd::cpu_llama target(fixture::stories260k(), decode_test::one_thread());
  sd::draft_model_proposer baseline(same, target, sd::greedy{}, {.k = 4});
  auto const per_forward = [](sd::request_stats const& s) {
    return static_cast<double>(s.steps + s.accepted) / static_cast<double>(s.steps);
  };
  double const a = per_forward(check_greedy(tli, prompts, 96));
  double const b = per_forward(check_greedy(text, prompts, 96));
  double const c = per_forward(check_greedy(baseline, prompts, 96));
  MESSAGE("tokens per target forward, k = 4: intersection " << a << ", string " << b
                                                            << ", same-vocabulary draft " << c);
  CHECK(std::max(a, b) >= 0.8 * c);
}
