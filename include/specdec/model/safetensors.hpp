#pragma once
//! \file
//! safetensors (https://github.com/huggingface/safetensors): a bounds-checked reader of the
//! format the reference Medusa and Hydra repositories publish their heads in (`safetensors_file`),
//! the JSON helpers the head configs and tree files share with it, and F32 / F16 / BF16 tensors
//! converted to float32.
//!
//! File layout: an 8-byte little-endian unsigned header length N; N bytes of UTF-8 JSON (padded
//! with spaces); the data section, every byte up to the end of the file. The header is an object
//! mapping each tensor name to {"dtype": "F32", "shape": [d0, d1, ...], "data_offsets": [begin,
//! end]} (byte offsets into the data section, end exclusive) and may hold "__metadata__", an
//! object of strings. Tensors are row-major and little-endian.
//!
//! What the reader checks (each violation throws `errc::bad_file` naming the file and the tensor
//! or the header field): the file holds the 8 length bytes; the header lies within the file and
//! within `safetensors_max_header` bytes; it is valid JSON (UTF-8), an object, nested at most
//! `safetensors_max_depth` deep, without duplicate names; every entry has a known dtype, a shape
//! of non-negative integers and two data offsets begin <= end; the byte count end - begin equals
//! the product of the shape times the dtype's size (overflow-checked); sorted by offset the
//! tensors tile the data section exactly, with no gap, overlap or byte left after the last one
//! (as the reference reader requires). Nothing is read from the data before all of this holds.
//! Tensor types other than F32, F16 and BF16 are listed (their extents checked) but reading them
//! as floats throws `errc::unsupported` naming the type.

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

#include "specdec/core/error.hpp"
#include "specdec/model/binary_io.hpp"
#include "specdec/model/half.hpp"
#include "specdec/model/mapped_file.hpp"

namespace specdec {

//! A safetensors tensor type (the header's "dtype" strings).
enum class safetensors_dtype {
  f32,      //!< "F32"
  f16,      //!< "F16"
  bf16,     //!< "BF16"
  f64,      //!< "F64"
  f8_e4m3,  //!< "F8_E4M3"
  f8_e5m2,  //!< "F8_E5M2"
  i8,       //!< "I8"
  i16,      //!< "I16"
  i32,      //!< "I32"
  i64,      //!< "I64"
  u8,       //!< "U8"
  u16,      //!< "U16"
  u32,      //!< "U32"
  u64,      //!< "U64"
  boolean,  //!< "BOOL"
};

namespace detail {

//! A dtype's header name and its element size in bytes.
struct safetensors_dtype_info {
  safetensors_dtype dtype;
  std::string_view name;
  std::size_t bytes;
};

//! Every dtype this reader knows.
inline constexpr safetensors_dtype_info safetensors_dtypes[] = {
    {safetensors_dtype::f32, "F32", 4},         {safetensors_dtype::f16, "F16", 2},
    {safetensors_dtype::bf16, "BF16", 2},       {safetensors_dtype::f64, "F64", 8},
    {safetensors_dtype::f8_e4m3, "F8_E4M3", 1}, {safetensors_dtype::f8_e5m2, "F8_E5M2", 1},
    {safetensors_dtype::i8, "I8", 1},           {safetensors_dtype::i16, "I16", 2},
    {safetensors_dtype::i32, "I32", 4},         {safetensors_dtype::i64, "I64", 8},
    {safetensors_dtype::u8, "U8", 1},           {safetensors_dtype::u16, "U16", 2},
    {safetensors_dtype::u32, "U32", 4},         {safetensors_dtype::u64, "U64", 8},
    {safetensors_dtype::boolean, "BOOL", 1},
};

}  // namespace detail

//! The header name of `dtype`, e.g. "BF16".
[[nodiscard]] constexpr std::string_view to_string(safetensors_dtype dtype) noexcept {
  for (auto const& d : detail::safetensors_dtypes)
    if (d.dtype == dtype) return d.name;
  return "?";
}

//! Bytes per element of `dtype`.
[[nodiscard]] constexpr std::size_t element_size(safetensors_dtype dtype) noexcept {
  for (auto const& d : detail::safetensors_dtypes)
    if (d.dtype == dtype) return d.bytes;
  return 0;
}

//! The dtype called `name` ("F32", ...), or nullopt.
[[nodiscard]] constexpr std::optional<safetensors_dtype> parse_safetensors_dtype(
    std::string_view name) noexcept {
  for (auto const& d : detail::safetensors_dtypes)
    if (d.name == name) return d.dtype;
  return std::nullopt;
}

//! The largest header accepted, in bytes (the reference reader's limit).
inline constexpr std::uint64_t safetensors_max_header = 100'000'000;
//! The deepest JSON nesting accepted in a header, config or tree file (a header needs 3: the
//! object, a tensor's entry, its shape).
inline constexpr int safetensors_max_depth = 8;

namespace detail {

//! The most names (object keys) one JSON file may hold in all: far beyond what a real header,
//! config or tree file has (a header spends four per tensor), and it bounds the memory an absurd
//! file of the largest size accepted could make the parser build.
inline constexpr std::size_t json_max_names = std::size_t{1} << 20;

//! The SAX handler of `parse_json`: builds the value as nlohmann's own DOM parser does, and stops
//! at the first nesting deeper than `safetensors_max_depth`, name repeated within one object
//! (found as the name is inserted into the object being built), name beyond `max_names` in all,
//! or syntax error, recording it in `problem`. O(n log n) in the size of the text at worst
//! (nlohmann's callback parser, which this replaces, rescans an object each time one of its
//! members ends, and the name check it served compared each name with every earlier one: both
//! quadratic).
class checked_json_builder {
 public:
  using json = nlohmann::json;

