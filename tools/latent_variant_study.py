#!/usr/bin/env python3
"""Variants of an mlakv_latent_transform_v2 (or v1) file for recipe studies (docs/quality.md "Past 0.60").

Two subcommands, both writing ordinary transform files that `mlakv eval --scales` reads:

  scale IN OUT M        every layer's outer_scale multiplied by M (> 0); the audit fields
                        seed_search is dropped (it no longer describes the file)
  greedy START CANDS... --out OUT --mlakv BIN --model DIR --text CALIB [--windows 4]
                        a per-layer selection by calibration KLD: for layer 0, 1, ... the layer's
                        entry of START (the current file) or of one candidate file, whichever
                        gives the lowest `mlakv eval` KLD mean in --format on the --text windows
                        (ties to the current); later layers are chosen with the earlier choices
                        in place. A layer's entry (mu, d, signs, outer_scale) is self-contained,
                        so the spliced file is what a per-layer selection would write.

Only ever give calibration text to `greedy`: it selects on what it measures.
"""
import argparse
import copy
import json
import os
import subprocess
import sys
import tempfile

FORMAT = "mlakv_latent_transform_v2"
FORMATS = ("mlakv_latent_transform_v2", "mlakv_latent_transform_v1")  # v1 (no nvfp4_scales) reads as "rn"


def load(path):
    with open(path) as f:
        j = json.load(f)
    if j.get("format") not in FORMATS:
        sys.exit(f"error: {path}: not a {' or '.join(FORMATS)} file")
    j.pop("seed_search", None)
    return j


def write(j, path):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(j, f, indent=1)
    os.replace(tmp, path)


def cmd_scale(a):
    if not a.multiple > 0:
        sys.exit("error: the multiple must be > 0")
    j = load(a.input)
    for layer in j["layers"]:
        layer["outer_scale"] = layer["outer_scale"] * a.multiple
    write(j, a.output)


def eval_klds(a, files):
    args = [a.mlakv, "eval", "--model", a.model, "--text", a.text, "--context", str(a.context),
            "--windows", str(a.windows), "--formats", a.format, "--json"]
    for p in files:
        args += ["--scales", p]
    r = subprocess.run(args, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"error: mlakv eval failed: {r.stderr.strip()}")
    rows = {row["scales"]: row["kld_mean"] for row in json.loads(r.stdout)["formats"] if row["recipe"] == "mlakv"}
    return [rows[os.path.basename(p)] for p in files]


def cmd_greedy(a):
    cur = load(a.start)
    cands = [load(c) for c in a.candidates]
    n = len(cur["layers"])
    for c, path in zip(cands, a.candidates):
        if len(c["layers"]) != n:
            sys.exit(f"error: {path} has {len(c['layers'])} layers, {a.start} has {n}")
    layers = range(n) if a.layers is None else [int(x) for x in a.layers.split(",")]
    with tempfile.TemporaryDirectory() as wd:
        for l in layers:
            if not 0 <= l < n:
                sys.exit(f"error: layer {l} is not in [0, {n})")
            files = []
            for k, c in enumerate([None] + cands):
                j = copy.deepcopy(cur)
                if c is not None:
                    j["layers"][l] = copy.deepcopy(c["layers"][l])
                p = os.path.join(wd, f"layer{l}_cand{k}.json")
                write(j, p)
                files.append(p)
            v = eval_klds(a, files)
            best = min(range(len(v)), key=lambda i: (v[i], i))
            print(f"layer {l}: KLD mean current {v[0]:.6g}, candidates "
                  + ", ".join(f"{x:.6g}" for x in v[1:]) + f" -> {'current' if best == 0 else a.candidates[best - 1]}")
            if best > 0:
                cur["layers"][l] = copy.deepcopy(cands[best - 1]["layers"][l])
    write(cur, a.out)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("scale")
    s.add_argument("input")
    s.add_argument("output")
    s.add_argument("multiple", type=float)
    g = sub.add_parser("greedy")
    g.add_argument("start")
    g.add_argument("candidates", nargs="+")
    g.add_argument("--out", required=True)
    g.add_argument("--mlakv", required=True, help="the mlakv binary")
    g.add_argument("--model", required=True)
    g.add_argument("--text", required=True, help="CALIBRATION text")
    g.add_argument("--context", type=int, default=2048)
    g.add_argument("--windows", type=int, default=4)
    g.add_argument("--format", default="nvfp4_ds_mla")
    g.add_argument("--layers", help="comma-separated layers to choose (default: all, in order)")
    a = ap.parse_args()
    cmd_scale(a) if a.cmd == "scale" else cmd_greedy(a)


if __name__ == "__main__":
    main()
