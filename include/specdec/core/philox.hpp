#pragma once
//! \file
//! Philox4x32-10, the counter-based random number generator of Salmon et al. (SC'11, "Parallel
//! random numbers: as easy as 1, 2, 3"), addressed by (seed, stream, offset).
//!
//! The i-th 32-bit word of stream `s` under seed `k` is word `i % 4` of
//! `philox4x32_10(counter = {lo(i / 4), hi(i / 4), lo(s), hi(s)}, key = {lo(k), hi(k)})`.
//! Every function here is usable from host and from CUDA device code, so a kernel that reads word
//! i of a stream sees exactly the value the host reference read: this is what lets the CUDA
//! verifiers make the same decisions as the host ones.

#include <cstdint>

#include "specdec/core/host_device.hpp"

namespace specdec {

//! Four 32-bit words: a Philox counter or output block.
struct philox_block {
  std::uint32_t v[4];  //!< the words, v[0] first
};

namespace detail {
SPECDEC_HOST_DEVICE constexpr void philox_mulhilo(std::uint32_t a, std::uint32_t b,
                                                  std::uint32_t& hi, std::uint32_t& lo) noexcept {
  std::uint64_t const product = static_cast<std::uint64_t>(a) * b;
  hi = static_cast<std::uint32_t>(product >> 32);
  lo = static_cast<std::uint32_t>(product);
}
}  // namespace detail

//! One Philox4x32 block with 10 rounds: the Random123 function `philox4x32_R(10, ctr, key)`.
SPECDEC_HOST_DEVICE constexpr philox_block philox4x32_10(philox_block counter, std::uint32_t key0,
                                                         std::uint32_t key1) noexcept {
  constexpr std::uint32_t m0 = 0xD2511F53u, m1 = 0xCD9E8D57u;
  constexpr std::uint32_t w0 = 0x9E3779B9u, w1 = 0xBB67AE85u;
  philox_block c = counter;
  for (int round = 0; round < 10; ++round) {
    std::uint32_t hi0 = 0, lo0 = 0, hi1 = 0, lo1 = 0;
    detail::philox_mulhilo(m0, c.v[0], hi0, lo0);
    detail::philox_mulhilo(m1, c.v[2], hi1, lo1);
    c = philox_block{{hi1 ^ c.v[1] ^ key0, lo1, hi0 ^ c.v[3] ^ key1, lo0}};
    key0 += w0;
    key1 += w1;
  }
  return c;
}

//! Block `block` (words 4 * block .. 4 * block + 3) of stream `stream` under `seed`.
SPECDEC_HOST_DEVICE constexpr philox_block philox_block_at(std::uint64_t seed, std::uint64_t stream,
                                                           std::uint64_t block) noexcept {
  return philox4x32_10(
      philox_block{{static_cast<std::uint32_t>(block), static_cast<std::uint32_t>(block >> 32),
                    static_cast<std::uint32_t>(stream), static_cast<std::uint32_t>(stream >> 32)}},
      static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32));
}

//! The last Philox block computed, kept so that reads of words in the same block (consecutive
//! draws, a walk's words) cost one block: `word(seed, stream, index)` is `philox_word`'s value.
struct philox_kept_block {
  std::uint64_t block = ~std::uint64_t{0};  // none yet: an index no offset has
  philox_block words{};

  SPECDEC_HOST_DEVICE constexpr std::uint32_t word(std::uint64_t seed, std::uint64_t stream,
                                                   std::uint64_t index) noexcept {
    if ((index >> 2) != block) {
      block = index >> 2;
      words = philox_block_at(seed, stream, block);
    }
    return words.v[index & 3u];
  }
};

//! Word `index` of stream `stream` under `seed` (see the file comment for the exact mapping).
SPECDEC_HOST_DEVICE constexpr std::uint32_t philox_word(std::uint64_t seed, std::uint64_t stream,
                                                        std::uint64_t index) noexcept {
  return philox_block_at(seed, stream, index >> 2).v[index & 3u];
}

//! Maps a 32-bit word to a float uniform in [0, 1) with 24 random bits (every value exact).
SPECDEC_HOST_DEVICE constexpr float word_to_uniform(std::uint32_t word) noexcept {
  return static_cast<float>(word >> 8) * (1.0f / 16777216.0f);
}

//! Uniform in [0, 1) at word `index` of stream `stream` under `seed`.
SPECDEC_HOST_DEVICE constexpr float philox_uniform(std::uint64_t seed, std::uint64_t stream,
                                                   std::uint64_t index) noexcept {
  return word_to_uniform(philox_word(seed, stream, index));
}

//! A position in a Philox stream: (seed, stream, offset). Drawing reads word `offset` and
//! advances it by one. Cheap to copy; copies draw the same values. Verifiers address words
//! relative to `offset()` and document how many they consume, so that the host and the device
//! read the same words for the same decision.
class philox {
 public:
  //! A generator at word `offset` of stream `stream` under `seed`.
  SPECDEC_HOST_DEVICE constexpr explicit philox(std::uint64_t seed, std::uint64_t stream = 0,
                                                std::uint64_t offset = 0) noexcept
      : seed_(seed), stream_(stream), offset_(offset) {}

  //! The next 32-bit word. Consecutive draws share their Philox block: the last block computed is
  //! kept, so four draws in a row cost one block (the values are `philox_word`'s).
  SPECDEC_HOST_DEVICE constexpr std::uint32_t next_u32() noexcept {
    return kept_.word(seed_, stream_, offset_++);
  }
  //! The next uniform in [0, 1).
  SPECDEC_HOST_DEVICE constexpr float uniform() noexcept { return word_to_uniform(next_u32()); }
  //! The uniform at `offset() + delta`, without advancing.
  [[nodiscard]] SPECDEC_HOST_DEVICE constexpr float uniform_at(std::uint64_t delta) const noexcept {
    return philox_uniform(seed_, stream_, offset_ + delta);
  }

  //! Moves to word `offset`.
  SPECDEC_HOST_DEVICE constexpr void seek(std::uint64_t offset) noexcept { offset_ = offset; }
  //! Advances by `count` words.
  SPECDEC_HOST_DEVICE constexpr void skip(std::uint64_t count) noexcept { offset_ += count; }

  [[nodiscard]] SPECDEC_HOST_DEVICE constexpr std::uint64_t seed() const noexcept { return seed_; }
  [[nodiscard]] SPECDEC_HOST_DEVICE constexpr std::uint64_t stream() const noexcept {
    return stream_;
  }
  [[nodiscard]] SPECDEC_HOST_DEVICE constexpr std::uint64_t offset() const noexcept {
    return offset_;
  }

 private:
  std::uint64_t seed_;
  std::uint64_t stream_;
  std::uint64_t offset_;
  philox_kept_block kept_;  // the last block `next_u32` computed
};

}  // namespace specdec
