"""Independent numpy readers of the record formats (docs/formats.md), written from the byte
tables, and a float64 numpy MLA attention: the references the binding is checked against."""
import numpy as np

E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], dtype=np.float64)


def bf16_to_f64(u16):
    return (u16.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def e4m3_to_f64(b):
    b = b.astype(np.int64)
    s = np.where(b & 0x80, -1.0, 1.0)
    e = (b >> 3) & 0xF
    m = b & 0x7
    v = np.where(e == 0, m / 8.0 * 2.0 ** -6, (1 + m / 8.0) * 2.0 ** (e - 7))
    v = np.where((e == 15) & (m == 7), np.nan, v)
    return s * v


def decode(records, fmt, outer_scale=1.0, token_scale=False):
    """token_scale: the nvfp4 per-token scale mode, the latent multiplied by each record's
    fp32 s_t at bytes [292, 296) instead of outer_scale."""
    r = np.ascontiguousarray(records)
    n = r.shape[0]
    if fmt == "bf16":
        u = r.view(np.uint16).reshape(n, 576)
        x = bf16_to_f64(u)
        return x[:, :512], x[:, 512:]
    if fmt == "f32":
        x = r.view(np.float32).reshape(n, 576).astype(np.float64)
        return x[:, :512], x[:, 512:]
    if fmt == "fp8_ds_mla":
        lat = e4m3_to_f64(r[:, :512])
        scales = r[:, 512:528].copy().view(np.float32).astype(np.float64)  # [n, 4]
        lat = lat.astype(np.float32) * np.repeat(scales, 128, axis=1).astype(np.float32)
        rope = bf16_to_f64(r[:, 528:656].copy().view(np.uint16))
        return lat, rope
    if fmt in ("nvfp4_ds_mla", "nvfp4_ds_mla_fp8rope", "nvfp4_ds_mla_int8rope"):
        codes = r[:, :256]
        lo, hi = codes & 0xF, codes >> 4
        q = np.empty((n, 512), dtype=np.float64)
        q[:, 0::2] = E2M1[lo]
        q[:, 1::2] = E2M1[hi]
        sf = e4m3_to_f64(r[:, 256:288])  # [n, 32]
        # Reader: x = (e2m1 * e4m3(sf)) * s_l in float32; the product in parentheses is exact.
        if token_scale:
            scale = r[:, 292:296].copy().view(np.float32)  # [n, 1] s_t
        else:
            scale = np.float32(outer_scale)
        lat = (q * np.repeat(sf, 16, axis=1)).astype(np.float32) * scale
        if fmt == "nvfp4_ds_mla":
            rope = bf16_to_f64(r[:, 304:432].copy().view(np.uint16))
        elif fmt == "nvfp4_ds_mla_fp8rope":
            rs = r[:, 288:292].copy().view(np.float32).astype(np.float64)  # [n, 1]
            rope = e4m3_to_f64(r[:, 304:368]).astype(np.float32) * rs.astype(np.float32)
        else:  # int8 rope: v = q * rs, q a signed byte
            rs = r[:, 288:292].copy().view(np.float32)  # [n, 1]
            rope = r[:, 304:368].view(np.int8).astype(np.float32) * rs
        return lat, rope
    raise ValueError(fmt)


def attention(q, keys, softmax_scale, visible):
    """q [H, 576], keys [T, 576] (decoded latent | rope), first `visible` tokens -> out [H, 512], lse [H]."""
    q = q.astype(np.float64)
    k = keys[:visible].astype(np.float64)
    if visible == 0:
        return np.zeros((q.shape[0], 512)), np.full(q.shape[0], -np.inf)
    s = (q @ k.T) * softmax_scale
    m = s.max(axis=1, keepdims=True)
    p = np.exp(s - m)
    z = p.sum(axis=1, keepdims=True)
    out = (p / z) @ k[:, :512]
    return out, (m + np.log(z))[:, 0]
