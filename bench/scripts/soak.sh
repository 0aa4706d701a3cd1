#!/usr/bin/env bash
# Soak (issue 20): tollgate for an hour or more at steady mixed load against the simulated
# apiserver, sampling its memory, file descriptors, runtime tasks and connections every 10 s;
# the goal is RSS and fds within ±10% of their value at 10 minutes, with no growth trend.
#
# The load, all through one tollgate in enforce mode with its defaults (the adaptive budget):
#   nodes   NODES simulated nodes: status PATCH every HEARTBEAT, lease renewal every 10 s, and
#           DAEMONS informer-like daemons per node whose watches the server ends every 30 s, so
#           watches reconnect (LIST rv=0, then WATCH) all the time;
#   storm   LISTS consistent LISTs of all pods per minute from another client, more than the
#           budget lets through at once (so some are queued and some get 429), and GETS small
#           GETs per second.
# TLS on both sides, with client certificates and a front-proxy certificate (made here with openssl),
# as tollgate is deployed; tollgate runs with the limits it ships with.
# Writes the section "tollgate soak (issue 20)" of bench/RESULTS.md and prints it. A benchmark,
# not a CI test. Loopback only; everything it starts is killed by pid on exit (an interrupted run
# still reports what it sampled).
#
# Environment:
#   SKIP_BUILD=1      use the existing release binaries (no cargo build)
#   BIN_DIR=dir       where the release binaries are (default target/release)
#   SOAK_SECONDS=3660 how long the load runs
#   NODES=100  HEARTBEAT=5s  DAEMONS=2  PODS=3000  POD_BYTES=2048  LISTS=60  GETS=20
#   RESULTS=path      where to write the results (default bench/RESULTS.md; "-" prints only)
#   SOAK_REPORT=dir   write the figures of a run kept with KEEP_TMP=1 again, without running
set -euo pipefail

BENCH=soak
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source=lib.sh
source "$ROOT/bench/scripts/lib.sh"

SOAK_SECONDS=${SOAK_SECONDS:-3660}
NODES=${NODES:-100}
HEARTBEAT=${HEARTBEAT:-5s}
DAEMONS=${DAEMONS:-2}
PODS=${PODS:-3000}
POD_BYTES=${POD_BYTES:-2048}
LISTS=${LISTS:-60}
GETS=${GETS:-20}
SAMPLE_SECONDS=10
RESULTS=${RESULTS:-$ROOT/bench/RESULTS.md}
COMMAND="bench/scripts/soak.sh"
[[ $SOAK_SECONDS == 3660 ]] || COMMAND="SOAK_SECONDS=$SOAK_SECONDS $COMMAND"

# The figures of a finished run's kept directory (KEEP_TMP=1), written again: SOAK_REPORT=dir.
if [[ -n ${SOAK_REPORT:-} ]]; then
    TMP=$SOAK_REPORT
    [[ -f $TMP/run.env ]] || die "$TMP/run.env is missing: not a soak directory kept with KEEP_TMP=1"
    # shellcheck disable=SC1091
    . "$TMP/run.env"
else
for tool in curl python3 openssl; do
    command -v "$tool" >/dev/null || die "$tool is missing"
done
release_binaries
bench_init
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
STARTED=$(date -u '+%Y-%m-%d %H:%M')

# The deployed shape: TLS on both sides, clients known by their certificates (the nodes as
# system:node:*, the storm as a user of its own), tollgate forwarding identity with a front-proxy
# certificate. A CA signs a certificate: cert NAME SUBJECT EXTENSION.
PKI=$TMP/pki
mkdir -p "$PKI"
ca() { # ca NAME
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
        -keyout "$PKI/$1.key" -out "$PKI/$1.crt" -subj "/CN=$1" 2>/dev/null
}
cert() { # cert CA NAME SUBJECT
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$PKI/$2.key" \
        -out "$PKI/$2.csr" -subj "$3" 2>/dev/null
    openssl x509 -req -in "$PKI/$2.csr" -CA "$PKI/$1.crt" -CAkey "$PKI/$1.key" -CAcreateserial \
        -days 2 -out "$PKI/$2.crt" -extfile <(echo "extendedKeyUsage=clientAuth") 2>/dev/null
}
ca client-ca
ca front-proxy-ca
cert client-ca nodes "/O=system:nodes/CN=system:node:soak"
cert client-ca storm "/CN=soak-storm"
cert client-ca tollgate "/O=system:masters/CN=tollgate"
cert front-proxy-ca front-proxy "/CN=front-proxy-client"

