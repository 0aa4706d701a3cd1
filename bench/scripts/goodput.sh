#!/usr/bin/env bash
# The goodput benchmark (issue 16): how many LISTs a control plane serves while the lanes tollgate
# protects (node-status heartbeats) stay within their latency target, against the best a fixed
# budget can do — on the real kube-apiserver 1.20 and on the modeled simulator at 2 and 4 virtual
# CPUs. Every run starts a fresh control plane (and a fresh tollgate), so cold starts count.
#
# Per control plane:
#   baseline        heartbeats only, through tollgate (default settings, --mode enforce): B = PATCH
#                   p99; the target is p99 <= max(2 x B, 50 ms), tollgate's default adaptive target;
#   direct          the storm without tollgate;
#   static-default  the storm through tollgate, `quota.mode: static` with every other default;
#   adaptive        the storm through tollgate with nothing set but --mode enforce (the default budget);
#   dryrun          the storm through tollgate in its default mode (dryRun: nothing is refused or
#                   queued): what relaying alone costs the heartbeats (not in the default VIAS);
#   static-R        the storm through tollgate with a static pool of R bytes/s (burst: one LIST,
#                   etcdReadWeight 0 so R is in bytes sent), R found by a bisection on log(R) between
#                   2 LISTs/min and the offered rate. The best static pool is the passing run, of
#                   these and static-default, with the most LISTs served.
# Goodput = LISTs answered 200 per minute of the run. A run passes when PATCH p99 is within the
# target, no heartbeat failed and the apiserver did not crash.
#
# The storms:
#   real   10,000 pods of ~3.3 KB (one LIST of all pods ~33 MB), 20 node-status PATCH/s from the
#          admin client certificate, 240 consistent LIST-all-pods per minute from the unprivileged
#          test-user certificate; kube-apiserver 1.20.2 + etcd from ../shared/tools/kube-apiserver,
#          reseeded per run from a copy of one seeded etcd data dir;
#   sim2   the demo's shape: 1,000 nodes, 100 PATCH/s, 30,000 pods of ~2 KB, 180 consistent
#          LISTs/min, the modeled apiserver with --virtual-cpus 2 (8 GiB memory limit);
#   sim4   the same with --virtual-cpus 4.
#   Both report object counts as 1.20 does: 0 for the first minute (--etcd-count-metric-poll-period 1m).
#
# Writes the section "tollgate goodput (issue 16)" of bench/RESULTS.md and prints it. A benchmark,
# not a CI test: ~40 minutes with the defaults; run it on a quiet machine. Loopback only; everything
# it starts is stopped by pid on exit.
#
# Environment:
#   PLANES="real sim2 sim4"   control planes to measure
#   RUN_SECONDS=60            length of each run
#   SEARCH_STEPS=4            bisection steps of the best-static search (plus its low end)
#   REAL_PODS=10000 REAL_POD_BYTES=900 REAL_NODES=200 REAL_PATCH=20/s REAL_STORM=240
#   SIM_PODS=30000 SIM_POD_BYTES=2048 SIM_NODES=1000 SIM_PATCH=100/s SIM_STORM=180
#   SKIP_BUILD=1 BIN_DIR=target/release RESULTS=path ("-" prints only) KEEP_TMP=1
#   TRACES=dir                keep each tollgate run's budget trace (budget.trace, one /debug/budget
#                             a second), its last /debug/budget, its /metrics and the heartbeats'
#                             timeseries.csv (.hb.csv) there, as
#                             PREFIXPLANE-NAME.* (TRACE_PREFIX: matrix.sh names apiserver, cell and run)
#   VIAS="direct static-default adaptive search"   the runs after the baseline (a subset for a
#                             quick look; the targets' check needs all of them)
#   KUBE=1.20                 the real apiserver: 1.20 (../shared/tools/kube-apiserver's 1.20.2,
#                             or KUBE_APISERVER_TOOLS) or current (scripts/kube-current.sh's build,
#                             started by scripts/kube-current-start.sh)
#   KUBE_APISERVER_TOOLS      the 1.20 kube-apiserver scripts (default ../shared/tools/kube-apiserver)
#   SEED_CACHE=dir            keep the seeded etcd data dir there, keyed by version, pods, pod bytes
#                             and nodes, and reuse it on the next call (bench/scripts/matrix.sh)
#   BASELINE=tollgate         the baseline's heartbeats through tollgate (tollgate) or sent directly
#                             (direct: tollgate's own cost does not move the target)
#   TARGET_MS=ms              the target given: no baseline run (matrix.sh, after a cell's first call)
#   LIST_SHAPE=single         the storm's LISTs (bench/scripts/matrix.sh's cells):
#                             single  one client, consistent LISTs of all pods at the storm rate;
#                             mix     four kinds at a quarter of the rate each: namespace-scoped,
#                                     label selector, resourceVersion=0 (the watch cache) across all
#                                     namespaces, and paginated limit=500 with continue (one identity,
#                                     test-user: the tools have one unprivileged user);
#                             step    calm (a quarter of the rate) for a third of the run, the rate
#                                     for a third, twice the rate for the last third;
#                             what reaches etcd on a current apiserver (issue 33), one client at
#                             the rate, LISTs of all pods:
#                             exact   resourceVersionMatch=Exact at the last revision seen;
#                             paged   limit=500, following continue to the end (one LIST = all pages);
#                             selector  consistent, label selector (every seeded pod matches);
#                             a relist storm: RATE informers of all pods start at once a third into
#                             the run (the rest of it: watches; each informer's LIST is counted):
#                             informers  LIST (resourceVersion=0) then WATCH, as client-go's reflector;
#                             watchlist  a streaming list (sendInitialEvents=true, WatchListClient)
#                             restart  RATE informers (LIST then WATCH) sync for a third of the run,
#                                     then the apiserver is killed and started again and they relist; the heartbeats
#                                     run from when it answers again, for RUN_SECONDS (real only)
set -euo pipefail

