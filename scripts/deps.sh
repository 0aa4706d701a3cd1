#!/usr/bin/env bash
# Installs what building and testing Tollgate needs on a fresh Debian machine,
# only when missing. Sourced by scripts/test.sh and scripts/demo.sh.
#   build: protoc and its includes (etcd-client generates its gRPC code at build time), make (jemalloc's build)
#   tests: etcd (real storage), kubectl (real client), chromium (renders the demo's report),
#          prometheus (evaluates the dashboards and rules), podman, buildah and runc (build and
#          run the container images), and a real kube-apiserver 1.20.2
#          built once into a cache outside the repo by ../shared/tools/kube-apiserver/install.sh
set -euo pipefail

need_pkgs=()
command -v protoc >/dev/null 2>&1 || need_pkgs+=(protobuf-compiler)
# protoc's includes: etcd-client's .proto files import google/protobuf/descriptor.proto.
[ -f /usr/include/google/protobuf/descriptor.proto ] || need_pkgs+=(libprotobuf-dev)
# tollgate's allocator (tikv-jemalloc-sys) builds jemalloc's C sources with make.
command -v make >/dev/null 2>&1 || need_pkgs+=(make)
if [ "${1:-}" = "--tests" ]; then
  command -v etcd >/dev/null 2>&1 || need_pkgs+=(etcd-server)
  # Debian's kubectl is 1.20; a newer kubectl already on the machine is preferred.
  command -v kubectl >/dev/null 2>&1 || need_pkgs+=(kubernetes-client)
  # Headless Chromium renders the demo's report in tests/tests/demo.rs.
  command -v chromium >/dev/null 2>&1 || need_pkgs+=(chromium)
  # A real Prometheus (and promtool) checks the dashboards and rules in tests/tests/observability.
  { command -v prometheus && command -v promtool; } >/dev/null 2>&1 || need_pkgs+=(prometheus)
  # tests/tests/images.rs builds the images with buildah (scripts/build-images.sh) and runs them
  # with podman under runc: crun, podman's default, refuses hosts whose cgroups are hybrid.
  command -v podman >/dev/null 2>&1 || need_pkgs+=(podman)
  command -v buildah >/dev/null 2>&1 || need_pkgs+=(buildah)
  command -v runc >/dev/null 2>&1 || need_pkgs+=(runc)
fi

if [ ${#need_pkgs[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "missing: ${need_pkgs[*]}. Install them with:" >&2
    echo "  sudo apt-get update && sudo apt-get install -y ${need_pkgs[*]}" >&2
    exit 1
  fi
  echo "installing ${need_pkgs[*]} (Debian packages)…" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${need_pkgs[@]}" >/dev/null
fi

if ! command -v cargo-nextest >/dev/null 2>&1; then
  echo "installing cargo-nextest…" >&2
  cargo install --locked cargo-nextest >/dev/null
fi

if [ "${1:-}" = "--tests" ]; then
  # The real-apiserver test tier (tests/tests/real_apiserver) needs kube-apiserver, built once
  # per machine (~7 min on 2 cores, then a < 1 s no-op). Its scripts live beside the checkout,
  # never at a path this repo hard-codes: KUBE_APISERVER_TOOLS if set, else ../shared/tools
  # next to the repo root (CI's layout too), else the development machine's /work/shared.
  repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  usable() { [ -x "$1/install.sh" ] && [ -x "$1/start.sh" ] && [ -x "$1/stop.sh" ]; }
  if [ -n "${KUBE_APISERVER_TOOLS:-}" ]; then
    # An explicit choice that does not work is an error, not a reason to guess.
    if ! usable "$KUBE_APISERVER_TOOLS"; then
      echo "missing: KUBE_APISERVER_TOOLS=$KUBE_APISERVER_TOOLS has no executable install.sh, start.sh and stop.sh" >&2
      exit 1
    fi
    tools=$KUBE_APISERVER_TOOLS
  elif usable "$repo_root/../shared/tools/kube-apiserver"; then
    tools=$repo_root/../shared/tools/kube-apiserver
  elif usable /work/shared/tools/kube-apiserver; then
    tools=/work/shared/tools/kube-apiserver
  else
    echo "missing: the kube-apiserver test tools (install.sh, start.sh, stop.sh) that the" >&2
    echo "  real-apiserver tests need. Looked in $repo_root/../shared/tools/kube-apiserver" >&2
    echo "  and /work/shared/tools/kube-apiserver; set KUBE_APISERVER_TOOLS to their directory." >&2
    exit 1
  fi
  tools=$(cd "$tools" && pwd)
  echo "kube-apiserver for the real-apiserver tests: $tools/install.sh (cached after the first build)…" >&2
  "$tools/install.sh" >&2
fi
