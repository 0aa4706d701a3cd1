#!/usr/bin/env bash
# Latency tollgate adds at half its maximum rate (issue 3, benchmarks), against the floor of
# any hyper proxy here (minproxy, bench/src/bin/minproxy.rs) and nginx as a plain reverse proxy,
# in the same run, in front of the same upstream (nginx serving a 1 KB JSON object at every
# path, so a GET of a pod's path is classified like one).
#   1. tollgate's maximum rate: wrk -t1 -c$CONNECTIONS through it, MAX_SECONDS long.
#   2. open-loop GETs at half that rate with loadgen (latency from each request's intended
#      start, so stalls are not hidden) over the same CONNECTIONS connections
#      (--max-connections), DURATION each, against the upstream directly and through each
#      proxy, interleaved over ROUNDS. Without the cap, a hiccup made loadgen open a burst of
#      new connections, some of whose SYNs waited out the kernel's 1 s retransmission: tails
#      of 1 s through every proxy (minproxy included) that measured TCP connection storms, not
#      the work a proxy adds per request.
# Added p99 = p99 through the proxy - p99 direct, from the rounds' merged requests (the median
# of the rounds' values is shown too). Writes the section "tollgate added latency (issue 3)" of
# bench/RESULTS.md and prints it. A benchmark, not a CI test. Loopback only; everything it
# starts is killed by pid on exit.
#
# Environment:
#   SKIP_BUILD=1     use the existing release binaries (no cargo build)
#   BIN_DIR=dir      where the release binaries are (default target/release)
#   ROUNDS=3         interleaved rounds
#   DURATION=20      seconds of load per run
#   MAX_SECONDS=8    seconds of the wrk run that finds the maximum rate
#   CONNECTIONS=16   wrk's -c and loadgen's --max-connections
#   RATE=N           skip step 1 and use N requests/s
#   MODE=off         tollgate's --mode (issue 3 measures forwarding without enforcement)
#   PIN=1            pin the proxy under test to CPU 1 and loadgen and the upstream nginx to CPU 0
#                    (taskset), so the proxies' tails are not the load generator's queueing on
#                    a shared core; each proxy then runs on one core (tokio sizes its runtime
#                    from the affinity mask)
#   RESULTS=path     where to write the results (default bench/RESULTS.md; "-" prints only)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-20}
MAX_SECONDS=${MAX_SECONDS:-8}
CONNECTIONS=${CONNECTIONS:-16}
RESULTS=${RESULTS:-$ROOT/bench/RESULTS.md}
MODE=${MODE:-off}
TARGET=1.5
PIN=${PIN:-}
# Where the proxies and the load side run (PIN=1), or nowhere in particular.
ON_PROXY_CPU=() ON_LOAD_CPU=()
if [[ -n "$PIN" ]]; then
    command -v taskset >/dev/null || die "taskset is missing (util-linux)"
    [[ $(nproc) -ge 2 ]] || die "PIN=1 needs 2 CPUs"
    ON_PROXY_CPU=(taskset -c 1) ON_LOAD_CPU=(taskset -c 0)
fi

BENCH=proxy-latency
# shellcheck source=lib.sh
source "$ROOT/bench/scripts/lib.sh"

for tool in curl wrk awk python3; do
    command -v "$tool" >/dev/null || die "$tool is missing"
done
NGINX=$(command -v nginx || echo /usr/sbin/nginx)
[[ -x "$NGINX" ]] || die "nginx is missing (apt-get install -y nginx-light)"
bench_init

if [[ -z "${SKIP_BUILD:-}" ]]; then
    log "building release binaries (tollgate, minproxy, loadgen)…"
    (cd "$ROOT" && cargo build --release -q -p tollgate -p bench -p loadgen)
fi
BIN_DIR=${BIN_DIR:-$ROOT/target/release}
for b in tollgate minproxy loadgen; do
    [[ -x "$BIN_DIR/$b" ]] || die "$BIN_DIR/$b is missing: run without SKIP_BUILD"
done

# --- upstream and proxies --------------------------------------------------------------------
chmod 755 "$TMP"
mkdir -p "$TMP/www"
python3 - "$TMP/www/pod.json" <<'EOF'
import json, sys
doc = {"kind": "Pod", "apiVersion": "v1", "metadata": {"name": "loadgen-pod-0", "namespace": "default"},
       "spec": {"nodeName": "node-0"}, "status": {"phase": "Running"}}
