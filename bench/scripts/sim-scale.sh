#!/usr/bin/env bash
# Scale benchmark of the simulated kube-apiserver (issue 2, "What it must show", last bullet).
#
# One run:
#   1. starts `tollgate-bench sim` (release build) with 5,000 nodes and 150,000 pods of ~2 KB,
#      measures seeding time (process start -> ready line) and RSS once seeded;
#   2. measures full-LIST throughput (GET /api/v1/pods with curl) against nginx serving a
#      static file of the same bytes (the LIST response itself, saved once), same curl command,
#      in the same run, interleaved;
#   3. measures the RSS rise while 10 full LISTs run concurrently (VmRSS sampled every ~50 ms,
#      plus VmHWM after resetting it), against the RSS just before;
#   4. writes the figures to bench/RESULTS.md (section "Simulated apiserver at scale (issue 2)")
#      and prints them.
# A benchmark, not a CI test. Loopback only. Everything it starts is killed by pid on exit.
#
# Environment:
#   SKIP_BUILD=1       use the existing target/release/tollgate-bench (no cargo build)
#   NODES PODS POD_BYTES NAMESPACES   override the scale (defaults: 5000 150000 2048 50)
#   RUNS=5             sequential LISTs (and nginx downloads) measured, after one warm-up each
#   CONCURRENT=10      LISTs run at once in step 3
#   RESULTS=path       where to write the results (default bench/RESULTS.md; "-" prints only)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
NODES=${NODES:-5000}
PODS=${PODS:-150000}
POD_BYTES=${POD_BYTES:-2048}
NAMESPACES=${NAMESPACES:-50}
RUNS=${RUNS:-5}
CONCURRENT=${CONCURRENT:-10}
RESULTS=${RESULTS:-$ROOT/bench/RESULTS.md}

# Targets from issue 2.
SEED_LIMIT_S=60
RSS_LIMIT_KB=$((3 * 1024 * 1024)) # 3 GiB
RATIO_MIN=0.5
RISE_FRACTION=0.10

die() { echo "sim-scale: $*" >&2; exit 1; }
log() { echo "sim-scale: $*" >&2; }

for tool in curl nginx awk sort; do
    command -v "$tool" >/dev/null || [[ -x /usr/sbin/$tool ]] || die "$tool is missing (nginx: apt-get install -y nginx-light)"
done
NGINX=$(command -v nginx || echo /usr/sbin/nginx)

