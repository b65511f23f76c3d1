#!/usr/bin/env bash
# Builds the CUDA targets (Release, this machine's GPU architecture), runs the CUDA tests, the
# kernel tests under compute-sanitizer (memcheck, and racecheck on the shared-memory kernels),
# and the CUDA benchmarks. Logs and benchmark JSON go to $OUT (default: build/gpu-results).
#
#   bash tests/backend/cuda/run_gpu.sh [build] [test] [sanitize] [bench]   (default: all four)
#
# Environment: SPECDEC_MODEL_DIR (default ../shared/models), SPECDEC_DEPS_PREFIX (an extra
# CMAKE_PREFIX_PATH for doctest / nlohmann-json / Google Benchmark / Eigen (optional) when they
# are not installed),
# CUDA_ARCH (default: detected with nvidia-smi, else 90), JOBS (default: nproc).
set -uo pipefail
cd "$(dirname "$0")/../../.."
root="$PWD"
out="${OUT:-$root/build/gpu-results}"
mkdir -p "$out"
build="$root/build/gpu"
stages=("$@")
((${#stages[@]})) || stages=(build test sanitize bench)
has() { local s; for s in "${stages[@]}"; do [[ "$s" == "$1" ]] && return 0; done; return 1; }

export SPECDEC_MODEL_DIR="${SPECDEC_MODEL_DIR:-$(cd .. && pwd)/shared/models}"
export SPECDEC_DATA_DIR="${SPECDEC_DATA_DIR:-$(cd .. && pwd)/shared/data}"
jobs="${JOBS:-$(nproc)}"
arch="${CUDA_ARCH:-}"
if [[ -z "$arch" ]]; then
  arch="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d '.')"
  arch="${arch:-90}"
fi
status=0

nvidia-smi -L 2>&1 || true
if has build; then
  echo "== configure + build (sm_$arch)"
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CUDA_ARCHITECTURES="$arch" -DSPECDEC_ENABLE_CUDA=ON -DSPECDEC_CUDA_RUN_TESTS=ON \
    -DSPECDEC_BUILD_EXAMPLES=OFF -DSPECDEC_BUILD_TOOLS=OFF -DSPECDEC_INSTALL=OFF \
    ${SPECDEC_DEPS_PREFIX:+-DCMAKE_PREFIX_PATH="$SPECDEC_DEPS_PREFIX"} \
    -DSPECDEC_MODEL_DIR="$SPECDEC_MODEL_DIR" -DSPECDEC_DATA_DIR="$SPECDEC_DATA_DIR" \
    > "$out/configure.log" 2>&1 || { tail -40 "$out/configure.log"; exit 1; }
  targets=(specdec_backend_cuda_tests specdec_backend_cuda_host_tests)
  for b in benchmarks/cuda/bench_*.cu; do targets+=("$(basename "${b%.cu}")_cuda"); done
  cmake --build "$build" -j "$jobs" --target "${targets[@]}" > "$out/build.log" 2>&1 ||
    { grep -E "error|Error" -A5 "$out/build.log" | head -80; exit 1; }
  echo "built: ${targets[*]}"
fi
tests="$build/tests/backend/cuda/specdec_backend_cuda_tests"
if has test; then
  echo "== tests"
  "$build/tests/backend/cuda/specdec_backend_cuda_host_tests" > "$out/tests.log" 2>&1 || status=1
  tail -3 "$out/tests.log"
  "$tests" --duration=true >> "$out/tests.log" 2>&1 || status=1
  grep -E "MESSAGE|: (distribution|softmax|sampling|greedy|speculative|given|tree|truncating)|tree forward|ERROR|FATAL|test cases|assertions|Status" \
    "$out/tests.log" | grep -v "^$" | head -80
fi
if has bench; then
  echo "== benchmarks"
  for b in "$build"/benchmarks/bench_*_cuda; do
    name="$(basename "$b")"
    echo "-- $name" >> "$out/bench.txt"
    "$b" --benchmark_counters_tabular=true >> "$out/bench.txt" 2>&1 || status=1
  done
  cat "$out/bench.txt"
fi
if has sanitize; then
  # Each sanitizer run is capped (SANITIZE_TIMEOUT seconds, default 150); a capped run reports
  # what it checked so far.
  cap="${SANITIZE_TIMEOUT:-150}"
  echo "== compute-sanitizer memcheck (kernel tests, quick sweep)"
  SPECDEC_CUDA_QUICK=1 timeout "$cap" compute-sanitizer --tool memcheck --error-exitcode 9 \
    "$tests" --test-case-exclude="*cuda_llama*" > "$out/sanitize.log" 2>&1 || status=1
  grep -E "ERROR SUMMARY|test cases|Status|=========" "$out/sanitize.log" | tail -6
  echo "== compute-sanitizer memcheck (model tests)"
  timeout "$cap" compute-sanitizer --tool memcheck --error-exitcode 9 "$tests" \
    --test-case="*keep_path*,*bad input*" >> "$out/sanitize.log" 2>&1 || status=1
  grep -E "ERROR SUMMARY|test cases|Status" "$out/sanitize.log" | tail -3
  echo "== compute-sanitizer racecheck (shared-memory kernels, quick sweep)"
  SPECDEC_CUDA_QUICK=1 timeout "$cap" compute-sanitizer --tool racecheck --error-exitcode 9 \
    "$tests" --test-case="*padded*,*cuda softmax equals*,*cuda distribution*" \
    >> "$out/sanitize.log" 2>&1 || status=1
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY|test cases|Status" "$out/sanitize.log" | tail -3
fi
exit $status
