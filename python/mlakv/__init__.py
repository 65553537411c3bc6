"""mlakv: Multi-head Latent Attention over compressed, paged KV caches.

The C++ library does the work; this package converts. Tensors cross without copies
through DLPack (numpy arrays, torch tensors, anything with ``__dlpack__``), and every
bad argument raises ``ValueError`` / ``TypeError`` / ``IndexError`` naming it.

    import numpy as np, mlakv
    cache = mlakv.PagedCache(num_blocks=64, block_size=64, formats=["fp8_ds_mla"])
    seq = cache.add_sequence()
    slots = cache.append(seq, 100)
    cache.write(0, slots, latent, rope)                  # latent [100, 512], rope [100, 64]
    table, seqlens = cache.tables([seq])
    out, lse = mlakv.mla_decode(q, cache.layer(0), table, seqlens, softmax_scale=0.1352)
"""
from ._core import (  # noqa: F401
    LATENT_DIM,
    ROPE_DIM,
    CacheLayer,
    Calibrator,
    LatentTransform,
    DecodePlan,
    Model,
    OuterScales,
    PagedCache,
    Tokenizer,
    cache_layer,
    cpu_isa,
    cuda_available,
    decode,
    encode,
    formats,
    latent_transform_signs,
    load_latent_transform,
    load_outer_scales,
    merge_attn_states,
    mla_decode,
    num_threads,
    outer_scales_from_max_abs,
    parse_latent_transform,
    parse_outer_scales,
    plan,
    record_bytes,
    set_num_threads,
    write_cache,
)
from ._version import __version__  # noqa: F401

QK_DIM = LATENT_DIM + ROPE_DIM
