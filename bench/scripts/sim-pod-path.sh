#!/usr/bin/env bash
# The simulator's pod path, before and after a change, in one run: two release builds of
# `tollgate-bench`, each started ROUNDS times (interleaved: before, after, before, after, ...) with
# the scale of bench/RESULTS.md "Simulated apiserver at scale" (5,000 nodes, 150,000 pods of ~2 KB,
# 50 namespaces). Per start: seeding time (process start to its "serving" line), RSS once seeded,
# and the median of RUNS LISTs of all pods (curl, one warm-up first). Prints a Markdown table and
# the after/before ratios of the medians; writes nothing.
#
# Usage: bench/scripts/sim-pod-path.sh BEFORE_REV
#   BEFORE_REV is built in a temporary git worktree into target/ (its own package paths, so the
#   current tree's artifacts stay), after is the current tree's target/release/tollgate-bench
#   (built unless SKIP_BUILD=1). Environment: ROUNDS=3 RUNS=5 NODES PODS POD_BYTES NAMESPACES.
# A benchmark, not a CI test: run it on a quiet machine. Loopback only; everything it starts is
# stopped by pid on exit.
set -euo pipefail

BENCH=sim-pod-path
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source=lib.sh
source "$ROOT/bench/scripts/lib.sh"

BEFORE_REV=${1:?usage: sim-pod-path.sh BEFORE_REV}
ROUNDS=${ROUNDS:-3}
RUNS=${RUNS:-5}
NODES=${NODES:-5000}
PODS=${PODS:-150000}
POD_BYTES=${POD_BYTES:-2048}
NAMESPACES=${NAMESPACES:-50}

bench_init
BEFORE_SHA=$(git -C "$ROOT" rev-parse --short "$BEFORE_REV")
AFTER_SHA=$(git -C "$ROOT" rev-parse --short HEAD)
git -C "$ROOT" worktree add --detach -q "$TMP/before-src" "$BEFORE_REV"
cleanup_worktree() { git -C "$ROOT" worktree remove --force "$TMP/before-src" 2>/dev/null || true; bench_cleanup; }
trap cleanup_worktree EXIT
log "building $BEFORE_SHA (before)…"
(cd "$TMP/before-src" && CARGO_TARGET_DIR=$ROOT/target cargo build --release -q -p bench --bin tollgate-bench) >&2
cp "$ROOT/target/release/tollgate-bench" "$TMP/tollgate-bench.before"
if [[ -z "${SKIP_BUILD:-}" ]]; then
    log "building $AFTER_SHA (after)…"
    (cd "$ROOT" && cargo build --release -q -p bench --bin tollgate-bench) >&2
fi
cp "$ROOT/target/release/tollgate-bench" "$TMP/tollgate-bench.after"
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)

# measure WHICH: one start; prints "seed_s rss_mib list_median_ms".
measure() {
    local which=$1 d="$TMP/run.$1.$RANDOM" t0 t1 url pid i
    mkdir -p "$d"
    t0=$(date +%s.%N)
    "$TMP/tollgate-bench.$which" sim --nodes "$NODES" --pods "$PODS" --pod-bytes "$POD_BYTES" \
        --namespaces "$NAMESPACES" --listen 127.0.0.1:0 >"$d/out" 2>"$d/err" &
    pid=$!
    PIDS+=("$pid")
    url=""
    for i in $(seq 12000); do
        url=$(grep -o 'serving the Kubernetes API at http://[^ ]*' "$d/out" 2>/dev/null | awk '{print $NF}' || true)
        [[ -n $url ]] && break
        kill -0 "$pid" 2>/dev/null || { cat "$d/err" >&2; die "the $which simulator exited"; }
        sleep 0.01
    done
    [[ -n $url ]] || die "the $which simulator was not ready in 120 s"
    t1=$(date +%s.%N)
    local rss
    rss=$(rss_kb "$pid")
    curl -sf -o /dev/null "$url/api/v1/pods" || die "the $which LIST failed"
    for i in $(seq "$RUNS"); do
        curl -sf -o /dev/null -w '%{time_total}\n' "$url/api/v1/pods"
    done >"$d/lists"
    kill "$pid"
    wait "$pid" 2>/dev/null || true
    awk -v a="$t0" -v b="$t1" -v r="$rss" 'BEGIN {printf "%.2f %.1f ", b - a, r / 1024}'
    sort -g "$d/lists" | awk '{a[NR]=$1} END {printf "%.0f\n", 1000 * a[int((NR+1)/2)]}'
}

echo "| round | seeding s before / after | RSS seeded MiB before / after | LIST of all pods, median of $RUNS, ms before / after |"
echo "|---|---|---|---|"
: >"$TMP/all"
for r in $(seq "$ROUNDS"); do
    measure before >"$TMP/m" && read -r sb rb lb <"$TMP/m"
    measure after >"$TMP/m" && read -r sa ra la <"$TMP/m"
    echo "$sb $rb $lb $sa $ra $la" >>"$TMP/all"
    echo "| $r | $sb / $sa | $rb / $ra | $lb / $la |"
done
awk '{sb+=$1; lb+=$3; sa+=$4; la+=$6} END {printf "\nafter / before, sums over the rounds: seeding %.2f, LIST %.2f\n", sa/sb, la/lb}' "$TMP/all"
echo "before $BEFORE_SHA, after $AFTER_SHA; load average $LOAD_BEFORE before, $(cut -d' ' -f1-3 /proc/loadavg) after"
