#!/usr/bin/env bash
# tollgate's per-request cost as users measure it (issue 36): closed-loop saturation drivers (wrk
# over HTTP/1.1, h2load over HTTP/2, as most people benchmark a proxy) beside the fixed-rate
# loadgen driver with client certificates, tollgate in its DEFAULT configuration as the headline
# row, against nginx and HAProxy in their default production configuration and pinned to one
# worker, and the minimal hyper proxy. tls-bench.sh is the fixed-rate, one-worker version (issue 21).
#
#   upstream  nginx (one worker) over HTTPS (h2 and http/1.1, as kube-apiserver offers), verifying
#             a client certificate when one is presented (front-proxy CA), as kube-apiserver does;
#             a 1 KB JSON document for every API path, a BIG_MB body for LIST configmaps, /readyz. TLS=0: plain HTTP everywhere (proxy-bench's shape).
#   proxies   tollgate      release tollgate with no flags beyond TLS and upstream: default mode,
#                           default runtime threads (one per core), default upstream protocol
#                           (--tls-cert-file/--tls-private-key-file, --client-ca-file,
#                           --front-proxy-cert/-key, --upstream-ca, --upstream-client-cert/-key);
#             tollgate-1w   the same with TOKIO_WORKER_THREADS=1;
#             tollgate-h1up the same with one worker and `upstream.lightProtocol: http1` (tuned);
#             tollgate-base the default configuration of an earlier build, BASE_BIN (before/after);
#             minproxy      bench/src/bin/minproxy.rs, TLS both sides, nothing else;
#             nginx, haproxy          default production shape: `worker_processes auto`, HAProxy's
#                                     default threads (one per core);
#             nginx-1w, haproxy-1w    `worker_processes 1`, `nbthread 1`.
#             nginx and HAProxy verify client certificates when presented (optional, as tollgate
#             and minproxy here: wrk and h2load present none), pass CN/O as X-Remote-User/-Group,
#             re-encrypt to the upstream with the front-proxy certificate over kept-alive
#             connections, no access logs.
#   drivers   wrk-cN        wrk -t1 -cN --latency (HTTP/1.1, N connections, closed loop);
#             h2load-cN     h2load -c(N/8) -m8 (HTTP/2, N streams over N/8 connections, closed loop);
#             loadgen-h1|h2 loadgen with a client certificate, offered OFFERED/s with at most
#                           INFLIGHT outstanding (saturating: the completed rate is the maximum).
#             Each driver runs DURATION s per proxy per round, interleaved, after WARM s unmeasured.
#
# COUNT=cpu (default): CPU = utime+stime of the proxy's processes (all nginx workers) before/after
# each run, per request completed; a quiet machine is needed for these to mean much. The log says
# how many of those ticks were the kernel's (stime): with COUNT=syscalls, what one system call weighs.
# COUNT=callgrind: every proxy runs under `valgrind --tool=callgrind` and the figure is
# instructions per request, stable on a loaded machine, so usable while other builds run: after
# the warm-up, a SHORT-second run and a DURATION-second run, counters dumped after each; the figure
# is (long - short) / (requests long - requests short), the marginal cost of a request without the
# runs' TLS handshakes (printed beside it: the long run's own figure, handshakes included).
# Instructions are user space only: the kernel's share (syscalls, TCP) is not in them. Throughput and latency under valgrind mean
# nothing and are not reported in that mode. CALLGRIND_KEEP=dir keeps the dumps (annotate them with
# `callgrind_annotate --inclusive=yes FILE`).
# COUNT=syscalls: strace -c attached to the proxy's processes during each run: system calls per
# request (the kernel's share, which instruction counts leave out); strace slows the proxy, so
# only the count means anything.
# BIG=1: then BIG_GETS downloads of BIG_MB through each proxy (curl, HTTP/1.1), cost per GB.
# LATENCY=1 (COUNT=cpu): loadgen open loop at half the better peer's loadgen-h1 saturation rate
# (h1 and h2), against the upstream directly and through each proxy: p50/p99 added.
#
# Environment (defaults): DRIVERS="wrk-c32 wrk-c256 h2load-c32 h2load-c256 loadgen-h1 loadgen-h2"
#   PROXIES="tollgate tollgate-1w tollgate-h1up minproxy nginx nginx-1w haproxy haproxy-1w"
#   ROUNDS=3 DURATION=5 WARM=1 (callgrind: 20 and 5) OFFERED=40000 INFLIGHT=32 BIG=1 BIG_MB=200 BIG_GETS=2 LATENCY=1
#   LAT_DURATION=8 LAT_ROUNDS=ROUNDS LAT_RATE= (default: half the better peer's loadgen-h1 rate) TLS=1 KEY=rsa|ec PIN= (pin every proxy to this CPU) SKIP_BUILD= BIN_DIR=target/release
#   RESULTS=- (print only; a path writes the section "Cost per request as users measure it",
#   keeping the "###" subsections written by hand under it)
# Debian packages it needs (nginx, haproxy, wrk, nghttp2-client for h2load, valgrind, strace, curl,
# openssl, python3) are installed with apt-get when missing and run as root (else it says what to run).
# Loopback only; everything it starts is killed by pid on exit.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
COUNT=${COUNT:-cpu}
read -r -a DRIVERS <<<"${DRIVERS:-wrk-c32 wrk-c256 h2load-c32 h2load-c256 loadgen-h1 loadgen-h2}"
# DRIVERS=none: only the per-GB downloads (BIG=1).
[[ ${DRIVERS[*]} != none ]] || DRIVERS=()
read -r -a PROXIES <<<"${PROXIES:-tollgate tollgate-1w tollgate-h1up minproxy nginx nginx-1w haproxy haproxy-1w}"
ROUNDS=${ROUNDS:-3}
# Under valgrind a proxy serves ~50 times slower: longer runs amortize each run's TLS handshakes
# (every driver run opens its connections anew, as users' runs do).
if [[ ${COUNT:-cpu} != callgrind ]]; then DURATION=${DURATION:-5} WARM=${WARM:-1} KEY=${KEY:-rsa}; else DURATION=${DURATION:-20} WARM=${WARM:-5} SHORT=${SHORT:-8} KEY=${KEY:-ec}; fi
OFFERED=${OFFERED:-40000}
INFLIGHT=${INFLIGHT:-32}
BIG=${BIG:-1}
BIG_MB=${BIG_MB:-200}
BIG_GETS=${BIG_GETS:-2}
LATENCY=${LATENCY:-1}
LAT_DURATION=${LAT_DURATION:-8}
LAT_ROUNDS=${LAT_ROUNDS:-$ROUNDS}
TLS=${TLS:-1}
PIN=${PIN:-}
RESULTS=${RESULTS:--}
SMALL_PATH=/api/v1/namespaces/default/pods/loadgen-pod-0
BIG_PATH=/api/v1/configmaps
case $COUNT in cpu | callgrind | syscalls) ;; *) echo "cost-bench: COUNT=cpu|callgrind|syscalls" >&2; exit 64 ;; esac
[[ $COUNT == cpu ]] || LATENCY=0
[[ $COUNT != syscalls ]] || BIG=0

