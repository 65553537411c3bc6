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
built = os.path.exists(_lib)
load_error = None
if built:
    try:
        torch.ops.load_library(_lib)
    except OSError as e:  # keep the dynamic loader's reason (an undefined symbol, a torch too old)
        load_error = f"{e}: {e.__cause__}"
available = built and load_error is None
if available:

    @torch.library.register_fake("mlakv::write_cache")
    def _write_cache_fake(kv_cache, slot_mapping, latent, rope, format, outer_scale, fp8_exact, token_scale=False,
                          nvfp4_search=False):
        return None

    @torch.library.register_fake("mlakv::mla_decode")
    def _mla_decode_fake(q, kv_cache, block_table, seqlens, out, lse, format, outer_scale, softmax_scale, causal,
                         num_splits, workspace, token_scale=False):
        return None

    @torch.library.register_fake("mlakv::mla_decode_sparse")
    def _mla_decode_sparse_fake(q, kv_cache, indices, topk_length, out, lse, format, outer_scale, softmax_scale,
                                num_splits, workspace, token_scale=False):
        return None


# The ops themselves reject bad arguments with a RuntimeError naming the argument (thrown as
# std::runtime_error from the kernel; torch's dispatcher carries it to Python). The wrappers
# below check every argument first and raise ValueError naming it, the package's convention
# for bad arguments (docs/python.md, "PyTorch custom ops").
_LATENT, _ROPE = _core.LATENT_DIM, _core.ROPE_DIM


def _check(t, name, dtypes, shape, device):
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        raise ValueError(f"{name}: dtype {t.dtype} (expected {' or '.join(str(d) for d in dtypes)})")
    if t.dim() != len(shape) or any(e is not None and t.shape[i] != e for i, e in enumerate(shape)):
        want = "[" + ", ".join("*" if e is None else str(e) for e in shape) + "]"
        raise ValueError(f"{name}: shape {list(t.shape)} (expected {want})")
    if t.dim() > 0 and t.shape[-1] > 1 and t.stride(-1) != 1:
        raise ValueError(f"{name}: the last dimension must be contiguous (stride 1), got strides {t.stride()}")
    if device is not None and t.device != device:
        raise ValueError(f"{name}: on {t.device}, expected {device} (the cache's device)")


def _check_cache(kv_cache, fmt):
    rb = _core.record_bytes(fmt)
    _check(kv_cache, "kv_cache", (torch.uint8,), (None, None, rb), None)
    if not kv_cache.is_contiguous():
        raise ValueError("kv_cache: must be contiguous [num_blocks, block_size, record_bytes]")
    return kv_cache.device


def _check_attention(q, out, lse, dev, softmax_scale, num_splits):
    _check(q, "q", (torch.float32, torch.bfloat16), (None, None, None, _LATENT + _ROPE), dev)
    B, S, H = q.shape[:3]
    _check(out, "out", (torch.float32,), (B, S, H, _LATENT), dev)
    _check(lse, "lse", (torch.float32,), (B, S, H), dev)
    if not (float(softmax_scale) > 0 and float(softmax_scale) < float("inf")):
        raise ValueError(f"softmax_scale: must be finite and > 0, got {softmax_scale}")
    if int(num_splits) < 1:
        raise ValueError(f"num_splits: must be >= 1, got {num_splits}")
    return B, S


def _format(name):
    if name not in FORMATS:
        raise ValueError(f"format: unknown record format {name!r} (one of {', '.join(FORMATS)})")
    return FORMATS[name]


def _token_scale(token_scale, fmt, outer_scale):
    """The per-token scale mode: a bool, on an nvfp4 format, with outer_scale 1.0 (s_t replaces s_l)."""
    if not isinstance(token_scale, bool):
        raise ValueError(f"token_scale: expected a bool, got {type(token_scale).__name__}")
    if token_scale and not fmt.startswith("nvfp4"):
        raise ValueError(f"token_scale: the per-token scale mode is a mode of the nvfp4 formats, not {fmt}")
    if token_scale and float(outer_scale) != 1.0:
        raise ValueError(f"token_scale: the per-token scale s_t replaces the outer scale, which must be 1.0 "
                         f"(got outer_scale={outer_scale})")
    return token_scale


