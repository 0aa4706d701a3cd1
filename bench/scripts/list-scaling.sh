#!/usr/bin/env bash
# LIST cost against object count and size (issue 9, item 4), measured the same way against
#   real  kube-apiserver 1.20.2 + etcd 3.4 (../shared/tools/kube-apiserver, start.sh/stop.sh)
#   sim   tollgate-bench sim --cost-model modeled (default constants unless SIM_FLAGS says otherwise)
# and printed side by side, with a least-squares fit of the real apiserver's CPU per LIST
# beside the sim's constants (bench/MODEL.md, "LIST cost against object count and size").
#
# Grid: POINTS of S:N (pod padding bytes : pods), seeded with `loadgen seed` (100 nodes,
# 10 namespaces). Points of one size that grow in N are seeded on top of each other (seed
# skips the pods already there, 409); a new size, or fewer pods, starts a fresh server (the
# real apiserver has no kubelet, so deleted bound pods would stay Terminating).
# At each point, after IDLE_SECONDS measuring the idle CPU rate, 4 variants, one loadgen run
# each, LISTs one at a time (--max-in-flight 1) at LIST_RATE for LIST_SECONDS:
#   consistent     LIST pods -A, resourceVersion unset (etcd)
#   rv0            LIST pods -A, resourceVersion=0 (watch cache)
#   consistent-sel the same with fieldSelector=spec.nodeName=<one seeded node> (1% of the pods)
#   rv0-sel        rv=0 with that selector (the cache's node-name index)
# Figures: LIST p50 and bytes per LIST from loadgen's summary.json; CPU seconds per LIST =
# (CPU over the run − idle rate × run time − a loadgen run's fixed cost, measured per point
# with one LIST of an empty namespace) / LISTs answered, where CPU is, for real,
# utime+stime of the kube-apiserver and etcd processes (/proc/PID/stat) and, for the sim,
# tollgate_sim_virtual_cpu_seconds_total{component="apiserver"|"etcd"} from /metrics.
#
# Takes ~6–7 minutes per target with the defaults. A benchmark, not a CI test. Loopback only;
# it stops exactly what it started (trap). Run it on a quiet machine.
#
# Environment:
#   TARGETS="real sim"   which to measure
#   POINTS="3300:2000 3300:5000 3300:10000 1000:5000 10000:5000"
#   VARIANTS="consistent rv0 consistent-sel rv0-sel"
#   LIST_RATE=30/min LIST_SECONDS=15 IDLE_SECONDS=5
#   NODES=100 NAMESPACES=10 SEL_NODE=loadgen-node-7
#   SIM_FLAGS=""         extra flags for the sim (e.g. "--model-set decode_per_byte=6e-9")
#   SIM_MEMORY_LIMIT=24Gi the sim's --memory-limit (the machine's memory, as the real one has)
#   SKIP_BUILD=1         use the existing target/release binaries
#   LOADGEN=, SIM=       other binaries to use (with SKIP_BUILD=1)
#   OUT=dir              keep the loadgen outputs, CPU figures and servers' logs there
#                        (default: a temp dir, removed)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
TOOLS=""
for d in "$ROOT/../shared/tools/kube-apiserver" /work/shared/tools/kube-apiserver; do
    [[ -x $d/start.sh ]] && { TOOLS=$(cd "$d" && pwd); break; }
done
TARGETS=${TARGETS:-real sim}
POINTS=${POINTS:-3300:2000 3300:5000 3300:10000 1000:5000 10000:5000}
VARIANTS=${VARIANTS:-consistent rv0 consistent-sel rv0-sel}
LIST_RATE=${LIST_RATE:-30/min}
LIST_SECONDS=${LIST_SECONDS:-15}
IDLE_SECONDS=${IDLE_SECONDS:-5}
NODES=${NODES:-100}
NAMESPACES=${NAMESPACES:-10}
SEL_NODE=${SEL_NODE:-loadgen-node-7}
SIM_FLAGS=${SIM_FLAGS:-}
SIM_MEMORY_LIMIT=${SIM_MEMORY_LIMIT:-24Gi}
LOADGEN=${LOADGEN:-$ROOT/target/release/loadgen}
SIM=${SIM:-$ROOT/target/release/tollgate-bench}
HZ=$(getconf CLK_TCK)

log() { echo "list-scaling: $*" >&2; }
die() { log "$*"; exit 1; }
# shellcheck source=bench/scripts/modeled-sim.sh
source "$(dirname "${BASH_SOURCE[0]}")/modeled-sim.sh"

if [[ -z "${SKIP_BUILD:-}" ]]; then
    (cd "$ROOT" && cargo build --release -p bench -p loadgen --bin tollgate-bench --bin loadgen) >&2
