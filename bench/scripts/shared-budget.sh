#!/usr/bin/env bash
# The shared etcd-read budget (issue 17): three masters — three simulated apiservers on one real
# etcd (`tollgate-bench sim --store etcd`, the storage etcd), each behind its own tollgate — share
# one cluster-wide etcd-read budget B. The tollgates coordinate through a second real etcd (their
# `--etcd-servers`), so that etcd can be stopped while the apiservers keep serving: that is what
# an etcd out of reach from tollgate's side looks like. loadgen sends consistent LISTs of all pods
# (read from the storage etcd) unevenly through the three tollgates, 70/20/10%, far more than B.
# The local pools are static (256 MiB/s, `--quota-mode static`): without heartbeats through
# tollgate the adaptive one would hold at its minimum and be what limits. A sampler reads every
# tollgate's /debug/budget every 0.25 s for the whole run.
#
# Phases (one run, one control plane):
#   steady     STEADY_SECONDS with the storm 70/20/10: etcd-read bytes/s admitted by all tollgates
#              (their tollgate_shared_budget counters: predicted at admission, and settled at the
#              responses' end) and the storage etcd's own bytes sent to clients
#              (etcd_network_client_grpc_sent_bytes_total), against B; coordination writes/s (the
#              tollgates' counter, and the coordination etcd's puts + txns: only coordination
#              writes there);
#   move       the storm moves from master 1 to master 3 (10/20/70): seconds until master 3's share
#              in force exceeds master 1's;
#   kill       master 2's tollgate (a member, or the coordinator if it is) killed by pid: seconds
#              until the other two hold the capacity between them;
#   heartbeats HEARTBEAT_NODES simulated nodes per live master (`loadgen nodes`: a status PATCH and
#              a lease renewal per node per second) for 30 s, etcd up: the baseline;
#   etcd-stop  the coordination etcd stopped (SIGSTOP) for 30 s while the same heartbeats run:
#              every tollgate's share in force, the etcd-read bytes/s admitted meanwhile (the
#              fallback: reserve / N each), and the heartbeats' p99 against the baseline; SIGCONT;
#   coord-kill the coordinator's tollgate killed: seconds until a new one is elected, and the
#              largest sum over the samples of the grants and of the shares in force;
#   five       four more tollgates start (five members; on the three simulated apiservers, two of
#              them fronted twice), LISTs through all five at FIVE_RATES; coordination writes/s
#              over FIVE_SECONDS after a warm-up.
#
# Writes the section "Shared etcd-read budget (issue 17)" of bench/RESULTS.md and prints it. A
# benchmark, not a CI test: about 5 minutes. Loopback only; everything it starts is stopped by pid
# on exit.
#
# Environment:
#   BUDGET=20000000          B, etcd-read bytes/s (quota.global.etcdBytesPerSecond)
#   STEADY_SECONDS=60 FIVE_SECONDS=60
#   PODS=3000 POD_BYTES=2048  the seeded pods (one LIST of all pods ~6 MB)
#   RATES="7/s 2/s 1/s"       LISTs per second through the three tollgates
#   FIVE_RATES="4/s 2/s 2/s 1/s 1/s"
#   HEARTBEAT_NODES=50
#   SKIP_BUILD=1 BIN_DIR=target/release RESULTS=path ("-" prints only) KEEP_TMP=1
#   ETCD_BIN=/usr/bin/etcd
set -euo pipefail

BENCH=shared-budget
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source=lib.sh
source "$ROOT/bench/scripts/lib.sh"

COMMAND="bench/scripts/shared-budget.sh"
for v in BUDGET STEADY_SECONDS FIVE_SECONDS PODS POD_BYTES RATES FIVE_RATES HEARTBEAT_NODES; do
    [[ -n "${!v+x}" ]] && COMMAND="$v=\"${!v}\" $COMMAND"
