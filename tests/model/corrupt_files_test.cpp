// The corrupted-file loops of the model readers (support/corrupt.hpp): a few hundred variants of
// the stories260K fixture in each llama2.c format, of stories260K.gguf and of tok512.bin, each
// refused with a specdec::error or read and used (a model runs a short greedy request, a
// vocabulary encodes and decodes). Marked skip: each runs as its own ctest (model_corrupt_llama2c,
// model_corrupt_gguf, model_corrupt_tokenizer; tests/CMakeLists.txt), under the asan preset too.
#include "support/doctest.hpp"

#include <algorithm>
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "model/test_util.hpp"
#include "specdec/backend/cpu/llama.hpp"
#include "specdec/decode/autoregressive.hpp"
#include "specdec/model/gguf.hpp"
#include "specdec/model/llama2c.hpp"
#include "specdec/model/load.hpp"
#include "specdec/model/tokenizer.hpp"
#include "specdec/sampling/policy.hpp"
#include "support/corrupt.hpp"
#include "support/files.hpp"

namespace sd = specdec;

namespace {

constexpr std::size_t variants = 300;

// Runs a short greedy request on the model at `path` (read with load_model), checking that every
// token is in its vocabulary.
void run_model(std::filesystem::path const& path) {
  auto const w = std::make_shared<sd::llama_weights const>(sd::load_model(path));
  std::size_t const context =
      std::min<std::size_t>(static_cast<std::size_t>(w->config.seq_len), 24);
  sd::cpu_llama m(w, {.threads = 1, .max_context = std::max<std::size_t>(context, 8)});
  sd::decode_config config;
  config.max_new_tokens = 3;
  sd::autoregressive_decoder ar(m, sd::greedy{}, config);
  std::vector<sd::token_id> prompt{1, 2, 3};
  for (sd::token_id& t : prompt) t %= static_cast<sd::token_id>(m.vocab_size());
  for (sd::token_id t : ar.generate(prompt).tokens)
    REQUIRE((t >= 0 && static_cast<std::size_t>(t) < m.vocab_size()));
}

// Encodes and decodes a text with a vocabulary, checking that the ids are in it.
void use_vocabulary(sd::tokenizer const& t) {
  std::string const text = "Once upon a time, there was a girl \xc3\xa9 \xff\x01 end.";
  auto const ids = t.encode(text, true);
  for (sd::token_id id : ids) REQUIRE((id >= 0 && id < t.vocab_size()));
  (void)t.decode(ids);
  for (sd::token_id e : t.end_of_text()) REQUIRE((e >= 0 && e < t.vocab_size()));
}

}  // namespace

TEST_CASE("corrupted llama2.c model files are refused or run" * doctest::skip()) {
  test_support::temp_dir dir;
  auto const fixture = test_support::model_file("stories260K.bin");
  auto const weights = sd::load_llama2c(fixture);
  auto const bad = dir.file("variant.bin");
  std::size_t accepted = 0, refused = 0;
  // The fixture itself (legacy), and the same weights as versions 1 and 2 (Q8_0).
  struct format_case {
    sd::llama2c_format format;
    std::size_t header;
    std::size_t count;
  };
  for (format_case const& f : {format_case{sd::llama2c_format::legacy, 28, variants / 2},
                               format_case{sd::llama2c_format::v1, 64, variants / 4},
                               format_case{sd::llama2c_format::v2_q8_0, 64, variants / 4}}) {
    auto const good = dir.file("good.bin");
    if (f.format == sd::llama2c_format::legacy)
      std::filesystem::copy_file(fixture, good, std::filesystem::copy_options::overwrite_existing);
    else
      sd::write_llama2c(good, weights, f.format);
    auto const counts =
        test_support::corrupt_file_loop(sd::test::read_bytes(good), f.header,
                                        17 + static_cast<int>(f.format), f.count, bad, run_model);
    accepted += counts.accepted;
    refused += counts.refused;
  }
  MESSAGE("llama2.c variants: ", refused, " refused, ", accepted, " read and run");
  CHECK(refused > 0);
  CHECK(accepted > 0);
}

TEST_CASE("corrupted GGUF files are refused or run" * doctest::skip()) {
  test_support::temp_dir dir;
  auto const good = test_support::model_file("stories260K.gguf");
  auto const header = static_cast<std::size_t>(sd::gguf_file(good).data_offset());
  auto const counts = test_support::corrupt_file_loop(sd::test::read_bytes(good), header, 29,
                                                      variants, dir.file("variant.gguf"),
                                                      [](std::filesystem::path const& path) {
                                                        run_model(path);
                                                        use_vocabulary(sd::load_tokenizer(path));
                                                      });
  MESSAGE("GGUF variants: ", counts.refused, " refused, ", counts.accepted, " read and run");
  CHECK(counts.refused > 0);
  CHECK(counts.accepted > 0);
}

TEST_CASE("corrupted tokenizer files are refused or used" * doctest::skip()) {
  test_support::temp_dir dir;
  auto const bytes = sd::test::read_bytes(test_support::model_file("tok512.bin"));
  auto const counts =
      test_support::corrupt_file_loop(bytes, bytes.size(), 41, variants, dir.file("variant.bin"),
                                      [](std::filesystem::path const& path) {
                                        use_vocabulary(sd::tokenizer::load_llama2c(path));
                                        use_vocabulary(sd::tokenizer::load_llama2c(path, 512));
                                      });
  MESSAGE("tokenizer variants: ", counts.refused, " refused, ", counts.accepted, " read and used");
  CHECK(counts.refused > 0);
  CHECK(counts.accepted > 0);
}
