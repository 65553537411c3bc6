"""Type stubs for mlakv._core (the nanobind module). Arrays are anything with DLPack
(numpy arrays, torch tensors); shapes in the docstrings use B batch, S queries per
request, H heads, T tokens, L = 512 latent dims, R = 64 rope dims."""
from typing import Any, Callable, Optional, Sequence

import numpy as np
import numpy.typing as npt

Array = Any  # numpy.ndarray | torch.Tensor | any __dlpack__ object

LATENT_DIM: int
ROPE_DIM: int

def formats() -> list[dict[str, Any]]:
    """Every record format: name, record_bytes, has_outer_scale, summary, regions [(offset, bytes, what)]."""
def record_bytes(format: str) -> int: ...
def encode(latent: Array, rope: Array, format: str, *, outer_scale: float = 1.0, fp8_scales: str = "pow2",
           out: Optional[Array] = None, token_scale: bool = False, nvfp4_scales: str = "rn") -> npt.NDArray[np.uint8]:
    """latent [n, 512], rope [n, 64] (f32 or bf16, CPU) -> records [n, record_bytes] uint8 (into `out` if given).
    token_scale: the nvfp4 per-token scale mode (s_t at bytes [292, 296); replaces outer_scale).
    nvfp4_scales: "rn" (round to nearest) or "search" (each group's scale among RN-1, RN, RN+1 by its
    squared error; nvfp4 formats outside token_scale; the records decode as any others)."""
def decode(records: Array, format: str, *, outer_scale: float = 1.0, latent_dim: int = 512,
           rope_dim: int = 64, token_scale: bool = False) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]:
    """records [n, record_bytes] uint8 -> (latent [n, 512], rope [n, 64]) float32."""
def write_cache(kv_cache: Array, slot_mapping: Array, latent: Array, rope: Array, *, format: str,
                outer_scale: float = 1.0, fp8_scales: str = "pow2", stream: int = 0, token_scale: bool = False,
                check_scales: bool | None = None, nvfp4_scales: str = "rn") -> None:
    """vLLM's concat_and_cache_mla: kv_cache [num_blocks, block_size, record_bytes] uint8 (written in place),
    slot_mapping [n] int64/int32 (-1 = padding, skipped), latent [n, 512], rope [n, 64]. All or nothing.
    check_scales: warn (UserWarning) when most nvfp4 group scales of the written tokens fall into e4m3
    subnormals (small latents at an uncalibrated outer_scale; the message names the fix). None: on for
    CPU caches, off for CUDA ones (there the check reads a device tally back and synchronizes the stream;
    not for CUDA-graph capture)."""

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
    def nvfp4_scales(self) -> str: ...
    @property
    def device(self) -> str: ...
    def tensor(self) -> npt.NDArray[np.uint8]:
        """The layer's bytes [num_blocks, block_size, record_bytes] (a view, no copy)."""

def cache_layer(kv_cache: Array, format: str, *, outer_scale: float = 1.0, token_scale: bool = False,
                nvfp4_scales: str = "rn") -> CacheLayer:
    """Wraps a caller's [num_blocks, block_size, record_bytes] uint8 tensor (no copy)."""

class PagedCache:
    def __init__(self, num_blocks: int, *, block_size: int = 64, num_layers: int = 1,
                 formats: Sequence[str] = ("bf16",), outer_scales: Sequence[float] = (),
                 fp8_scales: str = "pow2", token_scale: bool = False, nvfp4_scales: str = "rn") -> None:
        """token_scale: every layer in the nvfp4 per-token scale mode (nvfp4 formats, no outer_scales).
        nvfp4_scales: how the writer chooses nvfp4 group scales, "rn" or "search" (every layer nvfp4, no
        token_scale); a LatentTransform's records take its own (LatentTransform.nvfp4_scales)."""
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

