"""mlakv's Python package against numpy references, the C++ CLI, and its own contracts
(zero copy, errors that name the argument)."""
import json
import os
import subprocess
import warnings

import numpy as np
import pytest

import mlakv
import reference as ref

FORMATS = ["bf16", "fp8_ds_mla", "nvfp4_ds_mla", "nvfp4_ds_mla_fp8rope", "f32", "nvfp4_ds_mla_int8rope"]


def latents(rng, n):
    # RMS-normed-like latents with a few outlier channels, and unit rope.
    gamma = np.exp(rng.normal(np.log(0.3), 0.6, 512)).astype(np.float32)
    gamma[:6] *= 10
    lat = (rng.standard_normal((n, 512)) * gamma).astype(np.float32)
    rope = rng.standard_normal((n, 64)).astype(np.float32)
    return lat, rope


def test_formats_table():
    cli = os.environ.get("MLAKV_CLI")
    fm = {f["name"]: f for f in mlakv.formats()}
    assert set(FORMATS) <= set(fm)
    for name in FORMATS:
        f = fm[name]
        assert mlakv.record_bytes(name) == f["record_bytes"]
        # Regions tile the record in order.
        end = 0
        for off, nbytes, _ in f["regions"]:
            assert off == end
            end = off + nbytes
        assert end == f["record_bytes"]
    assert [fm[n]["record_bytes"] for n in FORMATS] == [1152, 656, 432, 368, 2304, 368]
    if cli:
        out = json.loads(subprocess.run([cli, "formats", "--json"], check=True, capture_output=True).stdout)
        rows = out["formats"] if isinstance(out, dict) else out
        by = {r["name"]: r for r in rows}
        for name in FORMATS:
            assert by[name]["bytes_per_token_per_layer"] == fm[name]["record_bytes"]


@pytest.mark.parametrize("fmt", FORMATS)
def test_encode_decode_against_numpy_reader(rng, fmt):
    lat, rope = latents(rng, 257)
    scale = 0.37 if fmt.startswith("nvfp4") else 1.0
    rec = mlakv.encode(lat, rope, fmt, outer_scale=scale)
    assert rec.dtype == np.uint8 and rec.shape == (257, mlakv.record_bytes(fmt))
    l2, r2 = mlakv.decode(rec, fmt, outer_scale=scale)
    lr, rr = ref.decode(rec, fmt, outer_scale=scale)
    # The numpy reader, written from the byte tables, reads the same values bit for bit
    # (every product is exact in float32).
    np.testing.assert_array_equal(l2.astype(np.float64), lr.astype(np.float32).astype(np.float64))
    np.testing.assert_array_equal(r2.astype(np.float64), rr.astype(np.float32).astype(np.float64))
    # And the round trip is close to the input (loose: each format's own rounding).
    tol = {"bf16": 1e-2, "fp8_ds_mla": 0.07, "nvfp4_ds_mla": 0.5, "nvfp4_ds_mla_fp8rope": 0.5, "f32": 0,
           "nvfp4_ds_mla_int8rope": 0.5}[fmt]
    if tol == 0:  # unquantized: the values themselves
        np.testing.assert_array_equal(l2, lat)
        np.testing.assert_array_equal(r2, rope)
    else:
        assert np.linalg.norm(l2 - lat) / np.linalg.norm(lat) < tol