# --- processes and temp dirs, cleaned up whatever happens -------------------------------
TMP=$(mktemp -d /tmp/sim-scale.XXXXXX)
SIM_PID=""
NGINX_PID=""
SAMPLER_PID=""
CURL_PIDS=()
cleanup() {
    local pid
    for pid in "${CURL_PIDS[@]}" "$SAMPLER_PID" "$NGINX_PID" "$SIM_PID"; do
        [[ -n "$pid" ]] && kill "$pid" 2>/dev/null || true
    done
    for pid in "${CURL_PIDS[@]}" "$SAMPLER_PID" "$NGINX_PID" "$SIM_PID"; do
        [[ -n "$pid" ]] && wait "$pid" 2>/dev/null || true
    done
    rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# --- build ------------------------------------------------------------------------------
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
BIN=$TARGET_DIR/release/tollgate-bench
if [[ "${SKIP_BUILD:-0}" != 1 ]]; then
    log "building the release binary (cargo build --release -p bench)…"
    (cd "$ROOT" && cargo build --release -p bench) >&2
fi
[[ -x "$BIN" ]] || die "$BIN not found (build it, or unset SKIP_BUILD)"

now() { date +%s.%N; }
kb_field() { # kb_field PID VmRSS|VmHWM -> kB
    local k v _
    while read -r k v _; do
        if [[ "$k" == "$2:" ]]; then echo "$v"; return; fi
    done <"/proc/$1/status"
    echo 0
}
median() { sort -g | awk '{a[NR]=$1} END {if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }
fmt_mib() { awk -v k="$1" 'BEGIN {printf "%.1f MiB", k/1024}'; }

LOAD_START=$(cut -d' ' -f1-3 /proc/loadavg)

# --- 1. seeding -------------------------------------------------------------------------
SIM_CMD=("$BIN" sim --nodes "$NODES" --pods "$PODS" --pod-bytes "$POD_BYTES" --namespaces "$NAMESPACES" --listen 127.0.0.1:0)
log "starting: ${SIM_CMD[*]}"
T0=$(now)
RUST_LOG=${RUST_LOG:-info} "${SIM_CMD[@]}" >"$TMP/sim.out" 2>"$TMP/sim.err" &
SIM_PID=$!
URL=""
while [[ -z "$URL" ]]; do
    kill -0 "$SIM_PID" 2>/dev/null || { cat "$TMP/sim.err" >&2; die "the simulator exited before it was ready"; }
    URL=$(grep -o 'serving the Kubernetes API at http://[^ ]*' "$TMP/sim.out" 2>/dev/null | awk '{print $NF}' || true)
    [[ -n "$URL" ]] || sleep 0.02
    awk -v t0="$T0" -v t="$(now)" 'BEGIN {exit !(t - t0 > 600)}' && die "not ready after 600 s"
done
T1=$(now)
SEED_S=$(awk -v a="$T0" -v b="$T1" 'BEGIN {printf "%.2f", b - a}')
SEED_INTERNAL_MS=$(sed 's/\x1b\[[0-9;]*m//g' "$TMP/sim.err" | grep -o 'elapsed_ms=[0-9]*' | head -1 | cut -d= -f2 || true)
RSS_SEEDED_KB=$(kb_field "$SIM_PID" VmRSS)
HWM_SEEDED_KB=$(kb_field "$SIM_PID" VmHWM)
log "ready at $URL after ${SEED_S} s; VmRSS $(fmt_mib "$RSS_SEEDED_KB"), VmHWM $(fmt_mib "$HWM_SEEDED_KB")"

# --- 2. LIST throughput vs nginx --------------------------------------------------------
LIST_URL=$URL/api/v1/pods
mkdir -p "$TMP/www"
# nginx's worker runs as an unprivileged user when started as root: let it read the file.
chmod 755 "$TMP" "$TMP/www"
# The static file is the LIST response itself: same size, same bytes.
curl -sf -o "$TMP/www/pods.json" "$LIST_URL" || die "LIST failed"
LIST_BYTES=$(stat -c %s "$TMP/www/pods.json")
chmod 644 "$TMP/www/pods.json"
ITEMS=$(grep -o '"kind":"Pod"' "$TMP/www/pods.json" | wc -l)
[[ "$ITEMS" -eq "$PODS" ]] || die "the LIST returned $ITEMS pods, expected $PODS"
log "one LIST: $LIST_BYTES bytes, $ITEMS pods"

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])' 2>/dev/null ||
        echo $((20000 + RANDOM % 40000))
}

# nginx with its own prefix and conf, one worker. sendfile on: Debian's nginx.conf ships it on,
# so this is what nginx from Debian does, and it is the stronger baseline (the file goes from the
# page cache to the socket without a copy through user space, which the sim cannot do).
start_nginx() { # start_nginx on|off
    local sendfile=$1 port try
    for try in 1 2 3 4 5; do
        port=$(free_port)
        rm -rf "$TMP/nginx" && mkdir -p "$TMP/nginx/logs" "$TMP/nginx/tmp"
        cat >"$TMP/nginx/nginx.conf" <<EOF
daemon off;
worker_processes 1;
pid $TMP/nginx/nginx.pid;
error_log $TMP/nginx/logs/error.log warn;
events { worker_connections 64; }
http {
    access_log off;
    sendfile $sendfile;
    tcp_nopush on;
    client_body_temp_path $TMP/nginx/tmp/body;
    proxy_temp_path $TMP/nginx/tmp/proxy;
    fastcgi_temp_path $TMP/nginx/tmp/fastcgi;
    uwsgi_temp_path $TMP/nginx/tmp/uwsgi;
    scgi_temp_path $TMP/nginx/tmp/scgi;
    types { application/json json; }
    server {
        listen 127.0.0.1:$port;
        root $TMP/www;
    }
}
EOF
        "$NGINX" -p "$TMP/nginx" -c "$TMP/nginx/nginx.conf" -e "$TMP/nginx/logs/error.log" \
            >"$TMP/nginx/logs/stdout" 2>&1 &
        NGINX_PID=$!
        local i
        for i in $(seq 100); do
            if curl -sf -o /dev/null "http://127.0.0.1:$port/pods.json" -r 0-0; then
                NGINX_URL=http://127.0.0.1:$port/pods.json
                return 0
            fi
            kill -0 "$NGINX_PID" 2>/dev/null || break
            sleep 0.05
        done
        stop_nginx
    done
    tail -5 "$TMP/nginx/logs/error.log" >&2 || true
    die "nginx did not start"
}
stop_nginx() {
    if [[ -n "$NGINX_PID" ]]; then
        kill "$NGINX_PID" 2>/dev/null || true
        wait "$NGINX_PID" 2>/dev/null || true
        NGINX_PID=""
    fi
}