  explicit checked_json_builder(std::size_t max_names) : max_names_(max_names) {}

  //! The value built (complete when the parse returned true).
  json value;
  //! What stopped the parse, or empty.
  std::string problem;

  bool null() { return add(nullptr); }
  bool boolean(bool v) { return add(v); }
  bool number_integer(json::number_integer_t v) { return add(v); }
  bool number_unsigned(json::number_unsigned_t v) { return add(v); }
  bool number_float(json::number_float_t v, json::string_t const&) { return add(v); }
  bool string(json::string_t& v) { return add(std::move(v)); }
  bool binary(json::binary_t& v) { return add(json::binary(std::move(v))); }

  bool start_object(std::size_t) { return open(json::value_t::object); }
  bool key(json::string_t& name) {
    if (++count_ > max_names_)
      return fail("more than " + std::to_string(max_names_) + " names in its JSON objects");
    auto const [at, added] = open_.back()->get_ref<json::object_t&>().try_emplace(name);
    if (!added) return fail("the name '" + name + "' appears twice in one JSON object");
    member_ = &at->second;
    return true;
  }
  bool end_object() {
    open_.pop_back();
    return true;
  }
  bool start_array(std::size_t) { return open(json::value_t::array); }
  bool end_array() {
    open_.pop_back();
    return true;
  }
  bool parse_error(std::size_t, std::string const&, json::exception const& e) {
    return fail(std::string("invalid JSON: ") + e.what());
  }

 private:
  bool fail(std::string what) {
    problem = std::move(what);
    return false;
  }

  template <class V>
  bool add(V&& v) {
    place(json(std::forward<V>(v)));
    return true;
  }
  // Places `v` where the next value goes (the root, the end of the open array, the member named
  // last) and returns where.
  json* place(json v) {
    if (open_.empty()) {
      value = std::move(v);
      return &value;
    }
    if (open_.back()->is_array()) {
      open_.back()->push_back(std::move(v));
      return &open_.back()->back();
    }
    *member_ = std::move(v);
    return member_;
  }
  bool open(json::value_t type) {
    if (open_.size() >= static_cast<std::size_t>(safetensors_max_depth))
      return fail("JSON nested deeper than " + std::to_string(safetensors_max_depth) + " levels");
    open_.push_back(place(json(type)));
    return true;
  }