"$SIM_BIN" sim --listen 127.0.0.1:0 --nodes 0 --pods "$PODS" --pod-bytes "$POD_BYTES" \
    --tls --cert-dir "$PKI/sim" --client-ca-file "$PKI/client-ca.crt" \
    --requestheader-client-ca-file "$PKI/front-proxy-ca.crt" \
    --requestheader-allowed-names front-proxy-client \
    >"$TMP/sim.out" 2>"$TMP/sim.log" &
SIM_PID=$!
PIDS+=("$SIM_PID")
URL=$(wait_line "$TMP/sim.out" "serving the Kubernetes API at " "$SIM_PID" "the sim")

# Its serving certificate is the simulator's (issued for 127.0.0.1 by the simulator's CA).
"$TOLLGATE_BIN" --mode enforce --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0 --upstream "$URL" \
    --upstream-ca "$PKI/sim/ca.crt" --tls-cert-file "$PKI/sim/apiserver.crt" \
    --tls-private-key-file "$PKI/sim/apiserver.key" --client-ca-file "$PKI/client-ca.crt" \
    --front-proxy-cert "$PKI/front-proxy.crt" --front-proxy-key "$PKI/front-proxy.key" \
    --upstream-client-cert "$PKI/tollgate.crt" --upstream-client-key "$PKI/tollgate.key" \
    --requestheader-username-headers X-Remote-User --requestheader-group-headers X-Remote-Group \
    --requestheader-extra-headers-prefix X-Remote-Extra- --requestheader-uid-headers X-Remote-Uid \
    >"$TMP/tollgate.out" 2>"$TMP/tollgate.log" &
TG_PID=$!
PIDS+=("$TG_PID")
wait_tollgate "$TMP/tollgate.out" "$TG_PID"
TARGET=$TG_TARGET ADMIN=$TG_ADMIN
log "sim $URL, tollgate $TARGET (admin $ADMIN), $SOAK_SECONDS s from $STARTED UTC"