fetch() { # fetch URL -> "bytes seconds"
    curl -s -o /dev/null -w '%{size_download} %{time_total}\n' "$1"
}
mbps() { awk '{printf "%.1f\n", $1 / $2 / 1e6}'; }
check_size() { # check_size "bytes seconds" what
    local b=${1%% *}
    [[ "$b" -eq "$LIST_BYTES" ]] || die "$2 returned $b bytes, expected $LIST_BYTES"
}

measure_pair() { # measure_pair on|off -> fills SIM_RUNS / NGX_RUNS (MB/s, one per line)
    start_nginx "$1"
    local r i
    # One warm-up each, then RUNS interleaved pairs.
    fetch "$LIST_URL" >/dev/null
    fetch "$NGINX_URL" >/dev/null
    : >"$TMP/sim_runs.$1"
    : >"$TMP/ngx_runs.$1"
    for i in $(seq "$RUNS"); do
        r=$(fetch "$LIST_URL"); check_size "$r" "the LIST"
        echo "$r" | mbps >>"$TMP/sim_runs.$1"
        r=$(fetch "$NGINX_URL"); check_size "$r" "nginx"
        echo "$r" | mbps >>"$TMP/ngx_runs.$1"
    done
    stop_nginx
}

log "LIST throughput: $RUNS runs each, sim and nginx (sendfile on) interleaved…"
measure_pair on
log "…and again against nginx with sendfile off (for information)…"
measure_pair off
# Each ratio is taken between the runs interleaved with each other.
SIM_MBPS=$(median <"$TMP/sim_runs.on")
SIM_OFF_MBPS=$(median <"$TMP/sim_runs.off")
NGX_MBPS=$(median <"$TMP/ngx_runs.on")
NGX_OFF_MBPS=$(median <"$TMP/ngx_runs.off")
RATIO=$(awk -v a="$SIM_MBPS" -v b="$NGX_MBPS" 'BEGIN {printf "%.2f", a / b}')
RATIO_OFF=$(awk -v a="$SIM_OFF_MBPS" -v b="$NGX_OFF_MBPS" 'BEGIN {printf "%.2f", a / b}')
SIM_ALL=$(xargs <"$TMP/sim_runs.on")
SIM_OFF_ALL=$(xargs <"$TMP/sim_runs.off")
NGX_ALL=$(xargs <"$TMP/ngx_runs.on")
NGX_OFF_ALL=$(xargs <"$TMP/ngx_runs.off")
log "sim $SIM_MBPS MB/s vs nginx $NGX_MBPS MB/s: ratio $RATIO (sendfile off round: sim $SIM_OFF_MBPS vs nginx $NGX_OFF_MBPS, ratio $RATIO_OFF)"

# --- 3. memory while LISTs run concurrently ---------------------------------------------
sleep 1
BASE_KB=$(kb_field "$SIM_PID" VmRSS)
# Reset VmHWM to the current RSS, so it reports the peak of this phase only (Linux >= 4.0).
HWM_RESET=yes
echo 5 >"/proc/$SIM_PID/clear_refs" 2>/dev/null || HWM_RESET=no
sampler() {
    local max=0 samples=0 v
    while [[ ! -e "$TMP/stop-sampling" ]]; do
        v=$(kb_field "$SIM_PID" VmRSS)
        ((v > max)) && max=$v
        samples=$((samples + 1))
        echo "$max $samples" >"$TMP/peak.tmp" && mv "$TMP/peak.tmp" "$TMP/peak"
        sleep 0.05
    done
}
sampler &
SAMPLER_PID=$!
log "$CONCURRENT concurrent LISTs (baseline VmRSS $(fmt_mib "$BASE_KB"))…"
C0=$(now)
for i in $(seq "$CONCURRENT"); do
    curl -s -o /dev/null -w '%{http_code} %{size_download} %{time_total}\n' "$LIST_URL" >"$TMP/conc.$i" &
    CURL_PIDS+=($!)
