// The batch decoder on the stories260K fixture: every request's output in a batch equals its
// output decoded alone (speculative_decoder, or autoregressive_decoder for a request that drafts
// nothing), greedy and sampled, with requests joining and leaving at random steps; cancellation;
// slot reuse; failures isolated to their request.
#include "specdec/decode/batch_decoder.hpp"

#include "support/doctest.hpp"

#include <cstdint>
#include <map>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "decode/jobs.hpp"
#include "specdec/backend/cpu/batched_llama.hpp"
#include "specdec/backend/cpu/llama.hpp"
#include "specdec/decode/autoregressive.hpp"
#include "specdec/decode/speculative_decoder.hpp"
#include "specdec/propose/draft_model.hpp"
#include "specdec/propose/per_request.hpp"
#include "specdec/propose/prompt_lookup.hpp"
#include "specdec/sampling/policy.hpp"
#include "specdec/verify/greedy.hpp"
#include "specdec/verify/speculative_sampling.hpp"
#include "specdec/verify/tree_sampling.hpp"
#include "support/errors.hpp"
#include "support/fixture.hpp"

namespace sd = specdec;

namespace {

using lookup = sd::prompt_lookup_proposer;
using lookups = sd::per_request_proposer<lookup>;

static_assert(sd::batch_proposer<lookups>);
static_assert(!sd::batch_proposer<lookup>);
static_assert(sd::produces_trees_v<lookups>);

sd::prompt_lookup_config const tree_config{.n_max = 3, .n_min = 1, .k = 4, .max_branches = 3};

sd::cpu_batched_llama batched_model(std::size_t slots, std::size_t context = 0) {
  return sd::cpu_batched_llama(
      fixture::stories260k(),
      {.model = {.threads = 1, .max_context = context}, .max_slots = slots});
}

using decode_test::job;
using decode_test::policy_of;

// `j` decoded alone: the speculative decoder with a prompt lookup tree proposer and the tree
// verifier, or the autoregressive decoder when it drafts nothing.
sd::decode_result alone(job const& j) {
  sd::cpu_llama target(fixture::stories260k(), {.threads = 1});
  if (j.config.max_draft_nodes == std::optional<std::size_t>(0)) {
    sd::autoregressive_decoder ar(target, j.policy, j.config);
    return ar.generate(j.prompt);
  }
  lookup proposer(tree_config);
  sd::speculative_decoder d(target, proposer, sd::tree_verifier{}, j.policy, j.config);
  return d.generate(j.prompt);
}

// A mix of jobs over the fixture prompts: greedy and sampled with different parameters and seeds,
// different lengths and node caps, one that drafts nothing.
std::vector<job> mixed_jobs(std::size_t count) {
  auto const prompts = fixture::encoded_prompts();
  std::vector<job> jobs;
  for (std::size_t i = 0; i < count; ++i) {
    job j{prompts[i % prompts.size()], policy_of(0.0f), {}};
    switch (i % 4) {
      case 1:
        j.policy = policy_of(1.0f);
        break;
      case 2:
        j.policy = policy_of(0.8f, 0.9f);
        break;
      case 3:
        j.policy = policy_of(1.2f, 1.0f, 20);
        break;
      default:
        break;
    }
    j.config.max_new_tokens = 20 + 7 * (i % 5);
    j.config.seed = 100 + i;
    j.config.eos_tokens = fixture::tok512().end_of_text();
    if (i % 5 == 3) j.config.max_draft_nodes = i % 2 == 0 ? 2 : 0;  // a cap, or no speculation
    jobs.push_back(std::move(j));
  }
  return jobs;
}

}  // namespace