done
BUDGET=${BUDGET:-20000000}
STEADY_SECONDS=${STEADY_SECONDS:-60}
FIVE_SECONDS=${FIVE_SECONDS:-60}
PODS=${PODS:-3000}
POD_BYTES=${POD_BYTES:-2048}
HEARTBEAT_NODES=${HEARTBEAT_NODES:-50}
read -r -a RATE <<<"${RATES:-7/s 2/s 1/s}"
read -r -a FIVE_RATE <<<"${FIVE_RATES:-4/s 2/s 2/s 1/s 1/s}"
RESULTS=${RESULTS:-$ROOT/bench/RESULTS.md}
ETCD_BIN=${ETCD_BIN:-/usr/bin/etcd}
[[ -x $ETCD_BIN ]] || die "$ETCD_BIN is missing (Debian's etcd-server: scripts/deps.sh --tests)"

release_binaries
bench_init
# A stopped etcd would not die of the exit trap's SIGTERM: let it go on first.
trap '[[ -n "${COORD_PID:-}" ]] && kill -CONT "$COORD_PID" 2>/dev/null; bench_cleanup' EXIT
[[ -n "${KEEP_TMP:-}" ]] && log "outputs kept in $TMP"
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)

# start_etcd NAME: one etcd on free ports; sets ETCD_URL_OUT and ETCD_PID_OUT.
start_etcd() {
    local port peer
    port=$(free_port)
    peer=$(free_port)
    ETCD_URL_OUT=http://127.0.0.1:$port
    "$ETCD_BIN" --name="$1" --data-dir="$TMP/etcd-$1" --listen-client-urls="$ETCD_URL_OUT" \
        --advertise-client-urls="$ETCD_URL_OUT" --listen-peer-urls="http://127.0.0.1:$peer" \
        --initial-advertise-peer-urls="http://127.0.0.1:$peer" \
        --initial-cluster="$1=http://127.0.0.1:$peer" >"$TMP/etcd-$1.log" 2>&1 &
    ETCD_PID_OUT=$!
    PIDS+=("$ETCD_PID_OUT")
    wait_http "$ETCD_URL_OUT/health" "$ETCD_PID_OUT" "etcd $1"
}

# === two etcds, three simulated apiservers on the storage one, three tollgates ===
start_etcd store
STORE_URL=$ETCD_URL_OUT
start_etcd coord
COORD_URL=$ETCD_URL_OUT COORD_PID=$ETCD_PID_OUT

TG_PID=() ADMIN=() URLS=() SIM_URLS=()
# start_tollgate I SIM_URL: tollgate I in front of SIM_URL, coordinating through the coord etcd.
start_tollgate() {
    local i=$1 pid
    "$TOLLGATE_BIN" --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0 --upstream "$2" \
        --mode enforce --quota-mode static --global-etcd-bytes-per-second "$BUDGET" --global-cluster bench \
        --etcd-servers "$COORD_URL" >"$TMP/tollgate$i.out" 2>"$TMP/tollgate$i.log" &
    pid=$!
    PIDS+=("$pid")
    TG_PID[i]=$pid
    URLS[i]=$(wait_line "$TMP/tollgate$i.out" "tollgate serving at " "$pid" "tollgate $i")
    ADMIN[i]=$(grep -o "admin http://[^)]*" "$TMP/tollgate$i.out" | head -1 | awk '{print $2}')
    wait_http "${ADMIN[$i]}/readyz" "$pid" "tollgate $i's admin listener"
}
for i in 0 1 2; do
    "$SIM_BIN" sim --listen 127.0.0.1:0 --store etcd --etcd-endpoints "$STORE_URL" --pods "$PODS" \
        --pod-bytes "$POD_BYTES" --nodes 100 >"$TMP/sim$i.out" 2>"$TMP/sim$i.log" &
    pid=$!
    PIDS+=("$pid")
    SIM_URLS[i]=$(wait_line "$TMP/sim$i.out" "serving the Kubernetes API at " "$pid" "sim $i")
    start_tollgate "$i" "${SIM_URLS[$i]}"
done

# === the sampler: every tollgate's /debug/budget every 0.25 s, one JSON line per sample ===
python3 - "$TMP/samples.jsonl" "${ADMIN[@]}" <<'PY' &
import json, sys, time, urllib.request
out, admins = sys.argv[1], sys.argv[2:]
with open(out, "w", buffering=1) as f:
    while True:
        t = time.time()
        row = {"t": t, "tollgates": {}}
        for i, a in enumerate(admins):
            try:
                with urllib.request.urlopen(a + "/debug/budget", timeout=1) as r:
                    row["tollgates"][str(i)] = json.load(r).get("shared")
            except Exception:
                row["tollgates"][str(i)] = None
        f.write(json.dumps(row) + "\n")
        time.sleep(max(0.0, 0.25 - (time.time() - t)))
