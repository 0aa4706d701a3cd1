# Shared helpers of the benchmark scripts in bench/scripts (sourced, not run).
# The caller sets BENCH (its name, for messages) before sourcing. bench_init makes the temp dir
# and the exit trap that kills, by pid, every process recorded in PIDS. The temp dir is under
# TMPDIR (default /tmp): the real-apiserver benchmarks keep etcd's data there, so TMPDIR=/dev/shm
# takes a shared disk's stalls out of the heartbeats' fsyncs.

die() { echo "$BENCH: $*" >&2; exit 1; }
log() { echo "$BENCH: $*" >&2; }

bench_init() {
    TMP=$(mktemp -d "${TMPDIR:-/tmp}/$BENCH.XXXXXX")
    PIDS=()
    trap bench_cleanup EXIT
    trap 'exit 130' INT TERM HUP PIPE
}
bench_cleanup() {
    local pid
    # A script's own cleanup first (goodput.sh: a real apiserver started through its starter).
    if declare -F bench_cleanup_hook >/dev/null; then bench_cleanup_hook || true; fi
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
    [[ -n "${KEEP_TMP:-}" ]] || rm -rf "$TMP"
}

# Installs the Debian packages of the commands that are missing (apt_need CMD PACKAGE [CMD
# PACKAGE]...): as root with apt-get (updating the lists first), else it says what to run and stops.
# nginx and haproxy live in /usr/sbin, off a non-root PATH: found there too.
apt_need() {
    local missing=()
    while (($# >= 2)); do
        command -v "$1" >/dev/null 2>&1 || [[ -x /usr/sbin/$1 ]] ||
            [[ " ${missing[*]} " == *" $2 "* ]] || missing+=("$2")
        shift 2
    done
    ((${#missing[@]})) || return 0
    [[ $(id -u) == 0 ]] || die "missing: ${missing[*]} (sudo apt-get update && sudo apt-get install -y ${missing[*]})"
    log "installing ${missing[*]} (Debian packages)..."
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >&2 || die "apt-get update failed"
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2 || die "apt-get install ${missing[*]} failed"
}
free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}
# Polls (bounded) until GET URL answers 200.
wait_http() { # wait_http URL PID what
    local i
    for i in $(seq 200); do
        curl -skf -o /dev/null -r 0-0 "$1" && return 0
        kill -0 "$2" 2>/dev/null || die "$3 exited; see $TMP"
        sleep 0.05
    done
    die "$3 did not answer at $1 within 10 s"
}
# Polls (bounded) stdout file FILE for "PREFIX URL"; prints URL.
wait_line() { # wait_line FILE PREFIX PID what
    local i url
    for i in $(seq 1200); do
        url=$(grep -o "$2[^ ]*" "$1" 2>/dev/null | head -1 | awk '{print $NF}' || true)
        [[ -n "$url" ]] && { echo "$url"; return 0; }
        kill -0 "$3" 2>/dev/null || { cat "$1" >&2; die "$4 exited"; }
        sleep 0.05
    done
    die "$4 printed no address within 60 s"
}
# wait_tollgate OUT PID: the tollgate of pid PID, writing its start lines to OUT, serves; sets
# TG_TARGET (its URL) and TG_ADMIN (its admin listener's), once the admin listener is ready.
wait_tollgate() {
    TG_TARGET=$(wait_line "$1" "tollgate serving at " "$2" "tollgate")
    TG_ADMIN=$(grep -o "admin http://[^)]*" "$1" | head -1 | awk '{print $2}')
    wait_http "$TG_ADMIN/readyz" "$2" "tollgate's admin listener"
}
nginx_conf() { # nginx_conf DIR PORT SERVER_BLOCK [HTTP_EXTRA]
    mkdir -p "$1/logs" "$1/tmp"
    cat >"$1/nginx.conf" <<NGINX
worker_processes 1;
daemon off;
pid $1/nginx.pid;
error_log $1/logs/error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    default_type application/octet-stream;
    types { application/json json; }
    keepalive_requests 100000000;
    client_body_temp_path $1/tmp/body;
    proxy_temp_path $1/tmp/proxy;
    fastcgi_temp_path $1/tmp/fastcgi;
    uwsgi_temp_path $1/tmp/uwsgi;
    scgi_temp_path $1/tmp/scgi;
    ${4:-}
    server {
        listen 127.0.0.1:$2;
        $3
    }
}
NGINX
}
# The upstream's files in DIR: small.json (a 1 KB JSON List) and big.bin (BYTES of zeros).
# nginx workers run as an unprivileged user (when started as root): they must read them.
upstream_files() { # upstream_files DIR BYTES
    chmod 755 "$(dirname "$1")"
    mkdir -p "$1"
    python3 - "$1/small.json" <<'EOF'
import json, sys
items = [{"name": f"item-{i}", "value": i} for i in range(25)]
doc = {"kind": "List", "apiVersion": "v1", "items": items}
s = json.dumps(doc)
s = s[:-1] + ', "pad": "' + "x" * (1024 - len(s) - 11) + '"}'
assert len(s) == 1024, len(s)
open(sys.argv[1], "w").write(s)
EOF
    truncate -s "$2" "$1/big.bin"
    chmod 644 "$1/small.json" "$1/big.bin"
}
# The worker of a one-worker nginx whose master is PID.
nginx_worker() {
    local i w
    for i in $(seq 100); do
        w=$(cat "/proc/$1/task/$1/children" 2>/dev/null | awk '{print $1}')
        [[ -n "$w" ]] && { echo "$w"; return 0; }
        sleep 0.05
    done
    die "nginx master $1 has no worker"
}
# CPU ticks (utime + stime) of PID.
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
# Resident set (KiB) now, and its high-water mark.
rss_kb() { awk '/^VmRSS/ {print $2}' "/proc/$1/status"; }
hwm_kb() { awk '/^VmHWM/ {print $2}' "/proc/$1/status"; }
mib() { awk -v k="$1" 'BEGIN {printf "%.1f", k / 1024}'; }
# The median of the numbers on stdin (whitespace-separated; the mean of the middle two for an
# even count), with three decimals.
median() { tr -s ' \t' '\n\n' | grep . | sort -g | awk '{v[NR] = $1} END {printf "%.3f", NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
# nginx as a plain reverse proxy to 127.0.0.1:UPSTREAM_PORT, the peer of the proxy benchmarks:
# one worker, proxy_buffering off, 64 KB buffers, upstream keepalive.
nginx_proxy_conf() { # nginx_proxy_conf DIR PORT UPSTREAM_PORT
    nginx_conf "$1" "$2" "location / {
            proxy_pass http://up;
            proxy_http_version 1.1;
            proxy_set_header Connection \"\";
            proxy_buffering off;
            proxy_buffer_size 64k;
            proxy_buffers 4 64k;
        }" "upstream up { server 127.0.0.1:$3; keepalive 64; }"
}
# The real apiserver's scripts for KUBE (1.20: ../shared/tools/kube-apiserver or
# KUBE_APISERVER_TOOLS; current: scripts/kube-current*.sh): sets KUBE_START, KUBE_STOP, KUBE_INSTALL.
kube_tools() {
    case $KUBE in
    1.20)
        local tools=${KUBE_APISERVER_TOOLS:-$ROOT/../shared/tools/kube-apiserver}
        [[ -x $tools/start.sh ]] || tools=/work/shared/tools/kube-apiserver
        KUBE_START=$tools/start.sh KUBE_STOP=$tools/stop.sh KUBE_INSTALL=$tools/install.sh
        ;;
    current)
        KUBE_START=$ROOT/scripts/kube-current-start.sh KUBE_STOP=$ROOT/scripts/kube-current-stop.sh
        KUBE_INSTALL=$ROOT/scripts/kube-current.sh
        ;;
    *) die "KUBE=$KUBE: 1.20 or current" ;;
    esac
}
# tollgate's flags in front of a real apiserver whose env file is sourced: its serving certificate,
# client CA, front-proxy identity and an admin client certificate upstream. Sets REAL_TLS_ARGS.
real_tls_args() {
    REAL_TLS_ARGS=(--upstream-ca "$KUBE_CA_CERT" --tls-cert-file "$KUBE_RUN_DIR/pki/apiserver.crt"
        --tls-private-key-file "$KUBE_RUN_DIR/pki/apiserver.key" --client-ca-file "$KUBE_CA_CERT"
        --front-proxy-cert "$KUBE_FRONT_PROXY_CLIENT_CERT" --front-proxy-key "$KUBE_FRONT_PROXY_CLIENT_KEY"
        --upstream-client-cert "$KUBE_ADMIN_CERT" --upstream-client-key "$KUBE_ADMIN_KEY")
}
# Replaces the section of FILE whose heading is SECTION's first line (up to the next "## "),
# or appends SECTION; creates FILE if missing.
write_section() { # write_section FILE SECTION
    python3 - "$1" "$2" <<'PY'
import sys
path, section = sys.argv[1], sys.argv[2].rstrip("\n") + "\n"
try:
    text = open(path).read()
except FileNotFoundError:
    text = "# Benchmark results\n"
heading = section.split("\n", 1)[0]
start = text.find(heading + "\n")
if start < 0:
    text = text.rstrip("\n") + "\n\n" + section
else:
    nxt = text.find("\n## ", start + len(heading))
    text = text[:start] + section + ("" if nxt < 0 else text[nxt:])
open(path, "w").write(text)
PY
}
# The release tollgate-bench, tollgate and loadgen in BIN_DIR (default target/release): built
# unless SKIP_BUILD is set, then checked; sets SIM_BIN, TOLLGATE_BIN and LOADGEN_BIN.
release_binaries() {
    BIN_DIR=${BIN_DIR:-$ROOT/target/release}
    SIM_BIN=$BIN_DIR/tollgate-bench
    TOLLGATE_BIN=$BIN_DIR/tollgate
    LOADGEN_BIN=$BIN_DIR/loadgen
    if [[ -z "${SKIP_BUILD:-}" ]]; then
        (cd "$ROOT" && cargo build --release --locked -p bench -p tollgate -p loadgen \
            --bin tollgate-bench --bin tollgate --bin loadgen) >&2
    fi
    local b bins=("$TOLLGATE_BIN" "$LOADGEN_BIN")
    # NEED_SIM=0: a run on the real apiserver only needs no tollgate-bench.
    [[ ${NEED_SIM:-1} == 0 ]] || bins+=("$SIM_BIN")
    for b in "${bins[@]}"; do
        [[ -x $b ]] || die "$b is missing: build the release binaries first"
    done
}