BENCH=goodput
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source=lib.sh
source "$ROOT/bench/scripts/lib.sh"

# The command as run: every setting given in the environment, before the defaults fill in.
COMMAND="bench/scripts/goodput.sh"
for v in KUBE BASELINE TARGET_MS LIST_SHAPE PLANES VIAS RUN_SECONDS SEARCH_STEPS REAL_PODS REAL_POD_BYTES REAL_NODES REAL_PATCH REAL_STORM \
    SIM_PODS SIM_POD_BYTES SIM_NODES SIM_PATCH SIM_STORM; do
    [[ -n "${!v+x}" ]] && COMMAND="$v=\"${!v}\" $COMMAND"
done

PLANES=${PLANES:-real sim2 sim4}
VIAS=${VIAS:-direct static-default adaptive search}
RUN_SECONDS=${RUN_SECONDS:-60}
SEARCH_STEPS=${SEARCH_STEPS:-4}
REAL_PODS=${REAL_PODS:-10000}
REAL_POD_BYTES=${REAL_POD_BYTES:-900}
REAL_NODES=${REAL_NODES:-200}
REAL_PATCH=${REAL_PATCH:-20/s}
REAL_STORM=${REAL_STORM:-240}
SIM_PODS=${SIM_PODS:-30000}
SIM_POD_BYTES=${SIM_POD_BYTES:-2048}
SIM_NODES=${SIM_NODES:-1000}
SIM_PATCH=${SIM_PATCH:-100/s}
SIM_STORM=${SIM_STORM:-180}
LIST_SHAPE=${LIST_SHAPE:-single}
RESULTS=${RESULTS:-$ROOT/bench/RESULTS.md}
KUBE=${KUBE:-1.20}
BASELINE=${BASELINE:-tollgate}
TARGET_MS=${TARGET_MS:-}
kube_tools
[[ $BASELINE == tollgate || $BASELINE == direct ]] || die "BASELINE=$BASELINE: tollgate or direct"
[[ -z $TARGET_MS || $TARGET_MS =~ ^[0-9]+(\.[0-9]+)?$ ]] || die "TARGET_MS=$TARGET_MS: a number of milliseconds"

[[ " $PLANES " == *" sim"* ]] || NEED_SIM=0
release_binaries

bench_init
[[ -n "${KEEP_TMP:-}" ]] && log "outputs kept in $TMP"
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
CLK_TCK=$(getconf CLK_TCK)

# Whether this tollgate knows `quota.mode` (the adaptive budget); without it "static-default" is
# plain --mode enforce and there is no adaptive run.
printf 'mode: enforce\nupstream:\n  urls: ["http://127.0.0.1:1"]\nquota:\n  mode: static\n' >"$TMP/probe.yaml"
if "$TOLLGATE_BIN" check-config --config "$TMP/probe.yaml" >/dev/null 2>&1; then
    HAS_ADAPTIVE=1
else
    HAS_ADAPTIVE=0
    log "this tollgate has no quota.mode: the adaptive run is skipped"
fi

