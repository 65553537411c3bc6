#!/usr/bin/env python3
"""Runs FlashMLA's dense bf16 decode on one shape a few times, for Nsight Compute:
    ncu --set full -k regex:flash_fwd_splitkv_mla --launch-skip 2 --launch-count 1 \\
        python3 tools/flashmla-bench/ncu_dense.py --flashmla .ext/flashmla
Shape (default: issue 12's compute-bound one): B=64, H=128, s_q=2, 8K context, 64-token
pages, contiguous block tables, N(0, 1) cache and q, causal (as bench_flashmla.py)."""
import argparse
import sys

ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
ap.add_argument("--flashmla", default=".ext/flashmla")
ap.add_argument("--b", type=int, default=64)
ap.add_argument("--h", type=int, default=128)
ap.add_argument("--sq", type=int, default=2)
ap.add_argument("--ctx", type=int, default=8192)
ap.add_argument("--calls", type=int, default=4)
args = ap.parse_args()
sys.path.insert(0, args.flashmla)
import torch  # noqa: E402
import flash_mla  # noqa: E402

D_QK, D_V, BLOCK = 576, 512, 64
dev = torch.device("cuda:0")
g = torch.Generator(device=dev).manual_seed(1)
nb = args.ctx // BLOCK
kv = torch.randn(args.b * nb, BLOCK, 1, D_QK, dtype=torch.bfloat16, device=dev, generator=g)
q = torch.randn(args.b, args.sq, args.h, D_QK, dtype=torch.bfloat16, device=dev, generator=g)
bt = torch.arange(args.b * nb, dtype=torch.int32, device=dev).view(args.b, nb)
lens = torch.full((args.b,), args.ctx, dtype=torch.int32, device=dev)
sched, _ = flash_mla.get_mla_metadata()
for _ in range(args.calls):
    out, lse = flash_mla.flash_mla_with_kvcache(q, kv, bt, lens, D_V, sched, None, softmax_scale=D_QK ** -0.5, causal=True)
torch.cuda.synchronize()
print("ok", tuple(out.shape), bool(torch.isfinite(out).all()))
