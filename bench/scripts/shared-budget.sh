#!/usr/bin/env bash
# The shared etcd-read budget (issue 17): three masters — three simulated apiservers on one real
# etcd (`tollgate-bench sim --store etcd`), each behind its own tollgate — share one cluster-wide
# etcd-read budget B through that etcd. loadgen sends consistent LISTs of all pods (read from
# etcd) unevenly through the three tollgates, 70/20/10%, far more than B. The local pools are static
# (256 MiB/s, `--quota-mode static`): without heartbeats through tollgate the adaptive one would
# hold at its minimum and be what limits. A sampler reads every
# tollgate's /debug/budget every 0.25 s for the whole run.
#
# Phases (one run, one control plane):
#   steady     STEADY_SECONDS with the storm 70/20/10: etcd-read bytes/s admitted by all tollgates
#              (their tollgate_shared_budget counters: predicted at admission, and settled at the
#              responses' end) and etcd's own bytes sent to clients
#              (etcd_network_client_grpc_sent_bytes_total), against B; coordination writes/s (the
#              tollgates' counter, and etcd's puts + txns, which only coordination makes here);
#   move       the storm moves from master 1 to master 3 (10/20/70): seconds until master 3's grant
#              exceeds master 1's, and until both are within 10% of their final values;
#   kill       master 2's tollgate (a member, or the coordinator if it is) killed by pid: seconds
#              until the other two hold the capacity between them;
#   etcd-stop  etcd stopped (SIGSTOP) for 30 s: every tollgate's share in force and the admitted
#              etcd-read bytes/s meanwhile (the fallback: reserve / N each); then SIGCONT;
#   coord-kill the coordinator's tollgate killed: seconds until a new one is elected, and the
#              largest sum over the samples of the grants and of the shares in force.
# Heartbeats are not measured here: the simulated apiservers keep their objects in the same etcd,
# so with etcd stopped no write can succeed, with or without tollgate.
#
# Writes the section "Shared etcd-read budget (issue 17)" of bench/RESULTS.md and prints it. A
# benchmark, not a CI test: about 3 minutes. Loopback only; everything it starts is stopped by pid
# on exit.
#
# Environment:
#   BUDGET=20000000          B, etcd-read bytes/s (quota.global.etcdBytesPerSecond)
#   STEADY_SECONDS=60
#   PODS=3000 POD_BYTES=2048  the seeded pods (one LIST of all pods ~6 MB)
#   RATES="7/s 2/s 1/s"       LISTs per second through the three tollgates
#   SKIP_BUILD=1 BIN_DIR=target/release RESULTS=path ("-" prints only) KEEP_TMP=1
#   ETCD_BIN=/usr/bin/etcd
set -euo pipefail

BENCH=shared-budget
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source=lib.sh
source "$ROOT/bench/scripts/lib.sh"

COMMAND="bench/scripts/shared-budget.sh"
for v in BUDGET STEADY_SECONDS PODS POD_BYTES RATES; do
    [[ -n "${!v+x}" ]] && COMMAND="$v=\"${!v}\" $COMMAND"
done
BUDGET=${BUDGET:-20000000}
STEADY_SECONDS=${STEADY_SECONDS:-60}
PODS=${PODS:-3000}
POD_BYTES=${POD_BYTES:-2048}
read -r -a RATE <<<"${RATES:-7/s 2/s 1/s}"
RESULTS=${RESULTS:-$ROOT/bench/RESULTS.md}
ETCD_BIN=${ETCD_BIN:-/usr/bin/etcd}
[[ -x $ETCD_BIN ]] || die "$ETCD_BIN is missing (Debian's etcd-server: scripts/deps.sh --tests)"

release_binaries
bench_init
[[ -n "${KEEP_TMP:-}" ]] && log "outputs kept in $TMP"
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)

# === etcd, three simulated apiservers on it, three tollgates ===
ETCD_PORT=$(free_port)
ETCD_PEER=$(free_port)
ETCD_URL=http://127.0.0.1:$ETCD_PORT
"$ETCD_BIN" --name=bench --data-dir="$TMP/etcd" --listen-client-urls="$ETCD_URL" \
    --advertise-client-urls="$ETCD_URL" --listen-peer-urls="http://127.0.0.1:$ETCD_PEER" \
    --initial-advertise-peer-urls="http://127.0.0.1:$ETCD_PEER" \
    --initial-cluster="bench=http://127.0.0.1:$ETCD_PEER" >"$TMP/etcd.log" 2>&1 &
ETCD_PID=$!
PIDS+=("$ETCD_PID")
wait_http "$ETCD_URL/health" "$ETCD_PID" "etcd"