PY
SAMPLER_PID=$!
PIDS+=("$SAMPLER_PID")

# mark NAME: the time, both etcds' metrics and (for the five phase) every live tollgate's view.
mark() {
    local i
    echo "$1 $(date +%s.%N)" >>"$TMP/marks"
    curl -s "$STORE_URL/metrics" >"$TMP/store.$1.prom" || true
    curl -s -m 2 "$COORD_URL/metrics" >"$TMP/coord.$1.prom" || true
    for i in "${!TG_PID[@]}"; do
        [[ ${TG_PID[$i]} == dead ]] && continue
        curl -s -m 2 "${ADMIN[$i]}/debug/budget" >"$TMP/budget.$1.$i.json" || true
    done
}
LOAD_PIDS=()
# storm_rates R0 R1 …: (re)start loadgen on each live tollgate at its rate (- for none).
storm_rates() {
    local pid i rates=("$@")
    for pid in "${LOAD_PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    LOAD_PIDS=()
    for i in "${!rates[@]}"; do
        [[ ${TG_PID[$i]} == dead || ${rates[$i]} == - ]] && continue
        "$LOADGEN_BIN" --server "${URLS[$i]}" --lists "${rates[$i]}" --list-resource pods -A \
            --list-rv consistent --duration 900s --no-progress --timeout 30s --max-in-flight 50 \
            >/dev/null 2>>"$TMP/loadgen$i.log" &
        pid=$!
        PIDS+=("$pid")
        LOAD_PIDS+=("$pid")
    done
}
# heartbeats NAME: HEARTBEAT_NODES nodes per live master for 30 s (summary in $TMP/hb-NAME-I).
heartbeats() {
    local i pids=()
    for i in 0 1 2; do
        [[ ${TG_PID[$i]} == dead ]] && continue
        "$LOADGEN_BIN" nodes --server "${URLS[$i]}" --count "$HEARTBEAT_NODES" --object-prefix "hb$i-" \
            --heartbeat 1s --lease-renew 1s --duration 30s --no-progress --timeout 10s \
            --output "$TMP/hb-$1-$i" >/dev/null 2>>"$TMP/heartbeats$i.log" &
        pids+=("$!")
        PIDS+=("$!")
    done
    HB_PIDS=("${pids[@]}")
}
kill_tollgate() { kill -9 "${TG_PID[$1]}"; wait "${TG_PID[$1]}" 2>/dev/null || true; TG_PID[$1]=dead; }
coordinator() { # the index of the live tollgate that says it is the coordinator
    local i
    for i in "${!TG_PID[@]}"; do
        [[ ${TG_PID[$i]} == dead ]] && continue
        curl -s "${ADMIN[$i]}/debug/budget" | grep -q '"role": "coordinator"' && { echo "$i"; return; }
    done
    echo none
}

