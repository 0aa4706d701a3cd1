#!/usr/bin/env bash
# Forwarding cost of tollgate (issue 3, "What it must show", benchmarks): CPU time of the proxy
# process per small GET and per GB streamed, in the same run, against two peers in front of
# the same upstream:
#   upstream  nginx (one worker) serving a 1 KB JSON file and a 200 MB file;
#   minproxy  a minimal hyper reverse proxy that does no work (bench/src/bin/minproxy.rs);
#   nginx     nginx as a plain reverse proxy (proxy_buffering off, 64 KB buffers, keepalive);
#   tollgate  release build, plain HTTP, mode off (classification, pattern learning, metrics on).
# Load is driven by wrk; the machine is small and shared, so the figure compared is CPU time
# of the proxy process (utime+stime from /proc/PID/stat, before/after each wrk run) per
# request or per GB, not requests/s. Rounds are interleaved (each proxy once per round).
# Writes the section "tollgate forwarding (issue 3)" of bench/RESULTS.md and prints it.
# A benchmark, not a CI test. Loopback only; everything it starts is killed by pid on exit.
#
# Environment:
#   SKIP_BUILD=1     use the existing release binaries (no cargo build)
#   BIN_DIR=dir      where the release binaries are (default target/release)
#   ROUNDS=3         interleaved rounds
#   DURATION=8       seconds per wrk run
#   SMALL_CONNS=16   wrk connections for the small GETs
#   BIG_CONNS=2      wrk connections for the 200 MB downloads
#   MODE=off         tollgate's --mode (issue 3 measures forwarding without enforcement)
#   RESULTS=path     where to write the results (default bench/RESULTS.md; "-" prints only)
#   TOLLGATE_BEFORE=path  another tollgate binary (an earlier build) run as a fourth proxy,
#                    "tollgate-before", with the same configuration: before/after ratios in one run
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-8}
SMALL_CONNS=${SMALL_CONNS:-16}
BIG_CONNS=${BIG_CONNS:-2}
RESULTS=${RESULTS:-$ROOT/bench/RESULTS.md}
MODE=${MODE:-off}
BIG_BYTES=$((200 * 1024 * 1024))

# Targets from issue 3.
SMALL_TARGET=1.25
BIG_TARGET=1.15

BENCH=proxy-bench
# shellcheck source=lib.sh
source "$ROOT/bench/scripts/lib.sh"

for tool in curl wrk awk python3; do
    command -v "$tool" >/dev/null || die "$tool is missing"
done
NGINX=$(command -v nginx || echo /usr/sbin/nginx)
[[ -x "$NGINX" ]] || die "nginx is missing (apt-get install -y nginx-light)"
CLK_TCK=$(getconf CLK_TCK)
bench_init

# --- build ---------------------------------------------------------------------------------
if [[ -z "${SKIP_BUILD:-}" ]]; then
    log "building release binaries (tollgate, minproxy)…"
    (cd "$ROOT" && cargo build --release -q -p tollgate -p bench --bin tollgate --bin minproxy)
fi
BIN_DIR=${BIN_DIR:-$ROOT/target/release}
TOLLGATE=$BIN_DIR/tollgate
MINPROXY=$BIN_DIR/minproxy
[[ -x "$TOLLGATE" && -x "$MINPROXY" ]] || die "release binaries missing: run without SKIP_BUILD"

# --- upstream: nginx serving the files -------------------------------------------------------
upstream_files "$TMP/www" "$BIG_BYTES"

UP_PORT=$(free_port)
nginx_conf "$TMP/up" "$UP_PORT" "root $TMP/www; location / { }" "sendfile on; tcp_nopush on;"
"$NGINX" -p "$TMP/up" -c "$TMP/up/nginx.conf" >"$TMP/up/logs/stdout" 2>&1 &
PIDS+=($!)
UPSTREAM=http://127.0.0.1:$UP_PORT
wait_http "$UPSTREAM/small.json" "${PIDS[-1]}" "upstream nginx"
UP_WORKER=$(nginx_worker "${PIDS[-1]}")

