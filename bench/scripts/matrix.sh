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
#   hb5-240                     10,000 pods, 240/min, heartbeats at 5/s (from 50 nodes): too few
#                               for the budget's signal, so tollgate steers by its own probes
# What reaches etcd on a current apiserver, or replaces relists there (issue 33; KUBE=current):
#   exact-240 paged-240 sel-240 10,000 pods, 240/min: exact-revision LISTs, paginated LISTs (limit
#                               500 with continue), label-selector LISTs (goodput.sh's LIST_SHAPE)
#   inf-50 wl-50                10,000 pods, 50 informers starting at once a third into the run:
#                               LIST then WATCH, or a streaming list (RATE is their count, and the
#                               oracle's sweep halves it)
#   restart-50                  10,000 pods, 50 informers synced, then the apiserver restarts and
#                               they relist (goodput.sh's LIST_SHAPE=restart)
# The heartbeats are 20 node-status PATCH/s unless the cell says.
#
# The oracle's sweep: direct runs at the cell's rate, then halving until one passes (at most
# SWEEP_STEPS), then one step between the last passing and first failing rates; the oracle is the
# most LISTs/min served by a passing direct run (a direct run serves what it sends when it passes).
#
# The target, per cell: p99 <= max(2 x B, 50 ms), B the heartbeat p99 of one baseline run (no
# LISTs) sent directly at the cell's first call, so tollgate's own cost does not move it; every run
# of the cell is judged against that one target (goodput.sh's TARGET_MS).
#
# Output: one table row per cell, as bench/RESULTS.md's "The scenario matrix (issue 32)" wants it:
# median and worst p99, LISTs/min, goodput / oracle, 429s, apiserver cores and peak memory (median
# of the adaptive runs), under the apiserver's version. Printed, and merged into RESULTS (default:
# bench/RESULTS.md) unless "-": the rows of the cells run replace theirs, other cells' rows stay
# with the time they were measured, so the matrix can be run a few cells at a time.
# Duration: the apiserver is seeded once per pod count (~1-2 min at 10k pods, ~4 at 25k) and copied
# for every run; each call is one run of RUN_SECONDS plus ~20 s of start; a full matrix (7 cells,
# ~4 oracle runs, a baseline and 3 adaptive runs each) is ~55 runs: ~2 hours at RUN_SECONDS=60. A
# benchmark, not a test: run it on a quiet machine. Loopback only; goodput.sh stops everything it
# started.
#
# Environment:
#   CELLS="10k-60 10k-240 10k-500 25k-240 mix-300 step-240 hb100-240"
#   KUBE=1.20|current   the apiserver (goodput.sh's KUBE: the 1.20.2 tier or scripts/kube-current.sh's)
#   RUNS=3 SWEEP_STEPS=3 RUN_SECONDS=60 RESULTS=path|- SKIP_BUILD=1 (passed on to goodput.sh)
#   TRACES=dir         keep every tollgate run's budget trace, last /debug/budget and /metrics
#                      there, named KUBE-CELL-RUN-* (goodput.sh's TRACES; the same cell on
#                      both apiservers in one directory keeps both)
#   TMPDIR=/tmp        where every run's etcd data lives (lib.sh); /dev/shm keeps a shared disk's
#                      stalls out of the heartbeats (etcd fsyncs each PATCH), named in the command
set -euo pipefail

BENCH=matrix
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source=lib.sh
source "$ROOT/bench/scripts/lib.sh"

COMMAND="bench/scripts/matrix.sh"
for v in CELLS KUBE RUNS SWEEP_STEPS RUN_SECONDS TMPDIR; do
    [[ -n "${!v+x}" ]] && COMMAND="$v=\"${!v}\" $COMMAND"
done
CELLS=${CELLS:-10k-60 10k-240 10k-500 25k-240 mix-300 step-240 hb100-240}
RUNS=${RUNS:-3}
SWEEP_STEPS=${SWEEP_STEPS:-3}
RUN_SECONDS=${RUN_SECONDS:-60}
RESULTS=${RESULTS:-$ROOT/bench/RESULTS.md}
KUBE=${KUBE:-1.20}
export RUN_SECONDS KUBE
if [[ -n ${TRACES:-} ]]; then
    TRACES=$(realpath -m "$TRACES")
    export TRACES
fi

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
    hb5-240) echo "PODS=10000 RATE=240 SHAPE=single PATCH=5/s NODES=50" ;;
    exact-240) echo "PODS=10000 RATE=240 SHAPE=exact PATCH=20/s NODES=200" ;;
    paged-240) echo "PODS=10000 RATE=240 SHAPE=paged PATCH=20/s NODES=200" ;;
    sel-240) echo "PODS=10000 RATE=240 SHAPE=selector PATCH=20/s NODES=200" ;;
    inf-50) echo "PODS=10000 RATE=50 SHAPE=informers PATCH=20/s NODES=200" ;;
    wl-50) echo "PODS=10000 RATE=50 SHAPE=watchlist PATCH=20/s NODES=200" ;;
    restart-50) echo "PODS=10000 RATE=50 SHAPE=restart PATCH=20/s NODES=200" ;;
    tiny) echo "PODS=500 RATE=60 SHAPE=single PATCH=20/s NODES=20" ;;
    *) die "unknown cell $1" ;;
    esac
}

