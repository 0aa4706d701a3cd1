# Sourced by calibrate.sh and list-scaling.sh: starts the modeled simulated apiserver.
# Needs SIM, SIM_MEMORY_LIMIT, SIM_FLAGS, TMP and die() from the caller.

# start_modeled_sim NAME: the sim on a free port, its output in $TMP/NAME.{out,err} and its
# kubeconfig in $TMP/NAME.kubeconfig; sets SIM_PID and SIM_URL (dies if it does not serve in 30 s).
start_modeled_sim() {
    # shellcheck disable=SC2086
    "$SIM" sim --cost-model modeled --memory-limit "$SIM_MEMORY_LIMIT" --listen 127.0.0.1:0 --exit-with-stdin \
        --kubeconfig-out "$TMP/$1.kubeconfig" $SIM_FLAGS >"$TMP/$1.out" 2>"$TMP/$1.err" < <(sleep infinity) &
    SIM_PID=$!
    for _ in $(seq 1 300); do grep -q "serving the Kubernetes API" "$TMP/$1.out" && break; sleep 0.1; done
    SIM_URL=$(sed -n 's/.*serving the Kubernetes API at \(http[^ ]*\).*/\1/p' "$TMP/$1.out")
    [[ -n $SIM_URL ]] || { cat "$TMP/$1.err" >&2; die "the sim did not start"; }
}
