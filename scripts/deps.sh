#!/usr/bin/env bash
# Installs what building and testing Tollgate needs on a fresh Debian machine,
# only when missing. Sourced by scripts/test.sh and scripts/demo.sh.
#   build: protoc and its includes (etcd-client generates its gRPC code at build time), make (jemalloc's build)
#   tests: etcd (real storage), kubectl (real client), chromium (renders the demo's report),
#          prometheus (evaluates the dashboards and rules), podman, buildah and runc (build and
#          run the container images), and two real kube-apiservers, each built once into a cache
#          outside the repo: 1.20.2 by ../shared/tools/kube-apiserver/install.sh and the current
#          release (with its etcd) by scripts/kube-current.sh (needs Go)
set -euo pipefail

need_pkgs=()
command -v protoc >/dev/null 2>&1 || need_pkgs+=(protobuf-compiler)
# protoc's includes: etcd-client's .proto files import google/protobuf/descriptor.proto, which
# protoc finds in PROTOC_INCLUDE (prost-build's variable) or beside itself (../include), else in
# /usr/include (Debian's libprotobuf-dev) or /usr/local/include. A protoc without them fails
# the build late and obscurely, so it is said here.
protoc_includes() {
  if [ -n "${PROTOC_INCLUDE:-}" ]; then
    echo "$PROTOC_INCLUDE"
    return
  fi
  local bin
  if bin=$(command -v protoc 2>/dev/null); then
    echo "$(dirname "$bin")/../include"
  fi
  echo /usr/include
  echo /usr/local/include
}
protoc_has_includes() {
  local dir
  while read -r dir; do
    [ -f "$dir/google/protobuf/descriptor.proto" ] && return 0
  done < <(protoc_includes)
  return 1
}
no_protoc_includes() {
  echo "missing: google/protobuf/descriptor.proto: protoc is $(command -v protoc || echo absent) but its" >&2
  echo "  includes are not in $(protoc_includes | paste -sd' ' -) (etcd-client's build imports it)." >&2
  echo "  Install libprotobuf-dev, or set PROTOC_INCLUDE to the directory that holds google/protobuf." >&2
  exit 1
}
if ! protoc_has_includes; then
  # An explicit PROTOC_INCLUDE that lacks them is an error, not a reason to install packages.
  [ -n "${PROTOC_INCLUDE:-}" ] && no_protoc_includes
  need_pkgs+=(libprotobuf-dev)
fi
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
# The packages did not bring protoc's includes where protoc looks (a protoc of its own, say).
protoc_has_includes || no_protoc_includes

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

if [ "${1:-}" = "--tests" ]; then
  # The same tier on the current release (scripts/kube-current.sh: kube-apiserver and etcd from
  # the Go module proxy, ~15-25 min on 2 cores the first time, then a < 1 s no-op). Go is not a
  # Debian package here (bookworm's is too old): the machine image provides it.
  repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  if ! command -v "${GO:-go}" >/dev/null 2>&1; then
    echo "missing: Go, to build the current kube-apiserver and etcd for the real-apiserver tests" >&2
    echo "  (scripts/kube-current.sh; the version its go.mod files name, or GOTOOLCHAIN=auto)" >&2
    exit 1
  fi
  echo "current kube-apiserver and etcd for the real-apiserver tests: scripts/kube-current.sh (cached after the first build)…" >&2
  bash "$repo_root/scripts/kube-current.sh" >/dev/null
fi
