#pragma once
//! \file
//! Small value types shared by every part of specdec.

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <type_traits>

namespace specdec {

//! A token id. Valid ids are in [0, vocab_size); 32 bits so that any vocabulary fits.
using token_id = std::int32_t;

//! An absolute position in a sequence (0 = the first token of the prompt).
using position_t = std::int32_t;

//! A node index in a draft tree (0 = the root).
using node_index = std::int32_t;

//! The value used where no token is present.
inline constexpr token_id no_token = -1;

//! The largest draft tree specdec accepts (nodes, root included). Bounds every per-step buffer.
inline constexpr std::size_t max_tree_nodes = 4096;

//! The tokens of a sequence so far, as a sampling policy reads them (for penalties) and a verifier
//! takes them (the committed tokens, the root last), together with whether the caller has already
//! checked every id against the vocabulary in use.
//!
//! Any contiguous range of token ids converts to an unchecked history, and a history converts back
//! to a span, so code written for spans keeps working. `token_history::checked(tokens)` is a
//! history its maker vouches for: a decoder's committed tokens (the prompt was checked, every
//! later token was drawn inside the vocabulary), a draft's cache (checked as tokens enter it). A
//! policy without penalties reads the history only to check it, so it skips that read for a
//! checked history; with penalties it reads, and checks, every id anyway.
class token_history {
 public:
  //! An empty history.
  constexpr token_history() noexcept = default;

  //! An unchecked history over `tokens` (any range convertible to a span of token ids).
  template <class R>
  requires(
      !std::same_as<std::remove_cvref_t<R>, token_history> &&
      std::convertible_to<
          R const&,
          std::span<
              token_id const>>) constexpr token_history(R const&
                                                            tokens) noexcept  // NOLINT(google-explicit-constructor)
      : tokens_(tokens) {}

  //! A history whose ids the caller has checked against the vocabulary in use.
  [[nodiscard]] static constexpr token_history checked(std::span<token_id const> tokens) noexcept {
    token_history h(tokens);
    h.checked_ = true;
    return h;
  }

  //! The tokens, oldest first.
  [[nodiscard]] constexpr std::span<token_id const> tokens() const noexcept { return tokens_; }
  //! Whether every id was checked against the vocabulary by the history's maker.
  [[nodiscard]] constexpr bool is_checked() const noexcept { return checked_; }
  //! Number of tokens.
  [[nodiscard]] constexpr std::size_t size() const noexcept { return tokens_.size(); }
  //! Whether there are no tokens.
  [[nodiscard]] constexpr bool empty() const noexcept { return tokens_.empty(); }
  //! The tokens, as a span.
  constexpr operator std::span<token_id const>() const noexcept {  // NOLINT
    return tokens_;
  }

 private:
  std::span<token_id const> tokens_;
  bool checked_ = false;
};

//! Number of 64-bit words in one row of a bit-packed [n, n] visibility mask.
[[nodiscard]] constexpr std::size_t mask_words(std::size_t n) noexcept {
  return (n + 63) / 64;
}

}  // namespace specdec
