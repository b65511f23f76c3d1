#pragma once
//! \file
//! GGUF (versions 2 and 3, little-endian): a bounds-checked reader of the header, metadata of every
//! value type, tensor infos and data section (`gguf_file`), and `load_gguf` (`llama_weights` from
//! a "llama" GGUF). One topic (one file format, every check of it in one place) needs 800 lines.
//!
//! File layout: "GGUF", uint32 version, uint64 tensor count, uint64 metadata count; metadata
//! entries (string key, uint32 value type, value); tensor infos (string name, uint32 n_dims,
//! uint64 ne[n_dims] innermost first, uint32 ggml type, uint64 offset into the data section);
//! padding to `general.alignment` (default 32); the data section. A string is a uint64 length and
//! that many bytes; an array is a uint32 element type, a uint64 count and the elements.
//!
//! Every length, count, offset and extent is checked against the file size (overflow-safe) before
//! anything is read; violations throw `errc::bad_file` naming the file, the item and the numbers.

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "specdec/core/error.hpp"
#include "specdec/model/binary_io.hpp"
#include "specdec/model/half.hpp"
#include "specdec/model/llama_weights.hpp"
#include "specdec/model/mapped_file.hpp"
#include "specdec/model/weight_storage.hpp"

namespace specdec {

//! The type of a GGUF metadata value (the file's uint32 codes).
enum class gguf_value_type : std::uint32_t {
  uint8 = 0,
  int8 = 1,
  uint16 = 2,
  int16 = 3,
  uint32 = 4,
  int32 = 5,
  float32 = 6,
  boolean = 7,
  string = 8,
  array = 9,
  uint64 = 10,
  int64 = 11,
  float64 = 12,
};

//! A GGUF tensor element type (ggml's type codes). Quantised types are listed so that their
//! extents can be checked and their names reported; only f32, f16 and bf16 are converted.
enum class gguf_type : std::uint32_t {
  f32 = 0,
  f16 = 1,
  q4_0 = 2,
  q4_1 = 3,
  q5_0 = 6,
  q5_1 = 7,
  q8_0 = 8,
  q8_1 = 9,
  q2_k = 10,
  q3_k = 11,
  q4_k = 12,
  q5_k = 13,
  q6_k = 14,
  q8_k = 15,
  iq2_xxs = 16,
  iq2_xs = 17,
  iq3_xxs = 18,
  iq1_s = 19,
  iq4_nl = 20,
  iq3_s = 21,
  iq2_s = 22,
  iq4_xs = 23,
  i8 = 24,
  i16 = 25,
  i32 = 26,
  i64 = 27,
  f64 = 28,
  iq1_m = 29,
  bf16 = 30,
  tq1_0 = 34,
  tq2_0 = 35,
  mxfp4 = 39,
};

//! Storage layout of a tensor type: `block_size` elements take `block_bytes` bytes.
struct gguf_type_traits {
  std::string_view name;      //!< e.g. "Q4_K"; empty for an unknown type
  std::uint32_t block_size;   //!< elements per block (0 for an unknown type)
  std::uint32_t block_bytes;  //!< bytes per block
};

//! The layout and name of `type`; `block_size` is 0 for a code this reader does not know.
[[nodiscard]] constexpr gguf_type_traits traits(gguf_type type) noexcept {
  switch (type) {
    case gguf_type::f32:
      return {"F32", 1, 4};
    case gguf_type::f16:
      return {"F16", 1, 2};
    case gguf_type::q4_0:
      return {"Q4_0", 32, 18};
    case gguf_type::q4_1:
      return {"Q4_1", 32, 20};
    case gguf_type::q5_0:
      return {"Q5_0", 32, 22};
    case gguf_type::q5_1:
      return {"Q5_1", 32, 24};
    case gguf_type::q8_0:
      return {"Q8_0", 32, 34};
    case gguf_type::q8_1:
      return {"Q8_1", 32, 36};
    case gguf_type::q2_k:
      return {"Q2_K", 256, 84};
    case gguf_type::q3_k:
      return {"Q3_K", 256, 110};
    case gguf_type::q4_k:
      return {"Q4_K", 256, 144};
    case gguf_type::q5_k:
      return {"Q5_K", 256, 176};
    case gguf_type::q6_k:
      return {"Q6_K", 256, 210};
    case gguf_type::q8_k:
      return {"Q8_K", 256, 292};
    case gguf_type::iq2_xxs:
      return {"IQ2_XXS", 256, 66};
    case gguf_type::iq2_xs:
      return {"IQ2_XS", 256, 74};
    case gguf_type::iq3_xxs:
      return {"IQ3_XXS", 256, 98};
    case gguf_type::iq1_s:
      return {"IQ1_S", 256, 50};
    case gguf_type::iq4_nl:
      return {"IQ4_NL", 32, 18};
    case gguf_type::iq3_s:
      return {"IQ3_S", 256, 110};
    case gguf_type::iq2_s:
      return {"IQ2_S", 256, 82};
    case gguf_type::iq4_xs:
      return {"IQ4_XS", 256, 136};
    case gguf_type::i8:
      return {"I8", 1, 1};
    case gguf_type::i16:
      return {"I16", 1, 2};
    case gguf_type::i32:
      return {"I32", 1, 4};
    case gguf_type::i64:
      return {"I64", 1, 8};
    case gguf_type::f64:
      return {"F64", 1, 8};
    case gguf_type::iq1_m:
      return {"IQ1_M", 256, 56};
    case gguf_type::bf16:
      return {"BF16", 1, 2};
    case gguf_type::tq1_0:
      return {"TQ1_0", 256, 54};
    case gguf_type::tq2_0:
      return {"TQ2_0", 256, 66};
    case gguf_type::mxfp4:
      return {"MXFP4", 32, 17};
  }
  return {"", 0, 0};
}

//! The name of a metadata value type, e.g. "uint32".
[[nodiscard]] constexpr std::string_view to_string(gguf_value_type type) noexcept {
  switch (type) {
    case gguf_value_type::uint8:
      return "uint8";
    case gguf_value_type::int8:
      return "int8";
    case gguf_value_type::uint16:
      return "uint16";
    case gguf_value_type::int16:
      return "int16";
    case gguf_value_type::uint32:
      return "uint32";
    case gguf_value_type::int32:
      return "int32";
    case gguf_value_type::float32:
      return "float32";
    case gguf_value_type::boolean:
      return "bool";
    case gguf_value_type::string:
      return "string";
    case gguf_value_type::array:
      return "array";
    case gguf_value_type::uint64:
      return "uint64";
    case gguf_value_type::int64:
      return "int64";
    case gguf_value_type::float64:
      return "float64";
  }
  return "unknown";
}

//! Size in bytes of a scalar metadata value type (0 for string and array, whose size varies).
[[nodiscard]] constexpr std::size_t scalar_size(gguf_value_type type) noexcept {
  switch (type) {
    case gguf_value_type::uint8:
    case gguf_value_type::int8:
    case gguf_value_type::boolean:
      return 1;
    case gguf_value_type::uint16:
    case gguf_value_type::int16:
      return 2;
    case gguf_value_type::uint32:
    case gguf_value_type::int32:
    case gguf_value_type::float32:
      return 4;
    case gguf_value_type::uint64:
    case gguf_value_type::int64:
    case gguf_value_type::float64:
      return 8;
    case gguf_value_type::string:
    case gguf_value_type::array:
      return 0;
  }
  return 0;
}

//! The file's magic: "GGUF" as a little-endian uint32.
inline constexpr std::uint32_t gguf_magic = 0x46554747u;
//! The alignment of the data section and of every tensor when `general.alignment` is absent.
inline constexpr std::uint64_t gguf_default_alignment = 32;

namespace detail {
template <class T>
inline constexpr bool gguf_integer = std::is_integral_v<T> && !std::is_same_v<T, bool>;

[[nodiscard]] constexpr bool is_integer(gguf_value_type t) noexcept {
  return t == gguf_value_type::uint8 || t == gguf_value_type::int8 ||
         t == gguf_value_type::uint16 || t == gguf_value_type::int16 ||
         t == gguf_value_type::uint32 || t == gguf_value_type::int32 ||
         t == gguf_value_type::uint64 || t == gguf_value_type::int64;
}
[[nodiscard]] constexpr bool is_signed(gguf_value_type t) noexcept {
  return t == gguf_value_type::int8 || t == gguf_value_type::int16 || t == gguf_value_type::int32 ||
         t == gguf_value_type::int64;
}
}  // namespace detail

//! One metadata value: a scalar, a string, or an array of scalars or strings. Views point into
//! the mapped file, which the owning `gguf_file` keeps alive.
class gguf_value {
 public:
  //! The value's type (`array` for arrays; see `element_type`).
  [[nodiscard]] gguf_value_type type() const noexcept { return type_; }
  //! True for arrays.
  [[nodiscard]] bool is_array() const noexcept { return type_ == gguf_value_type::array; }
  //! The element type of an array (the value's own type otherwise).
  [[nodiscard]] gguf_value_type element_type() const noexcept { return element_type_; }
  //! The number of elements of an array (1 for a scalar or a string).
  [[nodiscard]] std::uint64_t size() const noexcept { return count_; }
  //! The key this value belongs to (for messages).
  [[nodiscard]] std::string_view key() const noexcept { return key_; }