TEST_CASE("batch_decoder: each request equals its decoding alone, joining and leaving at random") {
  std::vector<job> const jobs = mixed_jobs(12);
  std::vector<sd::decode_result> want;
  for (job const& j : jobs) want.push_back(alone(j));

  for (std::size_t slots : {std::size_t{3}, std::size_t{16}}) {
    CAPTURE(slots);
    sd::cpu_batched_llama target = batched_model(slots);
    lookups proposer([] { return lookup(tree_config); });
    sd::batch_decoder<sd::cpu_batched_llama, lookups, sd::tree_verifier, sd::sampler> decoder(
        target, proposer);
    std::mt19937_64 rng(slots);
    std::vector<std::uint64_t> ids(jobs.size());
    std::vector<std::vector<sd::token_id>> streamed(jobs.size());
    std::size_t next = 0, steps = 0;
    while (next < jobs.size() || decoder.running() + decoder.waiting() > 0) {
      // Requests arrive at random steps, a few at a time.
      for (std::size_t n = rng() % 3; n > 0 && next < jobs.size(); --n, ++next) {
        std::size_t const i = next;
        ids[i] = decoder.submit(jobs[i].prompt, jobs[i].policy, jobs[i].config,
                                {.on_token = [&streamed, i](sd::token_id t) {
                                  streamed[i].push_back(t);
                                  return true;
                                }});
      }
      (void)decoder.step();
      REQUIRE(++steps < 2000);
    }
    for (std::size_t i = 0; i < jobs.size(); ++i) {
      CAPTURE(i);
      std::optional<sd::batch_result> got = decoder.take(ids[i]);
      REQUIRE(got.has_value());
      CHECK_FALSE(got->failed());
      CHECK(got->result.tokens == want[i].tokens);
      CHECK(got->result.reason == want[i].reason);
      CHECK(streamed[i] == got->result.tokens);
      CHECK(got->result.stats.generated == got->result.tokens.size());
      if (jobs[i].config.max_draft_nodes == std::optional<std::size_t>(0))
        CHECK(got->result.stats.drafted == 0);
      CHECK_FALSE(decoder.take(ids[i]).has_value());  // taken once
    }
    sd::batch_stats const& s = decoder.stats();
    CHECK(s.finished == jobs.size());
    CHECK(s.failed == 0);
    CHECK(s.max_batch <= slots);
    std::size_t generated = 0;
    for (auto const& w : want) generated += w.tokens.size();
    CHECK(s.committed == generated);
    CHECK(s.drafted >= s.accepted);
    CHECK(target.free_slots() == slots);  // every slot came back
    if (slots == 3) CHECK(s.max_batch == 3);
  }
}

TEST_CASE("batch_decoder: the adaptive policy keeps greedy outputs identical") {
  auto const prompts = fixture::encoded_prompts();
  sd::cpu_batched_llama target = batched_model(8);
  lookups proposer([] { return lookup(tree_config); });
  sd::adaptive_speculation adaptive(
      {.max_k = 6, .calibration_rows = {1, 2, 4, 8, 16, 32, 64}, .calibration_context = 32});
  sd::batch_decoder<sd::cpu_batched_llama, lookups, sd::tree_verifier, sd::sampler,
                    sd::adaptive_speculation>
      decoder(target, proposer, {}, adaptive);
  std::vector<job> jobs;
  for (std::size_t i = 0; i < 6; ++i) {
    job j{prompts[i], policy_of(0.0f), {}};
    j.config.max_new_tokens = 40;
    jobs.push_back(j);
  }
  std::vector<std::uint64_t> ids;
  for (job const& j : jobs) ids.push_back(decoder.submit(j.prompt, j.policy, j.config));
  decoder.run();
  CHECK(decoder.speculation().costs().calibrated());  // before the first step
  for (std::size_t i = 0; i < jobs.size(); ++i) {
    auto const got = decoder.take(ids[i]);
    REQUIRE(got.has_value());
    CHECK(got->result.tokens == alone(jobs[i]).tokens);
  }
}

