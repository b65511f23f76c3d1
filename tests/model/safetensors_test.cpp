// The safetensors reader (model/safetensors.hpp): round trips of F32 / F16 / BF16 tensors, the
// metadata, and every malformed-file case, each a specdec::error naming the tensor or the header
// field and the file.
#include "specdec/model/safetensors.hpp"

#include "support/doctest.hpp"

#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "model/safetensors_util.hpp"
#include "model/test_util.hpp"
#include "support/errors.hpp"
#include "support/files.hpp"

using namespace specdec;
using specdec::test::st_file;
using specdec::test::st_floats;
using specdec::test::st_raw;
using test_support::check_error;

namespace {

std::vector<float> ramp(std::size_t n, float scale = 0.25f) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = (static_cast<float>(i) - 3.0f) * scale;
  return v;
}

// Parses `bytes` as a file called "test.safetensors".
safetensors_file parse(std::vector<std::byte> const& bytes) {
  return safetensors_file(bytes, "test.safetensors");
}

//! A JSON object of the given members: built by appending (GCC 12's -Wrestrict misreads
//! `"{" + std::string&&` at -O3).
std::string object(std::string const& members) {
  std::string s = "{";
  s += members;
  s += '}';
  return s;
}

// A header entry with the given fields.
std::string entry(std::string const& name, std::string const& dtype, std::string const& shape,
                  std::string const& offsets) {
  return "\"" + name + "\":{\"dtype\":" + dtype + ",\"shape\":" + shape +
         ",\"data_offsets\":" + offsets + "}";
}

// The i-th of many long names (66 bytes or so, as in a header padded with names to make its check
// slow).
std::string long_name(std::size_t i) {
  return "model.layers.0.self_attn.q_proj.weight.a_name_of_many_" + std::to_string(i);
}

// A header holding the tensor "a" ([2] F32, data bytes [0, 8)) and `n` more names: metadata
// strings, or empty tensors at the end of the data; `repeat` names the first of them again last.
std::string many_names(std::size_t n, bool tensors, bool repeat) {
  std::string h = "{" + entry("a", "\"F32\"", "[2]", "[0,8]");
  if (!tensors) h += ",\"__metadata__\":{";
  for (std::size_t i = 0; i <= n; ++i) {
    if (i == n && !repeat) break;
    std::string const name = long_name(i == n ? 0 : i);
    if (i > 0 || tensors) h += ',';
    h += tensors ? entry(name, "\"F32\"", "[0]", "[8,8]") : "\"" + name + "\":\"v\"";
  }
  h += tensors ? "}" : "}}";
  return h;
}

// Seconds since `start`.
double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

TEST_CASE("safetensors: F32, F16 and BF16 tensors read back as float32") {
  std::vector<float> const a = ramp(6), b = ramp(4, 0.5f), c = ramp(8, 0.125f);
  auto const bytes = st_file({st_floats("a", {2, 3}, a), st_floats("b.weight", {4}, b, "F16"),
                              st_floats("c", {2, 2, 2}, c, "BF16")},
                             {{"format", "pt"}});
  safetensors_file const f = parse(bytes);
  REQUIRE(f.tensors().size() == 3);
  CHECK(f.metadata().at("format") == "pt");
  CHECK(f.header_size() % 8 == 0);
  CHECK(f.read("a") == a);
  CHECK(f.read("b.weight") == b);  // these values are exact in F16 and BF16
  CHECK(f.read("c") == c);
  safetensors_tensor const& t = f.require("c");
  CHECK(t.dtype == safetensors_dtype::bf16);
  CHECK(t.shape == std::vector<std::uint64_t>{2, 2, 2});
  CHECK(t.elements == 8);
  CHECK(t.bytes() == 16);
  CHECK(t.shape_text() == "[2, 2, 2]");
  CHECK(f.find("missing") == nullptr);
  // Tensors are listed in data order.
  CHECK(f.tensors()[0].name == "a");
  CHECK(f.tensors()[2].name == "c");

  SUBCASE("F16 and BF16 round to nearest even, as the writers convert") {
    std::vector<float> const odd{0.1f, -1.0e-6f, 65504.0f, 3.14159f};
    auto const f16 = parse(st_file({st_floats("x", {4}, odd, "F16")})).read("x");
    auto const bf = parse(st_file({st_floats("x", {4}, odd, "BF16")})).read("x");
    for (std::size_t i = 0; i < odd.size(); ++i) {
      CHECK(f16[i] == half_to_float(float_to_half(odd[i])));
      CHECK(bf[i] == bf16_to_float(float_to_bf16(odd[i])));
    }
  }
  SUBCASE("from a file on disk") {
    test_support::temp_dir dir;
    specdec::test::write_bytes(dir.file("x.safetensors"), bytes);
    safetensors_file const g(dir.file("x.safetensors"));
    CHECK(g.file() != nullptr);
    CHECK(g.read("a") == a);
    CHECK(g.where().find("x.safetensors") != std::string::npos);
  }
}

