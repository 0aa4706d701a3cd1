#!/usr/bin/env bash
# The demo on the embedded simulated cluster: starts the simulated
# kube-apiserver seeded with 100 nodes and 3,000 pods and drives it with
# kubectl. (It grows into `tollgate-bench demo` as the proxy and loadgen land.)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
cargo build --release --locked -p bench --bin tollgate-bench

work=$(mktemp -d)
sim_pid=""
cleanup() { [ -n "$sim_pid" ] && kill "$sim_pid" 2>/dev/null; wait 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT

./target/release/tollgate-bench sim --listen 127.0.0.1:0 --nodes 100 --pods 3000 \
  --kubeconfig-out "$work/kubeconfig" >"$work/sim.out" 2>"$work/sim.err" &
sim_pid=$!
for _ in $(seq 300); do grep -q "serving" "$work/sim.out" 2>/dev/null && break; sleep 0.1; done
grep "serving" "$work/sim.out" || { cat "$work/sim.err"; exit 1; }

k() { echo "\$ kubectl $*" >&2; kubectl --kubeconfig "$work/kubeconfig" --request-timeout=20s "$@"; echo; }
k get nodes --no-headers -o custom-columns=NAME:.metadata.name | sed -n '1,5p'
k get pods -A --no-headers | wc -l
k get pods -A --field-selector spec.nodeName=node-7 | sed -n '1,6p'
pod=$(kubectl --kubeconfig "$work/kubeconfig" get pods -n ns-1 -o name | sed -n '1p')
k label -n ns-1 "$pod" demo=yes
k get -n ns-1 "$pod" --show-labels
k patch node node-1 --type merge -p '{"metadata":{"labels":{"demo":"patched"}}}'
k delete -n ns-1 "$pod"
k get --raw /metrics | grep -E '^apiserver_request_total' | sed -n '1,5p'
echo "The simulated apiserver's kubeconfig was $work/kubeconfig (removed on exit)."