# === control planes ===
# start_plane PLANE DIR: a fresh control plane; sets URL, UP_PID (the apiserver's pid, for CPU and
# memory), METRICS_URL (the sim's /metrics; empty for the real apiserver) and, for the real one,
# the certificate paths in $DIR/env.
REAL_SEED=""
REAL_PEER_PORT=""
# The run dir of the real apiserver running now, stopped on exit if a run ends early.
LIVE_KUBE=""
bench_cleanup_hook() { [[ -z $LIVE_KUBE ]] || "$KUBE_STOP" "$LIVE_KUBE" >/dev/null 2>&1; }
start_plane() {
    local plane=$1 d=$2
    case $plane in
    real)
        rm -rf "$d/etcd"
        cp -a "$REAL_SEED" "$d/etcd"
        URL=$(KUBE_ETCD_DATA_DIR="$d/etcd" KUBE_ETCD_PEER_PORT=$REAL_PEER_PORT \
            "$KUBE_START" "$d/kube" 2>"$d/kube-start.log") || { cat "$d/kube-start.log" >&2; die "kube-apiserver did not start"; }
        # The certificates of this run (KUBE_CA_CERT, KUBE_ADMIN_CERT, ...).
        # shellcheck disable=SC1091
        . "$d/kube/env"
        UP_PID=$KUBE_APISERVER_PID
        LIVE_KUBE=$d/kube
        log "real: kube-apiserver $(curl -s -m 5 --cacert "$KUBE_CA_CERT" --cert "$KUBE_ADMIN_CERT" \
            --key "$KUBE_ADMIN_KEY" "$URL/version" | grep -o '"gitVersion": *"[^"]*"' | cut -d'"' -f4)"
        # A fresh apiserver on a copied etcd answers its first seconds of writes slowly (p99 up to
        # ~0.8 s with nothing else running); every run, direct or not, starts after the same 5 s of
        # heartbeats sent directly, so the baseline and the runs see an apiserver past its start.
        "$LOADGEN_BIN" --server "$URL" --duration 5s --no-progress --certificate-authority "$KUBE_CA_CERT" \
            --client-certificate "$KUBE_ADMIN_CERT" --client-key "$KUBE_ADMIN_KEY" --patches "$REAL_PATCH" \
            --patch-target node-status --objects "$REAL_NODES" --timeout 30s --output "$d/warmup" \
            >"$d/warmup.out" 2>&1 || log "real: the warm-up heartbeats failed; see $d/warmup.out"
        METRICS_URL=""
        ;;
    sim*)
        local cpus=${plane#sim}
        "$SIM_BIN" sim --listen 127.0.0.1:0 --nodes "$SIM_NODES" --pods "$SIM_PODS" \
            --pod-bytes "$SIM_POD_BYTES" --cost-model modeled --virtual-cpus "$cpus" \
            --memory-limit 8Gi --etcd-count-metric-poll-period 1m >"$d/sim.out" 2>"$d/sim.log" &
        UP_PID=$!
        PIDS+=("$UP_PID")
        URL=$(wait_line "$d/sim.out" "serving the Kubernetes API at " "$UP_PID" "the sim")
        METRICS_URL=$URL/metrics
        "$LOADGEN_BIN" seed --server "$URL" --nodes "$SIM_NODES" --pods 0 >"$d/seed.log" 2>&1 \
            || die "loadgen seed failed; see $d/seed.log"
        ;;
    esac
}
stop_plane() {
    local plane=$1 d=$2
    case $plane in
    real) "$KUBE_STOP" "$d/kube" >/dev/null 2>&1 || true; LIVE_KUBE=""; rm -rf "$d/etcd" ;;
    sim*) kill "$UP_PID" 2>/dev/null || true; wait "$UP_PID" 2>/dev/null || true ;;
    esac
}
# seed_real: one seeded etcd data dir, copied for every real run (from SEED_CACHE when it has one).
seed_real() {
    local d=$TMP/real-seed
    mkdir -p "$d"
    REAL_SEED=$d/etcd
    REAL_PEER_PORT=$(free_port)
    local cached=""
    if [[ -n ${SEED_CACHE:-} ]]; then
        cached=$SEED_CACHE/$KUBE-$REAL_PODS-$REAL_POD_BYTES-$REAL_NODES
        if [[ -s $cached/list-bytes && -d $cached/etcd ]]; then
            REAL_SEED=$cached/etcd
            REAL_LIST_BYTES=$(cat "$cached/list-bytes")
            log "real: the seeded etcd of $cached ($REAL_LIST_BYTES bytes per LIST of all pods)"
            return
        fi
    fi
    log "real: seeding $REAL_PODS pods of +$REAL_POD_BYTES bytes and $REAL_NODES nodes ($(date -u +%H:%M:%S))"
    KUBE_ETCD_DATA_DIR="$REAL_SEED" KUBE_ETCD_PEER_PORT=$REAL_PEER_PORT \
        "$KUBE_START" "$d/kube" >"$d/url" 2>"$d/kube-start.log" || { cat "$d/kube-start.log" >&2; die "kube-apiserver did not start"; }
    # shellcheck disable=SC1091
    (. "$d/kube/env" && "$LOADGEN_BIN" seed --kubeconfig "$KUBECONFIG" --nodes "$REAL_NODES" \
        --pods "$REAL_PODS" --pod-bytes "$REAL_POD_BYTES" --concurrency 32) >"$d/seed.log" 2>&1 \
        || { "$KUBE_STOP" "$d/kube" >/dev/null 2>&1; die "loadgen seed failed; see $d/seed.log"; }
    # The size of one LIST of all pods, as the storm's clients receive it.
    # shellcheck disable=SC1091
    REAL_LIST_BYTES=$(. "$d/kube/env" && curl -s --cacert "$KUBE_CA_CERT" --cert "$KUBE_ADMIN_CERT" \
        --key "$KUBE_ADMIN_KEY" "$KUBE_APISERVER_URL/api/v1/pods" | wc -c)
    "$KUBE_STOP" "$d/kube" >/dev/null 2>&1 || true
    log "real: one LIST of all pods is $REAL_LIST_BYTES bytes"
    if [[ -n $cached ]]; then
        rm -rf "$cached"
        mkdir -p "$cached"
        cp -a "$REAL_SEED" "$cached/etcd"
        echo "$REAL_LIST_BYTES" >"$cached/list-bytes"
    fi
}

# measure_sim_list: the size of one LIST of all pods on the sim, from a throwaway sim.
measure_sim_list() {
    local d=$TMP/sim-measure
    mkdir -p "$d"
    start_plane sim2 "$d"
    SIM_LIST_BYTES=$(curl -s "$URL/api/v1/pods" | wc -c)
    stop_plane sim2 "$d"
    log "sim: one LIST of all pods is $SIM_LIST_BYTES bytes"
}