TEST_CASE("batch_decoder: cancellation, callbacks and slot reuse") {
  auto const prompts = fixture::encoded_prompts();
  sd::cpu_batched_llama target = batched_model(2);
  lookups proposer([] { return lookup(tree_config); });
  sd::batch_decoder<sd::cpu_batched_llama, lookups, sd::tree_verifier, sd::sampler> decoder(
      target, proposer);
  sd::decode_config config;
  config.max_new_tokens = 30;
  job const full{prompts[0], policy_of(0.0f), config};
  auto const want = alone(full);

  std::map<std::uint64_t, sd::finish_reason> finished;
  sd::batch_callbacks watch{.on_token = {},
                            .on_finish = [&](std::uint64_t id, sd::batch_result const& r) {
                              finished[id] = r.result.reason;
                            }};
  auto const running = decoder.submit(prompts[0], policy_of(0.0f), config, watch);
  std::size_t seen = 0;
  sd::batch_callbacks stop_at_5 = watch;
  stop_at_5.on_token = [&seen](sd::token_id) { return ++seen < 5; };  // cancels at its 5th token
  auto const stopped = decoder.submit(prompts[1], policy_of(0.0f), config, stop_at_5);
  auto const queued = decoder.submit(prompts[2], policy_of(0.0f), config, watch);
  auto const later = decoder.submit(prompts[0], policy_of(0.0f), config, watch);
  (void)decoder.step();
  CHECK(decoder.running() == 2);  // two slots: the others wait
  CHECK(decoder.waiting() == 2);
  CHECK(decoder.cancel(queued));  // a waiting request ends at once, without tokens
  CHECK(finished.at(queued) == sd::finish_reason::cancelled);
  (void)decoder.step();
  CHECK(decoder.cancel(running));  // a running one at the next step, with what it has
  CHECK_FALSE(decoder.cancel(12345));
  decoder.run();
  CHECK_FALSE(decoder.cancel(running));  // over

  auto const r_running = decoder.take(running);
  REQUIRE(r_running.has_value());
  CHECK(r_running->result.reason == sd::finish_reason::cancelled);
  CHECK_FALSE(r_running->result.tokens.empty());
  CHECK(r_running->result.tokens.size() < want.tokens.size());
  CHECK(std::equal(r_running->result.tokens.begin(), r_running->result.tokens.end(),
                   want.tokens.begin()));
  auto const r_stopped = decoder.take(stopped);
  REQUIRE(r_stopped.has_value());
  CHECK(r_stopped->result.reason == sd::finish_reason::cancelled);
  CHECK(r_stopped->result.tokens.size() == 5);
  auto const r_queued = decoder.take(queued);
  REQUIRE(r_queued.has_value());
  CHECK(r_queued->result.tokens.empty());
  // The last request ran in a slot another request had used, and equals its decoding alone.
  auto const r_later = decoder.take(later);
  REQUIRE(r_later.has_value());
  CHECK(r_later->result.tokens == want.tokens);
  CHECK(r_later->waiting_steps >= 2);
  CHECK(finished.size() == 4);
  CHECK(finished.at(later) == sd::finish_reason::max_tokens);
  CHECK(target.free_slots() == 2);
}

namespace {

// A prompt lookup proposer that throws when its request's prompt starts with a given token.
struct fragile_proposer {
  static constexpr bool produces_trees = true;
  lookup inner{tree_config};
  bool broken = false;
  void begin(std::span<sd::token_id const> prompt) {
    broken = prompt.size() > 1 && prompt[1] == 7;
    inner.begin(prompt);
  }
  void propose(sd::propose_context const& ctx, sd::draft_tree& tree) {
    if (broken && ctx.tokens.size() > 12) throw std::runtime_error("fragile: cannot draft");
    inner.propose(ctx, tree);
  }
  void accept(sd::verify_result const& r) { inner.accept(r); }
  [[nodiscard]] std::size_t max_nodes() const noexcept { return inner.max_nodes(); }
};

}  // namespace

TEST_CASE("batch_decoder: a bad request fails alone and the others keep running") {
  auto const prompts = fixture::encoded_prompts();
  sd::cpu_batched_llama target = batched_model(4, 64);  // a context of 64 positions
  using fragile = sd::per_request_proposer<fragile_proposer>;
  fragile proposer([] { return fragile_proposer{}; });
  sd::batch_decoder<sd::cpu_batched_llama, fragile, sd::tree_verifier, sd::sampler> decoder(
      target, proposer);
  sd::decode_config config;
  config.max_new_tokens = 20;
  std::vector<sd::token_id> const good = prompts[0];
  std::vector<sd::token_id> too_long(80, 5);
  too_long[0] = 1;
  std::vector<sd::token_id> bad_token = good;
  bad_token[2] = 600;
  std::vector<sd::token_id> const breaks_proposer{1, 7, 9, 11};
  sd::decode_config bad_config = config;
  bad_config.eos_tokens = {-3};

  auto const ok1 = decoder.submit(good, policy_of(0.0f), config);
  auto const e_long = decoder.submit(too_long, policy_of(0.0f), config);
  auto const e_empty = decoder.submit({}, policy_of(0.0f), config);
  auto const e_token = decoder.submit(bad_token, policy_of(0.0f), config);
  auto const e_config = decoder.submit(good, policy_of(0.0f), bad_config);
  auto const e_proposer = decoder.submit(breaks_proposer, policy_of(0.0f), config);
  auto const e_callback = decoder.submit(
      prompts[3], policy_of(1.0f), config,
      {.on_token = [](sd::token_id) -> bool { throw std::runtime_error("callback broke"); }});
  sd::decode_config none = config;
  none.max_new_tokens = 0;
  auto const nothing = decoder.submit(good, policy_of(0.0f), none);
  auto const ok2 = decoder.submit(prompts[4], policy_of(1.0f), config);
  decoder.run();

  auto const expect_failed = [&](std::uint64_t id, sd::errc code, std::string const& fragment) {
    auto const r = decoder.take(id);
    REQUIRE(r.has_value());
    CHECK(r->failed());
    CHECK(r->code == code);
    CHECK_MESSAGE(r->error.find(fragment) != std::string::npos, r->error);
  };
  expect_failed(e_long, sd::errc::context_overflow, "does not fit the context of 64");
  expect_failed(e_empty, sd::errc::invalid_argument, "the prompt is empty");
  expect_failed(e_token, sd::errc::out_of_range, "prompt token 600 at index 2");
  expect_failed(e_config, sd::errc::invalid_argument, "eos_tokens[0] = -3");
  expect_failed(e_proposer, sd::errc::internal, "fragile: cannot draft");
  expect_failed(e_callback, sd::errc::internal, "callback broke");
  auto const r_nothing = decoder.take(nothing);
  REQUIRE(r_nothing.has_value());
  CHECK(r_nothing->result.reason == sd::finish_reason::max_tokens);
  CHECK(r_nothing->result.tokens.empty());

  // The healthy requests equal their decoding alone (with the same proposer: prompt lookup).
  for (auto [id, j] : {std::pair{ok1, job{good, policy_of(0.0f), config}},
                       std::pair{ok2, job{prompts[4], policy_of(1.0f), config}}}) {
    auto const r = decoder.take(id);
    REQUIRE(r.has_value());
    CHECK_FALSE(r->failed());
    CHECK(r->result.tokens == alone(j).tokens);
  }
  CHECK(decoder.stats().failed == 6);
  CHECK(target.free_slots() == 4);
  CHECK(sd::to_string(sd::finish_reason::failed) == "failed");
}

