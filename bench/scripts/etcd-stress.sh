#!/usr/bin/env bash
# etcd stress (issue 8): Tess.IO's "avoid queries with large range" and "separate pods into their
# own etcd", measured with `loadgen etcd` against real etcds on loopback.
#
# Two etcds (A, B), each with its own data dir. A is seeded with SEED keys of SEED_SIZE bytes under
# /registry/pods/ (the "pods"). Puts at PUT_RATE (heartbeat-like writes, PUT_SIZE bytes, 5,000 keys)
# are measured, each case DURATION long, open loop (latency from each put's intended start):
#   alone A / alone B          puts on A (or B), nothing else
#   one etcd,  ranges R        puts on A + whole-prefix linearizable ranges of A's pods at R
#   two etcds, ranges R        puts on B + the same ranges on A (pods separated into their own etcd)
# Ranges and puts run as two loadgen processes started together; ranges are capped at
# RANGE_INFLIGHT outstanding (further ticks are dropped and counted) to bound memory.
# Writes a section into bench/RESULTS.md (RESULTS=... to change), with etcd's CPU per case.
#
#   bash bench/scripts/etcd-stress.sh                    # SEED=20000 PUT_RATE=100/s DURATION=30s
#   SKIP_BUILD=1 DURATION=10s RANGE_RATES="2/s" bash bench/scripts/etcd-stress.sh
set -euo pipefail
BENCH=etcd-stress
cd "$(dirname "$0")/../.."
# shellcheck source=bench/scripts/lib.sh
source bench/scripts/lib.sh

SEED=${SEED:-20000}
SEED_SIZE=${SEED_SIZE:-3300}
PUT_RATE=${PUT_RATE:-100/s}
PUT_SIZE=${PUT_SIZE:-3300}
DURATION=${DURATION:-30s}
RANGE_RATES=${RANGE_RATES:-"1/s 2/s 4/s"}
RANGE_INFLIGHT=${RANGE_INFLIGHT:-8}
RESULTS=${RESULTS:-bench/RESULTS.md}
ETCD=${ETCD_BIN:-/usr/bin/etcd}
LOADGEN=target/release/loadgen

[[ -x "$ETCD" ]] || die "no etcd at $ETCD (install Debian's etcd-server)"
if [[ -z "${SKIP_BUILD:-}" ]]; then
    cargo build --release -p loadgen --bin loadgen >&2
fi
[[ -x "$LOADGEN" ]] || die "no $LOADGEN (build it: cargo build --release -p loadgen --bin loadgen)"
bench_init
HZ=$(getconf CLK_TCK)

start_etcd() { # start_etcd NAME: sets URL_NAME and PID_NAME
    local name=$1 client peer pid
    client=$(free_port)
    peer=$(free_port)
    "$ETCD" --name "$name" --data-dir "$TMP/$name.etcd" \
        --listen-client-urls "http://127.0.0.1:$client" --advertise-client-urls "http://127.0.0.1:$client" \
        --listen-peer-urls "http://127.0.0.1:$peer" --initial-advertise-peer-urls "http://127.0.0.1:$peer" \
        --initial-cluster "$name=http://127.0.0.1:$peer" --log-level error >"$TMP/$name.log" 2>&1 &
    pid=$!
    PIDS+=("$pid")
    wait_http "http://127.0.0.1:$client/health" "$pid" "etcd $name"
    printf -v "URL_$name" '%s' "http://127.0.0.1:$client"
    printf -v "PID_$name" '%s' "$pid"
}

start_etcd A
start_etcd B
log "etcd A at $URL_A (pid $PID_A), B at $URL_B (pid $PID_B)"
seed_start=$(date +%s.%N)
"$LOADGEN" etcd --endpoints "$URL_A" --seed "$SEED" --seed-size "$SEED_SIZE" --no-progress >&2
seed_s=$(awk -v a="$seed_start" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}')
log "seeded $SEED keys of $SEED_SIZE bytes in ${seed_s}s"

LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
ROWS=""
declare -A P99

# case LABEL PUT_URL RANGE_URL RANGE_RATE ("-" for no ranges)
run_case() {
    local label=$1 put_url=$2 range_url=$3 rate=$4 dir a0 b0 a1 b1 rpid=""
    dir="$TMP/$(echo "$label" | tr -c 'a-zA-Z0-9\n' '-')"
    mkdir -p "$dir"
    a0=$(ticks "$PID_A")
    b0=$(ticks "$PID_B")
    if [[ "$rate" != "-" ]]; then
        "$LOADGEN" etcd --endpoints "$range_url" --ranges "$rate" --range-prefix /registry/pods/ \
            --max-in-flight "$RANGE_INFLIGHT" --duration "$DURATION" --no-progress \
            --output "$dir/ranges" >"$dir/ranges.txt" 2>&1 &
        rpid=$!
        PIDS+=("$rpid")
    fi
    "$LOADGEN" etcd --endpoints "$put_url" --puts "$PUT_RATE" --put-size "$PUT_SIZE" \
        --put-prefix /loadgen/nodes/ --put-keys 5000 --duration "$DURATION" --no-progress \
        --output "$dir/puts" >"$dir/puts.txt" 2>&1 || { cat "$dir/puts.txt" >&2; die "$label: puts failed"; }
    if [[ -n "$rpid" ]]; then
        wait "$rpid" || { cat "$dir/ranges.txt" >&2; die "$label: ranges failed"; }
    fi
    a1=$(ticks "$PID_A")
    b1=$(ticks "$PID_B")
    local row
    row=$(python3 - "$dir" "$label" "$rate" "$(( a1 - a0 ))" "$(( b1 - b0 ))" "$HZ" <<'PY'
import json, os, sys
d, label, rate, ta, tb, hz = sys.argv[1:7]
p = json.load(open(os.path.join(d, "puts", "summary.json")))["operations"][0]
l = p["latency_ms"]
cells = [label, f'{p["requests"]} ({p["errors"]} err, {p["dropped"]} dropped)',
         f'{l["p50"]:.1f}', f'{l["p99"]:.1f}', f'{l["p99.9"]:.1f}', f'{l["max"]:.1f}']
rf = os.path.join(d, "ranges", "summary.json")
if os.path.exists(rf):
    r = json.load(open(rf))["operations"][0]
    per = r["bytes"] / r["requests"] / 1e6 if r["requests"] else 0
    cells += [f'{rate}: {r["requests"]} done, {r["dropped"]} dropped, {r["errors"]} err',
              f'{r["latency_ms"]["p50"]:.0f} / {r["latency_ms"]["p99"]:.0f}', f'{per:.1f}']
else:
    cells += ["—", "—", "—"]
cells += [f'{int(ta) / int(hz):.1f} / {int(tb) / int(hz):.1f}']
print(f'{l["p99"]:.3f}\t| ' + " | ".join(cells) + " |")
PY
)
    P99[$label]=${row%%$'\t'*}
    ROWS+="${row#*$'\t'}"$'\n'
    log "$label: ${row#*$'\t'}"
}

