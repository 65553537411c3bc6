#!/usr/bin/env python3
"""Times FlashMLA (deepseek-ai/FlashMLA at 9241ae3, built in place) on mlakv's bench_cuda shapes.

Method, the same as mlakv's bench/bench_cuda.cc so that the two can stand side by side:
CUDA events around one decode step (split-KV kernel + combine, i.e. one call of
flash_mla_with_kvcache), a 512 MiB fill flushes L2 before every repetition, warm-ups
first, median of --reps (the upper median, element n/2 of the sorted times, as mlakv).
After the flush a short GPU spin (torch.cuda._sleep) keeps the queue ahead of Python's
launch overhead, so the events time the kernels, not the host.

Counting (mlakv's convention):
  tokens  dense: B * ctx                 sparse: B * s_q * topk (attended index entries)
  FLOPs   2 * H * s_q * ctx * (576 + 512) per request (dense);
          2 * H * topk * (576 + 512) per query row (sparse)
  bytes   q (bf16) + attended records (1152 B bf16 / 656 B fp8_ds_mla) + out (bf16) + lse (f32);
          sparse rows also carry FlashMLA's own count (unique records only) as bytes_unique.

Caches: one bf16 cache of 128 x 32768 tokens (N(0,1) latents and rope), paged in 64-token
blocks; block tables are contiguous (request b owns blocks b*ctx/64 ..), as in mlakv. The
fp8 cache is that cache quantized by FlashMLA's own tests/quant.py (V32_FP8Sparse, 656 B).
Sparse indices are drawn uniformly with replacement from the request's own 32768-token
pool, independently for every query row (mlakv's scheme). "Dense-equivalent" fp8 rows run
the sparse kernel with topk = ctx over every token of the request (FlashMLA has no dense
fp8 decode); for H=16 they pad the heads to 64, the smallest the sparse kernel takes.

Each case is checked first: for two requests, out and lse against a float32 torch
reference over the (dequantized) cache. Ceilings are measured in the same process:
a 4 GiB device-to-device copy (read + write bytes) and a bf16 8192^3 matmul on random data.

usage: python3 bench_flashmla.py --flashmla DIR [--out flashmla.json]
                                           [--reps 30] [--warmup 5] [--only ceil,dense,sparse]
"""
import argparse
import json
import os
import platform
import subprocess
import sys
import time
import traceback

D_QK, D_V = 576, 512
BLOCK = 64
BF16_RECORD, FP8_RECORD = 1152, 656
FLUSH_BYTES = 512 << 20
SPIN_CYCLES = 100_000  # ~50 us at 1.98 GHz

# (B, H, s_q, ctx, why)
DENSE_CASES = [
    (64, 16, 1, 8192, "mlakv shape"),
    (64, 16, 1, 32768, "mlakv shape"),
    (64, 128, 2, 8192, "mlakv shape"),
    (128, 16, 1, 8192, "B=128 cross-check (earlier run: 3.85 TB/s)"),
    (128, 16, 1, 32768, "B=128 cross-check (earlier run: 4.19 TB/s)"),
    (128, 128, 1, 8192, "B=128 cross-check (earlier run: 636 TFLOP/s)"),
    (128, 128, 2, 8192, "B=128 of the mlakv s_q=2 shape"),
]
# (B, H, s_q, pool per request, topk, pad_from_H or None, why)
SPARSE_CASES = [
    (64, 128, 2, 32768, 2048, None, "mlakv shape"),
    (64, 64, 2, 32768, 2048, None, "mlakv shape at H=64"),
    (128, 128, 2, 32768, 2048, None, "B=128 cross-check (earlier run: 395 TFLOP/s, unique indices)"),
    (128, 64, 2, 32768, 2048, None, "B=128 cross-check (earlier run: 318 TFLOP/s, unique indices)"),
    (64, 128, 2, 8192, 8192, None, "fp8 dense-equivalent of the mlakv H=128 s_q=2 8K shape (topk = ctx)"),
    (64, 64, 1, 8192, 8192, 16, "fp8 dense-equivalent of the mlakv H=16 8K shape, heads padded 16->64"),
    (64, 64, 1, 32768, 32768, 16, "fp8 dense-equivalent of the mlakv H=16 32K shape, heads padded 16->64"),
    # The tensor-parallel shapes of issue 12 (H = 8 or 16 heads per GPU, s_q = 1, top-k 2048):
    # FlashMLA's Hopper sparse kernel takes 64 or 128 heads, so engines pad to 64; the time
    # is the same whether 8 or 16 heads are real.
    (1, 64, 1, 32768, 2048, 16, "TP shape B=1: H=8 or 16 padded to 64"),
    (8, 64, 1, 32768, 2048, 16, "TP shape B=8: H=8 or 16 padded to 64"),
    (64, 64, 1, 32768, 2048, 16, "TP shape B=64: H=8 or 16 padded to 64"),
]
POOL_TOKENS = 128 * 32768
CHUNK_BLOCKS = 8192  # 524288 tokens


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--flashmla", default=".ext/flashmla", help="FlashMLA source tree, built in place")
    ap.add_argument("--out", default="flashmla.json")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--only", default="ceil,dense,sparse")
    ap.add_argument("--seed", type=int, default=20261201)
    return ap.parse_args()


