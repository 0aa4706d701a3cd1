#!/usr/bin/env bash
# The whole test suite, as CI runs it: installs what is missing, checks
# formatting and lints, builds every target once, runs every test in parallel.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh --tests

# A one-off build gains nothing from incremental caches, which cost gigabytes.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
echo "disk free before the build: $(df -h --output=avail . | tail -1 | tr -d ' ')"

cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings
# One build of every binary and test target; nextest runs them in parallel.
cargo nextest run --workspace --locked --no-fail-fast
# Fuzz targets (scripts/fuzz.sh), opt-in: their release build with sanitizer coverage is its own, ~580 CPU-s from clean (bench/RESULTS.md).
if [ -n "${FUZZ_SECONDS:-}" ]; then bash scripts/fuzz.sh "$FUZZ_SECONDS"; fi