  //! The scalar value converted to `T`: an integer type from any GGUF integer type whose value
  //! fits, `float`/`double` from float32/float64, `bool` from bool, `std::string_view` from a
  //! string. Throws `errc::bad_file` (naming the key and the types) otherwise.
  template <class T>
  [[nodiscard]] T as() const {
    SPECDEC_CHECK(!is_array(), bad_file, where_, ": metadata '", key_,
                  "' is an array, expected a single ", expected_name<T>());
    return element<T>(0);
  }

  //! Element `i` of an array (or the scalar when i == 0), converted as by `as`.
  template <class T>
  [[nodiscard]] T element(std::uint64_t i) const {
    SPECDEC_CHECK(i < count_, out_of_range, where_, ": element ", i, " of metadata '", key_,
                  "' which has ", count_);
    gguf_value_type const t = element_type_;
    if constexpr (std::is_same_v<T, std::string_view> || std::is_same_v<T, std::string>) {
      check_type(t == gguf_value_type::string, "string");
      return T(is_array() ? strings_[static_cast<std::size_t>(i)] : string_);
    } else if constexpr (std::is_same_v<T, bool>) {
      check_type(t == gguf_value_type::boolean, "bool");
      return raw<std::uint8_t>(i) != 0;
    } else if constexpr (std::is_floating_point_v<T>) {
      check_type(t == gguf_value_type::float32 || t == gguf_value_type::float64, "float");
      if (t == gguf_value_type::float32) return static_cast<T>(raw<float>(i));
      double const d = raw<double>(i);
      // A finite float64 beyond `T`'s range would become an infinity (or worse) when converted.
      SPECDEC_CHECK(
          !std::isfinite(d) || std::fabs(d) <= static_cast<double>(std::numeric_limits<T>::max()),
          bad_file, where_, ": metadata '", key_, "' value ", d, " is out of the range of ",
          expected_name<T>());
      return static_cast<T>(d);
    } else {
      static_assert(detail::gguf_integer<T>, "unsupported metadata value type");
      check_type(detail::is_integer(t), "integer");
      if (detail::is_signed(t)) {
        std::int64_t const v = t == gguf_value_type::int8    ? raw<std::int8_t>(i)
                               : t == gguf_value_type::int16 ? raw<std::int16_t>(i)
                               : t == gguf_value_type::int32 ? raw<std::int32_t>(i)
                                                             : raw<std::int64_t>(i);
        SPECDEC_CHECK(std::in_range<T>(v), bad_file, where_, ": metadata '", key_, "' value ", v,
                      " is out of range");
        return static_cast<T>(v);
      }
      std::uint64_t const v = t == gguf_value_type::uint8    ? raw<std::uint8_t>(i)
                              : t == gguf_value_type::uint16 ? raw<std::uint16_t>(i)
                              : t == gguf_value_type::uint32 ? raw<std::uint32_t>(i)
                                                             : raw<std::uint64_t>(i);
      SPECDEC_CHECK(std::in_range<T>(v), bad_file, where_, ": metadata '", key_, "' value ", v,
                    " is out of range");
      return static_cast<T>(v);
    }
  }