TEST_CASE("safetensors: scalars, empty tensors and an empty file of tensors") {
  auto const bytes = st_file(
      {st_floats("s", {}, {2.5f}), st_floats("e", {0, 4}, {}), st_floats("v", {1}, {-1.0f})});
  safetensors_file const f = parse(bytes);
  CHECK(f.read("s") == std::vector<float>{2.5f});
  CHECK(f.require("s").elements == 1);
  CHECK(f.read("e").empty());
  CHECK(f.read("v") == std::vector<float>{-1.0f});
  CHECK(parse(st_raw("{}", {})).tensors().empty());
}

TEST_CASE("safetensors: other dtypes are listed, reading them as floats is unsupported") {
  std::vector<std::byte> data(8);
  auto const bytes = st_raw(object(entry("ids", "\"I32\"", "[2]", "[0,8]")), data);
  safetensors_file const f = parse(bytes);
  CHECK(f.require("ids").dtype == safetensors_dtype::i32);
  check_error([&] { (void)f.read("ids"); }, errc::unsupported, "tensor 'ids' has dtype I32");
  check_error([&] { (void)parse(st_raw(object(entry("q", "\"Q4\"", "[2]", "[0,8]")), data)); },
              errc::unsupported, "unknown dtype \"Q4\"");
  std::vector<float> out(3);
  check_error([&] { f.read(f.require("ids"), out); }, errc::invalid_argument, "'ids' has 2");
}

