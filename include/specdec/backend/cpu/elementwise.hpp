#pragma once
//! \file
//! The RoPE table of the CPU backend (its elementwise kernels are in kernels/elementwise.inl).
//! Internal to backend/cpu.

#include <cmath>
#include <cstddef>
#include <vector>

namespace specdec::detail::cpu {

//! Extends the RoPE table `table` ([rows, head_size]: (cos, sin) of pair i of position p at
//! p * head_size + 2i, 2i + 1) to `positions` rows, each angle p * theta^(-2i / head_size)
//! computed in double from its position alone (so a row's values do not depend on when it was
//! added).
inline void grow_rope_table(std::vector<float>& table, std::size_t head_size, double theta,
                            std::size_t positions) {
  std::size_t const from = table.size() / head_size;
  if (positions <= from) return;
  table.resize(positions * head_size);
  for (std::size_t p = from; p < positions; ++p) {
    for (std::size_t i = 0; i < head_size; i += 2) {
      double const freq = std::pow(theta, -static_cast<double>(i) / static_cast<double>(head_size));
      double const angle = static_cast<double>(p) * freq;
      table[p * head_size + i] = static_cast<float>(std::cos(angle));
      table[p * head_size + i + 1] = static_cast<float>(std::sin(angle));
    }
  }
}

}  // namespace specdec::detail::cpu