# === one run ===
# run PLANE NAME VIA [RATE]: VIA = direct | baseline | dryrun | static-default | adaptive | static.
# Leaves $TMP/PLANE-NAME with loadgen outputs (hb/, lists/), tollgate's metrics and the apiserver's
# CPU ticks and memory samples; appends a line to $TMP/runs.
run() {
    local plane=$1 name=$2 via=$3 rate=${4:-}
    local d=$TMP/$plane-$name
    mkdir -p "$d"
    log "$plane $name ($(date -u +%H:%M:%S))"
    start_plane "$plane" "$d"
    local target=$URL tg_pid="" admin=""
    local storm lists_rate patch objects list_bytes
    if [[ $plane == real ]]; then
        storm=$REAL_STORM patch=$REAL_PATCH objects=$REAL_NODES list_bytes=$REAL_LIST_BYTES
    else
        storm=$SIM_STORM patch=$SIM_PATCH objects=$SIM_NODES list_bytes=$SIM_LIST_BYTES
    fi
    lists_rate=$storm
    [[ $via == baseline ]] && lists_rate=0
    if [[ $via != direct && ! ($via == baseline && $BASELINE == direct) ]]; then
        {
            if [[ $via == dryrun ]]; then echo "mode: dryRun"; else echo "mode: enforce"; fi
            case $via in
            static-default) [[ $HAS_ADAPTIVE == 1 ]] && printf 'quota:\n  mode: static\n' ;;
            static)
                printf 'quota:\n'
                [[ $HAS_ADAPTIVE == 1 ]] && printf '  mode: static\n'
                printf '  bytesPerSecond: %s\n  burstBytes: %s\n  etcdReadWeight: 0\n' "$rate" "$list_bytes"
                ;;
            esac
        } >"$d/tollgate.yaml"
        local tls=()
        if [[ $plane == real ]]; then
            real_tls_args
            tls=("${REAL_TLS_ARGS[@]}")
        fi
        "$TOLLGATE_BIN" --config "$d/tollgate.yaml" --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0 \
            --upstream "$URL" "${tls[@]}" >"$d/tollgate.out" 2>"$d/tollgate.log" &
        tg_pid=$!
        PIDS+=("$tg_pid")
        wait_tollgate "$d/tollgate.out" "$tg_pid"
        target=$TG_TARGET admin=$TG_ADMIN
    fi
    # The apiserver's CPU before, and its memory every half second while the load runs.
    awk '{print $14 + $15}' "/proc/$UP_PID/stat" >"$d/ticks.before"
    sample_memory "$d"
    # The budget's state every second (budget.trace: seconds since the start, then /debug/budget),
    # to see how the controller moved during the run.
    local tracer=""
    if [[ -n $admin ]]; then
        (
            start=$(date +%s.%N)
            while kill -0 "$tg_pid" 2>/dev/null; do
                printf '%s ' "$(awk -v s="$start" -v n="$(date +%s.%N)" 'BEGIN {printf "%.1f", n - s}')"
                curl -s -m 1 "$admin/debug/budget" | tr -d '\n'
                echo
                sleep 1
            done
        ) >"$d/budget.trace" 2>/dev/null &
        tracer=$!
        PIDS+=("$tracer")
    fi
    [[ -n $METRICS_URL ]] && curl -s -m 5 "$METRICS_URL" >"$d/plane.before" || true
    local common=(--server "$target" --duration "${RUN_SECONDS}s" --no-progress)
    local hb_auth=() list_auth=()
    if [[ $plane == real ]]; then
        hb_auth=(--certificate-authority "$KUBE_CA_CERT" --client-certificate "$KUBE_ADMIN_CERT" --client-key "$KUBE_ADMIN_KEY")
        list_auth=(--certificate-authority "$KUBE_CA_CERT" --client-certificate "$KUBE_USER_CERT" --client-key "$KUBE_USER_KEY")
    fi
    local hb_run=("$LOADGEN_BIN" "${common[@]}" "${hb_auth[@]}" --patches "$patch" --patch-target node-status
        --objects "$objects" --timeout 30s --drain-timeout 15s --output "$d/hb")
    local hb=""
    if [[ $LIST_SHAPE != restart || $lists_rate == 0 ]]; then
        "${hb_run[@]}" >"$d/hb.out" 2>"$d/hb.log" &
        hb=$!
        PIDS+=("$hb")
    fi
    if [[ $lists_rate != 0 ]]; then
        local lg=("$LOADGEN_BIN" "${common[@]}" "${list_auth[@]}" --timeout 60s --drain-timeout 30s)
        case $LIST_SHAPE in
        single)
            "${lg[@]}" --lists "$lists_rate/min" -A --list-rv consistent --output "$d/lists" \
                >"$d/lists.out" 2>"$d/lists.log" || log "$plane $name: the LIST loadgen failed; see $d/lists.log"
            ;;
        mix)
            local q k=0 lpids=()
            q=$(awk -v r="$lists_rate" 'BEGIN {printf "%.2f", r / 4}')
            for kind in "-n default --list-rv consistent" "-A -l app.kubernetes.io/managed-by=loadgen --list-rv consistent" \
                "-A --list-rv cache" "-A --list-rv consistent --list-limit 500"; do
                k=$((k + 1))
                # shellcheck disable=SC2086
                "${lg[@]}" --lists "$q/min" $kind --output "$d/lists-$k" >"$d/lists-$k.out" 2>"$d/lists-$k.log" &
                lpids+=($!)
                PIDS+=($!)
            done
            for p in "${lpids[@]}"; do wait "$p" || log "$plane $name: a LIST loadgen failed; see $d/lists-*.log"; done
            ;;
        step)
            local third=$((RUN_SECONDS / 3)) k=0
            for r in "$(awk -v r="$lists_rate" 'BEGIN {printf "%.2f", r / 4}')" "$lists_rate" "$((lists_rate * 2))"; do
                k=$((k + 1))
                "$LOADGEN_BIN" --server "$target" --duration "${third}s" --no-progress "${list_auth[@]}" \
                    --timeout 60s --drain-timeout 5s --lists "$r/min" -A --list-rv consistent --output "$d/lists-$k" \
                    >"$d/lists-$k.out" 2>"$d/lists-$k.log" || log "$plane $name: a LIST loadgen failed; see $d/lists-$k.log"
            done
            ;;
        exact | paged | selector)
            local kind
            case $LIST_SHAPE in
            exact) kind=(-A --list-rv exact) ;;
            paged) kind=(-A --list-rv consistent --list-limit 500) ;;
            selector) kind=(-A -l app.kubernetes.io/managed-by=loadgen --list-rv consistent) ;;
            esac
            "${lg[@]}" --lists "$lists_rate/min" "${kind[@]}" --output "$d/lists" \
                >"$d/lists.out" 2>"$d/lists.log" || log "$plane $name: the LIST loadgen failed; see $d/lists.log"
            ;;
        informers | watchlist)
            # The storm's schedule, not a wait for a condition: they start a third into the run.
            local third=$((RUN_SECONDS / 3)) wl=()
            [[ $LIST_SHAPE == watchlist ]] && wl=(--watch-list)
            sleep "$third"
            "$LOADGEN_BIN" --server "$target" --duration "$((RUN_SECONDS - third))s" --no-progress "${list_auth[@]}" \
                --timeout 60s --drain-timeout 5s --watches "$lists_rate" --watch-all-namespaces \
                "${wl[@]}" --output "$d/lists" \
                >"$d/lists.out" 2>"$d/lists.log" || log "$plane $name: the informers' loadgen failed; see $d/lists.log"
            ;;
        restart)
            [[ $plane == real ]] || die "LIST_SHAPE=restart needs the real apiserver"
            # The informers sync for a third of the run; the apiserver restarts; the heartbeats run
            # from when it answers again through the target, alongside the informers' relists.
            local third=$((RUN_SECONDS / 3)) inf
            "$LOADGEN_BIN" --server "$target" --duration "$((3 * RUN_SECONDS))s" --no-progress "${list_auth[@]}" \
                --timeout 60s --drain-timeout 5s --watches "$lists_rate" --watch-all-namespaces --output "$d/lists" \
                >"$d/lists.out" 2>"$d/lists.log" &
            inf=$!
            PIDS+=("$inf")
            # The storm's schedule, not a wait for a condition, as for the informers above.
            sleep "$third"
            restart_apiserver "$d"
            if ! wait_ready "$target" "$UP_PID" "$KUBE_CA_CERT" "$KUBE_ADMIN_CERT" "$KUBE_ADMIN_KEY"; then
                log "$plane $name: $target not ready after the restart; the apiserver's last lines:"
                tail -n 20 "$d/kube/logs/kube-apiserver.log" >&2
            fi
            "${hb_run[@]}" >"$d/hb.out" 2>"$d/hb.log" &
            hb=$!
            PIDS+=("$hb")
            wait "$hb" || log "$plane $name: the heartbeat loadgen failed; see $d/hb.log"
            hb=""
            # Stopped by a signal, loadgen writes what it measured (and exits 130).
            kill -INT "$inf" 2>/dev/null || true
            wait "$inf" || true
            ;;
        *) die "unknown LIST_SHAPE $LIST_SHAPE (single, mix, step, exact, paged, selector, informers, watchlist, restart)" ;;
        esac
    fi
    [[ -z $hb ]] || wait "$hb" || log "$plane $name: the heartbeat loadgen failed; see $d/hb.log"
    awk '{print $14 + $15}' "/proc/$UP_PID/stat" >"$d/ticks.after" 2>/dev/null || echo "" >"$d/ticks.after"
    kill -0 "$UP_PID" 2>/dev/null && echo 0 >"$d/crashed" || echo 1 >"$d/crashed"
    [[ -n $METRICS_URL ]] && curl -s -m 5 "$METRICS_URL" >"$d/plane.after" || true
    [[ -n $admin ]] && { curl -s -m 5 "$admin/metrics" >"$d/tollgate.metrics" || true; }
    [[ -n $admin ]] && { curl -s -m 5 "$admin/debug/budget" >"$d/budget.json" 2>/dev/null || true; }
    kill "$SAMPLER" ${tracer:+"$tracer"} 2>/dev/null || true
    wait "$SAMPLER" ${tracer:+"$tracer"} 2>/dev/null || true
    if [[ -n ${TRACES:-} && -n $admin ]]; then
        mkdir -p "$TRACES"
        local f
        for f in budget.trace budget.json tollgate.metrics; do
            [[ -f $d/$f ]] && cp "$d/$f" "$TRACES/${TRACE_PREFIX:-}$plane-$name.$f"
        done
        # The heartbeats' own view each second, beside the budget's signal in budget.trace.
        [[ -f $d/hb/timeseries.csv ]] && cp "$d/hb/timeseries.csv" "$TRACES/${TRACE_PREFIX:-}$plane-$name.hb.csv"
    fi
    if [[ -n $tg_pid ]]; then kill "$tg_pid" 2>/dev/null || true; wait "$tg_pid" 2>/dev/null || true; fi
    stop_plane "$plane" "$d"
    echo "$plane $name $via ${rate:-0} $lists_rate" >>"$TMP/runs"
}

