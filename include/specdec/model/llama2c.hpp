#pragma once
//! \file
//! llama2.c checkpoints: the legacy header-less-magic format (version 0) and the versioned exports
//! of llama2.c's export.py ("ak42" magic, version 1 = float32, version 2 = int8 Q8_0 groups).
//!
//! Legacy (v0): 7 little-endian int32 (dim, hidden_dim, n_layers, n_heads, n_kv_heads,
//! vocab_size, seq_len; vocab_size < 0 means an unshared classifier), then float32 tensors
//! token_embedding [vocab, dim], rms_att [L, dim], wq [L, dim, dim], wk [L, kv_dim, dim],
//! wv [L, kv_dim, dim], wo [L, dim, dim], rms_ffn [L, dim], w1 [L, hidden, dim],
//! w2 [L, dim, hidden], w3 [L, hidden, dim], rms_final [dim], the RoPE tables freq_cis_real and
//! freq_cis_imag [seq_len, head_size / 2] (ignored), and the classifier [vocab, dim] if unshared.
//!
//! Version 1: a 256-byte header (uint32 magic 0x616b3432, int32 version, the same 7 int32 with a
//! positive vocab_size, uint8 shared_classifier, zero padding), then float32 rms_att [L, dim],
//! rms_ffn [L, dim], rms_final [dim], token_embedding, wq, wk, wv, wo, w1, w2, w3 (each [L, ...]),
//! and the classifier if unshared. No RoPE tables.
//!
//! Version 2: the version-1 header plus int32 group_size right after the flag (byte 37); float32
//! rms_att, rms_ffn, rms_final; then for each of token_embedding, wq[0..L), wk[0..L), wv[0..L),
//! wo[0..L), w1[0..L), w2[0..L), w3[0..L) and the classifier (if unshared): int8 values [numel]
//! followed by float32 scales [numel / group_size] (value = q * scale of its group), as llama2.c's
//! runq.c reads them. The loader dequantises them to float32.
//!
//! Neither format stores RoPE theta or the RMSNorm epsilon: the loader uses 10000 and 1e-5.

#include <climits>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "specdec/core/error.hpp"
#include "specdec/model/binary_io.hpp"
#include "specdec/model/llama_weights.hpp"
#include "specdec/model/mapped_file.hpp"
#include "specdec/model/weight_storage.hpp"

namespace specdec {

//! The magic of versioned llama2.c checkpoints: "ak42" read as a little-endian uint32.
inline constexpr std::uint32_t llama2c_magic = 0x616b3432u;

//! Size of the versioned llama2.c header in bytes.
inline constexpr std::size_t llama2c_header_bytes = 256;

//! The llama2.c checkpoint layouts `write_llama2c` can produce.
enum class llama2c_format {
  legacy,   //!< version 0: 7-int32 header, RoPE tables, negative vocab_size when unshared
  v1,       //!< "ak42" version 1: 256-byte header, float32
  v2_q8_0,  //!< "ak42" version 2: 256-byte header, int8 groups with float32 scales (lossy)
};

namespace detail {

//! Element counts of a Llama model's tensors, computed overflow-checked from a validated config.
struct llama_counts {
  std::uint64_t d, h, l, kv, v, s, hs;
  std::uint64_t emb, attn_sq, attn_kv, ffn;  // per-tensor element counts (one layer)

  llama_counts(llama_config const& c, std::string_view where)
      : d(static_cast<std::uint64_t>(c.dim)),
        h(static_cast<std::uint64_t>(c.hidden_dim)),
        l(static_cast<std::uint64_t>(c.n_layers)),
        kv(static_cast<std::uint64_t>(c.kv_dim())),
        v(static_cast<std::uint64_t>(c.vocab_size)),
        s(static_cast<std::uint64_t>(c.seq_len)),
        hs(static_cast<std::uint64_t>(c.head_size())),
        emb(checked_mul(v, d, where, "token embedding size")),
        attn_sq(checked_mul(d, d, where, "attention matrix size")),
        attn_kv(checked_mul(kv, d, where, "key/value matrix size")),
        ffn(checked_mul(h, d, where, "feed-forward matrix size")) {}

