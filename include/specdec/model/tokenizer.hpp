#pragma once
//! \file
//! `tokenizer`: a SentencePiece-style (Llama) vocabulary with llama2.c's encoding — a dummy
//! prefix space, one token per UTF-8 character where the vocabulary has it and byte tokens
//! (<0xNN>) otherwise, then repeated merging of the adjacent pair whose merged piece scores
//! highest — implemented in O(n log n) with a priority queue over adjacent pairs and a linked list
//! of symbols. Loads llama2.c's tokenizer.bin and the vocabulary embedded in a GGUF file.

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <limits>
#include <optional>
#include <queue>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "specdec/core/error.hpp"
#include "specdec/core/types.hpp"
#include "specdec/model/binary_io.hpp"
#include "specdec/model/gguf.hpp"
#include "specdec/model/mapped_file.hpp"

namespace specdec {

//! The kind of a vocabulary entry (GGUF's tokenizer.ggml.token_type codes).
enum class token_type : std::uint8_t {
  normal = 1,        //!< a text piece; takes part in encoding
  unknown = 2,       //!< the unknown token; decodes to its piece
  control = 3,       //!< BOS, EOS and other control tokens; never produced by encode, decode to ""
  user_defined = 4,  //!< a text piece; takes part in encoding
  unused = 5,        //!< never produced by encode
  byte = 6,          //!< <0xNN>: the raw byte NN (byte fallback)
};

//! A Llama (SentencePiece-style) vocabulary: pieces, scores, token types and the special ids.
//! Pieces are stored as text (SentencePiece's "▁" already turned into a space).
class tokenizer {
 public:
  //! A vocabulary of `pieces` with merge `scores` and `types` (all the same length); `bos`, `eos`
  //! and `unk` are ids in range or `no_token`. Byte tokens are the entries of type `byte` whose
  //! piece is "<0xNN>". With `add_space_prefix`, encode prepends a space to non-empty text. The
  //! end-of-text set is {eos} (none without an EOS); `set_end_of_text` changes it.
  //! Throws `errc::invalid_argument` for inconsistent sizes or special ids out of range.
  tokenizer(std::vector<std::string> const& pieces, std::vector<float> scores,
            std::vector<token_type> types, token_id bos, token_id eos, token_id unk,
            bool add_space_prefix = true)
      : scores_(std::move(scores)),
        types_(std::move(types)),
        bos_(bos),
        eos_(eos),
        unk_(unk),
        add_space_prefix_(add_space_prefix) {
    SPECDEC_CHECK(!pieces.empty(), invalid_argument, "tokenizer: empty vocabulary");
    SPECDEC_CHECK(pieces.size() <= static_cast<std::size_t>(std::numeric_limits<token_id>::max()),
                  invalid_argument, "tokenizer: ", pieces.size(), " tokens is too many");
    SPECDEC_CHECK(scores_.size() == pieces.size() && types_.size() == pieces.size(),
                  invalid_argument, "tokenizer: ", pieces.size(), " pieces but ", scores_.size(),
                  " scores and ", types_.size(), " types");
    for (token_id special : {bos_, eos_, unk_}) {
      SPECDEC_CHECK(special == no_token ||
                        (special >= 0 && static_cast<std::size_t>(special) < pieces.size()),
                    invalid_argument, "tokenizer: special token id ", special,
                    " is outside the vocabulary of ", pieces.size());
    }
    offsets_.reserve(pieces.size() + 1);
    offsets_.push_back(0);
    for (auto const& p : pieces) {
      arena_ += p;
      offsets_.push_back(arena_.size());
      max_token_length_ = std::max(max_token_length_, p.size());
    }
    byte_of_.assign(pieces.size(), -1);
    byte_token_.fill(no_token);
    for (std::size_t id = 0; id < pieces.size(); ++id) {
      if (types_[id] != token_type::byte) continue;
      int const b = parse_byte_piece(pieces[id]);
      if (b < 0) continue;
      byte_of_[id] = static_cast<std::int16_t>(b);
      if (byte_token_[static_cast<std::size_t>(b)] == no_token) {
        byte_token_[static_cast<std::size_t>(b)] = static_cast<token_id>(id);
      }
    }
    if (eos_ != no_token) end_of_text_.push_back(eos_);
    build_index();
  }