  //! All elements of an array (or the scalar as one element), converted as by `as`.
  template <class T>
  [[nodiscard]] std::vector<T> as_vector() const {
    std::vector<T> out;
    out.reserve(static_cast<std::size_t>(count_));
    for (std::uint64_t i = 0; i < count_; ++i) out.push_back(element<T>(i));
    return out;
  }

 private:
  friend class gguf_file;

  template <class T>
  static constexpr char const* expected_name() {
    if constexpr (std::is_same_v<T, std::string_view> || std::is_same_v<T, std::string>) {
      return "string";
    } else if constexpr (std::is_same_v<T, bool>) {
      return "bool";
    } else if constexpr (std::is_floating_point_v<T>) {
      return "float";
    } else {
      return "integer";
    }
  }

  void check_type(bool ok, char const* expected) const {
    SPECDEC_CHECK(ok, bad_file, where_, ": metadata '", key_, "' has type ",
                  to_string(element_type_), ", expected ", expected);
  }

  template <class R>
  [[nodiscard]] R raw(std::uint64_t i) const noexcept {
    R v;
    std::memcpy(&v, data_.data() + i * sizeof(R), sizeof(R));
    return v;
  }

  std::string_view where_;  // the file name (owned by the gguf_file)
  std::string_view key_;
  gguf_value_type type_ = gguf_value_type::uint8;
  gguf_value_type element_type_ = gguf_value_type::uint8;
  std::uint64_t count_ = 1;
  std::span<std::byte const> data_;        // scalar(s) of a numeric value or array
  std::string_view string_;                // a string value
  std::vector<std::string_view> strings_;  // a string array's elements
};

//! One metadata key/value pair.
struct gguf_kv {
  std::string_view key;  //!< the key, e.g. "llama.block_count"
  gguf_value value;      //!< its value
};

//! One tensor's description and its bytes in the map.
struct gguf_tensor_info {
  std::string_view name;                        //!< e.g. "blk.0.attn_q.weight"
  gguf_type type = gguf_type::f32;              //!< element type
  std::uint32_t n_dims = 0;                     //!< number of dimensions used (<= 4)
  std::array<std::uint64_t, 4> ne{1, 1, 1, 1};  //!< extents, innermost first (ne[0] = row length)
  std::uint64_t elements = 0;                   //!< product of the extents
  std::uint64_t offset = 0;                     //!< byte offset from the start of the data section
  std::uint64_t bytes = 0;                      //!< size of the data in bytes
  std::byte const* data = nullptr;              //!< the data in the map, [bytes]
};

//! A parsed GGUF file: metadata and tensor infos, all validated against the file size, over a
//! shared memory map. Cheap to copy (copies share the map and stay valid independently).
class gguf_file {
 public:
  //! Maps (or reads: `file_access::read`) and parses `path`. Throws `errc::io` when the file
  //! cannot be read, `errc::bad_file` (naming the file, the item and the numbers) when it is
  //! malformed or truncated or when two tensors' data overlap, and `errc::unsupported` for GGUF
  //! v1, big-endian files, nested arrays and unknown tensor types.
  explicit gguf_file(std::filesystem::path const& path, file_access access = file_access::map)
      : map_(mapped_file::open(path, access)),
        where_(std::make_shared<std::string>(path.string())) {
    parse();
  }

