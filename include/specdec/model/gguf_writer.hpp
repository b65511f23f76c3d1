#pragma once
//! \file
//! `write_gguf`: writes a Llama model (and optionally its vocabulary) as a GGUF v3 file of
//! architecture "llama", in the tensor naming and layout llama.cpp uses, with matrices in F32,
//! F16 or BF16 (norm vectors always F32).

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "specdec/core/error.hpp"
#include "specdec/model/binary_io.hpp"
#include "specdec/model/gguf.hpp"
#include "specdec/model/half.hpp"
#include "specdec/model/llama2c.hpp"
#include "specdec/model/llama_weights.hpp"
#include "specdec/model/tokenizer.hpp"

namespace specdec {

namespace detail {

inline void gguf_write_string(binary_writer& out, std::string_view s) {
  out.write(static_cast<std::uint64_t>(s.size()));
  out.write_bytes(s.data(), s.size());
}

//! A space becomes SentencePiece's U+2581 ("▁").
inline std::string to_sentencepiece(std::string_view piece) {
  std::string out;
  out.reserve(piece.size());
  for (char ch : piece) {
    if (ch == ' ') {
      out += "\xe2\x96\x81";
    } else {
      out += ch;
    }
  }
  return out;
}

}  // namespace detail

//! Writes `w` to `path` as GGUF v3 (alignment 32): llama.* hyper-parameters, the vocabulary of
//! `vocab` when it is not null (tokenizer.ggml.model "llama", tokens with spaces as "▁", scores,
//! token types, BOS/EOS/unknown ids), and the tensors token_embd, output_norm, output (only when
//! the classifier is not shared) and blk.N.*, matrices stored as `type` (f32, f16 or bf16; F16
//! and BF16 round to nearest even). Throws `errc::invalid_argument` for another type, incomplete
//! weights or a vocabulary whose size differs from the model's, and `errc::io` on write failure.
inline void write_gguf(std::filesystem::path const& path, llama_weights const& w,
                       tokenizer const* vocab, gguf_type type = gguf_type::f32) {
  detail::check_complete(w, "write_gguf");
  SPECDEC_CHECK(type == gguf_type::f32 || type == gguf_type::f16 || type == gguf_type::bf16,
                invalid_argument, "write_gguf: tensor type ", traits(type).name,
                " is not supported (F32, F16 and BF16 are)");
  llama_config const& c = w.config;
  SPECDEC_CHECK(vocab == nullptr || vocab->vocab_size() == c.vocab_size, invalid_argument,
                "write_gguf: the vocabulary has ", vocab ? vocab->vocab_size() : 0,
                " tokens but the model ", c.vocab_size);
  constexpr std::uint64_t alignment = gguf_default_alignment;
  detail::binary_writer out(path);
  using detail::gguf_write_string;

  // Metadata, as (key, writer of type + value) pairs.
  std::vector<std::pair<std::string, std::function<void()>>> kvs;
  auto const u32 = [&](std::string key, std::uint32_t v) {
    kvs.emplace_back(std::move(key), [&out, v] {
      out.write(gguf_value_type::uint32);
      out.write(v);
    });
  };
  auto const f32 = [&](std::string key, float v) {
    kvs.emplace_back(std::move(key), [&out, v] {
      out.write(gguf_value_type::float32);
      out.write(v);
    });
  };
  auto const str = [&](std::string key, std::string v) {
    kvs.emplace_back(std::move(key), [&out, v = std::move(v)] {
      out.write(gguf_value_type::string);
      gguf_write_string(out, v);
    });
  };
  auto const u = [](std::int32_t v) { return static_cast<std::uint32_t>(v); };
  str("general.architecture", "llama");
  str("general.name", "specdec");
  u32("general.alignment", static_cast<std::uint32_t>(alignment));
  u32("general.file_type", type == gguf_type::f32 ? 0u : type == gguf_type::f16 ? 1u : 32u);
  u32("llama.context_length", u(c.seq_len));
  u32("llama.embedding_length", u(c.dim));
  u32("llama.block_count", u(c.n_layers));
  u32("llama.feed_forward_length", u(c.hidden_dim));
  u32("llama.rope.dimension_count", u(c.head_size()));
  u32("llama.attention.head_count", u(c.n_heads));
  u32("llama.attention.head_count_kv", u(c.n_kv_heads));
  f32("llama.rope.freq_base", c.rope_theta);
  f32("llama.attention.layer_norm_rms_epsilon", c.rms_eps);
  if (vocab != nullptr) {
    str("tokenizer.ggml.model", "llama");
    kvs.emplace_back("tokenizer.ggml.tokens", [&out, vocab] {
      out.write(gguf_value_type::array);
      out.write(gguf_value_type::string);
      out.write(static_cast<std::uint64_t>(vocab->vocab_size()));
      for (token_id i = 0; i < vocab->vocab_size(); ++i) {
        gguf_write_string(out, detail::to_sentencepiece(vocab->piece(i)));
      }
    });
    kvs.emplace_back("tokenizer.ggml.scores", [&out, vocab] {
      out.write(gguf_value_type::array);
      out.write(gguf_value_type::float32);
      out.write(static_cast<std::uint64_t>(vocab->vocab_size()));
      for (token_id i = 0; i < vocab->vocab_size(); ++i) out.write(vocab->score(i));
    });
    kvs.emplace_back("tokenizer.ggml.token_type", [&out, vocab] {
      out.write(gguf_value_type::array);
      out.write(gguf_value_type::int32);
      out.write(static_cast<std::uint64_t>(vocab->vocab_size()));
      for (token_id i = 0; i < vocab->vocab_size(); ++i) {
        out.write(static_cast<std::int32_t>(vocab->type(i)));
      }
    });
    auto const special = [&](char const* key, token_id id) {
      u32(key, id == no_token ? 0xffffffffu : static_cast<std::uint32_t>(id));
    };
    special("tokenizer.ggml.bos_token_id", vocab->bos());
    special("tokenizer.ggml.eos_token_id", vocab->eos());
    special("tokenizer.ggml.unknown_token_id", vocab->unk());
    kvs.emplace_back("tokenizer.ggml.add_space_prefix", [&out, vocab] {
      out.write(gguf_value_type::boolean);
      out.write(std::uint8_t{vocab->add_space_prefix() ? std::uint8_t{1} : std::uint8_t{0}});
    });
  }

  // Tensors, in llama.cpp's order, each padded to the alignment.
  struct tensor {
    std::string name;
    float const* data;
    std::uint64_t cols, rows;  // ne[0], ne[1]
    gguf_type type;
    std::uint64_t offset = 0;
  };
  auto const d = static_cast<std::uint64_t>(c.dim), h = static_cast<std::uint64_t>(c.hidden_dim),
             kv = static_cast<std::uint64_t>(c.kv_dim()),
             v = static_cast<std::uint64_t>(c.vocab_size);
  std::vector<tensor> tensors;
  tensors.push_back({"token_embd.weight", w.token_embedding, d, v, type});
  tensors.push_back({"output_norm.weight", w.rms_final, d, 1, gguf_type::f32});
  if (!c.shared_classifier) tensors.push_back({"output.weight", w.classifier, d, v, type});
  for (std::size_t l = 0; l < w.layers.size(); ++l) {
    auto const& layer = w.layers[l];
    std::string const p = "blk." + std::to_string(l) + ".";
    tensors.push_back({p + "attn_norm.weight", layer.rms_att, d, 1, gguf_type::f32});
    tensors.push_back({p + "attn_q.weight", layer.wq, d, d, type});
    tensors.push_back({p + "attn_k.weight", layer.wk, d, kv, type});
    tensors.push_back({p + "attn_v.weight", layer.wv, d, kv, type});
    tensors.push_back({p + "attn_output.weight", layer.wo, d, d, type});
    tensors.push_back({p + "ffn_norm.weight", layer.rms_ffn, d, 1, gguf_type::f32});
    tensors.push_back({p + "ffn_gate.weight", layer.w1, d, h, type});
    tensors.push_back({p + "ffn_down.weight", layer.w2, h, d, type});
    tensors.push_back({p + "ffn_up.weight", layer.w3, d, h, type});
  }
  auto const padded = [&](std::uint64_t n) { return (n + alignment - 1) / alignment * alignment; };
  std::uint64_t offset = 0;
  for (auto& t : tensors) {
    t.offset = offset;
    offset = padded(offset + t.cols * t.rows * traits(t.type).block_bytes);
  }

  out.write(gguf_magic);
  out.write(std::uint32_t{3});
  out.write(static_cast<std::uint64_t>(tensors.size()));
  out.write(static_cast<std::uint64_t>(kvs.size()));
  for (auto const& [key, write_value] : kvs) {
    gguf_write_string(out, key);
    write_value();
  }
  for (auto const& t : tensors) {
    gguf_write_string(out, t.name);
    std::uint32_t const n_dims = t.rows == 1 ? 1u : 2u;
    out.write(n_dims);
    out.write(t.cols);
    if (n_dims == 2) out.write(t.rows);
    out.write(t.type);
    out.write(t.offset);
  }
  out.write_zeros(static_cast<std::size_t>(padded(out.written()) - out.written()));
  std::uint64_t const data_start = out.written();
  std::vector<std::uint16_t> buffer;
  for (auto const& t : tensors) {
    out.write_zeros(static_cast<std::size_t>(data_start + t.offset - out.written()));
    auto const n = static_cast<std::size_t>(t.cols * t.rows);
    if (t.type == gguf_type::f32) {
      out.write_bytes(t.data, n * sizeof(float));
      continue;
    }
    constexpr std::size_t chunk = 1 << 16;
    buffer.resize(chunk);
    for (std::size_t begin = 0; begin < n; begin += chunk) {
      std::size_t const count = std::min(chunk, n - begin);
      for (std::size_t i = 0; i < count; ++i) {
        float const x = t.data[begin + i];
        buffer[i] = t.type == gguf_type::f16 ? float_to_half(x) : float_to_bf16(x);
      }
      out.write_bytes(buffer.data(), count * sizeof(std::uint16_t));
    }
  }
  out.write_zeros(static_cast<std::size_t>(data_start + offset - out.written()));
  out.close();
}

}  // namespace specdec
