#!/usr/bin/env bash
# specdec's set-up and entry points on a fresh Debian machine.
#   bash tools/run.sh generate [flags...]  builds the release preset and runs speculative
#                                          generation on the stories260K fixture with statistics
#   bash tools/run.sh test                 builds the dev preset and runs every test
# Installs the Debian packages it needs when they are missing (needs root or sudo).
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(cmake ninja-build g++ libeigen3-dev xtensor-dev doctest-dev libbenchmark-dev libcli11-dev
  nlohmann-json3-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "specdec: installing ${missing[*]}" >&2
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${missing[@]}" >/dev/null
fi

shared="$(cd .. && pwd)/shared"
export SPECDEC_MODEL_DIR="${SPECDEC_MODEL_DIR:-$shared/models}"
export SPECDEC_DATA_DIR="${SPECDEC_DATA_DIR:-$shared/data}"
jobs="${SPECDEC_JOBS:-$(nproc)}"

cmd="${1:-test}"
shift || true
case "$cmd" in
  test)
    cmake --preset dev >/dev/null
    cmake --build --preset dev -j "$jobs"
    ctest --preset dev -j "$jobs" "$@"
    ;;
  generate)
    cmake --preset release >/dev/null
    cmake --build --preset release -j "$jobs" --target specdec-generate
    if (($#)); then
      build/release/tools/specdec-generate "$@"
    else
      # Speculative generation with the draft model trained for the fixture (self-speculation by
      # layer skipping when it is not there), the autoregressive baseline, and the statistics;
      # timings from the median of 5 alternating runs of each (one run lasts a few milliseconds).
      draft=tools/draft/stories_draft.bin
      if [ -f "$draft" ]; then
        strategy=(--strategy draft --draft "$draft" -k 3)
      else
        echo "specdec: $draft not found; showing layer-skip self-speculation instead" >&2
        strategy=(--strategy layer-skip --skip-layers 2 -k 3)
      fi
      build/release/tools/specdec-generate --model "$SPECDEC_MODEL_DIR/stories260K.bin" \
        --tokenizer "$SPECDEC_MODEL_DIR/tok512.bin" "${strategy[@]}" \
        --prompt "Once upon a time" -n 200 --compare --repeat 5
    fi
    ;;
  *)
    echo "usage: bash tools/run.sh {test|generate} [args...]" >&2
    exit 2
    ;;
esac
