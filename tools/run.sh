#!/usr/bin/env bash
# specdec's set-up and entry points on a fresh Debian machine.
#   bash tools/run.sh generate [flags...]  builds the release preset and runs speculative
#                                          generation on the stories260K fixture with statistics;
#                                          flags are added to the default run's (a flag given
#                                          replaces the default of the same flag); without flags
#                                          also on the fixture widened to a memory-bound shape
#   bash tools/run.sh test [ctest args...] builds what the dev preset's tests need and runs them
# Installs the Debian packages it needs when they are missing (needs root or sudo). Build output
# goes to stderr, so that stdout holds only the program's output (`generate --json | jq` works).
# SPECDEC_PRESET chooses another configure preset for `generate` (default: release).
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(cmake ninja-build g++ libeigen3-dev xtensor-dev doctest-dev libbenchmark-dev libcli11-dev
  nlohmann-json3-dev python3)
missing=()
for p in "${packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "specdec: installing ${missing[*]}" >&2
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${missing[@]}" >&2
fi

shared="$(cd .. && pwd)/shared"
export SPECDEC_MODEL_DIR="${SPECDEC_MODEL_DIR:-$shared/models}"
export SPECDEC_DATA_DIR="${SPECDEC_DATA_DIR:-$shared/data}"
jobs="${SPECDEC_JOBS:-$(nproc)}"

# Whether the arguments "$2"... name the flag "$1" (as "--flag" or "--flag=value").
given() {
  local flag="$1" a
  shift
  for a in "$@"; do
    [[ "$a" == "$flag" || "$a" == "$flag="* ]] && return 0
  done
  return 1
}

cmd="${1:-test}"
shift || true
case "$cmd" in
  test)
    # What the tests run (specdec_test_deps: the test programs, the tools and examples they run);
    # the benchmarks, the CUDA objects no test runs here and the compilation of every header on
    # its own (a compile check) are built by .ci/run's own step (the full dev build).
    cmake --preset dev >&2
    cmake --build --preset dev -j "$jobs" --target specdec_test_deps >&2
    ctest --preset dev -j "$jobs" "$@"
    ;;
  generate)
    preset="${SPECDEC_PRESET:-release}"
    cmake --preset "$preset" >&2
    cmake --build --preset "$preset" -j "$jobs" --target specdec-generate >&2
    # The default run: speculative generation with the draft model trained for the fixture
    # (self-speculation by layer skipping when it is not there), the autoregressive baseline, and
    # the statistics, timed over 5 alternating runs of each after a warm-up (one run lasts a few
    # milliseconds). Each flag given replaces its default: --model also the default tokenizer,
    # --prompt-file the default prompt, --strategy the default strategy and its options.
    defaults=()
    draft=tools/draft/stories_draft.bin
    if ! given --model "$@"; then
      defaults+=(--model "$SPECDEC_MODEL_DIR/stories260K.bin")
      given --tokenizer "$@" || defaults+=(--tokenizer "$SPECDEC_MODEL_DIR/tok512.bin")
    fi
    if ! given --strategy "$@"; then
      if [ -f "$draft" ]; then
        given --draft "$@" || defaults+=(--strategy draft --draft "$draft")
      else
        echo "specdec: $draft not found; showing layer-skip self-speculation instead" >&2
        defaults+=(--strategy layer-skip)
        given --skip-layers "$@" || defaults+=(--skip-layers 2)
      fi
      given -k "$@" || defaults+=(-k 3)
    fi
    given --prompt "$@" || given --prompt-file "$@" || defaults+=(--prompt "Once upon a time")
    given -n "$@" || defaults+=(-n 200)
    given --compare "$@" || defaults+=(--compare)
    given --repeat "$@" || defaults+=(--repeat 5)
    if [ "$#" -gt 0 ] || [ "${SPECDEC_WIDENED:-1}" = 0 ] || [ ! -f "$draft" ]; then
      exec "build/$preset/tools/specdec-generate" "${defaults[@]}" "$@"
    fi
    "build/$preset/tools/specdec-generate" "${defaults[@]}"
    # Without flags (and unless SPECDEC_WIDENED=0), the same model and draft again, widened with
    # zeros to the stories110M shape (docs/models.md, "Widened models"; made once, into
    # build/widened): the same function and acceptance, but a forward that streams 313 MB of
    # weights, where scoring a few rows costs about what one costs and speculation pays. Each
    # step's draft length is chosen from the forward's measured cost (--speculate adaptive).
    cmake --build --preset "$preset" -j "$jobs" --target specdec-widen >&2
    widen="build/$preset/tools/specdec-widen"
    mkdir -p build/widened
    target=build/widened/stories260K-stories110M.bin
    wide_draft=build/widened/stories_draft-wide.bin
    [ -f "$target" ] ||
      "$widen" --model "$SPECDEC_MODEL_DIR/stories260K.bin" --preset stories110M -o "$target" >&2
    [ -f "$wide_draft" ] ||
      "$widen" --model "$draft" --dim 256 --hidden-dim 1024 --layers 4 -o "$wide_draft" >&2
    echo
    echo "== stories260K widened to the stories110M shape (memory-bound), draft widened to 5%"
    exec "build/$preset/tools/specdec-generate" --model "$target" \
      --tokenizer "$SPECDEC_MODEL_DIR/tok512.bin" --strategy draft --draft "$wide_draft" -k 4 \
      --speculate adaptive --prompt "Once upon a time" -n 128 --compare --repeat 3
    ;;
  *)
    echo "usage: bash tools/run.sh {test|generate} [args...]" >&2
    exit 2
    ;;
esac
