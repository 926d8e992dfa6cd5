#!/usr/bin/env python3
"""Summarise hack/bench/flows.sh's raw.tsv as a flows x queue-pairs table.

Usage: flows_table.py [--meta meta.txt] [--md OUT.md] raw.tsv

Per flow count and queue-pair count: the median aggregate Mpps at the sink
over the successful runs. Per flow count and Q > 1: the gain over one
queue pair, computed per trial (the Q values of one flow count run back to
back, so a trial's ratio is what survives the machine's drift) and
reported as the median over the trials with min and max; the sink RX
queues that carried >= 1 % of the frames (median); the median CPU pressure
(PSI some avg10) of the flow count's runs. The bottom line is the mean of
the median gains over the flow counts, as the 2011 tables
(../shared/seeds/) end with. Plain text in the seeds' layout on stdout, a
markdown table in --md.
"""
import csv
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
            sys.exit("flows_table.py: unknown flag %s" % args[0])
        args = args[2:]
    if len(args) != 1:
        sys.exit(__doc__)
    with open(args[0]) as fh:
        rows = list(csv.DictReader(fh, delimiter="\t"))

    flows, queues, sizes = [], [], set()
    runs = {}  # (flows, q) -> [row]
    by_trial = {}  # (trial, flows, q) -> mpps
    for r in rows:
        fl, q = int(r["flows"]), int(r["queues"])
        sizes.add(r["size"])
        if fl not in flows:
            flows.append(fl)
        if q not in queues:
            queues.append(q)
        runs.setdefault((fl, q), []).append(r)
        if r["status"] == "ok" and num(r["mpps"]) is not None:
            by_trial[r["trial"], fl, q] = num(r["mpps"])
    flows.sort()
    queues.sort()
    base = queues[0]
    trials = sorted({r["trial"] for r in rows}, key=int)

    def ok(fl, q):
        return [r for r in runs.get((fl, q), []) if r["status"] == "ok"]

    def gains(fl, q):
        out = []
        for t in trials:
            a, b = by_trial.get((t, fl, base)), by_trial.get((t, fl, q))
            if a and b is not None:
                out.append(100.0 * (b / a - 1.0))
        return out

    table = []
    for fl in flows:
        row = {"flows": fl, "cells": {}, "psi": med(num(r["psi_some_avg10"]) for q in queues for r in ok(fl, q))}
        for q in queues:
            g = gains(fl, q) if q != base else []
            row["cells"][q] = {
                "mpps": med(num(r["mpps"]) for r in ok(fl, q)),
                "switched": med(num(r["switched_mpps"]) for r in ok(fl, q)),
                "n": len(ok(fl, q)),
                "runs": len(runs.get((fl, q), [])),
                "gain": med(g) if g else None,
                "gmin": min(g) if g else None,
                "gmax": max(g) if g else None,
                "rxq": med(num(r["sink_rxq"]) for r in ok(fl, q)),
                "flood": max((num(r["flood_pps"]) or 0 for r in ok(fl, q)), default=None),
                "nobuf": med(num(r["rx_no_buffer_pps"]) for r in ok(fl, q)),
                "cpu": (med(num(r["gen_cpu_pct"]) for r in ok(fl, q)), med(num(r["sink_cpu_pct"]) for r in ok(fl, q)),
                        med(num(r["dp_cpu_pct"]) for r in ok(fl, q))),
            }
        table.append(row)
    avg = {}
    for q in queues[1:]:
        gs = [row["cells"][q]["gain"] for row in table if row["cells"][q]["gain"] is not None]
        avg[q] = sum(gs) / len(gs) if gs else None

    size = "/".join(sorted(sizes))
    title = " %s B frames, median of %d trial(s), aggregate Mpps at the sink " % (size, len(trials))
    out = []
    out.append(title.center(78, "_"))
    head = "%-8s" % "#flows"
    for q in queues:
        head += "%12s" % ("Mpps q%d" % q)
        if q != base:
            head += "%10s" % ("gain%% q%d" % q)
    head += "%10s%8s" % ("rxq hit", "PSI%")
    out.append(head)
    out.append("_" * 78)
    for row in table:
        line = "%-8d" % row["flows"]
        for q in queues:
            c = row["cells"][q]
            line += "%12s" % f(c["mpps"], "%.3f")
            if q != base:
                line += "%10s" % f(c["gain"], "%.1f")
        line += "%10s" % "/".join(f(row["cells"][q]["rxq"], "%g") for q in queues)
        line += "%8s" % f(row["psi"], "%.0f")
        out.append(line)
    out.append("_" * 78)
    out.append("mean gain over q%d: %s" % (base, ",  ".join("q%d %s%%" % (q, f(avg[q], "%.1f")) for q in queues[1:])))
    out.append("")
    out.append("per cell: runs ok/total, Mpps the switch took from the generator, gain min..max,")
    out.append("  CPU % of one CPU (generator/sink/dataplane), sink RX ring full (drops/s), max flood/s")
    for row in table:
        for q in queues:
            c = row["cells"][q]
            out.append("  f%-4d q%d  %d/%d  switched %s  gain %s..%s  cpu %s/%s/%s  no_buffer %s  flood %s" % (
                row["flows"], q, c["n"], c["runs"], f(c["switched"], "%.3f"), f(c["gmin"], "%.1f"), f(c["gmax"], "%.1f"),
                f(c["cpu"][0], "%.0f"), f(c["cpu"][1], "%.0f"), f(c["cpu"][2], "%.0f"),
                f(c["nobuf"], "%.0f"), f(c["flood"], "%.0f")))
    for k in ("command", "started_utc", "finished_utc", "git", "cpus", "vhostmq_polling", "mem", "psi_cpu_at_start"):
        if k in meta:
            out.append("%s: %s" % (k, meta[k]))
    print("\n".join(out))

    if md:
        h = "| flows |"
        sep = "|---:|"
        for q in queues:
            h += " %d qp Mpps |" % q
            sep += "---:|"
            if q != base:
                h += " %d qp gain (min..max) |" % q
                sep += "---:|"
        h += " sink RX queues hit (%s qp) | CPU PSI |" % "/".join(str(q) for q in queues)
        sep += "---:|---:|"
        lines = [h, sep]
        for row in table:
            line = "| %d |" % row["flows"]
            for q in queues:
                c = row["cells"][q]
                line += " %s |" % f(c["mpps"], "%.3f")
                if q != base:
                    line += " %s %% (%s..%s) |" % (f(c["gain"], "%+.0f"), f(c["gmin"], "%+.0f"), f(c["gmax"], "%+.0f"))
            line += " %s |" % "/".join(f(row["cells"][q]["rxq"], "%g") for q in queues)
            line += " %s %% |" % f(row["psi"], "%.0f")
            lines.append(line)
        line = "| mean gain |"
        for q in queues:
            line += " |"
            if q != base:
                line += " %s %% |" % f(avg[q], "%+.0f")
        lines.append(line + " | |")
        # the switch's side: what it took from the generator, and what of
        # it found the sink's RX ring full
        lines += ["", "| flows |" + "".join(" %d qp switched Mpps | %d qp sink ring full, Mpps |" % (q, q) for q in queues)
                  + " CPU %% gen/sink/dataplane (%s qp) |" % "; ".join(str(q) for q in queues),
                  "|---:|" + "---:|---:|" * len(queues) + "---|"]
        for row in table:
            line = "| %d |" % row["flows"]
            for q in queues:
                c = row["cells"][q]
                line += " %s | %s |" % (f(c["switched"], "%.3f"), f(None if c["nobuf"] is None else c["nobuf"] / 1e6, "%.3f"))
            line += " %s |" % "; ".join("/".join(f(x, "%.0f") for x in row["cells"][q]["cpu"]) for q in queues)
            lines.append(line)
        with open(md, "w") as fh:
            fh.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