  //! Loads llama2.c's tokenizer.bin: int32 max_token_length, then per token a float32 score, an
  //! int32 length and that many bytes, every token up to the end of the file; when `vocab_size`
  //! >= 0 (the model's vocab_size), the file must hold exactly that many. By llama2.c's convention
  //! id 0 is unknown, 1 is BOS and 2 is EOS (control), and "<0xNN>" pieces are byte tokens; the
  //! end-of-text set is {BOS, EOS}, since llama2.c models end a text with BOS (the start of the
  //! next one) as often as with EOS, and llama2.c's run.c stops at BOS. Throws `errc::io` /
  //! `errc::bad_file` (naming the file, the token and the numbers).
  [[nodiscard]] static tokenizer load_llama2c(std::filesystem::path const& path,
                                              std::int32_t vocab_size = -1) {
    // Read, not mapped: the file is small and parsed at once.
    auto const map = mapped_file::open(path, file_access::read);
    detail::byte_reader r(map->bytes(), path.string());
    auto const max_len = r.read<std::int32_t>("max_token_length");
    SPECDEC_CHECK(max_len >= 0, bad_file, path.string(), ": max_token_length ", max_len,
                  " is negative");
    std::vector<std::string> pieces;
    std::vector<float> scores;
    while (r.remaining() > 0) {
      scores.push_back(r.read<float>("token score"));
      auto const len = r.read<std::int32_t>("token length");
      SPECDEC_CHECK(len >= 0, bad_file, path.string(), ": token ", pieces.size(),
                    " has negative length ", len);
      auto const bytes = r.take(static_cast<std::uint64_t>(len), "token bytes");
      pieces.emplace_back(reinterpret_cast<char const*>(bytes.data()), bytes.size());
    }
    SPECDEC_CHECK(!pieces.empty(), bad_file, path.string(), ": no tokens");
    // The whole file is read first, so that a vocabulary of another size is reported as such (a
    // well-formed file of another model's vocabulary is not truncated).
    SPECDEC_CHECK(vocab_size < 0 || pieces.size() == static_cast<std::size_t>(vocab_size), bad_file,
                  path.string(), ": the vocabulary has ", pieces.size(),
                  " tokens but the model has ", vocab_size, " (a tokenizer of another model?)");
    std::vector<token_type> types(pieces.size(), token_type::normal);
    for (std::size_t i = 0; i < pieces.size(); ++i) {
      if (parse_byte_piece(pieces[i]) >= 0) types[i] = token_type::byte;
    }
    auto const special = [&](token_id id) { return static_cast<std::size_t>(id) < pieces.size(); };
    if (special(0)) types[0] = token_type::unknown;
    if (special(1)) types[1] = token_type::control;
    if (special(2)) types[2] = token_type::control;
    tokenizer t(pieces, std::move(scores), std::move(types), special(1) ? 1 : no_token,
                special(2) ? 2 : no_token, special(0) ? 0 : no_token);
    std::vector<token_id> end;
    for (token_id id : {t.bos(), t.eos()})
      if (id != no_token) end.push_back(id);
    t.set_end_of_text(std::move(end));
    return t;
  }

