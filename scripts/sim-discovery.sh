#!/usr/bin/env bash
# Regenerates bench/src/sim/api/discovery-1.20.json: the discovery documents of the real
# kube-apiserver 1.20.2 (`/api`, `/api/v1`, `/apis` and every group/version's resource list),
# which the simulator serves its resource list from (bench/src/sim/resources.rs).
#
#   bash scripts/sim-discovery.sh            # starts kube-apiserver with the shared tools' start.sh
#
# Needs the kube-apiserver tools (../shared/tools/kube-apiserver, or $KUBE_APISERVER_TOOLS; built
# once by their install.sh), kubectl and jq. The server address in `/api` is dropped (it is the
# run's random port); everything else is stored as served, in the server's order.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
tools=${KUBE_APISERVER_TOOLS:-}
for d in "$tools" "$repo/../shared/tools/kube-apiserver" /work/shared/tools/kube-apiserver; do
  if [[ -n "$d" && -x "$d/start.sh" || -f "$d/start.sh" ]]; then tools=$d; break; fi
done
[[ -f "$tools/start.sh" ]] || { echo "no kube-apiserver tools (set KUBE_APISERVER_TOOLS)" >&2; exit 1; }
run=$(mktemp -d)
trap 'bash "$tools/stop.sh" "$run" >/dev/null 2>&1 || true; rm -rf "$run"' EXIT
bash "$tools/start.sh" "$run" >/dev/null
export KUBECONFIG="$run/kubeconfig"
raw() { kubectl get --raw "$1"; }
out="$repo/bench/src/sim/api/discovery-1.20.json"
{

  echo '{"api":'; raw /api | jq -c 'del(.serverAddressByClientCIDRs)'
  echo ',"apis":'; raw /apis
  echo ',"resources":['; raw /api/v1
  for gv in $(raw /apis | jq -r '.groups[].versions[].groupVersion'); do
    echo ','; raw "/apis/$gv"
  done
  echo ']}'
} | jq --indent 1 . >"$out"
echo "wrote $out ($(jq '[.resources[].resources[]] | length' "$out") resources and subresources)" >&2
