"""Interop with the conventions of other engines' caches.

- fp8_ds_mla (656 B) as FlashMLA defines it (its README and tests/quant.py, commit 9241ae3):
  bytes 0..511 float8_e4m3fn latent codes, 512..527 four float32 tile scales (one per 128
  latents, s = 2^ceil(log2(max(amax / 448, 1e-4))), code = e4m3fn(x / s) rounded to nearest
  even), 528..655 the 64 rope values in bf16; the reader computes code * s. A numpy writer and
  reader written from those rules, independent of mlakv's codecs, against mlakv's records.
- A vLLM-style kv_cache tensor [num_blocks, block_size, record_bytes] uint8 (torch, CPU) used
  in place by write_cache and mla_decode.
- On a GPU with FlashMLA importable (tools/gpu_session.sh builds it): FlashMLA's sparse fp8
  decode and dense bf16 decode over caches written by mlakv.write_cache, against mlakv.mla_decode
  on the same records.
"""
import numpy as np
import pytest

import mlakv
import reference as ref

TILE = 128


# ---- float8_e4m3fn (bias 7, no infinities, 0x7f / 0xff NaN) -------------------------------------

def _e4m3fn_positive_values():
    codes = np.arange(127)  # 0x00 .. 0x7e; 0x7f is NaN
    e, m = codes >> 3, codes & 7
    return np.where(e == 0, m / 8.0 * 2.0 ** -6, (1 + m / 8.0) * 2.0 ** (e - 7.0))


E4M3FN = _e4m3fn_positive_values()  # increasing; E4M3FN[126] = 448


def e4m3fn_encode(y):
    """float64 values with |y| <= 448 -> e4m3fn codes, round to nearest, ties to the even code."""
    a = np.abs(y)
    hi = np.clip(np.searchsorted(E4M3FN, a, side="left"), 0, 126)
    lo = np.clip(hi - 1, 0, 126)
    dlo, dhi = a - E4M3FN[lo], E4M3FN[hi] - a
    pick_hi = (dhi < dlo) | ((dhi == dlo) & (hi % 2 == 0))
    code = np.where(pick_hi, hi, lo).astype(np.uint8)
    return np.where(np.signbit(y), code | 0x80, code).astype(np.uint8)


def e4m3fn_decode(codes):
    c = codes.astype(np.int64)
    mag = np.where((c & 0x7F) == 0x7F, np.nan, E4M3FN[np.minimum(c & 0x7F, 126)])
    return np.where(c & 0x80, -mag, mag)


