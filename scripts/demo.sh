#!/usr/bin/env bash
# The demo (README's first command): builds the three programs and runs `tollgate-bench demo`:
# the same workload on the modeled simulated control plane — heartbeats only (directly, then
# through tollgate), a LIST storm without tollgate, the storm through tollgate's adaptive
# default, and through two static pools for comparison — then writes report/report.html
# (self-contained), report/summary.md and report/summary.json. Arguments go to the demo
# (`--quick`, `--output DIR`, `--help`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
cargo build --release --locked -p bench -p tollgate -p loadgen \
  --bin tollgate-bench --bin tollgate --bin loadgen
exec ./target/release/tollgate-bench demo "$@"