TEST_CASE("batch_decoder: a request runs into the end of its context") {
  sd::cpu_batched_llama target = batched_model(2, 24);
  lookups proposer([] { return lookup(tree_config); });
  sd::batch_decoder<sd::cpu_batched_llama, lookups, sd::tree_verifier, sd::sampler> decoder(
      target, proposer);
  sd::decode_config config;
  config.max_new_tokens = 100;
  auto const prompt = fixture::once_upon_a_time();
  auto const id = decoder.submit(prompt, policy_of(0.0f), config);
  decoder.run();
  auto const r = decoder.take(id);
  REQUIRE(r.has_value());
  CHECK(r->result.reason == sd::finish_reason::context_full);
  CHECK(r->result.tokens.size() == 24 - prompt.size() + 1);
  sd::cpu_llama alone_target(fixture::stories260k(), {.threads = 1, .max_context = 24});
  lookup p(tree_config);
  sd::speculative_decoder d(alone_target, p, sd::tree_verifier{}, policy_of(0.0f), config);
  CHECK(r->result.tokens == d.generate(prompt).tokens);
}

TEST_CASE("speculation: the expected accepted length, the cost model and the goodput rule") {
  CHECK(sd::expected_accepted_length(0.0, 4) == doctest::Approx(1.0));
  CHECK(sd::expected_accepted_length(1.0, 4) == doctest::Approx(5.0));
  CHECK(sd::expected_accepted_length(0.8, 4) == doctest::Approx((1 - std::pow(0.8, 5)) / 0.2));

  sd::forward_cost_model m;
  CHECK(m.empty());
  CHECK(m.predict(5) == 0.0);
  m.observe(1, 10.0);
  CHECK(m.predict(1) == doctest::Approx(10.0));
  CHECK(m.predict(4) == doctest::Approx(40.0));  // one point: in proportion to the rows
  m.observe(8, 12.0);
  m.observe(16, 20.0);
  CHECK(m.predict(0) == doctest::Approx(10.0));  // flat below the first point
  CHECK(m.predict(4) == doctest::Approx(10.0 + 2.0 * 3.0 / 7.0));
  CHECK(m.predict(12) == doctest::Approx(16.0));  // interpolated
  CHECK(m.predict(32) == doctest::Approx(36.0));  // the last slope
  m.observe(8, 22.0, 0.5);                        // a moving average
  CHECK(m.predict(8) == doctest::Approx(17.0));

  // Convex from the first point at twice the first time (compute-bound): a stretch whose slopes
  // dip becomes the chord between its ends; below, as measured; then non-decreasing.
  sd::forward_cost_model v;
  for (auto [r, t] : std::vector<std::pair<std::size_t, double>>{
           {1, 10.0}, {2, 9.0}, {4, 10.0}, {8, 20.0}, {16, 24.0}, {32, 56.0}, {64, 80.0}})
    v.observe(r, t, 1.0);
  sd::forward_cost_model smooth = v;
  v.make_convex();
  CHECK(v.predict(1) == doctest::Approx(10.0));
  CHECK(v.predict(2) == doctest::Approx(10.0));  // 9, raised: non-decreasing
  CHECK(v.predict(4) == doctest::Approx(10.0));  // an end keeps its time
  CHECK(v.predict(6) == doctest::Approx(15.0));  // the step 4..8 as measured
  CHECK(v.predict(8) == doctest::Approx(20.0));
  CHECK(v.predict(16) == doctest::Approx(24.0));  // slopes 0.5, 2, 0.75 above it:
  CHECK(v.predict(32) == doctest::Approx(24.0 + 16.0 * 56.0 / 48.0));  // the chord 16..64
  CHECK(v.predict(64) == doctest::Approx(80.0));
  // Convex throughout, the chord 4..16 would price 8 rows at 14.7.
  smooth.make_convex(0.0);
  CHECK(smooth.predict(8) == doctest::Approx(10.0 + 4.0 * 14.0 / 12.0));
  CHECK(smooth.predict(16) == doctest::Approx(24.0));

  sd::adaptive_speculation flat({.max_k = 6, .probe_interval = 0, .probe_new = false});
  sd::adaptive_speculation linear({.max_k = 6, .probe_interval = 0, .probe_new = false});
  for (std::size_t r : {1, 2, 4, 8, 16, 32, 64, 256}) {
    flat.costs().observe(r, r <= 32 ? 1.0 : static_cast<double>(r) / 32.0, 1.0);  // memory-bound
    linear.costs().observe(r, static_cast<double>(r), 1.0);                       // compute-bound
  }
  // Estimates resting on many tested tokens (kept as they are, see below); a drafted token costs
  // the proposer a microsecond.
  std::vector<sd::speculation_request> reqs(4);
  for (std::size_t i = 0; i < 4; ++i)
    reqs[i] = {.slot = i, .max_draft = 8, .acceptance = 0.8, .tested = 1e6};
  reqs[3].acceptance = 0.0;
  reqs[2].max_draft = 1;
  sd::step_cost const proposer{.drafted = 1, .propose_seconds = 1e-6};
  flat.observe(proposer);
  std::vector<std::size_t> k(4, 99);
  flat.choose(reqs, k);
  // Rows are free up to 32: the 3 requests that can gain draft up to their limits (6, 6, 1);
  // the one whose drafts are never accepted drafts nothing.
  CHECK(k == std::vector<std::size_t>{6, 6, 1, 0});
  linear.choose(reqs, k);
  CHECK(k == std::vector<std::size_t>{0, 0, 0, 0});  // a row costs as much as a token: no gain
  // Free up to 16 rows: 12 draft rows, the largest gains first (ties: the earlier request).
  sd::adaptive_speculation knee({.max_k = 6, .probe_interval = 0, .probe_new = false});
  for (std::size_t r : {1, 16, 64})
    knee.costs().observe(r, r <= 16 ? 1.0 : static_cast<double>(r) / 16.0, 1.0);
  knee.observe(proposer);
  knee.choose(reqs, k);
  CHECK(k == std::vector<std::size_t>{6, 5, 1, 0});
  // Noisy estimates are drawn to the batch's mean as far as their noise exceeds their spread:
  // four requests on 10 tested tokens each, at 0.95, 0.65, 0.8 and 0.8, are as alike as their
  // noise lets one tell (spread 0.045, noise 4 x 0.16 / 11): all at 0.8, an even split.
  std::vector<sd::speculation_request> alike(4);
  for (std::size_t i = 0; i < 4; ++i)
    alike[i] = {.slot = i, .max_draft = 8, .acceptance = 0.8, .tested = 10.0};
  alike[0].acceptance = 0.95;
  alike[1].acceptance = 0.65;
  sd::adaptive_speculation even({.max_k = 6, .probe_interval = 0, .probe_new = false});
  even.costs() = knee.costs();
  even.choose(alike, k);
  for (double a : even.acceptance()) CHECK(a == doctest::Approx(0.8));
  CHECK(k == std::vector<std::size_t>{3, 3, 3, 3});
  // On 20 tested tokens each, 0.1, 0.9, 0.1, 0.9 differ: between-request variance 0.148 of the
  // 0.16 observed, so each keeps 0.926 of its distance to the mean 0.5.
  for (std::size_t i = 0; i < 4; ++i)
    alike[i] = {.slot = i, .acceptance = i % 2 ? 0.9 : 0.1, .tested = 20.0};
  even.choose(alike, k);
  double const keep =
      (0.64 - 4.0 * 0.25 / 21.0) / 4.0 / ((0.64 - 4.0 * 0.25 / 21.0) / 4.0 + 0.25 / 21.0);
  CHECK(even.acceptance()[0] == doctest::Approx(0.5 - 0.4 * keep));
  CHECK(even.acceptance()[1] == doctest::Approx(0.5 + 0.4 * keep));
  alike.resize(2);  // fewer than 3: as they are
  even.choose(alike, k);
  CHECK(even.acceptance()[0] == doctest::Approx(0.1));
  // Probes: a request none of whose drafts was tested yet drafts one token where nothing pays at
  // its estimate, if its drafts could pay were they all accepted (here: rows free up to 32) ...
  for (auto& r : reqs) r = {.slot = r.slot, .max_draft = r.max_draft, .acceptance = 0.0};
  sd::adaptive_speculation probing({.max_k = 6, .probe_interval = 0});
  probing.costs() = flat.costs();
  reqs[1].tested = 3.0;
  reqs[2].tested = 0.5;
  probing.choose(reqs, k);
  CHECK(k == std::vector<std::size_t>{1, 0, 0, 1});
  reqs[3].max_draft = 0;  // not allowed to draft
  probing.choose(reqs, k);
  CHECK(k == std::vector<std::size_t>{1, 0, 0, 0});
  reqs[3].max_draft = 8;
  // ... but not where a row costs as much as a token: no acceptance would make drafting pay.
  probing.costs() = linear.costs();
  probing.choose(reqs, k);
  CHECK(k == std::vector<std::size_t>{0, 0, 0, 0});
  for (auto& r : reqs) r.tested = 0.0;
  // ... and every 3rd idle step with probe_interval 2, likewise only where drafts could pay.
  sd::adaptive_speculation periodic({.max_k = 6, .probe_interval = 2, .probe_new = false});
  std::vector<std::size_t> probes;
  for (auto const* costs : {&flat.costs(), &linear.costs()}) {
    periodic.costs() = *costs;
    for (int step = 0; step < 6; ++step) {
      periodic.choose(reqs, k);
      probes.push_back(k[0]);
    }
  }
  CHECK(probes == std::vector<std::size_t>{0, 0, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0});
  // A step that also scores prompts keeps the drafts whose tokens come at the rate of the step
  // without them (4 requests at 0.8, rows free up to 8: one draft each, 7.2 tokens per second at
  // slope 1/8, 7.87 at 1/16), not those that raise its own goodput, which the time of 100 prompt
  // rows would make any draft do.
  for (double slope : {1.0 / 8.0, 1.0 / 16.0}) {
    sd::adaptive_speculation p({.max_k = 6, .probe_interval = 0, .probe_new = false});
    for (std::size_t r : {1, 8, 256})
      p.costs().observe(r, r <= 8 ? 1.0 : 1.0 + static_cast<double>(r - 8) * slope, 1.0);
    std::vector<sd::speculation_request> first(4);
    for (std::size_t i = 0; i < 4; ++i)
      first[i] = {.slot = i, .max_draft = 8, .other_rows = 25, .acceptance = 0.8};
    p.choose(first, k);
    // A draft row's tokens at slope 1/8: 0.8 * 8 = 6.4 per second; at 1/16: 12.8, 10.2, 8.2, 6.6.
    CHECK(k == std::vector<std::size_t>(4, slope > 0.1 ? 0 : 3));
    // New requests probe: one accepted token per row would come at 8 per second.
    sd::adaptive_speculation q({.max_k = 6, .probe_interval = 0});
    q.costs() = p.costs();
    q.choose(first, k);
    CHECK(k == std::vector<std::size_t>(4, slope > 0.1 ? 1 : 3));
  }
  // A predicted gain within the margin is not taken: one request at 0.8, T(1) = 1, T(2) = 1.75
  // (one draft: 1.8 / 1.75, +2.9%).
  std::vector<sd::speculation_request> one{{.slot = 0, .max_draft = 4, .acceptance = 0.8}};
  std::vector<std::size_t> k1(1, 99);
  for (double margin : {0.0, 0.02, 0.05}) {
    sd::adaptive_speculation a(
        {.max_k = 4, .probe_interval = 0, .probe_new = false, .min_gain = margin});
    a.costs().observe(1, 1.0, 1.0);
    a.costs().observe(2, 1.75, 1.0);
    a.choose(one, k1);
    CHECK(k1[0] == (margin < 0.029 ? 1u : 0u));
  }
  test_support::expect_error([] { sd::adaptive_speculation bad({.min_gain = -0.1}); },
                             sd::errc::invalid_argument);
  sd::fixed_speculation fixed(3);
  fixed.choose(reqs, k);
  CHECK(k == std::vector<std::size_t>{3, 3, 1, 3});
  test_support::expect_error([] { sd::adaptive_speculation bad({.cost_weight = 0.0}); },
                             sd::errc::invalid_argument);

  // A calibrated curve keeps its shape: observations move its scale.
  sd::cpu_batched_llama model = batched_model(4);
  sd::forward_cost_model c;
  std::size_t const rows[] = {1, 4, 16};
  c.calibrate(model, rows, 8, 1);
  CHECK(c.calibrated());
  CHECK(c.size() == 3);
  CHECK(model.free_slots() == 4);  // the calibration's slots came back
  double const at4 = c.predict(4), at16 = c.predict(16);
  CHECK(at4 > 0.0);
  c.observe(4, 2.0 * at4, 1.0);
  CHECK(c.scale() == doctest::Approx(2.0));
  CHECK(c.predict(16) == doctest::Approx(2.0 * at16));
}