TEST_CASE("safetensors: every malformed file is a specdec::error naming the problem") {
  std::vector<std::byte> const data16(16);
  auto const one = [&](std::string const& e, std::vector<std::byte> const& data) {
    return st_raw(object(e), data);
  };
  SUBCASE("shorter than the header length") {
    check_error([&] { (void)parse(std::vector<std::byte>(5)); }, errc::bad_file,
                "test.safetensors: truncated: the header length");
  }
  SUBCASE("header over the file, absurd header sizes") {
    auto bytes = st_file({st_floats("a", {2}, {1.0f, 2.0f})});
    auto truncated = bytes;
    truncated.resize(20);
    check_error([&] { (void)parse(truncated); }, errc::bad_file, "runs past the end of the file");
    specdec::test::poke<std::uint64_t>(bytes, 0, std::numeric_limits<std::uint64_t>::max());
    check_error([&] { (void)parse(bytes); }, errc::bad_file, "exceeds the limit");
    specdec::test::poke<std::uint64_t>(bytes, 0, safetensors_max_header);
    check_error([&] { (void)parse(bytes); }, errc::bad_file, "runs past the end of the file");
  }
  SUBCASE("truncated data") {
    auto bytes = st_file({st_floats("a", {4}, ramp(4))});
    bytes.resize(bytes.size() - 1);
    check_error([&] { (void)parse(bytes); }, errc::bad_file,
                "tensor 'a': data_offsets [0, 16] run past the end of the data section (15");
  }
  SUBCASE("bad JSON, bad UTF-8, not an object, too deep, duplicate names") {
    check_error([&] { (void)parse(st_raw("{\"a\":", {})); }, errc::bad_file,
                "test.safetensors (header): invalid JSON");
    check_error([&] { (void)parse(st_raw("{\"a\xff\":1}", {})); }, errc::bad_file, "invalid JSON");
    check_error([&] { (void)parse(st_raw("[1,2]", {})); }, errc::bad_file,
                "the header is not a JSON object");
    check_error([&] { (void)parse(st_raw("{\"a\":[[[[[[[[[[1]]]]]]]]]]}", {})); }, errc::bad_file,
                "nested deeper than");
    std::string const a = entry("a", "\"F32\"", "[2]", "[0,8]");
    std::string const b = entry("a", "\"F32\"", "[2]", "[8,16]");
    check_error([&] { (void)parse(st_raw(object(a + "," + b), data16)); }, errc::bad_file,
                "the name 'a' appears twice");
  }
  SUBCASE("a NUL byte, with or without content after it") {
    // The JSON parser would end the text at the NUL and ignore the rest; a strict one refuses it.
    check_error([&] { (void)parse(st_raw(std::string("{}\0{\"a\":1}", 10), {})); }, errc::bad_file,
                "test.safetensors (header): a NUL byte at byte 2 of 16");
    std::string const a = entry("a", "\"F32\"", "[2]", "[0,8]");
    check_error([&] { (void)parse(st_raw(object(a) + std::string(1, '\0'), data16)); },
                errc::bad_file, "a NUL byte at byte");
  }
  SUBCASE("more names than the limit") {
    check_error([&] { (void)detail::parse_json("{\"a\":{\"b\":1,\"c\":2}}", "names.json", 2); },
                errc::bad_file, "names.json: more than 2 names in its JSON objects");
    CHECK(detail::parse_json("{\"a\":{\"b\":1}}", "names.json", 2).size() == 1);
  }
  SUBCASE("malformed entries") {
    check_error([&] { (void)parse(one("\"a\":[1]", {})); }, errc::bad_file,
                "tensor 'a': its entry is not an object");
    check_error([&] { (void)parse(one("\"a\":{\"shape\":[1],\"data_offsets\":[0,4]}", data16)); },
                errc::bad_file, "tensor 'a': missing field \"dtype\"");
    check_error(
        [&] { (void)parse(one("\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}", data16)); },
        errc::bad_file, "tensor 'a': missing field \"shape\"");
    check_error([&] { (void)parse(one("\"a\":{\"dtype\":\"F32\",\"shape\":[1]}", data16)); },
                errc::bad_file, "tensor 'a': missing field \"data_offsets\"");
    check_error([&] { (void)parse(one(entry("a", "7", "[4]", "[0,16]"), data16)); }, errc::bad_file,
                "tensor 'a': \"dtype\" is not a string");
    check_error([&] { (void)parse(one(entry("a", "\"F32\"", "4", "[0,16]"), data16)); },
                errc::bad_file, "tensor 'a': \"shape\" is not an array");
    check_error([&] { (void)parse(one(entry("a", "\"F32\"", "[-4]", "[0,16]"), data16)); },
                errc::bad_file, "a dimension of \"shape\" must be a non-negative integer");
    check_error([&] { (void)parse(one(entry("a", "\"F32\"", "[4.5]", "[0,16]"), data16)); },
                errc::bad_file, "a dimension of \"shape\"");
    check_error([&] { (void)parse(one(entry("a", "\"F32\"", "[\"4\"]", "[0,16]"), data16)); },
                errc::bad_file, "a dimension of \"shape\"");
    check_error([&] { (void)parse(one(entry("a", "\"F32\"", "[4]", "[0,16,2]"), data16)); },
                errc::bad_file, "\"data_offsets\" is not an array of two offsets");
    check_error([&] { (void)parse(one(entry("a", "\"F32\"", "[4]", "[0,-16]"), data16)); },
                errc::bad_file, "the second data offset must be a non-negative integer");
    check_error([&] { (void)parse(one(entry("a", "\"F32\"", "[0]", "[16,0]"), data16)); },
                errc::bad_file, "tensor 'a': data_offsets [16, 0] are out of order");
    check_error([&] { (void)parse(one(entry("a", "\"F32\"", "[3]", "[0,16]"), data16)); },
                errc::bad_file, "tensor 'a': shape [3] of F32 needs 12 bytes but data_offsets");
    check_error([&] { (void)parse(one(entry("a", "\"F16\"", "[4]", "[0,16]"), data16)); },
                errc::bad_file, "shape [4] of F16 needs 8 bytes");
    check_error(
        [&] {
          (void)parse(one(entry("a", "\"F32\"", "[4294967296,4294967296]", "[0,16]"), data16));
        },
        errc::bad_file, "tensor 'a': the element count overflows");
    check_error(
        [&] { (void)parse(one(entry("a", "\"F64\"", "[4611686018427387904]", "[0,16]"), data16)); },
        errc::bad_file, "tensor 'a': the byte count overflows");
    check_error(
        [&] { (void)parse(one(entry("a", "\"F32\"", "[4]", "[0,18446744073709551615]"), data16)); },
        errc::bad_file, "run past the end of the data section");
  }
  SUBCASE("overlapping, gapped and trailing data") {
    std::string const a = entry("a", "\"F32\"", "[2]", "[0,8]");
    check_error(
        [&] {
          (void)parse(st_raw(object(a + "," + entry("b", "\"F32\"", "[2]", "[4,12]")), data16));
        },
        errc::bad_file, "tensor 'b' (bytes 4..12) overlaps the tensor before it");
    check_error(
        [&] {
          (void)parse(st_raw(object(a + "," + entry("b", "\"F32\"", "[1]", "[12,16]")), data16));
        },
        errc::bad_file, "tensor 'b' starts at byte 12 of the data, leaving a gap after byte 8");
    check_error([&] { (void)parse(st_raw(object(a), data16)); }, errc::bad_file,
                "8 bytes after the last tensor");
    check_error([&] { (void)parse(st_raw("{}", data16)); }, errc::bad_file,
                "16 bytes after the last tensor");
    // Two tensors at the same bytes.
    check_error(
        [&] {
          (void)parse(st_raw(object(a + "," + entry("b", "\"F32\"", "[2]", "[0,8]")), data16));
        },
        errc::bad_file, "overlaps the tensor before it");
  }
  SUBCASE("metadata that is not an object of strings") {
    check_error([&] { (void)parse(st_raw("{\"__metadata__\":{\"n\":1}}", {})); }, errc::bad_file,
                "__metadata__ entry 'n' is not a string");
    check_error([&] { (void)parse(st_raw("{\"__metadata__\":[]}", {})); }, errc::bad_file,
                "__metadata__ is not an object of strings");
  }
  SUBCASE("a missing tensor names it and the file") {
    safetensors_file const f = parse(st_file({st_floats("a", {1}, {1.0f})}));
    check_error([&] { (void)f.require("b"); }, errc::bad_file,
                "test.safetensors: missing tensor 'b'");
  }
  SUBCASE("a file that does not exist") {
    check_error([] { safetensors_file f("/nonexistent/x.safetensors"); }, errc::io,
                "/nonexistent/x.safetensors");
  }
}

