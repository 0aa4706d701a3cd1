#!/usr/bin/env bash
# tollgate's per-request cost in the shape it is deployed (issue 21): TLS from clients with
# client-certificate authentication, TLS with a front-proxy certificate to the upstream, HTTP/1.1
# and HTTP/2 clients, the default mode (dryRun) — against nginx and HAProxy doing the same job and
# the minimal hyper proxy with TLS on both sides. proxy-bench.sh is the plain-HTTP version.
#
#   upstream  nginx (one worker) over HTTPS (h2 and http/1.1, as kube-apiserver offers), requiring
#             a client certificate of the front-proxy CA; it answers every API path with the same
#             1 KB JSON document (so tollgate classifies loadgen's GETs as pod GETs), a 200 MB body
#             for LIST configmaps, /readyz for tollgate's health checks and the requestheader
#             ConfigMap (kubeadm's X-Remote-* names) tollgate reads with a front-proxy certificate;
#   proxies   each in front of that upstream, interleaved per round:
#             tollgate-dryRun, tollgate-off, tollgate-enforce  release tollgate, --mode as named
#               (--tls-cert-file/--tls-private-key-file, --client-ca-file, --front-proxy-cert/--front-proxy-key,
#               --upstream-ca; health checks on /readyz, apiserver metrics scrape off);
#             tollgate-MODE-h1up  the same with `upstream.lightProtocol: http1` (light requests over
#               kept-alive HTTP/1.1 to the upstream, bulk ones over HTTP/2), against tollgate-MODE;
#             minproxy  bench/src/bin/minproxy.rs with TLS both sides and required client
#               certificates, no other work;
#             nginx, haproxy  TLS-terminating reverse proxies verifying client certificates,
#               passing the certificate's CN and O as X-Remote-User/-Group (the job tollgate does
#               as a front proxy), re-encrypting to the upstream with the front-proxy certificate,
#               keep-alive to the upstream, access logs off.
#   cores     every proxy runs one worker: TOKIO_WORKER_THREADS=1 for tollgate and minproxy
#             (tokio's multi-thread runtime reads it), `worker_processes 1` for nginx, `nbthread 1`
#             for HAProxy; PIN=CPU also pins each proxy with taskset. The figure compared is CPU
#             time, not requests/s: the machine is small and shared.
#   clients   loadgen (client certificate, --http-version 1.1 or 2): wrk has no client
#             certificates, h2load none either; loadgen GETs API paths (pods/NAME), which is what
#             the upstream answers. 200 MB bodies: curl (HTTP/1.1, client certificate), BIG_CONNS
#             in parallel, BIG_GETS each over one kept-alive connection.
#
# Per round and proxy: small GETs at saturation over h1 and over h2 (open loop offered OFFERED/s,
# at most INFLIGHT outstanding: the completed rate is the proxy's maximum here), then the 200 MB
# LISTs. CPU = utime+stime of the proxy process (/proc/PID/stat) before/after each run. After the
# rounds, the latency phase: loadgen open loop at half the slowest proxy's maximum rate (h1 and h2)
# against the upstream directly and through each proxy; added p99 = proxy p99 - direct p99; and
# tollgate-dryRun once more while /debug/patterns is scraped every 100 ms (and minproxy, as the control).
# Writes the section "tollgate in the deployed shape (issue 21)" of bench/RESULTS.md and prints it.
# A benchmark, not a CI test. Loopback only; everything it starts is killed by pid on exit.
#
# Environment:
#   SKIP_BUILD=1     use the existing release binaries (no cargo build)
#   BIN_DIR=dir      where the release binaries are (default target/release)
#   ROUNDS=3         interleaved rounds
#   DURATION=8       seconds per small-GET run
#   LAT_DURATION=10  seconds per latency run
#   LAT_ROUNDS=1     interleaved rounds of the latency phase (direct, then each proxy, h1 and h2);
#                    with more than one, a proxy's p99 is the median of its rounds and its added p99
#                    the median of (its p99 - that round's direct p99): one 10 s run holds too few of
#                    the bursts that set a p99 to rank the proxies
#   OFFERED=20000    offered rate (GETs/s) of the saturating runs
#   INFLIGHT=16      outstanding requests (and HTTP/1.1 connections) of the saturating runs
#   LAT_CONNS=64     HTTP/1.1 connections of the latency runs (HTTP/2: one connection)
#   WARMUP=2         seconds at half the rate before each latency run's measured LAT_DURATION
#   BIG_CONNS=2      parallel 200 MB downloaders (one connection each)
#   BIG_GETS=3       200 MB downloads per downloader per run
#   PROXIES="…"      which proxies (default: tollgate-dryRun tollgate-off tollgate-enforce
#                    minproxy nginx haproxy; also tollgate-dryRun-h1up etc., see above)
#   PIN=cpu          also pin every proxy to this CPU with taskset (default: unpinned)
#   PIN_REST=cpu     pin the upstream nginx, loadgen and the 200 MB downloads to this CPU (default: unpinned);
#                    with PIN, the proxy measured has a core of its own, so the latency phase's added
#                    p99 is the proxy's and not the three processes' contention for two cores
#   PROFILE=1        after the rounds, one more small-GET run per proxy and protocol under `perf record`
#                    (not counted in the CPU figures): the share of each proxy's CPU samples by
#                    component (kernel, TLS, HTTP/2, hyper, tokio, the allocator, tollgate, …),
#                    written as a table into the section; perf.data kept in the run's directory
#   UPSTREAM_KIND=kube  the real kube-apiserver 1.20 (../shared/tools/kube-apiserver, started and
#                    stopped here, its certificates used throughout, clients as its unprivileged
#                    test-user, one pod and one node seeded) instead of nginx: only the small-request
#                    rounds, and the apiserver's CPU per request beside the proxy's; printed, not written
#   OP=patches       with UPSTREAM_KIND=kube: node-status PATCHes (the kubelet's heartbeat) instead
#                    of GETs of one pod
#   RESULTS=path     where to write the results (default bench/RESULTS.md; "-" prints only); the
#                    section's "###" subsections (follow-ups written by hand) are kept
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-8}
LAT_DURATION=${LAT_DURATION:-10}
LAT_ROUNDS=${LAT_ROUNDS:-1}
OFFERED=${OFFERED:-20000}
INFLIGHT=${INFLIGHT:-16}
LAT_CONNS=${LAT_CONNS:-64}
WARMUP=${WARMUP:-2}
BIG_CONNS=${BIG_CONNS:-2}
BIG_GETS=${BIG_GETS:-3}
RESULTS=${RESULTS:-$ROOT/bench/RESULTS.md}
UPSTREAM_KIND=${UPSTREAM_KIND:-nginx}
OP=${OP:-gets}
case $UPSTREAM_KIND/$OP in
nginx/gets | kube/gets | kube/patches) ;;
*) echo "tls-bench: UPSTREAM_KIND=$UPSTREAM_KIND OP=$OP: use nginx (GETs) or kube (gets or patches)" >&2; exit 64 ;;
esac
[[ $UPSTREAM_KIND == nginx ]] || RESULTS=-
PROXIES_SET=${PROXIES:-}
read -r -a PROXIES <<<"${PROXIES:-tollgate-dryRun tollgate-off tollgate-enforce minproxy nginx haproxy}"
PIN=${PIN:-}
PIN_REST=${PIN_REST:-}
# A prefix for the upstream and the clients (see PIN_REST).
REST_CMD=()
[[ -z "$PIN_REST" ]] || REST_CMD=(taskset -c "$PIN_REST")
BIG_BYTES=$((200 * 1024 * 1024))
SMALL_PATH=/api/v1/namespaces/default/pods/loadgen-pod-0
BIG_PATH=/api/v1/configmaps

