#include "specdec/model/tokenizer.hpp"

#include "support/doctest.hpp"

#include <chrono>
#include <cstdint>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "model/test_util.hpp"
#include "specdec/model/gguf_writer.hpp"
#include "specdec/model/load.hpp"
#include "specdec/model/random.hpp"
#include "support/errors.hpp"
#include "support/files.hpp"
#include "support/llama_shapes.hpp"

using namespace specdec;
using test_support::expect_error;

namespace {

tokenizer const& tok512() {
  static tokenizer const t = tokenizer::load_llama2c(test_support::model_file("tok512.bin"), 512);
  return t;
}

void append_utf8(std::string& out, std::uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xc0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xe0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else {
    out += static_cast<char>(0xf0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  }
}

// Every JSON string literal of a JSON-lines file (keys included), unescaped.
std::vector<std::string> json_strings(std::filesystem::path const& path) {
  std::ifstream in(path);
  REQUIRE(in.is_open());
  std::stringstream ss;
  ss << in.rdbuf();
  std::string const s = ss.str();
  std::vector<std::string> out;
  auto const hex4 = [&](std::size_t at) {
    return static_cast<std::uint32_t>(std::stoul(s.substr(at, 4), nullptr, 16));
  };
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '"') continue;
    std::string v;
    for (++i; i < s.size() && s[i] != '"'; ++i) {
      if (s[i] != '\\') {
        v += s[i];
        continue;
      }
      char const e = s[++i];
      switch (e) {
        case 'n':
          v += '\n';
          break;
        case 't':
          v += '\t';
          break;
        case 'r':
          v += '\r';
          break;
        case 'b':
          v += '\b';
          break;
        case 'f':
          v += '\f';
          break;
        case 'u': {
          std::uint32_t cp = hex4(i + 1);
          i += 4;
          if (cp >= 0xd800 && cp < 0xdc00 && s.compare(i + 1, 2, "\\u") == 0) {
            std::uint32_t const lo = hex4(i + 3);
            cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
            i += 6;
          }
          append_utf8(v, cp);
          break;
        }
        default:
          v += e;
      }
    }
    out.push_back(std::move(v));
  }
  return out;
}

// llama2.c's encode(), literally: quadratic, for comparison.
std::vector<token_id> reference_encode(tokenizer const& t, std::string const& text, bool bos) {
  std::vector<token_id> tokens;
  if (bos) tokens.push_back(t.bos());
  if (text.empty()) return tokens;
  auto const emit_group = [&](std::string const& group) {
    token_id const id = t.find(group);
    if (id != no_token) {
      tokens.push_back(id);
    } else {
      for (char c : group) tokens.push_back(t.byte_token(static_cast<std::uint8_t>(c)));
    }
  };
  emit_group(" ");  // the dummy prefix
  std::string group;
  for (std::size_t i = 0; i < text.size(); ++i) {
    if ((static_cast<unsigned char>(text[i]) & 0xc0) != 0x80) group.clear();
    group += text[i];
    if (i + 1 < text.size() && (static_cast<unsigned char>(text[i + 1]) & 0xc0) == 0x80 &&
        group.size() < 4) {
      continue;
    }
    emit_group(group);
    group.clear();
  }
  std::size_t const first = bos ? 1 : 0;  // BOS never merges
  while (true) {
    float best_score = -1e10f;
    token_id best_id = no_token;
    std::size_t best_idx = 0;
    for (std::size_t i = first; i + 1 < tokens.size(); ++i) {
      std::string const merged =
          std::string(t.piece(tokens[i])) + std::string(t.piece(tokens[i + 1]));
      token_id const id = t.find(merged);
      if (id != no_token && t.score(id) > best_score) {
        best_score = t.score(id);
        best_id = id;
        best_idx = i;
      }
    }
    if (best_id == no_token) break;
    tokens[best_idx] = best_id;
    tokens.erase(tokens.begin() + static_cast<std::ptrdiff_t>(best_idx) + 1);
  }
  return tokens;
}

std::vector<std::string> corpus() {
  std::vector<std::string> texts;
  for (char const* name :
       {"tinystories_prompts.jsonl", "HumanEval.jsonl", "spec_bench_question.jsonl"}) {
    auto const s = json_strings(test_support::data_file(name));
    texts.insert(texts.end(), s.begin(), s.end());
  }
  REQUIRE(texts.size() > 1000);
  return texts;
}

}  // namespace