# --- the proxies ---------------------------------------------------------------------------
declare -A URL PID
"$MINPROXY" --listen 127.0.0.1:0 --upstream "$UPSTREAM" >"$TMP/minproxy.out" 2>&1 &
PIDS+=($!)
PID[minproxy]=${PIDS[-1]}
URL[minproxy]=$(wait_line "$TMP/minproxy.out" "minproxy serving at " "${PID[minproxy]}" minproxy)

NP_PORT=$(free_port)
nginx_proxy_conf "$TMP/np" "$NP_PORT" "$UP_PORT"
"$NGINX" -p "$TMP/np" -c "$TMP/np/nginx.conf" >"$TMP/np/logs/stdout" 2>&1 &
PIDS+=($!)
URL[nginx]=http://127.0.0.1:$NP_PORT
wait_http "${URL[nginx]}/small.json" "${PIDS[-1]}" "nginx proxy"
PID[nginx]=$(nginx_worker "${PIDS[-1]}")

# tollgate as shipped (mode off), except: the upstream is nginx, so the health check asks
# for a file it has and the apiserver metrics scrape is off.
cat >"$TMP/tollgate.yaml" <<EOF
upstream:
  healthCheck: {enabled: true, path: /small.json, intervalSeconds: 5, timeoutSeconds: 2}
  metricsScrape: {enabled: false}
EOF
start_tollgate() { # start_tollgate NAME BINARY
    RUST_LOG=info "$2" --mode "$MODE" --config "$TMP/tollgate.yaml" --listen 127.0.0.1:0 \
        --admin-listen 127.0.0.1:0 --upstream "$UPSTREAM" >"$TMP/$1.out" 2>"$TMP/$1.err" &
    PIDS+=($!)
    PID[$1]=${PIDS[-1]}
    URL[$1]=$(wait_line "$TMP/$1.out" "tollgate serving at " "${PID[$1]}" "$1")
}
start_tollgate tollgate "$TOLLGATE"
TOLLGATE_ADMIN=$(grep -o '(admin http://[^)]*' "$TMP/tollgate.out" | sed 's/(admin //')

PROXIES=(minproxy tollgate nginx)
if [[ -n "${TOLLGATE_BEFORE:-}" ]]; then
    [[ -x "$TOLLGATE_BEFORE" ]] || die "TOLLGATE_BEFORE=$TOLLGATE_BEFORE is not an executable"
    start_tollgate tollgate-before "$TOLLGATE_BEFORE"
    PROXIES=(minproxy tollgate-before tollgate nginx)
fi
for p in "${PROXIES[@]}"; do
    wait_http "${URL[$p]}/small.json" "${PID[$p]}" "$p"
    got=$(curl -s "${URL[$p]}/small.json" | md5sum)
    [[ "$got" == "$(md5sum <"$TMP/www/small.json")" ]] || die "$p does not forward small.json faithfully"
    log "$p: ${URL[$p]} (pid ${PID[$p]})"
done

# wrk's "N requests in Ts, X.YZMB read" -> "N BYTES" (wrk's units are binary).
wrk_totals() {
    awk '/requests in/ {
        n = $1; v = $5; sub(/read$/, "", v); sub(/,$/, "", v)
        u = v; gsub(/[0-9.]/, "", u); x = v; gsub(/[A-Za-z]/, "", x)
        m = 1; if (u == "KB") m = 1024; if (u == "MB") m = 1048576; if (u == "GB") m = 1073741824; if (u == "TB") m = 1099511627776
        printf "%d %.0f\n", n, x * m }' "$1"
}
wrk_p99() { awk '$1 == "99%" {print $2}' "$1"; }
wrk_errors() { awk '/Non-2xx|Socket errors/ {print}' "$1"; }

# Accumulated per proxy and workload: ticks, requests, bytes.
declare -A T N B P99 RT RD
for p in "${PROXIES[@]}"; do
    for w in small big; do T[$p.$w]=0; N[$p.$w]=0; B[$p.$w]=0; done
    P99[$p]=""
done
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)

