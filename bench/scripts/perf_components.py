#!/usr/bin/env python3
"""Group `perf report --stdio --no-children --sort dso,sym` output by component, per proxy.

Usage: perf_components.py DIR WHAT PROXY[=US]...
  reads DIR/perf.PROXY.WHAT.txt (tls-bench.sh PROFILE=1; WHAT is h1 or h2)

Prints a Markdown table: one row per component, one column per proxy, each cell the share of that
proxy's CPU samples and, given the proxy's CPU time per request US (µs), that share of it. A Rust symbol goes to the first crate other than std, core and alloc named in it, left to
right (`<h2::proto::X as tollgate::Y>::f` is HTTP/2's code, `core::ptr::drop_in_place<tollgate::Z>`
tollgate's), else to the standard library; the kernel, the C library and OpenSSL go by
the object they are in.
"""
import re
import sys

# (component, crates or symbol prefixes), in the order the table lists them.
COMPONENTS = [
    ("kernel (TCP, syscalls, scheduling)", []),
    ("TLS: rustls", ["rustls", "tokio_rustls", "hyper_rustls", "webpki", "rustls_pki_types"]),
    ("crypto: ring", ["ring", "ring_core"]),
    ("TLS and crypto: OpenSSL", []),
    ("HTTP/2: h2 (framing, HPACK, streams)", ["h2"]),
    ("hyper and hyper-util", ["hyper", "hyper_util"]),
    ("http, bytes, httparse", ["http", "bytes", "httparse", "http_body", "http_body_util"]),
    ("tokio", ["tokio", "mio"]),
    ("tollgate", ["tollgate", "apimodel", "kubeio"]),
    ("minproxy", ["minproxy"]),
    ("metrics, tracing", ["prometheus", "tracing", "tracing_core", "tracing_subscriber"]),
    ("Rust std/core/alloc", ["std", "core", "alloc", "hashbrown"]),
    ("allocator: jemalloc (tollgate's)", []),
    ("C library (malloc, memcpy, …)", []),
    ("nginx", []),
    ("haproxy", []),
    ("other", []),
]
CRATE_OF = {c: name for name, crates in COMPONENTS for c in crates}
CRATE = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)::")
LINE = re.compile(r"^\s*([0-9.]+)%\s+(\S+)\s+\[(.)\]\s+(.*)$")


def component(dso, kind, sym):
    if kind == "k" or dso.startswith("[kernel"):
        return "kernel (TCP, syscalls, scheduling)"
    if dso.startswith("libc") or dso.startswith("ld-linux"):
        return "C library (malloc, memcpy, …)"
    if dso.startswith("libssl") or dso.startswith("libcrypto"):
        return "TLS and crypto: OpenSSL"
    if dso in ("nginx", "haproxy"):
        return dso
    if sym.startswith("_rjem_") or sym.startswith("je_") or "jemalloc" in sym:
        return "allocator: jemalloc (tollgate's)"
    if sym.startswith("ring_core") or sym.startswith("GFp_") or "_ring_core_" in sym:
        return "crypto: ring"
    found = [CRATE_OF.get(m.group(1)) for m in CRATE.finditer(sym)]
    found = [n for n in found if n]
    for name in found:
        if name != "Rust std/core/alloc":
            return name
    if found:
        return found[0]
    if sym.startswith("__rust") or sym.startswith("__rdl") or sym.startswith("_ZN"):
        return "Rust std/core/alloc"
    return "other"


def shares(path):
    out = {}
    with open(path) as f:
        for line in f:
            m = LINE.match(line)
            if not m:
                continue
            pct, dso, kind, sym = float(m.group(1)), m.group(2), m.group(3), m.group(4)
            c = component(dso, kind, sym.strip())
            out[c] = out.get(c, 0.0) + pct
    return out


def main():
    if len(sys.argv) < 4:
        sys.exit("usage: perf_components.py DIR WHAT PROXY[=US]...")
    d, what = sys.argv[1], sys.argv[2]
    proxies, per_request = [], {}
    for arg in sys.argv[3:]:
        name, _, us = arg.partition("=")
        proxies.append(name)
        if us:
            per_request[name] = float(us)
    table = {p: shares(f"{d}/perf.{p}.{what}.txt") for p in proxies}
    rows = [name for name, _ in COMPONENTS if any(table[p].get(name, 0) >= 0.05 for p in proxies)]
    print(f"Profile, {what}: one small-GET run per proxy under `perf record` (not in the CPU "
          f"figures): share of each proxy's CPU samples by component, and that share of its CPU "
          f"per {what} GET measured above.")
    print()
    print("| component | " + " | ".join(proxies) + " |")
    print("|---|" + "---|" * len(proxies))
    def cell(p, r):
        share = table[p].get(r, 0)
        if p in per_request:
            return f"{share:.1f}% ({share / 100 * per_request[p]:.1f} µs)"
        return f"{share:.1f}%"

    for r in rows:
        print(f"| {r} | " + " | ".join(cell(p, r) for p in proxies) + " |")
    if per_request:
        print(f"| **CPU per {what} GET** | " + " | ".join(
            f"{per_request[p]:.1f} µs" if p in per_request else "" for p in proxies) + " |")


if __name__ == "__main__":
    main()
