#!/usr/bin/env bash
# The heartbeat baseline (issue 32, item 6): how much of the heartbeats' tail with no LISTs at all
# is tollgate's own (a fresh process's connections and first requests, its scheduling) and how
# much is the apiserver's, on one real apiserver, interleaved so both see the same machine.
#
# One apiserver (seeded like the matrix: REAL_PODS pods, REAL_NODES nodes), then ROUNDS rounds of,
# per path in VIAS:
#   direct            a fresh loadgen straight to the apiserver;
#   enforce           a fresh tollgate with --mode enforce (the goodput and matrix runs' setting);
#   default           a fresh tollgate with no mode given (dryRun: what a rollout starts with);
# each measured twice back to back: "cold" (the first RUN_SECONDS of a fresh tollgate and fresh
# loadgen connections) and "warm" (the next RUN_SECONDS: the same tollgate, new loadgen). Cold minus
# warm is the start's part; warm through tollgate minus warm direct is tollgate's steady part. The
# heartbeats: REAL_PATCH node-status PATCHes over REAL_NODES nodes, the admin certificate.
#
# Output: per path and phase, the median over rounds of p50, p99 and max, and the worst p99; the
# first second's max (connection set-up). Printed, and written to RESULTS (default
# bench/RESULTS.md) as "The heartbeat baseline (issue 32)" unless RESULTS=-. A benchmark: run on a
# quiet machine (~ROUNDS x VIAS x 2 x RUN_SECONDS, 9 min by default). Loopback only; everything
# started is stopped by pid.
#
# Environment: KUBE=1.20|current ROUNDS=3 RUN_SECONDS=30 VIAS="direct enforce default"
#   REAL_PODS=10000 REAL_POD_BYTES=900 REAL_NODES=200 REAL_PATCH=20/s SKIP_BUILD=1 RESULTS=path|-
set -euo pipefail

BENCH=baseline
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source=lib.sh
source "$ROOT/bench/scripts/lib.sh"

COMMAND="bench/scripts/baseline.sh"
for v in KUBE ROUNDS RUN_SECONDS VIAS REAL_PODS REAL_POD_BYTES REAL_NODES REAL_PATCH; do
    [[ -n "${!v+x}" ]] && COMMAND="$v=\"${!v}\" $COMMAND"
done
KUBE=${KUBE:-1.20}
ROUNDS=${ROUNDS:-3}
RUN_SECONDS=${RUN_SECONDS:-30}
VIAS=${VIAS:-direct enforce default}
REAL_PODS=${REAL_PODS:-10000}
REAL_POD_BYTES=${REAL_POD_BYTES:-900}
REAL_NODES=${REAL_NODES:-200}
REAL_PATCH=${REAL_PATCH:-20/s}
RESULTS=${RESULTS:-$ROOT/bench/RESULTS.md}
kube_tools
for v in $VIAS; do [[ $v == direct || $v == enforce || $v == default ]] || die "VIAS: unknown path $v (direct, enforce, default)"; done

NEED_SIM=0
release_binaries
bench_init
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
"$KUBE_INSTALL" >&2

K=$TMP/kube
"$KUBE_START" "$K" >"$TMP/url" 2>"$TMP/kube-start.log" || { cat "$TMP/kube-start.log" >&2; die "kube-apiserver did not start"; }
# Stopped on exit with the rest (the trap kills PIDS; the apiserver has its own stop script).
trap '"$KUBE_STOP" "$K" >/dev/null 2>&1 || true; bench_cleanup' EXIT
# shellcheck disable=SC1091
. "$K/env"
URL=$KUBE_APISERVER_URL
real_tls_args
VERSION=$(curl -s -m 5 --cacert "$KUBE_CA_CERT" --cert "$KUBE_ADMIN_CERT" --key "$KUBE_ADMIN_KEY" "$URL/version" |
    grep -o '"gitVersion": *"[^"]*"' | cut -d'"' -f4)
log "kube-apiserver $VERSION at $URL; seeding $REAL_PODS pods and $REAL_NODES nodes"
"$LOADGEN_BIN" seed --kubeconfig "$KUBECONFIG" --nodes "$REAL_NODES" --pods "$REAL_PODS" \
    --pod-bytes "$REAL_POD_BYTES" --concurrency 32 >"$TMP/seed.log" 2>&1 || die "loadgen seed failed; see $TMP/seed.log"

