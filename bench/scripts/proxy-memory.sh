#!/usr/bin/env bash
# Memory of tollgate under the two loads that break buffering proxies (issue 3, benchmarks):
#   slow    50 concurrent 200 MB downloads to clients reading at SLOW_RATE each (curl
#           --limit-rate), upstream nginx serving the file at full speed: a proxy that does not
#           apply backpressure buffers what the client has not read yet. Target: RSS < 100 MB.
#           minproxy (bench/src/bin/minproxy.rs, a hyper proxy doing no work) runs the same
#           load for reference.
#   watches WATCHES idle watches over HTTP/2 with TLS, as client-go opens them (many streams per
#           connection), through tollgate to the simulated apiserver (TLS, 250 streams per
#           connection, so tollgate needs WATCHES/250 upstream connections). Driven by loadgen.
#           Target: RSS < 200 MB.
# RSS is the peak of VmRSS sampled every 100 ms while the load is fully in place, and VmHWM
# (reset with clear_refs just before the load starts). The open-file limit is raised here, in
# the benchmark, not in tollgate's defaults.
# Writes the section "tollgate memory (issue 3)" of bench/RESULTS.md and prints it.
# A benchmark, not a CI test. Loopback only; everything it starts is killed by pid on exit.
#
# Environment:
#   SKIP_BUILD=1     use the existing release binaries (no cargo build)
#   BIN_DIR=dir      where the release binaries are (default target/release)
#   SLOW_CLIENTS=50  concurrent slow downloads
#   SLOW_RATE=2M     curl --limit-rate of each
#   HOLD=15          seconds the full load is held and sampled
#   WATCHES=10000    idle watches
#   MODE=off         tollgate's --mode (issue 3 measures forwarding without enforcement)
#   RESULTS=path     where to write the results (default bench/RESULTS.md; "-" prints only)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
SLOW_CLIENTS=${SLOW_CLIENTS:-50}
SLOW_RATE=${SLOW_RATE:-2M}
HOLD=${HOLD:-15}
WATCHES=${WATCHES:-10000}
RESULTS=${RESULTS:-$ROOT/bench/RESULTS.md}
MODE=${MODE:-off}
BIG_BYTES=$((200 * 1024 * 1024))
SLOW_TARGET_MB=100
WATCH_TARGET_MB=200

BENCH=proxy-memory
# shellcheck source=lib.sh
source "$ROOT/bench/scripts/lib.sh"

for tool in curl awk python3; do
    command -v "$tool" >/dev/null || die "$tool is missing"
done
NGINX=$(command -v nginx || echo /usr/sbin/nginx)
[[ -x "$NGINX" ]] || die "nginx is missing (apt-get install -y nginx-light)"
# Each watch is a stream, not a socket, but each slow client and each proxy side is one.
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"
bench_init

if [[ -z "${SKIP_BUILD:-}" ]]; then
    log "building release binaries (tollgate, minproxy, tollgate-bench, loadgen)…"
    (cd "$ROOT" && cargo build --release -q -p tollgate -p bench -p loadgen)
fi
BIN_DIR=${BIN_DIR:-$ROOT/target/release}
for b in tollgate minproxy tollgate-bench loadgen; do
    [[ -x "$BIN_DIR/$b" ]] || die "$BIN_DIR/$b is missing: run without SKIP_BUILD"
done

# Peak VmRSS (KiB) of PID, sampled every 100 ms for SECONDS, combined with VmHWM; the HWM
# is reset first so it covers only this window.
peak_rss() { # peak_rss PID SECONDS
    local pid=$1 end peak=0 r
    echo 5 >"/proc/$pid/clear_refs" 2>/dev/null || true
    end=$((SECONDS + $2))
    while ((SECONDS < end)); do
        r=$(rss_kb "$pid")
        ((r > peak)) && peak=$r
        sleep 0.1
    done
    r=$(hwm_kb "$pid")
    ((r > peak)) && peak=$r
    echo "$peak"
}
metric() { # metric ADMIN_URL NAME -> summed value
    curl -s "$1/metrics" | awk -v n="$2" '$1 == n || index($1, n "{") == 1 {s += $2} END {printf "%d", s}'
}