@pytest.mark.parametrize("fmt", ["nvfp4_ds_mla", "nvfp4_ds_mla_fp8rope", "nvfp4_ds_mla_int8rope"])
def test_token_scale_mode_against_numpy_reader(rng, fmt):
    lat, rope = latents(rng, 65)
    lat[3] *= 1e-3  # a small-magnitude token
    lat[4] = 0.0  # s_t = 0, zero codes
    rec = mlakv.encode(lat, rope, fmt, token_scale=True)
    st = rec[:, 292:296].copy().view(np.float32)[:, 0]
    # s_t = token_amax * f32(1/2688), the fork's constant (b12x kv_cache.py _TWO_LEVEL_RCP)
    np.testing.assert_array_equal(st, np.abs(lat).max(axis=1) * np.float32(1.0 / 2688.0))
    assert not rec[4, :288].any()
    l2, r2 = mlakv.decode(rec, fmt, token_scale=True)
    lr, rr = ref.decode(rec, fmt, token_scale=True)
    np.testing.assert_array_equal(l2, lr.astype(np.float32))
    np.testing.assert_array_equal(r2, rr.astype(np.float32))
    assert np.linalg.norm(l2[3] - lat[3]) / np.linalg.norm(lat[3]) < 0.2
    with pytest.raises(ValueError, match="token_scale"):
        mlakv.encode(lat, rope, "fp8_ds_mla", token_scale=True)


def test_encode_writes_into_the_callers_buffer(rng):
    lat, rope = latents(rng, 8)
    out = np.zeros((8, 656), dtype=np.uint8)
    got = mlakv.encode(lat, rope, "fp8_ds_mla", out=out)
    assert np.shares_memory(got, out)
    np.testing.assert_array_equal(out, mlakv.encode(lat, rope, "fp8_ds_mla"))


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("block_size", [1, 16, 33])
def test_mla_decode_against_numpy(rng, fmt, block_size):
    T, H, S = 150, 8, 2
    lat, rope = latents(rng, T)
    cache = mlakv.PagedCache(num_blocks=(T + block_size - 1) // block_size + 3, block_size=block_size,
                             formats=[fmt])
    other = cache.add_sequence()
    cache.append(other, block_size)  # the sequence under test does not start at block 0
    seq = cache.add_sequence()
    slots = cache.append(seq, T)
    cache.write(0, slots, lat, rope)
    table, seqlens = cache.tables([seq])
    q = rng.standard_normal((1, S, H, 576)).astype(np.float32)
    scale = 1.0 / np.sqrt(192.0)
    out, lse = mlakv.mla_decode(q, cache.layer(0), table, seqlens, softmax_scale=scale, num_splits=3)
    rec = cache.layer(0).tensor().reshape(-1, mlakv.record_bytes(fmt))[slots]
    kl, kr = ref.decode(rec, fmt)
    keys = np.concatenate([kl, kr], axis=1)
    for i in range(S):
        ro, rl = ref.attention(q[0, i], keys, scale, T - S + i + 1)  # causal
        # float32 kernel vs float64 reference on the same records.
        np.testing.assert_allclose(out[0, i], ro, rtol=0, atol=2e-4 * np.abs(ro).max() + 1e-6)
        np.testing.assert_allclose(lse[0, i], rl, rtol=1e-5, atol=1e-5)


def test_sparse_decode_skips_invalid_indices(rng):
    T, H = 64, 4
    lat, rope = latents(rng, T)
    cache = mlakv.PagedCache(num_blocks=4, block_size=16, formats=["bf16"])
    seq = cache.add_sequence()
    slots = cache.append(seq, T)
    cache.write(0, slots, lat, rope)
    q = rng.standard_normal((1, 1, H, 576)).astype(np.float32)
    chosen = np.array([3, 17, 40, 63], dtype=np.int32)
    idx = np.array([[[3, -1, 17, 40, 10**6, 63]]], dtype=np.int32)
    out, lse = mlakv.mla_decode(q, cache.layer(0), softmax_scale=0.1, indices=idx)
    kl, kr = ref.decode(cache.layer(0).tensor().reshape(-1, 1152)[chosen], "bf16")
    ro, rl = ref.attention(q[0, 0], np.concatenate([kl, kr], axis=1), 0.1, len(chosen))
    np.testing.assert_allclose(out[0, 0], ro, atol=1e-4 * np.abs(ro).max())
    np.testing.assert_allclose(lse[0, 0], rl, rtol=1e-5)


