#!/usr/bin/env bash
# Calibration of the simulated apiserver's cost model (issue 5): the reference
# scenario measured the same way against
#   real  kube-apiserver 1.20.2 + etcd 3.4 (../shared/tools/kube-apiserver, start.sh/stop.sh)
#   sim   tollgate-bench sim --cost-model modeled (default constants unless SIM_FLAGS says otherwise)
# and printed side by side.
#
# Scenario: 200 nodes and 10,000 pods of ~3.3 KB seeded with `loadgen seed` (the same
# objects on both), node status PATCHes at 20/s throughout, and in steps of STEP_SECONDS:
# consistent LIST-all-pods at 0, 60, 120, 240 per minute, then 240 per minute with
# resourceVersion=0 (from the watch cache). Each step is one loadgen run; its PATCH
# p50/p99 and LIST p50 come from loadgen's summary.json (latency from the intended start).
# Memory: the real apiserver's VmRSS sampled every 0.5 s (peak per step); the sim's
# tollgate_sim_virtual_memory_bytes scraped every 0.5 s (peak per step).
#
# Takes ~(2 targets x 5 steps x STEP_SECONDS) plus seeding: ~13 minutes with the defaults.
# A benchmark, not a CI test. Loopback only; it stops exactly what it started (trap).
#
# Environment:
#   TARGETS="real sim"   which to measure
#   STEP_SECONDS=60      length of each step
#   STEPS="0 60 120 240 240rv0"
#   NODES=200 PODS=10000 POD_BYTES=3300 PATCH_RATE=20/s
#   SIM_FLAGS=""         extra flags for the sim (e.g. "--model-set quantum=0.02")
#   SIM_MEMORY_LIMIT=24Gi the sim's --memory-limit (the machine's memory, as the real one has)
#   SKIP_BUILD=1         use the existing target/release binaries
#   LOADGEN=, SIM=       other binaries to use (with SKIP_BUILD=1)
#   OUT=dir              keep the loadgen outputs (and the servers' logs) there
#                        (default: a temp dir, removed)
# Run it on a quiet machine: builds or tests alongside inflate the real apiserver's figures.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
TOOLS=$(cd "$ROOT/../shared/tools/kube-apiserver" 2>/dev/null && pwd || true)
TARGETS=${TARGETS:-real sim}
STEP_SECONDS=${STEP_SECONDS:-60}
STEPS=${STEPS:-0 60 120 240 240rv0}
NODES=${NODES:-200}
PODS=${PODS:-10000}
POD_BYTES=${POD_BYTES:-3300}
PATCH_RATE=${PATCH_RATE:-20/s}
SIM_FLAGS=${SIM_FLAGS:-}
# The real apiserver runs with no memory limit on this 24 GiB machine; the sim gets the same,
# so a step that would OOM-kill an 8 GiB control plane is measured, not restarted.
SIM_MEMORY_LIMIT=${SIM_MEMORY_LIMIT:-24Gi}
LOADGEN=${LOADGEN:-$ROOT/target/release/loadgen}
SIM=${SIM:-$ROOT/target/release/tollgate-bench}

log() { echo "calibrate: $*" >&2; }
die() { log "$*"; exit 1; }
# shellcheck source=bench/scripts/modeled-sim.sh
source "$(dirname "${BASH_SOURCE[0]}")/modeled-sim.sh"

if [[ -z "${SKIP_BUILD:-}" ]]; then
    (cd "$ROOT" && cargo build --release -p bench -p loadgen --bin tollgate-bench --bin loadgen) >&2
fi
[[ -x $LOADGEN && -x $SIM ]] || die "build target/release/{loadgen,tollgate-bench} first"

TMP=$(mktemp -d /tmp/calibrate.XXXXXX)
OUT=${OUT:-$TMP/out}
mkdir -p "$OUT"
SIM_PID=""
REAL_RUN=""
SAMPLER_PID=""
cleanup() {
    [[ -n $SAMPLER_PID ]] && kill "$SAMPLER_PID" 2>/dev/null || true
    [[ -n $SIM_PID ]] && kill "$SIM_PID" 2>/dev/null || true
    [[ -n $REAL_RUN ]] && "$TOOLS/stop.sh" "$REAL_RUN" >/dev/null 2>&1 || true
    [[ -z "${KEEP:-}" ]] && rm -rf "$TMP"
}
trap cleanup EXIT INT TERM

# Peak of a sampled number over a step: `sample CMD` prints one number.
start_sampler() { # $1: file, $2...: command printing bytes
    local file=$1; shift
    echo 0 >"$file"
    (
        peak=0
        while true; do
            v=$("$@" 2>/dev/null || echo 0)
            v=${v%.*}
            [[ -n $v && $v -gt $peak ]] && { peak=$v; echo "$peak" >"$file"; }
            sleep 0.5
        done
    ) &
    SAMPLER_PID=$!
}
stop_sampler() { kill "$SAMPLER_PID" 2>/dev/null || true; wait "$SAMPLER_PID" 2>/dev/null || true; SAMPLER_PID=""; }

real_rss() { awk '/^VmRSS:/ {printf "%.0f\n", $2 * 1024}' "/proc/$KUBE_APISERVER_PID/status"; }
sim_vmem() { curl -sf "$SIM_URL/metrics" | awk '/^tollgate_sim_virtual_memory_bytes / {printf "%.0f\n", $2}'; }