  std::size_t max_names_;
  std::size_t count_ = 0;
  std::vector<json*> open_;  // the open objects and arrays, outermost first
  json* member_ = nullptr;   // the member of the innermost open object named last
};

//! Parses `text` (from `where`) as one JSON value with the care every file of the library gets:
//! invalid JSON or UTF-8 throws `errc::bad_file` with the parser's position and reason, and so
//! does a NUL byte anywhere (the parser would take it for the end of the text and ignore what
//! follows, where a strict parser refuses the file); nesting deeper than `safetensors_max_depth`,
//! a name repeated within one object (the parser would otherwise keep the last of two equal names
//! silently) and more than `max_names` names in all throw `errc::bad_file` naming it. Linear in
//! the size of the text, but for a logarithm (`checked_json_builder`).
[[nodiscard]] inline nlohmann::json parse_json(std::string_view text, std::string_view where,
                                               std::size_t max_names = json_max_names) {
  std::size_t const nul = text.find('\0');
  SPECDEC_CHECK(nul == std::string_view::npos, bad_file, where, ": a NUL byte at byte ", nul,
                " of ", text.size(), " (JSON text holds none; the text would end there)");
  checked_json_builder builder(max_names);
  bool const ok = nlohmann::json::sax_parse(text.begin(), text.end(), &builder,
                                            nlohmann::json::input_format_t::json, true, false);
  SPECDEC_CHECK(ok && builder.problem.empty(), bad_file, where, ": ",
                builder.problem.empty() ? "invalid JSON" : builder.problem);
  return std::move(builder.value);
}

//! The whole file at `path` as text (a JSON config or tree file), read (never mapped: a file
//! truncated while it is copied must not end the process). Throws `errc::io` when it cannot be
//! read and `errc::bad_file` when it exceeds `limit` bytes.
[[nodiscard]] inline std::string read_text_file(std::filesystem::path const& path,
                                                std::size_t limit = std::size_t{1} << 24) {
  auto const too_big = [&](std::uintmax_t size) {
    SPECDEC_THROW(bad_file, path.string(), ": ", size, " bytes, more than the ", limit,
                  " a JSON file of this kind may have");
  };
  std::error_code ec;  // when the size is unknown, opening the file says why
  if (std::uintmax_t const size = std::filesystem::file_size(path, ec); !ec && size > limit)
    too_big(size);
  auto const map = mapped_file::open(path, file_access::read);
  if (map->size() > limit) too_big(map->size());
  return std::string(reinterpret_cast<char const*>(map->data()), map->size());
}

//! `value` as an unsigned 64-bit integer (a JSON integer >= 0); throws `errc::bad_file` naming
//! `what` otherwise (floats, negative numbers, strings, ...).
[[nodiscard]] inline std::uint64_t json_unsigned(nlohmann::json const& value,
                                                 std::string_view where, std::string_view what) {
  SPECDEC_CHECK(
      value.is_number_unsigned() || (value.is_number_integer() && value.get<std::int64_t>() >= 0),
      bad_file, where, ": ", what, " must be a non-negative integer, got ", value.dump());
  return value.get<std::uint64_t>();
}

}  // namespace detail

//! One tensor of a safetensors file, as its header describes it (checked; see the file comment).
struct safetensors_tensor {
  std::string name;                  //!< the header's key
  safetensors_dtype dtype = {};      //!< the element type
  std::vector<std::uint64_t> shape;  //!< row-major dimensions (empty for a scalar)
  std::uint64_t elements = 0;        //!< the product of `shape` (1 for a scalar)
  std::uint64_t begin = 0;           //!< first byte in the data section
  std::uint64_t end = 0;             //!< one past the last byte in the data section
  std::byte const* data = nullptr;   //!< the first byte in memory ([end - begin] bytes)

  //! Bytes of data (end - begin).
  [[nodiscard]] std::uint64_t bytes() const noexcept { return end - begin; }
  //! The shape as text, e.g. "[512, 64]".
  [[nodiscard]] std::string shape_text() const {
    std::string s = "[";
    for (std::size_t i = 0; i < shape.size(); ++i)
      s += (i == 0 ? "" : ", ") + std::to_string(shape[i]);
    return s + "]";
  }
};

//! A parsed, checked safetensors file (see the file comment for every check). Holds the bytes it
//! was given (a memory map it owns, or a span the caller keeps alive) and points into them.
class safetensors_file {
 public:
  //! Maps (or, with `file_access::read`, reads into memory) and parses the file at `path`; see
  //! mapped_file.hpp for what mapping implies. Throws `errc::io` when it cannot be mapped or read
  //! and `errc::bad_file` (naming the file and the tensor or field) for any malformed content.
  explicit safetensors_file(std::filesystem::path const& path,
                            file_access access = file_access::map)
      : map_(mapped_file::open(path, access)), where_(path.string()) {
    parse(map_->bytes());
  }

  //! Parses `bytes` (which must outlive this object); `where` names them in error messages.
  safetensors_file(std::span<std::byte const> bytes, std::string where) : where_(std::move(where)) {
    parse(bytes);
  }

