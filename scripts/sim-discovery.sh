#!/usr/bin/env bash
# Regenerates the discovery documents the simulator serves, from a real kube-apiserver:
#   bench/src/sim/api/discovery-1.20.json      kube-apiserver 1.20.2 (`--kube-version 1.20`)
#   bench/src/sim/api/discovery-current.json   the current release (`--kube-version 1.37`)
# Each holds `/version`, `/api`, `/apis` and every group/version's resource list (`/api/v1`,
# `/apis/G/V`), which the simulator serves and builds its resource table from
# (bench/src/sim/resources/builtin.rs).
#
#   bash scripts/sim-discovery.sh            # 1.20.2, with the shared tools' start.sh
#   bash scripts/sim-discovery.sh current    # the release scripts/kube-current.sh built
#
# 1.20 needs the kube-apiserver tools (../shared/tools/kube-apiserver, or $KUBE_APISERVER_TOOLS;
# built once by their install.sh); current needs scripts/kube-current.sh's build (cached outside
# the checkout). Both need kubectl and jq. The server address in `/api` is dropped (it is the
# run's random port),; everything else
# is stored as served, in the server's order.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
which=${1:-1.20}
run=$(mktemp -d)
case $which in
  1.20)
    tools=${KUBE_APISERVER_TOOLS:-}
    for d in "$tools" "$repo/../shared/tools/kube-apiserver" /work/shared/tools/kube-apiserver; do
      if [[ -n "$d" && -f "$d/start.sh" ]]; then tools=$d; break; fi
    done
    [[ -f "$tools/start.sh" ]] || { echo "no kube-apiserver tools (set KUBE_APISERVER_TOOLS)" >&2; exit 1; }
    start=("$tools/start.sh"); stop=("$tools/stop.sh")
    out="$repo/bench/src/sim/api/discovery-1.20.json"
    ;;
  current)
    start=("$repo/scripts/kube-current-start.sh"); stop=("$repo/scripts/kube-current-stop.sh")
    out="$repo/bench/src/sim/api/discovery-current.json"
    ;;
  *) echo "usage: $0 [1.20|current]" >&2; rm -rf "$run"; exit 64 ;;
esac
trap 'bash "${stop[0]}" "$run" >/dev/null 2>&1 || true; rm -rf "$run"' EXIT
bash "${start[0]}" "$run" >/dev/null
export KUBECONFIG="$run/kubeconfig"
raw() { kubectl get --raw "$1"; }
{
  echo '{"version":'; raw /version
  echo ',"api":'; raw /api | jq -c 'del(.serverAddressByClientCIDRs)'
  echo ',"apis":'; raw /apis
  echo ',"resources":['; raw /api/v1
  for gv in $(raw /apis | jq -r '.groups[].versions[].groupVersion'); do
    echo ','; raw "/apis/$gv"
  done
  echo ']}'
} | jq --indent 1 . >"$out"
echo "wrote $out ($(jq '[.resources[].resources[]] | length' "$out") resources and subresources)" >&2