TEST_CASE("tokenizer: tok512 loads and encodes the MANIFEST reference") {
  auto const& t = tok512();
  CHECK(t.vocab_size() == 512);
  CHECK(t.bos() == 1);
  CHECK(t.eos() == 2);
  CHECK(t.unk() == 0);
  CHECK(t.max_token_length() == 7);
  CHECK(t.piece(1) == "\n<s>\n");
  CHECK(t.type(1) == token_type::control);
  CHECK(t.type(3) == token_type::byte);
  CHECK(t.byte_token(0) == 3);
  CHECK(t.byte_token(255) == 258);
  auto const ids = t.encode("Once upon a time", true);
  CHECK(ids == std::vector<token_id>{1, 403, 407, 261, 378});
  CHECK(t.decode(ids) == "Once upon a time");
  CHECK(t.decode(1, 403) == "Once");  // leading space dropped after BOS
  CHECK(t.decode(403, 403) == " Once");
  CHECK(t.decode(261, 13) == "\n");  // <0x0A> is the raw byte
  CHECK(t.decode(0, 2).empty());     // control tokens decode to nothing
  CHECK(t.encode("", true) == std::vector<token_id>{1});
  CHECK(t.encode("", false).empty());
  CHECK(t.encode("Once", false) == std::vector<token_id>{403});
}

TEST_CASE("tokenizer: the reference greedy ids decode to the reference text") {
  std::ifstream ids_in(test_support::model_file("reference_greedy_once_upon_a_time.ids"));
  std::vector<token_id> ids{1};
  for (token_id id; ids_in >> id;) ids.push_back(id);
  REQUIRE(ids.size() == 257);
  std::ifstream txt_in(test_support::model_file("reference_greedy_once_upon_a_time.txt"));
  std::stringstream ss;
  ss << txt_in.rdbuf();
  std::string expected = ss.str();
  std::string const text = tok512().decode(ids);
  CHECK(text.rfind("Once upon a time, there was a little girl named Lily.", 0) == 0);
  if (text != expected && !expected.empty() && expected.back() == '\n') expected.pop_back();
  CHECK(text == expected);
}

TEST_CASE("tokenizer: round trips and agreement with llama2.c's algorithm on the corpora") {
  auto const& t = tok512();
  auto const texts = corpus();
  std::size_t tokens = 0, bytes = 0, compared = 0;
  for (auto const& text : texts) {
    auto const ids = t.encode(text, true);
    tokens += ids.size();
    bytes += text.size();
    if (t.decode(ids) != text) FAIL("round trip failed for: ", text);
    // The quadratic reference is slow: compare on the shorter texts and a prefix of long ones.
    if (compared < 400) {
      std::string const part = text.substr(0, 300);
      if (t.encode(part, true) != reference_encode(t, part, true)) {
        FAIL("differs from llama2.c's algorithm on: ", part);
      }
      ++compared;
    }
  }
  MESSAGE(texts.size(), " texts, ", bytes, " bytes, ", tokens, " tokens");
}

TEST_CASE("tokenizer: arbitrary bytes round trip") {
  auto const& t = tok512();
  std::mt19937 rng(5);
  for (int trial = 0; trial < 300; ++trial) {
    std::string text(rng() % 40, '\0');
    for (char& c : text) {
      // Mostly letters and spaces (merges), some UTF-8 lead/continuation bytes and NULs.
      auto const r = rng() % 10;
      c = r < 6 ? "ab tehno"[rng() % 8] : static_cast<char>(rng() & 0xff);
    }
    auto const ids = t.encode(text, true);
    CHECK(t.decode(ids) == text);
    CHECK(ids == reference_encode(t, text, true));
  }
}

