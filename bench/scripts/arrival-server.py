#!/usr/bin/env python3
"""Records when each request arrives, for loadgen's timing-error benchmark (issue 4).

  arrival-server.py serve PORT_FILE OUT_CSV
      Serves HTTP/1.1 (keep-alive) on 127.0.0.1:<free port>, writes the port to PORT_FILE,
      answers every GET with a small JSON object, and records for every request whose path
      ends in `-<N>` (loadgen's `{prefix}pod-N` with a large --objects) the sequence number N,
      the kernel's receive timestamp of the packet that completed the request head
      (SO_TIMESTAMPNS, CLOCK_REALTIME, ns) and the time this process read it
      (time.time_ns()). On SIGTERM/SIGINT it writes `seq,kernel_ns,user_ns` rows to OUT_CSV.

  arrival-server.py sleeper SECONDS RATE_PER_S
      The machine's own timer baseline: one bare thread sleeping to the same schedule
      (wake N at N / RATE), no network. Prints percentiles of how late it woke (`key=value`),
      the floor any user-space load generator's timing error sits on, on this machine, now.

  arrival-server.py analyze OUT_CSV RATE_PER_S
      Compares arrivals with the intended schedule (request N at N / RATE after the start):
      offset_N = arrival_N - N / RATE; the schedule's start is taken as the median offset;
      the timing error of request N is offset_N - median. Prints percentiles of |error| (and
      the signed extremes) for both timestamps, as `key=value` lines.

A single-threaded epoll loop: no thread hand-off between the socket and the timestamp.
"""
import os
import selectors
import signal
import socket
import struct
import sys
import time

RESPONSE_BODY = b'{"kind":"Pod","apiVersion":"v1","metadata":{"name":"x","namespace":"default"}}'
RESPONSE = (
    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
    + str(len(RESPONSE_BODY)).encode()
    + b"\r\n\r\n"
    + RESPONSE_BODY
)
SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)
SCM_TIMESTAMPNS = SO_TIMESTAMPNS


def serve(port_file, out_csv):
    records = []
    sel = selectors.DefaultSelector()
    lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(1024)
    lsock.setblocking(False)
    sel.register(lsock, selectors.EVENT_READ, None)
    buffers = {}
    stop = []

    def on_signal(_sig, _frame):
        stop.append(True)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    tmp = port_file + ".tmp"
    with open(tmp, "w") as f:
        f.write(str(lsock.getsockname()[1]))
    os.rename(tmp, port_file)

    while not stop:
        try:
            events = sel.select(timeout=0.5)
        except InterruptedError:
            continue
        for key, _ in events:
            sock = key.fileobj
            if sock is lsock:
                try:
                    conn, _ = lsock.accept()
                except BlockingIOError:
                    continue
                conn.setblocking(False)
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                conn.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
                sel.register(conn, selectors.EVENT_READ, None)
                buffers[conn] = b""
                continue
            try:
                data, anc, _flags, _addr = sock.recvmsg(65536, socket.CMSG_SPACE(16))
            except (BlockingIOError, InterruptedError):
                continue
            except OSError:
                data = b""
            user_ns = time.time_ns()
            if not data:
                sel.unregister(sock)
                buffers.pop(sock, None)
                sock.close()
                continue
            kernel_ns = 0
            for level, kind, cdata in anc:
                if level == socket.SOL_SOCKET and kind == SCM_TIMESTAMPNS and len(cdata) >= 16:
                    sec, nsec = struct.unpack("qq", cdata[:16])
                    kernel_ns = sec * 1_000_000_000 + nsec
            buf = buffers[sock] + data
            out = []
            while True:
                end = buf.find(b"\r\n\r\n")
                if end < 0:
                    break
                head, buf = buf[:end], buf[end + 4:]
                line = head.split(b"\r\n", 1)[0]
                parts = line.split(b" ")
                if len(parts) >= 2:
                    path = parts[1].split(b"?", 1)[0]
                    tail = path.rsplit(b"-", 1)
                    if len(tail) == 2 and tail[1].isdigit():
                        records.append((int(tail[1]), kernel_ns, user_ns))
                out.append(RESPONSE)
            buffers[sock] = buf
            if out:
                try:
                    sock.sendall(b"".join(out))
                except OSError:
                    pass
    with open(out_csv, "w") as f:
        f.write("seq,kernel_ns,user_ns\n")
        for r in records:
            f.write("%d,%d,%d\n" % r)


def percentile(sorted_values, q):
    if not sorted_values:
        return float("nan")
    i = min(len(sorted_values) - 1, max(0, int(round(q * (len(sorted_values) - 1)))))
    return sorted_values[i]


def analyze(out_csv, rate):
    rows = []
    with open(out_csv) as f:
        next(f)
        for line in f:
            seq, k, u = line.strip().split(",")
            rows.append((int(seq), int(k), int(u)))
    period_ns = 1e9 / rate
    print("requests=%d" % len(rows))
    seqs = sorted(r[0] for r in rows)
    print("missing=%d" % ((seqs[-1] - seqs[0] + 1 - len(set(seqs))) if seqs else 0))
    for name, col in (("kernel", 1), ("user", 2)):
        offsets = sorted(r[col] - r[0] * period_ns for r in rows if r[col] > 0)
        if not offsets:
            continue
        median = percentile(offsets, 0.5)
        errors = sorted(abs(o - median) / 1e6 for o in offsets)
        signed = sorted((o - median) / 1e6 for o in offsets)
        for label, q in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99), ("p99.9", 0.999)):
            print("%s_abs_%s_ms=%.3f" % (name, label, percentile(errors, q)))
        print("%s_abs_max_ms=%.3f" % (name, errors[-1]))
        print("%s_signed_min_ms=%.3f" % (name, signed[0]))
        print("%s_signed_max_ms=%.3f" % (name, signed[-1]))
        print("%s_over_1ms=%d" % (name, sum(1 for e in errors if e > 1.0)))


def sleeper(seconds, rate):
    period = 1e9 / rate
    n = int(seconds * rate)
    late = []
    t0 = time.perf_counter_ns()
    for i in range(1, n + 1):
        due = t0 + i * period
        now = time.perf_counter_ns()
        if due > now:
            time.sleep((due - now) / 1e9)
        late.append((time.perf_counter_ns() - due) / 1e6)
    late.sort()
    for label, q in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99), ("p99.9", 0.999)):
        print("sleeper_late_%s_ms=%.3f" % (label, percentile(late, q)))
    print("sleeper_late_max_ms=%.3f" % late[-1])
    print("sleeper_over_1ms=%d" % sum(1 for x in late if x > 1.0))


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "serve":
        serve(sys.argv[2], sys.argv[3])
    elif len(sys.argv) == 4 and sys.argv[1] == "sleeper":
        sleeper(float(sys.argv[2]), float(sys.argv[3]))
    elif len(sys.argv) == 4 and sys.argv[1] == "analyze":
        analyze(sys.argv[2], float(sys.argv[3]))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
