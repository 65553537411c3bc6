#!/usr/bin/env python3
"""The part chain of one sm90_nat CTA, from a -DMLAKV_NAT_TRACE build's NATTRACE lines.

A trace build (kernel_nat.cuh; e.g. `tools/gpu_variants.sh build DIR trace "-DMLAKV_NAT_TRACE"`)
prints, at each format's 12th launch, clock64 stamps of CTA (0, 0, 0) to stderr:

    NATTRACE <format> <sparse> <tile> <part> <event> <cycles>

with part 0 = rope, 1 = left V half, 2 = right, and event 0 = the part's load issued (sparse:
its gathers started), 1 = staged, 2 = converted, 4 / 5 = its full barrier seen by warpgroup
0 / 1, 6 / 7 = released by warpgroup 0 / 1. For each tile of the window this prints, per
part, the cycles from the release of the same part of tile t - 2 (the buffer's previous use)
to the load's issue, the load (issue -> staged), the conversion, and from the conversion to
each warpgroup's wait ending: a wait that ends ~150 cycles after the conversion means the
consumer was already waiting for it. Also the step period (tile t's rope seen by warpgroup 0,
t -> t + 2).

    tools/nat_trace.py LOG [--format N] [--sparse 0|1] [--tiles A:B]
"""
import argparse
import collections
import sys

PARTS = {0: "rope", 1: "L", 2: "R"}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("log")
    ap.add_argument("--format", type=int, help="the KvFormat value (default: every format in the log)")
    ap.add_argument("--sparse", type=int, choices=(0, 1), help="dense (0) or sparse (1) launches only")
    ap.add_argument("--tiles", default="10:16", help="tile window A:B (default 10:16, a steady state)")
    a = ap.parse_args()
    lo, hi = (int(x) for x in a.tiles.split(":"))
    ev = collections.defaultdict(dict)
    with open(a.log) as f:
        for line in f:
            w = line.split()
            if len(w) != 7 or w[0] != "NATTRACE":
                continue
            fmt, sp, t, part, e, c = (int(x) for x in w[1:])
            if (a.format is not None and fmt != a.format) or (a.sparse is not None and sp != a.sparse):
                continue
            ev[(fmt, sp)].setdefault((t, part), {})[e] = c
    if not ev:
        sys.exit(f"error: no NATTRACE lines in {a.log} (a -DMLAKV_NAT_TRACE build's stderr)")

    def gap(x, y):
        return "-" if x is None or y is None else str(y - x)

    for (fmt, sp), d in sorted(ev.items()):
        print(f"== format {fmt} {'sparse' if sp else 'dense'}: cycles")
        print("tile part | release(t-2)->issued  issued->staged  staged->converted  converted->wg0 wg1")
        for t in range(lo, hi):
            for part in range(3):
                e = d.get((t, part), {})
                prev = d.get((t - 2, part), {})
                rel = max((prev[x] for x in (6, 7) if x in prev), default=None)
                print(f"{t:4d} {PARTS[part]:4s} | {gap(rel, e.get(0)):>9s} {gap(e.get(0), e.get(1)):>9s} "
                      f"{gap(e.get(1), e.get(2)):>9s} {gap(e.get(2), e.get(4)):>9s} {gap(e.get(2), e.get(5)):>6s}")
        steps = [d[(t + 2, 0)][4] - d[(t, 0)][4] for t in range(lo, hi, 2)
                 if 4 in d.get((t, 0), {}) and 4 in d.get((t + 2, 0), {})]
        if steps:
            print(f"step period (two tiles): {min(steps)}-{max(steps)} cycles")


if __name__ == "__main__":
    main()