TEST_CASE("tokenizer: ties go to the leftmost pair, as in llama2.c") {
  // All merges score the same: "aa" pairs from the left.
  std::vector<std::string> pieces{"<unk>", "<s>", "</s>", " ", "a", "aa", " a", "b", "ab", "ba"};
  std::vector<float> scores(pieces.size(), 0.0f);
  std::vector<token_type> types(pieces.size(), token_type::normal);
  types[0] = token_type::unknown;
  types[1] = types[2] = token_type::control;
  tokenizer const t(pieces, scores, types, 1, 2, 0, /*add_space_prefix=*/false);
  CHECK(t.encode("aaa", false) == std::vector<token_id>{5, 4});
  CHECK(t.encode("aaaa", false) == std::vector<token_id>{5, 5});
  CHECK(t.encode("aba", false) == std::vector<token_id>{8, 4});
  CHECK(t.encode("x", false) == std::vector<token_id>{0});  // no byte tokens: unknown
  std::mt19937 rng(11);
  for (int trial = 0; trial < 300; ++trial) {
    std::string text(rng() % 30 + 1, 'a');
    for (char& c : text) c = "ab "[rng() % 3];
    std::vector<token_id> expected;
    {
      // Reference without the dummy prefix.
      std::vector<token_id> tokens;
      for (char c : text) tokens.push_back(t.find(std::string(1, c)));
      while (true) {
        float best = -1e10f;
        token_id id = no_token;
        std::size_t at = 0;
        for (std::size_t i = 0; i + 1 < tokens.size(); ++i) {
          token_id const m =
              t.find(std::string(t.piece(tokens[i])) + std::string(t.piece(tokens[i + 1])));
          if (m != no_token && t.score(m) > best) {
            best = t.score(m);
            id = m;
            at = i;
          }
        }
        if (id == no_token) break;
        tokens[at] = id;
        tokens.erase(tokens.begin() + static_cast<std::ptrdiff_t>(at) + 1);
      }
      expected = tokens;
    }
    CHECK(t.encode(text, false) == expected);
  }
}

TEST_CASE("tokenizer: long texts encode in O(n log n)") {
  auto const texts = corpus();
  std::string big;
  for (auto const& s : texts) big += s;
  REQUIRE(big.size() > 500000);
  auto const start = std::chrono::steady_clock::now();
  auto const ids = tok512().encode(big, true);
  double const seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CHECK(tok512().decode(ids) == big);
  MESSAGE(big.size(), " bytes -> ", ids.size(), " tokens in ", seconds, " s");
  CHECK(seconds < 30.0);  // a quadratic merge loop would take hours here
}

TEST_CASE("tokenizer: the GGUF vocabulary of stories260K agrees with tok512.bin") {
  gguf_file const f(test_support::model_file("stories260K.gguf"));
  auto const g = tokenizer::from_gguf(f);
  auto const& t = tok512();
  REQUIRE(g.vocab_size() == t.vocab_size());
  CHECK(g.bos() == 1);
  CHECK(g.eos() == 2);
  CHECK(g.unk() == 0);
  int piece_diffs = 0, score_diffs = 0, type_diffs = 0;
  for (token_id i = 0; i < t.vocab_size(); ++i) {
    if (g.piece(i) != t.piece(i)) {
      ++piece_diffs;
      MESSAGE("piece ", i, ": gguf '", std::string(g.piece(i)), "' vs tok512 '",
              std::string(t.piece(i)), "'");
    }
    score_diffs += g.score(i) != t.score(i);
    type_diffs += g.type(i) != t.type(i);
  }
  // Only the control tokens' spelling differs ("<s>" vs "\n<s>\n").
  CHECK(piece_diffs == 2);
  CHECK(g.piece(1) == "<s>");
  CHECK(score_diffs == 0);
  CHECK(type_diffs == 0);
  std::size_t disagreements = 0;
  auto const texts = corpus();
  for (auto const& text : texts) disagreements += g.encode(text, true) != t.encode(text, true);
  CHECK(disagreements == 0);
  CHECK(g.encode("Once upon a time", true) == std::vector<token_id>{1, 403, 407, 261, 378});

  // load_tokenizer picks the embedded vocabulary for the GGUF model, tok512 for the .bin.
  auto const from_model = load_tokenizer(test_support::model_file("stories260K.gguf"));
  CHECK(from_model.piece(1) == "<s>");
  auto const from_bin = load_tokenizer(test_support::model_file("stories260K.bin"),
                                       test_support::model_file("tok512.bin"));
  CHECK(from_bin.piece(1) == "\n<s>\n");
  expect_error([&] { (void)load_tokenizer(test_support::model_file("stories260K.bin")); },
               errc::invalid_argument);
}