# One step: loadgen with PATCHes and (maybe) LISTs; writes OUT/TARGET-STEP/summary.json.
run_step() { # $1 target, $2 step, $3 kubeconfig, $4 memory sampler function
    local target=$1 step=$2 kc=$3 sampler=$4
    local rate=${step%rv0} rv=consistent
    [[ $step == *rv0 ]] && rv=cache
    local dir=$OUT/$target-$step
    local lists=()
    [[ $rate != 0 ]] && lists=(--lists "$rate/min" --list-resource pods -A --list-rv "$rv")
    start_sampler "$dir.mem" "$sampler"
    log "$target: step $step (${STEP_SECONDS}s)"
    "$LOADGEN" --kubeconfig "$kc" --duration "${STEP_SECONDS}s" --no-progress \
        --patches "$PATCH_RATE" --patch-target node-status --objects "$NODES" \
        "${lists[@]}" --timeout 120s --drain-timeout 120s --output "$dir" >"$dir.log" 2>&1 ||
        log "$target: loadgen exited non-zero at step $step (see $dir.log)"
    stop_sampler
}

seed() { # $1 kubeconfig
    "$LOADGEN" seed --kubeconfig "$1" --nodes "$NODES" --pods "$PODS" --pod-bytes "$POD_BYTES" \
        --namespaces 10 >"$TMP/seed.log" 2>&1 || { cat "$TMP/seed.log" >&2; die "seeding failed"; }
}

for target in $TARGETS; do
    case $target in
    real)
        [[ -x $TOOLS/start.sh ]] || die "no ../shared/tools/kube-apiserver/start.sh"
        REAL_RUN=$TMP/kube-run
        "$TOOLS/start.sh" "$REAL_RUN" >/dev/null
        # shellcheck disable=SC1091
        source "$REAL_RUN/env"
        log "real: seeding $NODES nodes, $PODS pods"
        seed "$REAL_RUN/kubeconfig"
        for s in $STEPS; do
            run_step real "$s" "$REAL_RUN/kubeconfig" real_rss
            kill -0 "$KUBE_APISERVER_PID" 2>/dev/null || log "real: kube-apiserver exited during step $s"
        done
        cp -r "$REAL_RUN/logs" "$OUT/real-logs" 2>/dev/null || true
        "$TOOLS/stop.sh" "$REAL_RUN" >/dev/null 2>&1 || true
        REAL_RUN=""
        ;;
    sim)
        start_modeled_sim sim
        log "sim: seeding $NODES nodes, $PODS pods at $SIM_URL"
        seed "$TMP/sim.kubeconfig"
        for s in $STEPS; do run_step sim "$s" "$TMP/sim.kubeconfig" sim_vmem; done
        cp "$TMP/sim.err" "$OUT/sim.log" 2>/dev/null || true
        curl -sf "$SIM_URL/metrics" | grep -E '^tollgate_sim_(restarts|virtual_cpu)' >"$OUT/sim-final.metrics" || true
        kill "$SIM_PID" 2>/dev/null || true
        SIM_PID=""
        ;;
    *) die "unknown target $target" ;;
    esac
done

python3 - "$OUT" "$STEPS" "$TARGETS" <<'EOF'
import json, os, sys
out, steps, targets = sys.argv[1], sys.argv[2].split(), sys.argv[3].split()
def fig(target, step):
    p = os.path.join(out, f"{target}-{step}", "summary.json")
    if not os.path.exists(p):
        return None
    s = json.load(open(p))
    # loadgen names the verb "LIST(rv=0)" for cache LISTs.
    ops = {o["verb"].split("(")[0]: o for o in s["operations"]}
    def lat(verb, q):
        o = ops.get(verb)
        return o["latency_ms"].get(q) if o and o.get("requests") else None
    def errs(verb):
        o = ops.get(verb)
        return o.get("error_rate") if o else None
    mem = open(os.path.join(out, f"{target}-{step}.mem")).read().strip()
    return dict(pp50=lat("PATCH", "p50"), pp99=lat("PATCH", "p99"), lp50=lat("LIST", "p50"),
                mem=int(mem or 0) / 1e9, perr=errs("PATCH"), lerr=errs("LIST"))
def f(v, unit=""):
    return "—" if v is None else (f"{v:.0f}{unit}" if v >= 100 else f"{v:.3g}{unit}")
def ratio(a, b):
    if a is None or b is None or not b:
        return "—"
    return f"{a / b:.2f}"
label = lambda s: ("240/min rv=0" if s.endswith("rv0") else f"{s}/min consistent")
print("| step | PATCH p50 ms (real / sim) | PATCH p99 ms (real / sim) | LIST p50 ms (real / sim) | peak memory GB (real RSS / sim modeled) | sim/real p50, p99, LIST, memory |")
print("|---|---|---|---|---|---|")
for st in steps:
    r = fig("real", st) if "real" in targets else None
    m = fig("sim", st) if "sim" in targets else None
    g = lambda d, k: d and d[k]
    print(f"| {label(st)} | {f(g(r,'pp50'))} / {f(g(m,'pp50'))} | {f(g(r,'pp99'))} / {f(g(m,'pp99'))} | "
          f"{f(g(r,'lp50'))} / {f(g(m,'lp50'))} | {f(g(r,'mem'))} / {f(g(m,'mem'))} | "
          f"{ratio(g(m,'pp50'), g(r,'pp50'))}, {ratio(g(m,'pp99'), g(r,'pp99'))}, "
          f"{ratio(g(m,'lp50'), g(r,'lp50'))}, {ratio(g(m,'mem'), g(r,'mem'))} |")
for t in targets:
    for st in steps:
        d = fig(t, st)
        if d and ((d["perr"] or 0) > 0 or (d["lerr"] or 0) > 0):
            print(f"\n{t} {label(st)}: error rate PATCH {d['perr']}, LIST {d['lerr']}")
EOF
[[ -f $OUT/sim-final.metrics ]] && { echo; echo "sim at the end:"; cat "$OUT/sim-final.metrics"; }