  //! The vocabulary embedded in a GGUF file: tokenizer.ggml.tokens (required), .scores and
  //! .token_type (optional; must match the token count), .bos_token_id / .eos_token_id /
  //! .unknown_token_id (defaults 1, 2, 0) and .add_space_prefix (default true). The end-of-text
  //! set is EOS and, when the file names them, the end-of-turn and end-of-message tokens
  //! (.eot_token_id, .eom_token_id), as llama.cpp stops generation at them. Only the
  //! SentencePiece model ("llama") is supported; others throw `errc::unsupported`.
  [[nodiscard]] static tokenizer from_gguf(gguf_file const& f) {
    std::string const& w = f.where();
    auto const model = f.get<std::string_view>("tokenizer.ggml.model");
    SPECDEC_CHECK(model.has_value(), bad_file, w,
                  ": no embedded vocabulary (tokenizer.ggml.model)");
    SPECDEC_CHECK(*model == "llama", unsupported, w, ": tokenizer model '", *model,
                  "' is not supported (only the SentencePiece 'llama' model is)");
    auto const tokens = f.get_array<std::string_view>("tokenizer.ggml.tokens");
    SPECDEC_CHECK(tokens.has_value() && !tokens->empty(), bad_file, w,
                  ": missing or empty tokenizer.ggml.tokens");
    std::size_t const n = tokens->size();
    std::vector<float> scores =
        f.get_array<float>("tokenizer.ggml.scores").value_or(std::vector<float>(n, 0.0f));
    SPECDEC_CHECK(scores.size() == n, bad_file, w, ": ", n, " tokens but ", scores.size(),
                  " scores");
    std::vector<token_type> types(n, token_type::normal);
    if (auto const codes = f.get_array<std::int32_t>("tokenizer.ggml.token_type")) {
      SPECDEC_CHECK(codes->size() == n, bad_file, w, ": ", n, " tokens but ", codes->size(),
                    " token types");
      for (std::size_t i = 0; i < n; ++i) {
        std::int32_t const c = (*codes)[i];
        SPECDEC_CHECK(c >= 0 && c <= 6, bad_file, w, ": token ", i, " has unknown type ", c);
        types[i] = c == 0 ? token_type::normal : static_cast<token_type>(c);
      }
    }
    std::vector<std::string> pieces;
    pieces.reserve(n);
    for (std::string_view t : *tokens) pieces.push_back(from_sentencepiece(t));
    auto const id = [&](char const* key, token_id fallback) -> token_id {
      auto const v = f.get<std::uint64_t>(key);
      if (!v.has_value()) return static_cast<std::size_t>(fallback) < n ? fallback : no_token;
      if (*v == 0xffffffffu) return no_token;
      SPECDEC_CHECK(*v < n, bad_file, w, ": ", key, " ", *v, " is outside the vocabulary of ", n);
      return static_cast<token_id>(*v);
    };
    token_id const bos = id("tokenizer.ggml.bos_token_id", 1);
    token_id const eos = id("tokenizer.ggml.eos_token_id", 2);
    token_id const unk = id("tokenizer.ggml.unknown_token_id", 0);
    bool const prefix = f.get<bool>("tokenizer.ggml.add_space_prefix").value_or(true);
    tokenizer t(pieces, std::move(scores), std::move(types), bos, eos, unk, prefix);
    std::vector<token_id> end = t.end_of_text();
    for (char const* key : {"tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"}) {
      token_id const e = id(key, no_token);
      if (e != no_token && std::find(end.begin(), end.end(), e) == end.end()) end.push_back(e);
    }
    t.set_end_of_text(std::move(end));
    return t;
  }

  //! Number of tokens.
  [[nodiscard]] std::int32_t vocab_size() const noexcept {
    return static_cast<std::int32_t>(scores_.size());
  }
  //! The BOS id (or `no_token`).
  [[nodiscard]] token_id bos() const noexcept { return bos_; }
  //! The EOS id (or `no_token`).
  [[nodiscard]] token_id eos() const noexcept { return eos_; }
  //! The unknown-token id (or `no_token`).
  [[nodiscard]] token_id unk() const noexcept { return unk_; }
  //! The model family's end-of-text tokens: generation stops at any of them (what
  //! `decode_config::eos_tokens` is set to). See the loaders for each format's set.
  [[nodiscard]] std::vector<token_id> const& end_of_text() const noexcept { return end_of_text_; }
  //! Replaces the end-of-text set. Throws `errc::invalid_argument` for an id outside the
  //! vocabulary.
  void set_end_of_text(std::vector<token_id> ids) {
    for (token_id id : ids)
      SPECDEC_CHECK(id >= 0 && id < vocab_size(), invalid_argument, "tokenizer: end-of-text token ",
                    id, " is outside the vocabulary of ", vocab_size());
    end_of_text_ = std::move(ids);
  }
  //! Whether encode prepends a space to non-empty text.
  [[nodiscard]] bool add_space_prefix() const noexcept { return add_space_prefix_; }
  //! Length in bytes of the longest piece.
  [[nodiscard]] std::size_t max_token_length() const noexcept { return max_token_length_; }