  //! The GGUF version (2 or 3).
  [[nodiscard]] std::uint32_t version() const noexcept { return version_; }
  //! The alignment of the data section and of tensor offsets.
  [[nodiscard]] std::uint64_t alignment() const noexcept { return alignment_; }
  //! Byte offset of the data section in the file.
  [[nodiscard]] std::uint64_t data_offset() const noexcept { return data_offset_; }
  //! The file name, for messages.
  [[nodiscard]] std::string const& where() const noexcept { return *where_; }
  //! The memory map (to keep data alive beyond this object).
  [[nodiscard]] std::shared_ptr<mapped_file const> const& file() const noexcept { return map_; }

  //! Every metadata entry, in file order.
  [[nodiscard]] std::span<gguf_kv const> metadata() const noexcept { return kvs_; }
  //! The value of `key`, or null when absent.
  [[nodiscard]] gguf_value const* find(std::string_view key) const noexcept {
    auto const it = kv_index_.find(key);
    return it == kv_index_.end() ? nullptr : &kvs_[it->second].value;
  }
  //! True when `key` is present.
  [[nodiscard]] bool contains(std::string_view key) const noexcept { return find(key) != nullptr; }
  //! The scalar `key` converted to `T` (see `gguf_value::as`), or nullopt when absent.
  template <class T>
  [[nodiscard]] std::optional<T> get(std::string_view key) const {
    gguf_value const* v = find(key);
    if (v == nullptr) return std::nullopt;
    return v->as<T>();
  }
  //! The scalar `key` converted to `T`; throws `errc::bad_file` when absent.
  template <class T>
  [[nodiscard]] T require(std::string_view key) const {
    gguf_value const* v = find(key);
    SPECDEC_CHECK(v != nullptr, bad_file, where(), ": missing metadata '", key, "'");
    return v->as<T>();
  }
  //! The array `key` converted element-wise to `T`, or nullopt when absent.
  template <class T>
  [[nodiscard]] std::optional<std::vector<T>> get_array(std::string_view key) const {
    gguf_value const* v = find(key);
    if (v == nullptr) return std::nullopt;
    SPECDEC_CHECK(v->is_array(), bad_file, where(), ": metadata '", key, "' has type ",
                  to_string(v->type()), ", expected an array");
    return v->as_vector<T>();
  }

  //! Every tensor, in file order.
  [[nodiscard]] std::span<gguf_tensor_info const> tensors() const noexcept { return tensors_; }
  //! The tensor called `name`, or null when absent.
  [[nodiscard]] gguf_tensor_info const* find_tensor(std::string_view name) const noexcept {
    auto const it = tensor_index_.find(name);
    return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
  }