run() { # run PROXY small|big
    local p=$1 w=$2 out=$TMP/wrk.$1.$2 t0 t1 n b
    local args=(-t1 -c"$SMALL_CONNS" -d"${DURATION}s" --latency "${URL[$p]}/small.json")
    [[ $w == big ]] && args=(-t1 -c"$BIG_CONNS" -d"${DURATION}s" --timeout 120s "${URL[$p]}/big.bin")
    t0=$(ticks "${PID[$p]}")
    wrk "${args[@]}" >"$out" 2>&1 || die "wrk against $p failed: $(cat "$out")"
    t1=$(ticks "${PID[$p]}")
    [[ -z "$(wrk_errors "$out")" ]] || die "wrk against $p ($w): $(wrk_errors "$out")"
    read -r n b < <(wrk_totals "$out")
    T[$p.$w]=$((T[$p.$w] + t1 - t0))
    N[$p.$w]=$((N[$p.$w] + n))
    B[$p.$w]=$((B[$p.$w] + b))
    RT[$p.$w.$r]=$((t1 - t0))
    RD[$p.$w.$r]=$n
    [[ $w == big ]] && RD[$p.$w.$r]=$b
    [[ $w == small ]] && P99[$p]="${P99[$p]} $(wrk_p99 "$out")"
    log "round $r $p $w: $n requests, $b bytes, $((t1 - t0)) ticks"
}

for r in $(seq "$ROUNDS"); do
    for p in "${PROXIES[@]}"; do run "$p" small; done
    for p in "${PROXIES[@]}"; do run "$p" big; done
done
LOAD_AFTER=$(cut -d' ' -f1-3 /proc/loadavg)
for p in "${PROXIES[@]}"; do
    kill -0 "${PID[$p]}" 2>/dev/null || die "$p exited during the benchmark"
done
PATTERNS=$(curl -s "$TOLLGATE_ADMIN/debug/patterns" | python3 -c 'import json,sys; print(sum(p["count"] for p in json.load(sys.stdin)))')
RSS_KB=$(awk '/VmHWM/ {print $2}' "/proc/${PID[tollgate]}/status")

