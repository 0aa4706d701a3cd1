#!/usr/bin/env bash
# The scenario matrix of issue 32 on the real kube-apiserver 1.20.2: per cell, the oracle (the best
# even LIST rate sent directly whose heartbeat p99 stays within the target, by a short sweep) and
# tollgate's adaptive default (nothing set but --mode enforce), RUNS runs each, every run from a
# fresh apiserver (reseeded from one etcd copy) and a fresh tollgate. Each run is one
# bench/scripts/goodput.sh run (PLANES=real), whose header describes the storm, the heartbeats and
# the target (p99 <= max(2 x the baseline through tollgate, 50 ms)).
#
# Cells (CELLS, space-separated NAME=PODS/RATE/SHAPE/PATCH):
#   10k-60 10k-240 10k-500      10,000 pods (one LIST of all pods ~33 MB), 60/240/500 LISTs/min
#   25k-240                     25,000 pods (~83 MB), 240/min
#   mix-300                     10,000 pods, 300/min of four kinds (goodput.sh's LIST_SHAPE=mix)
#   step-240                    10,000 pods, 60 -> 240 -> 480/min (LIST_SHAPE=step)
#   hb100-240                   10,000 pods, 240/min, heartbeats at 100/s (from 1,000 nodes)
# The heartbeats are 20 node-status PATCH/s unless the cell says.
#
# The oracle's sweep: direct runs at the cell's rate, then halving until one passes (at most
# SWEEP_STEPS), then one step between the last passing and first failing rates; the oracle is the
# most LISTs/min served by a passing direct run (a direct run serves what it sends when it passes).
#
# Output: one table row per cell, as bench/RESULTS.md's "The scenario matrix (issue 32)" wants it:
# median and worst p99, LISTs/min, goodput / oracle, 429s, apiserver cores and peak memory (median
# of the adaptive runs). Printed, and written to RESULTS (default: bench/RESULTS.md) unless "-".
# Duration: each goodput.sh call seeds the apiserver (~1-2 min at 10k pods, ~4 at 25k), runs a
# baseline and one run of RUN_SECONDS; a full matrix (7 cells, ~4 oracle runs and 3 adaptive runs
# each) is ~50 calls: ~3 hours at RUN_SECONDS=60. A benchmark, not a test: run it on a quiet
# machine. Loopback only; goodput.sh stops everything it started.
#
# Environment:
#   CELLS="10k-60 10k-240 10k-500 25k-240 mix-300 step-240 hb100-240"
#   RUNS=3 SWEEP_STEPS=3 RUN_SECONDS=60 RESULTS=path|- SKIP_BUILD=1 (passed on to goodput.sh)
set -euo pipefail

BENCH=matrix
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source=lib.sh
source "$ROOT/bench/scripts/lib.sh"

COMMAND="bench/scripts/matrix.sh"
for v in CELLS RUNS SWEEP_STEPS RUN_SECONDS; do
    [[ -n "${!v+x}" ]] && COMMAND="$v=\"${!v}\" $COMMAND"
done
CELLS=${CELLS:-10k-60 10k-240 10k-500 25k-240 mix-300 step-240 hb100-240}
RUNS=${RUNS:-3}
SWEEP_STEPS=${SWEEP_STEPS:-3}
RUN_SECONDS=${RUN_SECONDS:-60}
RESULTS=${RESULTS:-$ROOT/bench/RESULTS.md}
export RUN_SECONDS

# cell NAME: shell assignments PODS RATE SHAPE PATCH NODES.
cell() {
    case $1 in
    10k-60) echo "PODS=10000 RATE=60 SHAPE=single PATCH=20/s NODES=200" ;;
    10k-240) echo "PODS=10000 RATE=240 SHAPE=single PATCH=20/s NODES=200" ;;
    10k-500) echo "PODS=10000 RATE=500 SHAPE=single PATCH=20/s NODES=200" ;;
    25k-240) echo "PODS=25000 RATE=240 SHAPE=single PATCH=20/s NODES=200" ;;
    mix-300) echo "PODS=10000 RATE=300 SHAPE=mix PATCH=20/s NODES=200" ;;
    step-240) echo "PODS=10000 RATE=240 SHAPE=step PATCH=20/s NODES=200" ;;
    hb100-240) echo "PODS=10000 RATE=240 SHAPE=single PATCH=100/s NODES=1000" ;;
    tiny) echo "PODS=500 RATE=60 SHAPE=single PATCH=20/s NODES=20" ;;
    *) die "unknown cell $1" ;;
    esac
}

bench_init
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
OUT=$TMP/rows
: >"$OUT"
first=1