 private:
  void parse() {
    std::string const& w = *where_;
    detail::byte_reader r(map_->bytes(), w);
    SPECDEC_CHECK(map_->size() >= 4 && r.read<std::uint32_t>("magic") == gguf_magic, bad_file, w,
                  ": not a GGUF file (no 'GGUF' magic)");
    version_ = r.read<std::uint32_t>("version");
    SPECDEC_CHECK(version_ != 1, unsupported, w, ": GGUF version 1 is not supported (2 and 3 are)");
    SPECDEC_CHECK((version_ & 0xffffu) != 0, unsupported, w,
                  ": big-endian GGUF files are not supported (version field ", version_, ")");
    SPECDEC_CHECK(version_ == 2 || version_ == 3, unsupported, w, ": GGUF version ", version_,
                  " is not supported (2 and 3 are)");
    std::uint64_t const n_tensors = r.read<std::uint64_t>("tensor count");
    std::uint64_t const n_kv = r.read<std::uint64_t>("metadata count");
    // Each entry takes at least 13 bytes (key length, type, a 1-byte value); each tensor info at
    // least 24 (name length, n_dims, type, offset): reject counts the file cannot hold before
    // reserving memory for them.
    SPECDEC_CHECK(n_kv <= r.remaining() / 13, bad_file, w, ": metadata count ", n_kv,
                  " cannot fit in the file (", map_->size(), " bytes)");
    SPECDEC_CHECK(n_tensors <= r.remaining() / 24, bad_file, w, ": tensor count ", n_tensors,
                  " cannot fit in the file (", map_->size(), " bytes)");

    kvs_.reserve(static_cast<std::size_t>(n_kv));
    for (std::uint64_t i = 0; i < n_kv; ++i) {
      std::string_view const key = read_string(r, "metadata key");
      gguf_kv kv{key, {}};
      kv.value.where_ = w;
      kv.value.key_ = key;
      auto const type = read_value_type(r, key);
      kv.value.type_ = type;
      kv.value.element_type_ = type;
      if (type == gguf_value_type::array) {
        auto const elem = read_value_type(r, key);
        SPECDEC_CHECK(elem != gguf_value_type::array, unsupported, w, ": metadata '", key,
                      "' is an array of arrays, which is not supported");
        std::uint64_t const count = r.read<std::uint64_t>("array length");
        kv.value.element_type_ = elem;
        kv.value.count_ = count;
        if (elem == gguf_value_type::string) {
          SPECDEC_CHECK(count <= r.remaining() / 8, bad_file, w, ": metadata '", key, "' claims ",
                        count, " strings at offset ", r.offset(), " but only ", r.remaining(),
                        " bytes remain");
          kv.value.strings_.reserve(static_cast<std::size_t>(count));
          for (std::uint64_t j = 0; j < count; ++j) {
            kv.value.strings_.push_back(read_string(r, key));
          }
        } else {
          std::uint64_t const bytes =
              detail::checked_mul(count, scalar_size(elem), w, "metadata array size");
          SPECDEC_CHECK(bytes <= r.remaining(), bad_file, w, ": metadata '", key, "' claims ",
                        count, " elements of ", to_string(elem), " (", bytes, " bytes) at offset ",
                        r.offset(), " but only ", r.remaining(), " bytes remain");
          kv.value.data_ = r.take(bytes, key);
        }
      } else if (type == gguf_value_type::string) {
        kv.value.string_ = read_string(r, key);
      } else {
        kv.value.data_ = r.take(scalar_size(type), key);
      }
      SPECDEC_CHECK(kv_index_.emplace(key, kvs_.size()).second, bad_file, w,
                    ": duplicate metadata key '", key, "'");
      kvs_.push_back(std::move(kv));
    }

    alignment_ = gguf_default_alignment;
    if (gguf_value const* a = find("general.alignment")) {
      alignment_ = a->as<std::uint64_t>();
      SPECDEC_CHECK(alignment_ != 0 && (alignment_ & (alignment_ - 1)) == 0 &&
                        alignment_ <= (std::uint64_t{1} << 30),
                    bad_file, w, ": general.alignment ", alignment_,
                    " is not a power of two (up to 2^30)");
    }

    tensors_.reserve(static_cast<std::size_t>(n_tensors));
    for (std::uint64_t i = 0; i < n_tensors; ++i) {
      gguf_tensor_info t;
      t.name = read_string(r, "tensor name");
      t.n_dims = r.read<std::uint32_t>("tensor dimension count");
      SPECDEC_CHECK(t.n_dims <= 4, bad_file, w, ": tensor '", t.name, "' has ", t.n_dims,
                    " dimensions (at most 4)");
      t.elements = 1;
      for (std::uint32_t d = 0; d < t.n_dims; ++d) {
        t.ne[d] = r.read<std::uint64_t>("tensor extent");
        SPECDEC_CHECK(
            t.ne[d] <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()),
            bad_file, w, ": tensor '", t.name, "' extent ", d, " is ", t.ne[d]);
        t.elements = detail::checked_mul(t.elements, t.ne[d], w, "tensor element count");
      }
      auto const code = r.read<std::uint32_t>("tensor type");
      t.type = static_cast<gguf_type>(code);
      gguf_type_traits const tr = traits(t.type);
      SPECDEC_CHECK(tr.block_size != 0, unsupported, w, ": tensor '", t.name,
                    "' has unknown ggml type ", code);
      SPECDEC_CHECK(t.ne[0] % tr.block_size == 0, bad_file, w, ": tensor '", t.name, "' of type ",
                    tr.name, " has rows of ", t.ne[0], " elements, not a multiple of its block of ",
                    tr.block_size);
      t.bytes = detail::checked_mul(t.elements / tr.block_size, tr.block_bytes, w, "tensor size");
      t.offset = r.read<std::uint64_t>("tensor offset");
      SPECDEC_CHECK(t.offset % alignment_ == 0, bad_file, w, ": tensor '", t.name, "' offset ",
                    t.offset, " is not a multiple of the alignment ", alignment_);
      SPECDEC_CHECK(tensor_index_.emplace(t.name, tensors_.size()).second, bad_file, w,
                    ": duplicate tensor '", t.name, "'");
      tensors_.push_back(t);
    }