namespace {

// Drafts one token that greedy verification rejects: the greedy continuation's token + 1.
struct wrong_proposer {
  static constexpr bool produces_trees = false;
  std::vector<sd::token_id> sequence;  // prompt and greedy continuation
  void begin(std::span<sd::token_id const>) {}
  void propose(sd::propose_context const& ctx, sd::draft_tree& tree) {
    tree.reset(ctx.tokens.back());
    std::size_t const t = ctx.tokens.size();
    if (ctx.max_nodes > 0 && t < sequence.size())
      tree.add_node(0, static_cast<sd::token_id>((sequence[t] + 1) % 512));
  }
  void accept(sd::verify_result const&) {}
  [[nodiscard]] std::size_t max_nodes() const noexcept { return 1; }
};

// Drafts one token on the first step, none after; records the acceptance estimates it is given.
struct recording_policy {
  std::vector<double>* seen;
  void choose(std::span<sd::speculation_request const> requests, std::span<std::size_t> draft) {
    for (std::size_t i = 0; i < requests.size(); ++i) {
      draft[i] = seen->empty() ? std::min<std::size_t>(1, requests[i].max_draft) : 0;
      seen->push_back(requests[i].acceptance);
    }
  }
  void observe(sd::step_cost const&) {}
};

}  // namespace

