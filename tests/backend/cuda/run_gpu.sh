#!/usr/bin/env bash
# Builds the CUDA targets (Release, this machine's GPU architecture), runs the CUDA tests,
# specdec-generate on the GPU, compute-sanitizer on the kernel and model tests, and the CUDA
# benchmarks, then prints every bar of the GPU path (bars.py). Logs and benchmark JSON go to $OUT
# (default: build/gpu-results), at most 8 files:
#   build.log tests.log sanitize.log bench.log bench_e2e.json bench_sampling.json
#   bench_verify.json bars.txt
#
#   bash tests/backend/cuda/run_gpu.sh [deps] [build] [test] [bench] [sanitize]
#   (default: all five, in that order; about 7 minutes on 16 cores and an H100, each stage capped
#   so that the whole stays under 11 minutes: the sanitizer runs last, as the least urgent)
#
# On a machine without the project's dependencies (doctest, Google Benchmark, nlohmann-json,
# CLI11) and without ../shared, run tests/backend/cuda/prepare_device.sh here first and carry
# .device/ along: the deps stage unpacks .device/debs into .device/deps (dpkg-deb, or ar and tar)
# and uses it as SPECDEC_DEPS_PREFIX, and the fixture copies in .device/shared are used when
# SPECDEC_MODEL_DIR / SPECDEC_DATA_DIR are unset and ../shared is missing.
#
# Environment: SPECDEC_MODEL_DIR, SPECDEC_DATA_DIR (default ../shared/{models,data}, else
# .device/shared/...), SPECDEC_DEPS_PREFIX (an extra CMAKE_PREFIX_PATH for the dependencies),
# CUDA_ARCH (default: detected with nvidia-smi, else 90), JOBS (default: nproc), and the stage caps
# in seconds: BUILD_TIMEOUT (240), TEST_TIMEOUT (120), BENCH_TIMEOUT (100 for bench_e2e_cuda; 40 and
# 30 for the sampling and verification benchmarks), SANITIZE_TIMEOUT (40 per run, three runs).
set -uo pipefail
cd "$(dirname "$0")/../../.."
root="$PWD"
out="${OUT:-$root/build/gpu-results}"
mkdir -p "$out"
build="$root/build/gpu"
stages=("$@")
((${#stages[@]})) || stages=(deps build test bench sanitize)
has() { local s; for s in "${stages[@]}"; do [[ "$s" == "$1" ]] && return 0; done; return 1; }
start=$SECONDS
elapsed() { echo "[$((SECONDS - start)) s]"; }

shared_default() {  # $1 = models | data
  if [[ -d "$root/../shared/$1" ]]; then (cd "$root/../shared/$1" && pwd)
  else echo "$root/.device/shared/$1"; fi
}
export SPECDEC_MODEL_DIR="${SPECDEC_MODEL_DIR:-$(shared_default models)}"
export SPECDEC_DATA_DIR="${SPECDEC_DATA_DIR:-$(shared_default data)}"
jobs="${JOBS:-$(nproc)}"
arch="${CUDA_ARCH:-}"
if [[ -z "$arch" ]]; then
  arch="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d '.')"
  arch="${arch:-90}"
fi
status=0

nvidia-smi -L 2>&1 || true
if has deps && [[ -d "$root/.device/debs" ]]; then
  echo "== deps: unpacking .device/debs $(elapsed)"
  mkdir -p "$root/.device/deps"
  for f in "$root"/.device/debs/*.deb; do
    if command -v dpkg-deb > /dev/null; then
      dpkg-deb -x "$f" "$root/.device/deps"
    else
      tmp="$(mktemp -d)"
      (cd "$tmp" && ar x "$f" && tar -xf data.tar.* -C "$root/.device/deps")
      rm -rf "$tmp"
    fi
  done
  export SPECDEC_DEPS_PREFIX="${SPECDEC_DEPS_PREFIX:-$root/.device/deps/usr}"
fi
if [[ -z "${SPECDEC_DEPS_PREFIX:-}" && -d "$root/.device/deps/usr" ]]; then
  export SPECDEC_DEPS_PREFIX="$root/.device/deps/usr"
fi

bench_targets=(bench_e2e_cuda bench_sampling_cuda bench_verify_cuda)
if has build; then
  echo "== configure + build (sm_$arch) $(elapsed)"
  {
    cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_CUDA_ARCHITECTURES="$arch" -DSPECDEC_ENABLE_CUDA=ON -DSPECDEC_CUDA_RUN_TESTS=ON \
      -DSPECDEC_BUILD_EXAMPLES=OFF -DSPECDEC_BUILD_TOOLS=ON -DSPECDEC_INSTALL=OFF \
      ${SPECDEC_DEPS_PREFIX:+-DCMAKE_PREFIX_PATH="$SPECDEC_DEPS_PREFIX"} \
      -DSPECDEC_MODEL_DIR="$SPECDEC_MODEL_DIR" -DSPECDEC_DATA_DIR="$SPECDEC_DATA_DIR"
  } > "$out/build.log" 2>&1 || { tail -40 "$out/build.log"; exit 1; }
  targets=(specdec_backend_cuda_tests specdec_backend_cuda_host_tests specdec-generate
           "${bench_targets[@]}")
  timeout "${BUILD_TIMEOUT:-240}" cmake --build "$build" -j "$jobs" --target "${targets[@]}" \
    >> "$out/build.log" 2>&1 || { grep -E "error|Error" -A5 "$out/build.log" | head -80; exit 1; }
  echo "built: ${targets[*]} $(elapsed)"
fi

tests="$build/tests/backend/cuda/specdec_backend_cuda_tests"
if has test; then
  echo "== tests $(elapsed)"
  "$build/tests/backend/cuda/specdec_backend_cuda_host_tests" > "$out/tests.log" 2>&1 || status=1
  tail -3 "$out/tests.log"
  timeout "${TEST_TIMEOUT:-120}" "$tests" --duration=true >> "$out/tests.log" 2>&1 || status=1
  grep -E "MESSAGE|: (distribution|softmax|sampling|greedy|speculative|given|tree|truncating|pivot)|tree forward|fused|logits vs f32|device step|ERROR|FATAL|test cases|assertions|Status" \
    "$out/tests.log" | grep -v "^$" | head -120
  echo "== specdec-generate --device cuda (greedy: the MANIFEST's ids) $(elapsed)"
  gen="$build/tools/specdec-generate"
  for args in "--strategy autoregressive" "--strategy prompt-lookup" \
              "--strategy draft --draft $root/tools/draft/stories_draft.bin" \
              "--strategy autoregressive --dtype bf16"; do
    # shellcheck disable=SC2086
    "$gen" --model "$SPECDEC_MODEL_DIR/stories260K.bin" --tokenizer "$SPECDEC_MODEL_DIR/tok512.bin" \
      --prompt "Once upon a time" -n 64 --ignore-eos --device cuda --json $args \
      > "$out/generate.json" 2>> "$out/tests.log" || status=1
    python3 - "$out/generate.json" "$SPECDEC_MODEL_DIR" "$args" >> "$out/tests.log" 2>&1 <<'EOF' || status=1
import json, sys
out = json.load(open(sys.argv[1]))
ref = [int(t) for t in open(sys.argv[2] + "/reference_greedy_once_upon_a_time.ids").read().split()]
same = out["tokens"] == ref[4:4 + 64]
rate = out["stats"].get("tokens_per_second", 0)
print(f"generate --device cuda {sys.argv[3]}: {'MANIFEST ids' if same else 'DIFFERENT ids'}, "
      f"{rate:.0f} tokens/s")
sys.exit(0 if same or "bf16" in sys.argv[3] else 1)
EOF
    tail -1 "$out/tests.log"
  done
  rm -f "$out/generate.json"
fi


if has bench; then
  echo "== benchmarks $(elapsed)"
  cap="${BENCH_TIMEOUT:-100}"
  b="$build/benchmarks"
  : > "$out/bench.log"
  timeout "$cap" "$b/bench_e2e_cuda" --benchmark_counters_tabular=true \
    --benchmark_out="$out/bench_e2e.json" >> "$out/bench.log" 2>&1 || status=1
  timeout 40 "$b/bench_sampling_cuda" --benchmark_counters_tabular=true \
    --benchmark_filter='BM_sample(_radix)?/rows:[0-9]+/vocab:[0-9]+/policy:(1|2)/' \
    --benchmark_out="$out/bench_sampling.json" >> "$out/bench.log" 2>&1 || status=1
  timeout 30 "$b/bench_verify_cuda" --benchmark_counters_tabular=true \
    --benchmark_filter='BM_chain_verify/batch:1/' \
    --benchmark_out="$out/bench_verify.json" >> "$out/bench.log" 2>&1 || status=1
  grep -vE "^\*\*\*|^-+$" "$out/bench.log" | head -120
  echo "== bars $(elapsed)"
  python3 "$root/tests/backend/cuda/bars.py" "$out/bench_e2e.json" "$out/bench_sampling.json" \
    "$out/bench_verify.json" | tee "$out/bars.txt"
fi
if has sanitize; then
  # Each run is capped (SANITIZE_TIMEOUT seconds); a capped run reports what it checked so far.
  cap="${SANITIZE_TIMEOUT:-40}"
  echo "== compute-sanitizer memcheck: pivot and chain kernels, fused forward + graphs, device step, segments $(elapsed)"
  SPECDEC_CUDA_QUICK=1 timeout "$cap" compute-sanitizer --tool memcheck --error-exitcode 9 \
    "$tests" --test-case="*cuda pivot*,*one launch*,*fused kernels and their graphs*,*device results*,*sampled requests on the device-resident step*,*cuda_batched_llama: ragged*" \
    > "$out/sanitize.log" 2>&1 || status=1
  grep -E "ERROR SUMMARY|test cases|Status" "$out/sanitize.log" | tail -3
  echo "== compute-sanitizer memcheck: the other kernel tests, quick sweep $(elapsed)"
  SPECDEC_CUDA_QUICK=1 timeout "$cap" compute-sanitizer --tool memcheck --error-exitcode 9 \
    "$tests" --test-case-exclude="*cuda_llama*,*cuda_batched_llama*,*pivot*,*one launch*" >> "$out/sanitize.log" 2>&1 ||
    status=1
  grep -E "ERROR SUMMARY|test cases|Status" "$out/sanitize.log" | tail -3
  echo "== compute-sanitizer racecheck: pivot kernels, quick sweep $(elapsed)"
  SPECDEC_CUDA_QUICK=1 timeout "$cap" compute-sanitizer --tool racecheck --error-exitcode 9 \
    "$tests" --test-case="*cuda pivot distribution*" >> "$out/sanitize.log" 2>&1 || status=1
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY|test cases|Status" "$out/sanitize.log" | tail -3
fi
echo "done $(elapsed)"
exit $status