s = json.dumps(doc)
doc["metadata"]["annotations"] = {"pad": "x" * (1024 - len(s) - 32)}
s = json.dumps(doc)
assert 1000 <= len(s) <= 1024, len(s)
open(sys.argv[1], "w").write(s)
EOF
chmod 644 "$TMP/www/pod.json"
UP_PORT=$(free_port)
nginx_conf "$TMP/up" "$UP_PORT" "root $TMP/www; location / { default_type application/json; try_files /pod.json =404; }"
"${ON_LOAD_CPU[@]}" "$NGINX" -p "$TMP/up" -c "$TMP/up/nginx.conf" >"$TMP/up/logs/stdout" 2>&1 &
PIDS+=($!)
declare -A URL
URL[direct]=http://127.0.0.1:$UP_PORT
wait_http "${URL[direct]}/healthz" "${PIDS[-1]}" "upstream nginx"

"${ON_PROXY_CPU[@]}" "$BIN_DIR/minproxy" --listen 127.0.0.1:0 --upstream "${URL[direct]}" >"$TMP/minproxy.out" 2>&1 &
PIDS+=($!)
URL[minproxy]=$(wait_line "$TMP/minproxy.out" "minproxy serving at " "${PIDS[-1]}" minproxy)

NP_PORT=$(free_port)
nginx_proxy_conf "$TMP/np" "$NP_PORT" "$UP_PORT"
"${ON_PROXY_CPU[@]}" "$NGINX" -p "$TMP/np" -c "$TMP/np/nginx.conf" >"$TMP/np/logs/stdout" 2>&1 &
PIDS+=($!)
URL[nginx]=http://127.0.0.1:$NP_PORT
wait_http "${URL[nginx]}/healthz" "${PIDS[-1]}" "nginx proxy"

cat >"$TMP/tollgate.yaml" <<EOF
upstream:
  healthCheck: {enabled: true, path: /healthz, intervalSeconds: 5, timeoutSeconds: 2}
  metricsScrape: {enabled: false}
EOF
"${ON_PROXY_CPU[@]}" "$BIN_DIR/tollgate" --mode "$MODE" --config "$TMP/tollgate.yaml" --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0 \
    --upstream "${URL[direct]}" >"$TMP/tollgate.out" 2>"$TMP/tollgate.err" &
PIDS+=($!)
URL[tollgate]=$(wait_line "$TMP/tollgate.out" "tollgate serving at " "${PIDS[-1]}" tollgate)
wait_http "${URL[tollgate]}/healthz" "${PIDS[-1]}" tollgate

POD_PATH=/api/v1/namespaces/default/pods/loadgen-pod-0

# --- 1. tollgate's maximum rate ------------------------------------------------------------
if [[ -z "${RATE:-}" ]]; then
    "${ON_LOAD_CPU[@]}" wrk -t1 -c"$CONNECTIONS" -d"${MAX_SECONDS}s" "${URL[tollgate]}$POD_PATH" >"$TMP/wrk.max" 2>&1 || die "wrk failed: $(cat "$TMP/wrk.max")"
    MAX=$(awk '/^Requests\/sec/ {printf "%d", $2}' "$TMP/wrk.max")
    RATE=$((MAX / 2))
    log "tollgate's maximum rate: $MAX requests/s (wrk -t1 -c$CONNECTIONS); load at $RATE/s"
else
    MAX="(not measured; RATE given)"
fi

# --- 2. open-loop load at half of it -----------------------------------------------------
TARGETS=(direct minproxy tollgate nginx)
declare -A P99S
run() { # run TARGET ROUND
    local t=$1 out=$TMP/lg.$1.$2
    "${ON_LOAD_CPU[@]}" "$BIN_DIR/loadgen" --server "${URL[$t]}" --gets "$RATE/s" --get-resource pods -n default --objects 1 --max-connections "$CONNECTIONS" \
        --duration "${DURATION}s" --no-progress --output "$out" >"$out.log" 2>&1 \
        || die "loadgen against $t failed: $(tail -5 "$out.log")"
    P99S[$t]="${P99S[$t]:-} $(python3 - "$out/summary.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
op = next(o for o in s["operations"] if o["name"].startswith("get"))
print(f'{op["latency_ms"]["p99"]:.3f}:{op["latency_ms"]["p50"]:.3f}:{op["requests"]}:{op["rate_per_s"]:.0f}')
PY
)"
    log "round $2 $t: $(echo "${P99S[$t]}" | awk '{print $NF}') (p99:p50:requests:rate)"
}
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
for r in $(seq "$ROUNDS"); do
    for t in "${TARGETS[@]}"; do run "$t" "$r"; done
