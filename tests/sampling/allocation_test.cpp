// The hot path does not allocate after warm-up: this executable replaces the global operator new
// with a counting one, armed only inside the measured region.
#include <doctest/doctest.h>

#include <atomic>
#include <cstdlib>
#include <new>
#include <random>
#include <vector>

#include "rows.hpp"
#include "specdec/sampling/policy.hpp"

// The replacement operator delete frees with std::free what the replacement operator new got from
// std::malloc; GCC cannot see that pairing through inlined allocators and warns.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif

namespace {
std::atomic<bool> counting{false};
std::atomic<long> allocations{0};
}  // namespace

// Every non-aligned form is replaced, so that each allocation and its release pair up.
void* operator new(std::size_t n) {
  if (counting.load(std::memory_order_relaxed)) allocations.fetch_add(1);
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) {
  return operator new(n);
}
void* operator new(std::size_t n, std::nothrow_t const&) noexcept {
  if (counting.load(std::memory_order_relaxed)) allocations.fetch_add(1);
  return std::malloc(n == 0 ? 1 : n);
}
void* operator new[](std::size_t n, std::nothrow_t const& tag) noexcept {
  return operator new(n, tag);
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

TEST_CASE("distribution, greedy_token, sample and softmax do not allocate after warm-up") {
  namespace sd = specdec;
  std::mt19937_64 gen(12);
  std::vector<float> const logits =
      sampling_test::make_row(sampling_test::row_kind::peaked, 32000, gen);
  std::vector<sd::token_id> const history = sampling_test::make_history(32000, 512, gen);
  sd::sampling_params all;
  all.temperature = 0.8f;
  all.top_k = 50;
  all.top_p = 0.9f;
  all.min_p = 0.02f;
  all.repetition_penalty = 1.1f;
  all.frequency_penalty = 0.2f;
  all.presence_penalty = 0.3f;
  all.logit_bias = {{5, 1.0f}, {7, -2.0f}};
  sd::sampling_params top_p_only;
  top_p_only.top_p = 0.5f;
  sd::sampler const samplers[] = {sd::sampler(all), sd::sampler(top_p_only), sd::sampler({})};
  std::vector<float> probs(logits.size());
  sd::philox rng(1);
  auto const work = [&] {
    for (auto const& s : samplers) {
      s.distribution(logits, history, probs);
      (void)s.sample(probs, rng);
      (void)s.greedy_token(logits, history);
    }
    sd::softmax(logits, probs);
    (void)sd::argmax(logits);
  };
  // The counter sees allocations.
  counting = true;
  auto* probe = new std::vector<int>(3);
  counting = false;
  delete probe;
  CHECK(allocations.load() == 2);

  work();  // warm-up: per-thread scratch grows here
  allocations = 0;
  counting = true;
  for (int i = 0; i < 5; ++i) work();
  counting = false;
  CHECK(allocations.load() == 0);
}
