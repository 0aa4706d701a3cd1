#!/usr/bin/env bash
# Installs what building and testing Tollgate needs on a fresh Debian machine,
# only when missing. Sourced by scripts/test.sh and scripts/demo.sh.
#   build: protoc (etcd-client generates its gRPC code at build time)
#   tests: etcd (real storage), kubectl (real client)
set -euo pipefail

need_pkgs=()
command -v protoc >/dev/null 2>&1 || need_pkgs+=(protobuf-compiler)
if [ "${1:-}" = "--tests" ]; then
  command -v etcd >/dev/null 2>&1 || need_pkgs+=(etcd-server)
  # Debian's kubectl is 1.20; a newer kubectl already on the machine is preferred.
  command -v kubectl >/dev/null 2>&1 || need_pkgs+=(kubernetes-client)
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
