#!/usr/bin/env bash
# Scale benchmark of loadgen's simulated nodes (issue 7, "What it must show", last bullet):
# one loadgen process simulates 5,000 nodes with 5 daemons each (25,000 pod watches over
# HTTP/2) and 500 node-status heartbeats/s (`--preset tess-5k`) against the simulated
# apiserver, and must use < 1 CPU core on average, < 1.5 GiB RSS, heartbeat schedule lag
# p99 < 50 ms.
#
# One run:
#   1. builds both binaries in release (unless SKIP_BUILD=1), raises the open-file limit;
#   2. starts `tollgate-bench sim` (empty; loadgen registers its nodes, leases and pods);
#   3. runs `loadgen nodes --preset tess-5k --http2 …` for DURATION and samples loadgen's
#      /proc/PID/stat (utime+stime ticks) and /proc/PID/status (VmRSS, VmHWM) every second;
#   4. CPU = ticks over the load window only: registration (before the clock starts) is
#      excluded by taking the window that ends when loadgen's last scheduled beat is due
#      (exit time minus the drain) and starts DURATION - WARMUP before it (WARMUP=10 s
#      skipped); RSS = the last VmHWM seen; lag = `start_lag_ms.p99` of `node-heartbeat`
#      in summary.json (how late each beat was issued against its intended time);
#   5. writes the figures to bench/RESULTS.md (section "Simulated nodes at scale (issue 7)")
#      and prints them. The sim runs on the same machine and cores: say so with the figures.
# A benchmark, not a CI test. Loopback only. Everything it starts is killed by pid on exit.
#
# Environment:
#   SKIP_BUILD=1        use the existing target/release binaries (no cargo build)
#   PROFILE=debug       use target/debug binaries instead (smoke runs only: figures meaningless)
#   NODES=5000 DAEMONS=5 PODS_PER_NODE=30 HEARTBEAT=10s   override the preset's shape
#   DURATION=120        seconds of load (after registration)
#   WARMUP=10           seconds at the start of the load window left out of the CPU average
#   STAGES=""           e.g. "fast" to run the Stage engine too (--stages $STAGES)
#   RESULTS=path        where to write the results (default bench/RESULTS.md; "-" prints only)
set -euo pipefail

BENCH=nodes-scale
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source=bench/scripts/lib.sh
source "$ROOT/bench/scripts/lib.sh"

NODES=${NODES:-5000}
DAEMONS=${DAEMONS:-5}
PODS_PER_NODE=${PODS_PER_NODE:-30}
HEARTBEAT=${HEARTBEAT:-10s}
DURATION=${DURATION:-120}
WARMUP=${WARMUP:-10}
STAGES=${STAGES:-}
RESULTS=${RESULTS:-$ROOT/bench/RESULTS.md}
PROFILE=${PROFILE:-release}

# Targets from issue 7.
CPU_LIMIT=1.0
RSS_LIMIT_KB=$((3 * 512 * 1024)) # 1.5 GiB
LAG_LIMIT_MS=50

for tool in python3 awk; do
    command -v "$tool" >/dev/null || die "$tool is missing"
done
bench_init

if [[ -z "${SKIP_BUILD:-}" && $PROFILE == release ]]; then
    log "building release binaries (cargo build --release -p bench -p loadgen)"
    (cd "$ROOT" && cargo build --release -p bench -p loadgen) >&2
fi
SIM_BIN=$ROOT/target/$PROFILE/tollgate-bench
LOADGEN_BIN=$ROOT/target/$PROFILE/loadgen
[[ -x $SIM_BIN && -x $LOADGEN_BIN ]] || die "release binaries missing; run without SKIP_BUILD"

# 25,000 watches need 25,000 streams; over HTTP/2 few sockets, but the sim's side and
# registration's concurrency want headroom: ask for as many descriptors as allowed.
HARD=$(ulimit -Hn)
ulimit -n "$HARD" 2>/dev/null || ulimit -n 65536 2>/dev/null || true
log "open-file limit $(ulimit -n)"