  //! The file name (or the name given with the bytes), for messages.
  [[nodiscard]] std::string const& where() const noexcept { return where_; }
  //! The file's bytes (a memory map or a copy), when this object opened the file (null for a
  //! span).
  [[nodiscard]] std::shared_ptr<mapped_file const> const& file() const noexcept { return map_; }
  //! Every tensor, in the order of their data (ascending offsets).
  [[nodiscard]] std::span<safetensors_tensor const> tensors() const noexcept { return tensors_; }
  //! The "__metadata__" strings (empty when absent).
  [[nodiscard]] std::map<std::string, std::string> const& metadata() const noexcept {
    return metadata_;
  }
  //! Bytes of the JSON header (N).
  [[nodiscard]] std::uint64_t header_size() const noexcept { return header_size_; }

  //! The tensor called `name`, or null (a binary search over the names).
  [[nodiscard]] safetensors_tensor const* find(std::string_view name) const noexcept {
    auto const it = std::lower_bound(
        by_name_.begin(), by_name_.end(), name,
        [&](std::size_t i, std::string_view n) { return std::string_view(tensors_[i].name) < n; });
    if (it == by_name_.end() || tensors_[*it].name != name) return nullptr;
    return &tensors_[*it];
  }

  //! The tensor called `name`; throws `errc::bad_file` naming it and the file when it is missing.
  [[nodiscard]] safetensors_tensor const& require(std::string_view name) const {
    safetensors_tensor const* t = find(name);
    SPECDEC_CHECK(t != nullptr, bad_file, where_, ": missing tensor '", name, "'");
    return *t;
  }

  //! Converts `t` (a tensor of this file) to float32 into `out`, which must hold `t.elements`
  //! floats. F16 and BF16 convert exactly (model/half.hpp). Throws `errc::unsupported` naming the
  //! tensor for other dtypes and `errc::invalid_argument` for a wrong size of `out`.
  void read(safetensors_tensor const& t, std::span<float> out) const {
    SPECDEC_CHECK(out.size() == t.elements, invalid_argument, where_, ": tensor '", t.name,
                  "' has ", t.elements, " elements, the buffer ", out.size());
    switch (t.dtype) {
      case safetensors_dtype::f32:
        if (!out.empty()) std::memcpy(out.data(), t.data, out.size() * sizeof(float));
        return;
      case safetensors_dtype::f16:
        half_to_float(t.data, out);
        return;
      case safetensors_dtype::bf16:
        bf16_to_float(t.data, out);
        return;
      default:
        SPECDEC_THROW(unsupported, where_, ": tensor '", t.name, "' has dtype ", to_string(t.dtype),
                      ", which is not supported (F32, F16 and BF16 are)");
    }
  }

  //! The tensor called `name` as float32 (see `read`).
  [[nodiscard]] std::vector<float> read(std::string_view name) const {
    safetensors_tensor const& t = require(name);
    std::vector<float> out(static_cast<std::size_t>(t.elements));
    read(t, out);
    return out;
  }

  //! Converts `t` (a tensor of this file) of an integer type (I8 ... I64, U8 ... U64) or BOOL to
  //! int64 into `out`, which must hold `t.elements` values (BOOL: 0 or 1; any other byte throws
  //! `errc::bad_file`, as does a U64 value beyond the int64 range). Throws `errc::unsupported`
  //! naming the tensor for floating-point dtypes and `errc::invalid_argument` for a wrong size.
  void read_integers(safetensors_tensor const& t, std::span<std::int64_t> out) const {
    SPECDEC_CHECK(out.size() == t.elements, invalid_argument, where_, ": tensor '", t.name,
                  "' has ", t.elements, " elements, the buffer ", out.size());
    auto const convert = [&]<class T>(T) {
      for (std::size_t i = 0; i < out.size(); ++i) {
        T v;
        std::memcpy(&v, t.data + i * sizeof(T), sizeof(T));
        if constexpr (std::is_same_v<T, std::uint64_t>)
          SPECDEC_CHECK(v <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()),
                        bad_file, where_, ": tensor '", t.name, "' holds ", v, " at index ", i,
                        ", beyond the int64 range");
        out[i] = static_cast<std::int64_t>(v);
      }
    };
    switch (t.dtype) {
      case safetensors_dtype::i8:
        return convert(std::int8_t{});
      case safetensors_dtype::i16:
        return convert(std::int16_t{});
      case safetensors_dtype::i32:
        return convert(std::int32_t{});
      case safetensors_dtype::i64:
        return convert(std::int64_t{});
      case safetensors_dtype::u8:
        return convert(std::uint8_t{});
      case safetensors_dtype::u16:
        return convert(std::uint16_t{});
      case safetensors_dtype::u32:
        return convert(std::uint32_t{});
      case safetensors_dtype::u64:
        return convert(std::uint64_t{});
      case safetensors_dtype::boolean:
        convert(std::uint8_t{});
        for (std::size_t i = 0; i < out.size(); ++i)
          SPECDEC_CHECK(out[i] == 0 || out[i] == 1, bad_file, where_, ": tensor '", t.name,
                        "' holds the byte ", out[i], " at index ", i, ", not a BOOL (0 or 1)");
        return;
      default:
        SPECDEC_THROW(unsupported, where_, ": tensor '", t.name, "' has dtype ", to_string(t.dtype),
                      ", not an integer or BOOL type");
    }
  }