TEST_CASE("batch_decoder: an unlucky batch's acceptance estimate returns to the prior") {
  // A batch of one request whose only draft is rejected: its estimate falls below the prior,
  // then, with no new evidence, rises back toward it as the counts decay (the batch's rate has
  // the configured prior as its own prior), so speculation is not switched off for good.
  auto const prompts = fixture::encoded_prompts();
  job j{prompts[0], policy_of(0.0f), {}};
  j.config.max_new_tokens = 40;
  j.config.max_draft_nodes = 0;
  std::vector<sd::token_id> sequence = prompts[0];
  std::vector<sd::token_id> const greedy = alone(j).tokens;
  sequence.insert(sequence.end(), greedy.begin(), greedy.end());
  j.config.max_draft_nodes.reset();

  sd::cpu_batched_llama target = batched_model(1);
  using wrongs = sd::per_request_proposer<wrong_proposer>;
  wrongs proposer([&] { return wrong_proposer{sequence}; });
  std::vector<double> seen;
  sd::batch_decoder<sd::cpu_batched_llama, wrongs, sd::tree_verifier, sd::sampler, recording_policy>
      decoder(target, proposer, {}, recording_policy{&seen},
              {.acceptance = {.prior = 0.5, .prior_weight = 2.0}});
  std::uint64_t const id = decoder.submit(j.prompt, j.policy, j.config);
  decoder.run();
  auto const got = decoder.take(id);
  REQUIRE(got.has_value());
  CHECK(got->result.tokens == greedy);  // a rejected draft changes nothing
  CHECK(decoder.stats().drafted == 1);
  CHECK(decoder.stats().accepted == 0);
  REQUIRE(seen.size() > 20);
  CHECK(seen[0] == doctest::Approx(0.5));  // the prior before any evidence
  CHECK(seen[1] < 0.3);                    // one rejection
  for (std::size_t i = 2; i < seen.size(); ++i) CHECK(seen[i] > seen[i - 1]);
  CHECK(seen.back() > 0.45);
  CHECK(seen.back() < 0.5);
}

