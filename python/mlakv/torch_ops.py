"""PyTorch custom ops over mlakv (torch.ops.mlakv.*), registered through libtorch's stable ABI,
with fake (meta) implementations so they trace under torch.compile and replay in CUDA graphs.

    import torch, mlakv.torch_ops as ops
    ops.write_cache(kv_cache, slot_mapping, kv_c_normed, k_pe, format="fp8_ds_mla")
    ops.mla_decode(q, kv_cache, block_table, seq_lens, out, lse, format="fp8_ds_mla", softmax_scale=s)

Every op writes into the tensors it is given and returns nothing (no allocation): on CUDA it
runs on torch's current stream. Available where the package was built against torch >= 2.10
(``mlakv.torch_ops.available``)."""
import os

import torch

from . import _core

FORMATS = {f["name"]: i for i, f in enumerate(_core.formats())}

_lib = os.path.join(os.path.dirname(__file__), "_torch_ops.so")
available = os.path.exists(_lib)
if available:
    torch.ops.load_library(_lib)

    @torch.library.register_fake("mlakv::write_cache")
    def _write_cache_fake(kv_cache, slot_mapping, latent, rope, format, outer_scale, fp8_exact):
        return None

    @torch.library.register_fake("mlakv::mla_decode")
    def _mla_decode_fake(q, kv_cache, block_table, seqlens, out, lse, format, outer_scale, softmax_scale, causal,
                         num_splits, workspace):
        return None

    @torch.library.register_fake("mlakv::mla_decode_sparse")
    def _mla_decode_sparse_fake(q, kv_cache, indices, topk_length, out, lse, format, outer_scale, softmax_scale,
                                num_splits, workspace):
        return None


def _format(name):
    if name not in FORMATS:
        raise ValueError(f"format: unknown record format {name!r} (one of {', '.join(FORMATS)})")
    return FORMATS[name]


def write_cache(kv_cache, slot_mapping, latent, rope, *, format, outer_scale=1.0, fp8_scales="pow2"):
    """vLLM's concat_and_cache_mla: kv_cache [num_blocks, block_size, record_bytes] uint8 (in place),
    slot_mapping [n] int64 (-1 skipped), latent [n, 512], rope [n, 64]."""
    if fp8_scales not in ("pow2", "exact"):
        raise ValueError(f"fp8_scales: expected 'pow2' or 'exact', got {fp8_scales!r}")
    torch.ops.mlakv.write_cache(kv_cache, slot_mapping, latent, rope, _format(format), float(outer_scale),
                                fp8_scales == "exact")


def mla_decode(q, kv_cache, block_table, seqlens, out, lse, *, format, softmax_scale, outer_scale=1.0, causal=True,
               num_splits=1, workspace=None):
    """Dense MLA decode into out [B, s_q, H, 512] f32 and lse [B, s_q, H] f32 (see mlakv.mla_decode)."""
    torch.ops.mlakv.mla_decode(q, kv_cache, block_table, seqlens, out, lse, _format(format), float(outer_scale),
                               float(softmax_scale), bool(causal), int(num_splits), workspace)


def mla_decode_sparse(q, kv_cache, indices, out, lse, *, format, softmax_scale, topk_length=None, outer_scale=1.0,
                      num_splits=1, workspace=None):
    """Sparse (DSA top-k) MLA decode: indices [B, s_q, topk] int32 slot ids, invalid ones skipped."""
    torch.ops.mlakv.mla_decode_sparse(q, kv_cache, indices, topk_length, out, lse, _format(format),
                                      float(outer_scale), float(softmax_scale), int(num_splits), workspace)