BENCH=cost-bench
# shellcheck source=lib.sh
source "$ROOT/bench/scripts/lib.sh"
# What the run needs, installed from Debian's packages when missing (a fresh machine has none of
# the peers or drivers): the peers and the upstream, each driver the run uses, the counter.
NEED=(curl curl openssl openssl awk gawk python3 python3 nginx nginx haproxy haproxy)
for d in "${DRIVERS[@]}"; do
    case $d in
    wrk-c*) NEED+=(wrk wrk) ;;
    h2load-c*) ((TLS)) || die "plain HTTP (TLS=0): wrk and loadgen-h1 only"
        NEED+=(h2load nghttp2-client) ;;
    loadgen-h1 | loadgen-h2) ;;
    *) die "unknown driver $d" ;;
    esac
done
[[ $COUNT != callgrind ]] || NEED+=(valgrind valgrind callgrind_control valgrind)
[[ $COUNT != syscalls ]] || NEED+=(strace strace)
apt_need "${NEED[@]}"
PATH=$PATH:/usr/sbin
CLK_TCK=$(getconf CLK_TCK)
bench_init

if [[ -z "${SKIP_BUILD:-}" ]]; then
    log "building release binaries (tollgate, minproxy, loadgen)…"
    (cd "$ROOT" && cargo build --release --locked -q -p tollgate -p bench -p loadgen \
        --bin tollgate --bin minproxy --bin loadgen)
fi
BIN_DIR=${BIN_DIR:-${CARGO_TARGET_DIR:-$ROOT/target}/release}
NEEDED=()
[[ " ${PROXIES[*]} " != *" tollgate-base "* || -x ${BASE_BIN:-} ]] || die "tollgate-base needs BASE_BIN=path of an earlier tollgate build"
for p in "${PROXIES[@]}"; do case $p in tollgate*) NEEDED+=(tollgate) ;; minproxy) NEEDED+=(minproxy) ;; esac; done
[[ "${DRIVERS[*]} $LATENCY" != *loadgen* && $LATENCY == 0 ]] || NEEDED+=(loadgen)
for b in "${NEEDED[@]}"; do [[ -x $BIN_DIR/$b ]] || die "$BIN_DIR/$b is missing: run without SKIP_BUILD"; done

# --- certificates (as tls-bench.sh: serving, client and front-proxy CAs, RSA 2048) ------------
PKI=$TMP/pki
mkdir -p "$PKI"
# KEY=rsa (kubeadm's RSA 2048; the default) or ec (P-256; COUNT=callgrind's default: under valgrind
# an RSA signature takes ~10 M instructions, so a run's handshakes would not be done within the
# short run and leak into the marginal cost; key types change handshakes, not requests).
if [[ $KEY == ec ]]; then NEWKEY=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1); else NEWKEY=(-newkey rsa:2048); fi
ca() { openssl req -x509 -new -nodes "${NEWKEY[@]}" -days 2 -subj "/CN=$2" \
    -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign \
    -keyout "$PKI/$1.key" -out "$PKI/$1.crt" 2>/dev/null; }