    // The data section starts at the next multiple of the alignment.
    std::uint64_t const end = r.offset();
    data_offset_ =
        detail::checked_add(end, (alignment_ - end % alignment_) % alignment_, w, "data offset");
    SPECDEC_CHECK(data_offset_ <= map_->size() || tensors_.empty(), bad_file, w,
                  ": truncated: the data section would start at ", data_offset_,
                  " but the file has ", map_->size(), " bytes");
    for (auto& t : tensors_) {
      std::uint64_t const begin = detail::checked_add(data_offset_, t.offset, w, "tensor offset");
      std::uint64_t const stop = detail::checked_add(begin, t.bytes, w, "tensor extent");
      SPECDEC_CHECK(stop <= map_->size(), bad_file, w, ": tensor '", t.name, "' (", t.bytes,
                    " bytes at file offset ", begin, ") extends past the end of the file (",
                    map_->size(), " bytes)");
      t.data = map_->data() + begin;
    }
    check_overlaps();
  }

  // Rejects tensors whose data overlap or alias each other (llama.cpp lays tensors out one after
  // another; two views of the same bytes load as garbage). Tensors of no bytes overlap nothing.
  void check_overlaps() const {
    std::vector<gguf_tensor_info const*> order;
    order.reserve(tensors_.size());
    for (auto const& t : tensors_)
      if (t.bytes > 0) order.push_back(&t);
    std::sort(order.begin(), order.end(), [](auto const* a, auto const* b) {
      return a->offset < b->offset || (a->offset == b->offset && a->name < b->name);
    });
    for (std::size_t i = 1; i < order.size(); ++i) {
      gguf_tensor_info const& a = *order[i - 1];
      gguf_tensor_info const& b = *order[i];
      SPECDEC_CHECK(a.offset + a.bytes <= b.offset, bad_file, *where_, ": the data of tensor '",
                    b.name, "' (", b.bytes, " bytes at data offset ", b.offset,
                    ") overlaps that of tensor '", a.name, "' (", a.bytes, " bytes at data offset ",
                    a.offset, ")");
    }
  }

  std::string_view read_string(detail::byte_reader& r, std::string_view what) {
    std::uint64_t const length = r.read<std::uint64_t>("string length");
    SPECDEC_CHECK(length <= r.remaining(), bad_file, *where_, ": ", what, ": string of ", length,
                  " bytes at offset ", r.offset() - 8, " runs past the end of the file (",
                  map_->size(), " bytes)");
    auto const bytes = r.take(length, what);
    return {reinterpret_cast<char const*>(bytes.data()), bytes.size()};
  }

  gguf_value_type read_value_type(detail::byte_reader& r, std::string_view key) {
    auto const code = r.read<std::uint32_t>("value type");
    SPECDEC_CHECK(code <= 12, bad_file, *where_, ": metadata '", key, "' has unknown value type ",
                  code, " at offset ", r.offset() - 4);
    return static_cast<gguf_value_type>(code);
  }

  std::shared_ptr<mapped_file const> map_;
  std::shared_ptr<std::string const> where_;  // stable address: values keep a view of it
  std::uint32_t version_ = 0;
  std::uint64_t alignment_ = gguf_default_alignment;
  std::uint64_t data_offset_ = 0;
  std::vector<gguf_kv> kvs_;
  std::unordered_map<std::string_view, std::size_t> kv_index_;
  std::vector<gguf_tensor_info> tensors_;
  std::unordered_map<std::string_view, std::size_t> tensor_index_;
};

namespace detail {

//! Reads a metadata integer as an int32 hyper-parameter (throws `errc::bad_file` if absent when
//! `fallback` is empty, or out of int32 range).
inline std::int32_t gguf_param(gguf_file const& f, std::string const& key,
                               std::optional<std::int32_t> fallback = std::nullopt) {
  gguf_value const* v = f.find(key);
  if (v == nullptr) {
    SPECDEC_CHECK(fallback.has_value(), bad_file, f.where(), ": missing metadata '", key, "'");
    return *fallback;
  }
  SPECDEC_CHECK(!v->is_array(), unsupported, f.where(), ": metadata '", key,
                "' is a per-layer array, which is not supported");
  return v->as<std::int32_t>();
}

//! Reads a metadata float as a hyper-parameter (`fallback` when absent) and checks it as
//! `llama_config::validate` does, naming the key: finite, positive and below `max`.
inline float gguf_hyperparameter(gguf_file const& f, std::string const& key, float fallback,
                                 float max) {
  float const v = f.get<float>(key).value_or(fallback);
  llama_config::check_hyperparameter(v, max, f.where(), "metadata '" + key + "'");
  return v;
}

}  // namespace detail