run_case "alone A" "$URL_A" - -
run_case "alone B" "$URL_B" - -
for rate in $RANGE_RATES; do
    run_case "one etcd, ranges $rate" "$URL_A" "$URL_A" "$rate"
    run_case "two etcds, ranges $rate" "$URL_B" "$URL_A" "$rate"
done
LOAD_AFTER=$(cut -d' ' -f1-3 /proc/loadavg)

RATIOS=""
for rate in $RANGE_RATES; do
    RATIOS+=$(awk -v r="$rate" -v one="${P99["one etcd, ranges $rate"]}" -v a="${P99["alone A"]}" \
        -v two="${P99["two etcds, ranges $rate"]}" -v b="${P99["alone B"]}" \
        'BEGIN {printf "| %s | %.1f× | %.1f× | %.2f× |", r, one / a, two / b, one / two}')$'\n'
done

# Two identical cases (puts alone on A, on B) say how far apart one run per case can land.
NOISE=$(awk -v a="${P99["alone A"]}" -v b="${P99["alone B"]}" \
    'BEGIN {hi = (a > b) ? a : b; lo = (a > b) ? b : a; printf "%.2f", ((lo > 0) ? hi / lo : 0)}')
COMMIT=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
git diff --quiet HEAD -- loadgen bench/scripts/etcd-stress.sh 2>/dev/null || COMMIT+=" with uncommitted changes"
CPU=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')
SECTION="## etcd: puts under large range reads, one etcd vs two (issue 8)

Command: \`bash bench/scripts/etcd-stress.sh\` (SEED=$SEED SEED_SIZE=$SEED_SIZE PUT_RATE=$PUT_RATE
PUT_SIZE=$PUT_SIZE DURATION=$DURATION RANGE_RATES=\"$RANGE_RATES\" RANGE_INFLIGHT=$RANGE_INFLIGHT), release
\`loadgen\` (\`cargo build --release -p loadgen --bin loadgen\`), run $(date -u +%Y-%m-%dT%H:%MZ) at $COMMIT on
$(nproc) cores ($CPU), one disk; $("$ETCD" --version | head -1). Load average (1/5/15 min) before:
$LOAD_BEFORE, after: $LOAD_AFTER — the machine was shared with other engineers' cargo builds during
the run, so absolute figures are noisy; compare the ratios, each taken within this run.

Two etcds on loopback (own data dirs, default settings). A holds $SEED keys of $SEED_SIZE bytes under
/registry/pods/ (seeded in ${seed_s} s by \`loadgen etcd --seed\`; one whole-prefix range reads
~$(awk -v n="$SEED" -v s="$SEED_SIZE" 'BEGIN {printf "%.0f", n * s / 1e6}') MB). Each case: puts of $PUT_SIZE-byte values at $PUT_RATE over 5,000 keys for $DURATION,
open loop (latency from each put's intended start), in one \`loadgen etcd\` process; the ranges
(whole prefix, linearizable, at most $RANGE_INFLIGHT outstanding) in a second process started with it.
etcd CPU is utime+stime of each etcd process over the case (/proc/PID/stat).

| case | puts | put p50 ms | put p99 ms | put p99.9 ms | put max ms | ranges | range p50 / p99 ms | MB per range | etcd CPU s (A / B) |
|---|---|---|---|---|---|---|---|---|---|
${ROWS}
Put p99 relative to the same etcd's puts alone, and one etcd against two:

| range rate | one etcd: p99 / alone A | two etcds: p99 / alone B | one etcd p99 / two etcds p99 |
|---|---|---|---|
${RATIOS}
Noise floor: one run per case; the two identical cases (puts alone on A and on B) differ by
${NOISE}× in p99 in this run, so a ratio within that is not a difference.

How to read it: the first ratio column is what large linearizable ranges on the etcd that takes
the writes do to the puts' tail (Tess.IO's \"avoid queries with large range\"); the second is the
same ranges with the pods in their own etcd; the last compares the two. On this one machine both
etcds (and both loadgen processes) share the same cores and one disk, so \"two etcds\" removes the
contention *inside one etcd* (its locks, its apply loop, its CPU share), not the machine's: it
shows lock and CPU contention, not isolation of hardware, which separate machines would add."
write_section "$RESULTS" "$SECTION"
log "wrote the section to $RESULTS"