def bf16_round(x):
    """float32 -> nearest bf16 (ties to even), returned as float32."""
    u = np.ascontiguousarray(x, np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return (u.astype(np.uint32) << 16).view(np.float32)


def flashmla_quantize(lat, rope):
    """FlashMLA's V32_FP8Sparse writer: lat [n, 512], rope [n, 64] bf16-valued float32 -> [n, 656] u8."""
    n = lat.shape[0]
    out = np.zeros((n, 656), np.uint8)
    scales = np.zeros((n, 4), np.float32)
    for t in range(4):
        x = lat[:, t * TILE:(t + 1) * TILE].astype(np.float32)
        r = np.maximum(np.abs(x).max(axis=1) / np.float32(448.0), np.float32(1e-4)).astype(np.float32)
        frac, ex = np.frexp(r)  # r = frac * 2^ex, frac in [0.5, 1)
        s = np.where(frac == 0.5, r, np.ldexp(np.float32(1.0), ex)).astype(np.float32)  # 2^ceil(log2 r), exactly
        scales[:, t] = s
        out[:, t * TILE:(t + 1) * TILE] = e4m3fn_encode((x / s[:, None]).astype(np.float64))
    out[:, 512:528] = scales.view(np.uint8).reshape(n, 16)
    out[:, 528:656] = (np.ascontiguousarray(rope, np.float32).view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
    return out


def flashmla_dequantize(rec):
    """FlashMLA's V32_FP8Sparse reader -> (latent [n, 512], rope [n, 64]) float64 (before its bf16 cast)."""
    n = rec.shape[0]
    codes = e4m3fn_decode(rec[:, :512])
    scales = np.ascontiguousarray(rec[:, 512:528]).view(np.float32).reshape(n, 4).astype(np.float64)
    lat = codes * np.repeat(scales, TILE, axis=1)
    rope = ref.bf16_to_f64(np.ascontiguousarray(rec[:, 528:656]).view(np.uint16))
    return lat, rope


def bf16_latents(rng, n):
    gamma = np.exp(rng.normal(np.log(0.3), 0.6, 512)).astype(np.float32)
    gamma[:6] *= 10
    lat = bf16_round((rng.standard_normal((n, 512)) * gamma).astype(np.float32))
    rope = bf16_round(rng.standard_normal((n, 64)).astype(np.float32))
    lat[0, :TILE] = 0  # an all-zero tile: the 1e-4 floor of the scale
    lat[1, TILE:2 * TILE] *= 1e-6  # a tile under the floor
    return lat, rope


def test_e4m3fn_tables():
    assert E4M3FN[126] == 448 and E4M3FN[1] == 2.0 ** -9 and E4M3FN[8] == 2.0 ** -6
    assert np.all(np.diff(E4M3FN) > 0)
    # Round trip of every finite code, and ties to the even code (1.0 = 0x38, 1.125 = 0x39, 1.25 = 0x3a).
    finite = np.array([c for c in range(256) if (c & 0x7F) != 0x7F], np.uint8)
    np.testing.assert_array_equal(e4m3fn_encode(e4m3fn_decode(finite)), finite)
    assert e4m3fn_encode(np.array([1.0625]))[0] == 0x38 and e4m3fn_encode(np.array([1.1875]))[0] == 0x3A


def test_mlakv_fp8_ds_mla_records_are_flashmlas(rng):
    lat, rope = bf16_latents(rng, 300)
    mine = mlakv.encode(lat, rope, "fp8_ds_mla")  # pow2 scales: FlashMLA's rule
    theirs = flashmla_quantize(lat, rope)
    # Zero codes may carry either sign; both read as 0.
    zero = ((mine[:, :512] & 0x7F) == 0) & ((theirs[:, :512] & 0x7F) == 0)
    np.testing.assert_array_equal(np.where(zero, 0, mine[:, :512]), np.where(zero, 0, theirs[:, :512]))
    np.testing.assert_array_equal(mine[:, 512:], theirs[:, 512:])
    s = np.ascontiguousarray(mine[:, 512:528]).view(np.float32)
    assert s[0, 0] == np.float32(2.0 ** -13)  # all-zero tile: 2^ceil(log2(1e-4))
    # FlashMLA's reader and mlakv's decode give the same values, bit for bit.
    fl, fr = flashmla_dequantize(mine)
    ml, mr = mlakv.decode(mine, "fp8_ds_mla")
    np.testing.assert_array_equal(ml.astype(np.float64), fl)
    np.testing.assert_array_equal(mr.astype(np.float64), fr)
    np.testing.assert_array_equal(mr, rope)  # rope is stored unquantized (bf16)
    # And FlashMLA's bf16 dequantized cache is exactly representable (pow2 scales x 4-bit codes).
    np.testing.assert_array_equal(bf16_round(ml), ml)


def test_vllm_kv_cache_torch_tensor_in_place(rng):
    torch = pytest.importorskip("torch")
    fmt, nb, bs = "fp8_ds_mla", 8, 16
    kv = torch.zeros(nb, bs, mlakv.record_bytes(fmt), dtype=torch.uint8)
    ptr = kv.data_ptr()
    lat, rope = bf16_latents(rng, 40)
    # vLLM's slot_mapping: int64 slot ids, -1 for padded tokens.
    slots = torch.randperm(nb * bs)[:40]
    slots[5] = -1
    # bf16 inputs, as a serving engine hands them (kv_c_normed and k_pe in the model dtype).
    mlakv.write_cache(kv, slots, torch.from_numpy(lat).to(torch.bfloat16), torch.from_numpy(rope).to(torch.bfloat16),
                      format=fmt)
    assert kv.data_ptr() == ptr
    flat = kv.view(-1, kv.shape[-1]).numpy()
    live = slots.numpy() >= 0
    np.testing.assert_array_equal(flat[slots.numpy()[live]], flashmla_quantize(lat, rope)[live])
    untouched = np.setdiff1d(np.arange(nb * bs), slots.numpy()[live])
    assert not flat[untouched].any()
    # The decode reads the same tensor (no copy): dense over a block table of the slots' blocks.
    layer = mlakv.cache_layer(kv, fmt)
    assert np.shares_memory(layer.tensor(), kv.numpy())
    q = torch.randn(1, 1, 8, 576, dtype=torch.float32)
    seq = slots.numpy()[live][:20]
    idx = torch.from_numpy(seq.astype(np.int32)).view(1, 1, -1)
    out = torch.empty(1, 1, 8, 512)
    lse = torch.empty(1, 1, 8)
    mlakv.mla_decode(q, layer, indices=idx, softmax_scale=0.1, out=out, lse=lse)
    kl, kr = flashmla_dequantize(flat[seq])
    ro, rl = ref.attention(q.numpy()[0, 0], np.concatenate([kl, kr], axis=1), 0.1, len(seq))
    np.testing.assert_allclose(out.numpy()[0, 0], ro, atol=1e-4 * np.abs(ro).max())
    np.testing.assert_allclose(lse.numpy()[0, 0], rl, rtol=1e-5)


# ---- FlashMLA itself, on the GPU -------------------------------------------------------------------

def _flash_mla():
    torch = pytest.importorskip("torch")
    if not (mlakv.cuda_available() and torch.cuda.is_available()):
        pytest.skip("needs a CUDA build of mlakv and a GPU")
    try:
        import flash_mla  # noqa: F401
    except ImportError as e:
        pytest.skip(f"flash_mla is not importable ({e}); tools/gpu_session.sh builds it from .ext/flashmla")
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("FlashMLA 9241ae3's decode kernels are built for sm_90a")
    return torch, flash_mla


def _bf16_tol():
    # FlashMLA rounds P to bf16 before P V and its output to bf16: 2^-9 relative each; mlakv's CPU
    # path reads the same exact values in float32. 4 x that bound leaves room for the sums.
    return 4 * 2.0 ** -8


def test_flashmla_sparse_fp8_decode_reads_mlakv_records():
    torch, flash_mla = _flash_mla()
    g = torch.Generator().manual_seed(7)
    nb, bs, B, s_q, H, topk = 16, 64, 2, 2, 64, 256
    T = nb * bs
    lat = torch.randn(T, 512, generator=g).to(torch.bfloat16).float() * 0.5
    rope = torch.randn(T, 64, generator=g).to(torch.bfloat16).float()
    kv = torch.zeros(nb, bs, 656, dtype=torch.uint8, device="cuda")
    stream = torch.cuda.current_stream().cuda_stream
    mlakv.write_cache(kv, torch.arange(T, device="cuda"), lat.cuda(), rope.cuda(), format="fp8_ds_mla", stream=stream)
    idx = torch.randint(0, T, (B, s_q, topk), generator=g, dtype=torch.int32)
    idx[0, 0, 10:20] = -1  # invalid entries are skipped by both
    idx = idx.cuda()
    q = torch.randn(B, s_q, H, 576, generator=g).to(torch.bfloat16).cuda()
    scale = 576 ** -0.5
    sched, _ = flash_mla.get_mla_metadata()
    out_f, lse_f = flash_mla.flash_mla_with_kvcache(
        q, kv.view(nb, bs, 1, 656).view(torch.float8_e4m3fn), None, None, 512, sched, None,
        softmax_scale=scale, causal=False, is_fp8_kvcache=True, indices=idx)
    torch.cuda.synchronize()
    # mlakv on the same bytes: the CPU kernel (float32 over the exact dequantized values) and CUDA.
    kv_cpu = kv.cpu().numpy()
    o_ref, l_ref = mlakv.mla_decode(q.float().cpu().numpy(), mlakv.cache_layer(kv_cpu, "fp8_ds_mla"),
                                    indices=idx.cpu().numpy(), softmax_scale=scale)
    o_f = out_f.float().cpu().numpy()
    l_f = lse_f.transpose(1, 2).cpu().numpy()  # FlashMLA: [B, H, s_q]
    rel = np.linalg.norm(o_f - o_ref) / np.linalg.norm(o_ref)
    print(f"FlashMLA sparse fp8 vs mlakv CPU: rel {rel:.2e}, lse {np.abs(l_f - l_ref).max():.2e}")
    assert rel < _bf16_tol(), rel
    np.testing.assert_allclose(l_f, l_ref, atol=1e-3)
    out = torch.empty(B, s_q, H, 512, device="cuda")
    lse = torch.empty(B, s_q, H, device="cuda")
    mlakv.mla_decode(q, mlakv.cache_layer(kv, "fp8_ds_mla"), indices=idx, softmax_scale=scale, out=out, lse=lse,
                     stream=stream)
    torch.cuda.synchronize()
    rel_c = np.linalg.norm(out.cpu().numpy() - o_f) / np.linalg.norm(o_f)
    print(f"FlashMLA sparse fp8 vs mlakv CUDA: rel {rel_c:.2e}")
    assert rel_c < 2 * _bf16_tol(), rel_c
    np.testing.assert_allclose(lse.cpu().numpy(), l_f, atol=2e-2)


def test_flashmla_dense_bf16_decode_reads_mlakv_records():
    torch, flash_mla = _flash_mla()
    g = torch.Generator().manual_seed(8)
    nb, bs, B, H = 12, 64, 3, 16
    lens = torch.tensor([250, 64 * 4, 1], dtype=torch.int32)
    lat = torch.randn(nb * bs, 512, generator=g)
    rope = torch.randn(nb * bs, 64, generator=g)
    kv = torch.zeros(nb, bs, 1152, dtype=torch.uint8, device="cuda")
    stream = torch.cuda.current_stream().cuda_stream
    mlakv.write_cache(kv, torch.arange(nb * bs, device="cuda"), lat.cuda(), rope.cuda(), format="bf16", stream=stream)
    table = torch.randperm(nb, generator=g).to(torch.int32).view(B, 4).cuda()
    q = torch.randn(B, 1, H, 576, generator=g).to(torch.bfloat16).cuda()
    scale = 576 ** -0.5
    sched, _ = flash_mla.get_mla_metadata()
    # mlakv's bf16 record is FlashMLA's bf16 cache entry: [latent | rope] as 576 bf16.
    out_f, lse_f = flash_mla.flash_mla_with_kvcache(q, kv.view(torch.bfloat16).view(nb, bs, 1, 576), table,
                                                    lens.cuda(), 512, sched, None, softmax_scale=scale, causal=True)
    torch.cuda.synchronize()
    o_ref, l_ref = mlakv.mla_decode(q.float().cpu().numpy(), mlakv.cache_layer(kv.cpu().numpy(), "bf16"),
                                    table.cpu().numpy(), lens.numpy(), softmax_scale=scale)
    o_f = out_f.float().cpu().numpy()
    rel = np.linalg.norm(o_f - o_ref) / np.linalg.norm(o_ref)
    print(f"FlashMLA dense bf16 vs mlakv CPU: rel {rel:.2e}")
    assert rel < _bf16_tol(), rel
    np.testing.assert_allclose(lse_f.transpose(1, 2).cpu().numpy(), l_ref, atol=1e-3)