fi
[[ -x $LOADGEN && -x $SIM ]] || die "build target/release/{loadgen,tollgate-bench} first"

TMP=$(mktemp -d /tmp/list-scaling.XXXXXX)
OUT=${OUT:-$TMP/out}
mkdir -p "$OUT"
SIM_PID=""
REAL_RUN=""
cleanup() {
    [[ -n $SIM_PID ]] && kill "$SIM_PID" 2>/dev/null || true
    [[ -n $REAL_RUN ]] && "$TOOLS/stop.sh" "$REAL_RUN" >/dev/null 2>&1 || true
    [[ -z "${KEEP:-}" ]] && rm -rf "$TMP"
}
trap cleanup EXIT INT TERM

# "apiserver etcd" CPU seconds so far, of the running target.
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
real_cpu() { echo "$(ticks "$KUBE_APISERVER_PID") $(ticks "$ETCD_PID")" | awk -v hz="$HZ" '{printf "%.4f %.4f\n", $1 / hz, $2 / hz}'; }
sim_cpu() {
    curl -sf "$SIM_URL/metrics" | awk '
        /^tollgate_sim_virtual_cpu_seconds_total\{.*component="apiserver"/ {a = $NF}
        /^tollgate_sim_virtual_cpu_seconds_total\{.*component="etcd"/ {e = $NF}
        END {printf "%.6f %.6f\n", a, e}'
}
now() { date +%s.%N; }

start_real() { # $1 run dir
    [[ -x $TOOLS/start.sh ]] || die "no ../shared/tools/kube-apiserver/start.sh"
    REAL_RUN=$1
    "$TOOLS/start.sh" "$REAL_RUN" >/dev/null
    # shellcheck disable=SC1091
    source "$REAL_RUN/env"
    ETCD_PID=${KUBE_ETCD_PID:-$(awk '$1 == "etcd" {print $2}' "$REAL_RUN/pids")}
    KC=$REAL_RUN/kubeconfig
}
stop_real() {
    cp -r "$REAL_RUN/logs" "$OUT/real-logs-$(basename "$REAL_RUN")" 2>/dev/null || true
    "$TOOLS/stop.sh" "$REAL_RUN" >/dev/null 2>&1 || true
    REAL_RUN=""
}
start_sim() { # $1 tag
    start_modeled_sim "sim-$1"
    KC=$TMP/sim-$1.kubeconfig
    SIM_TAG=$1
}
stop_sim() {
    cp "$TMP/sim-$SIM_TAG.err" "$OUT/sim-$SIM_TAG.log" 2>/dev/null || true
    kill "$SIM_PID" 2>/dev/null || true
    wait "$SIM_PID" 2>/dev/null || true
    SIM_PID=""
}

seed() { # $1 pods, $2 pod bytes
    "$LOADGEN" seed --kubeconfig "$KC" --nodes "$NODES" --pods "$1" --pod-bytes "$2" \
        --namespaces "$NAMESPACES" >"$TMP/seed.log" 2>&1 || { cat "$TMP/seed.log" >&2; die "seeding failed"; }
}

# One point: idle rate, then each variant; writes OUT/TARGET-S-N-VARIANT/summary.json and .cpu
# ("apiserver_s etcd_s wall_s idle_apiserver_per_s idle_etcd_per_s overhead_apiserver_s overhead_etcd_s").
run_point() { # $1 target, $2 S, $3 N, $4 cpu function
    local target=$1 s=$2 n=$3 cpu=$4 v
    sleep 2
    local t0 c0 t1 c1
    t0=$(now); c0=$($cpu); sleep "$IDLE_SECONDS"; t1=$(now); c1=$($cpu)
    local idle over
    idle=$(echo "$t0 $c0 $t1 $c1" | awk '{d = $4 - $1; printf "%.6f %.6f\n", ($5 - $2) / d, ($6 - $3) / d}')
    # A loadgen run's own cost to the server (connection, TLS handshake, its first requests):
    # one LIST of an empty namespace from the cache, minus the idle rate; taken off each variant.
    t0=$(now); c0=$($cpu)
    "$LOADGEN" --kubeconfig "$KC" --duration 1s --no-progress --max-in-flight 1 --lists 1/min \
        --list-resource pods -n loadgen-empty --list-rv cache --output "$OUT/$target-$s-$n-overhead" \
        >"$OUT/$target-$s-$n-overhead.log" 2>&1 || log "$target: the overhead run failed (see $OUT/$target-$s-$n-overhead.log)"
    t1=$(now); c1=$($cpu)
    over=$(echo "$t0 $c0 $t1 $c1 $idle" | awk '{d = $4 - $1; printf "%.6f %.6f\n", $5 - $2 - $7 * d, $6 - $3 - $8 * d}')
    for v in $VARIANTS; do
        local dir=$OUT/$target-$s-$n-$v rv=consistent sel=()
        [[ $v == rv0* ]] && rv=cache
        [[ $v == *-sel ]] && sel=(--field-selector "spec.nodeName=$SEL_NODE")
        log "$target: S=$s N=$n $v (${LIST_SECONDS}s)"
        t0=$(now); c0=$($cpu)
        "$LOADGEN" --kubeconfig "$KC" --duration "${LIST_SECONDS}s" --no-progress --max-in-flight 1 \
            --lists "$LIST_RATE" --list-resource pods -A --list-rv "$rv" "${sel[@]}" \
            --timeout 120s --drain-timeout 120s --output "$dir" >"$dir.log" 2>&1 ||
            log "$target: loadgen exited non-zero at S=$s N=$n $v (see $dir.log)"
        t1=$(now); c1=$($cpu)
        echo "$t0 $c0 $t1 $c1 $idle $over" | awk '{printf "%.6f %.6f %.3f %s %s %s %s\n", $5 - $2, $6 - $3, $4 - $1, $7, $8, $9, $10}' >"$dir.cpu"
    done
}

for target in $TARGETS; do
    prev_s="" prev_n=0 k=0
    for p in $POINTS; do
        s=${p%%:*} n=${p##*:}
        if [[ $s != "$prev_s" || $n -lt $prev_n ]]; then
            k=$((k + 1))
            case $target in
            real) [[ -n $REAL_RUN ]] && stop_real; start_real "$TMP/kube-run-$k" ;;
            sim) [[ -n $SIM_PID ]] && stop_sim; start_sim "$k" ;;
            *) die "unknown target $target" ;;
            esac
        fi
        log "$target: seeding $NODES nodes, $n pods of $s bytes"
        st=$(now)
        seed "$n" "$s"
        log "$target: seeded in $(awk -v a="$st" -v b="$(now)" 'BEGIN {printf "%.0f", b - a}') s"
        case $target in
        real)
            run_point real "$s" "$n" real_cpu
            kill -0 "$KUBE_APISERVER_PID" 2>/dev/null || die "real: kube-apiserver exited at S=$s N=$n"
            ;;
        sim) run_point sim "$s" "$n" sim_cpu ;;
        esac
        prev_s=$s prev_n=$n
    done
    case $target in
    real) stop_real ;;
    sim) stop_sim ;;
    esac