done
LOAD_AFTER=$(cut -d' ' -f1-3 /proc/loadavg)

# Per target: the rounds' p99 values, their median, and the median p50.
median_field() { # median_field TARGET FIELD
    echo "${P99S[$1]}" | tr ' ' '\n' | awk -F: -v f="$2" 'NF {print $f}' | median
}
rounds_p99() { echo "${P99S[$1]}" | tr ' ' '\n' | awk -F: 'NF {printf "%s%s", sep, $1; sep = " "}'; }
declare -A MED ADD
for t in "${TARGETS[@]}"; do MED[$t]=$(median_field "$t" 1); done
for t in minproxy tollgate nginx; do
    ADD[$t]=$(awk -v a="${MED[$t]}" -v d="${MED[direct]}" 'BEGIN {printf "%.3f", a - d}')
done
# An added p99 at or below zero (the direct run's p99 above a proxy's: with PIN=1 loadgen and
# nginx share a core only in the direct run) leaves the ratio undefined, not "met".
RATIO=$(awk -v a="${ADD[tollgate]}" -v b="${ADD[minproxy]}" 'BEGIN {if (a <= 0 || b <= 0) print "n/a"; else printf "%.2f", a / b}')
VERDICT=$(awk -v r="$RATIO" -v t="$TARGET" 'BEGIN {print (r == "n/a" ? "undefined: the direct baseline is not below both proxies" : (r <= t ? "meets" : "misses"))}')
UNDER_1MS=$(awk -v a="${ADD[tollgate]}" 'BEGIN {print (a < 1 ? "yes" : "no")}')
# tollgate's p99 against minproxy's, whole and per round (defined whatever the baseline).
P99_RATIO=$(awk -v a="${MED[tollgate]}" -v b="${MED[minproxy]}" 'BEGIN {printf "%.2f", a / b}')
P99_ROUNDS=$(paste -d' ' <(rounds_p99 tollgate | tr ' ' '\n') <(rounds_p99 minproxy | tr ' ' '\n') \
    | awk '{printf "%s%.2f", sep, $1 / $2; sep = " "}')

row() { echo "| $1 | $(rounds_p99 "$1") | ${MED[$1]} ms | $(median_field "$1" 2) ms | ${ADD[$1]:-—}${ADD[$1]:+ ms} |"; }
SECTION=$(cat <<EOF
## tollgate added latency (issue 3)

\`bash bench/scripts/proxy-latency.sh\` (ROUNDS=$ROUNDS, DURATION=${DURATION}s), release builds, run
$(date -u +%Y-%m-%dT%H:%MZ) at ${REV:-$(cd "$ROOT" && git rev-parse --short HEAD)} on $(nproc) cores, shared with
other work: load average $LOAD_BEFORE before, $LOAD_AFTER after. Upstream: nginx serving a
1 KB pod object at every path. tollgate's maximum rate (wrk -t1 -c$CONNECTIONS, ${MAX_SECONDS} s): $MAX
requests/s; the load is open-loop GETs of \`$POD_PATH\` at **$RATE/s** from loadgen (HTTP/1.1,
latency from each request's intended start, over $CONNECTIONS connections), ${DURATION} s per run, targets interleaved.
${PIN:+CPUs pinned (PIN=1): each proxy on CPU 1, loadgen, wrk and the upstream nginx on CPU 0.}

| target | p99 per round (ms) | median p99 | median p50 | added p99 over direct |
|---|---|---|---|---|
$(row direct)
$(row minproxy)
$(row tollgate)
$(row nginx)

- tollgate's added p99 / minproxy's: **$RATIO** (target ≤ $TARGET: $VERDICT); added p99 under 1 ms: $UNDER_1MS
  (the target asks for it where the machine is quiet; this one is shared).
- tollgate's p99 / minproxy's p99: $P99_RATIO (medians), per round $P99_ROUNDS.
EOF
)

echo "$SECTION"
if [[ "$RESULTS" != "-" ]]; then
    write_section "$RESULTS" "$SECTION"
    log "wrote $RESULTS"
fi
