// The context buffers of cpu_llama (KV cache, transposed copy, RoPE table, attention scratch)
// grow with the positions in use, not with the context limit: a file's context length of 2^24
// costs nothing until it is used; growing gives bit-identical results; a context the machine
// cannot hold is refused with `errc::out_of_memory`, saying how much, before anything is
// allocated, and a request that would need it fails before its first token.
#include "support/doctest.hpp"

#include <cstdint>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "backend/cpu/test_models.hpp"
#include "specdec/backend/cpu/llama.hpp"
#include "specdec/decode/autoregressive.hpp"
#include "specdec/model/load.hpp"
#include "specdec/sampling/policy.hpp"
#include "support/errors.hpp"
#include "support/files.hpp"
#include "support/llama_shapes.hpp"

namespace sd = specdec;
namespace st = specdec::test;

namespace {

// Every logits row of a run through the cache: a prefill of 5, 40 single-token steps, a chain of
// 6 truncated to 2, a two-branch tree kept along one path, and 20 more steps.
std::vector<float> workload(sd::cpu_llama& m) {
  std::vector<float> all;
  sd::forward_result out;
  auto forward = [&](std::vector<sd::token_id> const& tokens,
                     std::vector<sd::position_t> const& positions,
                     std::vector<std::uint64_t> const& mask = {}) {
    sd::forward_request req;
    req.tokens = tokens;
    req.positions = positions;
    req.mask = mask;
    req.mask_stride = sd::mask_words(tokens.size());
    m.forward(req, out);
    all.insert(all.end(), out.logits.begin(), out.logits.end());
  };
  auto const v = static_cast<sd::token_id>(m.vocab_size());
  std::vector<sd::position_t> prefill(5);
  std::iota(prefill.begin(), prefill.end(), 0);
  forward({1, 7, 3, 9, 4}, prefill);
  auto next = [&](std::size_t i) { return static_cast<sd::token_id>((i * 7 + 3) % v); };
  for (std::size_t i = 0; i < 40; ++i) {
    auto const p = static_cast<sd::position_t>(m.cache().size());
    forward({next(i)}, {p});
  }
  auto base = static_cast<sd::position_t>(m.cache().size());
  forward({1, 2, 3, 4, 5, 6}, {base, base + 1, base + 2, base + 3, base + 4, base + 5});
  m.cache().truncate(static_cast<std::size_t>(base) + 2);
  base = static_cast<sd::position_t>(m.cache().size());
  // root, two children of the root, a grandchild of the second child.
  std::vector<std::uint64_t> const mask{0b0001, 0b0011, 0b0101, 0b1101};
  forward({8, 9, 10, 11}, {base, base + 1, base + 1, base + 2}, mask);
  std::vector<std::int32_t> const keep{0, 2, 3};
  m.cache().keep_path(static_cast<std::size_t>(base), keep);
  for (std::size_t i = 0; i < 20; ++i) {
    auto const p = static_cast<sd::position_t>(m.cache().size());
    forward({next(i + 40)}, {p});
  }
  return all;
}

}  // namespace

TEST_CASE("cpu_llama: the context grows on demand, with identical results") {
  for (auto const& shape : {test_support::shapes::odd_gqa(), test_support::shapes::head_size_6()}) {
    auto const w = st::random_llama(shape, 5);
    sd::cpu_llama grown(w, {.threads = 2, .max_context = std::size_t{1} << 24});
    CHECK(grown.max_context() == std::size_t{1} << 24);
    CHECK(grown.reserved() == 0);  // a context of 2^24 costs nothing until it is used
    CHECK(grown.cache().reserved() == 0);
    sd::cpu_llama ahead(w, {.threads = 2, .max_context = 512});
    ahead.reserve(512);
    CHECK(ahead.reserved() == 512);
    CHECK(ahead.cache().reserved() == 512);
    std::vector<float> const a = workload(grown), b = workload(ahead);
    REQUIRE(a.size() == b.size());
    CHECK(st::row_error(a.data(), b.data(), a.size()) == 0.0);
    CHECK(grown.cache().size() == 70);
    CHECK(grown.reserved() >= 70);
    CHECK(grown.reserved() <= 2 * 70);
    CHECK(grown.context_bytes(1000) > grown.context_bytes(10));
  }
}

TEST_CASE("cpu_llama: a context the machine cannot hold is refused before allocating") {
  auto const w = st::random_llama(test_support::shapes::wide_cache(), 3);
  sd::cpu_llama m(w, {.threads = 1, .max_context = std::size_t{1} << 24});
  std::string const message =
      test_support::expect_error([&] { m.reserve(std::size_t{1} << 24); }, sd::errc::out_of_memory);
  CHECK(message.find("cpu_llama: a context of 16777216 positions") != std::string::npos);
  CHECK(message.find("needs") != std::string::npos);
  CHECK(message.find("GiB") != std::string::npos);
  CHECK(message.find("of memory is available") != std::string::npos);
  CHECK(m.reserved() == 0);
  CHECK(m.cache().reserved() == 0);

  // A request whose positions cannot be held fails before its first token (the decoders reserve
  // them when the request starts); a short one on the same model runs.
  sd::decode_config config;
  config.max_new_tokens = (std::size_t{1} << 24) - 8;
  sd::autoregressive_decoder ar(m, sd::greedy{}, config);
  std::vector<sd::token_id> const prompt{1, 2, 3};
  std::size_t streamed = 0;
  test_support::expect_error(
      [&] {
        (void)ar.generate(prompt, [&](sd::token_id) {
          ++streamed;
          return true;
        });
      },
      sd::errc::out_of_memory);
  CHECK(streamed == 0);
  ar.config().max_new_tokens = 10;
  CHECK(ar.generate(prompt).tokens.size() == 10);
  CHECK(m.reserved() >= 13);
  CHECK(m.reserved() < 64);
}

TEST_CASE("cpu_llama: a GGUF context length of 2^20 loads and runs in little memory") {
  // stories260K.gguf declares a context of 128; the same weights with a context of 2^20 used to
  // cost 2.6 GB before the first token.
  auto const w = std::make_shared<sd::llama_weights const>(
      sd::load_model(test_support::model_file("stories260K.gguf")));
  sd::cpu_llama m(w, {.threads = 1, .max_context = std::size_t{1} << 20});
  CHECK(m.reserved() == 0);
  sd::decode_config config;
  config.max_new_tokens = 20;
  sd::autoregressive_decoder ar(m, sd::greedy{}, config);
  auto const r = ar.generate(std::vector<sd::token_id>{1, 403, 407, 261, 378});
  CHECK(r.tokens.size() == 20);
  CHECK(m.context_bytes(m.reserved()) < (std::uint64_t{1} << 20));
}