us_per_req() { awk -v t="${T[$1.small]}" -v n="${N[$1.small]}" -v hz="$CLK_TCK" 'BEGIN {printf "%.1f", t / hz / n * 1e6}'; }
s_per_gb() { awk -v t="${T[$1.big]}" -v b="${B[$1.big]}" -v hz="$CLK_TCK" 'BEGIN {printf "%.3f", t / hz / (b / 1e9)}'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", a / b}'; }
# tollgate/minproxy of each round (CPU per request or per byte): the spread of the ratio.
round_ratios() { # round_ratios small|big [PROXY [PEER]]
    local r out="" a=${2:-tollgate} b=${3:-minproxy}
    for r in $(seq "$ROUNDS"); do
        out="$out $(awk -v ta="${RT[$a.$1.$r]}" -v da="${RD[$a.$1.$r]}" \
            -v tb="${RT[$b.$1.$r]}" -v db="${RD[$b.$1.$r]}" \
            'BEGIN {printf "%.2f", (ta / da) / (tb / db)}')"
    done
    echo "${out# }"
}
verdict() { awk -v r="$1" -v t="$2" 'BEGIN {print (r <= t ? "meets" : "misses")}'; }

# The tollgate-before row and its ratios, when there is one (empty otherwise; the section adds the
# newline, since $(...) drops it).
row() {
    [[ -n "${N[$1.small]:-}" ]] || return 0
    printf '| %s | %s µs | %s |%s | %s s | %s |\n' "$1" "$(us_per_req "$1")" "${N[$1.small]}" \
        "${P99[$1]}" "$(s_per_gb "$1")" "$(awk -v b="${B[$1.big]}" 'BEGIN {printf "%.1f", b / 1e9}')"
}
before_ratios() {
    [[ -n "${N[tollgate-before.small]:-}" ]] || return 0
    printf -- '- tollgate / tollgate-before (%s): **%s×** per small GET (per round: %s), **%s×** per GB (per round: %s).\n' \
        "$TOLLGATE_BEFORE" \
        "$(ratio "$(us_per_req tollgate)" "$(us_per_req tollgate-before)")" "$(round_ratios small tollgate tollgate-before)" \
        "$(ratio "$(s_per_gb tollgate)" "$(s_per_gb tollgate-before)")" "$(round_ratios big tollgate tollgate-before)"
}

SMALL_RATIO=$(ratio "$(us_per_req tollgate)" "$(us_per_req minproxy)")
BIG_RATIO=$(ratio "$(s_per_gb tollgate)" "$(s_per_gb minproxy)")
NGX_SMALL_RATIO=$(ratio "$(us_per_req nginx)" "$(us_per_req minproxy)")
NGX_BIG_RATIO=$(ratio "$(s_per_gb nginx)" "$(s_per_gb minproxy)")
CPU_MODEL=$(awk -F': ' '/model name/ {print $2; exit}' /proc/cpuinfo)
BEFORE_ROW=$(row tollgate-before)
BEFORE_RATIOS=$(before_ratios)

SECTION=$(cat <<EOF
## tollgate forwarding (issue 3)

\`bash bench/scripts/proxy-bench.sh\` (ROUNDS=$ROUNDS, DURATION=${DURATION}s per wrk run, small GETs
with \`wrk -t1 -c$SMALL_CONNS\`, 200 MB downloads with \`wrk -t1 -c$BIG_CONNS\`), release builds, run
$(date -u +%Y-%m-%dT%H:%MZ) on $(nproc) cores ($CPU_MODEL), shared with other engineers' work:
load average $LOAD_BEFORE before, $LOAD_AFTER after. Upstream: nginx (one worker, sendfile)
serving a 1 KB JSON file and a 200 MB file. Peers, each in front of the same upstream, measured
in the same run, interleaved: \`minproxy\` (bench/src/bin/minproxy.rs, a hyper reverse proxy that
does no work) and nginx as a plain reverse proxy (one worker, \`proxy_buffering off\`, 64 KB
buffers, upstream keepalive). tollgate: plain HTTP, \`--mode off\` (classification, pattern
learning and metrics on; health checks on \`/small.json\`, apiserver metrics scrape off).
Figure: CPU time (utime+stime, /proc/PID/stat) of the proxy process over all rounds, divided by
the requests (small) or the bytes (GB = 10^9 B) wrk received.

| proxy | CPU per small GET | small GETs | p99 per round (wrk) | CPU per GB streamed | GB streamed |
|---|---|---|---|---|---|
| minproxy | $(us_per_req minproxy) µs | ${N[minproxy.small]} |${P99[minproxy]} | $(s_per_gb minproxy) s | $(awk -v b="${B[minproxy.big]}" 'BEGIN {printf "%.1f", b / 1e9}') |
${BEFORE_ROW:+$BEFORE_ROW
}| tollgate | $(us_per_req tollgate) µs | ${N[tollgate.small]} |${P99[tollgate]} | $(s_per_gb tollgate) s | $(awk -v b="${B[tollgate.big]}" 'BEGIN {printf "%.1f", b / 1e9}') |
| nginx | $(us_per_req nginx) µs | ${N[nginx.small]} |${P99[nginx]} | $(s_per_gb nginx) s | $(awk -v b="${B[nginx.big]}" 'BEGIN {printf "%.1f", b / 1e9}') |

- tollgate / minproxy per small GET: **$SMALL_RATIO×** (target ≤ $SMALL_TARGET×: $(verdict "$SMALL_RATIO" "$SMALL_TARGET")); per round: $(round_ratios small).
- tollgate / minproxy per GB streamed: **$BIG_RATIO×** (target ≤ $BIG_TARGET×: $(verdict "$BIG_RATIO" "$BIG_TARGET")); per round: $(round_ratios big).
${BEFORE_RATIOS:+$BEFORE_RATIOS
}- nginx / minproxy: $NGX_SMALL_RATIO× per small GET, $NGX_BIG_RATIO× per GB.
- tollgate observed $PATTERNS requests in \`/debug/patterns\` counts; its peak RSS (VmHWM) was $((RSS_KB / 1024)) MiB.
- Latency and requests/s are not compared: the load average above says how little the 2 cores
  were ours. The p99 added at half of tollgate's maximum rate is measured open-loop by
  \`bench/scripts/proxy-latency.sh\` ("tollgate added latency"), RSS with slow clients and idle
  watches by \`bench/scripts/proxy-memory.sh\` ("tollgate memory").
EOF
)
echo "$SECTION"
if [[ "$RESULTS" != "-" ]]; then
    write_section "$RESULTS" "$SECTION"
    log "written to $RESULTS"
fi
