// The decode loop does not allocate per step: once a decoder has served one request, a request of
// 160 tokens performs exactly as many heap allocations as one of 40 tokens (any allocation left is
// per request, not per step). Counts every global operator new of this test executable.
#include <doctest/doctest.h>

#include <atomic>
#include <cstdlib>
#include <new>
#include <vector>

#include "decode/toy_model.hpp"
#include "specdec/decode/autoregressive.hpp"
#include "specdec/decode/speculative_decoder.hpp"
#include "specdec/propose/draft_model.hpp"
#include "specdec/propose/layer_skip.hpp"
#include "specdec/propose/prompt_lookup.hpp"
#include "specdec/sampling/policy.hpp"
#include "specdec/verify/greedy.hpp"
#include "specdec/verify/speculative_sampling.hpp"
#include "specdec/verify/tree_sampling.hpp"

// The replacement operator delete frees with std::free what the replacement operator new got from
// std::malloc; GCC cannot see that pairing through inlined allocators and warns.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif

namespace {
std::atomic<std::size_t> allocations{0};
}  // namespace

// Every non-aligned form is replaced, so that each allocation and its release pair up.
void* operator new(std::size_t size) {
  allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(size == 0 ? 1 : size)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t size) {
  return ::operator new(size);
}
void* operator new(std::size_t size, std::nothrow_t const&) noexcept {
  allocations.fetch_add(1, std::memory_order_relaxed);
  return std::malloc(size == 0 ? 1 : size);
}
void* operator new[](std::size_t size, std::nothrow_t const& tag) noexcept {
  return ::operator new(size, tag);
}
void operator delete(void* p) noexcept {
  std::free(p);
}
void operator delete[](void* p) noexcept {
  std::free(p);
}
void operator delete(void* p, std::size_t) noexcept {
  std::free(p);
}
void operator delete[](void* p, std::size_t) noexcept {
  std::free(p);
}
void operator delete(void* p, std::nothrow_t const&) noexcept {
  std::free(p);
}
void operator delete[](void* p, std::nothrow_t const&) noexcept {
  std::free(p);
}

namespace sd = specdec;

namespace {

// Allocations of one request of `tokens` tokens, after a warm-up request.
template <class Decoder>
std::size_t allocations_of(Decoder& dec, std::size_t tokens, sd::decode_result& out) {
  std::vector<sd::token_id> const prompt{1, 5, 9, 5, 9, 2};
  dec.config().max_new_tokens = 200;
  dec.generate(prompt, out);  // warm-up: buffers reach their working sizes
  dec.config().max_new_tokens = tokens;
  std::size_t const before = allocations.load();
  dec.generate(prompt, out);
  std::size_t const count = allocations.load() - before;
  REQUIRE(out.tokens.size() == tokens);
  return count;
}

sd::sampler temperature_one() {
  sd::sampling_params params;
  params.temperature = 1.0f;
  params.top_p = 0.9f;
  return sd::sampler(params);
}

}  // namespace

TEST_CASE("no allocation per step") {
  constexpr std::size_t vocab = 24;
  toy::toy_lm target(vocab, 600);
  toy::toy_lm draft(vocab, 600, 7, 6.0f, 0.6f);
  sd::decode_result out;

  SUBCASE("autoregressive") {
    sd::autoregressive_decoder dec(target, temperature_one());
    CHECK(allocations_of(dec, 160, out) == allocations_of(dec, 40, out));
  }
  SUBCASE("prompt lookup, tree verifier") {
    sd::prompt_lookup_proposer p({.n_max = 3, .n_min = 1, .k = 4, .max_branches = 2});
    sd::speculative_decoder dec(target, p, sd::tree_verifier{}, temperature_one());
    CHECK(allocations_of(dec, 160, out) == allocations_of(dec, 40, out));
  }
  SUBCASE("draft model, sampled drafts, speculative sampling") {
    sd::draft_model_proposer<toy::toy_lm, sd::sampler, sd::draft_mode::sample> p(
        draft, target, temperature_one(), {.k = 4, .adaptive = true, .k_min = 1, .k_max = 6});
    sd::speculative_decoder dec(target, p, sd::speculative_sampling_verifier{}, temperature_one());
    CHECK(allocations_of(dec, 160, out) == allocations_of(dec, 40, out));
  }
  SUBCASE("layer skip, greedy") {
    sd::layer_skip_proposer<toy::toy_lm, sd::greedy> p({.skip_layers = {1}}, sd::greedy{}, vocab,
                                                       std::size_t{600});
    sd::speculative_decoder dec(target, p, sd::greedy_verifier{}, sd::greedy{});
    CHECK(allocations_of(dec, 160, out) == allocations_of(dec, 40, out));
  }
}
