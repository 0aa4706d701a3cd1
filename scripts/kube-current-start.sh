#!/usr/bin/env bash
# kube-current-start.sh RUN_DIR [extra kube-apiserver flags...]
# Starts the current etcd and kube-apiserver (scripts/kube-current.sh's build) on 127.0.0.1 with
# free ports, a throwaway PKI and RBAC for an unprivileged test user; waits for /readyz; prints the
# URL on stdout. Stop with scripts/kube-current-stop.sh RUN_DIR.
#
# The 1.20.2 tier's ../shared/tools/kube-apiserver/start.sh, adapted to a current apiserver: the
# same PKI, kubeconfig, RBAC, RUN_DIR layout and `env` file (one more variable,
# KUBE_APISERVER_VERSION), so tests/src/kube.rs reads both alike. What differs for a current
# kube-apiserver (tests/CONFORMANCE.md lists what the apiserver itself does differently):
#   - no --insecure-port=0: the insecure port and its flag were removed in 1.24 (an unknown flag
#     is fatal);
#   - etcd is the one built beside it (the release kube-apiserver ships with), not Debian's 3.4.
# Writes into RUN_DIR: env (source it), kubeconfig (contexts admin, test-user), pki/, pids, logs/,
# etcd-data/ (unless KUBE_ETCD_DATA_DIR is given).
# Env: KUBE_APISERVER_PORT, KUBE_ETCD_PORT, KUBE_ETCD_PEER_PORT   fixed ports instead of free ones
#      KUBE_ETCD_DATA_DIR   use (and keep) this etcd data dir instead of a fresh RUN_DIR/etcd-data
#      KUBE_APISERVER_BIN, KUBE_ETCD_BIN   (default: kube-current.sh --print-dir's kube-apiserver, etcd)
#      KUBE_START_TIMEOUT   seconds to wait for /readyz (default 60)
# (No ETCD_* names: etcd reads every ETCD_* variable as a flag; it is started without them.)
# Example: scripts/kube-current-start.sh /tmp/kube-run --max-requests-inflight=1 && source /tmp/kube-run/env
set -Eeuo pipefail