# sample_memory DIR: the apiserver's (UP_PID's) memory every half second, appended to DIR/memory,
# while it runs; SAMPLER is the sampler's pid.
sample_memory() {
    local d=$1
    (
        while kill -0 "$UP_PID" 2>/dev/null; do
            if [[ -n $METRICS_URL ]]; then
                curl -s -m 2 "$METRICS_URL" | awk '/^process_resident_memory_bytes / {print $2}'
            else
                awk '/^VmRSS/ {print $2 * 1024}' "/proc/$UP_PID/status"
            fi
            sleep 0.5
        done
    ) >>"$d/memory" 2>/dev/null &
    SAMPLER=$!
    PIDS+=("$SAMPLER")
}

# restart_apiserver DIR: the real apiserver of DIR killed (KILL, as the kernel's OOM killer or a
# crash does; with 50 watches open a 1.37 apiserver took over 30 s to stop on TERM) and started
# again with the same command line. UP_PID, DIR/kube/pids (what stop.sh stops) and
# the memory sampler follow the new process; the old one's CPU is kept in DIR/ticks.before, so the
# run's cores count both.
restart_apiserver() {
    local d=$1 old=$UP_PID bin argv=() spent
    bin=$(readlink "/proc/$old/exe") || die "the apiserver (pid $old) is gone before its restart"
    mapfile -d '' argv <"/proc/$old/cmdline"
    spent=$(awk -v b="$(cat "$d/ticks.before")" '{print $14 + $15 - b}' "/proc/$old/stat")
    log "restarting the apiserver (pid $old) at $(date -u +%H:%M:%S)"
    kill -KILL "$old"
    # Its port free again: a Go process's leader thread is a zombie while its other threads still
    # exit, and the listening socket closes with the last of them (a start at the zombie failed
    # with "bind: address already in use" in 3 of 5 runs).
    local deadline=$((SECONDS + 10)) port
    port=$(printf '%s\n' "${argv[@]}" | sed -n 's/^--secure-port=//p')
    [[ -n $port ]] || die "the apiserver (pid $old) has no --secure-port in its command line"
    while [[ -e /proc/$old && $(awk '{print $3}' "/proc/$old/stat" 2>/dev/null) != Z ]] || port_listening "$port"; do
        ((SECONDS < deadline)) || die "the apiserver (pid $old) still holds port $port 10 s after KILL"
        sleep 0.1
    done
    setsid "$bin" "${argv[@]:1}" >>"$d/kube/logs/kube-apiserver.log" 2>&1 </dev/null &
    UP_PID=$!
    sed -i "s/^kube-apiserver $old /kube-apiserver $UP_PID /" "$d/kube/pids"
    echo "$((0 - spent))" >"$d/ticks.before"
    sample_memory "$d"
}