# --- the simulated apiserver ---
"$SIM_BIN" sim --listen 127.0.0.1:0 >"$TMP/sim.out" 2>"$TMP/sim.err" </dev/null &
SIM_PID=$!
PIDS+=("$SIM_PID")
URL=$(wait_line "$TMP/sim.out" "serving the Kubernetes API at " "$SIM_PID" "tollgate-bench sim")
log "sim at $URL (pid $SIM_PID)"

# --- loadgen ---
ARGS=(nodes --server "$URL" --http2 --preset tess-5k --count "$NODES"
    --daemons-per-node "$DAEMONS" --pods-per-node "$PODS_PER_NODE" --heartbeat "$HEARTBEAT"
    -n default --namespace-allow default --duration "${DURATION}s" --no-progress
    --output "$TMP/out")
if [[ -n "$STAGES" ]]; then
    # shellcheck disable=SC2206
    ARGS+=(--stages $STAGES)
fi
CMD="loadgen ${ARGS[*]}"
CMD=${CMD//$URL/SIM_URL}
CMD=${CMD//$TMP/TMP}
START=$(date +%s.%N)
"$LOADGEN_BIN" "${ARGS[@]}" >"$TMP/loadgen.out" 2>"$TMP/loadgen.err" &
LG_PID=$!
PIDS+=("$LG_PID")
log "loadgen pid $LG_PID: $CMD"

# Samples: epoch seconds, utime+stime ticks, VmRSS kB, VmHWM kB.
sample() {
    local stat status
    stat=$(cat "/proc/$LG_PID/stat" 2>/dev/null) || return 1
    status=$(cat "/proc/$LG_PID/status" 2>/dev/null) || return 1
    # Fields after the ")" of the command name: utime is the 12th, stime the 13th.
    local ticks rss hwm
    ticks=$(awk '{sub(/.*\) /, ""); print $12 + $13}' <<<"$stat")
    rss=$(awk '/^VmRSS:/ {print $2}' <<<"$status")
    hwm=$(awk '/^VmHWM:/ {print $2}' <<<"$status")
    echo "$(date +%s.%N) $ticks ${rss:-0} ${hwm:-0}" >>"$TMP/samples"
}
: >"$TMP/samples"
while kill -0 "$LG_PID" 2>/dev/null; do
    sample || break
    sleep 1
done
STATUS=0
wait "$LG_PID" || STATUS=$?
END=$(date +%s.%N)
[[ $STATUS == 0 ]] || { tail -20 "$TMP/loadgen.err" >&2; die "loadgen exited with $STATUS"; }
[[ -s "$TMP/out/summary.json" ]] || die "no summary.json"

TICK_HZ=$(getconf CLK_TCK)
read -r CPU_CORES WINDOW_S HWM_KB RSS_LAST_KB < <(python3 - "$TMP/samples" "$END" "$DURATION" "$WARMUP" "$TICK_HZ" <<'PY'
import sys
path, end, duration, warmup, hz = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5])
rows = [tuple(map(float, l.split())) for l in open(path) if l.strip()]
if len(rows) < 3:
    print("nan 0 0 0"); sys.exit()
# The load window: the last `duration` s before the last sample (the drain after the last
# beat is short), less the warm-up at its start.
last = rows[-1][0]
lo, hi = last - duration + warmup, last
win = [r for r in rows if lo <= r[0] <= hi]
if len(win) < 2:
    win = rows[-2:]
cores = (win[-1][1] - win[0][1]) / hz / (win[-1][0] - win[0][0])
print(f"{cores:.3f} {win[-1][0] - win[0][0]:.0f} {int(max(r[3] for r in rows))} {int(rows[-1][2])}")
PY
)
read -r LAG_P99 LAG_MAX BEATS BEAT_RATE LIST_P99 < <(python3 - "$TMP/out/summary.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
ops = {o["name"]: o for o in s.get("operations", [])}
hb = ops.get("node-heartbeat", {})
lag = hb.get("start_lag_ms", {})
lists = ops.get("daemon-list", {}).get("latency_ms", {})
print(lag.get("p99", "nan"), lag.get("max", "nan"), hb.get("requests", 0), round(hb.get("rate_per_s", 0), 1), lists.get("p99", "nan"))
PY
)
WATCHES=$(python3 -c 'import json,sys; s=json.load(open(sys.argv[1])); n=s.get("nodes") or {}; w=n.get("daemon_watches") or {}; print(w.get("watchers",0), "/", w.get("active_at_end",0))' "$TMP/out/summary.json")