  //! A lower bound on `encode(text, bos).size()` that costs nothing: every token covers at most
  //! `max_token_length()` bytes of the text (with its dummy prefix space), so n bytes need at
  //! least n / max_token_length() tokens. Lets a caller refuse a text that cannot fit a context
  //! before encoding it.
  [[nodiscard]] std::size_t min_tokens(std::string_view text, bool bos) const noexcept {
    std::size_t const bytes = text.empty() ? 0 : text.size() + (add_space_prefix_ ? 1 : 0);
    std::size_t const per = std::max<std::size_t>(1, max_token_length_);
    return (bytes + per - 1) / per + (bos && bos_ != no_token ? 1 : 0);
  }

  //! The piece of `id` as stored (spaces as ' ', byte tokens as "<0xNN>"). Throws
  //! `errc::out_of_range` for ids outside the vocabulary.
  [[nodiscard]] std::string_view piece(token_id id) const {
    check_id(id, "piece");
    return stored_piece(id);
  }
  //! The merge score of `id`.
  [[nodiscard]] float score(token_id id) const {
    check_id(id, "score");
    return scores_[static_cast<std::size_t>(id)];
  }
  //! The type of `id`.
  [[nodiscard]] token_type type(token_id id) const {
    check_id(id, "type");
    return types_[static_cast<std::size_t>(id)];
  }
  //! The byte token for byte `b`, or `no_token` when the vocabulary has none.
  [[nodiscard]] token_id byte_token(std::uint8_t b) const noexcept { return byte_token_[b]; }
  //! The id whose piece is exactly `text` among the tokens encode may produce (normal and
  //! user-defined), or `no_token`.
  [[nodiscard]] token_id find(std::string_view text) const noexcept { return lookup(text); }

  //! Encodes `text` (any bytes; UTF-8 expected), prepending BOS when `bos` is true (and the
  //! vocabulary has one). See the file comment for the algorithm, which is llama2.c's: ties
  //! between equally scored pairs go to the leftmost pair, and pieces scoring -1e10 or less are
  //! never merged. Bytes without a token of their own become their byte token, or the unknown
  //! token when the vocabulary has no byte tokens (`errc::invalid_argument` if it has neither).
  [[nodiscard]] std::vector<token_id> encode(std::string_view text, bool bos) const {
    return encode(text, bos, add_space_prefix_);
  }