def test_out_and_lse_are_written_in_place(rng):
    lat, rope = latents(rng, 20)
    cache = mlakv.PagedCache(num_blocks=2, block_size=16, formats=["fp8_ds_mla"])
    seq = cache.add_sequence()
    cache.write(0, cache.append(seq, 20), lat, rope)
    table, seqlens = cache.tables([seq])
    q = rng.standard_normal((1, 1, 2, 576)).astype(np.float32)
    out = np.full((1, 1, 2, 512), np.nan, dtype=np.float32)
    lse = np.full((1, 1, 2), np.nan, dtype=np.float32)
    o2, l2 = mlakv.mla_decode(q, cache.layer(0), table, seqlens, softmax_scale=0.1, out=out, lse=lse)
    assert np.shares_memory(o2, out) and np.shares_memory(l2, lse)
    assert np.isfinite(out).all() and np.isfinite(lse).all()


def test_vllm_style_kv_cache_tensor_used_in_place(rng):
    # A serving engine's layer cache: [num_blocks, block_size, record_bytes] uint8, written
    # by write_cache through a slot mapping (-1 = padding) and read by mla_decode, no copies.
    nb, bs = 6, 16
    kv = np.zeros((nb, bs, 656), dtype=np.uint8)
    lat, rope = latents(rng, 5)
    slot_mapping = np.array([17, -1, 18, 40, 41], dtype=np.int64)
    mlakv.write_cache(kv, slot_mapping, lat, rope, format="fp8_ds_mla")
    flat = kv.reshape(-1, 656)
    expect = mlakv.encode(lat, rope, "fp8_ds_mla")
    for i, s in enumerate(slot_mapping):
        if s >= 0:
            np.testing.assert_array_equal(flat[s], expect[i])
    assert not flat[[0, 16, 19, 39, 42]].any()  # nothing else was touched
    layer = mlakv.cache_layer(kv, "fp8_ds_mla")
    assert np.shares_memory(layer.tensor(), kv)
    # The FlashMLA byte convention: the first 512 bytes e4m3, 4 fp32 scales, bf16 rope.
    scales = flat[17, 512:528].copy().view(np.float32)
    assert np.all(scales > 0) and np.all(np.log2(scales) == np.round(np.log2(scales)))  # pow2 tile scales


@pytest.mark.parametrize("fmt", ["nvfp4_ds_mla", "nvfp4_ds_mla_fp8rope", "nvfp4_ds_mla_int8rope"])
def test_write_cache_warns_when_nvfp4_scales_fall_into_subnormals(rng, fmt):
    # GLM-5.2-like shallow-layer latents (max |c| ~0.02) at outer scale 1: every group scale
    # amax/6 < 2^-6 is an e4m3 subnormal; the warning names the calibrated outer scale.
    rb = mlakv.record_bytes(fmt)
    lat, rope = latents(rng, 8)
    small = (lat * (0.02 / np.abs(lat).max())).astype(np.float32)
    kv = np.zeros((1, 16, rb), np.uint8)
    with pytest.warns(UserWarning, match=r"subnormals.*s_l = ") as w:
        mlakv.write_cache(kv, np.arange(8), small, rope, format=fmt)
    assert len(w) == 1
    suggested = float(str(w[0].message).split("s_l = ")[1].split()[0])
    assert suggested == pytest.approx(float(np.abs(small).max()) / 2688, rel=1e-5)
    np.testing.assert_array_equal(kv.reshape(-1, rb)[:8], mlakv.encode(small, rope, fmt))  # written all the same
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        mlakv.write_cache(kv, np.arange(8), small, rope, format=fmt, check_scales=False)  # asked not to check
        mlakv.write_cache(kv, np.arange(8), small, rope, format=fmt, outer_scale=suggested)  # calibrated
        mlakv.write_cache(kv, np.arange(8), lat, rope, format=fmt)  # natural-size latents
        mlakv.write_cache(kv, np.arange(8), small, rope, format=fmt, token_scale=True)  # per-token scales
        mlakv.write_cache(np.zeros((1, 16, 656), np.uint8), np.arange(8), small, rope, format="fp8_ds_mla")