class LatentTransform:
    """A mlakv_latent_transform_v2 (or v1) file (the mlakv recipe, docs/calibration.md)."""
    @property
    def num_layers(self) -> int: ...
    @property
    def nvfp4_scales(self) -> str:
        """"rn" or "search": how the nvfp4 writers encode this transform's records (v1 files: "rn")."""
    @property
    def outer_scales(self) -> list[float]: ...
    @property
    def importance(self) -> str: ...
    def layer(self, layer: int) -> dict: ...
    def apply(self, layer: int, latent: Any, rope: Any) -> tuple[np.ndarray, np.ndarray]: ...
    def fold_rows(self, layer: int, rows: Any) -> tuple[np.ndarray, np.ndarray]: ...
    def rotate_rope(self, layer: int, x: Any) -> np.ndarray: ...
    def to_json(self) -> str: ...
    def save(self, path: str) -> None: ...

def load_latent_transform(path: str) -> LatentTransform: ...
def parse_latent_transform(text: str) -> LatentTransform: ...
def latent_transform_signs(seed: int, n: int) -> list[float]: ...
def parse_outer_scales(text: str) -> OuterScales: ...
def outer_scales_from_max_abs(max_abs: Sequence[float]) -> OuterScales: ...

class Calibrator:
    """max |kv_c_normed| per layer -> nvfp4_ds_mla_outer_scale_v1 scales (s_l = max_abs / 2688)."""
    def __init__(self) -> None: ...
    def add(self, layer: int, kv_c_normed: Array) -> None: ...
    @property
    def max_abs(self) -> list[float]: ...
    def finish(self, num_layers: int = 0) -> OuterScales: ...

class Tokenizer:
    """A Hugging Face tokenizer.json (BPE / WordPiece / Unigram, its normalizer, pre-tokenizer,
    post-processor and decoder), the C++ tokenizer the CLI uses."""
    @staticmethod
    def load(path: str) -> Tokenizer:
        """tokenizer.json, or a directory holding it (and tokenizer_config.json)."""
    @staticmethod
    def byte_level() -> Tokenizer:
        """The 256-id byte-level tokenizer (id = byte)."""
    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]: ...
    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = False) -> str:
        """Bytes that do not form UTF-8 (a cut character) become U+FFFD."""
    def id_to_token(self, id: int) -> str: ...
    def token_to_id(self, token: str) -> int: ...
    def is_special(self, id: int) -> bool: ...
    @property
    def vocab_size(self) -> int: ...
    @property
    def bos_id(self) -> Optional[int]: ...
    @property
    def eos_id(self) -> Optional[int]: ...

TextOrTokens = Any  # str (text) | Sequence[int] | 1-D int32/int64 array (token ids)
ProgressFn = Callable[[str, int, int], None]  # (stage, done, total)