def _nvfp4_scales(nvfp4_scales, fmt, token_scale):
    """The nvfp4 group-scale choice: "rn" or "search" (an mlakv-recipe file's
    LatentTransform.nvfp4_scales), search on an nvfp4 format outside the per-token scale mode."""
    if nvfp4_scales not in ("rn", "search"):
        raise ValueError(f"nvfp4_scales: expected 'rn' or 'search', got {nvfp4_scales!r}")
    if nvfp4_scales == "search" and not fmt.startswith("nvfp4"):
        raise ValueError(f"nvfp4_scales: search is an encoder option of the nvfp4 formats, not {fmt}")
    if nvfp4_scales == "search" and token_scale:
        raise ValueError("nvfp4_scales: search does not apply to the per-token scale mode (its group scales stay "
                         "round-to-nearest); use a static outer scale, or nvfp4_scales='rn'")
    return nvfp4_scales == "search"


def write_cache(kv_cache, slot_mapping, latent, rope, *, format, outer_scale=1.0, fp8_scales="pow2",
                token_scale=False, nvfp4_scales="rn"):
    """vLLM's concat_and_cache_mla: kv_cache [num_blocks, block_size, record_bytes] uint8 (in place),
    slot_mapping [n] int64 (-1 skipped), latent [n, 512], rope [n, 64]. token_scale: the nvfp4
    per-token scale mode (fp32 s_t = token amax / 2688 at bytes [292, 296) replaces s_l; the fork's
    VLLM_NVFP4_MLA_DYNAMIC_SCALE=1); readers of the cache must pass it too. nvfp4_scales: how the
    nvfp4 group scales are chosen, "rn" (the fork's encoder) or "search" (docs/formats.md "The nvfp4
    scale search"); a writer-only option (the readers need nothing): pass an mlakv-recipe file's
    LatentTransform.nvfp4_scales with its outer_scales to write the C++ writers' bytes."""
    if fp8_scales not in ("pow2", "exact"):
        raise ValueError(f"fp8_scales: expected 'pow2' or 'exact', got {fp8_scales!r}")
    code = _format(format)
    ts = _token_scale(token_scale, format, outer_scale)
    search = _nvfp4_scales(nvfp4_scales, format, ts)
    dev = _check_cache(kv_cache, format)
    _check(slot_mapping, "slot_mapping", (torch.int64, torch.int32), (None,), dev)
    n = slot_mapping.shape[0]
    _check(latent, "latent", (torch.float32, torch.bfloat16), (n, _LATENT), dev)
    _check(rope, "rope", (latent.dtype,), (n, _ROPE), dev)
    torch.ops.mlakv.write_cache(kv_cache, slot_mapping, latent, rope, code, float(outer_scale),
                                fp8_scales == "exact", ts, search)


def mla_decode(q, kv_cache, block_table, seqlens, out, lse, *, format, softmax_scale, outer_scale=1.0, causal=True,
               num_splits=1, workspace=None, token_scale=False):
    """Dense MLA decode into out [B, s_q, H, 512] f32 and lse [B, s_q, H] f32 (see mlakv.mla_decode);
    token_scale: the cache was written in the nvfp4 per-token scale mode."""
    _format(format)
    ts = _token_scale(token_scale, format, outer_scale)
    dev = _check_cache(kv_cache, format)
    B, _ = _check_attention(q, out, lse, dev, softmax_scale, num_splits)
    _check(block_table, "block_table", (torch.int32,), (B, None), dev)
    _check(seqlens, "seqlens", (torch.int32,), (B,), dev)
    if workspace is not None:
        _check(workspace, "workspace", (torch.uint8,), (None,), dev)
    torch.ops.mlakv.mla_decode(q, kv_cache, block_table, seqlens, out, lse, _format(format), float(outer_scale),
                               float(softmax_scale), bool(causal), int(num_splits), workspace, ts)


def mla_decode_sparse(q, kv_cache, indices, out, lse, *, format, softmax_scale, topk_length=None, outer_scale=1.0,
                      num_splits=1, workspace=None, token_scale=False):
    """Sparse (DSA top-k) MLA decode: indices [B, s_q, topk] int32 slot ids, invalid ones skipped."""
    _format(format)
    ts = _token_scale(token_scale, format, outer_scale)
    dev = _check_cache(kv_cache, format)
    B, S = _check_attention(q, out, lse, dev, softmax_scale, num_splits)
    _check(indices, "indices", (torch.int32,), (B, S, None), dev)
    if topk_length is not None:
        _check(topk_length, "topk_length", (torch.int32,), (B,), dev)
    if workspace is not None:
        _check(workspace, "workspace", (torch.uint8,), (None,), dev)
    torch.ops.mlakv.mla_decode_sparse(q, kv_cache, indices, topk_length, out, lse, _format(format),
                                      float(outer_scale), float(softmax_scale), int(num_splits), workspace, ts)