log "storm ${RATE[*]} LISTs through the three tollgates; warming up 15 s"
storm_rates "${RATE[@]}"
sleep 15
mark steady-start
sleep "$STEADY_SECONDS"
mark steady-end
log "the storm moves from master 1 to master 3"
storm_rates "${RATE[2]}" "${RATE[1]}" "${RATE[0]}"
mark move
sleep 20
C=$(coordinator)
VICTIM=1
log "killing tollgate $VICTIM (coordinator: $C)"
mark kill
kill_tollgate "$VICTIM"
sleep 20
log "heartbeats for 30 s, etcd up (the baseline)"
mark hb-base
heartbeats base
for pid in "${HB_PIDS[@]}"; do wait "$pid" || log "a heartbeat loadgen exited non-zero; see $TMP"; done
log "stopping the coordination etcd for 30 s, heartbeats meanwhile"
heartbeats stop
mark etcd-stop
kill -STOP "$COORD_PID"
sleep 30
kill -CONT "$COORD_PID"
mark etcd-cont
for pid in "${HB_PIDS[@]}"; do wait "$pid" || log "a heartbeat loadgen exited non-zero; see $TMP"; done
sleep 20
C=$(coordinator)
[[ $C == none ]] && die "no coordinator after etcd came back"
log "killing the coordinator, tollgate $C"
mark coord-kill
kill_tollgate "$C"
sleep 20
mark coord-end
log "five members: four more tollgates, LISTs ${FIVE_RATE[*]}"
# One tollgate is left (tollgate 2 and the coordinator were killed): four more make five.
for i in 3 4 5 6; do start_tollgate "$i" "${SIM_URLS[$((i % 3))]}"; done
LIVE=()
for i in "${!TG_PID[@]}"; do [[ ${TG_PID[$i]} == dead ]] || LIVE+=("$i"); done
[[ ${#LIVE[@]} -eq 5 ]] || die "five members expected, ${#LIVE[@]} live"
FIVE=()
for i in "${!TG_PID[@]}"; do FIVE[i]=-; done
for j in "${!LIVE[@]}"; do FIVE[${LIVE[$j]}]=${FIVE_RATE[$j]}; done
storm_rates "${FIVE[@]}"
sleep 15
mark five-start
sleep "$FIVE_SECONDS"
mark five-end
LOAD_AFTER=$(cut -d' ' -f1-3 /proc/loadavg)

# The heartbeats of each window, merged over the masters (histograms merged, not averaged).
for w in base stop; do
    "$LOADGEN_BIN" merge --output "$TMP/hb-$w" "$TMP"/hb-"$w"-? >/dev/null 2>>"$TMP/merge.log" \
        || die "merging the $w heartbeats failed; see $TMP/merge.log"
done

# === the figures ===
SECTION=$(python3 - "$TMP" "$BUDGET" "$COMMAND" "$LOAD_BEFORE" "$LOAD_AFTER" "$VICTIM" "$C" "${RATE[*]}" "$PODS" "$POD_BYTES" "$(git -C "$ROOT" rev-parse --short HEAD)" "$HEARTBEAT_NODES" "${FIVE_RATE[*]}" "${LIVE[*]}" <<'PY'
import json, sys
tmp, B, command, load_before, load_after, victim, coord, rates, pods, pod_bytes, rev, hb_nodes, five_rates, five_live = sys.argv[1:]
B = float(B)
marks = {}
for line in open(f"{tmp}/marks"):
    k, v = line.split()
    marks[k] = float(v)
samples = [json.loads(l) for l in open(f"{tmp}/samples.jsonl") if l.strip()]

def prom(etcd, name, phase):
    total = 0.0
    try:
        for line in open(f"{tmp}/{etcd}.{phase}.prom"):
            if line.startswith(name + " ") or line.startswith(name + "{"):
                total += float(line.rsplit(" ", 1)[1])
    except FileNotFoundError:
        return float("nan")
    return total

def etcd_writes(etcd, a, b, dt):
    w = lambda p: prom(etcd, "etcd_mvcc_put_total", p) + prom(etcd, "etcd_mvcc_txn_total", p)
    return (w(b) - w(a)) / dt

def at(t):
    """The last sample at or before t."""
    best = None
    for s in samples:
        if s["t"] <= t:
            best = s
    return best

def counter(s, key, sub=None):
    tot = 0.0
    for v in s["tollgates"].values():
        if v is None:
            continue
        x = v["gate"][key] if sub == "gate" else v[key]
        tot += x
    return tot

def live(s):
    return {k: v for k, v in s["tollgates"].items() if v is not None}

reserve = 0.1 * B
cap = B - reserve
rows = []
fmt = lambda x: f"{x/1e6:.2f} MB/s"

# steady
s0, s1 = at(marks["steady-start"]), at(marks["steady-end"])
dt = s1["t"] - s0["t"]
adm = (counter(s1, "admittedBytes", "gate") - counter(s0, "admittedBytes", "gate")) / dt
rd = (counter(s1, "readBytes", "gate") - counter(s0, "readBytes", "gate")) / dt
sent = (prom("store", "etcd_network_client_grpc_sent_bytes_total", "steady-end") - prom("store", "etcd_network_client_grpc_sent_bytes_total", "steady-start")) / dt
writes = (counter(s1, "coordinationWrites") - counter(s0, "coordinationWrites")) / dt
etcd_w = etcd_writes("coord", "steady-start", "steady-end", dt)
grants = {}
for k, v in live(s1).items():
    grants[k] = v["gate"]["bytesPerSecond"]
rows.append(("steady: etcd-read bytes/s admitted by all tollgates (at their predicted cost)", f"{fmt(adm)} = {adm/B:.3f} × B", "≤ 1.05 × B", adm <= 1.05 * B))
rows.append(("steady: etcd-read bytes/s settled at the responses' end", f"{fmt(rd)} = {rd/B:.3f} × B", "≤ 1.05 × B", rd <= 1.05 * B))
rows.append(("steady: the storage etcd's bytes sent to clients/s (LIST reads, watches)", f"{fmt(sent)} = {sent/B:.3f} × B", "(JSON in etcd: comparable to the above)", None))
rows.append(("steady: shares in force at the end (masters 1/2/3)", " / ".join(fmt(grants.get(k, 0)) for k in "012"), "follow 70/20/10", grants.get("0", 0) > grants.get("1", 0) > grants.get("2", 0)))
rows.append(("steady: coordination writes/s, 3 members (tollgates' counter; the coordination etcd's puts + txns)", f"{writes:.2f}; {etcd_w:.2f}", "(5 members below)", None))

# move: seconds until master 3's share in force exceeds master 1's
def first(after, cond, until=None):
    for s in samples:
        if s["t"] >= after and (until is None or s["t"] <= until) and cond(s):
            return s["t"] - after
    return None
def grant(s, k):
    v = s["tollgates"].get(k)
    return None if v is None else v["gate"]["bytesPerSecond"]
tm = first(marks["move"], lambda s: (grant(s, "2") or 0) > (grant(s, "0") or 0), marks["kill"])
rows.append(("move 70/20/10 → 10/20/70: master 3's share above master 1's after", "never" if tm is None else f"{tm:.1f} s", "≤ 3 s", tm is not None and tm <= 3))

# kill: the other two hold ≥ 95% of the capacity
others = [k for k in "012" if k != victim]
tk = first(marks["kill"], lambda s: sum(grant(s, k) or 0 for k in others) >= 0.95 * cap and all(s["tollgates"][k] and len(s["tollgates"][k]["members"]) == 2 for k in others), marks["hb-base"])
rows.append((f"tollgate {int(victim)+1} killed: the other two hold the capacity after", "never" if tk is None else f"{tk:.1f} s", "≤ TTL + 2 s = 12 s", tk is not None and tk <= 12))

# the coordination etcd stopped
e0, e1 = marks["etcd-stop"], marks["etcd-cont"]
in_force = [sum(v["gate"]["bytesPerSecond"] for v in live(s).values()) for s in samples if e0 <= s["t"] <= e1]
sa, sb = at(e0 + 5), at(e1)
adm_stop = (counter(sb, "admittedBytes", "gate") - counter(sa, "admittedBytes", "gate")) / max(1e-9, sb["t"] - sa["t"])
fb = first(e0, lambda s: all(v["gate"]["granted"] is False for v in live(s).values()), e1)
members_left = len(live(at(e0)))
rows.append(("coordination etcd stopped 30 s: largest sum of the shares in force", fmt(max(in_force or [0])), "≤ B", max(in_force or [0]) <= B))
rows.append(("etcd stopped: etcd-read bytes/s admitted (from 5 s in to the end)", f"{fmt(adm_stop)} = {adm_stop/B:.3f} × B", f"≤ B (fallback reserve / N = {fmt(reserve / members_left)} each, {members_left} live)", adm_stop <= B))
rows.append(("etcd stopped: every tollgate on its fallback after", "never" if fb is None else f"{fb:.1f} s", "grant TTL 3 s + a renewal", None))

def hb(window):
    s = json.load(open(f"{tmp}/hb-{window}/summary.json"))
    out = {}
    for op in s["operations"]:
        if op["name"] in ("node-heartbeat", "lease-renew"):
            out[op["name"]] = (op["latency_ms"]["p99"], op["requests"], op["errors"])
    return out
base, stop = hb("base"), hb("stop")
for name, what in (("node-heartbeat", "status PATCHes"), ("lease-renew", "lease renewals")):
    b, s = base.get(name), stop.get(name)
    if b is None or s is None:
        rows.append((f"heartbeats ({what}) p99 without / with etcd stopped", "missing", "unaffected", False))
        continue
    ok = s[2] == 0 and s[0] <= max(2 * b[0], b[0] + 10)
    rows.append((f"heartbeats ({what}) p99 without / with etcd stopped; errors", f"{b[0]:.1f} ms / {s[0]:.1f} ms; {b[2]} / {s[2]} of {b[1]} / {s[1]}", "unaffected (≤ 2 × the baseline or + 10 ms; no errors)", ok))

# coordinator killed
c0 = marks["coord-kill"]
after = [s for s in samples if c0 <= s["t"] <= marks["coord-end"]]
gsum = max((sum(m.get("grantBytesPerSecond") or 0 for m in v["members"]) for s in after for v in live(s).values()), default=0)
fsum = max((sum(v["gate"]["bytesPerSecond"] for v in live(s).values()) for s in after), default=0)
# Only the survivors' view: the sample taken as the coordinator was killed may still show it.
survivors = [k for k in "012" if k not in (victim, coord)]
tc = first(c0, lambda s: any(s["tollgates"][k] and s["tollgates"][k]["role"] == "coordinator" for k in survivors), marks["coord-end"])
rows.append(("coordinator killed: a new coordinator after", "never" if tc is None else f"{tc:.1f} s", "≤ lease TTL 10 s + a renewal", tc is not None and tc <= 12))
rows.append(("coordinator killed: largest grant sum / sum of shares in force", f"{fmt(gsum)} / {fmt(fsum)}", f"≤ B − reserve ({fmt(cap)}) / ≤ B", gsum <= cap + 1 and fsum <= B + 1))

# five members
def views(phase):
    out = {}
    for i in five_live.split():
        try:
            out[i] = json.load(open(f"{tmp}/budget.{phase}.{i}.json"))["shared"]
        except (OSError, ValueError, KeyError):
            out[i] = None
    return out
v0, v1 = views("five-start"), views("five-end")
dt5 = marks["five-end"] - marks["five-start"]
complete = all(v0[i] and v1[i] for i in v0)
w5 = sum(v1[i]["coordinationWrites"] - v0[i]["coordinationWrites"] for i in v0 if v0[i] and v1[i]) / dt5
e5 = etcd_writes("coord", "five-start", "five-end", dt5)
n5 = max((len(v["members"]) for v in v1.values() if v), default=0)
rows.append((f"coordination writes/s, {n5} members (tollgates' counter; the coordination etcd's puts + txns)", f"{w5:.2f}; {e5:.2f}", "≤ 5/s for 5 members", complete and n5 == 5 and max(w5, e5) <= 5))

out = ["## Shared etcd-read budget (issue 17)", "",
       f"Command: `{command}` at {rev}. Three masters: three `tollgate-bench sim --store etcd` on one "
       f"storage etcd ({pods} pods of ~{pod_bytes} B, one consistent LIST of all pods read from etcd), each "
       f"behind a tollgate with `--mode enforce --quota-mode static --global-etcd-bytes-per-second {B:.0f}` (B = {fmt(B)}, "
       f"reserve 10%, floor 5%) coordinating through a second etcd (`--etcd-servers`); loadgen LISTs at {rates} "
       f"through the three; {hb_nodes} simulated nodes per live master (a status PATCH and a lease renewal per "
       f"node per second) for the heartbeat windows; for the last figure five tollgates on the three "
       f"simulated apiservers, LISTs at {five_rates}. Release binaries, one run; "
       f"load average before {load_before}, after {load_after} (a shared 2-core machine: noisy).", "",
       "| figure | measured | target | met |", "|---|---|---|---|"]
for name, val, target, ok in rows:
    out.append(f"| {name} | {val} | {target} | {'—' if ok is None else ('yes' if ok else '**no**')} |")
print("\n".join(out))
PY
)
echo "$SECTION"
[[ $RESULTS == - ]] || write_section "$RESULTS" "$SECTION"