@pytest.mark.parametrize("fmt", ["nvfp4_ds_mla_fp8rope", "nvfp4_ds_mla_int8rope"])
def test_token_scale_kv_cache_written_and_attended(rng, fmt):
    # The vLLM-style path in the per-token scale mode: write_cache stores s_t, cache_layer
    # reads it back for mla_decode; against the numpy reader and float64 attention.
    nb, bs, T, H = 4, 16, 40, 4
    rb = mlakv.record_bytes(fmt)
    kv = np.zeros((nb, bs, rb), dtype=np.uint8)
    lat, rope = latents(rng, T)
    lat[5] *= 1e-3
    slots = np.arange(T, dtype=np.int64) + 3
    mlakv.write_cache(kv, slots, lat, rope, format=fmt, token_scale=True)
    flat = kv.reshape(-1, rb)
    np.testing.assert_array_equal(flat[slots], mlakv.encode(lat, rope, fmt, token_scale=True))
    layer = mlakv.cache_layer(kv, fmt, token_scale=True)
    assert layer.token_scale
    q = rng.standard_normal((1, 1, H, 576)).astype(np.float32)
    idx = slots[None, None, :].astype(np.int32)
    out, lse = mlakv.mla_decode(q, layer, softmax_scale=0.1, indices=idx)
    kl, kr = ref.decode(flat[slots], fmt, token_scale=True)
    ro, rl = ref.attention(q[0, 0], np.concatenate([kl, kr], axis=1), 0.1, T)
    np.testing.assert_allclose(out[0, 0], ro, rtol=0, atol=2e-4 * np.abs(ro).max() + 1e-6)
    np.testing.assert_allclose(lse[0, 0], rl, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="token_scale"):
        mlakv.cache_layer(kv, fmt, token_scale=True, outer_scale=0.5)


def test_paged_cache_in_token_scale_mode(rng):
    lat, rope = latents(rng, 30)
    cache = mlakv.PagedCache(num_blocks=2, block_size=16, formats=["nvfp4_ds_mla"], token_scale=True)
    seq = cache.add_sequence()
    slots = cache.append(seq, 30)
    cache.write(0, slots, lat, rope)
    assert cache.layer(0).token_scale
    rec = cache.layer(0).tensor().reshape(-1, 432)[slots]
    np.testing.assert_array_equal(rec, mlakv.encode(lat, rope, "nvfp4_ds_mla", token_scale=True))
    with pytest.raises(ValueError, match="token_scale"):
        mlakv.PagedCache(num_blocks=2, block_size=16, formats=["bf16"], token_scale=True)


def test_merge_attn_states_against_numpy(rng):
    P, N, D = 3, 5, 512
    o = rng.standard_normal((P, N, D)).astype(np.float32)
    lse = rng.standard_normal((P, N)).astype(np.float32)
    lse[1, 2] = -np.inf  # an empty partial contributes nothing
    out, l = mlakv.merge_attn_states(o, lse)
    w = np.exp(lse.astype(np.float64) - np.max(lse, axis=0))
    ref_l = np.log(w.sum(axis=0)) + np.max(lse, axis=0)
    ref_o = (w[:, :, None] * o).sum(axis=0) / w.sum(axis=0)[:, None]
    np.testing.assert_allclose(l, ref_l, rtol=1e-6)
    np.testing.assert_allclose(out, ref_o, rtol=1e-5, atol=1e-6)


def test_paged_cache_sequences():
    c = mlakv.PagedCache(num_blocks=4, block_size=4, formats=["bf16"])
    a = c.add_sequence()
    s = c.append(a, 6)
    assert s.dtype == np.int64 and len(s) == 6 and c.length(a) == 6
    b = c.fork(a)
    assert c.length(b) == 6
    assert c.block_table(b)[0] == c.block_table(a)[0]  # full block shared
    assert c.block_table(b)[1] != c.block_table(a)[1]  # partial tail copied
    c.free(a)
    c.free(b)
    assert c.num_free_blocks == 4
    with pytest.raises(MemoryError):
        c.append(c.add_sequence(), 17)