# port_listening PORT: a socket listens on PORT (any address, IPv4 or IPv6).
port_listening() {
    local hex
    hex=$(printf ':%04X' "$1")
    awk -v p="$hex" '$4 == "0A" && substr($2, length($2) - 4) == p { found = 1 } END { exit !found }' \
        /proc/net/tcp /proc/net/tcp6 2>/dev/null
}

# wait_ready URL PID CA CERT KEY: poll URL/readyz with the admin's certificate until it answers ok;
# fails when the apiserver PID exits or after 60 s.
wait_ready() {
    local deadline=$((SECONDS + 60))
    until [[ $(curl -s -m 2 --cacert "$3" --cert "$4" --key "$5" "$1/readyz") == ok ]]; do
        kill -0 "$2" 2>/dev/null && ((SECONDS < deadline)) || return 1
        sleep 0.2
    done
}

# figures PLANE-NAME: shell assignments P99 PASS_ERRORS LIST_OK CRASHED from a finished run.
figures() {
    python3 - "$TMP/$1" <<'PY'
import json, os, sys
d = sys.argv[1]
def op(sub, name):
    try:
        s = json.load(open(os.path.join(d, sub, "summary.json")))
    except OSError:
        return {}
    return {o["name"]: o for o in s["operations"]}.get(name, {})
p = op("hb", "patch")
def lists():
    # Every LIST loadgen of the run (lists/, or lists-1/... for the mix and the step).
    agg = {"requests": 0, "status_codes": {}}
    for sub in sorted(os.listdir(d)):
        if sub == "lists" or sub.startswith("lists-") and os.path.isdir(os.path.join(d, sub)):
            # An informer's LIST (or streaming list) is its "watch-list" operation.
            o = op(sub, "list") or op(sub, "watch-list")
            agg["requests"] += o.get("requests", 0)
            for c, n in o.get("status_codes", {}).items():
                agg["status_codes"][c] = agg["status_codes"].get(c, 0) + n
    return agg
l = lists()
# Failed heartbeats: every request not answered 2xx (transport errors have no status code).
bad = p.get("requests", 0) - sum(n for c, n in p.get("status_codes", {}).items() if c.startswith("2"))
print(f'P99={p.get("latency_ms", {}).get("p99", 1e9):.1f} HB_ERR={bad} '
      f'LIST_OK={l.get("status_codes", {}).get("200", 0)} '
      f'CRASHED={open(os.path.join(d, "crashed")).read().strip() or 1}')
PY
}