  //! As above, with the dummy prefix space prepended when `space_prefix` (whatever
  //! `add_space_prefix()` says): pass false to encode text that continues a sequence (a forced
  //! span of a constraint, a stop string).
  [[nodiscard]] std::vector<token_id> encode(std::string_view text, bool bos,
                                             bool space_prefix) const {
    std::vector<token_id> out;
    if (bos && bos_ != no_token) out.push_back(bos_);
    if (text.empty()) return out;
    std::string buffer;
    if (space_prefix) {
      buffer.reserve(text.size() + 1);
      buffer += ' ';
      buffer += text;
      text = buffer;
    }

    // 1. Symbols: one per UTF-8 character found in the vocabulary, else one per byte.
    struct symbol {
      std::int32_t prev, next;
      token_id id;
      std::uint32_t begin, length;  // the symbol's text; length 0 = merged away
      bool mergeable;
    };
    SPECDEC_CHECK(text.size() < (std::size_t{1} << 31), invalid_argument, "tokenizer: a text of ",
                  text.size(), " bytes is too long to encode at once");
    std::vector<symbol> symbols;
    symbols.reserve(text.size());
    auto const push = [&](std::size_t begin, std::size_t length, token_id id, bool mergeable) {
      auto const index = static_cast<std::int32_t>(symbols.size());
      symbols.push_back({index - 1, index + 1, id, static_cast<std::uint32_t>(begin),
                         static_cast<std::uint32_t>(length), mergeable});
    };
    for (std::size_t i = 0; i < text.size();) {
      std::size_t length = 1;  // the dummy prefix space is a character of its own
      while (!(i == 0 && space_prefix) && length < 4 && i + length < text.size() &&
             (static_cast<unsigned char>(text[i + length]) & 0xc0u) == 0x80u) {
        ++length;
      }
      token_id const id = lookup(text.substr(i, length));
      if (id != no_token) {
        push(i, length, id, true);
      } else {
        for (std::size_t j = i; j < i + length; ++j) {
          token_id b = byte_token_[static_cast<unsigned char>(text[j])];
          if (b == no_token) b = unk_;
          SPECDEC_CHECK(b != no_token, invalid_argument, "tokenizer: byte ",
                        static_cast<int>(static_cast<unsigned char>(text[j])), " at offset ", j,
                        " has no token and the vocabulary has no byte or unknown tokens");
          push(j, 1, b, false);
        }
      }
      i += length;
    }
    symbols.back().next = -1;

    // 2. Merge the best-scoring adjacent pair until none is left: a max-heap of candidate pairs,
    //    stale entries skipped (left symbol merged away, its right neighbour changed or grew).
    struct candidate {
      float score;
      std::int32_t left, right;
      std::uint32_t length;
      token_id id;
    };
    auto const worse = [](candidate const& a, candidate const& b) {
      return a.score < b.score || (a.score == b.score && a.left > b.left);
    };
    std::priority_queue<candidate, std::vector<candidate>, decltype(worse)> queue(worse);
    auto const consider = [&](std::int32_t left) {
      if (left < 0) return;
      symbol const& a = symbols[static_cast<std::size_t>(left)];
      if (a.next < 0) return;
      symbol const& b = symbols[static_cast<std::size_t>(a.next)];
      if (!a.mergeable || !b.mergeable) return;
      std::uint32_t const length = a.length + b.length;
      if (length > max_token_length_) return;
      token_id const id = lookup(text.substr(a.begin, length));
      if (id == no_token) return;
      float const s = scores_[static_cast<std::size_t>(id)];
      if (!(s > -1e10f)) return;
      queue.push({s, left, a.next, length, id});
    };
    for (std::int32_t i = 0; i + 1 < static_cast<std::int32_t>(symbols.size()); ++i) consider(i);
    while (!queue.empty()) {
      candidate const c = queue.top();
      queue.pop();
      symbol& a = symbols[static_cast<std::size_t>(c.left)];
      if (a.length == 0 || a.next != c.right) continue;
      symbol& b = symbols[static_cast<std::size_t>(c.right)];
      if (a.length + b.length != c.length) continue;
      a.id = c.id;
      a.length = c.length;
      a.next = b.next;
      if (b.next >= 0) symbols[static_cast<std::size_t>(b.next)].prev = c.left;
      b.length = 0;
      consider(a.prev);
      consider(c.left);
    }
    for (std::int32_t i = 0; i >= 0; i = symbols[static_cast<std::size_t>(i)].next) {
      out.push_back(symbols[static_cast<std::size_t>(i)].id);
    }
    return out;
  }

  //! The text of `token` following `prev` (pass `no_token` when there is none), as llama2.c
  //! prints it: a byte token is its raw byte, a control token is empty, and right after BOS the
  //! piece's leading space (the dummy prefix) is dropped. The view stays valid as long as the
  //! tokenizer. Throws `errc::out_of_range` for a token outside the vocabulary.
  [[nodiscard]] std::string_view decode(token_id prev, token_id token) const {
    check_id(token, "decode");
    auto const t = static_cast<std::size_t>(token);
    std::string_view p;
    if (byte_of_[t] >= 0) {
      p = std::string_view(&all_bytes()[static_cast<std::size_t>(byte_of_[t])], 1);
    } else if (types_[t] == token_type::control) {
      return {};
    } else {
      p = stored_piece(token);
    }
    if (prev == bos_ && bos_ != no_token && !p.empty() && p.front() == ' ') p.remove_prefix(1);
    return p;
  }