# Targets from issue 21.
PEER_TARGET=1.0      # tollgate-dryRun / better of nginx and HAProxy, per small request
MIN_TARGET=1.25      # tollgate-dryRun / minproxy, per small request
MODE_TARGET=1.10     # tollgate-dryRun / tollgate-off, per small request
GB_TARGET=1.15       # tollgate-dryRun / minproxy, per GB
P99_TARGET_MS=1.0    # p99 added

BENCH=tls-bench
# shellcheck source=lib.sh
source "$ROOT/bench/scripts/lib.sh"

for tool in curl openssl awk python3; do
    command -v "$tool" >/dev/null || die "$tool is missing"
done
NGINX=$(command -v nginx || echo /usr/sbin/nginx)
[[ -x "$NGINX" ]] || die "nginx is missing (apt-get install -y nginx-light)"
HAPROXY=$(command -v haproxy || echo /usr/sbin/haproxy)
[[ -x "$HAPROXY" ]] || die "haproxy is missing (apt-get install -y haproxy)"
[[ -z "$PIN$PIN_REST" ]] || command -v taskset >/dev/null || die "PIN and PIN_REST need taskset (util-linux)"
CLK_TCK=$(getconf CLK_TCK)
bench_init

# --- build ---------------------------------------------------------------------------------
if [[ -z "${SKIP_BUILD:-}" ]]; then
    log "building release binaries (tollgate, minproxy, loadgen)…"
    (cd "$ROOT" && cargo build --release --locked -q -p tollgate -p bench -p loadgen \
        --bin tollgate --bin minproxy --bin loadgen)
fi
BIN_DIR=${BIN_DIR:-$ROOT/target/release}
TOLLGATE=$BIN_DIR/tollgate
MINPROXY=$BIN_DIR/minproxy
LOADGEN=$BIN_DIR/loadgen
NEEDED=("$LOADGEN")
for p in "${PROXIES[@]}"; do
    case $p in
    tollgate-*) NEEDED+=("$TOLLGATE") ;;
    minproxy) NEEDED+=("$MINPROXY") ;;
    esac
done
for b in "${NEEDED[@]}"; do
    [[ -x "$b" ]] || die "$b is missing: run without SKIP_BUILD"
done

# --- certificates --------------------------------------------------------------------------
# Three CAs as on a kubeadm master: the serving CA (upstream's and the proxies' certificate for
# 127.0.0.1), the client CA (the users' certificates) and the front-proxy CA (the certificate the
# proxies present to the upstream; tollgate's health checks use it too). RSA 2048, kubeadm's default.
PKI=$TMP/pki
mkdir -p "$PKI"
ca() { # ca NAME CN
    openssl req -x509 -new -nodes -newkey rsa:2048 -days 2 -subj "/CN=$2" \
        -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign \
        -keyout "$PKI/$1.key" -out "$PKI/$1.crt" 2>/dev/null
}
leaf() { # leaf NAME CA SUBJECT EXTENSIONS
    openssl req -new -nodes -newkey rsa:2048 -subj "$3" \
        -keyout "$PKI/$1.key" -out "$PKI/$1.csr" 2>/dev/null
    printf '%b\n' "$4" >"$PKI/$1.ext"
    openssl x509 -req -in "$PKI/$1.csr" -CA "$PKI/$2.crt" -CAkey "$PKI/$2.key" -CAcreateserial \
        -days 2 -extfile "$PKI/$1.ext" -out "$PKI/$1.crt" 2>/dev/null
    cat "$PKI/$1.crt" "$PKI/$1.key" >"$PKI/$1.pem" # HAProxy's crt: certificate and key in one file
}
ca serving-ca tls-bench-serving-ca
ca client-ca tls-bench-client-ca
ca front-proxy-ca tls-bench-front-proxy-ca
leaf server serving-ca /CN=127.0.0.1 \
    "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1,DNS:localhost"
leaf user client-ca "/O=system:masters/CN=bench-admin" \
    "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth"
leaf front-proxy front-proxy-ca /CN=front-proxy-client \
    "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth"