HERE=$(cd "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
log() { local ms=$(($(date +%s%N) / 1000000 - T0)); printf '[start %2d.%ds] %s\n' $((ms / 1000)) $((ms % 1000 / 100)) "$*" >&2; }
die() { printf 'kube-current-start.sh: ERROR: %s\n' "$*" >&2; exit 1; }
T0=$(($(date +%s%N) / 1000000))
(($# >= 1)) || { echo "usage: $0 RUN_DIR [extra kube-apiserver flags...]" >&2; exit 64; }
mkdir -p -- "$1"
RUN=$(cd -- "$1" && pwd); shift
P=$RUN/pki
BUILT=$("$HERE/kube-current.sh" --print-dir)
APISERVER_BIN=$(realpath -e -- "${KUBE_APISERVER_BIN:-$BUILT/kube-apiserver}" 2>/dev/null) ||
  die "no kube-apiserver at ${KUBE_APISERVER_BIN:-$BUILT/kube-apiserver}: run $HERE/kube-current.sh"
ETCD_BIN=$(realpath -e -- "${KUBE_ETCD_BIN:-$BUILT/etcd}" 2>/dev/null) ||
  die "no etcd at ${KUBE_ETCD_BIN:-$BUILT/etcd}: run $HERE/kube-current.sh"
for c in openssl curl; do command -v $c >/dev/null || die "$c missing (apt-get install openssl curl)"; done
VERSION=$("$APISERVER_BIN" --version 2>/dev/null) || die "$APISERVER_BIN --version failed"
VERSION=${VERSION#Kubernetes }
DEADLINE=$((SECONDS + ${KUBE_START_TIMEOUT:-60}))

# alive PID: running and not a zombie (a dead process lingers as a zombie until it is reaped).
alive() { local s; s=$(cat "/proc/$1/stat" 2>/dev/null) || return 1; s=${s##*) }; [[ ${s:0:1} != [ZX] ]]; }
if [[ -f $RUN/pids ]]; then
  while read -r _ pid _; do ! alive "$pid" || die "$RUN already has running processes: kube-current-stop.sh $RUN first"; done <"$RUN/pids"
fi
rm -rf -- "$P" "$RUN/logs" "$RUN/etcd-data" "$RUN/kubeconfig" "$RUN/env" "$RUN/pids"
mkdir -p "$P" "$RUN/logs"
# On any failure from here on, stop whatever was started (stop.sh reads RUN_DIR/pids).
trap 'rc=$?; ((rc == 0)) || { [[ ! -f $RUN/pids ]] || "$HERE/kube-current-stop.sh" "$RUN" >&2 || true; die "failed; logs in $RUN/logs"; }' EXIT
trap 'exit 130' INT TERM

# Ports: a given one must be free; others are random, below the ephemeral range, and not used by
# any socket in /proc/net/tcp* (a free check, not a reservation: see README).
USED=" "
while read -r _ addr _; do USED+="$((16#${addr##*:})) "; done < <(tail -q -n +2 /proc/net/tcp /proc/net/tcp6 2>/dev/null)
pick_port() { # VAR [GIVEN_PORT]
  local p=${2:-}
  if [[ -n $p ]]; then
    [[ $USED != *" $p "* ]] || die "port $p is already in use"
  else
    for _ in {1..200}; do p=$((10000 + RANDOM % 22000)); [[ $USED == *" $p "* ]] || break; done
  fi
  USED+="$p "; printf -v "$1" %s "$p"
}
for a in "$@"; do [[ $a != --secure-port=* ]] || KUBE_APISERVER_PORT=${a#*=}; done
pick_port PORT "${KUBE_APISERVER_PORT:-}"
pick_port ETCD_PORT "${KUBE_ETCD_PORT:-}"
pick_port PEER_PORT "${KUBE_ETCD_PEER_PORT:-}"
URL=https://127.0.0.1:$PORT
ETCD_URL=http://127.0.0.1:$ETCD_PORT

# PKI: cluster CA (serving + client certs), front-proxy CA (request-header auth), SA key pair.
log "generating PKI in $P"
ca() { openssl req -x509 -newkey rsa:2048 -nodes -keyout "$P/$1.key" -out "$P/$1.crt" -days 365 -subj "/CN=$2" \
  -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign; }
cert() { # NAME SUBJECT CA EXTENSION...
  local name=$1 subj=$2 ca=$3; shift 3
  openssl req -new -newkey rsa:2048 -nodes -keyout "$P/$name.key" -subj "$subj" |
    openssl x509 -req -CA "$P/$ca.crt" -CAkey "$P/$ca.key" -set_serial "0x$(openssl rand -hex 16)" -days 365 \
      -sha256 -out "$P/$name.crt" -extfile <(printf '%s\n' basicConstraints=critical,CA:FALSE \
      keyUsage=critical,digitalSignature,keyEncipherment "$@")
}
{
  ca ca kube-test-ca
  ca front-proxy-ca kube-test-front-proxy-ca
  cert apiserver /CN=kube-apiserver ca extendedKeyUsage=serverAuth "subjectAltName=IP:127.0.0.1,IP:::1,IP:10.0.0.1,\
DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
  cert admin /O=system:masters/CN=admin ca extendedKeyUsage=clientAuth
  cert test-user /O=test-users/CN=test-user ca extendedKeyUsage=clientAuth
  cert front-proxy-client /CN=front-proxy-client front-proxy-ca extendedKeyUsage=clientAuth
  openssl genrsa -out "$P/sa.key" 2048 && openssl rsa -in "$P/sa.key" -pubout -out "$P/sa.pub"
} >"$RUN/logs/pki.log" 2>&1 || { cat "$RUN/logs/pki.log" >&2; die "openssl failed"; }
chmod 600 "$P"/*.key

cat >"$RUN/kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: local
  cluster: {server: "$URL", certificate-authority: "$P/ca.crt"}
users:
- name: admin
  user: {client-certificate: "$P/admin.crt", client-key: "$P/admin.key"}
- name: test-user
  user: {client-certificate: "$P/test-user.crt", client-key: "$P/test-user.key"}
contexts:
- name: admin
  context: {cluster: local, user: admin}
- name: test-user
  context: {cluster: local, user: test-user}
current-context: admin
EOF

# etcd: single member, loopback only. setsid: own session, survives the caller's terminal.
if [[ -n ${KUBE_ETCD_DATA_DIR:-} ]]; then DATA=$(realpath -m -- "$KUBE_ETCD_DATA_DIR"); else DATA=$RUN/etcd-data; fi
if [[ -n ${KUBE_ETCD_DATA_DIR:-} && $DATA == "$RUN/etcd-data" ]]; then die "KUBE_ETCD_DATA_DIR may not be $RUN/etcd-data"; fi
UNSET=() # etcd treats any ETCD_* variable (e.g. from a sourced env file) as a flag
for v in $(compgen -e); do if [[ $v == ETCD_* ]]; then UNSET+=(-u "$v"); fi; done
log "starting etcd on $ETCD_URL (data $DATA)"
setsid env "${UNSET[@]}" "$ETCD_BIN" --name local --data-dir "$DATA" \
  --listen-client-urls "$ETCD_URL" --advertise-client-urls "$ETCD_URL" \
  --listen-peer-urls "http://127.0.0.1:$PEER_PORT" --initial-advertise-peer-urls "http://127.0.0.1:$PEER_PORT" \
  --initial-cluster "local=http://127.0.0.1:$PEER_PORT" --initial-cluster-state new \
  >"$RUN/logs/etcd.log" 2>&1 </dev/null &
ETCD_PID=$!
echo "etcd $ETCD_PID $ETCD_BIN" >>"$RUN/pids"

# wait_for NAME PID CMD...: poll CMD every 0.1 s until it succeeds; fail if PID dies or at the deadline.
wait_for() {
  local name=$1 pid=$2; shift 2
  while :; do
    alive "$pid" || { tail -n 30 "$RUN/logs/$name.log" >&2; die "$name exited; see $RUN/logs/$name.log"; }
    if "$@" >/dev/null 2>&1; then return 0; fi
    ((SECONDS < DEADLINE)) || { tail -n 30 "$RUN/logs/$name.log" >&2; die "$name not ready in time"; }
    sleep 0.1
  done
}
etcd_healthy() { [[ $(curl -sS --max-time 2 "$ETCD_URL/health") == *'"health":"true"'* ]]; }
wait_for etcd "$ETCD_PID" etcd_healthy

log "starting kube-apiserver $VERSION on $URL"
setsid "$APISERVER_BIN" \
  --etcd-servers="$ETCD_URL" --bind-address=127.0.0.1 --advertise-address=127.0.0.1 \
  --secure-port="$PORT" --cert-dir="$P" \
  --tls-cert-file="$P/apiserver.crt" --tls-private-key-file="$P/apiserver.key" \
  --client-ca-file="$P/ca.crt" --authorization-mode=RBAC \
  --requestheader-client-ca-file="$P/front-proxy-ca.crt" --requestheader-allowed-names=front-proxy-client \
  --requestheader-username-headers=X-Remote-User --requestheader-group-headers=X-Remote-Group \
  --requestheader-extra-headers-prefix=X-Remote-Extra- \
  --proxy-client-cert-file="$P/front-proxy-client.crt" --proxy-client-key-file="$P/front-proxy-client.key" \
  --service-account-issuer=https://kubernetes.default.svc.cluster.local \
  --service-account-key-file="$P/sa.pub" --service-account-signing-key-file="$P/sa.key" \
  --service-cluster-ip-range=10.0.0.0/24 --endpoint-reconciler-type=none \
  --disable-admission-plugins=ServiceAccount \
  "$@" >"$RUN/logs/kube-apiserver.log" 2>&1 </dev/null &
APISERVER_PID=$!
echo "kube-apiserver $APISERVER_PID $APISERVER_BIN" >>"$RUN/pids"
# (ServiceAccount admission is off: without a controller-manager no 'default' SA exists, so it would
#  reject every pod. The endpoint reconciler is off: it rejects the loopback advertise address.)

ADMIN=(--cacert "$P/ca.crt" --cert "$P/admin.crt" --key "$P/admin.key")
ready() { [[ $(curl -sS --max-time 2 "${ADMIN[@]}" "$URL/readyz") == ok ]]; }
wait_for kube-apiserver "$APISERVER_PID" ready
# The recorded pids must be the binaries themselves (stop.sh checks /proc/PID/exe against them).
[[ $(readlink "/proc/$ETCD_PID/exe") == "$ETCD_BIN" ]] || die "etcd pid $ETCD_PID is gone or not $ETCD_BIN"
[[ $(readlink "/proc/$APISERVER_PID/exe") == "$APISERVER_BIN" ]] || die "kube-apiserver pid $APISERVER_PID is gone"

# RBAC for the unprivileged user (without a controller-manager the aggregated roles stay empty).
log "granting test-user get/list/watch/create/update/patch/delete on pods, nodes, namespaces, events, configmaps, leases"
VERBS='["get","list","watch","create","update","patch","delete"]'
post() { # PATH JSON: create, accept 409 AlreadyExists (reused etcd data)
  local code
  code=$(curl -sS -o "$RUN/logs/rbac.out" -w '%{http_code}' "${ADMIN[@]}" -H 'Content-Type: application/json' \
    -X POST --data "$2" "$URL$1")
  [[ $code == 201 || $code == 409 ]] || { cat "$RUN/logs/rbac.out" >&2; die "POST $1 -> HTTP $code"; }
}
RBAC=/apis/rbac.authorization.k8s.io/v1
post $RBAC/clusterroles '{"apiVersion":"rbac.authorization.k8s.io/v1","kind":"ClusterRole",
 "metadata":{"name":"test-user"},"rules":[
 {"apiGroups":[""],"resources":["pods","pods/status","nodes","nodes/status","namespaces","namespaces/status",
   "events","configmaps"],"verbs":'"$VERBS"'},
 {"apiGroups":["events.k8s.io"],"resources":["events"],"verbs":'"$VERBS"'},
 {"apiGroups":["coordination.k8s.io"],"resources":["leases"],"verbs":'"$VERBS"'}]}'
post $RBAC/clusterrolebindings '{"apiVersion":"rbac.authorization.k8s.io/v1","kind":"ClusterRoleBinding",
 "metadata":{"name":"test-user"},
 "roleRef":{"apiGroup":"rbac.authorization.k8s.io","kind":"ClusterRole","name":"test-user"},
 "subjects":[{"apiGroup":"rbac.authorization.k8s.io","kind":"User","name":"test-user"}]}'

{
  echo "# written by $HERE/kube-current-start.sh; source it"
  # (never the input knobs above: sourcing one run's env must not steer the next start.sh)
  for v in KUBE_APISERVER_URL="$URL" ETCD_URL="$ETCD_URL" ETCDCTL_ENDPOINTS="$ETCD_URL" \
    KUBECONFIG="$RUN/kubeconfig" KUBE_RUN_DIR="$RUN" KUBE_ETCD_DATA="$DATA" \
    KUBE_CA_CERT="$P/ca.crt" KUBE_ADMIN_CERT="$P/admin.crt" KUBE_ADMIN_KEY="$P/admin.key" \
    KUBE_USER_NAME=test-user KUBE_USER_CERT="$P/test-user.crt" KUBE_USER_KEY="$P/test-user.key" \
    KUBE_FRONT_PROXY_CA_CERT="$P/front-proxy-ca.crt" KUBE_FRONT_PROXY_CLIENT_CERT="$P/front-proxy-client.crt" \
    KUBE_FRONT_PROXY_CLIENT_KEY="$P/front-proxy-client.key" KUBE_SA_KEY="$P/sa.key" KUBE_SA_PUB="$P/sa.pub" \
    KUBE_APISERVER_PID="$APISERVER_PID" KUBE_ETCD_PID="$ETCD_PID" KUBE_APISERVER_VERSION="$VERSION"; do
    printf 'export %s=%q\n' "${v%%=*}" "${v#*=}"
  done
} >"$RUN/env"
log "ready: kube-apiserver pid $APISERVER_PID, etcd pid $ETCD_PID; source $RUN/env"
echo "$URL"