  //! Elements of all per-layer matrices of one layer.
  [[nodiscard]] std::uint64_t layer_matrices(std::string_view where) const {
    std::uint64_t n = checked_mul(attn_sq, 2, where, "layer size");
    n = checked_add(n, checked_mul(attn_kv, 2, where, "layer size"), where, "layer size");
    return checked_add(n, checked_mul(ffn, 3, where, "layer size"), where, "layer size");
  }
};

//! Reads `count` float32 values in place from `r` (which must sit at a 4-byte aligned offset of a
//! page-aligned map) and returns a pointer to them.
[[nodiscard]] inline float const* take_floats(byte_reader& r, std::uint64_t count,
                                              std::string_view what) {
  auto const bytes = r.take(checked_mul(count, sizeof(float), r.where(), what), what);
  SPECDEC_ASSERT(reinterpret_cast<std::uintptr_t>(bytes.data()) % alignof(float) == 0);
  return reinterpret_cast<float const*>(bytes.data());
}

//! Reads the 7 int32 hyper-parameters of a llama2.c header.
inline llama_config read_llama2c_params(byte_reader& r) {
  llama_config c;
  c.dim = r.read<std::int32_t>("dim");
  c.hidden_dim = r.read<std::int32_t>("hidden_dim");
  c.n_layers = r.read<std::int32_t>("n_layers");
  c.n_heads = r.read<std::int32_t>("n_heads");
  c.n_kv_heads = r.read<std::int32_t>("n_kv_heads");
  c.vocab_size = r.read<std::int32_t>("vocab_size");
  c.seq_len = r.read<std::int32_t>("seq_len");
  return c;
}

inline void check_llama2c_size(std::string const& where, char const* format, std::uint64_t expected,
                               std::uint64_t actual, llama_config const& c) {
  SPECDEC_CHECK(expected == actual, bad_file, where, ": the ", format, " header (dim ", c.dim,
                ", hidden_dim ", c.hidden_dim, ", n_layers ", c.n_layers, ", n_heads ", c.n_heads,
                ", n_kv_heads ", c.n_kv_heads, ", vocab_size ", c.vocab_size, ", seq_len ",
                c.seq_len, ", ", c.shared_classifier ? "shared" : "unshared",
                " classifier) implies ", expected, " bytes but the file has ", actual, " bytes");
}

inline llama_weights load_llama2c_legacy(std::shared_ptr<mapped_file const> const& map,
                                         byte_reader& r) {
  std::string const& where = r.where();
  llama_config c = read_llama2c_params(r);
  SPECDEC_CHECK(c.vocab_size != INT_MIN, bad_file, where, ": vocab_size ", c.vocab_size,
                " is absurd");
  c.shared_classifier = c.vocab_size > 0;
  if (c.vocab_size < 0) c.vocab_size = -c.vocab_size;
  c.validate(where.c_str());
  llama_counts const n(c, where);

  // Expected size: header + every tensor + the two RoPE tables (+ the classifier).
  std::uint64_t floats = n.emb;
  floats = checked_add(floats, checked_mul(n.l, n.layer_matrices(where), where, "layers"), where,
                       "model size");
  floats = checked_add(floats, checked_mul(n.l, 2 * n.d, where, "norms"), where, "model size");
  floats = checked_add(floats, n.d, where, "model size");
  floats = checked_add(floats, checked_mul(n.s, n.hs, where, "RoPE tables"), where, "model size");
  if (!c.shared_classifier) floats = checked_add(floats, n.emb, where, "model size");
  std::uint64_t const expected =
      checked_add(28, checked_mul(floats, 4, where, "model size"), where, "model size");
  check_llama2c_size(where, "legacy llama2.c", expected, map->size(), c);

  llama_weights w;
  w.config = c;
  w.layers.resize(n.l);
  w.token_embedding = take_floats(r, n.emb, "token_embedding");
  auto const per_layer = [&](std::uint64_t count, float const* llama_layer_weights::*member,
                             char const* what) {
    float const* base = take_floats(r, checked_mul(n.l, count, where, what), what);
    for (std::size_t i = 0; i < w.layers.size(); ++i) w.layers[i].*member = base + i * count;
  };
  per_layer(n.d, &llama_layer_weights::rms_att, "rms_att");
  per_layer(n.attn_sq, &llama_layer_weights::wq, "wq");
  per_layer(n.attn_kv, &llama_layer_weights::wk, "wk");
  per_layer(n.attn_kv, &llama_layer_weights::wv, "wv");
  per_layer(n.attn_sq, &llama_layer_weights::wo, "wo");
  per_layer(n.d, &llama_layer_weights::rms_ffn, "rms_ffn");
  per_layer(n.ffn, &llama_layer_weights::w1, "w1");
  per_layer(n.ffn, &llama_layer_weights::w2, "w2");
  per_layer(n.ffn, &llama_layer_weights::w3, "w3");
  w.rms_final = take_floats(r, n.d, "rms_final");
  // Two tables of [seq_len, head_size / 2] floats.
  r.skip(checked_mul(checked_mul(n.s, n.hs, where, "RoPE tables"), 4, where, "RoPE tables"),
         "RoPE tables");
  w.classifier = c.shared_classifier ? w.token_embedding : take_floats(r, n.emb, "classifier");
  SPECDEC_ASSERT(r.remaining() == 0);
  w.storage = map;
  return w;
}

inline llama_weights load_llama2c_versioned(std::shared_ptr<mapped_file const> const& map,
                                            byte_reader& r) {
  std::string const& where = r.where();
  SPECDEC_CHECK(map->size() >= llama2c_header_bytes, bad_file, where, ": truncated: ", map->size(),
                " bytes is shorter than the ", llama2c_header_bytes, "-byte llama2.c header");
  auto const version = r.read<std::int32_t>("version");
  SPECDEC_CHECK(version == 1 || version == 2, unsupported, where, ": llama2.c checkpoint version ",
                version, " is not supported (1 = float32 and 2 = Q8_0 are)");
  llama_config c = read_llama2c_params(r);
  auto const flag = r.read<std::uint8_t>("shared_classifier");
  SPECDEC_CHECK(flag <= 1, bad_file, where, ": shared_classifier flag is ", int{flag},
                ", must be 0 or 1");
  c.shared_classifier = flag == 1;
  std::int32_t group_size = 0;
  if (version == 2) group_size = r.read<std::int32_t>("group_size");
  c.validate(where.c_str());
  llama_counts const n(c, where);
  r.seek(llama2c_header_bytes, "tensor data");

  std::uint64_t const norm_floats =
      checked_add(checked_mul(n.l, 2 * n.d, where, "norms"), n.d, where, "norms");
  if (version == 1) {
    std::uint64_t floats = checked_add(norm_floats, n.emb, where, "model size");
    floats = checked_add(floats, checked_mul(n.l, n.layer_matrices(where), where, "layers"), where,
                         "model size");
    if (!c.shared_classifier) floats = checked_add(floats, n.emb, where, "model size");
    std::uint64_t const expected = checked_add(
        llama2c_header_bytes, checked_mul(floats, 4, where, "model size"), where, "model size");
    check_llama2c_size(where, "llama2.c version 1", expected, map->size(), c);
  } else {
    SPECDEC_CHECK(group_size > 0, bad_file, where, ": Q8_0 group size ", group_size,
                  " must be positive");
    auto const gs = static_cast<std::uint64_t>(group_size);
    for (std::uint64_t count : {n.emb, n.attn_sq, n.attn_kv, n.ffn}) {
      SPECDEC_CHECK(count % gs == 0, bad_file, where, ": Q8_0 group size ", group_size,
                    " does not divide a tensor of ", count, " elements");
    }
    // int8 values + float32 scales for each quantised tensor.
    auto const qbytes = [&](std::uint64_t count) { return count + count / gs * 4; };
    std::uint64_t bytes = checked_add(llama2c_header_bytes,
                                      checked_mul(norm_floats, 4, where, "norms"), where, "size");
    bytes = checked_add(bytes, qbytes(n.emb), where, "model size");
    std::uint64_t const layer_q =
        checked_add(checked_add(qbytes(n.attn_sq) * 2, qbytes(n.attn_kv) * 2, where, "layer size"),
                    qbytes(n.ffn) * 3, where, "layer size");
    bytes = checked_add(bytes, checked_mul(n.l, layer_q, where, "layers"), where, "model size");
    if (!c.shared_classifier) bytes = checked_add(bytes, qbytes(n.emb), where, "model size");
    check_llama2c_size(where, "llama2.c version 2 (Q8_0)", bytes, map->size(), c);
  }

  llama_weights w;
  w.config = c;
  w.layers.resize(n.l);
  float const* const rms_att = take_floats(r, checked_mul(n.l, n.d, where, "rms_att"), "rms_att");
  float const* const rms_ffn = take_floats(r, checked_mul(n.l, n.d, where, "rms_ffn"), "rms_ffn");
  for (std::size_t i = 0; i < w.layers.size(); ++i) {
    w.layers[i].rms_att = rms_att + i * n.d;
    w.layers[i].rms_ffn = rms_ffn + i * n.d;
  }
  w.rms_final = take_floats(r, n.d, "rms_final");

  using member = float const* llama_layer_weights::*;
  struct group {
    member m;
    std::uint64_t count;
    char const* what;
  };
  group const groups[] = {
      {&llama_layer_weights::wq, n.attn_sq, "wq"}, {&llama_layer_weights::wk, n.attn_kv, "wk"},
      {&llama_layer_weights::wv, n.attn_kv, "wv"}, {&llama_layer_weights::wo, n.attn_sq, "wo"},
      {&llama_layer_weights::w1, n.ffn, "w1"},     {&llama_layer_weights::w2, n.ffn, "w2"},
      {&llama_layer_weights::w3, n.ffn, "w3"}};

  if (version == 1) {
    w.token_embedding = take_floats(r, n.emb, "token_embedding");
    for (auto const& g : groups) {
      float const* base = take_floats(r, checked_mul(n.l, g.count, where, g.what), g.what);
      for (std::size_t i = 0; i < w.layers.size(); ++i) w.layers[i].*g.m = base + i * g.count;
    }
    w.classifier = c.shared_classifier ? w.token_embedding : take_floats(r, n.emb, "classifier");
    SPECDEC_ASSERT(r.remaining() == 0);
    w.storage = map;
    return w;
  }

  // Version 2: dequantise every matrix into owned storage (sizes were checked against the file,
  // so the buffer is at most 4x the file).
  auto storage = std::make_shared<detail::weight_storage>();
  storage->map = map;
  std::uint64_t total = n.emb + n.l * (2 * n.attn_sq + 2 * n.attn_kv + 3 * n.ffn);
  if (!c.shared_classifier) total += n.emb;
  float* out = storage->allocate(static_cast<std::size_t>(total));
  auto const gs = static_cast<std::size_t>(group_size);
  auto const dequantise = [&](std::uint64_t count, char const* what) -> float const* {
    auto const q = r.take(count, what);
    auto const scales = r.take(count / gs * 4, what);
    float* const dst = out;
    for (std::size_t g = 0; g < count / gs; ++g) {
      float scale;
      std::memcpy(&scale, scales.data() + g * 4, 4);
      for (std::size_t j = g * gs; j < (g + 1) * gs; ++j) {
        dst[j] = static_cast<float>(static_cast<std::int8_t>(q[j])) * scale;
      }
    }
    out += count;
    return dst;
  };
  w.token_embedding = dequantise(n.emb, "token_embedding");
  for (auto const& g : groups) {
    for (auto& layer : w.layers) layer.*g.m = dequantise(g.count, g.what);
  }
  w.classifier = c.shared_classifier ? w.token_embedding : dequantise(n.emb, "classifier");
  SPECDEC_ASSERT(r.remaining() == 0);
  SPECDEC_ASSERT(out == storage->owned.get() + storage->owned_size);
  w.storage = std::move(storage);
  return w;
}

//! Checks every tensor of the weights a llama2.c reader produced for non-finite values
//! (`check_finite`), naming it as llama2.c does ("wq" of a layer: "layers[3].wq").
inline void check_llama2c_finite(llama_weights const& w, std::string const& where) {
  llama_counts const n(w.config, where);
  check_finite(w.token_embedding, n.emb, where, "token_embedding");
  using member = float const* llama_layer_weights::*;
  struct tensor {
    member m;
    std::uint64_t count;
    char const* name;
  };
  tensor const tensors[] = {{&llama_layer_weights::rms_att, n.d, "rms_att"},
                            {&llama_layer_weights::wq, n.attn_sq, "wq"},
                            {&llama_layer_weights::wk, n.attn_kv, "wk"},
                            {&llama_layer_weights::wv, n.attn_kv, "wv"},
                            {&llama_layer_weights::wo, n.attn_sq, "wo"},
                            {&llama_layer_weights::rms_ffn, n.d, "rms_ffn"},
                            {&llama_layer_weights::w1, n.ffn, "w1"},
                            {&llama_layer_weights::w2, n.ffn, "w2"},
                            {&llama_layer_weights::w3, n.ffn, "w3"}};
  for (std::size_t l = 0; l < w.layers.size(); ++l)
    for (tensor const& t : tensors)
      check_finite(w.layers[l].*t.m, t.count, where, "layers[" + std::to_string(l) + "]." + t.name);
  check_finite(w.rms_final, n.d, where, "rms_final");
  if (!w.config.shared_classifier) check_finite(w.classifier, n.emb, where, "classifier");
}

}  // namespace detail

//! Loads a llama2.c checkpoint (legacy, version 1 or version 2) by memory-mapping it (or reading
//! it into memory: `file_access::read`, see mapped_file.hpp). Float32 tensors point into the
//! file's bytes; version-2 tensors are dequantised into owned storage. Every size is checked
//! against the file before any tensor is touched, and every weight is checked to be finite: throws
//! `errc::io` when the file cannot be read, `errc::bad_file` (naming the file and the numbers, or
//! the tensor) when it is truncated, longer than its header implies, has absurd dimensions or a
//! NaN or infinite weight, and `errc::unsupported` for unknown versions.
[[nodiscard]] inline llama_weights load_llama2c(std::filesystem::path const& path,
                                                file_access access = file_access::map) {
  auto map = mapped_file::open(path, access);
  detail::byte_reader r(map->bytes(), path.string());
  SPECDEC_CHECK(map->size() >= 28, bad_file, path.string(), ": truncated: ", map->size(),
                " bytes is shorter than a llama2.c header (28 bytes)");
  llama_weights w;
  if (r.read<std::uint32_t>("magic") == llama2c_magic) {
    w = detail::load_llama2c_versioned(map, r);
  } else {
    r.seek(0, "header");
    w = detail::load_llama2c_legacy(map, r);
  }
  detail::check_llama2c_finite(w, path.string());
  return w;
}

//! Writes `w` as a llama2.c checkpoint in `format` (legacy by default; the legacy RoPE tables are
//! computed from `rope_theta`). Version 2 quantises each group of `group_size` values (halved until
//! it divides dim, as export.py does) to int8 with a float32 scale. RoPE theta and the RMSNorm
//! epsilon are not stored by any of these formats. Throws `errc::invalid_argument` for incomplete
//! weights and `errc::io` when the file cannot be written.
inline void write_llama2c(std::filesystem::path const& path, llama_weights const& w,
                          llama2c_format format = llama2c_format::legacy,
                          std::int32_t group_size = 64) {
  detail::check_complete(w, "write_llama2c");
  llama_config const& c = w.config;
  detail::llama_counts const n(c, "write_llama2c");
  detail::binary_writer out(path);
  auto const floats = [&](float const* p, std::uint64_t count) {
    out.write_bytes(p, static_cast<std::size_t>(count) * sizeof(float));
  };
  auto const params = [&](std::int32_t vocab) {
    for (std::int32_t v :
         {c.dim, c.hidden_dim, c.n_layers, c.n_heads, c.n_kv_heads, vocab, c.seq_len}) {
      out.write(v);
    }
  };
  using member = float const* llama_layer_weights::*;
  auto const each_layer = [&](member m, std::uint64_t count) {
    for (auto const& layer : w.layers) floats(layer.*m, count);
  };

  if (format == llama2c_format::legacy) {
    params(c.shared_classifier ? c.vocab_size : -c.vocab_size);
    floats(w.token_embedding, n.emb);
    each_layer(&llama_layer_weights::rms_att, n.d);
    each_layer(&llama_layer_weights::wq, n.attn_sq);
    each_layer(&llama_layer_weights::wk, n.attn_kv);
    each_layer(&llama_layer_weights::wv, n.attn_kv);
    each_layer(&llama_layer_weights::wo, n.attn_sq);
    each_layer(&llama_layer_weights::rms_ffn, n.d);
    each_layer(&llama_layer_weights::w1, n.ffn);
    each_layer(&llama_layer_weights::w2, n.ffn);
    each_layer(&llama_layer_weights::w3, n.ffn);
    floats(w.rms_final, n.d);
    // freq_cis_real then freq_cis_imag, [seq_len, head_size / 2] each.
    std::vector<float> row(static_cast<std::size_t>(n.hs / 2));
    for (int part = 0; part < 2; ++part) {
      for (std::uint64_t t = 0; t < n.s; ++t) {
        for (std::size_t i = 0; i < row.size(); ++i) {
          double const freq =
              1.0 / std::pow(static_cast<double>(c.rope_theta),
                             static_cast<double>(2 * i) / static_cast<double>(n.hs));
          double const angle = static_cast<double>(t) * freq;
          row[i] = static_cast<float>(part == 0 ? std::cos(angle) : std::sin(angle));
        }
        floats(row.data(), row.size());
      }
    }
    if (!c.shared_classifier) floats(w.classifier, n.emb);
    out.close();
    return;
  }

  out.write(llama2c_magic);
  out.write(std::int32_t{format == llama2c_format::v1 ? 1 : 2});
  params(c.vocab_size);
  out.write(std::uint8_t{c.shared_classifier ? std::uint8_t{1} : std::uint8_t{0}});
  if (format == llama2c_format::v2_q8_0) {
    SPECDEC_CHECK(group_size > 0, invalid_argument, "write_llama2c: group size ", group_size,
                  " must be positive");
    while (c.dim % group_size != 0) group_size /= 2;
    out.write(group_size);
  }
  out.write_zeros(llama2c_header_bytes - static_cast<std::size_t>(out.written()));
  each_layer(&llama_layer_weights::rms_att, n.d);
  each_layer(&llama_layer_weights::rms_ffn, n.d);
  floats(w.rms_final, n.d);

  auto const gs = static_cast<std::size_t>(group_size);
  std::vector<std::int8_t> q;
  std::vector<float> scales;
  auto const matrix = [&](float const* p, std::uint64_t count) {
    if (format == llama2c_format::v1) {
      floats(p, count);
      return;
    }
    auto const size = static_cast<std::size_t>(count);
    q.resize(size);
    scales.resize(size / gs);
    for (std::size_t g = 0; g < size / gs; ++g) {
      float wmax = 0.0f;
      for (std::size_t j = g * gs; j < (g + 1) * gs; ++j) wmax = std::fmax(wmax, std::fabs(p[j]));
      float const scale = wmax / 127.0f;
      scales[g] = scale;
      for (std::size_t j = g * gs; j < (g + 1) * gs; ++j) {
        float v = scale > 0.0f ? std::nearbyint(p[j] / scale) : 0.0f;
        v = std::fmin(127.0f, std::fmax(-127.0f, v));
        q[j] = static_cast<std::int8_t>(v);
      }
    }
    out.write_bytes(q.data(), q.size());
    floats(scales.data(), scales.size());
  };
  matrix(w.token_embedding, n.emb);
  for (member m : {&llama_layer_weights::wq, &llama_layer_weights::wk, &llama_layer_weights::wv,
                   &llama_layer_weights::wo, &llama_layer_weights::w1, &llama_layer_weights::w2,
                   &llama_layer_weights::w3}) {
    std::uint64_t const count =
        m == &llama_layer_weights::wq || m == &llama_layer_weights::wo   ? n.attn_sq
        : m == &llama_layer_weights::wk || m == &llama_layer_weights::wv ? n.attn_kv
                                                                         : n.ffn;
    for (auto const& layer : w.layers) matrix(layer.*m, count);
  }
  if (!c.shared_classifier) matrix(w.classifier, n.emb);
  out.close();
}

}  // namespace specdec