chmod 644 "$PKI"/*
chmod 755 "$PKI"
CURL_TLS=(--cacert "$PKI/serving-ca.crt" --cert "$PKI/user.crt" --key "$PKI/user.key")
LOADGEN_TLS=(--certificate-authority "$PKI/serving-ca.crt" --client-certificate "$PKI/user.crt"
    --client-key "$PKI/user.key")

# --- upstream: the real kube-apiserver, with its own certificates ----------------------------
UP_PID=""
if [[ $UPSTREAM_KIND == kube ]]; then
    TOOLS=${KUBE_APISERVER_TOOLS:-$ROOT/../shared/tools/kube-apiserver}
    [[ -x $TOOLS/start.sh ]] || TOOLS=/work/shared/tools/kube-apiserver
    [[ -x $TOOLS/start.sh ]] || die "no kube-apiserver tools (KUBE_APISERVER_TOOLS)"
    trap '"$TOOLS/stop.sh" "$TMP/kube" >/dev/null 2>&1 || true; bench_cleanup' EXIT
    "$TOOLS/start.sh" "$TMP/kube" >/dev/null 2>"$TMP/kube-start.log" ||
        die "kube-apiserver did not start: $(tail -5 "$TMP/kube-start.log")"
    # shellcheck disable=SC1091
    . "$TMP/kube/env"
    UPSTREAM=$KUBE_APISERVER_URL
    UP_PID=$KUBE_APISERVER_PID
    # The same names as above: one CA signs the serving and client certificates there; the
    # proxies serve with the apiserver's certificate (for 127.0.0.1); clients are test-user.
    for pair in serving-ca:"$KUBE_CA_CERT" client-ca:"$KUBE_CA_CERT" server:"$KUBE_RUN_DIR/pki/apiserver" \
        front-proxy:"${KUBE_FRONT_PROXY_CLIENT_CERT%.crt}" user:"${KUBE_USER_CERT%.crt}"; do
        name=${pair%%:*} from=${pair#*:}
        if [[ $from == *.crt ]]; then cp "$from" "$PKI/$name.crt"; continue; fi
        cp "$from.crt" "$PKI/$name.crt"
        cp "$from.key" "$PKI/$name.key"
        cat "$PKI/$name.crt" "$PKI/$name.key" >"$PKI/$name.pem"
    done
    chmod 644 "$PKI"/*
    KUBECONFIG=$TMP/kube/kubeconfig "$LOADGEN" seed --nodes 1 --pods 1 --namespace default \
        >"$TMP/seed.log" 2>&1 || die "loadgen seed failed; see $TMP/seed.log"
    OWN_CERT=("$KUBE_ADMIN_CERT" "$KUBE_ADMIN_KEY")
    SMALL_MD5=$(curl -sf --cacert "$KUBE_CA_CERT" --cert "$KUBE_ADMIN_CERT" --key "$KUBE_ADMIN_KEY" \
        "$UPSTREAM$SMALL_PATH" | md5sum)
    log "kube-apiserver at $UPSTREAM (pid $UP_PID)"
else
# --- upstream: nginx over HTTPS serving the files ------------------------------------------
upstream_files "$TMP/www" "$BIG_BYTES"
# What kube-apiserver publishes of its --requestheader-* flags (kubeadm's values): tollgate reads
# it before serving with a front-proxy certificate, and enforce refuses to start without it.
cat >"$TMP/www/requestheader.json" <<'EOF'
{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"extension-apiserver-authentication","namespace":"kube-system"},"data":{"requestheader-username-headers":"[\"X-Remote-User\"]","requestheader-group-headers":"[\"X-Remote-Group\"]","requestheader-extra-headers-prefix":"[\"X-Remote-Extra-\"]","requestheader-allowed-names":"[\"front-proxy-client\"]"}}
EOF
chmod 644 "$TMP/www/requestheader.json"

UP_PORT=$(free_port)
# nginx_conf writes "listen 127.0.0.1:PORT;": the port argument carries the listen options.
nginx_conf "$TMP/up" "$UP_PORT ssl http2" "root $TMP/www;
        ssl_certificate $PKI/server.crt;
        ssl_certificate_key $PKI/server.key;
        ssl_client_certificate $PKI/front-proxy-ca.crt;
        ssl_verify_client on;
        location = /readyz { return 200 ok; }
        location = /api/v1/namespaces/kube-system/configmaps/extension-apiserver-authentication { rewrite ^ /requestheader.json break; }
        location = $BIG_PATH { rewrite ^ /big.bin break; }
        location /api/ { rewrite ^ /small.json break; }" \
    "keepalive_timeout 600s;"
"${REST_CMD[@]}" "$NGINX" -p "$TMP/up" -c "$TMP/up/nginx.conf" >"$TMP/up/logs/stdout" 2>&1 &
PIDS+=($!)
UPSTREAM=https://127.0.0.1:$UP_PORT
up_ok() { # the upstream answers a front-proxy client
    curl -sf --cacert "$PKI/serving-ca.crt" --cert "$PKI/front-proxy.crt" --key "$PKI/front-proxy.key" \
        -o /dev/null "$UPSTREAM/readyz"
}
for _ in $(seq 200); do up_ok && break; sleep 0.05; done
up_ok || die "upstream nginx did not answer; see $TMP/up/logs"
OWN_CERT=("$PKI/front-proxy.crt" "$PKI/front-proxy.key")
SMALL_MD5=$(md5sum <"$TMP/www/small.json")
fi

# --- the proxies ---------------------------------------------------------------------------
declare -A URL PID
# Whether proxy NAME is in this run.
has() { [[ -n "${PID[$1]:-}" ]]; }
# A prefix, not a function: the pid of a backgrounded function would be a subshell's.
PIN_CMD=()
[[ -z "$PIN" ]] || PIN_CMD=(taskset -c "$PIN")

start_minproxy() {
    TOKIO_WORKER_THREADS=1 "${PIN_CMD[@]}" "$MINPROXY" --listen 127.0.0.1:0 --upstream "$UPSTREAM" \
        --tls-cert "$PKI/server.crt" --tls-key "$PKI/server.key" --client-ca "$PKI/client-ca.crt" \
        --upstream-ca "$PKI/serving-ca.crt" --upstream-client-cert "$PKI/front-proxy.crt" \
        --upstream-client-key "$PKI/front-proxy.key" >"$TMP/minproxy.out" 2>&1 &
    PIDS+=($!)
    PID[minproxy]=${PIDS[-1]}
    URL[minproxy]=$(wait_line "$TMP/minproxy.out" "minproxy serving at " "${PID[minproxy]}" minproxy)
}

# nginx terminating TLS: client certificates verified, the certificate's CN and O forwarded as the
# identity headers a front proxy sends, re-encrypted to the upstream with the front-proxy
# certificate over kept-alive connections (HTTP/1.1: nginx proxies no HTTP/2 upstream).
start_nginx() {
    local port dir=$TMP/np
    port=$(free_port)
    nginx_conf "$dir" "$port ssl http2" "ssl_certificate $PKI/server.crt;
        ssl_certificate_key $PKI/server.key;
        ssl_client_certificate $PKI/client-ca.crt;
        ssl_verify_client on;
        location / {
            proxy_pass https://up;
            proxy_http_version 1.1;
            proxy_set_header Connection \"\";
            proxy_set_header X-Remote-User \$remote_user_cn;
            proxy_set_header X-Remote-Group \$remote_group_o;
            proxy_ssl_certificate $PKI/front-proxy.crt;
            proxy_ssl_certificate_key $PKI/front-proxy.key;
            proxy_ssl_trusted_certificate $PKI/serving-ca.crt;
            proxy_ssl_verify on;
            proxy_ssl_name localhost;
            proxy_ssl_session_reuse on;
            proxy_buffering off;
            proxy_buffer_size 64k;
            proxy_buffers 4 64k;
        }" "upstream up { server 127.0.0.1:$UP_PORT; keepalive 64; keepalive_timeout 600s; }
    keepalive_timeout 600s;
    map \$ssl_client_s_dn \$remote_user_cn { default \"\"; ~CN=(?<cn>[^,/]+) \$cn; }
    map \$ssl_client_s_dn \$remote_group_o { default \"\"; ~O=(?<o>[^,/]+) \$o; }"
    "${PIN_CMD[@]}" "$NGINX" -p "$dir" -c "$dir/nginx.conf" >"$dir/logs/stdout" 2>&1 &
    PIDS+=($!)
    URL[nginx]=https://127.0.0.1:$port
    wait_https "${URL[nginx]}$SMALL_PATH" "${PIDS[-1]}" nginx
    PID[nginx]=$(nginx_worker "${PIDS[-1]}")
}

# HAProxy the same: one thread, client certificates required, identity headers from the
# certificate, TLS with the front-proxy certificate to the upstream, connections reused.
start_haproxy() {
    local port
    port=$(free_port)
    cat >"$TMP/haproxy.cfg" <<EOF
global
    nbthread 1
    maxconn 4096
defaults
    mode http
    timeout connect 5s
    timeout client 600s
    timeout server 600s
    timeout http-keep-alive 600s
    option http-keep-alive
    http-reuse always
frontend clients
    bind 127.0.0.1:$port ssl crt $PKI/server.pem ca-file $PKI/client-ca.crt verify required alpn h2,http/1.1
    http-request del-header X-Remote-User
    http-request del-header X-Remote-Group
    http-request set-header X-Remote-User %[ssl_c_s_dn(CN)]
    http-request set-header X-Remote-Group %[ssl_c_s_dn(O)]
    default_backend upstream
backend upstream
    server up 127.0.0.1:$UP_PORT ssl crt $PKI/front-proxy.pem ca-file $PKI/serving-ca.crt verify required
EOF
    "${PIN_CMD[@]}" "$HAPROXY" -db -f "$TMP/haproxy.cfg" >"$TMP/haproxy.out" 2>&1 &
    PIDS+=($!)
    PID[haproxy]=${PIDS[-1]}
    URL[haproxy]=https://127.0.0.1:$port
    wait_https "${URL[haproxy]}$SMALL_PATH" "${PID[haproxy]}" haproxy
}

# tollgate as shipped in MODE, except: the upstream is nginx, so the health check asks for
# /readyz with the front-proxy certificate and the apiserver metrics scrape is off.
# tollgate-MODE-h1up: light requests over HTTP/1.1 to the upstream.
for light in http2 http1; do
    cat >"$TMP/tollgate-$light.yaml" <<EOF
upstream:
  healthCheck: {enabled: true, path: /readyz, intervalSeconds: 5, timeoutSeconds: 2}
  metricsScrape: {enabled: false}
  lightProtocol: $light
EOF
done
declare -A ADMIN
start_tollgate() { # start_tollgate NAME MODE http2|http1
    TOKIO_WORKER_THREADS=1 RUST_LOG=info "${PIN_CMD[@]}" "$TOLLGATE" --mode "$2" --config "$TMP/tollgate-$3.yaml" \
        --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0 --upstream "$UPSTREAM" \
        --upstream-ca "$PKI/serving-ca.crt" --tls-cert-file "$PKI/server.crt" --tls-private-key-file "$PKI/server.key" \
        --client-ca-file "$PKI/client-ca.crt" --front-proxy-cert "$PKI/front-proxy.crt" \
        --front-proxy-key "$PKI/front-proxy.key" --upstream-client-cert "${OWN_CERT[0]}" \
        --upstream-client-key "${OWN_CERT[1]}" >"$TMP/$1.out" 2>"$TMP/$1.err" &
    PIDS+=($!)
    PID[$1]=${PIDS[-1]}
    URL[$1]=$(wait_line "$TMP/$1.out" "tollgate serving at " "${PID[$1]}" "$1")
    ADMIN[$1]=$(grep -o '(admin http://[^)]*' "$TMP/$1.out" | sed 's/(admin //')
}

# Polls (bounded) until GET URL answers 200 to a client with the user's certificate.
wait_https() { # wait_https URL PID what
    local i
    for i in $(seq 200); do
        curl -sf "${CURL_TLS[@]}" -o /dev/null "$1" && return 0
        kill -0 "$2" 2>/dev/null || die "$3 exited; see $TMP"
        sleep 0.05
    done
    die "$3 did not answer at $1 within 10 s"
}

for p in "${PROXIES[@]}"; do
    case $p in
    tollgate-dryRun | tollgate-off | tollgate-enforce) start_tollgate "$p" "${p#tollgate-}" http2 ;;
    tollgate-dryRun-h1up | tollgate-off-h1up | tollgate-enforce-h1up)
        mode=${p#tollgate-}
        start_tollgate "$p" "${mode%-h1up}" http1
        ;;
    minproxy) start_minproxy ;;
    nginx) start_nginx ;;
    haproxy) start_haproxy ;;
    *) die "unknown proxy $p (PROXIES)" ;;
    esac
done
for p in "${PROXIES[@]}"; do
    wait_https "${URL[$p]}$SMALL_PATH" "${PID[$p]}" "$p"
    for v in --http1.1 --http2; do
        got=$(curl -sf "${CURL_TLS[@]}" "$v" "${URL[$p]}$SMALL_PATH" | md5sum)
        [[ "$got" == "$SMALL_MD5" ]] || die "$p does not forward the small GET faithfully ($v)"
    done
    # A client without a certificate must not get through (tollgate: no identity, yet forwarded
    # as anonymous would be the apiserver's call; the peers refuse at the handshake).
    code=$(curl -s --cacert "$PKI/serving-ca.crt" -o /dev/null -w '%{http_code}' "${URL[$p]}$SMALL_PATH" || true)
    log "$p: ${URL[$p]} (pid ${PID[$p]}; without a client certificate: HTTP ${code:-none})"
done

# --- runs ------------------------------------------------------------------------------------
# One loadgen run: GETs of SMALL_PATH at RATE/s over h1|h2 for SECONDS against URL, at most
# INFLIGHT outstanding over at most CONNS HTTP/1.1 connections; with WARMUP, first WARMUP seconds
# at half the rate (connections opened, TLS handshakes done) whose latencies are left out of the
# p99. Sets LG to "requests ok errors dropped rate p99_ms" (run in this shell, so that die stops
# the script).
loadgen_run() { # loadgen_run URL h1|h2 RATE SECONDS INFLIGHT CONNS OUTDIR [WARMUP]
    local out=$7 version=2 schedule=(--duration "${4}s") op=(--gets "$3/s")
    [[ $2 == h1 ]] && version=1.1
    [[ $OP == gets ]] || op=(--patches "$3/s" --patch-target node-status)
    [[ -z "${8:-}" ]] || schedule=(--schedule steps --steps 2 --step-duration "${8}s" --duration "$(($4 + $8))s")
    rm -rf "$out"
    KUBECONFIG=/dev/null "${REST_CMD[@]}" "$LOADGEN" --server "$1" "${LOADGEN_TLS[@]}" --http-version "$version" \
        "${op[@]}" "${schedule[@]}" --max-in-flight "$5" --max-connections "$6" \
        --objects 1 --namespace default --timeout 10s --drain-timeout 10s --no-progress \
        --output "$out" >"$out.log" 2>&1 || die "loadgen against $1 failed: $(tail -5 "$out.log")"
    LG=$(python3 - "$out/summary.json" <<'PY'
import json, sys
op = json.load(open(sys.argv[1]))["operations"][0]
p99 = (op.get("steps") or [op])[-1]["latency_ms"]["p99"]
print(op["requests"], op["ok"], op["errors"], op["dropped"], round(op["rate_per_s"]), p99)
PY
    ) || die "no summary from loadgen against $1; see $out.log"
}

declare -A T N B RT RD MAXRATE UT URT
for p in "${PROXIES[@]}"; do
    for w in h1 h2 big; do T[$p.$w]=0; N[$p.$w]=0; B[$p.$w]=0; UT[$p.$w]=0; done
    MAXRATE[$p.h1]=""
    MAXRATE[$p.h2]=""
done
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)

small() { # small PROXY h1|h2
    local p=$1 w=$2 t0 t1 u0=0 u1=0 req ok err drop rate p99
    [[ -z "$UP_PID" ]] || u0=$(ticks "$UP_PID")
    t0=$(ticks "${PID[$p]}")
    loadgen_run "${URL[$p]}" "$w" "$OFFERED" "$DURATION" "$INFLIGHT" "$INFLIGHT" "$TMP/lg.$p.$w"
    t1=$(ticks "${PID[$p]}")
    [[ -z "$UP_PID" ]] || u1=$(ticks "$UP_PID")
    # The upstream's CPU while serving this proxy's requests (kube mode: the apiserver's).
    UT[$p.$w]=$((UT[$p.$w] + u1 - u0))
    URT[$p.$w.$r]=$((u1 - u0))
    read -r req ok err drop rate p99 <<<"$LG"
    ((err == 0)) || die "$p ($w): $err of $req GETs failed; see $TMP/lg.$p.$w.log"
    T[$p.$w]=$((T[$p.$w] + t1 - t0))
    N[$p.$w]=$((N[$p.$w] + ok))
    RT[$p.$w.$r]=$((t1 - t0))
    RD[$p.$w.$r]=$ok
    MAXRATE[$p.$w]="${MAXRATE[$p.$w]} $rate"
    log "round $r $p $w: $ok GETs ($rate/s, $drop dropped ticks), $((t1 - t0)) ticks"
}
big() { # big PROXY
    local p=$1 t0 t1 i b bad urls=() curls=()
    # curl's -o belongs to one URL: each of them gets its own.
    for i in $(seq "$BIG_GETS"); do urls+=(-o /dev/null "${URL[$p]}$BIG_PATH"); done
    rm -f "$TMP"/big."$p".*
    t0=$(ticks "${PID[$p]}")
    for i in $(seq "$BIG_CONNS"); do
        "${REST_CMD[@]}" curl -s --http1.1 "${CURL_TLS[@]}" -w '%{http_code} %{size_download}\n' \
            "${urls[@]}" >"$TMP/big.$p.$i" 2>&1 &
        curls+=($!)
    done
    for i in "${curls[@]}"; do wait "$i" || true; done
    t1=$(ticks "${PID[$p]}")
    bad=$(cat "$TMP"/big."$p".* | awk '$1 != 200 && n++ < 3')
    [[ -z "$bad" ]] || die "$p: 200 MB LIST answered: $bad"
    b=$(cat "$TMP"/big."$p".* | awk '{s += $2} END {printf "%.0f", s}')
    ((b == BIG_CONNS * BIG_GETS * BIG_BYTES)) || die "$p: $b bytes of 200 MB LISTs, expected $((BIG_CONNS * BIG_GETS * BIG_BYTES))"
    T[$p.big]=$((T[$p.big] + t1 - t0))
    B[$p.big]=$((B[$p.big] + b))
    RT[$p.big.$r]=$((t1 - t0))
    RD[$p.big.$r]=$b
    log "round $r $p big: $b bytes, $((t1 - t0)) ticks"
}
for r in $(seq "$ROUNDS"); do
    for p in "${PROXIES[@]}"; do small "$p" h1; done
    for p in "${PROXIES[@]}"; do small "$p" h2; done
    [[ $UPSTREAM_KIND == kube ]] || for p in "${PROXIES[@]}"; do big "$p"; done
done
for p in "${PROXIES[@]}"; do
    kill -0 "${PID[$p]}" 2>/dev/null || die "$p exited during the benchmark"
done

# --- kube mode: the proxy's and the apiserver's CPU per request, then stop ---------------------
if [[ $UPSTREAM_KIND == kube ]]; then
    per_req() { awk -v t="$1" -v n="$2" -v hz="$CLK_TCK" 'BEGIN {printf "%.1f", t / hz / n * 1e6}'; }
    # A/B per round of (proxy + apiserver) CPU per request.
    sum_rounds() { # sum_rounds h1|h2 A B
        local r out=""
        for r in $(seq "$ROUNDS"); do
            out="$out $(awk -v ta="${RT[$2.$1.$r]}" -v ua="${URT[$2.$1.$r]}" -v da="${RD[$2.$1.$r]}" \
                -v tb="${RT[$3.$1.$r]}" -v ub="${URT[$3.$1.$r]}" -v db="${RD[$3.$1.$r]}" \
                'BEGIN {printf "%.2f", ((ta + ua) / da) / ((tb + ub) / db)}')"
        done
        echo "${out# }"
    }
    what="small GET (a pod)"
    [[ $OP == gets ]] || what="node-status PATCH"
    echo "UPSTREAM_KIND=kube OP=$OP ROUNDS=$ROUNDS DURATION=$DURATION OFFERED=$OFFERED INFLIGHT=$INFLIGHT, run $(date -u +%Y-%m-%dT%H:%MZ), load average $LOAD_BEFORE before, $(cut -d' ' -f1-3 /proc/loadavg) after"
    echo
    echo "| proxy | proxy CPU per $what, h1 / h2 | kube-apiserver CPU per request, h1 / h2 | sum, h1 / h2 | requests/s h1 / h2 (per round) |"
    echo "|---|---|---|---|---|"
    for p in "${PROXIES[@]}"; do
        row="| $p"
        for col in T UT sum; do
            cell=""
            for w in h1 h2; do
                case $col in
                T) v=$(per_req "${T[$p.$w]}" "${N[$p.$w]}") ;;
                UT) v=$(per_req "${UT[$p.$w]}" "${N[$p.$w]}") ;;
                sum) v=$(per_req "$((T[$p.$w] + UT[$p.$w]))" "${N[$p.$w]}") ;;
                esac
                cell="$cell${cell:+ / }$v"
            done
            row="$row | $cell µs"
        done
        echo "$row | ${MAXRATE[$p.h1]# } / ${MAXRATE[$p.h2]# } |"
    done
    echo
    for p in "${PROXIES[@]}"; do
        [[ $p == *-h1up ]] || continue
        base=${p%-h1up}
        has "$base" || continue
        for w in h1 h2; do
            echo "- $w: $p / $base: proxy $(awk -v a="${T[$p.$w]}" -v na="${N[$p.$w]}" -v b="${T[$base.$w]}" -v nb="${N[$base.$w]}" 'BEGIN {printf "%.2f", (a / na) / (b / nb)}')×, apiserver $(awk -v a="${UT[$p.$w]}" -v na="${N[$p.$w]}" -v b="${UT[$base.$w]}" -v nb="${N[$base.$w]}" 'BEGIN {printf "%.2f", (a / na) / (b / nb)}')×, both **$(awk -v a="$((T[$p.$w] + UT[$p.$w]))" -v na="${N[$p.$w]}" -v b="$((T[$base.$w] + UT[$base.$w]))" -v nb="${N[$base.$w]}" 'BEGIN {printf "%.2f", (a / na) / (b / nb)}')×**; both per round: $(sum_rounds "$w" "$p" "$base")."
        done
    done
    # What each tollgate holds open to the apiserver at the end (TCP connections from its pid).
    for p in "${PROXIES[@]}"; do
        port=${UPSTREAM##*:}
        n=$(ss -Htnp state established "( dport = :$port )" 2>/dev/null | grep -c "pid=${PID[$p]}," || true)
        echo "- $p: $n connections open to the apiserver after the rounds."
    done
    exit 0
fi

# --- latency: open loop at half the slowest proxy's maximum rate --------------------------------
mean() { awk '{s = 0; for (i = 1; i <= NF; i++) s += $i; printf "%.0f", s / NF}' <<<"$1"; }
SLOWEST=""
SLOWEST_RATE=""
for p in "${PROXIES[@]}"; do
    for w in h1 h2; do
        m=$(mean "${MAXRATE[$p.$w]}")
        if [[ -z "$SLOWEST_RATE" ]] || ((m < SLOWEST_RATE)); then SLOWEST_RATE=$m; SLOWEST="$p ($w)"; fi
    done
done
LAT_RATE=$((SLOWEST_RATE / 2))
((LAT_RATE > 0)) || die "no maximum rate measured"
declare -A P99 P99R ADDED ADDEDR ADDED_ROUNDS
LAT_ROUND=1
# One open-loop run at LAT_RATE over h1|h2 against URL: sets P99[NAME.h1|h2] and, for the round
# LAT_ROUND, P99R[NAME.h1|h2.ROUND].
latency() { # latency NAME URL h1|h2
    local err out=$TMP/lat.$1.$3.$LAT_ROUND
    loadgen_run "$2" "$3" "$LAT_RATE" "$LAT_DURATION" 1000 "$LAT_CONNS" "$out" "$WARMUP"
    read -r _ _ err _ _ "P99[$1.$3]" <<<"$LG"
    ((err == 0)) || die "$1 ($3): $err GETs failed in the latency run; see $out.log"
    P99R[$1.$3.$LAT_ROUND]=${P99[$1.$3]}
    log "latency $1 $3 at $LAT_RATE/s (round $LAT_ROUND): p99 ${P99[$1.$3]} ms"
}
# The upstream's own p99 at that rate, through no proxy: what "added" is measured from. The
# upstream requires the front-proxy certificate, so this client presents it.
LOADGEN_TLS_USER=("${LOADGEN_TLS[@]}")
LOADGEN_TLS=(--certificate-authority "$PKI/serving-ca.crt" --client-certificate "$PKI/front-proxy.crt"
    --client-key "$PKI/front-proxy.key")
LOADGEN_TLS_DIRECT=("${LOADGEN_TLS[@]}")
for LAT_ROUND in $(seq "$LAT_ROUNDS"); do
    LOADGEN_TLS=("${LOADGEN_TLS_DIRECT[@]}")
    for w in h1 h2; do latency direct "$UPSTREAM" "$w"; done
    LOADGEN_TLS=("${LOADGEN_TLS_USER[@]}")
    for p in "${PROXIES[@]}"; do
        for w in h1 h2; do
            latency "$p" "${URL[$p]}" "$w"
            ADDEDR[$p.$w.$LAT_ROUND]=$(awk -v a="${P99[$p.$w]}" -v b="${P99R[direct.$w.$LAT_ROUND]}" 'BEGIN {printf "%.2f", a - b}')
        done
    done
done
# Over the rounds: the median p99, the median added p99, and the rounds' added p99s in a list.
for p in direct "${PROXIES[@]}"; do
    for w in h1 h2; do
        all="" added_all=""
        for r in $(seq "$LAT_ROUNDS"); do
            all="$all ${P99R[$p.$w.$r]}"
            added_all="$added_all ${ADDEDR[$p.$w.$r]:-}"
        done
        P99[$p.$w]=$(median <<<"$all")
        ADDED_ROUNDS[$p.$w]=${added_all# }
        [[ $p == direct ]] || ADDED[$p.$w]=$(median <<<"$added_all")
    done
done
LAT_ROUND=scraped
# tollgate-dryRun again while its /debug/patterns is scraped every 100 ms: the scrape must not
# stall requests. The scraper is one curl process on one kept-alive connection (--rate), so its
# own CPU is small and steady; as a control, minproxy's latency run again with the same scraper
# (still scraping tollgate-dryRun, which then serves no requests): what the scraper's CPU does to
# any proxy on these two cores, against which tollgate's difference is read.
if has tollgate-dryRun; then
    : >"$TMP/scrapes"
    scrapes=$(((LAT_DURATION + WARMUP) * 10 + 50))
    with_scraper() { # with_scraper NAME URL h1|h2
        # Line-buffered: the scraper is killed when the run ends, and what it buffered is lost.
        stdbuf -oL curl -s --rate 10/s -o /dev/null -w '%{http_code}\n' \
            "${ADMIN[tollgate-dryRun]}/debug/patterns?n=[1-$scrapes]" >>"$TMP/scrapes" &
        scraper=$!
        PIDS+=("$scraper")
        latency "$1" "$2" "$3"
        kill "$scraper" 2>/dev/null || true
        wait "$scraper" 2>/dev/null || true
    }
    for w in h1 h2; do
        with_scraper scraped "${URL[tollgate-dryRun]}" "$w"
        ! has minproxy || with_scraper scraped-minproxy "${URL[minproxy]}" "$w"
    done
    SCRAPES=$(grep -c "^200$" "$TMP/scrapes" || true)
fi
# The profile pass (PROFILE=1): where each proxy's CPU goes, by component, on h1 and on h2.
PROFILE_TABLE=""
if [[ -n "${PROFILE:-}" ]]; then
    command -v perf >/dev/null || die "PROFILE=1 needs perf (Debian's linux-perf)"
    for w in h1 h2; do
        args=()
        for p in "${PROXIES[@]}"; do
            perf record -F 1999 -p "${PID[$p]}" -o "$TMP/perf.$p.$w.data" >"$TMP/perf.$p.$w.log" 2>&1 &
            rec=$!
            PIDS+=("$rec")
            loadgen_run "${URL[$p]}" "$w" "$OFFERED" "$DURATION" "$INFLIGHT" "$INFLIGHT" "$TMP/lg.perf.$p.$w"
            kill -INT "$rec" 2>/dev/null || true
            wait "$rec" 2>/dev/null || true
            perf report -i "$TMP/perf.$p.$w.data" --stdio --no-children --sort dso,sym --percent-limit 0 \
                >"$TMP/perf.$p.$w.txt" 2>/dev/null || die "perf report failed for $p; see $TMP/perf.$p.$w.log"
            log "profiled $p ($w): $TMP/perf.$p.$w.txt"
            # With its measured CPU per GET, so that shares become microseconds.
            args+=("$p=$(awk -v t="${T[$p.$w]}" -v n="${N[$p.$w]}" -v hz="$CLK_TCK" 'BEGIN {printf "%.1f", t / hz / n * 1e6}')")
        done
        table=$(python3 "$ROOT/bench/scripts/perf_components.py" "$TMP" "$w" "${args[@]}") ||
            die "could not group the profiles"
        PROFILE_TABLE="$PROFILE_TABLE${PROFILE_TABLE:+

}$table"
    done
fi
LOAD_AFTER=$(cut -d' ' -f1-3 /proc/loadavg)
declare -A HWM
for p in "${PROXIES[@]}"; do
    kill -0 "${PID[$p]}" 2>/dev/null || die "$p exited during the latency runs"
    HWM[$p]=$(hwm_kb "${PID[$p]}")
done

# --- the section -----------------------------------------------------------------------------
us_per_req() { awk -v t="${T[$1.$2]}" -v n="${N[$1.$2]}" -v hz="$CLK_TCK" 'BEGIN {printf "%.1f", t / hz / n * 1e6}'; }
s_per_gb() { awk -v t="${T[$1.big]}" -v b="${B[$1.big]}" -v hz="$CLK_TCK" 'BEGIN {printf "%.3f", t / hz / (b / 1e9)}'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", a / b}'; }
added() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", a - b}'; }
verdict() { awk -v r="$1" -v t="$2" 'BEGIN {print (r <= t ? "met" : "**not met**")}'; }
lt_verdict() { awk -v r="$1" -v t="$2" 'BEGIN {print (r < t ? "met" : "**not met**")}'; }
# A/B of each round (CPU per request or per byte): the spread of the ratio.
round_ratios() { # round_ratios h1|h2|big A B
    local r out=""
    for r in $(seq "$ROUNDS"); do
        out="$out $(awk -v ta="${RT[$2.$1.$r]}" -v da="${RD[$2.$1.$r]}" \
            -v tb="${RT[$3.$1.$r]}" -v db="${RD[$3.$1.$r]}" \
            'BEGIN {printf "%.2f", (ta / da) / (tb / db)}')"
    done
    echo "${out# }"
}

TABLE="| proxy | CPU per small GET, h1 | h2 | max GETs/s h1 / h2 (per round) | CPU per GB (h1) | peak RSS | p99 at $LAT_RATE/s h1 / h2 | added p99 h1 / h2 |
|---|---|---|---|---|---|---|---|"
for p in "${PROXIES[@]}"; do
    TABLE="$TABLE
| $p | $(us_per_req "$p" h1) µs | $(us_per_req "$p" h2) µs | ${MAXRATE[$p.h1]# } / ${MAXRATE[$p.h2]# } | $(s_per_gb "$p") s | $(mib "${HWM[$p]}") MiB | ${P99[$p.h1]} / ${P99[$p.h2]} ms | ${ADDED[$p.h1]} / ${ADDED[$p.h2]} ms |"
done
TABLE="$TABLE
| (direct to the upstream) | | | | | | ${P99[direct.h1]} / ${P99[direct.h2]} ms | |"

RATIOS=""
line() { RATIOS="$RATIOS$1
"; }
T0=tollgate-dryRun
# T0 / PEER per small GET over h1 or h2, against its target.
small_target() { # small_target h1|h2 PEER TARGET [WHAT]
    local x
    x=$(ratio "$(us_per_req "$T0" "$1")" "$(us_per_req "$2" "$1")")
    line "- $1: $T0 / ${4:-$2} per small GET: **$x×** (target ≤ $3×: $(verdict "$x" "$3")); per round: $(round_ratios "$1" "$T0" "$2")."
}
if has "$T0"; then
    for w in h1 h2; do
        best=""
        for peer in nginx haproxy; do
            has "$peer" || continue
            if [[ -z "$best" ]] || awk -v a="$(us_per_req "$peer" "$w")" -v b="$(us_per_req "$best" "$w")" 'BEGIN {exit !(a < b)}'; then
                best=$peer
            fi
        done
        if [[ -n "$best" ]]; then
            small_target "$w" "$best" "$PEER_TARGET" "the better peer ($best)"
            for peer in nginx haproxy; do
                has "$peer" && [[ $peer != "$best" ]] && line "  $T0 / $peer: $(ratio "$(us_per_req "$T0" "$w")" "$(us_per_req "$peer" "$w")")×."
            done
        fi
        ! has minproxy || small_target "$w" minproxy "$MIN_TARGET"
        ! has tollgate-off || small_target "$w" tollgate-off "$MODE_TARGET"
        if has tollgate-enforce; then
            line "- $w: tollgate-enforce / $T0 per small GET: $(ratio "$(us_per_req tollgate-enforce "$w")" "$(us_per_req "$T0" "$w")")×."
        fi
    done
    if has minproxy; then
        x=$(ratio "$(s_per_gb "$T0")" "$(s_per_gb minproxy)")
        line "- $T0 / minproxy per GB: **$x×** (target ≤ $GB_TARGET×: $(verdict "$x" "$GB_TARGET")); per round: $(round_ratios big "$T0" minproxy)."
    fi
    for w in h1 h2; do
        x=${ADDED[$T0.$w]}
        rounds_note=""
        if ((LAT_ROUNDS > 1)); then
            rounds_note="; per round: ${ADDED_ROUNDS[$T0.$w]}"
            for peer in minproxy haproxy nginx; do
                has "$peer" && rounds_note="$rounds_note; $peer's median ${ADDED[$peer.$w]} ms (${ADDED_ROUNDS[$peer.$w]})"
            done
        fi
        line "- $w: $T0's added p99 at $LAT_RATE/s: **$x ms** (target < $P99_TARGET_MS ms: $(lt_verdict "$x" "$P99_TARGET_MS"))$rounds_note."
        if has minproxy; then
            line "- $w: with /debug/patterns scraped every 100 ms: $T0's p99 ${P99[scraped.$w]} ms (${P99[$T0.$w]} without, $(added "${P99[scraped.$w]}" "${P99[$T0.$w]}") ms); the control, minproxy with the same scraper running: ${P99[scraped-minproxy.$w]} ms (${P99[minproxy.$w]} without, $(added "${P99[scraped-minproxy.$w]}" "${P99[minproxy.$w]}") ms)."
        else
            line "- $w: with /debug/patterns scraped every 100 ms: $T0's p99 ${P99[scraped.$w]} ms (${P99[$T0.$w]} without)."
        fi
    done
    line "- /debug/patterns answered $SCRAPES scrapes with 200 during the scraped runs (10 a second)."
fi
# Light requests over HTTP/1.1 to the upstream against HTTP/2, per small GET and per GB (bulk
# stays HTTP/2, so per GB should not move).
for p in "${PROXIES[@]}"; do
    [[ $p == *-h1up ]] || continue
    base=${p%-h1up}
    has "$base" || continue
    for w in h1 h2; do
        line "- $w: $p / $base per small GET: **$(ratio "$(us_per_req "$p" "$w")" "$(us_per_req "$base" "$w")")×**; per round: $(round_ratios "$w" "$p" "$base")."
    done
    line "- $p / $base per GB: $(ratio "$(s_per_gb "$p")" "$(s_per_gb "$base")")×; per round: $(round_ratios big "$p" "$base")."
done

CPU_MODEL=$(awk -F': ' '/model name/ {print $2; exit}' /proc/cpuinfo)
SECTION=$(cat <<EOF
## tollgate in the deployed shape (issue 21)

\`${PROXIES_SET:+PROXIES=\"$PROXIES_SET\" }${PROFILE:+PROFILE=1 }ROUNDS=$ROUNDS DURATION=$DURATION LAT_DURATION=$LAT_DURATION LAT_ROUNDS=$LAT_ROUNDS bash bench/scripts/tls-bench.sh\`
(OFFERED=$OFFERED/s, INFLIGHT=$INFLIGHT, BIG_CONNS=$BIG_CONNS, BIG_GETS=$BIG_GETS${PIN:+, PIN=$PIN}${PIN_REST:+, PIN_REST=$PIN_REST}), release
builds, run $(date -u +%Y-%m-%dT%H:%MZ) on $(nproc) cores ($CPU_MODEL): load average $LOAD_BEFORE
before, $LOAD_AFTER after. $("$NGINX" -v 2>&1 | sed 's/.*: //'), HAProxy $("$HAPROXY" -v | awk 'NR == 1 {print $3}').

Shape: TLS from clients with client certificates (RSA 2048, as kubeadm), TLS to the upstream with
a front-proxy certificate. Upstream: nginx (one worker) over HTTPS offering h2 and http/1.1, a
1 KB JSON document for every pod GET and a 200 MB body for LIST configmaps. tollgate: release,
\`--mode\` dryRun (the default), off and enforce, \`--client-ca-file\`, \`--front-proxy-cert\`,
\`--upstream-ca\`; health checks on /readyz, apiserver metrics scrape off. minproxy
(bench/src/bin/minproxy.rs): TLS both sides, client certificates required, nothing else. nginx
and HAProxy: TLS terminated with client certificates required, CN/O forwarded as
X-Remote-User/-Group, re-encrypted with the front-proxy certificate, kept-alive upstream
connections (nginx: HTTP/1.1; HAProxy: HTTP/1.1, \`http-reuse always\`), no access logs. Cores:
one worker each (\`TOKIO_WORKER_THREADS=1\`, \`worker_processes 1\`, \`nbthread 1\`). Clients:
loadgen GETs with a client certificate (\`--http-version 1.1\` with $INFLIGHT connections, or \`2\`,
one connection), offered $OFFERED/s with at most $INFLIGHT outstanding, so the completed rate is
the maximum here; 200 MB LISTs with curl (HTTP/1.1), $BIG_CONNS × $BIG_GETS per round. CPU =
utime+stime of the proxy process (/proc/PID/stat) over all rounds, per GET completed or per GB
(10^9 B) received. p99: loadgen open loop at $LAT_RATE/s (half the slowest maximum, $SLOWEST),
${LAT_DURATION}s per run after ${WARMUP}s at half that rate (connections opened; left out), latency from
intended start; "added" is against the upstream directly$( ((LAT_ROUNDS > 1)) && echo " in the same round; over $LAT_ROUNDS interleaved rounds, each p99 is the median of the rounds' and each added p99 the median of the rounds' differences").

$TABLE

$RATIOS
${PROFILE_TABLE:+
$PROFILE_TABLE}
EOF
)
echo "$SECTION"
if [[ "$RESULTS" != "-" ]]; then
    # Follow-ups written by hand under the section ("### …") stay.
    kept=$(python3 - "$RESULTS" <<'PY'
import sys
try:
    text = open(sys.argv[1]).read()
except FileNotFoundError:
    sys.exit(0)
start = text.find("## tollgate in the deployed shape (issue 21)\n")
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
