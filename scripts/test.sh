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
# Each fuzz target (scripts/fuzz.sh) from its fixed corpus for FUZZ_SECONDS (0 skips): a build
# of its own with sanitizer coverage, unoptimized but for the YAML parser (~350 CPU-s from clean,
# release's is ~580; bench/RESULTS.md). A crash fails the run and is kept in fuzz/artifacts/.
FUZZ_SECONDS="${FUZZ_SECONDS:-10}"
if [ "$FUZZ_SECONDS" != 0 ]; then FUZZ_PROFILE=smoke bash scripts/fuzz.sh "$FUZZ_SECONDS"; fi
