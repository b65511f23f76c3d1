#!/usr/bin/env bash
# Prepares .device/ (git-ignored) for a run of tests/backend/cuda/run_gpu.sh on a machine that has
# cmake, ninja, nvcc and python3 but none of the project's other dependencies and no copy of
# ../shared: the Debian packages of doctest, Google Benchmark, nlohmann-json and CLI11 (downloaded
# with `apt-get download`, unpacked there by run_gpu.sh with dpkg-deb, or ar and tar), and the model
# fixture and prompt sets. About 4 MiB. Run it once on this machine, then carry .device along:
#
#   bash tests/backend/cuda/prepare_device.sh
#
# Environment: SPECDEC_MODEL_DIR, SPECDEC_DATA_DIR (default ../shared/{models,data}).
set -euo pipefail
cd "$(dirname "$0")/../../.."
models="${SPECDEC_MODEL_DIR:-$(cd .. && pwd)/shared/models}"
data="${SPECDEC_DATA_DIR:-$(cd .. && pwd)/shared/data}"
mkdir -p .device/debs .device/shared
(cd .device/debs &&
  apt-get download doctest-dev libbenchmark-dev libbenchmark1debian nlohmann-json3-dev libcli11-dev)
rm -rf .device/shared/models .device/shared/data
cp -r "$models" .device/shared/models
cp -r "$data" .device/shared/data
du -sh .device