done
for pid in "${CURL_PIDS[@]}"; do wait "$pid" || true; done
CURL_PIDS=()
C1=$(now)
sleep 0.2
touch "$TMP/stop-sampling"
wait "$SAMPLER_PID" || true
SAMPLER_PID=""
read -r PEAK_SAMPLED_KB SAMPLES <"$TMP/peak"
HWM_KB=$(kb_field "$SIM_PID" VmHWM)
for i in $(seq "$CONCURRENT"); do
    read -r code bytes _ <"$TMP/conc.$i"
    [[ "$code" == 200 && "$bytes" -eq "$LIST_BYTES" ]] || die "concurrent LIST $i: HTTP $code, $bytes bytes"
done
CONC_S=$(awk -v a="$C0" -v b="$C1" 'BEGIN {printf "%.2f", b - a}')
CONC_MBPS=$(awk -v n="$CONCURRENT" -v b="$LIST_BYTES" -v s="$CONC_S" 'BEGIN {printf "%.1f", n * b / s / 1e6}')
if [[ "$HWM_RESET" == yes ]]; then
    PEAK_KB=$(( HWM_KB > PEAK_SAMPLED_KB ? HWM_KB : PEAK_SAMPLED_KB ))
else
    PEAK_KB=$PEAK_SAMPLED_KB
fi
RISE_KB=$(( PEAK_KB > BASE_KB ? PEAK_KB - BASE_KB : 0 ))
RISE_LIMIT_KB=$(awk -v b="$LIST_BYTES" -v f="$RISE_FRACTION" 'BEGIN {printf "%d", b * f / 1024}')
RISE_PCT=$(awk -v r="$RISE_KB" -v b="$LIST_BYTES" 'BEGIN {printf "%.2f", 100 * r * 1024 / b}')
RSS_END_KB=$(kb_field "$SIM_PID" VmRSS)

# --- verdicts ---------------------------------------------------------------------------
pass() { if awk "BEGIN {exit !($1)}"; then echo PASS; else echo FAIL; fi; }
V_SEED=$(pass "$SEED_S < $SEED_LIMIT_S")
V_RSS=$(pass "$RSS_SEEDED_KB < $RSS_LIMIT_KB")
V_RATIO=$(pass "$RATIO >= $RATIO_MIN")
V_RISE=$(pass "$RISE_KB < $RISE_LIMIT_KB")

CPU=$(awk -F: '/model name/ {gsub(/^ +/, "", $2); print $2; exit}' /proc/cpuinfo)
MEM_GIB=$(awk '/MemTotal/ {printf "%.0f", $2 / 1048576}' /proc/meminfo)
GIT_REV=$(cd "$ROOT" && git rev-parse --short HEAD 2>/dev/null || echo unknown)
if [[ -n "$(cd "$ROOT" && git status --porcelain -- bench 2>/dev/null)" ]]; then GIT_REV="$GIT_REV + uncommitted changes in bench/"; fi