def read_text(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def nvidia_smi():
    try:
        return subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.draw,temperature.gpu",
             "--format=csv,noheader"], capture_output=True, text=True, timeout=20).stdout.strip()
    except Exception as e:  # noqa: BLE001 - informational only
        return f"unavailable: {e}"


class Timer:
    """CUDA-event timing with an L2 flush before each repetition (mlakv's method)."""

    def __init__(self, torch, reps, warmup):
        self.torch = torch
        self.reps = reps
        self.warmup = warmup
        self.flush_buf = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device="cuda")
        self.spin = hasattr(torch.cuda, "_sleep")

    def __call__(self, fn, flush=True):
        torch = self.torch
        for _ in range(self.warmup):
            fn()
        torch.cuda.synchronize()
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        ms = []
        for r in range(self.reps):
            if flush:
                self.flush_buf.fill_(r & 0xFF)
                if self.spin:
                    torch.cuda._sleep(SPIN_CYCLES)
            a.record()
            fn()
            b.record()
            b.synchronize()
            ms.append(a.elapsed_time(b))
        ms.sort()
        return {"median_ms": ms[len(ms) // 2], "min_ms": ms[0], "max_ms": ms[-1],
                "reps": self.reps, "warmup": self.warmup, "flush_l2": flush, "all_ms": [round(x, 5) for x in ms]}


def rel_l2(torch, a, ref):
    a = a.float()
    ref = ref.float()
    return float(torch.linalg.vector_norm(a - ref) / torch.linalg.vector_norm(ref).clamp_min(1e-30))


def reference(torch, q, k, scale, causal):
    """q [s_q, H, 576] , k [n, 576] float32 -> out [s_q, H, 512], lse [s_q, H] (natural log)."""
    s_q = q.shape[0]
    n = k.shape[0]
    scores = torch.einsum("shd,nd->shn", q.float(), k) * scale
    if causal and s_q > 1:
        pos = torch.arange(n, device=k.device)
        limit = n - s_q + 1 + torch.arange(s_q, device=k.device)  # query i sees its first n - s_q + i + 1 tokens
        scores = scores.masked_fill((pos[None, :] >= limit[:, None])[:, None, :], float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    out = torch.einsum("shn,nd->shd", torch.exp(scores - lse[..., None]), k[:, :D_V])
    return out, lse


def judge(rel_out, lse_err, finite):
    # bf16 output: rounding alone is ~2^-9 relative; 1e-2 leaves room for the fp32 accumulation order.
    return bool(finite and rel_out < 1e-2 and lse_err < 1e-2)


def flops_bytes_dense(B, H, s_q, ctx, record):
    flop = 2.0 * H * s_q * ctx * (D_QK + D_V) * B
    qo = B * s_q * H * (D_QK * 2 + D_V * 2 + 4)
    return flop, qo + B * ctx * record


def main():
    args = parse_args()
    t_start = time.time()
    res = {
        "tool": "shared/tools/flashmla-bench/bench_flashmla.py",
        "flashmla_commit": None, "cutlass_commit": None,
        "method": "CUDA events around one flash_mla_with_kvcache call (split-KV + combine); 512 MiB fill + "
                  "~50 us GPU spin before each rep; median (sorted[n//2]) of reps after warm-ups",
        "args": {k: v for k, v in vars(args).items() if k != "flashmla" and k != "out"},
        "errors": {}, "ceil": {}, "dense": [], "sparse": [], "section_seconds": {},
    }
    commits = (read_text(os.path.join(args.flashmla, ".flashmla-commit")) or "").split()
    if commits:
        res["flashmla_commit"] = commits[0]
        res["cutlass_commit"] = commits[1] if len(commits) > 1 else None

    def save():
        res["total_seconds"] = round(time.time() - t_start, 1)
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)

    import torch
    dev = torch.device("cuda:0")
    torch.cuda.set_device(dev)
    props = torch.cuda.get_device_properties(0)
    res["gpu"] = {
        "name": props.name, "sms": props.multi_processor_count, "cc": f"{props.major}.{props.minor}",
        "mem_GiB": round(props.total_memory / 2**30, 1),
        "l2_MB": round(getattr(props, "L2_cache_size", 0) / 1e6, 1),
        "torch": torch.__version__, "torch_cuda": torch.version.cuda,
        "python": platform.python_version(), "nvidia_smi_start": nvidia_smi(),
    }
    only = set(args.only.split(","))
    timer = Timer(torch, args.reps, args.warmup)
    gen = torch.Generator(device=dev)
    gen.manual_seed(args.seed)

    # ---- ceilings ------------------------------------------------------------------
    if "ceil" in only:
        t0 = time.time()
        try:
            nbytes = 4 << 30
            a = torch.empty(nbytes, dtype=torch.uint8, device=dev).fill_(1)
            b = torch.empty_like(a)
            t = timer(lambda: b.copy_(a), flush=False)
            res["ceil"]["hbm_copy"] = {"bytes_each_way": nbytes, "time": t,
                                       "TBps_read_plus_write": 2 * nbytes / (t["median_ms"] * 1e-3) / 1e12}
            del a, b
            n = 8192
            A = torch.randn(n, n, dtype=torch.bfloat16, device=dev, generator=gen)
            Bm = torch.randn(n, n, dtype=torch.bfloat16, device=dev, generator=gen)
            C = torch.empty(n, n, dtype=torch.bfloat16, device=dev)
            t = timer(lambda: torch.matmul(A, Bm, out=C), flush=False)
            res["ceil"]["bf16_matmul"] = {"n": n, "data": "randn", "time": t,
                                          "TFLOPS": 2 * n**3 / (t["median_ms"] * 1e-3) / 1e12}
            del A, Bm, C
            torch.cuda.empty_cache()
        except Exception:  # noqa: BLE001 - record and go on
            res["errors"]["ceil"] = traceback.format_exc()
        res["section_seconds"]["ceil"] = round(time.time() - t0, 1)
        save()
        print(f"ceilings: copy {res['ceil'].get('hbm_copy', {}).get('TBps_read_plus_write', float('nan')):.3f} TB/s, "
              f"bf16 matmul {res['ceil'].get('bf16_matmul', {}).get('TFLOPS', float('nan')):.1f} TFLOP/s", flush=True)
    copy_tbps = res["ceil"].get("hbm_copy", {}).get("TBps_read_plus_write")
    mm_tflops = res["ceil"].get("bf16_matmul", {}).get("TFLOPS")

    def fractions(row):
        row["frac_copy"] = row["TBps"] / copy_tbps if copy_tbps else None
        row["frac_matmul"] = row["TFLOPS"] / mm_tflops if mm_tflops else None

    # ---- FlashMLA --------------------------------------------------------------------
    try:
        sys.path.insert(0, os.path.abspath(args.flashmla))
        import flash_mla  # noqa: E402
        import importlib.util
        spec = importlib.util.spec_from_file_location("flashmla_tests_quant",
                                                      os.path.join(args.flashmla, "tests", "quant.py"))
        quant = importlib.util.module_from_spec(spec)  # FlashMLA's tests/quant.py: the fp8_ds_mla ground truth
        spec.loader.exec_module(quant)
    except Exception:  # noqa: BLE001
        res["errors"]["import"] = traceback.format_exc()
        save()
        print(res["errors"]["import"], file=sys.stderr)
        return 1

    scale = D_QK ** -0.5
    t0 = time.time()
    try:
        kv = torch.empty(POOL_TOKENS // BLOCK, BLOCK, 1, D_QK, dtype=torch.bfloat16, device=dev)
        for chunk in kv.split(CHUNK_BLOCKS):  # N(0, 1), in chunks of well under 2^31 elements
            chunk.normal_(generator=gen)
    except Exception:  # noqa: BLE001
        res["errors"]["alloc"] = traceback.format_exc()
        save()
        return 1
    res["section_seconds"]["make_bf16_cache"] = round(time.time() - t0, 1)

    def table(B, ctx):
        nb = ctx // BLOCK
        return torch.arange(B * nb, dtype=torch.int32, device=dev).view(B, nb)

    print(f"{'case':<12} {'B':>4} {'H':>4} {'s_q':>3} {'ctx':>6} {'topk':>6} {'ms':>9} {'tokens/s':>10} "
          f"{'TB/s':>6} {'TFLOP/s':>8} {'%copy':>6} {'%mm':>6} check", flush=True)

    def show(kind, r):
        print(f"{kind:<12} {r['b']:>4} {r['h_q']:>4} {r['s_q']:>3} {r['ctx']:>6} {r.get('topk', 0):>6} "
              f"{r['time']['median_ms']:>9.4f} {r['tokens_per_s']:>10.4g} {r['TBps']:>6.3f} {r['TFLOPS']:>8.1f} "
              f"{100 * (r['frac_copy'] or 0):>5.1f}% {100 * (r['frac_matmul'] or 0):>5.1f}% "
              f"{'ok' if r['check']['ok'] else 'FAIL'} (rel {r['check']['rel_out_max']:.1e}, lse {r['check']['lse_abs_max']:.1e})",
              flush=True)

    # ---- dense bf16 ------------------------------------------------------------------
    if "dense" in only:
        t0 = time.time()
        for (B, H, s_q, ctx, why) in DENSE_CASES:
            key = f"dense_b{B}_h{H}_sq{s_q}_ctx{ctx}"
            try:
                q = torch.randn(B, s_q, H, D_QK, dtype=torch.bfloat16, device=dev, generator=gen)
                bt = table(B, ctx)
                lens = torch.full((B,), ctx, dtype=torch.int32, device=dev)
                sched, _ = flash_mla.get_mla_metadata()

                def fn():
                    return flash_mla.flash_mla_with_kvcache(q, kv, bt, lens, D_V, sched, None,
                                                            softmax_scale=scale, causal=True)
                out, lse = fn()
                torch.cuda.synchronize()
                rels, lses, finite = [], [], bool(torch.isfinite(out).all() and torch.isfinite(lse).all())
                for b in (0, B - 1):
                    k = kv[bt[b].long()].view(-1, D_QK)[:ctx].float()
                    ro, rl = reference(torch, q[b], k, scale, True)
                    rels.append(rel_l2(torch, out[b], ro))
                    lses.append(float((lse[b].T - rl).abs().max()))
                del out, lse
                t = timer(fn)
                flop, nbytes = flops_bytes_dense(B, H, s_q, ctx, BF16_RECORD)
                sec = t["median_ms"] * 1e-3
                row = {"kind": "dense_bf16", "why": why, "b": B, "h_q": H, "s_q": s_q, "ctx": ctx, "causal": True,
                       "record_bytes": BF16_RECORD, "tokens": B * ctx, "flop": flop, "bytes": nbytes, "time": t,
                       "tokens_per_s": B * ctx / sec, "TBps": nbytes / sec / 1e12, "TFLOPS": flop / sec / 1e12,
                       "check": {"requests": [0, B - 1], "rel_out_max": max(rels), "lse_abs_max": max(lses),
                                 "finite": finite, "ok": judge(max(rels), max(lses), finite)}}
                fractions(row)
                res["dense"].append(row)
                show("dense_bf16", row)
                del q
            except Exception:  # noqa: BLE001
                res["errors"][key] = traceback.format_exc()
                print(f"{key}: FAILED\n{res['errors'][key]}", file=sys.stderr, flush=True)
            save()
        res["section_seconds"]["dense"] = round(time.time() - t0, 1)

    # ---- sparse fp8 (656 B) ----------------------------------------------------------
    if "sparse" in only:
        t0 = time.time()
        try:
            # Contiguous [blocks, 64, 1, 656] records (block stride 64 * 656, as mlakv's pages), written
            # chunk by chunk by FlashMLA's own quantizer.
            kv8_u8 = torch.empty(POOL_TOKENS // BLOCK, BLOCK, 1, FP8_RECORD, dtype=torch.uint8, device=dev)
            for dst, src in zip(kv8_u8.split(CHUNK_BLOCKS), kv.split(CHUNK_BLOCKS)):
                dst.copy_(quant.quantize_k_cache(src, quant.FP8KVCacheLayout.V32_FP8Sparse).view(torch.uint8))
            kv8 = kv8_u8.view(torch.float8_e4m3fn)
            res["section_seconds"]["quantize_fp8_cache"] = round(time.time() - t0, 1)
        except Exception:  # noqa: BLE001
            res["errors"]["quantize"] = traceback.format_exc()
            kv8 = None
        if kv8 is not None:
            del kv
            torch.cuda.empty_cache()
        for (B, H, s_q, pool, topk, pad_from, why) in (SPARSE_CASES if kv8 is not None else []):
            key = f"sparse_b{B}_h{H}_sq{s_q}_pool{pool}_topk{topk}"
            try:
                q = torch.randn(B, s_q, H, D_QK, dtype=torch.bfloat16, device=dev, generator=gen)
                base = (torch.arange(B, dtype=torch.int32, device=dev) * pool).view(B, 1, 1)
                if topk == pool:  # dense-equivalent: every token of the request, in order
                    idx = base + torch.arange(pool, dtype=torch.int32, device=dev).view(1, 1, pool).expand(B, s_q, pool)
                else:
                    idx = base + torch.randint(0, pool, (B, s_q, topk), dtype=torch.int32, device=dev, generator=gen)
                idx = idx.contiguous()
                sched, _ = flash_mla.get_mla_metadata()

                def fn():
                    return flash_mla.flash_mla_with_kvcache(q, kv8, None, None, D_V, sched, None,
                                                            softmax_scale=scale, causal=False, is_fp8_kvcache=True,
                                                            indices=idx)
                out, lse = fn()
                torch.cuda.synchronize()
                rels, lses, finite = [], [], bool(torch.isfinite(out).all() and torch.isfinite(lse).all())
                for b in (0, B - 1):
                    ib = idx[b].long()  # [s_q, topk]
                    recs = kv8_u8[ib // BLOCK, ib % BLOCK, 0, :].contiguous()  # [s_q, topk, 656]
                    kd = quant.dequantize_k_cache(recs.view(torch.float8_e4m3fn).view(s_q, topk, 1, FP8_RECORD),
                                                  quant.FP8KVCacheLayout.V32_FP8Sparse).view(s_q, topk, D_QK).float()
                    for i in range(s_q):
                        ro, rl = reference(torch, q[b, i:i + 1], kd[i], scale, False)
                        rels.append(rel_l2(torch, out[b, i:i + 1], ro))
                        lses.append(float((lse[b][:, i] - rl[0]).abs().max()))
                del out, lse
                t = timer(fn)
                sec = t["median_ms"] * 1e-3
                tokens = B * s_q * topk
                flop = 2.0 * H * tokens * (D_QK + D_V)
                qo = B * s_q * H * (D_QK * 2 + D_V * 2 + 4)
                unique = int(torch.unique(idx).numel())
                row = {"kind": "sparse_fp8", "why": why, "b": B, "h_q": H, "s_q": s_q, "ctx": pool, "topk": topk,
                       "pad_heads_from": pad_from, "record_bytes": FP8_RECORD,
                       "indices": "all tokens in order" if topk == pool else "uniform with replacement, per query row",
                       "tokens": tokens, "unique_tokens": unique, "flop": flop, "bytes": qo + tokens * FP8_RECORD,
                       "bytes_unique": qo + unique * FP8_RECORD, "time": t,
                       "tokens_per_s": tokens / sec, "TBps": (qo + tokens * FP8_RECORD) / sec / 1e12,
                       "TFLOPS": flop / sec / 1e12,
                       "check": {"requests": [0, B - 1], "rel_out_max": max(rels), "lse_abs_max": max(lses),
                                 "finite": finite, "ok": judge(max(rels), max(lses), finite)}}
                fractions(row)
                res["sparse"].append(row)
                show("sparse_fp8", row)
                del q, idx
            except Exception:  # noqa: BLE001
                res["errors"][key] = traceback.format_exc()
                print(f"{key}: FAILED\n{res['errors'][key]}", file=sys.stderr, flush=True)
            save()
        res["section_seconds"]["sparse"] = round(time.time() - t0, 1)

    res["gpu"]["nvidia_smi_end"] = nvidia_smi()
    save()
    bad = [r for r in res["dense"] + res["sparse"] if not r["check"]["ok"]]
    print(f"flashmla: {len(res['dense'])} dense + {len(res['sparse'])} sparse cases, {len(bad)} failed checks, "
          f"{len(res['errors'])} errors, {res['total_seconds']} s", flush=True)
    return 1 if (bad or res["errors"]) else 0


if __name__ == "__main__":
    sys.exit(main())
