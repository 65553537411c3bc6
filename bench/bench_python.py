"""Binding overhead of mlakv.mla_decode on the CPU path: the median time of a Python call
minus the median time of the same C++ call repeated inside C++ (no binding in the loop), on
shapes small enough that the kernel itself is short. Target (issue 13): <= 10 us.
With --cuda (a CUDA build, torch with a GPU): the host time of one call that enqueues a decode,
mlakv.mla_decode (plans inside every call) against DecodePlan.run (planned once), on a shape
whose kernel is short; the stream is synchronised once after all calls, never inside them.
    PYTHONPATH=build/python python bench/bench_python.py [--cuda] [--json FILE]"""
import argparse
import json
import time

import numpy as np

import mlakv


def case(T, H, fmt="fp8_ds_mla"):
    rng = np.random.default_rng(0)
    cache = mlakv.PagedCache(num_blocks=(T + 63) // 64, block_size=64, formats=[fmt])
    seq = cache.add_sequence()
    cache.write(0, cache.append(seq, T), rng.standard_normal((T, 512), dtype=np.float32),
                rng.standard_normal((T, 64), dtype=np.float32))
    table, seqlens = cache.tables([seq])
    q = rng.standard_normal((1, 1, H, 576), dtype=np.float32)
    out = np.empty((1, 1, H, 512), np.float32)
    lse = np.empty((1, 1, H), np.float32)
    layer = cache.layer(0)
    return q, layer, table, seqlens, out, lse


def median_py(fn, iters):
    t = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        t.append(time.perf_counter() - t0)
    t.sort()
    return t[len(t) // 2]


def cuda_rows(iters):
    import torch
    rows = []
    for fmt, B, H, T in [("fp8_ds_mla", 1, 16, 64), ("nvfp4_ds_mla", 64, 16, 1024)]:
        rb = mlakv.record_bytes(fmt)
        nb = (T + 63) // 64
        kv = torch.zeros(B * nb, 64, rb, dtype=torch.uint8, device="cuda")
        layer = mlakv.cache_layer(kv, fmt)
        q = torch.randn(B, 1, H, 576, device="cuda")
        table = torch.arange(B * nb, dtype=torch.int32, device="cuda").view(B, nb)
        seqlens = torch.full((B,), T, dtype=torch.int32, device="cuda")
        out = torch.empty(B, 1, H, 512, device="cuda")
        lse = torch.empty(B, 1, H, device="cuda")
        plan = mlakv.DecodePlan(q, layer, table, seqlens, softmax_scale=0.1, out=out, lse=lse)
        ws = torch.empty(max(plan.workspace_bytes, 1), dtype=torch.uint8, device="cuda")
        stream = torch.cuda.current_stream().cuda_stream
        calls = {
            "mla_decode": lambda: mlakv.mla_decode(q, layer, table, seqlens, softmax_scale=0.1, out=out, lse=lse,
                                                   num_splits=plan.num_splits, workspace=ws, stream=stream),
            "DecodePlan.run": lambda: plan.run(q, layer, table, seqlens, out=out, lse=lse, workspace=ws,
                                               stream=stream),
        }
        for name, fn in calls.items():
            for _ in range(20):
                fn()
            torch.cuda.synchronize()
            host = median_py(fn, iters)
            torch.cuda.synchronize()
            rows.append({"call": name, "format": fmt, "batch": B, "heads": H, "tokens": T,
                         "splits": plan.num_splits, "path": plan.path, "host_us": host * 1e6})
    print(f"{'call':>15} {'format':>13} {'B':>3} {'H':>3} {'tokens':>6} {'splits':>6} {'path':>5} {'host us':>8}")
    for r in rows:
        print(f"{r['call']:>15} {r['format']:>13} {r['batch']:>3} {r['heads']:>3} {r['tokens']:>6} {r['splits']:>6} "
              f"{r['path']:>5} {r['host_us']:>8.2f}")
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--cuda", action="store_true")
    ap.add_argument("--json")
    a = ap.parse_args()
    if a.cuda:
        rows = cuda_rows(min(a.iters, 200))  # stay below the launch queue depth: no waiting inside a call
        if a.json:
            with open(a.json, "w") as f:
                json.dump(rows, f, indent=2)
        return
    mlakv.set_num_threads(1)
    rows = []
    for T, H in [(1, 1), (64, 16), (1024, 16)]:
        q, layer, table, seqlens, out, lse = case(T, H)
        call = lambda: mlakv.mla_decode(q, layer, table, seqlens, softmax_scale=0.1, out=out, lse=lse)
        for _ in range(50):
            call()
        py = median_py(call, a.iters)
        cpp = mlakv._core._cpp_decode_seconds(q, layer, table, seqlens, 0.1, out, lse, a.iters)
        rows.append({"tokens": T, "heads": H, "python_us": py * 1e6, "cpp_us": cpp * 1e6,
                     "overhead_us": (py - cpp) * 1e6})
    print(f"{'tokens':>7} {'heads':>5} {'python us':>10} {'C++ us':>8} {'overhead us':>12}")
    for r in rows:
        print(f"{r['tokens']:>7} {r['heads']:>5} {r['python_us']:>10.2f} {r['cpp_us']:>8.2f} {r['overhead_us']:>12.2f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