bench_init
OUT=$TMP/rows
: >"$OUT"
first=1
# The seeded etcd of each pod count, kept for the whole matrix (goodput.sh's SEED_CACHE).
export SEED_CACHE=$TMP/seeds
VERSION=""

# one VIA RATE TAG: one goodput.sh run of the current cell; appends "TAG p99 target lists_per_min
# r429 hb_err crashed cores peak_gb" to $TMP/runs.tsv.
one() {
    local via=$1 rate=$2 tag=$3
    local out=$TMP/$CELL-$tag.log
    local skip=${SKIP_BUILD:-}
    [[ $first == 1 ]] || skip=1
    first=0
    SKIP_BUILD=$skip PLANES=real VIAS=$via RESULTS=- LIST_SHAPE=$SHAPE REAL_PODS=$PODS \
        REAL_STORM=$rate REAL_PATCH=$PATCH REAL_NODES=$NODES BASELINE=direct TARGET_MS=$CELL_TARGET \
        TRACE_PREFIX="$KUBE-$CELL-$tag-" \
        "$ROOT/bench/scripts/goodput.sh" >"$out" 2>&1 || { log "$CELL $tag: goodput.sh failed; see $out"; return 1; }
    if [[ -z $CELL_TARGET ]]; then
        CELL_TARGET=$(grep -o 'target PATCH p99 <= [0-9.]* ms' "$out" | head -1 | awk '{print $5}')
        log "$CELL: target $CELL_TARGET ms ($(grep -o 'baseline B = [0-9.]* ms' "$out" | head -1))"
    fi
    [[ -n $VERSION ]] || VERSION=$(grep -o 'real: kube-apiserver v[^ ]*' "$out" | head -1 | awk '{print $3}')
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

# write_rows: merge the row of the cell just measured into RESULTS (after each cell: a stopped
# matrix keeps what it measured).
write_rows() {
    local stamp section
    stamp="$(date -u '+%Y-%m-%d %H:%M UTC'), load average $CELL_LOAD before, $(cut -d' ' -f1-3 /proc/loadavg) after"
    [[ -n $VERSION ]] || VERSION="KUBE=$KUBE"
    tail -1 "$OUT" >"$TMP/row"
    section=$(python3 - "$RESULTS" "$TMP/row" "$VERSION" "$stamp" "$COMMAND" "$CELL" <<'PY'
import re, sys
results, rows_path, version, stamp, command, cell = sys.argv[1:]
HEAD = "## The scenario matrix (issue 32)"
ORDER = "10k-60 10k-240 10k-500 25k-240 mix-300 step-240 hb100-240 hb5-240 tiny".split()
try:
    text = open(results).read() if results != "-" else ""
except FileNotFoundError:
    text = ""
old = ""
if HEAD + "\n" in text:
    start = text.index(HEAD + "\n")
    nxt = text.find("\n## ", start + len(HEAD))
    old = text[start:] if nxt < 0 else text[start:nxt]
# The subsections already there: version -> (rows by cell, batch lines).
subs = {}
for m in re.finditer(r"^### kube-apiserver (\S+)\n(.*?)(?=^### |\Z)", old, re.S | re.M):
    body = m.group(2)
    rows = {l.split("|")[1].strip(): l for l in body.splitlines() if l.startswith("| ") and not l.startswith("| cell")}
    batches = [l for l in body.splitlines() if l.startswith("- ")]
    subs[m.group(1)] = (rows, batches)
rows, batches = subs.get(version, ({}, []))
n = 0
for l in open(rows_path):
    l = l.rstrip("\n")
    if l:
        rows[l.split("|")[1].strip()] = l.rstrip(" |") + f" | {stamp.split(',')[0]} |"
        n += 1
batches.append(f"- {stamp}: {cell} by `{command}`")
# Keep a batch line only while one of its cells still has a row measured at its time.
kept = [b for b in batches if any(b[2:].startswith(r.rsplit("|", 2)[-2].strip()) for r in rows.values())]
subs[version] = (rows, kept)
out = [HEAD, "",
       "Per cell: the oracle (the best even LIST rate sent directly within the target, by a short sweep",
       "of direct runs) and tollgate's adaptive default (nothing set but `--mode enforce`), each run from",
       "a fresh apiserver (reseeded from one etcd copy) and a fresh tollgate. The target: p99 <= max(2 x B,",
       "50 ms), B the heartbeat p99 of one run without LISTs, sent directly, at the cell's start. The",
       "cells and the sweep: `bench/scripts/matrix.sh`'s header. Each row names when it was measured;",
       "the batches below each table give the command and the machine's load.", ""]
for v in sorted(subs):
    rs, bs = subs[v]
    out += [f"### kube-apiserver {v}", "",
            "| cell | pods | LISTs | heartbeats | target ms | oracle LISTs/min | adaptive runs within | median p99 ms | worst p99 ms | LISTs/min (median) | goodput / oracle | 429s (median) | apiserver cores | apiserver peak GB | measured |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    out += [rs[c] for c in sorted(rs, key=lambda c: ORDER.index(c) if c in ORDER else 99)]
    out += [""] + bs + [""]
print("\n".join(out))
PY
    )
    if [[ $RESULTS != - ]]; then
        write_section "$RESULTS" "$section"
        log "written to $RESULTS"
    else
        echo "$section"
    fi
}

for CELL in $CELLS; do
    eval "$(cell "$CELL")"
    CELL_TARGET=""
    CELL_LOAD=$(cut -d' ' -f1-3 /proc/loadavg)
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
    write_rows
done