done

python3 - "$OUT" "$POINTS" "$VARIANTS" "$TARGETS" "$ROOT/bench/MODEL.md" "$SIM_FLAGS" <<'EOF'
import json, os, re, sys
out, points, variants, targets, model_md, sim_flags = sys.argv[1:7]
points = [tuple(int(x) for x in p.split(":")) for p in points.split()]
variants, targets = variants.split(), targets.split()

def fig(target, s, n, v):
    base = os.path.join(out, f"{target}-{s}-{n}-{v}")
    p = os.path.join(base, "summary.json")
    if not os.path.exists(p) or not os.path.exists(base + ".cpu"):
        return None
    ops = [o for o in json.load(open(p))["operations"] if o["verb"].startswith("LIST")]
    if not ops or not ops[0].get("ok"):
        return None
    o = ops[0]
    api, etcd, wall, idle_api, idle_etcd, over_api, over_etcd = (float(x) for x in open(base + ".cpu").read().split())
    ok = o["ok"]
    return dict(p50=o["latency_ms"]["p50"] / 1000, lists=ok, errors=o.get("errors", 0),
                bytes=o["bytes"] / ok,
                api=max(api - idle_api * wall - max(over_api, 0), 0) / ok,
                etcd=max(etcd - idle_etcd * wall - max(over_etcd, 0), 0) / ok)

def f(v, unit=""):
    if v is None:
        return "—"
    if v >= 100:
        return f"{v:.0f}{unit}"
    return f"{v:.3g}{unit}"
def ms(v):
    return "—" if v is None else f(v * 1000, " ms")
def ratio(a, b):
    return "—" if a is None or b is None or not b else f"{a / b:.2f}"
g = lambda d, k: d[k] if d else None