TG_PID=() ADMIN=() URLS=()
for i in 0 1 2; do
    "$SIM_BIN" sim --listen 127.0.0.1:0 --store etcd --etcd-endpoints "$ETCD_URL" --pods "$PODS" \
        --pod-bytes "$POD_BYTES" --nodes 100 >"$TMP/sim$i.out" 2>"$TMP/sim$i.log" &
    pid=$!
    PIDS+=("$pid")
    sim_url=$(wait_line "$TMP/sim$i.out" "serving the Kubernetes API at " "$pid" "sim $i")
    "$TOLLGATE_BIN" --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0 --upstream "$sim_url" \
        --mode enforce --quota-mode static --global-etcd-bytes-per-second "$BUDGET" --global-cluster bench \
        --etcd-servers "$ETCD_URL" >"$TMP/tollgate$i.out" 2>"$TMP/tollgate$i.log" &
    pid=$!
    PIDS+=("$pid")
    TG_PID+=("$pid")
    URLS+=("$(wait_line "$TMP/tollgate$i.out" "tollgate serving at " "$pid" "tollgate $i")")
    ADMIN+=("$(grep -o "admin http://[^)]*" "$TMP/tollgate$i.out" | head -1 | awk '{print $2}')")
    wait_http "${ADMIN[$i]}/readyz" "$pid" "tollgate $i's admin listener"
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
PIDS+=("$!")

mark() { echo "$1 $(date +%s.%N)" >>"$TMP/marks"; curl -s "$ETCD_URL/metrics" >"$TMP/etcd.$1.prom" || true; }
LOAD_PIDS=()
# storm_rates R0 R1 R2: (re)start loadgen on each live tollgate at its rate.
storm_rates() {
    local pid i rates=("$@")
    for pid in "${LOAD_PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    LOAD_PIDS=()
    for i in 0 1 2; do
        [[ ${TG_PID[$i]} == dead ]] && continue
        "$LOADGEN_BIN" --server "${URLS[$i]}" --lists "${rates[$i]}" --list-resource pods -A \
            --list-rv consistent --duration 600s --no-progress --timeout 30s --max-in-flight 50 \
            >/dev/null 2>>"$TMP/loadgen$i.log" &
        pid=$!
        PIDS+=("$pid")
        LOAD_PIDS+=("$pid")
    done
}
kill_tollgate() { kill -9 "${TG_PID[$1]}"; wait "${TG_PID[$1]}" 2>/dev/null || true; TG_PID[$1]=dead; }
coordinator() { # the index of the live tollgate that says it is the coordinator
    local i
    for i in 0 1 2; do
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
log "stopping etcd for 30 s"
mark etcd-stop
kill -STOP "$ETCD_PID"
sleep 30
kill -CONT "$ETCD_PID"
mark etcd-cont
sleep 20
C=$(coordinator)
[[ $C == none ]] && die "no coordinator after etcd came back"
log "killing the coordinator, tollgate $C"
mark coord-kill
kill_tollgate "$C"
sleep 20
mark end
LOAD_AFTER=$(cut -d' ' -f1-3 /proc/loadavg)

# === the figures ===
SECTION=$(python3 - "$TMP" "$BUDGET" "$COMMAND" "$LOAD_BEFORE" "$LOAD_AFTER" "$VICTIM" "$C" "${RATE[*]}" "$PODS" "$POD_BYTES" "$(git -C "$ROOT" rev-parse --short HEAD)" <<'PY'
import json, sys, re
tmp, B, command, load_before, load_after, victim, coord, rates, pods, pod_bytes, rev = sys.argv[1:]
B = float(B)
marks = {}
for line in open(f"{tmp}/marks"):
    k, v = line.split()
    marks[k] = float(v)
samples = [json.loads(l) for l in open(f"{tmp}/samples.jsonl") if l.strip()]

def prom(name, phase):
    total = 0.0
    try:
        for line in open(f"{tmp}/etcd.{phase}.prom"):
            if line.startswith(name + " ") or line.startswith(name + "{"):
                total += float(line.rsplit(" ", 1)[1])
    except FileNotFoundError:
        return float("nan")
    return total

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
sent = (prom("etcd_network_client_grpc_sent_bytes_total", "steady-end") - prom("etcd_network_client_grpc_sent_bytes_total", "steady-start")) / dt
writes = (counter(s1, "coordinationWrites") - counter(s0, "coordinationWrites")) / dt
etcd_w = ((prom("etcd_mvcc_put_total", "steady-end") + prom("etcd_mvcc_txn_total", "steady-end"))
          - (prom("etcd_mvcc_put_total", "steady-start") + prom("etcd_mvcc_txn_total", "steady-start"))) / dt
grants = {}
for k, v in live(s1).items():
    grants[k] = v["gate"]["bytesPerSecond"]
rows.append(("steady: etcd-read bytes/s admitted by all tollgates (at their predicted cost)", f"{fmt(adm)} = {adm/B:.3f} × B", "≤ 1.05 × B", adm <= 1.05 * B))
rows.append(("steady: etcd-read bytes/s settled at the responses' end", f"{fmt(rd)} = {rd/B:.3f} × B", "≤ 1.05 × B", rd <= 1.05 * B))
rows.append(("steady: etcd's own bytes sent to clients/s (LIST reads, watches, coordination)", f"{fmt(sent)} = {sent/B:.3f} × B", "(JSON in etcd: comparable to the above)", None))
rows.append(("steady: shares in force at the end (masters 1/2/3)", " / ".join(fmt(grants.get(k, 0)) for k in "012"), "follow 70/20/10", grants.get("0", 0) > grants.get("1", 0) > grants.get("2", 0)))
rows.append(("steady: coordination writes/s (tollgates' counter; etcd puts + txns)", f"{writes:.2f}; {etcd_w:.2f} (3 members)", "≤ 5/s for 5 members", writes * 5 / 3 <= 5))

# move: seconds until master 3's grant exceeds master 1's
def first(after, cond, until=None):
    for s in samples:
        if s["t"] >= after and (until is None or s["t"] <= until) and cond(s):
            return s["t"] - after
    return None
def grant(s, k):
    v = s["tollgates"].get(k)
    return None if v is None else v["gate"]["bytesPerSecond"]
tm = first(marks["move"], lambda s: (grant(s, "2") or 0) > (grant(s, "0") or 0), marks["kill"])
rows.append(("move 70/20/10 → 10/20/70: master 3's share above master 1's after", "never" if tm is None else f"{tm:.1f} s", "≤ 3 s (demand is smoothed over 1 s)", tm is not None and tm <= 3))

# kill: the other two hold ≥ 95% of the capacity
others = [k for k in "012" if k != victim]
tk = first(marks["kill"], lambda s: sum(grant(s, k) or 0 for k in others) >= 0.95 * cap and all(s["tollgates"][k] and len(s["tollgates"][k]["members"]) == 2 for k in others), marks["etcd-stop"])
rows.append((f"tollgate {int(victim)+1} killed: the other two hold the capacity after", "never" if tk is None else f"{tk:.1f} s", "≤ TTL + 2 s = 12 s", tk is not None and tk <= 12))

# etcd stopped
e0, e1 = marks["etcd-stop"], marks["etcd-cont"]
in_force = [sum(v["gate"]["bytesPerSecond"] for v in live(s).values()) for s in samples if e0 <= s["t"] <= e1]
sa, sb = at(e0 + 5), at(e1)
adm_stop = (counter(sb, "admittedBytes", "gate") - counter(sa, "admittedBytes", "gate")) / max(1e-9, sb["t"] - sa["t"])
fb = first(e0, lambda s: all(v["gate"]["granted"] is False for v in live(s).values()), e1)
rows.append(("etcd stopped 30 s: largest sum of the shares in force", fmt(max(in_force or [0])), "≤ B", max(in_force or [0]) <= B))
rows.append(("etcd stopped: etcd-read bytes/s admitted (from 5 s in)", f"{fmt(adm_stop)}", "≤ B (fallback reserve / N each)", adm_stop <= B))
rows.append(("etcd stopped: every tollgate on its fallback after", "never" if fb is None else f"{fb:.1f} s", "grant TTL 3 s + a renewal", None))

# coordinator killed
c0 = marks["coord-kill"]
after = [s for s in samples if c0 <= s["t"] <= marks["end"]]
gsum = max((sum(m.get("grantBytesPerSecond") or 0 for m in v["members"]) for s in after for v in live(s).values()), default=0)
fsum = max((sum(v["gate"]["bytesPerSecond"] for v in live(s).values()) for s in after), default=0)
# Only the survivors' view: the sample taken as the coordinator was killed may still show it.
survivors = [k for k in "012" if k not in (victim, coord)]
tc = first(c0, lambda s: any(s["tollgates"][k] and s["tollgates"][k]["role"] == "coordinator" for k in survivors), marks["end"])
rows.append(("coordinator killed: a new coordinator after", "never" if tc is None else f"{tc:.1f} s", "≤ lease TTL 10 s + a renewal", tc is not None and tc <= 12))
rows.append(("coordinator killed: largest grant sum / sum of shares in force", f"{fmt(gsum)} / {fmt(fsum)}", f"≤ B − reserve ({fmt(cap)}) / ≤ B", gsum <= cap + 1 and fsum <= B + 1))

out = ["## Shared etcd-read budget (issue 17)", "",
       f"Command: `{command}` at {rev}. Three masters: three `tollgate-bench sim --store etcd` on one "
       f"etcd ({pods} pods of ~{pod_bytes} B, one consistent LIST of all pods read from etcd), each "
       f"behind a tollgate with `--mode enforce --quota-mode static --global-etcd-bytes-per-second {B:.0f}` (B = {fmt(B)}, "
       f"reserve 10%, floor 5%); loadgen LISTs at {rates} through the three. Release binaries, one run; "
       f"load average before {load_before}, after {load_after} (a shared 2-core machine: noisy).", "",
       "| figure | measured | target | met |", "|---|---|---|---|"]
for name, val, target, ok in rows:
    out.append(f"| {name} | {val} | {target} | {'—' if ok is None else ('yes' if ok else '**no**')} |")
print("\n".join(out))
PY
)
echo "$SECTION"
[[ $RESULTS == - ]] || write_section "$RESULTS" "$SECTION"