# passes TARGET_MS: 1 when the last figures meet the target.
passes() { awk -v p="$P99" -v t="$1" -v e="$HB_ERR" -v c="$CRASHED" 'BEGIN {print (p <= t && e == 0 && c == 0) ? 1 : 0}'; }

for plane in $PLANES; do
    case $plane in
    real) [[ -x $KUBE_START ]] || die "no kube-apiserver starter at $KUBE_START"
          "$KUBE_INSTALL" >&2
          seed_real ;;
    sim2|sim4) [[ -n ${SIM_LIST_BYTES:-} ]] || measure_sim_list ;;
    *) die "unknown control plane $plane (real, sim2, sim4)" ;;
    esac
    if [[ -n $TARGET_MS ]]; then
        TARGET=$TARGET_MS
        log "$plane: target $TARGET ms (given)"
    else
        run "$plane" baseline baseline
        eval "$(figures "$plane-baseline")"
        [[ $HB_ERR == 0 && $P99 != 1000000000.0 ]] || die "$plane: the baseline run's heartbeats failed; see $TMP/$plane-baseline"
        TARGET=$(awk -v b="$P99" 'BEGIN {t = 2 * b; print (t < 50 ? 50 : t)}')
        log "$plane: baseline PATCH p99 $P99 ms ($BASELINE), target $TARGET ms"
    fi
    echo "$plane $TARGET" >>"$TMP/targets"
    wants() { [[ " $VIAS " == *" $1 "* ]]; }
    wants direct && run "$plane" direct direct
    wants dryrun && run "$plane" dryrun dryrun
    wants static-default && run "$plane" static-default static-default
    [[ $HAS_ADAPTIVE == 1 ]] && wants adaptive && run "$plane" adaptive adaptive
    wants search || continue
    # The best static pool: bisection on log(rate) between 2 LISTs/min and the offered rate.
    if [[ $plane == real ]]; then lb=$REAL_LIST_BYTES storm=$REAL_STORM; else lb=$SIM_LIST_BYTES storm=$SIM_STORM; fi
    lo=$((lb * 2 / 60))
    hi=$((lb * storm / 60))
    run "$plane" "static-$lo" static "$lo"
    eval "$(figures "$plane-static-$lo")"
    log "$plane static $lo B/s: p99 $P99 ms, $LIST_OK LISTs, pass $(passes "$TARGET")"
    if [[ $(passes "$TARGET") == 1 ]]; then
        for _ in $(seq "$SEARCH_STEPS"); do
            mid=$(awk -v a="$lo" -v b="$hi" 'BEGIN {printf "%d", sqrt(a * b)}')
            run "$plane" "static-$mid" static "$mid"
            eval "$(figures "$plane-static-$mid")"
            log "$plane static $mid B/s: p99 $P99 ms, $LIST_OK LISTs, pass $(passes "$TARGET")"
            if [[ $(passes "$TARGET") == 1 ]]; then lo=$mid; else hi=$mid; fi
        done
    fi
done
LOAD_AFTER=$(cut -d' ' -f1-3 /proc/loadavg)

python3 - "$TMP" "$RUN_SECONDS" "$CLK_TCK" "$COMMAND" "$LOAD_BEFORE" "$LOAD_AFTER" "$RESULTS" \
    "$ROOT/bench/scripts/lib.sh" "${REAL_LIST_BYTES:-0}" "$BASELINE" <<'PY'
import json, os, subprocess, sys, time
tmp, secs, clk, command, load0, load1, results, lib, real_list, baseline_via = sys.argv[1:]
secs, clk = float(secs), float(clk)
targets = dict(l.split() for l in open(os.path.join(tmp, "targets")))

def op(d, sub, name):
    try:
        s = json.load(open(os.path.join(d, sub, "summary.json")))
    except OSError:
        return {}
    return {o["name"]: o for o in s["operations"]}.get(name, {})

def metric(path, name, want=()):
    try:
        text = open(path).read()
    except OSError:
        return None
    total, seen = 0.0, False
    for line in text.splitlines():
        if line.startswith("#") or " " not in line:
            continue
        series, value = line.rsplit(" ", 1)
        n, _, labels = series.partition("{")
        if n == name and all(f'{k}="{v}"' in labels for k, v in want):
            total, seen = total + float(value), True
    return total if seen else None