leaf() { # leaf NAME CA SUBJECT EXTENSIONS
    openssl req -new -nodes "${NEWKEY[@]}" -subj "$3" -keyout "$PKI/$1.key" -out "$PKI/$1.csr" 2>/dev/null
    printf '%b\n' "$4" >"$PKI/$1.ext"
    openssl x509 -req -in "$PKI/$1.csr" -CA "$PKI/$2.crt" -CAkey "$PKI/$2.key" -CAcreateserial \
        -days 2 -extfile "$PKI/$1.ext" -out "$PKI/$1.crt" 2>/dev/null
    cat "$PKI/$1.crt" "$PKI/$1.key" >"$PKI/$1.pem"
}
ca serving-ca cost-bench-serving-ca
ca client-ca cost-bench-client-ca
ca front-proxy-ca cost-bench-front-proxy-ca
leaf server serving-ca /CN=127.0.0.1 \
    "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1,DNS:localhost"
leaf user client-ca "/O=system:masters/CN=bench-admin" \
    "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth"
leaf front-proxy front-proxy-ca /CN=front-proxy-client \
    "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth"
chmod 644 "$PKI"/*
chmod 755 "$PKI"
if ((TLS)); then
    S=https
    CURL_TLS=(--cacert "$PKI/serving-ca.crt" --cert "$PKI/user.crt" --key "$PKI/user.key")
    LOADGEN_TLS=(--certificate-authority "$PKI/serving-ca.crt" --client-certificate "$PKI/user.crt" --client-key "$PKI/user.key")
else
    S=http
    CURL_TLS=()
    LOADGEN_TLS=()
fi

# --- upstream (a client certificate is verified if presented, as kube-apiserver does: wrk's
# anonymous requests go through tollgate without one) ----------------------------------------------------------------------------------
upstream_files "$TMP/www" "$((BIG_MB * 1024 * 1024))"
UP_PORT=$(free_port)
if ((TLS)); then
    nginx_conf "$TMP/up" "$UP_PORT ssl http2" "root $TMP/www;
        ssl_certificate $PKI/server.crt;
        ssl_certificate_key $PKI/server.key;
        ssl_client_certificate $PKI/front-proxy-ca.crt;
        ssl_verify_client optional;
        location = /readyz { return 200 ok; }
        location = $BIG_PATH { rewrite ^ /big.bin break; }
        location /api/ { rewrite ^ /small.json break; }" "keepalive_timeout 600s;"
else
    nginx_conf "$TMP/up" "$UP_PORT" "root $TMP/www;
        location = /readyz { return 200 ok; }
        location = $BIG_PATH { rewrite ^ /big.bin break; }
        location /api/ { rewrite ^ /small.json break; }" "keepalive_timeout 600s;"
fi
nginx -p "$TMP/up" -c "$TMP/up/nginx.conf" >"$TMP/up/logs/stdout" 2>&1 &
PIDS+=($!)
UPSTREAM=$S://127.0.0.1:$UP_PORT
UP_CURL=()
((TLS)) && UP_CURL=(--cacert "$PKI/serving-ca.crt" --cert "$PKI/front-proxy.crt" --key "$PKI/front-proxy.key")
for _ in $(seq 200); do curl -sf "${UP_CURL[@]}" -o /dev/null "$UPSTREAM/readyz" && break; sleep 0.05; done
curl -sf "${UP_CURL[@]}" -o /dev/null "$UPSTREAM/readyz" || die "upstream nginx did not answer"
SMALL_MD5=$(md5sum <"$TMP/www/small.json")

# --- proxies -----------------------------------------------------------------------------------
declare -A URL PID ROOTPID
PIN_CMD=()
[[ -z "$PIN" ]] || PIN_CMD=(taskset -c "$PIN")
# Under COUNT=callgrind every proxy runs inside valgrind (children traced: nginx's workers).
VG=()
[[ $COUNT != callgrind ]] || VG=(valgrind --tool=callgrind --dump-instr=no --trace-children=yes
    "--callgrind-out-file=$TMP/cg/%p.out")
# nginx's workers run as an unprivileged user: they write their dumps there too.
mkdir -p "$TMP/cg"
chmod 777 "$TMP/cg"

start_tollgate() { # start_tollgate NAME WORKERS(""=default) CONFIG
    local env=() tls=()
    [[ -z $2 ]] || env=(TOKIO_WORKER_THREADS="$2")
    ((TLS)) && tls=(--upstream-ca "$PKI/serving-ca.crt" --tls-cert-file "$PKI/server.crt"
        --tls-private-key-file "$PKI/server.key" --client-ca-file "$PKI/client-ca.crt"
        --front-proxy-cert "$PKI/front-proxy.crt" --front-proxy-key "$PKI/front-proxy.key"
        --upstream-client-cert "$PKI/front-proxy.crt" --upstream-client-key "$PKI/front-proxy.key")
    [[ -z $3 ]] || tls+=(--config "$3")
    env "${env[@]}" "${PIN_CMD[@]}" "${VG[@]}" "${TOLLGATE:-$BIN_DIR/tollgate}" --listen 127.0.0.1:0 \
        --admin-listen 127.0.0.1:0 --upstream "$UPSTREAM" "${tls[@]}" >"$TMP/$1.out" 2>"$TMP/$1.err" &
    PIDS+=($!)
    PID[$1]=${PIDS[-1]}
    URL[$1]=$(wait_line "$TMP/$1.out" "tollgate serving at " "${PID[$1]}" "$1")
}
start_minproxy() {
    local tls=()
    ((TLS)) && tls=(--tls-cert "$PKI/server.crt" --tls-key "$PKI/server.key" --client-ca "$PKI/client-ca.crt"
        --client-ca-optional --upstream-ca "$PKI/serving-ca.crt" --upstream-client-cert "$PKI/front-proxy.crt"
        --upstream-client-key "$PKI/front-proxy.key")
    "${PIN_CMD[@]}" "${VG[@]}" "$BIN_DIR/minproxy" --listen 127.0.0.1:0 --upstream "$UPSTREAM" "${tls[@]}" \
        >"$TMP/minproxy.out" 2>&1 &
    PIDS+=($!)
    PID[minproxy]=${PIDS[-1]}
    URL[minproxy]=$(wait_line "$TMP/minproxy.out" "minproxy serving at " "${PID[minproxy]}" minproxy)
}
start_nginx() { # start_nginx NAME WORKERS
    local port dir=$TMP/$1 listen ssl="" up=http
    port=$(free_port)
    listen=$port
    if ((TLS)); then
        listen="$port ssl http2"
        up=https
        ssl="ssl_certificate $PKI/server.crt;
        ssl_certificate_key $PKI/server.key;
        ssl_client_certificate $PKI/client-ca.crt;
        ssl_verify_client optional;
        proxy_ssl_certificate $PKI/front-proxy.crt;
        proxy_ssl_certificate_key $PKI/front-proxy.key;
        proxy_ssl_trusted_certificate $PKI/serving-ca.crt;
        proxy_ssl_verify on;
        proxy_ssl_name localhost;
        proxy_ssl_session_reuse on;"
    fi
    nginx_conf "$dir" "$listen" "$ssl
        location / {
            proxy_pass $up://up;
            proxy_http_version 1.1;
            proxy_set_header Connection \"\";
            proxy_set_header X-Remote-User \$remote_user_cn;
            proxy_set_header X-Remote-Group \$remote_group_o;
            proxy_buffering off;
            proxy_buffer_size 64k;
            proxy_buffers 4 64k;
        }" "upstream up { server 127.0.0.1:$UP_PORT; keepalive 64; keepalive_timeout 600s; }
    keepalive_timeout 600s;
    map \$ssl_client_s_dn \$remote_user_cn { default \"\"; ~CN=(?<cn>[^,/]+) \$cn; }
    map \$ssl_client_s_dn \$remote_group_o { default \"\"; ~O=(?<o>[^,/]+) \$o; }"
    sed -i "s/^worker_processes 1;/worker_processes $2;/" "$dir/nginx.conf"
    # Under valgrind the workers stay root: callgrind_control cannot reach a process that
    # changed its user after valgrind made its control pipes.
    [[ $COUNT != callgrind || $(id -u) != 0 ]] || sed -i "1i user root;" "$dir/nginx.conf"
    "${PIN_CMD[@]}" "${VG[@]}" nginx -p "$dir" -c "$dir/nginx.conf" >"$dir/logs/stdout" 2>&1 &
    PIDS+=($!)
    PID[$1]=${PIDS[-1]}
    URL[$1]=$S://127.0.0.1:$port
}
start_haproxy() { # start_haproxy NAME THREADS(""=default)
    local port bind="" srv=""
    port=$(free_port)
    if ((TLS)); then
        bind="ssl crt $PKI/server.pem ca-file $PKI/client-ca.crt verify optional alpn h2,http/1.1"
        srv="ssl crt $PKI/front-proxy.pem ca-file $PKI/serving-ca.crt verify required"
    fi
    cat >"$TMP/$1.cfg" <<EOF
global
    maxconn 4096
    ${2:+nbthread $2}
defaults
    mode http
    timeout connect 5s
    timeout client 600s
    timeout server 600s
    timeout http-keep-alive 600s
    option http-keep-alive
    http-reuse always
frontend clients
    bind 127.0.0.1:$port $bind
    http-request del-header X-Remote-User
    http-request del-header X-Remote-Group
    $( ((TLS)) && echo "http-request set-header X-Remote-User %[ssl_c_s_dn(CN)] if { ssl_c_used }
    http-request set-header X-Remote-Group %[ssl_c_s_dn(O)] if { ssl_c_used }")
    default_backend upstream
backend upstream
    server up 127.0.0.1:$UP_PORT $srv
EOF
    "${PIN_CMD[@]}" "${VG[@]}" haproxy -db -f "$TMP/$1.cfg" >"$TMP/$1.out" 2>&1 &
    PIDS+=($!)
    PID[$1]=${PIDS[-1]}
    URL[$1]=$S://127.0.0.1:$port
}
cat >"$TMP/h1up.yaml" <<EOF
upstream:
  lightProtocol: http1
EOF
for p in "${PROXIES[@]}"; do
    case $p in
    tollgate) start_tollgate "$p" "" "" ;;
    tollgate-base) TOLLGATE=$BASE_BIN start_tollgate "$p" "" "" ;;
    tollgate-1w) start_tollgate "$p" 1 "" ;;
    tollgate-h1up) start_tollgate "$p" 1 "$TMP/h1up.yaml" ;;
    minproxy) start_minproxy ;;
    nginx) start_nginx "$p" auto ;;
    nginx-1w) start_nginx "$p" 1 ;;
    haproxy) start_haproxy "$p" "" ;;
    haproxy-1w) start_haproxy "$p" 1 ;;
    *) die "unknown proxy $p" ;;
    esac
done
# The processes whose CPU counts: nginx's workers (children of its master), else the process.
procs() { # procs NAME
    case $1 in
    nginx*) cat "/proc/${PID[$1]}/task/${PID[$1]}/children" 2>/dev/null ;;
    *) echo "${PID[$1]}" ;;
    esac
}
cpu_ticks() { # cpu_ticks NAME
    local t=0 pid
    for pid in $(procs "$1"); do t=$((t + $(awk '{print $14 + $15}' "/proc/$pid/stat"))); done
    echo "$t"
}
# The kernel's part of those ticks (stime): CPU time is user space (what COUNT=callgrind counts)
# plus this, so the split says what one system call weighs against instructions.
sys_ticks() { # sys_ticks NAME
    local t=0 pid
    for pid in $(procs "$1"); do t=$((t + $(awk '{print $15}' "/proc/$pid/stat"))); done
    echo "$t"
}
for p in "${PROXIES[@]}"; do
    for _ in $(seq 600); do curl -sf "${CURL_TLS[@]}" -o /dev/null "${URL[$p]}$SMALL_PATH" && break; sleep 0.1; done
    # Plain HTTP: HTTP/1.1 only (nginx and HAProxy speak h2c only when told to).
    vs=(--http1.1 --http2)
    ((TLS)) || vs=(--http1.1)
    for v in "${vs[@]}"; do
        got=$(curl -sf "${CURL_TLS[@]}" "$v" "${URL[$p]}$SMALL_PATH" | md5sum) || true
        [[ "$got" == "$SMALL_MD5" ]] || die "$p does not forward the small GET ($v); see $TMP"
    done
    log "$p: ${URL[$p]} (pid ${PID[$p]}: $(procs "$p" | tr '\n' ' '))"
done

# --- drivers -----------------------------------------------------------------------------------
# drive NAME DRIVER SECONDS OUT [warm]: runs DRIVER against NAME; sets DONE (requests completed), RATE,
# P50 and P99 (ms; "-" where the driver gives none).
drive() {
    local url=${URL[$1]}$SMALL_PATH n c out=$4
    DONE=0 RATE=0 P50=- P99=-
    case $2 in
    wrk-c*)
        c=${2#wrk-c}
        wrk -t1 -c"$c" -d"$3s" --timeout 60s --latency "$url" >"$out" 2>&1 || die "wrk failed: $(tail -3 "$out")"
        DONE=$(awk '/requests in/ {print $1}' "$out")
        RATE=$(awk '/^Requests\/sec/ {printf "%.0f", $2}' "$out")
        P50=$(awk '$1 == "50%" {print $2}' "$out")
        P99=$(awk '$1 == "99%" {print $2}' "$out")
        [[ -n ${5:-} ]] || ! grep -q "Non-2xx\|Socket errors" "$out" || die "$1: errors under $2: $(grep "Non-2xx\|Socket errors" "$out")"
        ;;
    h2load-c*)
        c=${2#h2load-c}
        n=$(((c + 7) / 8))
        h2load -c"$n" -m8 -D"$3" "$url" >"$out" 2>&1 || die "h2load failed: $(tail -3 "$out")"
        DONE=$(awk '/^requests:/ {print $8}' "$out")
        RATE=$(awk '/^finished in/ {sub(",", "", $4); printf "%.0f", $4}' "$out")
        [[ -n ${5:-} ]] || grep -q " 0 failed, 0 errored" "$out" || die "$1: h2load errors under $2; see $out"
        ;;
    loadgen-h1 | loadgen-h2)
        local version=2
        [[ $2 == loadgen-h1 ]] && version=1.1
        rm -rf "$out.d"
        KUBECONFIG=/dev/null "$BIN_DIR/loadgen" --server "${URL[$1]}" "${LOADGEN_TLS[@]}" --http-version "$version" \
            --gets "$OFFERED/s" --duration "$3s" --max-in-flight "$INFLIGHT" --max-connections "$INFLIGHT" \
            --objects 1 --namespace default --timeout 10s --drain-timeout 10s --no-progress \
            --output "$out.d" >"$out" 2>&1 || die "loadgen failed: $(tail -3 "$out")"
        read -r DONE RATE P50 P99 err < <(python3 - "$out.d/summary.json" <<'PY'
import json, sys
op = json.load(open(sys.argv[1]))["operations"][0]
l = op["latency_ms"]
print(op["ok"], round(op["rate_per_s"]), l["p50"], l["p99"], op["errors"])
PY
        )
        ((err == 0)) || die "$1: $err errors under $2; see $out"
        ;;
    esac
    [[ -n ${5:-} || ( -n $DONE && $DONE -gt 0 ) ]] || die "$1: no requests completed under $2; see $out"
}
# wrk prints latencies with units (e.g. 1.23ms, 850.00us): in ms.
to_ms() { awk -v v="$1" 'BEGIN {if (v == "-") {print "-"; exit} u = v; sub(/[0-9.]+/, "", u); x = v + 0;
    if (u == "us") x /= 1000; else if (u == "s") x *= 1000; printf "%.2f", x}'; }

# Callgrind: the instruction counters of NAME's processes zeroed, then dumped and summed.
cg_pids() { # the valgrind'd processes of NAME: for nginx, its workers
    procs "$1"
}
# valgrind takes a command when the process next runs: one blocked in epoll_wait is woken by
# connections to its port (opened and closed at once) until the command is through.
cg_cmd() { # cg_cmd NAME PID -z|-d
    local ctl port=${URL[$1]##*:} i
    timeout 120 callgrind_control "$3" "$2" >/dev/null 2>&1 &
    ctl=$!
    for i in $(seq 600); do
        kill -0 "$ctl" 2>/dev/null || break
        (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null || true
        sleep 0.2
    done
    wait "$ctl" || die "callgrind_control $3 $2 failed"
}
cg_zero() { local pid; for pid in $(cg_pids "$1"); do cg_cmd "$1" "$pid" -z; done; }
cg_dump() { # prints the instructions since cg_zero
    local pid total=0 f n
    for pid in $(cg_pids "$1"); do
        rm -f "$TMP/cg/$pid.out".*
        cg_cmd "$1" "$pid" -d
        for _ in $(seq 100); do
            f=$(ls "$TMP/cg/$pid.out".* 2>/dev/null | tail -1 || true)
            [[ -n $f ]] && grep -q '^totals:' "$f" && break
            sleep 0.1
        done
        n=$(awk '/^totals:/ {print $2}' "$f")
        total=$((total + n))
        [[ -z "${CALLGRIND_KEEP:-}" ]] || { mkdir -p "$CALLGRIND_KEEP"; cp "$f" "$CALLGRIND_KEEP/$1.$CUR.$pid.out"; }
    done
    echo "$total"
}

declare -A C N RATES P50S P99S WITH_HS WITH_HS_N
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
START=$(date +%s)
for r in $(seq "$ROUNDS"); do
    for d in "${DRIVERS[@]}"; do
        for p in "${PROXIES[@]}"; do
            CUR=$d.r$r
            drive "$p" "$d" "$WARM" "$TMP/warm.$p.$d" warm # connections opened, pools filled
            if [[ $COUNT == cpu ]]; then
                t0=$(cpu_ticks "$p") s0=$(sys_ticks "$p")
                drive "$p" "$d" "$DURATION" "$TMP/run.$p.$d.$r"
                c=$(($(cpu_ticks "$p") - t0))
                log "round $r $d $p: $(($(sys_ticks "$p") - s0)) of the $c ticks in the kernel"
            elif [[ $COUNT == syscalls ]]; then
                # strace attached to every thread for the run: the kernel's share, which
                # instruction counts leave out, as system calls per request.
                args=()
                for pid in $(procs "$p"); do args+=(-p "$pid"); done
                strace -c -f -o "$TMP/strace.$p.$d.$r" "${args[@]}" 2>/dev/null &
                st=$!
                sleep 1
                drive "$p" "$d" "$DURATION" "$TMP/run.$p.$d.$r"
                kill -INT "$st"
                wait "$st" || true
                c=$(awk '$NF == "total" {print $(NF - 2)}' "$TMP/strace.$p.$d.$r")
                [[ -n $c ]] || die "no strace summary for $p"
            else
                # The marginal cost: a short run, then a long one, each opening its connections
                # anew; their difference is requests without handshakes, whose RSA signatures
                # would otherwise weigh far more in a valgrind run's few thousand requests than
                # in a real run's hundreds of thousands.
                cg_zero "$p"
                drive "$p" "$d" "$SHORT" "$TMP/short.$p.$d.$r"
                short_done=$DONE
                short_c=$(cg_dump "$p")
                drive "$p" "$d" "$DURATION" "$TMP/run.$p.$d.$r"
                c=$(cg_dump "$p")
                WITH_HS[$p.$d]=$((${WITH_HS[$p.$d]:-0} + c))
                WITH_HS_N[$p.$d]=$((${WITH_HS_N[$p.$d]:-0} + DONE))
                ((DONE > short_done)) || die "$p: the long run under $d served no more than the short one"
                c=$((c - short_c))
                DONE=$((DONE - short_done))
            fi
            C[$p.$d]=$((${C[$p.$d]:-0} + c))
            N[$p.$d]=$((${N[$p.$d]:-0} + DONE))
            RATES[$p.$d]="${RATES[$p.$d]:-}${RATES[$p.$d]:+ }$RATE"
            P50S[$p.$d]="${P50S[$p.$d]:-}${P50S[$p.$d]:+ }$(to_ms "$P50")"
            P99S[$p.$d]="${P99S[$p.$d]:-}${P99S[$p.$d]:+ }$(to_ms "$P99")"
            log "round $r $d $p: $DONE requests ($RATE/s), $c $(case $COUNT in cpu) echo ticks ;; callgrind) echo instructions ;; *) echo system calls ;; esac)"
        done
    done
done
# Per GB: BIG_GETS downloads of BIG_MB over one connection per proxy (curl, HTTP/1.1).
declare -A GB
if ((BIG)); then
    for p in "${PROXIES[@]}"; do
        urls=()
        for _ in $(seq "$BIG_GETS"); do urls+=(-o /dev/null "${URL[$p]}$BIG_PATH"); done
        CUR=big
        if [[ $COUNT == cpu ]]; then t0=$(cpu_ticks "$p"); else cg_zero "$p"; fi
        b=$(curl -s --http1.1 "${CURL_TLS[@]}" -w '%{size_download}\n' "${urls[@]}" | awk '{s += $1} END {printf "%.0f", s}')
        if [[ $COUNT == cpu ]]; then c=$(($(cpu_ticks "$p") - t0)); else c=$(cg_dump "$p"); fi
        ((b == BIG_GETS * BIG_MB * 1024 * 1024)) || die "$p: $b bytes of the big LISTs"
        GB[$p]=$(awk -v c="$c" -v b="$b" -v hz="$CLK_TCK" -v cpu="$([[ $COUNT == cpu ]] && echo 1 || echo 0)" \
            'BEGIN {if (cpu) printf "%.3f s", c / hz / (b / 1e9); else printf "%.0f M", c / (b / 1e9) / 1e6}')
        log "big $p: $b bytes, ${GB[$p]} per GB"
    done
fi
for p in "${PROXIES[@]}"; do kill -0 "${PID[$p]}" 2>/dev/null || die "$p exited during the runs"; done

# --- latency at half the better peer's saturation rate ------------------------------------------
declare -A L50 L99
mean() { tr ' ' '\n' | awk '$1 != "-" {s += $1; n++} END {printf "%.0f", n ? s / n : 0}'; }
if ((LATENCY)); then
    if [[ -z ${LAT_RATE:-} ]]; then
        best=0
        for p in nginx haproxy nginx-1w haproxy-1w; do
            [[ -n ${RATES[$p.loadgen-h1]:-} ]] || continue
            m=$(mean <<<"${RATES[$p.loadgen-h1]}")
            ((m > best)) && best=$m
        done
        ((best > 0)) || die "LATENCY=1 needs a peer and the loadgen-h1 driver, or LAT_RATE"
        LAT_RATE=$((best / 2))
    fi
    lat() { # lat NAME URL h1|h2 [direct]: appends this run's p50 and p99 to L50/L99
        local v=2 out=$TMP/lat.$1.$3 tls=("${LOADGEN_TLS[@]}") p50 p99
        [[ $3 == h1 ]] && v=1.1
        ((TLS)) && [[ -n ${4:-} ]] && tls=(--certificate-authority "$PKI/serving-ca.crt"
            --client-certificate "$PKI/front-proxy.crt" --client-key "$PKI/front-proxy.key")
        rm -rf "$out"
        KUBECONFIG=/dev/null "$BIN_DIR/loadgen" --server "$2" "${tls[@]}" --http-version "$v" --gets "$LAT_RATE/s" \
            --schedule steps --steps 2 --step-duration 2s --duration "$((LAT_DURATION + 2))s" \
            --max-in-flight 1000 --max-connections 64 --objects 1 --namespace default --timeout 10s \
            --drain-timeout 10s --no-progress --output "$out" >"$out.log" 2>&1 || die "loadgen latency run failed"
        read -r p50 p99 < <(python3 - "$out/summary.json" <<'PY'
import json, sys
op = json.load(open(sys.argv[1]))["operations"][0]
l = (op.get("steps") or [op])[-1]["latency_ms"]
print(l["p50"], l["p99"])
PY
        )
        L50[$1.$3]="${L50[$1.$3]:-} $p50"
        L99[$1.$3]="${L99[$1.$3]:-} $p99"
        log "latency round $r $1 $3 at $LAT_RATE/s: p50 $p50 ms, p99 $p99 ms"
    }
    # Rounds interleaved, direct first in each: one stall of the shared machine in one run
    # otherwise decides a p99 (a direct p99 of 12.7 ms in one run where the others were ~1 ms).
    for ((r = 1; r <= LAT_ROUNDS; r++)); do
        for w in h1 h2; do
            lat direct "$UPSTREAM" "$w" direct
            for p in "${PROXIES[@]}"; do lat "$p" "${URL[$p]}" "$w"; done
        done
    done
    for k in "${!L50[@]}"; do
        L50[$k]=$(median <<<"${L50[$k]}")
        L99[$k]=$(median <<<"${L99[$k]}")
    done
fi
ELAPSED=$(($(date +%s) - START))
LOAD_AFTER=$(cut -d' ' -f1-3 /proc/loadavg)

# --- the table ---------------------------------------------------------------------------------
per_req() { # per_req NAME DRIVER: µs of CPU or instructions per request
    awk -v c="${C[$1.$2]}" -v n="${N[$1.$2]}" -v hz="$CLK_TCK" -v cpu="$([[ $COUNT == cpu ]] && echo 1 || echo 0)" \
        'BEGIN {if (cpu) printf "%.1f", c / hz / n * 1e6; else if (c / n < 100) printf "%.2f", c / n; else printf "%.0f", c / n}'
}
has() { [[ -n "${PID[$1]:-}" ]]; }
unit=$(case $COUNT in cpu) echo "µs CPU" ;; callgrind) echo "instructions" ;; *) echo "system calls" ;; esac)
H="| proxy |"
SEP="|---|"
for d in "${DRIVERS[@]}"; do H="$H $d |"; SEP="$SEP---|"; done
((BIG)) && { H="$H per GB |"; SEP="$SEP---|"; }
TABLE="Per small GET ($unit per request; in brackets, ÷ the better of nginx and HAProxy in the same column, default shape or one worker, whichever is cheaper):

$H
$SEP"
for p in "${PROXIES[@]}"; do
    row="| $p |"
    for d in "${DRIVERS[@]}"; do
        v=$(per_req "$p" "$d")
        best=""
        for q in nginx nginx-1w haproxy haproxy-1w; do
            has "$q" || continue
            b=$(per_req "$q" "$d")
            [[ -z $best ]] || awk -v a="$b" -v b="$best" 'BEGIN {exit !(a < b)}' && best=$b
        done
        hs=""
        [[ $COUNT != callgrind ]] || hs="; $(awk -v c="${WITH_HS[$p.$d]}" -v n="${WITH_HS_N[$p.$d]}" 'BEGIN {printf "%.0f", c / n}') with handshakes"
        row="$row $v${best:+ ($(awk -v a="$v" -v b="$best" 'BEGIN {printf "%.2f", a / b}')×)}$hs |"
    done
    ((BIG)) && row="$row ${GB[$p]} |"
    TABLE="$TABLE
$row"
done
if [[ $COUNT == cpu ]]; then
    TABLE="$TABLE

Saturation rate (requests/s per round) and the closed-loop drivers' p50 / p99 (ms, mean of rounds):

$H
$SEP"
    for p in "${PROXIES[@]}"; do
        row="| $p |"
        for d in "${DRIVERS[@]}"; do
            row="$row ${RATES[$p.$d]}; $(tr ' ' '\n' <<<"${P50S[$p.$d]}" | awk '$1 != "-" {s += $1; n++} END {if (n) printf "%.2f", s / n; else printf "-"}') / $(tr ' ' '\n' <<<"${P99S[$p.$d]}" | awk '$1 != "-" {s += $1; n++} END {if (n) printf "%.2f", s / n; else printf "-"}') |"
        done
        ((BIG)) && row="$row |"
        TABLE="$TABLE
$row"
    done
fi
if ((LATENCY)); then
    TABLE="$TABLE

Open loop at $LAT_RATE/s (half the better peer's loadgen-h1 saturation rate), p50 / p99 added to the upstream's own, medians of $LAT_ROUNDS interleaved rounds (direct: h1 ${L50[direct.h1]} / ${L99[direct.h1]} ms, h2 ${L50[direct.h2]} / ${L99[direct.h2]} ms):

| proxy | h1 p50 / p99 added | h2 p50 / p99 added |
|---|---|---|"
    for p in "${PROXIES[@]}"; do
        TABLE="$TABLE
| $p | $(awk -v a="${L50[$p.h1]}" -v b="${L50[direct.h1]}" 'BEGIN {printf "%.2f", a - b}') / $(awk -v a="${L99[$p.h1]}" -v b="${L99[direct.h1]}" 'BEGIN {printf "%.2f", a - b}') ms | $(awk -v a="${L50[$p.h2]}" -v b="${L50[direct.h2]}" 'BEGIN {printf "%.2f", a - b}') / $(awk -v a="${L99[$p.h2]}" -v b="${L99[direct.h2]}" 'BEGIN {printf "%.2f", a - b}') ms |"
    done
fi
CPU_MODEL=$(awk -F': ' '/model name/ {print $2; exit}' /proc/cpuinfo)
SECTION="## Cost per request as users measure it (issue 36)

\`COUNT=$COUNT TLS=$TLS ROUNDS=$ROUNDS DURATION=$DURATION DRIVERS=\"${DRIVERS[*]}\" PROXIES=\"${PROXIES[*]}\" bash bench/scripts/cost-bench.sh\`
(WARM=$WARM${SHORT:+, SHORT=$SHORT}, KEY=$KEY, OFFERED=$OFFERED/s, INFLIGHT=$INFLIGHT$( ((BIG)) && echo ", BIG_MB=$BIG_MB × $BIG_GETS")${PIN:+, PIN=$PIN}), release builds, run $(date -u +%Y-%m-%dT%H:%MZ)
in ${ELAPSED}s on $(nproc) cores ($CPU_MODEL): load average $LOAD_BEFORE before, $LOAD_AFTER after.
$(nginx -v 2>&1 | sed 's/.*: //'), HAProxy $(haproxy -v | awk 'NR == 1 {print $3}'), $(wrk -v 2>&1 | head -1 | awk '{print $1, $2}'), $(h2load --version 2>&1 | head -1).

$TABLE"
echo "$SECTION"
if [[ $RESULTS != - ]]; then
    # Follow-ups written by hand under the section ("### …") stay.
    kept=$(python3 - "$RESULTS" <<'PY'
import sys
try:
    text = open(sys.argv[1]).read()
except FileNotFoundError:
    sys.exit(0)
start = text.find("## Cost per request as users measure it (issue 36)\n")
if start >= 0:
    end = text.find("\n## ", start + 1)
    body = text[start:] if end < 0 else text[start:end + 1]
    first = body.find("\n### ")
    if first >= 0:
        print(body[first + 1:].rstrip("\n"))
PY
    )
    [[ -z "$kept" ]] || SECTION="$SECTION

$kept"
    write_section "$RESULTS" "$SECTION"
    log "written to $RESULTS"
fi