def test_plan_matches_the_cli():
    cli = os.environ.get("MLAKV_CLI")
    r = mlakv.plan("glm-5.2", format="fp8_ds_mla")
    assert r["bytes_per_token"] == 79 * 656 + 22 * 132
    if cli:
        out = subprocess.run([cli, "plan", "--model", "glm-5.2", "--format", "fp8_ds_mla", "--json"],
                             capture_output=True, text=True)
        if out.returncode == 0:
            j = json.loads(out.stdout)
            assert j["bytes_per_token"] == r["bytes_per_token"]


def test_calibrator_and_scale_files(rng, tmp_path):
    cal = mlakv.Calibrator()
    x0 = (rng.standard_normal((10, 512)) * 0.02).astype(np.float32)
    x1 = (rng.standard_normal((7, 512)) * 5).astype(np.float32)
    cal.add(0, x0)
    cal.add(1, x1)
    s = cal.finish()
    np.testing.assert_allclose(s.scales, [np.abs(x0).max() / 2688.0, np.abs(x1).max() / 2688.0], rtol=1e-7)
    path = str(tmp_path / "scales.json")
    s.save(path)
    t = mlakv.load_outer_scales(path)
    assert t.scales == s.scales
    assert t.scale_for(5) == 1.0  # layers past the file keep 1.0
    with pytest.raises(ValueError):
        mlakv.parse_outer_scales('{"format": "nvfp4_ds_mla_outer_scale_v1"}')


# ---- the mlakv recipe's latent transform ----------------------------------------------

def _splitmix64_signs(seed, n):
    # Independent of the C++: SplitMix64(seed) spreads the seed (seed * gamma + 1), each draw
    # is the finalizer of state + gamma; bit 63 set -> -1.
    mask, gamma = (1 << 64) - 1, 0x9E3779B97F4A7C15
    state = (seed * gamma + 1) & mask
    out = []
    for _ in range(n):
        z = (state + gamma) & mask
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
        z ^= z >> 31
        state = (state + gamma) & mask
        out.append(-1.0 if z >> 63 else 1.0)
    return np.array(out)


def _hadamard(n):
    h = np.array([[1.0]])
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return h


def _transform_file(rng):
    layer = {"mu": (0.3 * rng.standard_normal(512)).astype(np.float32).tolist(),
             "d": np.exp(0.4 * rng.standard_normal(512)).astype(np.float32).tolist(),
             "rotate": True, "sign_seed": 11, "rope_rotate": True, "rope_sign_seed": 12, "outer_scale": 0.002}
    return {"format": "mlakv_latent_transform_v1", "num_layers": 1, "latent_dim": 512, "rope_dim": 64,
            "denominator": 2688.0, "importance": "uniform", "layers": [layer]}