# --- part 1: slow clients -------------------------------------------------------------------
chmod 755 "$TMP"
mkdir -p "$TMP/www"
truncate -s "$BIG_BYTES" "$TMP/www/big.bin"
echo '{}' >"$TMP/www/healthz"
chmod 644 "$TMP/www/big.bin" "$TMP/www/healthz"
UP_PORT=$(free_port)
nginx_conf "$TMP/up" "$UP_PORT" "root $TMP/www; location / { }" "sendfile on; tcp_nopush on;"
"$NGINX" -p "$TMP/up" -c "$TMP/up/nginx.conf" >"$TMP/up/logs/stdout" 2>&1 &
PIDS+=($!)
UPSTREAM=http://127.0.0.1:$UP_PORT
wait_http "$UPSTREAM/healthz" "${PIDS[-1]}" "upstream nginx"

declare -A URL PID BASE PEAK ALIVE
"$BIN_DIR/minproxy" --listen 127.0.0.1:0 --upstream "$UPSTREAM" >"$TMP/minproxy.out" 2>&1 &
PIDS+=($!)
PID[minproxy]=${PIDS[-1]}
URL[minproxy]=$(wait_line "$TMP/minproxy.out" "minproxy serving at " "${PID[minproxy]}" minproxy)

cat >"$TMP/tollgate-slow.yaml" <<EOF
upstream:
  healthCheck: {enabled: true, path: /healthz, intervalSeconds: 5, timeoutSeconds: 2}
  metricsScrape: {enabled: false}
EOF
"$BIN_DIR/tollgate" --mode "$MODE" --config "$TMP/tollgate-slow.yaml" --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0 \
    --upstream "$UPSTREAM" >"$TMP/tollgate-slow.out" 2>"$TMP/tollgate-slow.err" &
PIDS+=($!)
PID[tollgate]=${PIDS[-1]}
URL[tollgate]=$(wait_line "$TMP/tollgate-slow.out" "tollgate serving at " "${PID[tollgate]}" tollgate)

slow_round() { # slow_round PROXY
    local p=$1 i curls=() alive=0 c
    wait_http "${URL[$p]}/healthz" "${PID[$p]}" "$p"
    BASE[$p]=$(rss_kb "${PID[$p]}")
    for i in $(seq "$SLOW_CLIENTS"); do
        curl -s -o /dev/null --limit-rate "$SLOW_RATE" "${URL[$p]}/big.bin" &
        curls+=($!)
        PIDS+=($!)
    done
    # Let every response start before sampling: the window is the steady state.
    sleep 2
    PEAK[$p]=$(peak_rss "${PID[$p]}" "$HOLD")
    for c in "${curls[@]}"; do kill -0 "$c" 2>/dev/null && alive=$((alive + 1)); done
    ALIVE[$p]=$alive
    for c in "${curls[@]}"; do kill "$c" 2>/dev/null || true; done
    for c in "${curls[@]}"; do wait "$c" 2>/dev/null || true; done
    log "$p: base $(mib "${BASE[$p]}") MiB, peak $(mib "${PEAK[$p]}") MiB with $alive of $SLOW_CLIENTS downloads in flight"
}
slow_round minproxy
slow_round tollgate

# --- part 2: idle HTTP/2 watches ------------------------------------------------------------
mkdir -p "$TMP/pki"
"$BIN_DIR/tollgate-bench" sim --listen 127.0.0.1:0 --tls --cert-dir "$TMP/pki" >"$TMP/sim.out" 2>"$TMP/sim.err" &
PIDS+=($!)
SIM_PID=${PIDS[-1]}
SIM_URL=$(wait_line "$TMP/sim.out" "serving the Kubernetes API at " "$SIM_PID" sim)

"$BIN_DIR/tollgate" --mode "$MODE" --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0 --upstream "$SIM_URL" \
    --upstream-ca "$TMP/pki/ca.crt" --tls-cert-file "$TMP/pki/apiserver.crt" --tls-private-key-file "$TMP/pki/apiserver.key" \
    >"$TMP/tollgate-watch.out" 2>"$TMP/tollgate-watch.err" &
PIDS+=($!)
TG_PID=${PIDS[-1]}
TG_URL=$(wait_line "$TMP/tollgate-watch.out" "tollgate serving at " "$TG_PID" tollgate)
TG_ADMIN=$(grep -o '(admin http://[^)]*' "$TMP/tollgate-watch.out" | sed 's/(admin //')
WATCH_BASE=$(rss_kb "$TG_PID")