 private:
  void parse(std::span<std::byte const> bytes) {
    detail::byte_reader r(bytes, where_);
    header_size_ = r.read<std::uint64_t>("the header length");
    SPECDEC_CHECK(header_size_ <= safetensors_max_header, bad_file, where_, ": a header of ",
                  header_size_, " bytes exceeds the limit of ", safetensors_max_header);
    SPECDEC_CHECK(header_size_ <= r.remaining(), bad_file, where_, ": the header of ", header_size_,
                  " bytes runs past the end of the file (", bytes.size(), " bytes)");
    auto const header = r.take(header_size_, "the header");
    std::span<std::byte const> const data = bytes.subspan(static_cast<std::size_t>(r.offset()));
    std::string const header_where = where_ + " (header)";
    nlohmann::json const h = detail::parse_json(
        std::string_view(reinterpret_cast<char const*>(header.data()), header.size()),
        header_where);
    SPECDEC_CHECK(h.is_object(), bad_file, where_, ": the header is not a JSON object");

    tensors_.clear();
    tensors_.reserve(h.size());
    for (auto const& [name, entry] : h.items()) {
      if (name == "__metadata__") {
        SPECDEC_CHECK(entry.is_object(), bad_file, where_,
                      ": __metadata__ is not an object of strings");
        for (auto const& [key, value] : entry.items()) {
          SPECDEC_CHECK(value.is_string(), bad_file, where_, ": __metadata__ entry '", key,
                        "' is not a string");
          metadata_.emplace(key, value.get<std::string>());
        }
        continue;
      }
      tensors_.push_back(parse_entry(name, entry, data));
    }
    std::sort(tensors_.begin(), tensors_.end(), [](auto const& a, auto const& b) {
      return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
    });
    // The tensors tile the data section: each starts where the previous one ended.
    std::uint64_t at = 0;
    for (auto const& t : tensors_) {
      SPECDEC_CHECK(t.begin >= at, bad_file, where_, ": tensor '", t.name, "' (bytes ", t.begin,
                    "..", t.end, ") overlaps the tensor before it, which ends at byte ", at);
      SPECDEC_CHECK(t.begin == at, bad_file, where_, ": tensor '", t.name, "' starts at byte ",
                    t.begin, " of the data, leaving a gap after byte ", at);
      at = t.end;
    }
    SPECDEC_CHECK(at == data.size(), bad_file, where_, ": ", data.size() - at,
                  " bytes after the last tensor (the data section has ", data.size(),
                  " bytes, the tensors cover ", at, ")");
    by_name_.resize(tensors_.size());
    for (std::size_t i = 0; i < by_name_.size(); ++i) by_name_[i] = i;
    std::sort(by_name_.begin(), by_name_.end(),
              [&](std::size_t a, std::size_t b) { return tensors_[a].name < tensors_[b].name; });
  }