# Every 10 s: seconds, RSS kB, fds, threads, then tollgate's own gauges.
sample() {
    local t0=$1 now rss fds threads m
    while kill -0 "$TG_PID" 2>/dev/null; do
        now=$(($(date +%s) - t0))
        rss=$(awk '/^VmRSS/ {print $2}' "/proc/$TG_PID/status" 2>/dev/null || echo "")
        threads=$(awk '/^Threads/ {print $2}' "/proc/$TG_PID/status" 2>/dev/null || echo "")
        fds=$(find "/proc/$TG_PID/fd" -mindepth 1 -maxdepth 1 2>/dev/null | wc -l)
        m=$(curl -s -m 5 "$ADMIN/metrics" | awk '
            /^tollgate_runtime_alive_tasks / {t=$2}
            /^tollgate_open_connections\{listener="client"\} / {c=$2}
            /^tollgate_inflight_requests / {i=$2}
            /^tollgate_patterns / {p=$2}
            END {printf "%s,%s,%s,%s", t, c, i, p}')
        echo "$now,$rss,$fds,$threads,$m"
        sleep "$SAMPLE_SECONDS"
    done
}
echo "second,rss_kb,fds,threads,tasks,client_connections,inflight,patterns" >"$TMP/samples.csv"
T0=$(date +%s)
sample "$T0" >>"$TMP/samples.csv" &
SAMPLER=$!
PIDS+=("$SAMPLER")

"$LOADGEN_BIN" --server "$TARGET" --duration "${SOAK_SECONDS}s" --no-progress \
    --certificate-authority "$PKI/sim/ca.crt" --client-certificate "$PKI/nodes.crt" \
    --client-key "$PKI/nodes.key" --nodes "$NODES" --heartbeat "$HEARTBEAT" --lease-renew 10s --daemons-per-node "$DAEMONS" \
    --daemon-watch-timeout 30s --timeout 30s --output "$TMP/nodes" \
    >"$TMP/nodes.out" 2>"$TMP/nodes.log" &
NODES_PID=$!
PIDS+=("$NODES_PID")
"$LOADGEN_BIN" --server "$TARGET" --duration "${SOAK_SECONDS}s" --no-progress \
    --certificate-authority "$PKI/sim/ca.crt" --client-certificate "$PKI/storm.crt" \
    --client-key "$PKI/storm.key" --lists "$LISTS/min" -A --list-rv consistent --gets "$GETS/s" --get-resource nodes --objects "$NODES" \
    --timeout 60s --output "$TMP/storm" >"$TMP/storm.out" 2>"$TMP/storm.log" &
STORM_PID=$!
PIDS+=("$STORM_PID")

# An interrupted soak stops the load (loadgen writes its results on SIGINT) and still reports.
stop_load() {
    kill -INT "$NODES_PID" "$STORM_PID" 2>/dev/null || true
}
trap 'stop_load' INT TERM
wait "$NODES_PID" || log "the nodes loadgen ended with an error; see $TMP/nodes.log"
wait "$STORM_PID" || log "the storm loadgen ended with an error; see $TMP/storm.log"
trap 'exit 130' INT TERM
ELAPSED=$(($(date +%s) - T0))
kill "$SAMPLER" 2>/dev/null || true
wait "$SAMPLER" 2>/dev/null || true
curl -s -m 5 "$ADMIN/metrics" >"$TMP/tollgate.metrics" || true
LOAD_AFTER=$(cut -d' ' -f1-3 /proc/loadavg)
for v in COMMAND STARTED ELAPSED LOAD_BEFORE LOAD_AFTER SOAK_SECONDS NODES HEARTBEAT DAEMONS PODS \
    POD_BYTES LISTS GETS BIN_DIR; do
    printf '%s=%q\n' "$v" "${!v}"
done >"$TMP/run.env"
fi

SECTION=$(python3 - "$TMP" "$COMMAND" "$STARTED" "$ELAPSED" "$LOAD_BEFORE" "$LOAD_AFTER" \
    "$NODES" "$HEARTBEAT" "$DAEMONS" "$PODS" "$POD_BYTES" "$LISTS" "$GETS" "${BIN_DIR#"$ROOT"/}" \
    "$SOAK_SECONDS" <<'PY'
import csv, json, os, sys
(tmp, command, started, elapsed, load_before, load_after,
 nodes, heartbeat, daemons, pods, pod_bytes, lists, gets, bin_dir, load_seconds) = sys.argv[1:]
elapsed = int(elapsed)
load_seconds = int(load_seconds)
rows = []
with open(os.path.join(tmp, "samples.csv")) as f:
    for r in csv.DictReader(f):
        try:
            rows.append({k: float(v) for k, v in r.items() if v not in ("", None)})
        except ValueError:
            continue
# Only while the load ran: the drain after it closes connections and ends tasks.
rows = [r for r in rows if "rss_kb" in r and "fds" in r and r["second"] <= load_seconds]

def at(second):
    return min(rows, key=lambda r: abs(r["second"] - second)) if rows else None

def slope_per_hour(key, since):
    pts = [(r["second"], r[key]) for r in rows if r["second"] >= since and key in r]
    if len(pts) < 3:
        return None
    n = len(pts)
    mx = sum(p[0] for p in pts) / n
    my = sum(p[1] for p in pts) / n
    var = sum((p[0] - mx) ** 2 for p in pts)
    return None if var == 0 else sum((p[0] - mx) * (p[1] - my) for p in pts) / var * 3600

ref_second = 600
tracked = [("rss_kb", "RSS", lambda v: f"{v / 1024:.1f} MB"), ("fds", "open fds", lambda v: f"{v:.0f}"),
           ("tasks", "runtime tasks", lambda v: f"{v:.0f}"), ("threads", "threads", lambda v: f"{v:.0f}")]
ref = at(ref_second)
last = rows[-1] if rows else None
table = ["| figure | at 10 min | min after | max after | at the load's end | max deviation from 10 min | trend after 10 min, per hour |",
         "|---|---|---|---|---|---|---|"]
verdicts = []
for key, name, fmt in tracked:
    if ref is None or key not in ref or last is None or last["second"] < ref_second:
        table.append(f"| {name} | — | — | — | — | — | — |")
        continue
    after = [r[key] for r in rows if r["second"] >= ref_second and key in r]
    base = ref[key]
    dev = max(abs(v - base) for v in after) / base * 100 if base else 0.0
    s = slope_per_hour(key, ref_second)
    trend = "—" if s is None else (f"{s / base * 100:+.1f}%" if base else f"{s:+.1f}")
    table.append(f"| {name} | {fmt(base)} | {fmt(min(after))} | {fmt(max(after))} | {fmt(last[key])} | {dev:.1f}% | {trend} |")
    if key in ("rss_kb", "fds"):
        verdicts.append((name, dev, s / base * 100 if (s is not None and base) else None))

# Each 10-minute window: RSS and tasks (median, least, most), to tell a trend from a burst.
nwin = max(1, (load_seconds + 599) // 600)
per_window = ["| | " + " | ".join(f"{w * 10}-{w * 10 + 10} min" for w in range(nwin)) + " |", "|---|" + "---|" * nwin]
for key, name, scale in (("rss_kb", "RSS MB (median, least-most)", 1024.0), ("tasks", "tasks (median, least-most)", 1.0)):
    cells = []
    for w in range(nwin):
        v = sorted(r[key] / scale for r in rows if w * 600 <= r["second"] < (w + 1) * 600 and key in r)
        cells.append(f"{v[len(v) // 2]:.{1 if scale > 1 else 0}f} ({v[0]:.{1 if scale > 1 else 0}f}-{v[-1]:.{1 if scale > 1 else 0}f})" if v else "—")
    per_window.append(f"| {name} | " + " | ".join(cells) + " |")

# Each 10-minute window: the load's per-second p99s (the median and the largest second), per operation.
def windows(path):
    out = {}
    try:
        with open(path) as f:
            for r in csv.DictReader(f):
                op, sec = r["operation"], int(r["second"])
                if int(r["completed"]) == 0:
                    continue
                out.setdefault(op, {}).setdefault(sec // 600, []).append(float(r["p99_ms"]))
    except (OSError, KeyError, ValueError):
        pass
    return out

def summary(name):
    try:
        with open(os.path.join(tmp, name, "summary.json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}

lat = ["| operation | " + " | ".join(f"{w * 10}-{w * 10 + 10} min" for w in range(max(1, (load_seconds + 599) // 600))) + " |",
       "|---|" + "---|" * max(1, (load_seconds + 599) // 600)]
for load in ("nodes", "storm"):
    for op, ws in sorted(windows(os.path.join(tmp, load, "timeseries.csv")).items()):
        cells = []
        for w in range(max(1, (load_seconds + 599) // 600)):
            v = sorted(ws.get(w, []))
            cells.append(f"{v[len(v) // 2]:.1f} / {v[-1]:.0f}" if v else "—")
        lat.append(f"| {load}: {op} | " + " | ".join(cells) + " |")

totals = ["| load | operation | requests | ok | 429 | other errors | p50 ms | p99 ms |", "|---|---|---|---|---|---|---|---|"]
for load in ("nodes", "storm"):
    ops = summary(load).get("operations", {})
    items = [(o.get("name", "?"), o) for o in ops]
    for op, o in sorted(items, key=lambda x: x[0]):
        lt = o.get("latency_ms", o.get("latency", {})) or {}
        if not o.get("requests"):
            continue
        codes = o.get("status_codes", {})
        totals.append(f"| {load} | {op} | {o['requests']} | {o.get('ok', '—')} | {codes.get('429', 0)} "
                      f"| {o.get('errors', 0) - codes.get('429', 0)} | {lt.get('p50', '—')} | {lt.get('p99', '—')} |")

lines = [f"## tollgate soak (issue 20)", "",
         f"tollgate (`--mode enforce`, every other setting its default; binaries of {bin_dir}) in front of `tollgate-bench sim`",
         f"({pods} pods of +{pod_bytes} bytes; TLS on both sides, clients known by their certificates, identity forwarded with a front-proxy certificate) for {load_seconds} s from {started} UTC, at steady mixed load: {nodes} simulated",
         f"nodes (status PATCH every {heartbeat}, lease renewal every 10 s, {daemons} informer-like daemons per node",
         f"whose watches the server ends every 30 s, so they re-LIST and re-watch all the time) and, from another",
         f"client, {lists} consistent LISTs of all pods per minute and {gets} GETs/s. Sampled every 10 s from /proc and",
         f"tollgate's `/metrics`. Load average {load_before} before, {load_after} after (the machine was shared).", "",
         f"Command: `{command}`", "", *table, ""]
for name, dev, trend in verdicts:
    ok = dev <= 10 and (trend is None or abs(trend) <= 10)
    lines.append(f"- {name}: max deviation {dev:.1f}% from its value at 10 min, trend "
                 f"{'—' if trend is None else f'{trend:+.1f}% per hour'}: {'**met**' if ok else '**not met**'} (goal ±10%, no growth)")
lines += ["", "Per 10-minute window:", "", *per_window]
lines += ["", "Per-second p99 latency through tollgate, ms (median second / worst second) per 10-minute window:", "", *lat,
          "", "The whole run, from loadgen's summaries:", "", *totals]
print("\n".join(lines))
PY
)
if [[ $RESULTS == - ]]; then
    echo "$SECTION"
else
    write_section "$RESULTS" "$SECTION"
    echo "$SECTION"
fi