# Long enough to open every watch and hold them through the sampling window.
LOADGEN_SECONDS=$((HOLD + 120))
"$BIN_DIR/loadgen" --server "$TG_URL" --certificate-authority "$TMP/pki/ca.crt" --http-version 2 \
    --watches "$WATCHES" --watch-resource configmaps -n default --duration "${LOADGEN_SECONDS}s" \
    --no-progress --output "$TMP/loadgen" >"$TMP/loadgen.out" 2>&1 &
PIDS+=($!)
LOADGEN_PID=${PIDS[-1]}

# Wait (bounded) until tollgate carries every watch.
open=0
for i in $(seq 1200); do
    open=$(metric "$TG_ADMIN" tollgate_inflight_requests)
    ((open >= WATCHES)) && break
    kill -0 "$LOADGEN_PID" 2>/dev/null || { cat "$TMP/loadgen.out" >&2; die "loadgen exited"; }
    sleep 0.1
done
((open >= WATCHES)) || die "only $open of $WATCHES watches open after 120 s"
log "$open watches open through tollgate; sampling for $HOLD s"
WATCH_PEAK=$(peak_rss "$TG_PID" "$HOLD")
WATCH_OPEN_AFTER=$(metric "$TG_ADMIN" tollgate_inflight_requests)
UPSTREAM_CONNS=$(awk -v p=":$(printf '%04X' "${SIM_URL##*:}")" '$3 ~ p && $4 == "01"' /proc/net/tcp | wc -l)
CLIENT_CONNS=$(awk -v p=":$(printf '%04X' "${TG_URL##*:}")" '$2 ~ p && $4 == "01"' /proc/net/tcp | wc -l)
log "tollgate: base $(mib "$WATCH_BASE") MiB, peak $(mib "$WATCH_PEAK") MiB; $UPSTREAM_CONNS upstream and $CLIENT_CONNS client connections"
kill "$LOADGEN_PID" 2>/dev/null || true

# Targets are in MB (10^6 bytes); RSS is read in KiB.
verdict() { awk -v kb="$1" -v mb="$2" 'BEGIN {print (kb * 1024 < mb * 1e6 ? "meets" : "misses")}'; }
SECTION=$(cat <<EOF
## tollgate memory (issue 3)

\`bash bench/scripts/proxy-memory.sh\` (SLOW_CLIENTS=$SLOW_CLIENTS, SLOW_RATE=$SLOW_RATE, HOLD=${HOLD}s,
WATCHES=$WATCHES), release builds, run $(date -u +%Y-%m-%dT%H:%MZ) at ${REV:-$(cd "$ROOT" && git rev-parse --short HEAD)}
on $(nproc) cores, shared with other work (load average $(cut -d' ' -f1-3 /proc/loadavg) at the end).
RSS = the peak of VmRSS sampled every 100 ms over the ${HOLD} s window with the whole load in place,
and of VmHWM reset at the window's start.

| load | proxy | RSS before | peak RSS under load | in flight at the end of the window | target |
|---|---|---|---|---|---|
| $SLOW_CLIENTS × 200 MB downloads, clients reading at $SLOW_RATE/s each | minproxy | $(mib "${BASE[minproxy]}") MiB | $(mib "${PEAK[minproxy]}") MiB | ${ALIVE[minproxy]} downloads | — |
| same | tollgate (mode $MODE) | $(mib "${BASE[tollgate]}") MiB | **$(mib "${PEAK[tollgate]}") MiB** | ${ALIVE[tollgate]} downloads | < $SLOW_TARGET_MB MB: $(verdict "${PEAK[tollgate]}" "$SLOW_TARGET_MB") |
| $WATCHES idle watches (configmaps), HTTP/2 over TLS from loadgen, to the sim over TLS | tollgate (mode $MODE) | $(mib "$WATCH_BASE") MiB | **$(mib "$WATCH_PEAK") MiB** | $WATCH_OPEN_AFTER requests in flight; $CLIENT_CONNS client and $UPSTREAM_CONNS upstream connections | < $WATCH_TARGET_MB MB: $(verdict "$WATCH_PEAK" "$WATCH_TARGET_MB") |

The upstream connection count shows the pool opening a new HTTP/2 connection each time one
carries \`upstream.maxStreamsPerConnection\` streams (default 100, recent apiservers' limit; the sim,
like kube-apiserver 1.20, allows 250), so no watch waits for a stream.
EOF
)

echo "$SECTION"
if [[ "$RESULTS" != "-" ]]; then
    write_section "$RESULTS" "$SECTION"
    log "wrote $RESULTS"
fi