  //! The text of a token sequence: the concatenation of `decode(previous, token)`.
  [[nodiscard]] std::string decode(std::span<token_id const> tokens) const {
    std::string out;
    token_id prev = no_token;
    for (token_id t : tokens) {
      out += decode(prev, t);
      prev = t;
    }
    return out;
  }

 private:
  static std::array<char, 256> const& all_bytes() noexcept {
    static constexpr std::array<char, 256> bytes = [] {
      std::array<char, 256> b{};
      for (int i = 0; i < 256; ++i) b[static_cast<std::size_t>(i)] = static_cast<char>(i);
      return b;
    }();
    return bytes;
  }

  //! NN of a "<0xNN>" piece (hex digits, either case), or -1.
  static int parse_byte_piece(std::string_view p) noexcept {
    if (p.size() != 6 || p.substr(0, 3) != "<0x" || p[5] != '>') return -1;
    auto const hex = [](char c) {
      if (c >= '0' && c <= '9') return c - '0';
      if (c >= 'a' && c <= 'f') return c - 'a' + 10;
      if (c >= 'A' && c <= 'F') return c - 'A' + 10;
      return -1;
    };
    int const hi = hex(p[3]), lo = hex(p[4]);
    return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
  }

  //! SentencePiece writes spaces as U+2581 ("▁"); pieces here hold plain spaces.
  static std::string from_sentencepiece(std::string_view t) {
    std::string out;
    out.reserve(t.size());
    for (std::size_t i = 0; i < t.size();) {
      if (t.compare(i, 3, "\xe2\x96\x81") == 0) {
        out += ' ';
        i += 3;
      } else {
        out += t[i++];
      }
    }
    return out;
  }

  void check_id(token_id id, char const* what) const {
    SPECDEC_CHECK(id >= 0 && id < vocab_size(), out_of_range, "tokenizer::", what, ": token id ",
                  id, " is outside the vocabulary of ", vocab_size());
  }

  [[nodiscard]] std::string_view stored_piece(token_id id) const noexcept {
    auto const i = static_cast<std::size_t>(id);
    return std::string_view(arena_).substr(offsets_[i], offsets_[i + 1] - offsets_[i]);
  }

  //! Open-addressing hash index of the pieces encode may produce (first id wins on duplicates).
  void build_index() {
    std::size_t capacity = 16;
    while (capacity < 2 * scores_.size()) capacity *= 2;
    slots_.assign(capacity, no_token);
    for (std::size_t id = 0; id < scores_.size(); ++id) {
      if (types_[id] != token_type::normal && types_[id] != token_type::user_defined) continue;
      std::string_view const p = stored_piece(static_cast<token_id>(id));
      if (p.empty()) continue;
      std::size_t slot = std::hash<std::string_view>{}(p) & (capacity - 1);
      while (slots_[slot] != no_token && stored_piece(slots_[slot]) != p) {
        slot = (slot + 1) & (capacity - 1);
      }
      if (slots_[slot] == no_token) slots_[slot] = static_cast<token_id>(id);
    }
  }

  [[nodiscard]] token_id lookup(std::string_view text) const noexcept {
    std::size_t const mask = slots_.size() - 1;
    std::size_t slot = std::hash<std::string_view>{}(text)&mask;
    while (slots_[slot] != no_token) {
      if (stored_piece(slots_[slot]) == text) return slots_[slot];
      slot = (slot + 1) & mask;
    }
    return no_token;
  }

  std::string arena_;                  // every piece, concatenated
  std::vector<std::size_t> offsets_;   // [vocab + 1]: piece i is arena_[offsets_[i], offsets_[i+1])
  std::vector<float> scores_;          // [vocab]
  std::vector<token_type> types_;      // [vocab]
  std::vector<std::int16_t> byte_of_;  // [vocab]: the byte a byte token stands for, or -1
  std::array<token_id, 256> byte_token_{};
  std::vector<token_id> slots_;  // hash index (power-of-two size, no_token = empty)
  token_id bos_ = no_token, eos_ = no_token, unk_ = no_token;
  std::vector<token_id> end_of_text_;  // see end_of_text()
  bool add_space_prefix_ = true;
  std::size_t max_token_length_ = 0;
};

}  // namespace specdec