REPORT=$(cat <<EOF
## Simulated apiserver at scale (issue 2)

Command: \`bench/scripts/sim-scale.sh\` (builds with \`cargo build --release -p bench\`, then runs
\`tollgate-bench sim --nodes $NODES --pods $PODS --pod-bytes $POD_BYTES --namespaces $NAMESPACES --listen 127.0.0.1:0\`).

Machine: $(nproc) cores ($CPU), $MEM_GIB GiB RAM, $(uname -sr); curl $(curl --version | awk 'NR==1 {print $2}'),
nginx $("$NGINX" -v 2>&1 | awk -F/ '{print $2}'). Run $(date -u +'%Y-%m-%d %H:%M UTC') at $GIT_REV. Server, curl and
nginx share the $(nproc) cores, so every throughput is a loopback figure bounded by both ends. Load average
(1/5/15 min) at the start: $LOAD_START, at the end: $(cut -d' ' -f1-3 /proc/loadavg) (other work on the machine, such
as concurrent cargo builds, makes the throughputs noisier; the ratio is taken from interleaved runs for that reason).

| figure | value | target | result |
|---|---|---|---|
| seeding time (process start → ready line) | ${SEED_S} s (seeding itself: ${SEED_INTERNAL_MS:-?} ms) | < ${SEED_LIMIT_S} s | $V_SEED |
| RSS once seeded (VmRSS) | $(fmt_mib "$RSS_SEEDED_KB") (VmHWM so far $(fmt_mib "$HWM_SEEDED_KB")) | < 3 GiB | $V_RSS |
| one full LIST (\`GET /api/v1/pods\`) | $LIST_BYTES bytes, $ITEMS pods ($((LIST_BYTES / ITEMS)) bytes each on average) | — | — |
| LIST throughput, median of $RUNS | $SIM_MBPS MB/s (runs: $SIM_ALL) | — | — |
| nginx, same file size, sendfile on, median of $RUNS | $NGX_MBPS MB/s (runs: $NGX_ALL) | — | — |
| ratio sim / nginx (sendfile on) | $RATIO | ≥ $RATIO_MIN | $V_RATIO |
| for information: second round against nginx with sendfile off, medians of $RUNS | sim $SIM_OFF_MBPS MB/s (runs: $SIM_OFF_ALL), nginx $NGX_OFF_MBPS MB/s (runs: $NGX_OFF_ALL); ratio $RATIO_OFF | — | — |
| $CONCURRENT concurrent full LISTs | all complete in ${CONC_S} s ($CONC_MBPS MB/s together) | — | — |
| RSS before them → peak during them | $(fmt_mib "$BASE_KB") → $(fmt_mib "$PEAK_KB") (VmRSS sampled $SAMPLES× every ~50 ms: $(fmt_mib "$PEAK_SAMPLED_KB"); VmHWM after reset: $(fmt_mib "$HWM_KB")$([[ $HWM_RESET == yes ]] || echo ", not reset"); after: $(fmt_mib "$RSS_END_KB")) | — | — |
| RSS rise during $CONCURRENT concurrent LISTs | $(fmt_mib "$RISE_KB") = ${RISE_PCT}% of one LIST | < 10% of one LIST ($(fmt_mib "$RISE_LIMIT_KB")) | $V_RISE |

How it is measured: seeding time from just before the process is started to the moment its
"serving the Kubernetes API at" line appears on stdout (polled every 20 ms); RSS from
\`/proc/PID/status\`. Throughput is \`curl -s -o /dev/null -w '%{size_download} %{time_total}'\`,
size over total time, MB = 10^6 bytes; one warm-up download each, then sim and nginx interleaved.
nginx runs from its own temp prefix and conf on a free 127.0.0.1 port, one worker, serving the
LIST response saved to a file (same bytes); \`sendfile on\` is the baseline because it is what
Debian's nginx.conf ships and the stronger peer (zero-copy from the page cache); the ratio against
\`sendfile off\` (a second round of interleaved runs) is shown for information.
For the concurrent LISTs, VmHWM is reset (\`echo 5 > /proc/PID/clear_refs\`) just before they
start, and the peak is the larger of the sampled VmRSS and that VmHWM.
EOF
)

echo
echo "$REPORT"
echo

if [[ "$RESULTS" != "-" ]]; then
    # Replace this section (up to the next "## " heading) and keep any others.
    touch "$RESULTS"
    if [[ ! -s "$RESULTS" ]]; then
        printf '# Benchmark results\n\nFigures recorded by the benchmarks under bench/; each section names the command that produced it.\n' >"$RESULTS"
    fi
    printf '%s\n' "$REPORT" >"$TMP/section.md"
    awk -v sec="$TMP/section.md" '
        function put() { while ((getline l < sec) > 0) print l; done = 1 }
        /^## Simulated apiserver at scale \(issue 2\)/ { skip = 1; if (!done) { put(); print "" }; next }
        skip && /^## / { skip = 0 }
        !skip { print }
        END { if (!done) { print ""; put() } }
    ' "$RESULTS" >"$TMP/results.md"
    # Drop a trailing blank line the replacement may leave.
    awk 'NF {for (; n > 0; n--) print ""; print; next} {n++}' "$TMP/results.md" >"$RESULTS"
    log "written to $RESULTS"
fi

[[ "$V_SEED$V_RSS$V_RATIO$V_RISE" == PASSPASSPASSPASS ]] || exit 2
