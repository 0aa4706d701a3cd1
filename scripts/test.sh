#!/usr/bin/env bash
# The whole test suite, as CI runs it: installs what is missing, checks
# formatting and lints, builds every target once, runs every test in parallel.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh --tests

cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings
# One build of every binary and test target; nextest runs them in parallel.
cargo nextest run --workspace --locked --no-fail-fast
