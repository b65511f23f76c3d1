#include "specdec/core/views.hpp"

#include "support/doctest.hpp"

#include <vector>

using specdec::matrix_view;

TEST_CASE("matrix_view addresses rows with a stride") {
  std::vector<float> data(12);
  for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<float>(i);
  matrix_view<float> m(data.data(), 3, 3, 4);
  CHECK(m.rows() == 3);
  CHECK(m.cols() == 3);
  CHECK(m(1, 2) == 6.0f);
  CHECK(m.row(2)[0] == 8.0f);
  CHECK(m.row(2).size() == 3);
  matrix_view<float const> c = m;
  CHECK(c(2, 2) == 10.0f);
  auto sub = c.subrows(1, 2);
  CHECK(sub.rows() == 2);
  CHECK(sub(0, 0) == 4.0f);
  CHECK_THROWS_AS((void)c.at_row(3), specdec::error);
  CHECK_THROWS_AS((void)c.subrows(2, 2), specdec::error);
  CHECK_THROWS_AS(matrix_view<float>(data.data(), 2, 5, 4), specdec::error);
  CHECK_THROWS_AS(matrix_view<float>(std::span<float>(data), 5, 5), specdec::error);
  CHECK_THROWS_AS(matrix_view<float>(nullptr, 2, 2), specdec::error);
  CHECK(matrix_view<float const>().empty());
}