TEST_CASE("tokenizer: errors") {
  auto const& t = tok512();
  expect_error([&] { (void)t.piece(-1); }, errc::out_of_range);
  expect_error([&] { (void)t.piece(512); }, errc::out_of_range);
  expect_error([&] { (void)t.decode(1, 512); }, errc::out_of_range);
  std::vector<token_id> const bad{1, 5, 9999};
  expect_error([&] { (void)t.decode(bad); }, errc::out_of_range);
  expect_error([&] { (void)t.score(600); }, errc::out_of_range);
  expect_error(
      [&] {
        tokenizer({"a"}, {0.0f, 1.0f}, {token_type::normal}, no_token, no_token, no_token);
      },
      errc::invalid_argument);
  expect_error([&] { tokenizer({"a"}, {0.0f}, {token_type::normal}, 1, no_token, no_token); },
               errc::invalid_argument);

  // Every truncation of tok512.bin, read with the model's vocab_size, is a bad_file error.
  test_support::temp_dir dir;
  auto const bytes = test::read_bytes(test_support::model_file("tok512.bin"));
  auto const cut = dir.file("cut.bin");
  for (std::size_t n = 0; n < bytes.size(); n += 1 + n / 100) {
    CAPTURE(n);
    test::write_bytes(cut, bytes, n);
    expect_error([&] { (void)tokenizer::load_llama2c(cut, 512); }, errc::bad_file);
  }
  // A negative or huge length.
  auto b = bytes;
  test::poke(b, 8, std::int32_t{-5});
  test::write_bytes(cut, b);
  expect_error([&] { (void)tokenizer::load_llama2c(cut, 512); }, errc::bad_file);
  test::poke(b, 8, std::int32_t{1 << 30});
  test::write_bytes(cut, b);
  expect_error([&] { (void)tokenizer::load_llama2c(cut, 512); }, errc::bad_file);
  // Reading every token to the end of the file gives the same vocabulary.
  CHECK(tokenizer::load_llama2c(test_support::model_file("tok512.bin")).vocab_size() == 512);
  // A model and a vocabulary of different sizes.
  auto const w = make_random_llama(test_support::shapes::vocab_300(), 1);
  write_gguf(dir.file("m300.gguf"), w, nullptr);
  expect_error(
      [&] { (void)load_tokenizer(dir.file("m300.gguf"), test_support::model_file("tok512.bin")); },
      errc::bad_file);
}

TEST_CASE("tokenizer: a vocabulary of another size is reported as such, not as a truncated file") {
  test_support::temp_dir dir;
  // Models of 600 and 300 tokens with tok512.bin: whichever is larger, the message says so.
  for (std::int32_t v : {600, 300}) {
    CAPTURE(v);
    auto c = test_support::shapes::vocab_300();
    c.vocab_size = v;
    auto const model = dir.file("m.bin");
    write_llama2c(model, make_random_llama(c, 1));
    auto const m = test_support::expect_error(
        [&] { (void)load_tokenizer(model, test_support::model_file("tok512.bin")); },
        errc::bad_file);
    CHECK(m.find("the vocabulary has 512 tokens but the model") != std::string::npos);
    CHECK(m.find(std::to_string(v)) != std::string::npos);
    CHECK(m.find("truncated") == std::string::npos);
    auto const direct = test_support::expect_error(
        [&] { (void)tokenizer::load_llama2c(test_support::model_file("tok512.bin"), v); },
        errc::bad_file);
    CHECK(direct.find("has 512 tokens but the model has " + std::to_string(v)) !=
          std::string::npos);
  }
}

TEST_CASE("tokenizer: min_tokens bounds the encoded length from below") {
  tokenizer const& t = tok512();
  std::mt19937 rng(5);
  for (std::string text : {std::string(), std::string("a"), std::string("Once upon a time"),
                           std::string(1000, 'x'), std::string("\xe2\x96\x81\xff\x01 z")}) {
    CAPTURE(text);
    CHECK(t.min_tokens(text, true) <= t.encode(text, true).size());
    CHECK(t.min_tokens(text, false) <= t.encode(text, false).size());
  }
  for (int i = 0; i < 50; ++i) {
    std::string text(rng() % 300, ' ');
    for (char& c : text) c = static_cast<char>("ab cde\n"[rng() % 7]);
    CHECK(t.min_tokens(text, true) <= t.encode(text, true).size());
  }
  // 10 MB of text needs far more tokens than any context: known without encoding it.
  CHECK(t.min_tokens(std::string(10'000'000, 'a'), true) > 1'000'000);
}
