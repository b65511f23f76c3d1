// A project that uses specdec's CPU backend (specdec::cpu) as an installed package or a
// subdirectory, with -Werror, configured with Eigen hidden from CMake: the backend needs nothing
// beyond the library. A small random model scores a prompt in one batch and token by token; the
// backend is batch-invariant, so the last token's logits must be the same bit for bit.
#include <specdec/backend/cpu/llama.hpp>
#include <specdec/model/random.hpp>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <numeric>
#include <vector>

int main() {
  namespace sd = specdec;
  sd::llama_config const config{.dim = 32,
                                .hidden_dim = 48,
                                .n_layers = 2,
                                .n_heads = 4,
                                .n_kv_heads = 2,
                                .vocab_size = 64,
                                .seq_len = 64};
  auto const weights =
      std::make_shared<sd::llama_weights const>(sd::make_random_llama(config, 3, 0.5f));
  sd::cpu_llama model(weights, {.threads = 1});
  std::vector<sd::token_id> const prompt{1, 7, 9, 7, 9, 12};
  std::vector<sd::position_t> positions(prompt.size());
  std::iota(positions.begin(), positions.end(), 0);

  // The whole prompt in one forward; the last row's logits.
  std::int32_t const last = static_cast<std::int32_t>(prompt.size() - 1);
  sd::forward_request batch{.tokens = prompt, .positions = positions, .logits_rows = {&last, 1}};
  sd::forward_result out;
  model.forward(batch, out);
  std::vector<float> const batched(out.logits.begin(), out.logits.end());

  // The same prompt one token at a time.
  model.reset();
  for (std::size_t i = 0; i < prompt.size(); ++i) {
    sd::forward_request one{.tokens = {&prompt[i], 1}, .positions = {&positions[i], 1}};
    model.forward(one, out);
  }
  if (batched.size() != 64 || out.logits != batched || !std::isfinite(batched[0]) ||
      model.cache().size() != prompt.size()) {
    std::puts("cpu_llama: the batched and the token-by-token logits differ");
    return 1;
  }
  std::printf("ok: %zu positions scored by the CPU backend, batch-invariant\n", prompt.size());
  return 0;
}