def test_latent_transform_against_numpy(rng, tmp_path):
    f = _transform_file(rng)
    t = mlakv.parse_latent_transform(json.dumps(f))
    assert t.num_layers == 1 and t.importance == "uniform"
    assert t.outer_scales == [np.float32(0.002)]
    L = f["layers"][0]
    s = _splitmix64_signs(11, 512)
    assert np.array_equal(np.array(mlakv.latent_transform_signs(11, 512)), s)
    mu, d = np.array(L["mu"], np.float64), np.array(L["d"], np.float64)
    H = _hadamard(512) * s[None, :] / np.sqrt(512.0)  # W S / sqrt(512)
    Hr = _hadamard(64) * _splitmix64_signs(12, 64)[None, :] / 8.0
    lat, rope = latents(rng, 9)
    c2, k2 = t.apply(0, lat, rope)
    want = (H @ (d[:, None] * (lat.astype(np.float64) - mu).T)).T
    np.testing.assert_allclose(c2, want, rtol=0, atol=1e-5 * np.abs(want).max())
    np.testing.assert_allclose(k2, (Hr @ rope.T.astype(np.float64)).T, rtol=0, atol=1e-5 * np.abs(rope).max() * 8)
    np.testing.assert_allclose(t.rotate_rope(0, rope), k2)
    # The folding identity: r . c = (H D^-1 r) . c' + r . mu.
    rows = rng.standard_normal((5, 512)).astype(np.float32)
    folded, bias = t.fold_rows(0, rows)
    np.testing.assert_allclose(folded, (H @ (rows.astype(np.float64) / d).T).T, rtol=1e-12, atol=1e-12)
    lhs = rows.astype(np.float64) @ lat.astype(np.float64).T
    rhs = folded @ c2.astype(np.float64).T + bias[:, None]
    np.testing.assert_allclose(rhs, lhs, rtol=0, atol=1e-4 * np.abs(lhs).max())
    # Files round-trip; the strict parser names the field.
    path = str(tmp_path / "t.json")
    t.save(path)
    assert mlakv.load_latent_transform(path).layer(0)["d"] == t.layer(0)["d"]
    f["layers"][0]["d"][7] = 0.0
    with pytest.raises(ValueError, match=r"layers\[0\]\.d\[7\]"):
        mlakv.parse_latent_transform(json.dumps(f))
    with pytest.raises(IndexError):
        t.apply(1, lat, rope)


# ---- every bad argument raises, naming it ------------------------------------------------

def _cache_and_tables(rng):
    lat, rope = latents(rng, 10)
    c = mlakv.PagedCache(num_blocks=2, block_size=16, formats=["bf16"])
    seq = c.add_sequence()
    c.write(0, c.append(seq, 10), lat, rope)
    t, s = c.tables([seq])
    return c, t, s


def test_bad_arguments_raise(rng):
    c, t, s = _cache_and_tables(rng)
    q = rng.standard_normal((1, 1, 4, 576)).astype(np.float32)
    layer = c.layer(0)
    with pytest.raises(ValueError, match="q"):
        mlakv.mla_decode(q[..., :500], layer, t, s, softmax_scale=0.1)
    with pytest.raises(ValueError, match="q"):
        mlakv.mla_decode(q.astype(np.float64), layer, t, s, softmax_scale=0.1)
    with pytest.raises(ValueError, match="q"):
        mlakv.mla_decode(np.ascontiguousarray(np.repeat(q, 2, axis=3))[..., ::2], layer, t, s, softmax_scale=0.1)
    with pytest.raises(ValueError, match="softmax_scale"):
        mlakv.mla_decode(q, layer, t, s, softmax_scale=-1.0)
    with pytest.raises(ValueError, match="seqlens"):
        mlakv.mla_decode(q, layer, t, s.astype(np.int64), softmax_scale=0.1)
    with pytest.raises(ValueError, match="block_table"):
        mlakv.mla_decode(q, layer, None, s, softmax_scale=0.1)
    with pytest.raises(IndexError, match="block_table"):
        mlakv.mla_decode(q, layer, np.array([[5]], dtype=np.int32), np.array([10], dtype=np.int32), softmax_scale=0.1)
    with pytest.raises(ValueError, match="num_splits"):
        mlakv.mla_decode(q, layer, t, s, softmax_scale=0.1, num_splits=0)
    with pytest.raises(ValueError, match="out"):
        mlakv.mla_decode(q, layer, t, s, softmax_scale=0.1, out=np.zeros((1, 1, 4, 511), dtype=np.float32))
    with pytest.raises(TypeError):
        mlakv.mla_decode(q.astype(np.complex64), layer, t, s, softmax_scale=0.1)
    with pytest.raises(ValueError, match="format"):
        mlakv.encode(np.zeros((1, 512), np.float32), np.zeros((1, 64), np.float32), "fp9")
    with pytest.raises(ValueError, match="fp8_scales"):
        mlakv.encode(np.zeros((1, 512), np.float32), np.zeros((1, 64), np.float32), "fp8_ds_mla", fp8_scales="x")
    with pytest.raises(ValueError, match="token 0"):
        mlakv.encode(np.full((1, 512), np.nan, np.float32), np.zeros((1, 64), np.float32), "fp8_ds_mla")
    with pytest.raises(ValueError, match="kv_cache"):
        mlakv.cache_layer(np.zeros((2, 16, 655), np.uint8), "fp8_ds_mla")
    with pytest.raises(ValueError, match="kv_cache"):
        mlakv.cache_layer(np.zeros((2, 16, 1312), np.uint8)[:, :, ::2], "fp8_ds_mla")
    with pytest.raises(IndexError, match="slot"):
        mlakv.write_cache(np.zeros((1, 4, 1152), np.uint8), np.array([4]), np.zeros((1, 512), np.float32),
                          np.zeros((1, 64), np.float32), format="bf16")
    with pytest.raises(ValueError, match="formats"):
        mlakv.PagedCache(num_blocks=2, num_layers=3, formats=["bf16", "fp8_ds_mla"])
    with pytest.raises(ValueError):
        mlakv.set_num_threads(-1)


