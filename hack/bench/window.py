#!/usr/bin/env python3
"""Measure one fixed window for hack/bench/run.sh.

Usage: window.py SECONDS SPEC...
  dpdk:NAME:PREFIX:NPORTS  port counters of the dpdk-testpmd started with
                           --file-prefix=PREFIX, through its telemetry socket
  proc:NAME:PID            CPU time (utime+stime, all threads) of PID

Samples every SPEC, sleeps SECONDS, samples again, and prints one JSON
object with the growth over the window:
  {"seconds": S, "psi_avg10": P,
   "dpdk": {NAME: {"seconds": S_NAME, "ports": [{"ipackets": n, ...}, ...]}},
   "cpu":  {NAME: percent of one CPU}}
Each process gets its own window, timed at its replies (at least SECONDS
long), so the time a query takes does not bias the rate. psi_avg10 is the CPU
pressure ("some avg10", %) at the end of the window, or null.
"""
import json
import os
import socket
import sys
import time

KEYS = ("ipackets", "opackets", "ibytes", "obytes", "imissed", "ierrors", "oerrors", "rx_nombuf")


def telemetry(prefix, nports):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.settimeout(3)
    s.connect("/var/run/dpdk/%s/dpdk_telemetry.v2" % prefix)
    try:
        s.recv(1 << 16)  # greeting
        t, ports = None, []
        for i in range(nports):
            s.send(("/ethdev/stats,%d" % i).encode())
            st = json.loads(s.recv(1 << 22).decode())["/ethdev/stats"]
            if t is None:
                t = time.monotonic()
            ports.append({k: int(st.get(k) or 0) for k in KEYS})
        return t, ports
    finally:
        s.close()


def cputime(pid):
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    # fields[0] is field 3 (state): utime and stime are fields 14 and 15
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def psi():
    try:
        with open("/proc/pressure/cpu") as f:
            for line in f:
                if line.startswith("some "):
                    return float(line.split()[1].split("=")[1])
    except OSError:
        pass
    return None


def sample(specs):
    out = {}
    for kind, name, args in specs:
        if kind == "dpdk":
            out[kind, name] = telemetry(args[0], int(args[1]))
        else:
            out[kind, name] = (time.monotonic(), cputime(int(args[0])))
    return out


def main():
    secs = float(sys.argv[1])
    specs = []
    for a in sys.argv[2:]:
        kind, name, *args = a.split(":")
        if kind not in ("dpdk", "proc") or len(args) != (2 if kind == "dpdk" else 1):
            sys.exit("window.py: bad spec %r" % a)
        specs.append((kind, name, args))
    t0 = time.monotonic()
    s0 = sample(specs)
    # every process's window lasts at least SECONDS, however late its first
    # reply came (a starved testpmd can take a second to answer)
    time.sleep(max(0.0, max(v[0] for v in s0.values()) + secs - time.monotonic()))
    s1 = sample(specs)
    res = {"seconds": time.monotonic() - t0, "psi_avg10": psi(), "dpdk": {}, "cpu": {}}
    for kind, name, _ in specs:
        (ta, a), (tb, b) = s0[kind, name], s1[kind, name]
        if kind == "dpdk":
            res["dpdk"][name] = {
                "seconds": tb - ta,
                "ports": [{k: pb[k] - pa[k] for k in KEYS} for pa, pb in zip(a, b)],
            }
        else:
            res["cpu"][name] = 100.0 * (b - a) / (tb - ta)
    json.dump(res, sys.stdout)
    print()


if __name__ == "__main__":
    main()
