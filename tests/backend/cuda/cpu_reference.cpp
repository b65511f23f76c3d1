#include "backend/cuda/cpu_reference.hpp"

#include <numeric>
#include <vector>

#include "specdec/backend/cpu/llama.hpp"
#include "specdec/model/load.hpp"
#include "specdec/model/random.hpp"

namespace cuda_test {

std::shared_ptr<specdec::llama_weights const> load_weights(std::filesystem::path const& path) {
  return std::make_shared<specdec::llama_weights const>(specdec::load_model(path));
}

std::shared_ptr<specdec::llama_weights const> random_weights(specdec::llama_config const& config,
                                                             std::uint64_t seed, float stddev) {
  return std::make_shared<specdec::llama_weights const>(
      specdec::make_random_llama(config, seed, stddev));
}

specdec::forward_result cpu_forward(std::shared_ptr<specdec::llama_weights const> const& weights,
                                    std::span<specdec::token_id const> prefix,
                                    specdec::forward_request const& req) {
  specdec::forward_result out;
  specdec::cpu_llama m(weights, {.threads = 2});
  if (!prefix.empty()) {
    std::vector<specdec::position_t> pos(prefix.size());
    std::iota(pos.begin(), pos.end(), 0);
    specdec::forward_request pre;
    pre.tokens = prefix;
    pre.positions = pos;
    m.forward(pre, out);
  }
  m.forward(req, out);
  return out;
}

}  // namespace cuda_test