def test_failed_write_changes_nothing(rng):
    kv = np.zeros((1, 4, 656), np.uint8)
    lat, rope = latents(rng, 2)
    lat[1, 7] = np.inf
    with pytest.raises(ValueError):
        mlakv.write_cache(kv, np.array([0, 1]), lat, rope, format="fp8_ds_mla")
    assert not kv.any()


def test_torch_tensors_cross_without_copies(rng):
    torch = pytest.importorskip("torch")
    lat, rope = latents(rng, 4)
    kv = torch.zeros((2, 16, 432), dtype=torch.uint8)
    mlakv.write_cache(kv, torch.tensor([0, 1, 2, 3]), torch.from_numpy(lat), torch.from_numpy(rope),
                      format="nvfp4_ds_mla")
    np.testing.assert_array_equal(kv.numpy().reshape(-1, 432)[:4], mlakv.encode(lat, rope, "nvfp4_ds_mla"))
    q = torch.randn(1, 1, 2, 576)
    out = torch.empty(1, 1, 2, 512)
    lse = torch.empty(1, 1, 2)
    mlakv.mla_decode(q, mlakv.cache_layer(kv, "nvfp4_ds_mla"), torch.tensor([[0]], dtype=torch.int32),
                     torch.tensor([4], dtype=torch.int32), softmax_scale=0.1, out=out, lse=lse)
    assert torch.isfinite(out).all()


def test_decode_plan_on_cpu_names_the_problem():
    # DecodePlan is CUDA's plan/run: a build without the CUDA backend says so; a CUDA build
    # refuses a CPU cache layer (the CPU path is mla_decode).
    kv = np.zeros((2, 16, 656), np.uint8)
    q = np.zeros((1, 1, 4, 576), np.float32)
    expect = "DecodePlan is for CUDA cache layers" if mlakv.cuda_available() else "no CUDA backend.*mla_decode"
    with pytest.raises(ValueError, match=expect):
        mlakv.DecodePlan(q, mlakv.cache_layer(kv, "fp8_ds_mla"), np.zeros((1, 2), np.int32), np.ones(1, np.int32),
                         softmax_scale=0.1, out=np.zeros((1, 1, 4, 512), np.float32), lse=np.zeros((1, 1, 4), np.float32))


def test_readme_python_examples_run():
    # The README's examples are current: each ```python block runs as written (from the repo root).
    import pathlib
    import re
    root = pathlib.Path(__file__).resolve().parents[2]
    blocks = re.findall(r"```python\n(.*?)```", (root / "README.md").read_text(encoding="utf-8"), re.S)
    assert len(blocks) >= 2
    cwd = os.getcwd()
    os.chdir(root)
    try:
        for b in blocks:
            exec(compile(b, "README.md", "exec"), {})
    finally:
        os.chdir(cwd)