# heartbeats TARGET OUT: one loadgen run of RUN_SECONDS of node-status PATCHes.
heartbeats() {
    "$LOADGEN_BIN" --server "$1" --duration "${RUN_SECONDS}s" --no-progress --certificate-authority "$KUBE_CA_CERT" \
        --client-certificate "$KUBE_ADMIN_CERT" --client-key "$KUBE_ADMIN_KEY" --patches "$REAL_PATCH" \
        --patch-target node-status --objects "$REAL_NODES" --timeout 30s --output "$2" >"$2.out" 2>&1 ||
        log "the heartbeats to $1 failed; see $2.out"
}

# A first direct run, not counted: the seed's writes are still being digested.
heartbeats "$URL" "$TMP/settle"
for round in $(seq "$ROUNDS"); do
    for via in $VIAS; do
        d=$TMP/$round-$via
        mkdir -p "$d"
        target=$URL tg=""
        if [[ $via != direct ]]; then
            mode=()
            [[ $via == enforce ]] && mode=(--mode enforce)
            "$TOLLGATE_BIN" "${mode[@]}" --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0 --upstream "$URL" \
                "${REAL_TLS_ARGS[@]}" >"$d/tollgate.out" 2>"$d/tollgate.log" &
            tg=$!
            PIDS+=("$tg")
            wait_tollgate "$d/tollgate.out" "$tg"
            target=$TG_TARGET admin=$TG_ADMIN
        fi
        log "round $round: $via ($(date -u +%H:%M:%S))"
        heartbeats "$target" "$d/cold"
        heartbeats "$target" "$d/warm"
        if [[ -n $tg ]]; then kill "$tg" 2>/dev/null || true; wait "$tg" 2>/dev/null || true; fi
    done
done
LOAD_AFTER=$(cut -d' ' -f1-3 /proc/loadavg)

section=$(python3 - "$TMP" "$ROUNDS" "$VIAS" "$VERSION" "$COMMAND" "$LOAD_BEFORE" "$LOAD_AFTER" "$REAL_PATCH" "$RUN_SECONDS" <<'PY'
import csv, json, os, statistics, sys, time
tmp, rounds, vias, version, command, load0, load1, patch, secs = sys.argv[1:]
def figures(d):
    try:
        s = json.load(open(os.path.join(d, "summary.json")))
    except OSError:
        return None
    op = {o["name"]: o for o in s["operations"]}.get("patch", {})
    lat = op.get("latency_ms", {})
    bad = op.get("requests", 0) - sum(n for c, n in op.get("status_codes", {}).items() if c.startswith("2"))
    first = None
    try:
        for row in csv.DictReader(open(os.path.join(d, "timeseries.csv"))):
            if row["operation"] == "patch" and row["second"] == "0":
                first = float(row["max_ms"])
    except OSError:
        pass
    return dict(p50=lat.get("p50"), p99=lat.get("p99"), max=lat.get("max"), first=first, bad=bad)
med = lambda v: statistics.median(v) if v else float("nan")
names = {"direct": "direct", "enforce": "tollgate `--mode enforce`", "default": "tollgate, default mode (dryRun)"}
out = ["## The heartbeat baseline (issue 32)", "",
       f"Heartbeats alone ({patch} node-status PATCHes, no LISTs) on one kube-apiserver {version}, each path",
       f"{rounds} times, interleaved: **cold** = the first {secs} s of a fresh tollgate and fresh client",
       f"connections, **warm** = the next {secs} s through the same tollgate. Medians over the rounds.",
       f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; load average {load0} before, {load1} after.", "",
       f"Command: `{command}`", "",
       "| path | phase | p50 ms | p99 ms (median) | p99 ms (worst) | max ms (median) | first second's max ms | failed |",
       "|---|---|---|---|---|---|---|---|"]
for via in vias.split():
    for phase in ("cold", "warm"):
        fs = [f for f in (figures(os.path.join(tmp, f"{r}-{via}", phase)) for r in range(1, int(rounds) + 1)) if f]
        if not fs:
            continue
        def col(k):
            return [f[k] for f in fs if f[k] is not None]
        out.append(f"| {names[via]} | {phase} | {med(col('p50')):.1f} | {med(col('p99')):.1f} | {max(col('p99')):.1f} | "
                   f"{med(col('max')):.1f} | {med(col('first')):.1f} | {sum(col('bad'))} |")
print("\n".join(out))
PY
)
echo "$section"
if [[ $RESULTS != - ]]; then
    write_section "$RESULTS" "$section"
    log "written to $RESULTS"
fi