TEST_CASE("batch_decoder: a batched draft model drafts for every request as it would alone") {
  // The trained draft of the fixture serves the whole batch from its own slots; greedy
  // candidates and sampled chains (speculative sampling) equal draft_model_proposer alone.
  auto const prompts = fixture::encoded_prompts();
  sd::draft_model_config const chain{.k = 4};
  auto const run_mode = [&]<sd::draft_mode M, class Verifier>(float temperature) {
    CAPTURE(temperature);
    sd::cpu_batched_llama target = batched_model(3);
    sd::cpu_batched_llama draft(fixture::trained_draft(),
                                {.model = {.threads = 1}, .max_slots = 3});
    using proposer_type = sd::batched_draft_model_proposer<sd::cpu_batched_llama, sd::sampler, M>;
    proposer_type proposer(draft, target.vocab_size(), policy_of(temperature), chain);
    static_assert(sd::batch_proposer<proposer_type>);
    sd::batch_decoder<sd::cpu_batched_llama, proposer_type, Verifier, sd::sampler> decoder(
        target, proposer);
    std::vector<std::uint64_t> ids;
    std::vector<sd::decode_config> configs;
    for (std::size_t i = 0; i < 5; ++i) {
      sd::decode_config c;
      c.max_new_tokens = 24 + 4 * i;
      c.seed = 40 + i;
      configs.push_back(c);
      ids.push_back(decoder.submit(prompts[i], policy_of(temperature), c));
    }
    decoder.run();
    for (std::size_t i = 0; i < ids.size(); ++i) {
      CAPTURE(i);
      auto const got = decoder.take(ids[i]);
      REQUIRE(got.has_value());
      CHECK_FALSE(got->failed());
      sd::cpu_llama alone_target(fixture::stories260k(), {.threads = 1});
      sd::cpu_llama alone_draft(fixture::trained_draft(), {.threads = 1});
      sd::draft_model_proposer<sd::cpu_llama, sd::sampler, M> p(alone_draft, alone_target,
                                                                policy_of(temperature), chain);
      sd::speculative_decoder d(alone_target, p, Verifier{}, policy_of(temperature), configs[i]);
      sd::decode_result const want = d.generate(prompts[i]);
      CHECK(got->result.tokens == want.tokens);
      CHECK(got->result.stats.accepted == want.stats.accepted);
    }
    CHECK(draft.free_slots() == 3);  // every draft slot came back
    CHECK(decoder.stats().accepted > 0);
  };
  run_mode.template operator()<sd::draft_mode::greedy, sd::greedy_verifier>(0.0f);
  run_mode.template operator()<sd::draft_mode::sample, sd::speculative_sampling_verifier>(1.0f);

  // A draft model with fewer slots than the batch: the requests it cannot take fail alone.
  sd::cpu_batched_llama target = batched_model(3);
  sd::cpu_batched_llama small(fixture::trained_draft(), {.model = {.threads = 1}, .max_slots = 1});
  sd::batched_draft_model_proposer<sd::cpu_batched_llama, sd::sampler> proposer(
      small, target.vocab_size(), policy_of(0.0f), chain);
  sd::batch_decoder<sd::cpu_batched_llama, decltype(proposer), sd::greedy_verifier, sd::sampler>
      decoder(target, proposer);
  sd::decode_config c;
  c.max_new_tokens = 16;
  auto const a = decoder.submit(prompts[0], policy_of(0.0f), c);
  auto const b = decoder.submit(prompts[1], policy_of(0.0f), c);
  decoder.run();
  auto const ra = decoder.take(a);
  auto const rb = decoder.take(b);
  REQUIRE(ra.has_value());
  REQUIRE(rb.has_value());
  CHECK_FALSE(ra->failed());
  CHECK(rb->failed());
  CHECK(rb->error.find("all 1 sequence slots are in use") != std::string::npos);
  test_support::expect_error(
      [&] {
        sd::batched_draft_model_proposer<sd::cpu_batched_llama, sd::sampler> bad(
            small, target.vocab_size(), policy_of(0.0f), {.k = 4, .adaptive = true});
      },
      sd::errc::invalid_argument);
}
