#pragma once
// Builds safetensors bytes for the model tests: well-formed files from tensors (to edit one thing
// at a time) and files with a header written by hand (for malformed headers).

#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "specdec/model/half.hpp"
#include "specdec/model/safetensors.hpp"

namespace specdec::test {

// One tensor to write: its name, dtype and shape, and its data bytes.
struct st_tensor {
  std::string name;
  std::string dtype = "F32";
  std::vector<std::uint64_t> shape;
  std::vector<std::byte> data;
};

// `values` encoded as `dtype` ("F32", "F16" or "BF16"), little-endian.
inline std::vector<std::byte> st_encode(std::vector<float> const& values,
                                        std::string const& dtype = "F32") {
  std::vector<std::byte> out;
  auto put = [&](void const* p, std::size_t n) {
    auto const at = out.size();
    out.resize(at + n);
    std::memcpy(out.data() + at, p, n);
  };
  for (float v : values) {
    if (dtype == "F16") {
      std::uint16_t const h = float_to_half(v);
      put(&h, 2);
    } else if (dtype == "BF16") {
      std::uint16_t const b = float_to_bf16(v);
      put(&b, 2);
    } else {
      put(&v, 4);
    }
  }
  return out;
}

// A tensor of floats written as `dtype`.
inline st_tensor st_floats(std::string name, std::vector<std::uint64_t> shape,
                           std::vector<float> const& values, std::string const& dtype = "F32") {
  return {std::move(name), dtype, std::move(shape), st_encode(values, dtype)};
}

// The file: the 8-byte length of `header` (padded with spaces to a multiple of 8 unless `pad` is
// false), the header, then `data`.
inline std::vector<std::byte> st_raw(std::string header, std::vector<std::byte> const& data,
                                     bool pad = true) {
  if (pad)
    while (header.size() % 8 != 0) header += ' ';
  std::vector<std::byte> out(8 + header.size());
  std::uint64_t const n = header.size();
  std::memcpy(out.data(), &n, 8);
  std::memcpy(out.data() + 8, header.data(), header.size());
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

// A well-formed file holding `tensors` back to back in order, with `metadata` when not null.
inline std::vector<std::byte> st_file(std::vector<st_tensor> const& tensors,
                                      nlohmann::json const& metadata = nullptr) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.is_null()) header["__metadata__"] = metadata;
  std::vector<std::byte> data;
  for (st_tensor const& t : tensors) {
    header[t.name] = {{"dtype", t.dtype},
                      {"shape", t.shape},
                      {"data_offsets", {data.size(), data.size() + t.data.size()}}};
    data.insert(data.end(), t.data.begin(), t.data.end());
  }
  return st_raw(header.dump(), data);
}

// Every tensor of `file` as an st_tensor (its bytes copied), in data order.
inline std::vector<st_tensor> st_tensors(safetensors_file const& file) {
  std::vector<st_tensor> out;
  for (safetensors_tensor const& t : file.tensors())
    out.push_back({t.name, std::string(to_string(t.dtype)), t.shape,
                   std::vector<std::byte>(t.data, t.data + t.bytes())});
  return out;
}

// `tensors` with `f` applied to the tensor named `name`.
template <class F>
std::vector<st_tensor> edited(std::vector<st_tensor> tensors, std::string const& name, F&& f) {
  for (auto& t : tensors)
    if (t.name == name) f(t);
  return tensors;
}

// `tensors` without the tensor named `name`.
inline std::vector<st_tensor> without(std::vector<st_tensor> tensors, std::string const& name) {
  std::erase_if(tensors, [&](st_tensor const& t) { return t.name == name; });
  return tensors;
}

}  // namespace specdec::test