print("| N pods | S bytes | variant | LIST p50 real / sim | apiserver CPU/LIST real / sim | etcd CPU/LIST real / sim | bytes/LIST | LISTs real, sim | sim/real: p50, apiserver CPU, etcd CPU |")
print("|---|---|---|---|---|---|---|---|---|")
figs = {}
for (s, n) in points:
    for v in variants:
        r = fig("real", s, n, v) if "real" in targets else None
        m = fig("sim", s, n, v) if "sim" in targets else None
        figs[(s, n, v)] = (r, m)
        b = g(r, "bytes") or g(m, "bytes")
        print(f"| {n} | {s} | {v} | {ms(g(r,'p50'))} / {ms(g(m,'p50'))} | {ms(g(r,'api'))} / {ms(g(m,'api'))} | "
              f"{ms(g(r,'etcd'))} / {ms(g(m,'etcd'))} | {f(b / 1e6 if b else None, ' MB')} | "
              f"{g(r,'lists') or '—'}, {g(m,'lists') or '—'} | "
              f"{ratio(g(m,'p50'), g(r,'p50'))}, {ratio(g(m,'api'), g(r,'api'))}, {ratio(g(m,'etcd'), g(r,'etcd'))} |")

# The sim's constants: the defaults in MODEL.md's table, with SIM_FLAGS' --model-set on top.
c = {}
for line in open(model_md):
    mm = re.match(r"\|\s*`(\w+)`\s*\|\s*([0-9.e+-]+)\s*\|", line)
    if mm:
        c[mm.group(1)] = float(mm.group(2))
for mm in re.finditer(r"--model-set[ =](\w+)=([0-9.e+-]+)", sim_flags):
    c[mm.group(1)] = float(mm.group(2))

def fit(rows):
    """Least squares y = a*x1 + b*x2 (no intercept); rows of (x1, x2, y)."""
    s11 = sum(x1 * x1 for x1, _, _ in rows); s12 = sum(x1 * x2 for x1, x2, _ in rows)
    s22 = sum(x2 * x2 for _, x2, _ in rows)
    t1 = sum(x1 * y for x1, _, y in rows); t2 = sum(x2 * y for _, x2, y in rows)
    det = s11 * s22 - s12 * s12
    if len(rows) < 2 or not det:
        return None
    a, b = (t1 * s22 - t2 * s12) / det, (s11 * t2 - s12 * t1) / det
    res = [y - a * x1 - b * x2 for x1, x2, y in rows]
    worst = max(abs(e) / y for e, (_, _, y) in zip(res, rows) if y)
    return a, b, worst

def rows(target, v, key):
    # objects and bytes: every pod and the whole LIST's bytes (a full LIST's response).
    out_rows = []
    for (s, n) in points:
        d = figs.get((s, n, v), (None, None))[0 if target == "real" else 1]
        if d and d[key] is not None:
            out_rows.append((n, d["bytes"], d[key]))
    return out_rows

def sci(v):
    return f"{v:.2e}"
get = lambda *k: sum(c.get(x, float("nan")) for x in k)
specs = [
    ("apiserver CPU per consistent LIST", "consistent", "api",
     get("decode_per_object", "selector_per_object"), "decode_per_object + selector_per_object",
     get("decode_per_byte", "encode_per_byte"), "decode_per_byte + encode_per_byte"),
    ("apiserver CPU per rv=0 LIST", "rv0", "api",
     get("cache_per_object", "selector_per_object"), "cache_per_object + selector_per_object",
     get("encode_per_byte"), "encode_per_byte"),
    ("etcd CPU per consistent LIST", "consistent", "etcd",
     get("etcd_range_per_key"), "etcd_range_per_key",
     get("etcd_range_per_byte"), "etcd_range_per_byte"),
]
print()
print("Least-squares fit, CPU seconds per LIST = a·objects + b·bytes (bytes of the LIST's JSON response), over the points above:")
print()
print("| what | real a (s/object) | real b (s/byte) | worst residual | sim a, b (fit of the sim's figures) | sim constants a | sim constants b | real / constants: a, b |")
print("|---|---|---|---|---|---|---|---|")
for label, v, key, ca, cna, cb, cnb in specs:
    fr = fit(rows("real", v, key)) if "real" in targets else None
    fm = fit(rows("sim", v, key)) if "sim" in targets else None
    print(f"| {label} | {sci(fr[0]) if fr else '—'} | {sci(fr[1]) if fr else '—'} | "
          f"{f'{fr[2] * 100:.0f}%' if fr else '—'} | {f'{sci(fm[0])}, {sci(fm[1])}' if fm else '—'} | "
          f"{sci(ca)} ({cna}) | {sci(cb)} ({cnb}) | "
          f"{ratio(fr and fr[0], ca)}, {ratio(fr and fr[1], cb)} |")
for t in targets:
    for (s, n) in points:
        for v in variants:
            d = figs[(s, n, v)][0 if t == "real" else 1]
            if d is None:
                print(f"\n{t} S={s} N={n} {v}: no figures")
            elif d["errors"]:
                print(f"\n{t} S={s} N={n} {v}: {d['errors']} LIST errors")
EOF
