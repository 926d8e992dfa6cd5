#!/usr/bin/env python3
"""Summarise hack/bench/run.sh's raw.tsv: one row per configuration.

Usage: summary.py [--meta meta.txt] [--md OUT.md] raw.tsv

Per configuration: the median Mpps of each backend over its successful
runs; the ratio vhostmq/dpdk of every trial in which both ran (the two
runs of a trial are back to back, so a ratio is what survives the
machine's drift) with its median, min and max; the median CPU share each
backend process got (% of one CPU, utime+stime over the window: a poller
below 100 % was preempted); vhostmq's busy share (worker time spent moving
frames, % of one CPU); the median CPU pressure (PSI some avg10).
Plain text on stdout, a markdown table in --md.
"""
import csv
import statistics
import sys

from benchstats import f, med, num


def main():
    args = sys.argv[1:]
    meta, md = {}, None
    while args and args[0].startswith("--"):
        if args[0] == "--meta":
            with open(args[1]) as fh:
                for line in fh:
                    k, _, v = line.rstrip("\n").partition(" ")
                    meta[k] = v
        elif args[0] == "--md":
            md = args[1]
        else:
            sys.exit("summary.py: unknown flag %s" % args[0])
        args = args[2:]
    with open(args[0]) as fh:
        rows = list(csv.DictReader(fh, delimiter="\t"))

    configs, backends = [], []
    for r in rows:
        if r["config"] not in configs:
            configs.append(r["config"])
        if r["backend"] not in backends:
            backends.append(r["backend"])
    backends.sort(key=lambda b: {"dpdk": 0, "vhostmq": 1}.get(b, 2))
    ok = [r for r in rows if r["status"] == "ok"]

    table, by_topo = [], {}
    for c in configs:
        rs = [r for r in ok if r["config"] == c]
        row = {"config": c, "runs": len([r for r in rows if r["config"] == c]), "ok": len(rs)}
        for b in backends:
            mine = [r for r in rs if r["backend"] == b]
            row["mpps", b] = med(num(r["mpps"]) for r in mine)
            row["cpu", b] = med(num(r["cpu_pct"]) for r in mine)
        row["busy"] = med(num(r["busy_pct"]) for r in rs if r["backend"] == "vhostmq")
        row["psi"] = med(num(r["psi_some_avg10"]) for r in rs)
        ratios = []
        trials = {r["trial"] for r in rs}
        for t in sorted(trials, key=int):
            d = [num(r["mpps"]) for r in rs if r["trial"] == t and r["backend"] == "dpdk"]
            v = [num(r["mpps"]) for r in rs if r["trial"] == t and r["backend"] == "vhostmq"]
            if d and v and d[0] and v[0] is not None:
                ratios.append(v[0] / d[0])
        row["ratios"] = ratios
        row["trials"] = len({r["trial"] for r in rows if r["config"] == c})
        if ratios:
            by_topo.setdefault(c.split("-")[0], []).append(statistics.median(ratios))
        table.append(row)

    trials = meta.get("trials", "?")
    head = "vhostmq vs DPDK 22.11 vhost, DPDK virtio-user traffic, %s interleaved trial(s) of %s s after %s s warm-up" % (
        trials, meta.get("window_s", "?"), meta.get("warmup_s", "?"))
    cols = ["config", "DPDK Mpps", "vhostmq Mpps", "ratio med/ min/ max", "pairs", "CPU% DPDK/vmq", "busy%", "PSI%"]
    lines = []
    for row in table:
        rt = row["ratios"]
        lines.append([
            row["config"],
            f(row.get(("mpps", "dpdk"))),
            f(row.get(("mpps", "vhostmq"))),
            "%s/%s/%s" % (f(med(rt)), f(min(rt) if rt else None), f(max(rt) if rt else None)),
            "%d/%d" % (len(rt), row["trials"]),
            "%s/%s" % (f(row.get(("cpu", "dpdk")), "%.0f"), f(row.get(("cpu", "vhostmq")), "%.0f")),
            f(row["busy"], "%.0f"),
            f(row["psi"], "%.1f"),
        ])
    w = [max(len(cols[i]), *(len(l[i]) for l in lines)) if lines else len(cols[i]) for i in range(len(cols))]

    def fmt(l):
        return "  ".join(x.ljust(w[i]) if i == 0 else x.rjust(w[i]) for i, x in enumerate(l))

    width = len(fmt(cols))
    bar = "_" * width
    title = " %s " % head
    pad = max(4, width - len(title))
    print("_" * (pad // 2) + title + "_" * (pad - pad // 2))
    print(fmt(cols))
    print(bar)
    for l in lines:
        print(fmt(l))
    print(bar)
    fails = len(rows) - len(ok)
    psis = sorted(x for x in (num(r["psi_some_avg10"]) for r in rows) if x is not None)
    tail = "median ratio vhostmq/DPDK by topology: " + (
        ", ".join("%s %.2f" % (t, statistics.median(v)) for t, v in by_topo.items()) or "-")
    tail += "; failed runs: %d of %d" % (fails, len(rows))
    if psis:
        tail += "; CPU PSI some avg10 min/median/max %.1f/%.1f/%.1f %%" % (psis[0], statistics.median(psis), psis[-1])
    gcs = [(num(r.get("gc_cycles")), num(r.get("mallocs_per_frame"))) for r in ok if r["backend"] == "vhostmq"]
    gcs = [g for g in gcs if g[0] is not None]
    if gcs:
        tail += ("\nvhostmq Go runtime in the windows (its /metrics before and after): GC cycles max %d, "
                 "%d of %d windows without one; heap allocations per forwarded frame max %s "
                 "(the stats call and the scrapes included)") % (
            max(g[0] for g in gcs), sum(1 for g in gcs if g[0] == 0), len(gcs),
            f(max((g[1] for g in gcs if g[1] is not None), default=None), "%.6f"))
    print(tail)
    print("h2g: DPDK = txonly on its vhost port (pure enqueue); vhostmq = port->port b->a through the switch "
          "(it cannot originate frames): not like for like, see p2p1.")
    print("rates: frontend (virtio-user) counters; CPU%%: the backend process's share of one CPU in the window; "
          "busy%%: vhostmq worker time moving frames. Machine: %s, %s." % (meta.get("cpu", "?"), meta.get("kernel", "?")))

    if md:
        with open(md, "w") as fh:
            fh.write("%s.\n\n" % head)
            fh.write("| " + " | ".join(cols) + " |\n")
            fh.write("|" + "|".join("---" if i == 0 else "---:" for i in range(len(cols))) + "|\n")
            for l in lines:
                fh.write("| " + " | ".join(l) + " |\n")
            fh.write("\n%s\n" % tail)


if __name__ == "__main__":
    main()