//! Builds `llama_weights` from a parsed GGUF of architecture "llama" (llama.* hyper-parameters;
//! tensors token_embd, blk.N.{attn_norm, attn_q, attn_k, attn_v, attn_output, ffn_norm,
//! ffn_gate, ffn_down, ffn_up}, output_norm, and output, whose absence means a tied classifier).
//! F32 tensors point into the map (copied when misaligned); F16 and BF16 are converted to float32
//! in owned storage; every weight is checked to be finite. Throws `errc::unsupported` for other
//! architectures, quantised tensor types (naming the type and the tensor), MoE, partial rotary
//! embeddings and RoPE scaling, and `errc::bad_file` for missing tensors or metadata, shapes that
//! disagree with the config, tensors the architecture does not use (as llama.cpp refuses them: a
//! llama.block_count below the file's layers would otherwise load part of the model) and NaN or
//! infinite weights (naming the tensor).
[[nodiscard]] inline llama_weights load_gguf(gguf_file const& f) {
  std::string const& w = f.where();
  auto const arch = f.require<std::string_view>("general.architecture");
  SPECDEC_CHECK(arch == "llama", unsupported, w, ": architecture '", arch,
                "' is not supported (only 'llama')");
  llama_config c;
  c.dim = detail::gguf_param(f, "llama.embedding_length");
  c.hidden_dim = detail::gguf_param(f, "llama.feed_forward_length");
  c.n_layers = detail::gguf_param(f, "llama.block_count");
  c.n_heads = detail::gguf_param(f, "llama.attention.head_count");
  c.n_kv_heads = detail::gguf_param(f, "llama.attention.head_count_kv", c.n_heads);
  c.seq_len = detail::gguf_param(f, "llama.context_length");
  c.rope_theta = detail::gguf_hyperparameter(f, "llama.rope.freq_base", 10000.0f,
                                             llama_config::max_rope_theta);
  c.rms_eps = detail::gguf_hyperparameter(f, "llama.attention.layer_norm_rms_epsilon", 1e-5f,
                                          llama_config::max_rms_eps);
  SPECDEC_CHECK(detail::gguf_param(f, "llama.expert_count", 0) == 0, unsupported, w,
                ": mixture-of-experts models are not supported");
  if (auto const scaling = f.get<std::string_view>("llama.rope.scaling.type")) {
    SPECDEC_CHECK(*scaling == "none", unsupported, w, ": RoPE scaling '", *scaling,
                  "' is not supported");
  }
  SPECDEC_CHECK(f.find_tensor("rope_freqs.weight") == nullptr, unsupported, w,
                ": per-dimension RoPE frequency factors (rope_freqs.weight) are not supported");

  gguf_tensor_info const* const embd = f.find_tensor("token_embd.weight");
  SPECDEC_CHECK(embd != nullptr, bad_file, w, ": missing tensor 'token_embd.weight'");
  SPECDEC_CHECK(embd->n_dims == 2 && embd->ne[1] <= std::uint64_t{1} << 24, bad_file, w,
                ": tensor 'token_embd.weight' has ", embd->n_dims, " dimensions, ne[1] ",
                embd->ne[1]);
  c.vocab_size = static_cast<std::int32_t>(embd->ne[1]);
  if (auto const v = f.get<std::int64_t>("llama.vocab_size")) {
    SPECDEC_CHECK(*v == c.vocab_size, bad_file, w, ": llama.vocab_size ", *v,
                  " disagrees with token_embd.weight's ", c.vocab_size, " rows");
  }
  gguf_tensor_info const* const output = f.find_tensor("output.weight");
  c.shared_classifier = output == nullptr;
  c.validate(w.c_str());

  auto const d = static_cast<std::uint64_t>(c.dim), h = static_cast<std::uint64_t>(c.hidden_dim),
             kv = static_cast<std::uint64_t>(c.kv_dim()),
             v = static_cast<std::uint64_t>(c.vocab_size);

  // Pass 1: find every tensor, check its shape and type, and count the floats to convert.
  struct wanted {
    gguf_tensor_info const* info;
    float const** target;
  };
  llama_weights out;
  out.config = c;
  out.layers.resize(static_cast<std::size_t>(c.n_layers));
  std::vector<wanted> list;
  std::uint64_t owned = 0;
  auto const want = [&](std::string const& name, std::uint64_t cols, std::uint64_t rows,
                        float const** target) {
    gguf_tensor_info const* t = f.find_tensor(name);
    SPECDEC_CHECK(t != nullptr, bad_file, w, ": missing tensor '", name, "'");
    std::uint32_t const dims = rows == 1 ? 1u : 2u;
    bool shape_ok =
        t->ne[0] == cols && t->ne[1] == rows && t->ne[2] == 1 && t->ne[3] == 1 && t->n_dims >= dims;
    SPECDEC_CHECK(shape_ok, bad_file, w, ": tensor '", name, "' has shape [", t->ne[0], ", ",
                  t->ne[1], ", ", t->ne[2], ", ", t->ne[3], "] (innermost first), expected [", cols,
                  ", ", rows, "]");
    bool const aligned_f32 = t->type == gguf_type::f32 &&
                             reinterpret_cast<std::uintptr_t>(t->data) % alignof(float) == 0;
    SPECDEC_CHECK(
        t->type == gguf_type::f32 || t->type == gguf_type::f16 || t->type == gguf_type::bf16,
        unsupported, w, ": tensor '", name, "' has type ", traits(t->type).name,
        ", which is not supported (F32, F16 and BF16 are)");
    if (!aligned_f32) owned += t->elements;
    list.push_back({t, target});
  };
  want("token_embd.weight", d, v, &out.token_embedding);
  want("output_norm.weight", d, 1, &out.rms_final);
  if (output != nullptr) want("output.weight", d, v, &out.classifier);
  for (std::size_t l = 0; l < out.layers.size(); ++l) {
    auto& layer = out.layers[l];
    std::string const p = "blk." + std::to_string(l) + ".";
    want(p + "attn_norm.weight", d, 1, &layer.rms_att);
    want(p + "attn_q.weight", d, d, &layer.wq);
    want(p + "attn_k.weight", d, kv, &layer.wk);
    want(p + "attn_v.weight", d, kv, &layer.wv);
    want(p + "attn_output.weight", d, d, &layer.wo);
    want(p + "ffn_norm.weight", d, 1, &layer.rms_ffn);
    want(p + "ffn_gate.weight", d, h, &layer.w1);
    want(p + "ffn_down.weight", h, d, &layer.w2);
    want(p + "ffn_up.weight", d, h, &layer.w3);
  }

  if (auto const rot = f.get<std::int64_t>("llama.rope.dimension_count")) {
    SPECDEC_CHECK(*rot == c.head_size(), unsupported, w, ": llama.rope.dimension_count ", *rot,
                  " differs from the head size ", c.head_size(),
                  " (partial rotary embeddings are not supported)");
  }
  // Every tensor of the file must be one of those: an unused one means a header that does not
  // describe the file (fewer layers than it holds) or tensors of another architecture.
  if (list.size() != f.tensors().size()) {
    for (gguf_tensor_info const& t : f.tensors()) {
      bool used = false;
      for (auto const& entry : list) used = used || entry.info == &t;
      SPECDEC_CHECK(used, bad_file, w, ": tensor '", t.name, "' is not used by a llama model of ",
                    c.n_layers, " layers (llama.block_count ", c.n_layers, ")",
                    output == nullptr ? "" : " with an untied classifier");
    }
  }
  // Pass 2: point into the map or convert into one owned buffer (sized once: stable pointers).
  auto storage = std::make_shared<detail::weight_storage>();
  storage->map = f.file();
  float* next = storage->allocate(static_cast<std::size_t>(owned));
  for (auto const& [t, target] : list) {
    if (t->type == gguf_type::f32 &&
        reinterpret_cast<std::uintptr_t>(t->data) % alignof(float) == 0) {
      *target = reinterpret_cast<float const*>(t->data);
      continue;
    }
    auto const n = static_cast<std::size_t>(t->elements);
    if (t->type == gguf_type::f32) {
      std::memcpy(next, t->data, n * sizeof(float));
    } else if (t->type == gguf_type::f16) {
      half_to_float(t->data, std::span<float>(next, n));
    } else {
      bf16_to_float(t->data, std::span<float>(next, n));
    }
    *target = next;
    next += n;
  }
  for (auto const& [t, target] : list) detail::check_finite(*target, t->elements, w, t->name);
  if (output == nullptr) out.classifier = out.token_embedding;
  out.storage = std::move(storage);
  return out;
}

//! Maps (or reads: `file_access::read`), parses and loads the GGUF model at `path` (see
//! `gguf_file` and `load_gguf(gguf_file)`).
[[nodiscard]] inline llama_weights load_gguf(std::filesystem::path const& path,
                                             file_access access = file_access::map) {
  return load_gguf(gguf_file(path, access));
}

}  // namespace specdec