rows = {}
for line in open(os.path.join(tmp, "runs")):
    plane, name, via, rate, lists = line.split()
    d = os.path.join(tmp, f"{plane}-{name}")
    p = op(d, "hb", "patch")
    l = {"requests": 0, "status_codes": {}}
    for sub in sorted(os.listdir(d)):
        if sub == "lists" or sub.startswith("lists-") and os.path.isdir(os.path.join(d, sub)):
            o = op(d, sub, "list") or op(d, sub, "watch-list")
            l["requests"] += o.get("requests", 0)
            for c, n in o.get("status_codes", {}).items():
                l["status_codes"][c] = l["status_codes"].get(c, 0) + n
    lat = p.get("latency_ms", {})
    try:
        t0, t1 = (float(open(os.path.join(d, f)).read().strip()) for f in ("ticks.before", "ticks.after"))
        cores = (t1 - t0) / clk / secs
    except (OSError, ValueError):
        cores = None
    if os.path.exists(os.path.join(d, "plane.after")):
        a = metric(os.path.join(d, "plane.after"), "process_cpu_seconds_total")
        b = metric(os.path.join(d, "plane.before"), "process_cpu_seconds_total")
        if a is not None and b is not None:
            cores = (a - b) / secs  # the modeled apiserver's virtual CPU
    mem = [float(x) for x in open(os.path.join(d, "memory")).read().split() if x.replace(".", "", 1).isdigit()]
    codes = l.get("status_codes", {})
    rows.setdefault(plane, []).append(dict(
        name=name, via=via, rate=int(rate), p50=lat.get("p50"), p99=lat.get("p99"),
        hb_err=p.get("requests", 0) - sum(n for c, n in p.get("status_codes", {}).items() if c.startswith("2")),
        hb_req=p.get("requests", 0),
        served=codes.get("200", 0), sent=l.get("requests", 0), r429=codes.get("429", 0),
        # LISTs that failed otherwise than by a 429 (timeouts, 5xx, cut short).
        list_err=l.get("requests", 0) - codes.get("200", 0) - codes.get("429", 0), cores=cores, peak=max(mem) if mem else None,
        crashed=open(os.path.join(d, "crashed")).read().strip() == "1"))

def fmt(v, f="{:.0f}"):
    return "—" if v is None else f.format(v)

out = []
checks = []
for plane, rs in rows.items():
    target = float(targets[plane])
    base = next((r for r in rs if r["name"] == "baseline"), None)
    def ok(r):
        return r["p99"] is not None and r["p99"] <= target and r["hb_err"] == 0 and not r["crashed"]
    # Every fixed budget measured is a candidate: the search's pools and the static default.
    statics = [r for r in rs if r["via"] in ("static", "static-default") and ok(r)]
    best = max(statics, key=lambda r: r["served"], default=None)
    how = "given" if base is None else f"baseline B = {base['p99']:.1f} ms {'through tollgate' if baseline_via == 'tollgate' else 'sent directly'}"
    out.append(f"\n### {plane}: target PATCH p99 <= {target:.0f} ms ({how})\n")
    out.append("| run | PATCH p50 ms | PATCH p99 ms | p99 / B | within target | LISTs served/min | goodput / best static | LISTs 429 | LIST errors | heartbeat errors | apiserver cores | apiserver peak GB | crash |")
    out.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rs:
        name = r["name"] + (" (best static)" if r is best else "")
        g = r["served"] * 60 / secs
        gb = None if best is None or not best["served"] else r["served"] / best["served"]
        out.append(f'| {name} | {fmt(r["p50"], "{:.1f}")} | {fmt(r["p99"], "{:.1f}")} | '
                   f'{fmt(None if r["p99"] is None or base is None else r["p99"] / base["p99"], "{:.2f}")} | '
                   f'{"yes" if ok(r) else "**no**"} | {g:.1f} | {fmt(gb, "{:.2f}")} | {r["r429"]} | '
                   f'{r["list_err"]} | {r["hb_err"]} | {fmt(r["cores"], "{:.2f}")} | '
                   f'{fmt(None if r["peak"] is None else r["peak"] / 1e9, "{:.2f}")} | {"yes" if r["crashed"] else "no"} |')
    ad = next((r for r in rs if r["via"] == "adaptive"), None)
    if ad is not None:
        ratio = (ad["served"] / best["served"]) if best and best["served"] else None
        checks.append(f"- {plane}: adaptive within the target: {'**met**' if ok(ad) else '**not met**'} "
                      f"(p99 {fmt(ad['p99'], '{:.1f}')} ms vs {target:.0f} ms, {ad['hb_err']} heartbeat errors, "
                      f"crash: {'yes' if ad['crashed'] else 'no'}); goodput >= 80% of the best static pool's: "
                      f"{'**met**' if ratio is not None and ratio >= 0.8 else '**not met**'} ({fmt(ratio, '{:.0%}')})")

stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
section = f"""## tollgate goodput (issue 16)

LISTs served while the heartbeats stay within their target, per control plane, each run from a fresh
start (cold starts count), {secs:.0f} s each; see the script's header for the storms. One LIST of all pods on
the real apiserver: {int(real_list):,} bytes. Measured {stamp}; load average {load0} before, {load1} after.

Command: `{command}`
""" + "\n".join(out) + "\n\nTargets:\n\n" + "\n".join(checks) + "\n"
print(section)
if results != "-":
    subprocess.run(["bash", "-c", f'source "{lib}"; write_section "$0" "$1"', results, section], check=True)
    print(f"written to {results}", file=sys.stderr)
PY