def test_the_stub_matches_the_module():
    # mlakv/_core.pyi declares exactly the module's public names, and each class's public members.
    import ast
    import pathlib
    stub = ast.parse((pathlib.Path(mlakv.__file__).parent / "_core.pyi").read_text())
    declared = {}
    for node in stub.body:
        if isinstance(node, ast.ClassDef):
            declared[node.name] = {n.name for n in node.body if isinstance(n, ast.FunctionDef)} - {"__init__"}
        elif isinstance(node, ast.FunctionDef):
            declared[node.name] = None
        elif isinstance(node, ast.AnnAssign):
            declared[node.target.id] = None
    helpers = {"Array", "TextOrTokens", "ProgressFn"}  # type aliases of the stub only
    public = {n for n in dir(mlakv._core) if not n.startswith("_")}
    assert public == set(declared) - helpers
    for name, members in declared.items():
        if members is not None:
            cls = getattr(mlakv._core, name)
            have = {n for n in dir(cls) if not n.startswith("_")}
            assert have == members, (name, have ^ members)


def test_nvfp4_scale_search(rng):
    # The writer option: records decode as any others; each group's squared error at most RN's;
    # PagedCache and write_cache give encode's bytes; the per-token mode and non-nvfp4 formats
    # refuse it; a v1 transform file means "rn", a v2 file says its mode.
    lat, rope = latents(rng, 40)
    lat = lat * np.float32(3.0)
    for fmt in ("nvfp4_ds_mla", "nvfp4_ds_mla_fp8rope", "nvfp4_ds_mla_int8rope"):
        rn = mlakv.encode(lat, rope, fmt, outer_scale=0.01)
        se = mlakv.encode(lat, rope, fmt, outer_scale=0.01, nvfp4_scales="search")
        assert not np.array_equal(rn, se)
        np.testing.assert_array_equal(rn[:, 288:], se[:, 288:])  # rope and pad: untouched
        l_rn, _ = mlakv.decode(rn, fmt, outer_scale=0.01)
        l_se, _ = mlakv.decode(se, fmt, outer_scale=0.01)
        e_rn = ((l_rn.astype(np.float64) - lat) ** 2).reshape(40, 32, 16).sum(-1)
        e_se = ((l_se.astype(np.float64) - lat) ** 2).reshape(40, 32, 16).sum(-1)
        assert np.all(e_se <= e_rn * (1 + 1e-4) + 1e-30)
        assert e_se.sum() < 0.97 * e_rn.sum()
        cache = mlakv.PagedCache(num_blocks=1, block_size=64, formats=[fmt], outer_scales=[0.01],
                                 nvfp4_scales="search")
        seq = cache.add_sequence()
        slots = cache.append(seq, 40)
        cache.write(0, slots, lat, rope)
        assert cache.layer(0).nvfp4_scales == "search"
        np.testing.assert_array_equal(cache.layer(0).tensor()[0, :40], se)
        kv = np.zeros((1, 64, mlakv.record_bytes(fmt)), np.uint8)
        mlakv.write_cache(kv, np.arange(40, dtype=np.int64), lat, rope, format=fmt, outer_scale=0.01,
                          nvfp4_scales="search")
        np.testing.assert_array_equal(kv[0, :40], se)
    with pytest.raises(ValueError, match="per-token scale mode"):
        mlakv.encode(lat, rope, "nvfp4_ds_mla", token_scale=True, nvfp4_scales="search")
    with pytest.raises(ValueError, match="encoder option of the nvfp4 formats"):
        mlakv.encode(lat, rope, "fp8_ds_mla", nvfp4_scales="search")
    with pytest.raises(ValueError, match="nvfp4_scales"):
        mlakv.encode(lat, rope, "nvfp4_ds_mla", nvfp4_scales="nearest")
    f = _transform_file(rng)
    assert mlakv.parse_latent_transform(json.dumps(f)).nvfp4_scales == "rn"  # v1
    f["format"] = "mlakv_latent_transform_v2"
    f["nvfp4_scales"] = "search"
    t = mlakv.parse_latent_transform(json.dumps(f))
    assert t.nvfp4_scales == "search"
    assert json.loads(t.to_json())["nvfp4_scales"] == "search"