# one VIA RATE TAG: one goodput.sh run of the current cell; appends "TAG p99 target lists_per_min
# r429 hb_err crashed cores peak_gb" to $TMP/runs.tsv.
one() {
    local via=$1 rate=$2 tag=$3
    local out=$TMP/$CELL-$tag.log
    local skip=${SKIP_BUILD:-}
    [[ $first == 1 ]] || skip=1
    first=0
    SKIP_BUILD=$skip PLANES=real VIAS=$via RESULTS=- LIST_SHAPE=$SHAPE REAL_PODS=$PODS \
        REAL_STORM=$rate REAL_PATCH=$PATCH REAL_NODES=$NODES \
        "$ROOT/bench/scripts/goodput.sh" >"$out" 2>&1 || { log "$CELL $tag: goodput.sh failed; see $out"; return 1; }
    python3 - "$out" "$via" "$CELL" "$tag" >>"$TMP/runs.tsv" <<'PY'
import re, sys
log, via, cell, tag = sys.argv[1:]
text = open(log).read()
target = float(re.search(r"target PATCH p99 <= (\d+(?:\.\d+)?) ms", text).group(1))
for line in text.splitlines():
    f = [x.strip() for x in line.strip().strip("|").split("|")]
    if len(f) == 13 and f[0].split(" ")[0] == via:
        # run, p50, p99, p99/B, within, lists/min, goodput/best, 429, list errors, hb errors, cores, peak GB, crash
        print(cell, tag, f[2], target, f[5], f[7], f[9], f[12], f[10], f[11], sep="\t")
        break
PY
}

# passing TAG: 0 when the run TAG of the current cell met the target.
passing() {
    awk -F'\t' -v c="$CELL" -v t="$1" '$1 == c && $2 == t {ok = ($3 + 0 <= $4 + 0 && $7 == 0 && $8 == "no")} END {exit ok ? 0 : 1}' "$TMP/runs.tsv"
}

for CELL in $CELLS; do
    eval "$(cell "$CELL")"
    log "$CELL: $PODS pods, $RATE LISTs/min ($SHAPE), heartbeats $PATCH ($(date -u +%H:%M:%S))"
    # The oracle's sweep.
    hi=$RATE lo=0 r=$RATE
    for _ in $(seq "$SWEEP_STEPS"); do
        one direct "$r" "direct-$r" || break
        if passing "direct-$r"; then lo=$r; break; fi
        hi=$r
        r=$((r / 2))
        [[ $r -ge 1 ]] || break
    done
    if [[ $lo -gt 0 && $hi -gt $lo ]]; then
        mid=$(((lo + hi) / 2))
        one direct "$mid" "direct-$mid" && passing "direct-$mid" && lo=$mid
    fi
    for i in $(seq "$RUNS"); do one adaptive "$RATE" "adaptive-$i" || true; done
    python3 - "$TMP/runs.tsv" "$CELL" "$PODS" "$RATE" "$SHAPE" "$PATCH" >>"$OUT" <<'PY'
import statistics, sys
path, cell, pods, rate, shape, patch = sys.argv[1:]
rows = [l.rstrip("\n").split("\t") for l in open(path) if l.startswith(cell + "\t")]
def num(x):
    try:
        return float(x)
    except ValueError:
        return None
def ok(r):
    return num(r[2]) is not None and num(r[2]) <= float(r[3]) and r[6] == "0" and r[7] == "no"
direct = [r for r in rows if r[1].startswith("direct-") and ok(r)]
oracle = max((num(r[4]) for r in direct), default=None)
ad = [r for r in rows if r[1].startswith("adaptive-")]
if not ad:
    print(f"| {cell} | {pods} | {rate}/min {shape} | {patch} | — | no adaptive run |")
    sys.exit()
p99 = [num(r[2]) for r in ad if num(r[2]) is not None]
lpm = [num(r[4]) for r in ad]
target = float(ad[0][3])
med = lambda v: statistics.median(v) if v else float("nan")
within = sum(ok(r) for r in ad)
g = med(lpm) / oracle if oracle else None
print(f"| {cell} | {pods} | {rate}/min {shape} | {patch} | {target:.0f} | "
      f"{'—' if oracle is None else f'{oracle:.1f}'} | {within}/{len(ad)} | {med(p99):.1f} | {max(p99):.1f} | "
      f"{med(lpm):.1f} | {'—' if g is None else f'{g:.2f}'} | {med([num(r[5]) for r in ad]):.0f} | "
      f"{med([num(r[8]) for r in ad if num(r[8]) is not None]):.2f} | {med([num(r[9]) for r in ad if num(r[9]) is not None]):.2f} |")
PY
    tail -1 "$OUT" >&2
done
LOAD_AFTER=$(cut -d' ' -f1-3 /proc/loadavg)

section="## The scenario matrix (issue 32)

Per cell: the oracle (the best even LIST rate sent directly within the target, by a short sweep)
and tollgate's adaptive default, $RUNS runs, ${RUN_SECONDS} s each, each from a fresh apiserver and
tollgate; the real kube-apiserver 1.20.2 + etcd. Measured $(date -u '+%Y-%m-%d %H:%M UTC'); load
average $LOAD_BEFORE before, $LOAD_AFTER after.

Command: \`$COMMAND\`

| cell | pods | LISTs | heartbeats | target ms | oracle LISTs/min | adaptive runs within | median p99 ms | worst p99 ms | LISTs/min (median) | goodput / oracle | 429s (median) | apiserver cores | apiserver peak GB |
|---|---|---|---|---|---|---|---|---|---|---|---|---|---|
$(cat "$OUT")
"
echo "$section"
if [[ $RESULTS != - ]]; then
    write_section "$RESULTS" "$section"
    log "written to $RESULTS"
fi