below() { python3 -c 'import sys; print("PASS" if float(sys.argv[1]) < float(sys.argv[2]) else "FAIL")' "$1" "$2" 2>/dev/null || echo "n/a"; }
V_CPU=$(below "$CPU_CORES" "$CPU_LIMIT")
V_RSS=$(below "$HWM_KB" "$RSS_LIMIT_KB")
V_LAG=$(below "$LAG_P99" "$LAG_LIMIT_MS")
fmt_mib() { awk -v k="$1" 'BEGIN {printf "%.0f MiB", k / 1024}'; }
LOAD=$(cut -d' ' -f1-3 /proc/loadavg)

REPORT=$(cat <<EOF
## Simulated nodes at scale (issue 7)

Command: \`RESULTS=${RESULTS/#$ROOT\//} NODES=$NODES DAEMONS=$DAEMONS PODS_PER_NODE=$PODS_PER_NODE HEARTBEAT=$HEARTBEAT DURATION=$DURATION STAGES="$STAGES" bench/scripts/nodes-scale.sh\`
(loadgen: \`$CMD\`, $PROFILE build), $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores, load average at the end $LOAD;
\`tollgate-bench sim\` runs on the same machine and shares its cores.

| figure | measured | target | verdict |
|---|---|---|---|
| nodes, daemon watches (watchers / active at the end) | $NODES, $WATCHES | 5,000, 25,000 | — |
| node status heartbeats | $BEATS in ${DURATION} s ($BEAT_RATE/s) | 500/s | — |
| loadgen CPU, average over ${WINDOW_S} s of load | $CPU_CORES cores | < $CPU_LIMIT | $V_CPU |
| loadgen peak RSS (VmHWM) | $(fmt_mib "$HWM_KB") (VmRSS at the end $(fmt_mib "$RSS_LAST_KB")) | < 1.5 GiB | $V_RSS |
| heartbeat schedule lag p99 (max) | $LAG_P99 ms ($LAG_MAX ms) | < $LAG_LIMIT_MS ms | $V_LAG |
| for information: daemon LIST latency p99 | $LIST_P99 ms | — | — |

How it is measured: CPU from \`/proc/PID/stat\` utime+stime sampled every second, over the
last DURATION s of the process's life less a ${WARMUP} s warm-up (registration of nodes,
leases and pods happens before and is excluded); RSS from \`/proc/PID/status\`; lag is
\`start_lag_ms\` of \`node-heartbeat\` in loadgen's summary.json (issue time minus intended time).
EOF
)

echo
echo "$REPORT"
echo

if [[ "$RESULTS" != "-" ]]; then
    touch "$RESULTS"
    if [[ ! -s "$RESULTS" ]]; then
        printf '# Benchmark results\n\nFigures recorded by the benchmarks under bench/; each section names the command that produced it.\n' >"$RESULTS"
    fi
    printf '%s\n' "$REPORT" >"$TMP/section.md"
    awk -v sec="$TMP/section.md" '
        function put() { while ((getline l < sec) > 0) print l; done = 1 }
        /^## Simulated nodes at scale \(issue 7\)/ { skip = 1; if (!done) { put(); print "" }; next }
        skip && /^## / { skip = 0 }
        !skip { print }
        END { if (!done) { print ""; put() } }
    ' "$RESULTS" >"$TMP/results.md"
    awk 'NF {for (; n > 0; n--) print ""; print; next} {n++}' "$TMP/results.md" >"$RESULTS"
    log "written to $RESULTS"
fi