class Model:
    """A DeepSeek-V3-family checkpoint on the CPU model runner (include/mlakv/model.h): the model
    `mlakv eval` / `mlakv generate` / `mlakv calibrate --model` run. Long calls release the GIL;
    one call at a time per Model (a second thread waits)."""
    @staticmethod
    def load(path: str, *, threads: int = 0) -> Model:
        """A directory with config.json and model.safetensors(.index.json); threads 0 = all cores.
        FileNotFoundError for a missing file or tensor, ValueError for a bad one,
        NotImplementedError for a model_type or setting the runner cannot run."""
    @property
    def path(self) -> str: ...
    @property
    def config(self) -> dict[str, Any]:
        """model_type, num_layers, hidden_size, num_heads, q_lora_rank, kv_lora_rank, qk_nope_head_dim,
        qk_rope_head_dim, v_head_dim, rms_norm_eps, rope_theta, rope_interleaved, max_position_embeddings,
        index_topk, softmax_scale, vocab_size, intermediate_size, moe_intermediate_size, n_routed_experts,
        num_experts_per_tok, n_shared_experts, num_moe_layers, num_mtp_layers, tie_word_embeddings."""
    @property
    def num_layers(self) -> int: ...
    @property
    def vocab_size(self) -> int: ...
    @property
    def notes(self) -> list[str]:
        """Load-time facts (dense attention for DSA models, skipped MTP tensors, dequantized encodings)."""
    @property
    def memory(self) -> dict[str, int]: ...
    @property
    def has_tokenizer(self) -> bool: ...
    @property
    def tokenizer(self) -> Tokenizer:
        """tokenizer.json of the directory, else byte-level for a 256-id vocabulary, else ValueError."""
    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]: ...
    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = False) -> str: ...
    def eval(self, input: TextOrTokens, *, context: int = 2048, windows: int = 32,
             formats: Sequence[str] = ("bf16", "fp8_ds_mla", "nvfp4_ds_mla", "nvfp4_ds_mla_fp8rope",
                                       "nvfp4_ds_mla_int8rope"),
             scales: Optional[str | Sequence[str]] = None, recipe: str = "", importance: str = "uniform",
             seed_candidates: int = 4, calib_windows: int = 4, needle: int = 0, block_size: int = 64,
             progress: Optional[ProgressFn] = None, nvfp4_scales: str = "search") -> dict[str, Any]:
        """`mlakv eval --json` as a dict (the same keys): teacher-forced KLD against the f32 cache, top-1,
        perplexity and needle retrieval of each format over `windows` windows of `context` tokens.
        Text is encoded without special tokens (as --text); a format may be "NAME+token-scale" (nvfp4).
        scales (--scales): None, or one or a list of "auto" (calibrated on calib_windows windows after
        the eval windows) / a scale file of either kind (outer scales or mlakv_latent_transform_v2/v1), read
        by the loader the CLI uses; recipe (--recipe): "", "fork", "mlakv" or "both"; importance
        (--importance) and seed_candidates (--seed-candidates: sign seeds tried on the calibration
        windows, the lowest-KLD one kept) and nvfp4_scales (--nvfp4-scales) for the mlakv recipe's auto calibration. progress(stage, done, total) is called
        with stage "calibration (fork recipe)", "calibration (mlakv recipe)", "eval" or "needle"; an
        exception it raises stops further calls and is raised when the run ends."""
    def generate(self, prompt: TextOrTokens, *, format: str = "bf16", max_tokens: int = 64,
                 scales: Optional[str] = None, stop_at_eos: bool = True, block_size: int = 64) -> dict[str, Any]:
        """`mlakv generate --json` as a dict: greedy decoding through the paged cache in `format`
        ("reference" = the f32 cache). Text prompts are encoded with special tokens (as --prompt).
        Keys: format, prompt_tokens, generated_tokens, tokens, text (None without a tokenizer),
        prefill_tokens_per_s, decode_tokens_per_s."""
    def calibrate(self, input: TextOrTokens, *, context: int = 2048, windows: int = 8, skip: int = 0,
                  progress: Optional[ProgressFn] = None) -> OuterScales:
        """`mlakv calibrate --model`: max |kv_c_normed| per layer over the windows (f32 cache),
        s_l = max_abs / 2688; .save(path) writes the nvfp4_ds_mla_outer_scale_v1 file eval reads."""

class DecodePlan:
    """CUDA plan / run: plan once per batch shape (split count, workspace size, kernel path and its
    shared-memory configuration, all on the host), then run() as often as wanted, under CUDA-graph
    capture too: run() allocates nothing and never synchronises. Raises ValueError in a build
    without the CUDA backend or for CPU tensors (use mla_decode there)."""
    def __init__(self, q: Array, cache_layer: CacheLayer, block_table: Optional[Array] = None,
                 seqlens: Optional[Array] = None, *, softmax_scale: float, causal: bool = True,
                 indices: Optional[Array] = None, topk_length: Optional[Array] = None,
                 num_splits: Optional[int] = None, out: Array, lse: Array) -> None:
        """The tensors of the call as mla_decode takes them (CUDA). num_splits None: the split count
        that fills the GPU once for this shape (cuda::suggest_num_splits)."""
    def run(self, q: Array, cache_layer: CacheLayer, block_table: Optional[Array] = None,
            seqlens: Optional[Array] = None, *, indices: Optional[Array] = None,
            topk_length: Optional[Array] = None, out: Array, lse: Array, workspace: Optional[Array] = None,
            stream: int = 0) -> None:
        """Enqueues on `stream`. Every tensor must match the planned one in shape, dtype, device and
        strides (contents and buffers may differ), the layer in geometry and format; `workspace` a
        contiguous uint8 device tensor of >= workspace_bytes when num_splits > 1."""
    @property
    def num_splits(self) -> int: ...
    @property
    def workspace_bytes(self) -> int: ...
    @property
    def path(self) -> str:
        """The kernel path the plan runs: "sm80", "sm90", "sm90_rows" or "sm90_nat"."""