// The checks of a header cost what parsing it costs: 100,000 names (6.6 MB), as metadata strings
// or as empty tensors, are read in about the time nlohmann/json takes to parse the header alone
// (0.3 s for the metadata in a release build, on a loaded 2-core machine; the check for repeated
// names was quadratic, and took 80 s for 100,000 short names), and a name repeated last is found
// as quickly. Measured against that parse, the bound holds in any build, sanitizers included.
TEST_CASE("safetensors: a header of 100,000 names is read in linear time") {
  constexpr std::size_t n = 100'000;
  std::vector<std::byte> const data8(8);
  for (bool const tensors : {false, true}) {
    CAPTURE(tensors);
    std::string const header = many_names(n, tensors, false);
    auto start = std::chrono::steady_clock::now();
    CHECK(nlohmann::json::parse(header).size() == (tensors ? n + 1 : 2));
    double const parse_alone = seconds_since(start);
    std::vector<std::byte> const bytes = st_raw(header, data8);
    start = std::chrono::steady_clock::now();
    safetensors_file const f = parse(bytes);
    double const read = seconds_since(start);
    CHECK(f.metadata().size() == (tensors ? 0 : n));
    CHECK(f.tensors().size() == (tensors ? n + 1 : 1));
    CHECK(f.find("a") != nullptr);
    CHECK((f.find(long_name(n - 1)) != nullptr) == tensors);
    CHECK(f.find(long_name(n)) == nullptr);
    start = std::chrono::steady_clock::now();
    check_error([&] { (void)parse(st_raw(many_names(n, tensors, true), data8)); }, errc::bad_file,
                "the name '" + long_name(0) + "' appears twice");
    double const repeated = seconds_since(start);
    MESSAGE(bytes.size(), " bytes of ", std::string(tensors ? "tensors" : "metadata"), ": read in ",
            read, " s, the repeated name found in ", repeated, " s; nlohmann/json parses it in ",
            parse_alone, " s");
    CHECK(read < 5.0 * parse_alone + 0.5);
    CHECK(repeated < 5.0 * parse_alone + 0.5);
  }
}
