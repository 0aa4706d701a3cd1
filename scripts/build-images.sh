#!/usr/bin/env bash
# Builds the container images of tollgate, loadgen and tollgate-bench from binaries already built
# on this machine, pulling nothing: `buildah from scratch`, then the binary, exactly the shared
# libraries `ldd` lists for it (and the dynamic loader), the CA bundle, and /etc/passwd and
# /etc/group naming the non-root user 65532 the image runs as. The result is the same shape as
# deploy/images/Containerfile's targets (same binary path, user, entrypoint, labels), which
# need a registry to build from. Needs buildah (Debian's `buildah`) and ldd; run as root, or
# rootless inside `buildah unshare`.
#
# Usage: scripts/build-images.sh [--bin-dir DIR] [--repo PREFIX] [--tag TAG] [IMAGE...]
#   IMAGE      tollgate, loadgen, tollgate-bench (default: tollgate loadgen)
#   --bin-dir  where the binaries are (default: target/release of this checkout;
#              build them first with `cargo build --release --locked -p tollgate -p loadgen -p bench`)
#   --repo     image name prefix (default: tollgate, giving tollgate/tollgate and tollgate/loadgen,
#              the names deploy/kubeadm/tollgate.yaml and loadgen/README.md's Job use); e.g.
#              registry.example.com/tollgate, then `podman push` them there
#   --tag      image tag (default: latest)
# Prints each image's name and tag on stdout, one a line; progress goes to stderr.
set -euo pipefail

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bin_dir=$repo_root/target/release
prefix=tollgate
tag=latest
images=()
while [ $# -gt 0 ]; do
  case "$1" in
    --bin-dir) bin_dir=${2:?--bin-dir needs a directory}; shift 2 ;;
    --repo) prefix=${2:?--repo needs a name prefix}; shift 2 ;;
    --tag) tag=${2:?--tag needs a tag}; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    tollgate|loadgen|tollgate-bench) images+=("$1"); shift ;;
    *) echo "build-images.sh: unknown argument: $1 (see --help)" >&2; exit 2 ;;
  esac
done
[ ${#images[@]} -gt 0 ] || images=(tollgate loadgen)

for tool in buildah ldd; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "build-images.sh: $tool is missing (scripts/deps.sh --tests installs buildah)" >&2
    exit 1
  fi
done
ca_bundle=/etc/ssl/certs/ca-certificates.crt
if [ ! -s "$ca_bundle" ]; then
  echo "build-images.sh: $ca_bundle is missing (Debian's ca-certificates)" >&2
  exit 1
fi

revision=$(git -C "$repo_root" rev-parse HEAD 2>/dev/null || echo unknown)
created=$(date -u +%Y-%m-%dT%H:%M:%SZ)

# What every image holds besides its binary and libraries, made once: the passwd and group
# entries (programs and libc look the user up), a writable /tmp and the user's home. `buildah
# copy` keeps the modes of what it copies but owns it by root (or by --chown): so root's part
# and the user's home are copied apart.
skeleton=$(mktemp -d)
ctr=
cleanup() {
  [ -z "$ctr" ] || buildah rm "$ctr" >/dev/null 2>&1 || true
  rm -rf "$skeleton"
}
trap cleanup EXIT
mkdir -p "$skeleton/root/etc" "$skeleton/root/tmp" "$skeleton/root/home" "$skeleton/home/nonroot"
chmod 0755 "$skeleton/root" "$skeleton/root/etc" "$skeleton/root/home" "$skeleton/home/nonroot"
chmod 1777 "$skeleton/root/tmp"
printf '%s\n' 'root:x:0:0:root:/root:/sbin/nologin' \
  'nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin' >"$skeleton/root/etc/passwd"
printf '%s\n' 'root:x:0:' 'nonroot:x:65532:' >"$skeleton/root/etc/group"
chmod 0644 "$skeleton/root/etc/passwd" "$skeleton/root/etc/group"

# The absolute paths ldd resolves for $1 (libraries and the loader), one a line, or nothing for a
# static binary; fails if a library is not found.
shared_libraries() {
  local out
  if ! out=$(ldd "$1" 2>&1); then
    case "$out" in *"not a dynamic executable"*|*"statically linked"*) return 0 ;; esac
    echo "build-images.sh: ldd $1: $out" >&2
    return 1
  fi
  if grep -q 'not found' <<<"$out"; then
    echo "build-images.sh: $1 needs libraries this machine lacks:" >&2
    grep 'not found' <<<"$out" >&2
    return 1
  fi
  # `libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x…)` and `/lib64/ld-linux-x86-64.so.2 (0x…)`;
  # linux-vdso has no file.
  awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }' <<<"$out"
}

description() {
  case "$1" in
    tollgate) echo "Reverse proxy in front of kube-apiserver that admits, queues or rejects heavy LISTs by their learned byte cost" ;;
    loadgen) echo "Open-loop load generator for the Kubernetes API with honest latency percentiles" ;;
    tollgate-bench) echo "Simulated kube-apiserver, capacity search, reports and demo for tollgate" ;;
  esac
}

for name in "${images[@]}"; do
  bin=$bin_dir/$name
  if [ ! -x "$bin" ]; then
    echo "build-images.sh: $bin is missing: build it first (cargo build --release --locked -p tollgate -p loadgen -p bench)" >&2
    exit 1
  fi
  image=$prefix/$name:$tag
  echo "building $image from $bin…" >&2
  libs=$(shared_libraries "$bin")
  version=$("$bin" --version | awk '{ print $2 }')

  ctr=$(buildah from --quiet scratch)
  buildah copy --quiet "$ctr" "$skeleton/root" / >/dev/null
  buildah copy --quiet --chown 65532:65532 "$ctr" "$skeleton/home" /home >/dev/null
  buildah copy --quiet "$ctr" "$ca_bundle" "$ca_bundle" >/dev/null
  buildah copy --quiet --chmod 0755 "$ctr" "$bin" "/usr/local/bin/$name" >/dev/null
  for lib in $libs; do
    # The file itself under the name the binary asks for (ldd's paths are often symlinks).
    buildah copy --quiet "$ctr" "$(readlink -f "$lib")" "$lib" >/dev/null
  done
  buildah config \
    --entrypoint "[\"/usr/local/bin/$name\"]" \
    --user 65532:65532 \
    --workingdir /home/nonroot \
    --env PATH=/usr/local/bin:/usr/bin:/bin \
    --env SSL_CERT_FILE="$ca_bundle" \
    --stop-signal SIGTERM \
    --created-by "scripts/build-images.sh" \
    --label org.opencontainers.image.title="$name" \
    --label org.opencontainers.image.description="$(description "$name")" \
    --label org.opencontainers.image.version="$version" \
    --label org.opencontainers.image.revision="$revision" \
    --label org.opencontainers.image.created="$created" \
    --label org.opencontainers.image.licenses=Apache-2.0 \
    "$ctr"
  buildah commit --quiet --rm "$ctr" "$image" >/dev/null
  ctr=
  echo "$image"
done
