"""Type stubs for mlakv._core (the nanobind module). Arrays are anything with DLPack
(numpy arrays, torch tensors); shapes in the docstrings use B batch, S queries per
request, H heads, T tokens, L = 512 latent dims, R = 64 rope dims."""
from typing import Any, Optional, Sequence

import numpy as np
import numpy.typing as npt

Array = Any  # numpy.ndarray | torch.Tensor | any __dlpack__ object

LATENT_DIM: int
ROPE_DIM: int

def formats() -> list[dict[str, Any]]:
    """Every record format: name, record_bytes, has_outer_scale, summary, regions [(offset, bytes, what)]."""
def record_bytes(format: str) -> int: ...
def encode(latent: Array, rope: Array, format: str, *, outer_scale: float = 1.0, fp8_scales: str = "pow2",
           out: Optional[Array] = None, token_scale: bool = False) -> npt.NDArray[np.uint8]:
    """latent [n, 512], rope [n, 64] (f32 or bf16, CPU) -> records [n, record_bytes] uint8 (into `out` if given).
    token_scale: the nvfp4 per-token scale mode (s_t at bytes [292, 296); replaces outer_scale)."""
def decode(records: Array, format: str, *, outer_scale: float = 1.0, latent_dim: int = 512,
           rope_dim: int = 64, token_scale: bool = False) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]:
    """records [n, record_bytes] uint8 -> (latent [n, 512], rope [n, 64]) float32."""
def write_cache(kv_cache: Array, slot_mapping: Array, latent: Array, rope: Array, *, format: str,
                outer_scale: float = 1.0, fp8_scales: str = "pow2", stream: int = 0, token_scale: bool = False) -> None:
    """vLLM's concat_and_cache_mla: kv_cache [num_blocks, block_size, record_bytes] uint8 (written in place),
    slot_mapping [n] int64/int32 (-1 = padding, skipped), latent [n, 512], rope [n, 64]. All or nothing."""

class CacheLayer:
    """One layer of a paged cache over memory it keeps alive."""
    @property
    def num_blocks(self) -> int: ...
    @property
    def block_size(self) -> int: ...
    @property
    def record_bytes(self) -> int: ...
    @property
    def format(self) -> str: ...
    @property
    def outer_scale(self) -> float: ...
    @property
    def token_scale(self) -> bool: ...
    @property
    def device(self) -> str: ...
    def tensor(self) -> npt.NDArray[np.uint8]:
        """The layer's bytes [num_blocks, block_size, record_bytes] (a view, no copy)."""

def cache_layer(kv_cache: Array, format: str, *, outer_scale: float = 1.0, token_scale: bool = False) -> CacheLayer:
    """Wraps a caller's [num_blocks, block_size, record_bytes] uint8 tensor (no copy)."""

class PagedCache:
    def __init__(self, num_blocks: int, *, block_size: int = 64, num_layers: int = 1,
                 formats: Sequence[str] = ("bf16",), outer_scales: Sequence[float] = (),
                 fp8_scales: str = "pow2", token_scale: bool = False) -> None:
        """token_scale: every layer in the nvfp4 per-token scale mode (nvfp4 formats, no outer_scales)."""
    def add_sequence(self) -> int: ...
    def append(self, seq: int, n: int) -> npt.NDArray[np.int64]:
        """Reserves n tokens; returns their slot ids [n]. All or nothing (MemoryError when full)."""
    def fork(self, seq: int) -> int: ...
    def free(self, seq: int) -> None: ...
    def length(self, seq: int) -> int: ...
    def block_table(self, seq: int) -> npt.NDArray[np.int32]: ...
    def tables(self, seqs: Sequence[int]) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.int32]]:
        """(block_table [B, max_blocks] int32 (-1 unused), seqlens [B] int32)."""
    def write(self, layer: int, slots: Array, latent: Array, rope: Array) -> None: ...
    def layer(self, layer: int) -> CacheLayer: ...
    @property
    def num_blocks(self) -> int: ...
    @property
    def block_size(self) -> int: ...
    @property
    def num_layers(self) -> int: ...
    @property
    def num_free_blocks(self) -> int: ...
    @property
    def nbytes(self) -> int: ...

def mla_decode(q: Array, cache_layer: CacheLayer, block_table: Optional[Array] = None,
               seqlens: Optional[Array] = None, *, softmax_scale: float, causal: bool = True,
               indices: Optional[Array] = None, topk_length: Optional[Array] = None,
               num_splits: Optional[int] = None, return_lse: bool = True, out: Optional[Array] = None,
               lse: Optional[Array] = None, workspace: Optional[Array] = None, stream: int = 0) -> Any:
    """Absorbed MLA attention. q [B, S, H, 576] f32/bf16; dense: block_table [B, max_blocks] int32,
    seqlens [B] int32; sparse: indices [B, S, topk] int32 slot ids (invalid ones skipped), topk_length [B].
    Returns out [B, S, H, 512] f32 (and lse [B, S, H] f32, natural log), written into out/lse if given.
    On CUDA tensors: out and lse must be given, `workspace` (uint8, on the device) when num_splits > 1, and the
    kernels are enqueued on `stream` (a cudaStream_t as int, e.g. torch.cuda.current_stream().cuda_stream):
    no allocation and no host synchronisation, so the call can be captured in a CUDA graph."""
def merge_attn_states(o_parts: Array, lse_parts: Array, *, out: Optional[Array] = None,
                      lse: Optional[Array] = None) -> tuple[Any, Any]:
    """o_parts [P, N, D] f32, lse_parts [P, N] f32 -> (out [N, D], lse [N]); lse = -inf parts count nothing."""
def set_num_threads(n: int) -> None: ...
def num_threads() -> int: ...
def cpu_isa() -> str: ...
def cuda_available() -> bool:
    """Whether this build has the CUDA backend (CUDA tensors accepted by write_cache / mla_decode)."""
def plan(model: str, *, format: str = "fp8_ds_mla", gpus: int = 1, gpu_mem_gib: float = 80.0, tp: int = 1,
         dcp: int = 1, mem_util: float = 0.9, reserved_gib: float = 0.0, block_size: int = 64) -> dict[str, Any]:
    """KV capacity for a preset name or a config.json path (mlakv plan)."""

class OuterScales:
    @property
    def scales(self) -> list[float]: ...
    @property
    def max_abs(self) -> list[float]: ...
    @property
    def num_layers(self) -> int: ...
    def scale_for(self, layer: int) -> float: ...
    def to_json(self) -> str: ...
    def save(self, path: str) -> None: ...

def load_outer_scales(path: str) -> OuterScales: ...
def parse_outer_scales(text: str) -> OuterScales: ...
def outer_scales_from_max_abs(max_abs: Sequence[float]) -> OuterScales: ...

class Calibrator:
    """max |kv_c_normed| per layer -> nvfp4_ds_mla_outer_scale_v1 scales (s_l = max_abs / 2688)."""
    def __init__(self) -> None: ...
    def add(self, layer: int, kv_c_normed: Array) -> None: ...
    @property
    def max_abs(self) -> list[float]: ...
    def finish(self, num_layers: int = 0) -> OuterScales: ...
