#pragma once
// The Llama shapes the tests build models of (random weights, files written and read back), in
// one place: each is a `llama_config` whose sizes are spelled once, here, with what the tests need
// them for. A test asserts on its shape's sizes (tensor byte counts, row widths), so a shape is
// never edited in place: a test that needs other sizes adds a shape. Fields not named keep
// llama_config's defaults (rope_theta 10000, rms_eps 1e-5, tied classifier).

#include "specdec/model/llama_weights.hpp"

namespace test_support::shapes {

// The smallest model the formats take (width 8, two layers, 2 query heads over 1 key/value head):
// llama2.c file round trips and edits of the written bytes.
inline specdec::llama_config file_tiny(bool shared_classifier) {
  return {.dim = 8,
          .hidden_dim = 12,
          .n_layers = 2,
          .n_heads = 2,
          .n_kv_heads = 1,
          .vocab_size = 16,
          .seq_len = 8,
          .shared_classifier = shared_classifier};
}

// A small model with a rope theta and an RMS epsilon other than the defaults: GGUF round trips
// (GGUF stores both, llama2.c neither).
inline specdec::llama_config file_small(bool shared_classifier) {
  return {.dim = 32,
          .hidden_dim = 64,
          .n_layers = 2,
          .n_heads = 4,
          .n_kv_heads = 2,
          .vocab_size = 64,
          .seq_len = 16,
          .rope_theta = 500000.0f,
          .rms_eps = 1e-6f,
          .shared_classifier = shared_classifier};
}

// make_random_llama's tests: three layers (one fewer keeps the others' tensors), w2 of [32, 48].
inline specdec::llama_config random_init() {
  return {.dim = 32,
          .hidden_dim = 48,
          .n_layers = 3,
          .n_heads = 4,
          .n_kv_heads = 2,
          .vocab_size = 50,
          .seq_len = 8};
}

// stories260K's widths with one layer and a vocabulary of 300, which matches no tokenizer fixture.
inline specdec::llama_config vocab_300() {
  return {.dim = 64,
          .hidden_dim = 172,
          .n_layers = 1,
          .n_heads = 8,
          .n_kv_heads = 4,
          .vocab_size = 300,
          .seq_len = 32};
}

// A small model with a wide KV cache: 64 layers of 64 floats per key and value (32 KiB per
// position), so that 2^24 positions, the largest context the CPU backend accepts, would take
// 512 GiB for the cache alone: a context no test machine can hold.
inline specdec::llama_config wide_cache() {
  return {.dim = 64,
          .hidden_dim = 32,
          .n_layers = 64,
          .n_heads = 8,
          .n_kv_heads = 8,
          .vocab_size = 512,
          .seq_len = 16};
}

// The CPU backend's shape: grouped-query attention (6 heads over 2), odd sizes that leave tile
// remainders, and by default an untied classifier.
inline specdec::llama_config odd_gqa(bool shared_classifier = false) {
  return {.dim = 48,
          .hidden_dim = 70,
          .n_layers = 3,
          .n_heads = 6,
          .n_kv_heads = 2,
          .vocab_size = 75,
          .seq_len = 96,
          .shared_classifier = shared_classifier};
}

// Head size 6 and rows that are not a multiple of any vector width; untied classifier.
inline specdec::llama_config head_size_6() {
  return {.dim = 36,
          .hidden_dim = 50,
          .n_layers = 2,
          .n_heads = 6,
          .n_kv_heads = 2,
          .vocab_size = 41,
          .seq_len = 32,
          .shared_classifier = false};
}

// A prime vocabulary (97) and room for a long window: the lookahead forward against its branches.
inline specdec::llama_config prime_vocab() {
  return {.dim = 64,
          .hidden_dim = 96,
          .n_layers = 2,
          .n_heads = 4,
          .n_kv_heads = 2,
          .vocab_size = 97,
          .seq_len = 128};
}

// The stories260K fixture's vocabulary and context with one tiny layer: a random draft for it.
inline specdec::llama_config fixture_draft() {
  return {.dim = 16,
          .hidden_dim = 32,
          .n_layers = 1,
          .n_heads = 2,
          .n_kv_heads = 1,
          .vocab_size = 512,
          .seq_len = 512};
}

// The CUDA model against the CPU backend: grouped-query attention (6 heads over 2), head size 16,
// a vocabulary of 111, a rope theta other than the default and an untied classifier.
inline specdec::llama_config cuda_gqa() {
  return {.dim = 96,
          .hidden_dim = 200,
          .n_layers = 3,
          .n_heads = 6,
          .n_kv_heads = 2,
          .vocab_size = 111,
          .seq_len = 128,
          .rope_theta = 500000.0f,
          .shared_classifier = false};
}

}  // namespace test_support::shapes
