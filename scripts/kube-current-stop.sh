#!/usr/bin/env bash
# kube-current-stop.sh RUN_DIR — ../shared/tools/kube-apiserver/stop.sh, unchanged but for this line
# (it is version-agnostic), so the current tier needs nothing outside the checkout.
# Stops exactly the processes kube-current-start.sh recorded in RUN_DIR/pids (kube-apiserver
# first, then etcd): TERM, then KILL after 10 s. A pid is only signalled while /proc/PID/exe is still
# the recorded etcd/kube-apiserver binary (guards against pid reuse). Then deletes the temporary
# RUN_DIR/etcd-data and RUN_DIR/pids; logs, pki, kubeconfig and env stay for inspection.
# Exit status: 0 when nothing recorded is left running.
set -Eeuo pipefail

(($# == 1)) || { echo "usage: $0 RUN_DIR" >&2; exit 64; }
RUN=$1
[[ -d $RUN ]] || { echo "kube-current-stop.sh: no such run dir: $RUN" >&2; exit 1; }

# ours PID EXE: PID is running (not a zombie) the binary EXE, named etcd or kube-apiserver.
ours() {
  local exe
  exe=$(readlink "/proc/$1/exe" 2>/dev/null) || return 1 # gone, or a zombie
  exe=${exe% (deleted)}                                    # binary replaced while running
  [[ $exe == "$2" && ${exe##*/} =~ ^(etcd|kube-apiserver)$ ]]
}

stop_one() { # NAME PID EXE
  local name=$1 pid=$2 exe=$3 i
  if ! ours "$pid" "$exe"; then
    if [[ -e /proc/$pid && $(readlink "/proc/$pid/exe" 2>/dev/null) ]]; then
      echo "$name: pid $pid now runs $(readlink "/proc/$pid/exe"), not the recorded $name: left alone"
    else
      echo "$name: pid $pid already exited"
    fi
    return 0
  fi
  kill -TERM "$pid" 2>/dev/null || true
  for ((i = 0; i < 100; i++)); do ours "$pid" "$exe" || break; sleep 0.1; done
  if ours "$pid" "$exe"; then
    echo "$name: pid $pid ignored TERM for 10 s: KILL"
    kill -KILL "$pid" 2>/dev/null || true
    for ((i = 0; i < 50; i++)); do ours "$pid" "$exe" || break; sleep 0.1; done
  fi
  if ours "$pid" "$exe"; then echo "$name: pid $pid still running" >&2; return 1; fi
  echo "$name: stopped pid $pid"
}

rc=0
if [[ -f $RUN/pids ]]; then
  for name in kube-apiserver etcd; do
    while read -r n pid exe; do
      [[ $n != "$name" ]] || stop_one "$n" "$pid" "$exe" || rc=1
    done <"$RUN/pids"
  done
else
  echo "kube-current-stop.sh: no $RUN/pids (nothing started, or already stopped)"
fi
if ((rc == 0)); then rm -rf -- "$RUN/etcd-data" "$RUN/pids"; fi
exit "$rc"
