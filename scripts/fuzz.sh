#!/usr/bin/env bash
# Fuzz tollgate's parsers with libFuzzer (libfuzzer-sys) on stable Rust: the
# request classifier, label and field selectors (parse, print, parse again),
# the configuration file, the kubeconfig reader, and the client listener on the
# wire (raw bytes through hyper's HTTP/1.1 and HTTP/2 parsers and the whole
# handler, against a stub apiserver on loopback) (fuzz/fuzz_targets/).
#
#   scripts/fuzz.sh [SECONDS] [TARGET...]   each target SECONDS (default 20)
#   FUZZ_RUNS=N scripts/fuzz.sh [SECONDS]   stop at N executions (or SECONDS)
#   FUZZ_PROFILE=smoke scripts/fuzz.sh 10   the build scripts/test.sh uses: unoptimized but for
#                                           the YAML parser, ~60% of release's build time
#
# Builds fuzz/ (its own workspace and target directory: the main build never
# sees these flags) with sanitizer coverage. The flags apply only to the
# target triple given, so build scripts and proc macros are built without
# them (with them, linking a build script fails on the missing
# __sanitizer_cov_* symbols). Each target starts from its fixed corpus in
# fuzz/corpus/TARGET/ (read, never written); what it finds new goes to
# fuzz/work/TARGET/, a crash to fuzz/artifacts/TARGET/ and a non-zero exit.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
seconds="${1:-20}"
shift || true
targets=("$@")
if [ "${#targets[@]}" -eq 0 ]; then
  targets=(classify selectors config kubeconfig wire)
fi
triple="$(rustc -vV | sed -n 's/^host: //p')"
export RUSTFLAGS="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing"
profile="${FUZZ_PROFILE:-release}"
# Its own lock file: a crate the main workspace adds to apimodel, kubeio or tollgate lands here too.
if ! cargo metadata --locked --format-version 1 >/dev/null 2>&1; then
  echo "fuzz/Cargo.lock is out of date with the crates it builds:" \
    "run (cd fuzz && cargo metadata --format-version 1 >/dev/null) and commit fuzz/Cargo.lock" >&2
  exit 1
fi
cargo build --profile "$profile" --locked --bins --target "$triple"
# The kubeconfig target writes its input to a file: in memory where possible.
TOLLGATE_FUZZ_TMP="$(mktemp -d -p /dev/shm 2>/dev/null || mktemp -d)"
export TOLLGATE_FUZZ_TMP
trap 'rm -rf "$TOLLGATE_FUZZ_TMP"' EXIT
for t in "${targets[@]}"; do
  mkdir -p "work/$t" "artifacts/$t"
  echo "fuzzing $t for ${seconds} s${FUZZ_RUNS:+ or $FUZZ_RUNS runs}"
  "target/$triple/$profile/$t" -max_total_time="$seconds" ${FUZZ_RUNS:+-runs="$FUZZ_RUNS"} \
    -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="artifacts/$t/" "work/$t" "corpus/$t"
done