  safetensors_tensor parse_entry(std::string const& name, nlohmann::json const& entry,
                                 std::span<std::byte const> data) const {
    std::string const what = where_ + ": tensor '" + name + "'";
    SPECDEC_CHECK(entry.is_object(), bad_file, what, ": its entry is not an object");
    safetensors_tensor t;
    t.name = name;
    auto const field = [&](char const* key) -> nlohmann::json const& {
      auto const it = entry.find(key);
      SPECDEC_CHECK(it != entry.end(), bad_file, what, ": missing field \"", key, "\"");
      return *it;
    };
    nlohmann::json const& dtype = field("dtype");
    SPECDEC_CHECK(dtype.is_string(), bad_file, what, ": \"dtype\" is not a string");
    auto const parsed = parse_safetensors_dtype(dtype.get_ref<std::string const&>());
    SPECDEC_CHECK(parsed.has_value(), unsupported, what, ": unknown dtype ", dtype.dump());
    t.dtype = *parsed;

    nlohmann::json const& shape = field("shape");
    SPECDEC_CHECK(shape.is_array(), bad_file, what, ": \"shape\" is not an array");
    t.elements = 1;
    for (auto const& d : shape) {
      std::uint64_t const dim = detail::json_unsigned(d, what, "a dimension of \"shape\"");
      t.shape.push_back(dim);
      t.elements = detail::checked_mul(t.elements, dim, what, "the element count");
    }
    std::uint64_t const bytes =
        detail::checked_mul(t.elements, element_size(t.dtype), what, "the byte count");

    nlohmann::json const& offsets = field("data_offsets");
    SPECDEC_CHECK(offsets.is_array() && offsets.size() == 2, bad_file, what,
                  ": \"data_offsets\" is not an array of two offsets");
    t.begin = detail::json_unsigned(offsets[0], what, "the first data offset");
    t.end = detail::json_unsigned(offsets[1], what, "the second data offset");
    SPECDEC_CHECK(t.begin <= t.end, bad_file, what, ": data_offsets [", t.begin, ", ", t.end,
                  "] are out of order");
    SPECDEC_CHECK(t.end <= data.size(), bad_file, what, ": data_offsets [", t.begin, ", ", t.end,
                  "] run past the end of the data section (", data.size(), " bytes)");
    SPECDEC_CHECK(t.end - t.begin == bytes, bad_file, what, ": shape ", t.shape_text(), " of ",
                  to_string(t.dtype), " needs ", bytes, " bytes but data_offsets [", t.begin, ", ",
                  t.end, "] hold ", t.end - t.begin);
    t.data = data.data() + t.begin;
    return t;
  }

  std::shared_ptr<mapped_file const> map_;
  std::string where_;
  std::uint64_t header_size_ = 0;
  std::vector<safetensors_tensor> tensors_;
  std::vector<std::size_t> by_name_;  // indices of tensors_ in the order of their names
  std::map<std::string, std::string> metadata_;
};

//! A float32 tensor to write (`write_safetensors`).
struct safetensors_output {
  std::string name;                  //!< unique, not "__metadata__"
  std::vector<std::uint64_t> shape;  //!< row-major; its product is data.size()
  std::span<float const> data;       //!< the values (must stay valid until the write returns)
};

//! Writes `tensors` as F32 in their order to `path` (see the file comment for the layout; the
//! header padded with spaces to a multiple of 8 bytes) with `metadata` (strings) when not empty.
//! What it writes reads back with `safetensors_file` exactly. Throws `errc::invalid_argument` for a
//! duplicate or reserved name or a shape that does not match the data, `errc::io` when the file
//! cannot be written.
inline void write_safetensors(std::filesystem::path const& path,
                              std::span<safetensors_output const> tensors,
                              std::map<std::string, std::string> const& metadata = {}) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::uint64_t offset = 0;
  for (safetensors_output const& t : tensors) {
    SPECDEC_CHECK(t.name != "__metadata__" && !header.contains(t.name), invalid_argument,
                  "write_safetensors: tensor name '", t.name, "' is reserved or given twice");
    std::uint64_t count = 1;  // the shape's product, or more than the data when it overflows
    for (std::uint64_t d : t.shape)
      count = d != 0 && count > std::numeric_limits<std::uint64_t>::max() / d
                  ? std::numeric_limits<std::uint64_t>::max()
                  : count * d;
    SPECDEC_CHECK(count == t.data.size(), invalid_argument, "write_safetensors: tensor '", t.name,
                  "' has ", t.data.size(), " values for its shape");
    std::uint64_t const bytes = t.data.size_bytes();
    header[t.name] = {
        {"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  detail::binary_writer out(path);
  out.write(static_cast<std::uint64_t>(text.size()));
  out.write_bytes(text.data(), text.size());
  for (safetensors_output const& t : tensors) out.write_bytes(t.data.data(), t.data.size_bytes());
  out.close();
}

}  // namespace specdec
