"""Paged attention for a flat ragged batch: one "unified" flash-attention kernel.

Every sequence i owns query rows query_start_loc[i]:query_start_loc[i+1] (decode: 1 row; prefill
chunk: many) that follow ctx_len = seq_len - q_len tokens already in the cache; the new tokens' K
and V are in the cache too (write_kv_cache ran first). Query row j sits at absolute position
ctx_len + j and attends causally to cache positions 0..ctx_len + j.

Layouts (element strides passed in; the last dim of every tensor must be contiguous):
  q, out          [num_tokens, num_heads, head_dim]
  k_cache, v_cache [num_blocks, block_size, num_kv_heads, head_dim]; FP8 caches hold K / k_scale, V / v_scale
  block_tables    [num_seqs, max_blocks] int32: physical block of each logical block
  seq_lens        [num_seqs] int32: ctx_len + q_len
  query_start_loc [num_seqs + 1] int32: cumulative q_len
  k_scale, v_scale [1] float32 (FP8 caches only): k_scale folds into the softmax scale, v_scale into
                  the output, both read on the device (no host sync)

Work split: a program owns one KV head and a tile of BLOCK_M query rows = BLOCK_Q query tokens of
one sequence x the GROUP query heads that share that KV head (GQA). Decode thus packs the group's
heads into the M dimension of tl.dot, and each K/V tile is read once per KV head, not per query
head. The program walks the sequence's keys in tiles of TILE_N, gathering each key's physical
block through the block table (TILE_N may span several blocks or part of one). Tiles wholly below
the tile's first query position need no mask; the rest, up to its last query position, are masked.
Softmax is online in the log2 domain with float32 statistics and accumulator.

Grid: one axis of (num_tokens // BLOCK_Q + num_seqs) x num_kv_heads programs, KV head fastest.
Sequence i's query blocks start at global index query_start_loc[i] // BLOCK_Q + i, an
upper-bounded numbering that needs no host sync; a program finds its sequence by binary search over
query_start_loc and exits if its block is empty. Batches with prefill chunks can read the step's new
K/V from the contiguous projections through tensor descriptors (prefill_new_kv_desc), the cached
prefix still through the block table.

Optional features (kernels/reference.py's paged_attention defines them), constexpr flags of the
kernels so that steps without them run the kernels compiled as before: `sliding_window` W (a query
at p sees keys p - W < k <= p; key tiles wholly outside every row's window are skipped, so blocks
before them are never read), `sinks` (float32 [num_heads]: one logit per head in the softmax
denominator; on the split path it enters in the merge, once) and `softcap` c (scores become
c * tanh(scores / c) after scaling, before masking). The plan sizes split-KV on the visible length
min(max_seq_len, W) when built with the window (plan_attention's sliding_window).

Pure-decode batches with too few (sequence, KV head) pairs to fill the GPU take the split-KV path
of attention_split.py instead (choose_num_splits). Tiles and split parameters come from a table per
GPU family (ATTENTION_CONFIGS), picked at run time. The split kernel merges its partial results
itself where the arrival counters allow (`merge_in_kernel`), and can then also quantize each token's
output for the next linear layer (`quantize`: the o_proj of a W8A8 model), which otherwise takes a
quantization kernel after the attention.

Two registered implementations of the attention op (kernels/registry.py) share this plan:
`triton_unified` (the portable kernels above, every GPU) and `triton_fp8_decode_sm90`, which also
sends pure-decode batches over an FP8 cache on Hopper to the Gluon kernel of
attention_fp8_decode_sm90.py (split or not; its tiles live there), whose hand-picked layouts avoid
the FP8 operand costs of tl.dot. The Gluon kernel has none of the optional features and its
implementation does not declare them, so the engine's auto selection takes `triton_unified` for
models that use them; a call with a feature on a plan of it runs the portable kernels. The engine's kernel selection picks one (auto: the Gluon one where
it runs); this module does not choose between them.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton

# platform switches on the interpreter on CPU; triton reads that when a kernel is defined, below
from tritonllm import platform
from tritonllm.kernels import attention_fp8_decode_sm90 as fp8_sm90
from tritonllm.kernels import attention_rope, attention_split
from tritonllm.kernels.attention_rope import FoldedRope
from tritonllm.kernels.attention_split import merge_splits_kernel, split_kv_decode_kernel
from tritonllm.kernels.attention_unified import unified_attention_kernel
from tritonllm.kernels.kv_cache_write import FP8_KV_DTYPES, KV_WRITE_SUPPORTS, check_kv_scales
from tritonllm.kernels.launch import MAX_ARRIVAL_COUNTERS, Launcher, aligned, arrival_counters, int_spec
from tritonllm.kernels.quant import fused_scales, min_exponent, quantize_rows
from tritonllm.kernels.quant_formats import BLOCK, OutputQuant, QuantizedActivation, qmax
from tritonllm.kernels.registry import FLOATS, Supports, register

try:  # triton >= 3.4: host-side tensor descriptors (TMA on Hopper)
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover
    TensorDescriptor = None

_num_multiprocessors = functools.cache(platform.num_multiprocessors)
_LOG2_E = 1.4426950408889634


@dataclass(frozen=True)
class AttentionTiles:
    block_m: int  # query rows per program: query tokens x query heads of one KV head; >= 16
    tile_n: int  # keys per step of the KV loop; >= 16
    num_warps: int
    num_stages: int


@dataclass(frozen=True)
class AttentionConfig:
    """Tiles and split-KV parameters of one GPU family. block_m is a minimum (raised to the GQA
    group); tile_n is for head_dim <= 128 and halves per doubling beyond, so K/V stages fit."""

    decode_few: AttentionTiles  # pure decode, < few_programs_per_sm (seq, KV head) programs per SM
    decode_many: AttentionTiles  # pure decode, more programs
    mixed: AttentionTiles  # a batch with query runs of more than 16 rows (prefill chunks)
    split: AttentionTiles  # the split-KV decode kernel
    decode_fp8: AttentionTiles  # pure decode (unsplit) over an FP8 cache: half the bytes per key
    few_programs_per_sm: int
    split_programs_per_sm: int  # split-KV: split until seqs x KV heads x splits reaches this per SM
    split_min_keys: int  # and keep at least this many keys per split
    max_splits: int
    # FP8 caches: widen K/V to float16 (one hardware conversion) and run the dots in float16. On the H200
    # (128 x 8192 decode) that took 714 us against 979-1005 us for bf16 dots (a multi-step conversion)
    fp8_dot_f16: bool = True
    # FP8 caches: quantise q per row to FP8 and run the query-key dot on FP8 tensor cores, so K is never
    # widened. Off: no faster on the H200 (720 vs 714 us), and q's rounding adds error
    fp8_qk: bool = False
    # batches with prefill chunks: read the step's new keys/values from the contiguous K/V projections
    # through tensor descriptors (TMA on Hopper) instead of gathering them from the cache; the cached
    # prefix is still gathered
    prefill_new_kv_desc: bool = False


ATTENTION_CONFIGS: dict[str, AttentionConfig] = {
    # H100/H200/B200 (sm90, sm100): 228 KiB shared memory per SM. decode and mixed tiles from a sweep on
    # an H200 (bf16, 32/8 heads, head_dim 128, block 16; triton 3.6): 128-key tiles with 3 stages keep
    # more loads in flight while programs are few (32 x 8192: 267 us vs 305 us with 64 keys); 64-key
    # tiles win by ~2% once there are several programs per SM (128 x 8192: 992 us, 4.3 TB/s). Longer
    # query runs: 64 rows x 64 keys, fastest or within 1% of the best of 8 configs on a 4096 causal
    # prefill (428 us, 320 TFLOP/s), a 512 chunk after 3584 cached (115 us) and 64 decodes + two 1024
    # chunks (240 us; 128-row tiles took 300-410 us there); a later sweep of 34 tilings found none
    # better on the prefill. With the new K/V read through tensor descriptors (prefill_new_kv_desc)
    # and 3 stages: prefill 4096 319 -> 458-464 TFLOP/s, the 512 chunk 279 TFLOP/s, the mixed batch
    # 169 us (2 stages: 380 TFLOP/s; 128 x 128 tiles, 8 warps: 475-481 TFLOP/s, but the mixed batch
    # 240 us). Split-KV (sweep of split counts x tiles, experiments/attention_kernels):
    # 1 x 1024 best 16.8 us (4 splits, 128-key tiles) vs 17.6 us with this table; 1 x 8192 best 23.0 us
    # (64 splits) vs 24.3 us; 32 x 1024 best unsplit. Within run-to-run noise, so the table stays.
    # split_min_keys 256 -> 32 (session 21, graph-replayed, merge in the kernel,
    # experiments/attention_kernels/h200_session21): 1 x 520 11.6 us at 2 splits against 6.9 at 16;
    # 1 x 1024 11.0 (4) against 7.0 (32); 4 x 640 12.5 (2) against 9.1-9.6 (8-12); 4 x 4096 and 16 x any
    # unchanged (the wave rule binds first). Decode graphs are captured at max_model_len, so this moves
    # eager decode steps (no graph, or a batch above the largest graph), not the graphed ones.
    "hopper": AttentionConfig(
        decode_few=AttentionTiles(block_m=16, tile_n=128, num_warps=4, num_stages=3),
        decode_many=AttentionTiles(block_m=16, tile_n=64, num_warps=4, num_stages=2),
        mixed=AttentionTiles(block_m=64, tile_n=64, num_warps=4, num_stages=3),
        split=AttentionTiles(block_m=16, tile_n=64, num_warps=4, num_stages=3),
        # FP8 sweep (128 x 8192, float16 dots): 128-key tiles 714 us (3 or 4 stages), 64-key 956 us, 8 warps
        # or 256-key tiles 1140-1200 us
        decode_fp8=AttentionTiles(block_m=16, tile_n=128, num_warps=4, num_stages=3),
        few_programs_per_sm=4,
        split_programs_per_sm=2,
        split_min_keys=32,
        max_splits=64,
        prefill_new_kv_desc=True,
    ),
    # A100 (164 KiB) and consumer Ampere/Ada/Blackwell parts (~100 KiB shared memory per SM): two stages
    # of 64-key K and V tiles (64 KiB at head_dim 128 in bf16) fit all of them. Unmeasured.
    "ampere": AttentionConfig(
        decode_few=AttentionTiles(block_m=16, tile_n=64, num_warps=4, num_stages=2),
        decode_many=AttentionTiles(block_m=16, tile_n=64, num_warps=4, num_stages=2),
        mixed=AttentionTiles(block_m=64, tile_n=64, num_warps=4, num_stages=2),
        split=AttentionTiles(block_m=16, tile_n=64, num_warps=4, num_stages=2),
        decode_fp8=AttentionTiles(block_m=16, tile_n=128, num_warps=4, num_stages=2),
        few_programs_per_sm=4,
        split_programs_per_sm=2,
        split_min_keys=256,
        max_splits=64,
    ),
    # AMD CDNA (MI200/MI300, gfx9xx): 64-wide wavefronts (4 warps = 256 lanes), 64 KiB LDS per CU on
    # MI300, so one stage (no LDS multi-buffering) of 64-key tiles. Unmeasured.
    "cdna": AttentionConfig(
        decode_few=AttentionTiles(block_m=16, tile_n=64, num_warps=4, num_stages=1),
        decode_many=AttentionTiles(block_m=16, tile_n=64, num_warps=4, num_stages=1),
        mixed=AttentionTiles(block_m=64, tile_n=64, num_warps=4, num_stages=1),
        split=AttentionTiles(block_m=16, tile_n=64, num_warps=4, num_stages=1),
        decode_fp8=AttentionTiles(block_m=16, tile_n=128, num_warps=4, num_stages=1),
        few_programs_per_sm=4,
        split_programs_per_sm=2,
        split_min_keys=256,
        max_splits=64,
    ),
    # Triton's interpreter (CPU): small tiles keep the tests' multi-tile paths busy; num_multiprocessors
    # is 1, so the split path is taken only for a single (sequence, KV head) pair.
    "interpreter": AttentionConfig(
        decode_few=AttentionTiles(block_m=16, tile_n=16, num_warps=4, num_stages=1),
        decode_many=AttentionTiles(block_m=16, tile_n=16, num_warps=4, num_stages=1),
        mixed=AttentionTiles(block_m=16, tile_n=16, num_warps=4, num_stages=1),
        split=AttentionTiles(block_m=16, tile_n=16, num_warps=4, num_stages=1),
        decode_fp8=AttentionTiles(block_m=16, tile_n=32, num_warps=4, num_stages=1),
        few_programs_per_sm=4,
        split_programs_per_sm=2,
        split_min_keys=32,
        max_splits=16,
    ),
}


@functools.cache
def gpu_family() -> str:
    """The ATTENTION_CONFIGS key of this machine's accelerator."""
    if not platform.is_gpu():
        return "interpreter"
    if torch.version.hip:
        arch = torch.cuda.get_device_properties(platform.DEVICE).gcnArchName
        # RDNA (gfx10-12, 32-wide wavefronts, small LDS) takes the conservative table
        return "cdna" if arch.startswith("gfx9") else "ampere"
    major, _ = torch.cuda.get_device_capability(platform.DEVICE)
    # sm120 (consumer Blackwell) has ~100 KiB of shared memory: the Ampere table fits it
    return "hopper" if major in (9, 10) else "ampere"


def attention_config() -> AttentionConfig:
    return ATTENTION_CONFIGS[gpu_family()]


def choose_num_splits(num_seqs: int, num_kv_heads: int, max_seq_len: int, num_sms: int) -> int:
    """Split-KV segments per sequence for a pure-decode batch; 1 means the unified kernel.

    Splits until num_seqs x num_kv_heads x splits programs make split_programs_per_sm waves on
    num_sms multiprocessors, keeping at least split_min_keys keys per split (shorter splits spend
    more on the merge and the per-program prologue than they gain). Sized on max_seq_len, the host's
    bound on the context, so no host sync is needed.
    """
    config = attention_config()
    programs = num_seqs * num_kv_heads
    if programs == 0 or programs >= num_sms:
        # Already a full wave: on the H200 (2026-11-29) 2 splits gave 32x1024 116 us and 32x8192
        # 269 us, no better than (or, with the merge launch, worse than) the unsplit kernel.
        return 1
    wanted = triton.cdiv(config.split_programs_per_sm * num_sms, programs)
    return max(1, min(wanted, max_seq_len // config.split_min_keys, config.max_splits))


def choose_tiles(
    max_query_len: int,
    group: int,
    head_dim: int,
    num_seqs: int,
    num_kv_heads: int,
    num_splits: int = 1,
    kv_fp8: bool = False,
) -> AttentionTiles:
    """Tiles for a batch whose longest query run is max_query_len rows, GQA group `group`, from this
    GPU family's ATTENTION_CONFIGS entry. Decode-only batches use the smallest M tile tl.dot allows
    (16, or the group if larger): the work there is reading K/V."""
    config = attention_config()
    if num_splits > 1:
        base = config.split
    elif max_query_len * group <= 16 and kv_fp8:
        base = config.decode_fp8
    elif max_query_len * group <= 16:
        few = num_seqs * num_kv_heads < config.few_programs_per_sm * _num_multiprocessors()
        base = config.decode_few if few else config.decode_many
    else:
        base = config.mixed
    # K and V tiles shrink with head_dim so the pipelined stages fit in shared memory
    dim_factor = max(1, head_dim // 128)
    return AttentionTiles(
        block_m=max(base.block_m, 16, triton.next_power_of_2(group)),
        tile_n=max(16, base.tile_n // dim_factor),
        num_warps=base.num_warps,
        num_stages=base.num_stages,
    )


def check_out(out: torch.Tensor, q: torch.Tensor) -> None:
    """A caller's output tensor must be what the kernels write: q's shape and dtype, contiguous
    (they address it with q's row and head strides of a packed [num_tokens, num_heads, head_dim])."""
    if out.shape != q.shape or out.dtype != q.dtype or out.device != q.device or not out.is_contiguous():
        raise ValueError(
            f"paged_attention: out {tuple(out.shape)} {out.dtype} on {out.device} (contiguous: {out.is_contiguous()}) "
            f"must be a contiguous {tuple(q.shape)} {q.dtype} tensor on {q.device}, like q"
        )


@dataclass(frozen=True)
class AttentionFeatures:
    """One layer's optional features as kernel arguments: window (0: none), sinks (None: none) and
    softcap2 = softcap x log2(e) (0.0: none), with their constexpr flags."""

    window: int = 0
    sinks: torch.Tensor | None = None
    softcap2: float = 0.0

    @property
    def sliding(self) -> bool:
        return self.window > 0

    @property
    def has_sinks(self) -> bool:
        return self.sinks is not None

    @property
    def softcapped(self) -> bool:
        return self.softcap2 > 0.0

    @property
    def any(self) -> bool:
        return self.sliding or self.has_sinks or self.softcapped

    @staticmethod
    def of(
        sliding_window: int | None, sinks: torch.Tensor | None, softcap: float | None, num_heads: int,
        device: torch.device,
    ) -> AttentionFeatures:  # fmt: skip
        """The features of paged_attention's keyword arguments, checked."""
        if sliding_window is None and sinks is None and softcap is None:
            return _NO_FEATURES
        if sliding_window is not None and (int(sliding_window) != sliding_window or sliding_window < 1):
            raise ValueError(f"paged_attention: sliding_window {sliding_window} must be a positive integer")
        if sinks is not None and (
            sinks.shape != (num_heads,) or sinks.dtype != torch.float32 or sinks.device != device
            or not sinks.is_contiguous()
        ):  # fmt: skip
            raise ValueError(
                f"paged_attention: sinks {tuple(sinks.shape)} {sinks.dtype} on {sinks.device} must be a contiguous "
                f"float32 [{num_heads}] tensor on {device}"
            )
        if softcap is not None and not softcap > 0:
            raise ValueError(f"paged_attention: softcap {softcap} must be positive")
        return AttentionFeatures(
            window=int(sliding_window or 0), sinks=sinks, softcap2=0.0 if softcap is None else float(softcap) * _LOG2_E
        )


_NO_FEATURES = AttentionFeatures()


class AttentionPlan:
    """One step's attention set-up, shared by every layer: the metadata checked, the split count,
    tiles, integer arguments and (split-KV) workspace fixed. Built once per step
    (AttentionMetadata.attention_plan); `run`, per layer, checks the layer's tensors and launches.
    Layers run one after another on one stream, so they can share the workspace."""

    def __init__(
        self,
        block_tables: torch.Tensor,
        seq_lens: torch.Tensor,
        query_start_loc: torch.Tensor,
        max_query_len: int,
        max_seq_len: int,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        block_size: int,
        *,
        tiles: AttentionTiles | None = None,
        num_splits: int | None = None,
        fp8_dot_f16: bool | None = None,
        fp8_qk: bool | None = None,
        new_kv_desc: bool | None = None,
        fp8_gluon: bool | None = False,
        kv_dtype: torch.dtype | None = None,
        reuse_output: bool = False,
        sliding_window: int | None = None,
        merge_in_kernel: bool | None = None,
    ) -> None:
        if num_heads % num_kv_heads:
            raise ValueError(f"num_heads {num_heads} is not a multiple of num_kv_heads {num_kv_heads}")
        if head_dim < 16 or head_dim & (head_dim - 1):
            raise ValueError(f"head_dim {head_dim} must be a power of two >= 16")
        if block_size & (block_size - 1):
            raise ValueError(f"block_size {block_size} must be a power of two")
        if block_tables.stride(-1) != 1:
            raise ValueError(
                f"paged_attention: block_tables must be contiguous in its last dim ({block_tables.stride()})"
            )
        group = num_heads // num_kv_heads
        num_seqs = seq_lens.shape[0]
        if num_splits is None:
            num_splits = 1
            if max_query_len == 1:
                # a window bounds the keys a query reads (the split kernel skips the rest)
                visible = max_seq_len if sliding_window is None else min(max_seq_len, sliding_window)
                num_splits = choose_num_splits(num_seqs, num_kv_heads, visible, _num_multiprocessors())
        if num_splits < 1 or (num_splits > 1 and max_query_len > 1):
            raise ValueError(
                f"num_splits {num_splits} with max_query_len {max_query_len}: split-KV serves pure-decode "
                "batches (max_query_len 1); use num_splits=1 for batches with prefill chunks"
            )
        if tiles is None:
            kv_fp8 = kv_dtype is not None and kv_dtype.itemsize == 1
            tiles = choose_tiles(max_query_len, group, head_dim, num_seqs, num_kv_heads, num_splits, kv_fp8)
        if tiles.block_m < group or tiles.block_m & (tiles.block_m - 1) or tiles.tile_n & (tiles.tile_n - 1):
            raise ValueError(f"{tiles}: block_m, tile_n must be powers of two, block_m >= group {group}")
        self.block_tables, self.seq_lens, self.query_start_loc = block_tables, seq_lens, query_start_loc
        self.num_seqs, self.num_heads, self.num_kv_heads = num_seqs, num_heads, num_kv_heads
        self.head_dim, self.block_size, self.group = head_dim, block_size, group
        self.tiles, self.num_splits = tiles, num_splits
        # FP8 caches: the float16 dots replace bf16 ones (a float32 q keeps float32 unless forced)
        config = attention_config()
        self.fp8_dot_f16, self.fp8_qk = fp8_dot_f16, fp8_qk
        self._config_dot_f16, self._config_qk = config.fp8_dot_f16, config.fp8_qk
        # new K/V through tensor descriptors: only for batches with prefill chunks on the unified path
        if new_kv_desc is None:
            new_kv_desc = config.prefill_new_kv_desc and max_query_len * group > 16
        self.new_kv_desc = new_kv_desc and num_splits == 1 and TensorDescriptor is not None
        # pure decode over an FP8 cache on sm90: the Gluon kernel (fp8_gluon False: never, the default of
        # the portable implementation; None: where its tile table and the shape allow, as the registered
        # triton_fp8_decode_sm90 implementation asks; True: required)
        self.fp8_tiles = None
        gluon_tiles = fp8_sm90.TILES.get(gpu_family())
        if fp8_gluon and gluon_tiles is None:
            gluon_tiles = fp8_sm90.TILES["hopper"]
        if fp8_gluon is not False and gluon_tiles is not None and max_query_len <= 1:
            tile_n = max(64, gluon_tiles.tile_n // max(1, head_dim // 128))
            if fp8_sm90.available() and fp8_sm90.supported(head_dim, group, block_size, tile_n):
                self.fp8_tiles = fp8_sm90.Fp8DecodeTiles(tile_n, gluon_tiles.num_stages, gluon_tiles.inplace_v)
        if fp8_gluon and self.fp8_tiles is None:
            raise ValueError(
                f"fp8_gluon=True: the Gluon FP8 decode kernel needs an sm90 GPU, Triton with Gluon, a pure-decode "
                f"batch and head_dim 64/128/256 with a group <= 16 (got max_query_len {max_query_len}, head_dim "
                f"{head_dim}, group {group}); use fp8_gluon=None"
            )
        self.device_index = seq_lens.device.index or 0
        # reuse_output: every run returns the same buffer (the engine's layers consume it before the next
        # layer's attention runs), which saves an allocation per layer
        self.reuse_output = reuse_output
        self._out: torch.Tensor | None = None
        self._flags: dict[tuple, tuple] = {}
        self._bt_stride = block_tables.stride(0)
        # the step's integer arguments; Launcher adds the tiles (constexprs, warps, stages) and device
        self._step_key = (num_splits, *int_spec(num_seqs, self._bt_stride))
        # split-KV: merged by the split kernel's last program per KV head (None: where the counters and
        # register budget allow; False: by the merge kernel, the ablation; True: required)
        self.counters = None
        if num_splits > 1 and merge_in_kernel is not False:
            counters = arrival_counters(seq_lens.device)
            if counters is not None and num_seqs * (num_kv_heads + 1) <= MAX_ARRIVAL_COUNTERS:
                self.counters = counters
        if merge_in_kernel and self.counters is None:
            raise ValueError(
                f"merge_in_kernel=True needs split-KV (num_splits {num_splits}) and the arrival counters (none while a "
                "graph is captured before they exist; launch.arrival_counters); use merge_in_kernel=None"
            )
        if num_splits > 1:
            # one float32 workspace: partial outputs, maxima and sums, each 16-byte aligned
            rows = num_seqs * num_heads * num_splits
            padded = triton.cdiv(rows, 4) * 4
            work = torch.empty(padded * (head_dim + 2), dtype=torch.float32, device=seq_lens.device)
            self.partial_out = work[: rows * head_dim].view(num_seqs, num_heads, num_splits, head_dim)
            self.partial_max = work[padded * head_dim : padded * head_dim + rows]
            self.partial_sum = work[padded * (head_dim + 1) : padded * (head_dim + 1) + rows]

    def run(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        scale: float,
        *,
        k_scale: torch.Tensor | None = None,
        v_scale: torch.Tensor | None = None,
        k_new: torch.Tensor | None = None,
        v_new: torch.Tensor | None = None,
        out: torch.Tensor | None = None,
        sliding_window: int | None = None,
        sinks: torch.Tensor | None = None,
        softcap: float | None = None,
        quantize: OutputQuant | None = None,
        rope: FoldedRope | None = None,
    ) -> torch.Tensor | QuantizedActivation:
        """Attention of one layer: q [num_tokens, num_heads, head_dim] over its caches
        [num_blocks, block_size, num_kv_heads, head_dim]; returns [num_tokens, num_heads, head_dim]
        (`out`, when given: a contiguous tensor of that shape in q's dtype, written in place).
        k_new, v_new [num_tokens, num_kv_heads, head_dim] (optional): this step's keys and values,
        already written to the cache, which the descriptor path reads contiguously. sliding_window,
        sinks, softcap: the optional features (module docstring), off when None. quantize: return the
        output [num_tokens, num_heads * head_dim] quantized for the next linear layer instead (a
        QuantizedActivation, as quant.quantize_rows makes it), in the split kernel where it merges.
        rope (plans that `folds_rope` only): q is given unrotated, and the split kernel applies RoPE (and the
        per-head norms) to it and writes this step's K/V into the caches itself (kernels/attention_rope.py)."""
        num_tokens = q.shape[0]
        if rope is not None:
            if not self.folds_rope:
                raise ValueError("paged_attention: rope is folded into split-KV decode only (plan.folds_rope); "
                                 "rotate q and write the KV cache first (rope_kv_write) for this batch")  # fmt: skip
            rope.check(num_tokens, self.num_kv_heads, self.head_dim)
        if q.shape[1:] != (self.num_heads, self.head_dim) or k_cache.shape[1:] != (
            self.block_size, self.num_kv_heads, self.head_dim
        ):  # fmt: skip
            raise ValueError(
                f"paged_attention: q {tuple(q.shape)} and cache {tuple(k_cache.shape)} do not match the plan's "
                f"{self.num_heads} heads / {self.num_kv_heads} KV heads of {self.head_dim}, block size {self.block_size}"
            )
        q_strides, k_strides, v_strides = q.stride(), k_cache.stride(), v_cache.stride()
        if q_strides[-1] != 1 or k_strides[-1] != 1 or v_strides[-1] != 1:
            raise ValueError("paged_attention: q, k_cache and v_cache must be contiguous in their last dim")
        kv_scaled = check_kv_scales(k_cache, v_cache, k_scale, v_scale, "paged_attention")
        if not kv_scaled:
            k_scale = v_scale = None
        if out is not None:
            check_out(out, q)
        else:
            out = self._out
            if out is None or out.shape[0] != num_tokens or out.dtype != q.dtype:
                out = torch.empty((num_tokens, self.num_heads, self.head_dim), dtype=q.dtype, device=q.device)
                if self.reuse_output:
                    self._out = out
        if num_tokens == 0 or self.num_seqs == 0:
            return _quantized(out, quantize)
        flags = self._flags.get((q.dtype, k_cache.dtype))
        if flags is None:
            flags = self._flags[q.dtype, k_cache.dtype] = self._dtype_flags(q.dtype, k_cache.dtype, kv_scaled)
        features = AttentionFeatures.of(sliding_window, sinks, softcap, self.num_heads, q.device)
        strides = (*q_strides[:2], *k_strides[:3], *v_strides[:3])
        layer_key = (
            q.dtype, k_cache.dtype, flags, strides, aligned(q, k_cache, v_cache, k_scale, v_scale, sinks),
            *int_spec(features.window),
        )  # fmt: skip
        if self.fp8_tiles is not None and not features.any and flags[0] and q.dtype in (torch.bfloat16, torch.float16):
            self._run_fp8_sm90(out, q, k_cache, v_cache, scale, k_scale, v_scale, strides, layer_key)
            return _quantized(out, quantize)
        if self.num_splits > 1:
            quantized = self._run_split(
                out, q, k_cache, v_cache, scale, k_scale, v_scale, flags, strides, layer_key, features, quantize, rope
            )  # fmt: skip
            return quantized if quantized is not None else _quantized(out, quantize)
        descs = (None, None)
        if self.new_kv_desc and not flags[0] and k_new is not None and v_new is not None:
            descs = self._new_kv_descriptors(k_new, v_new)
        self._run_unified(out, q, k_cache, v_cache, scale, k_scale, v_scale, flags, strides, layer_key, descs, features)
        return _quantized(out, quantize)

    def _new_kv_descriptors(self, k_new: torch.Tensor, v_new: torch.Tensor) -> tuple:
        """Tensor descriptors over [num_tokens, num_kv_heads * head_dim] views of the new K/V, with
        [tile_n, head_dim] boxes; (None, None) when the layout does not allow them (16-byte rule)."""
        descs = []
        for t in (k_new, v_new):
            if t.dim() != 3 or t.stride(2) != 1 or t.stride(1) != self.head_dim:
                return None, None
            rows = t.as_strided((t.shape[0], self.num_kv_heads * self.head_dim), (t.stride(0), 1))
            if rows.data_ptr() % 16 or (rows.stride(0) * rows.element_size()) % 16:
                return None, None
            descs.append(TensorDescriptor.from_tensor(rows, [self.tiles.tile_n, self.head_dim]))
        return tuple(descs)

    def _dtype_flags(self, q_dtype: torch.dtype, kv_dtype: torch.dtype, kv_scaled: bool) -> tuple:
        """(KV_SCALED, FP8_DOT_F16, FP8_QK, FP8_MAX) for a q and cache dtype."""
        dot_f16, fp8_qk = self.fp8_dot_f16, self.fp8_qk
        if dot_f16 is None:
            dot_f16 = self._config_dot_f16 and q_dtype == torch.bfloat16
        if fp8_qk is None:
            fp8_qk = self._config_qk and q_dtype in (torch.bfloat16, torch.float16)
        fp8_max = torch.finfo(kv_dtype).max if kv_scaled else 1.0
        return (kv_scaled, kv_scaled and dot_f16, kv_scaled and fp8_qk, fp8_max)

    def _run_unified(
        self, out, q, k_cache, v_cache, scale, k_scale, v_scale, flags, strides, layer_key, descs, features,
    ) -> None:  # fmt: skip
        tiles = self.tiles
        block_q = tiles.block_m // self.group
        num_q_blocks = q.shape[0] // block_q + self.num_seqs
        args = (
            out, q, k_cache, v_cache, self.block_tables, self.seq_lens, self.query_start_loc, k_scale, v_scale,
            features.sinks, *descs, self.num_seqs, num_q_blocks, scale * _LOG2_E, features.window, features.softcap2,
            strides[0], strides[1], self.num_heads * self.head_dim, self.head_dim, self._bt_stride, *strides[2:],
        )  # fmt: skip
        constexprs = dict(
            NUM_KV_HEADS=self.num_kv_heads, GROUP=self.group, BLOCK_SIZE=self.block_size, HEAD_DIM=self.head_dim,
            BLOCK_M=tiles.block_m, BLOCK_Q=block_q, TILE_N=tiles.tile_n, KV_SCALED=flags[0], FP8_DOT_F16=flags[1],
            FP8_QK=flags[2], FP8_MAX=flags[3], NEW_KV_DESC=descs[0] is not None, SLIDING=features.sliding,
            SINKS=features.has_sinks, SOFTCAP=features.softcapped,
        )  # fmt: skip
        # Triton specialises a descriptor on its dtype and block shape (fixed by the constexpr tiles)
        desc_dtype = None if descs[0] is None else (descs[0].base.dtype, descs[1].base.dtype)
        key = (self._step_key, layer_key, desc_dtype, *int_spec(num_q_blocks))
        _UNIFIED(
            key, (self.num_kv_heads * num_q_blocks,), args, constexprs,
            num_warps=tiles.num_warps, num_stages=tiles.num_stages, device_index=self.device_index,
        )  # fmt: skip

    def _run_fp8_sm90(self, out, q, k_cache, v_cache, scale, k_scale, v_scale, strides, layer_key) -> None:
        """Pure decode over an FP8 cache on sm90 (attention_fp8_decode_sm90.py): straight into out when
        unsplit, else partial results and their merge."""
        tiles, num_splits = self.fp8_tiles, self.num_splits
        partials = (self.partial_out, self.partial_max, self.partial_sum) if num_splits > 1 else (out, out, out)
        args = (
            out, *partials, q, k_cache, v_cache, self.block_tables, self.seq_lens, self.query_start_loc, k_scale,
            v_scale, num_splits, scale * _LOG2_E, strides[0], strides[1], self.num_heads * self.head_dim, self.head_dim,
            self._bt_stride, *strides[2:],
        )  # fmt: skip
        constexprs = dict(
            GROUP=self.group, ROWS=fp8_sm90.padded_rows(self.group), BLOCK_SIZE=self.block_size,
            HEAD_DIM=self.head_dim, TILE_N=tiles.tile_n, STAGES=tiles.num_stages, DIRECT=num_splits == 1,
            INPLACE_V=tiles.inplace_v,
        )  # fmt: skip
        key = (self._step_key, layer_key)
        _FP8_SM90(
            key, (self.num_kv_heads, self.num_seqs, num_splits), args, constexprs, num_warps=fp8_sm90.NUM_WARPS,
            num_stages=tiles.num_stages, device_index=self.device_index,
        )  # fmt: skip
        if num_splits > 1:
            self._merge(out, v_scale, True, key, tiles.tile_n, _NO_FEATURES)

    def _merge(self, out, v_scale, kv_scaled: bool, key, tile_n: int, features: AttentionFeatures) -> None:
        """The split-KV partial results merged into out (attention_split.merge_splits_kernel)."""
        merge_args = (
            out, self.partial_out, self.partial_max, self.partial_sum, self.seq_lens, self.query_start_loc, v_scale,
            features.sinks, self.num_splits, features.window, self.num_heads * self.head_dim, self.head_dim,
        )  # fmt: skip
        merge_constexprs = dict(
            HEAD_DIM=self.head_dim, SPLITS_PAD=triton.next_power_of_2(self.num_splits), TILE_N=tile_n,
            KV_SCALED=kv_scaled, SLIDING=features.sliding, SINKS=features.has_sinks,
        )  # fmt: skip
        _MERGE(key, (self.num_seqs, self.num_heads), merge_args, merge_constexprs, num_warps=4, num_stages=1,
               device_index=self.device_index)  # fmt: skip

    @property
    def folds_rope(self) -> bool:
        """Whether run takes `rope` (q unrotated, the step's K/V not yet written): split-KV decode, whose kernel
        rotates q and writes the newest K/V itself (kernels/attention_rope.py); not the sm90 FP8 decode kernel."""
        return self.num_splits > 1 and self.fp8_tiles is None

    def _run_split(
        self, out, q, k_cache, v_cache, scale, k_scale, v_scale, flags, strides, layer_key, features, quantize,
        rope=None,
    ) -> QuantizedActivation | None:  # fmt: skip
        """Split-KV decode (attention_split.py): partial results per segment, merged into out by the split
        kernel itself or the merge kernel after it. Returns the quantized output when the kernel made
        it (quantize given, merged in the kernel), else None. rope: q's rotation and the K/V write folded in."""
        tiles, num_splits = self.tiles, self.num_splits
        merge = self.counters is not None
        row = self.num_heads * self.head_dim
        row_pad = triton.next_power_of_2(row)
        quant = merge and quantize is not None and quantize.group in (0, BLOCK) and row_pad <= 16384
        qdata = qscale = out
        if quant:
            qdata = torch.empty((q.shape[0], row), dtype=quantize.dtype, device=q.device)
            qscale = fused_scales(q.shape[0], row, quantize.static_scale, quantize.group, q.device)
        args = (
            self.partial_out, self.partial_max, self.partial_sum, q, k_cache, v_cache, self.block_tables,
            self.seq_lens, self.query_start_loc, k_scale, num_splits, scale * _LOG2_E, features.window,
            features.softcap2, strides[0], strides[1], self._bt_stride, *strides[2:], out, qdata, qscale,
            self.counters if merge else out, v_scale, features.sinks, q.shape[0], row,
            self.head_dim, *attention_rope.launch_args(rope, out),
        )  # fmt: skip
        group_pad = triton.next_power_of_2(self.group)
        splits_pad = triton.next_power_of_2(num_splits)
        # every constexpr, in order, whether used or not: Launcher's fast path needs them all
        constexprs = dict(
            GROUP=self.group, BLOCK_SIZE=self.block_size, HEAD_DIM=self.head_dim, BLOCK_M=tiles.block_m,
            TILE_N=tiles.tile_n, KV_SCALED=flags[0], FP8_DOT_F16=flags[1], FP8_QK=flags[2], FP8_MAX=flags[3],
            SLIDING=features.sliding, SOFTCAP=features.softcapped, MERGE=merge, GROUP_PAD=group_pad,
            SPLITS_PAD=splits_pad, CHUNK=max(1, min(splits_pad, 4096 // (group_pad * self.head_dim))),
            SINKS=features.has_sinks, QUANT=quant, ROW_PAD=row_pad if quant else 1,
            STATIC=quant and quantize.static_scale is not None, QMAX=qmax(quantize.dtype) if quant else 1.0,
            IS_INT=quant and quantize.dtype == torch.int8, MIN_EXP=min_exponent(quantize.dtype) if quant else 0,
            QGROUP=quantize.group if quant else 0, EARLY_KV=attention_split.EARLY_KV,
            **attention_rope.constexprs(rope, k_cache.dtype, flags[0]),
        )  # fmt: skip
        key = (self._step_key, layer_key, *int_spec(q.shape[0]), quantize.dtype if quant else None, aligned(qscale),
               attention_rope.launch_key(rope))  # fmt: skip
        _SPLIT(
            key, (self.num_seqs, self.num_kv_heads, num_splits), args, constexprs, num_warps=tiles.num_warps,
            num_stages=tiles.num_stages, device_index=self.device_index,
        )  # fmt: skip
        if not merge:
            self._merge(out, v_scale, flags[0], key, tiles.tile_n, features)
        return QuantizedActivation(qdata, qscale, q.dtype) if quant else None


def _quantized(out: torch.Tensor, quantize: OutputQuant | None) -> torch.Tensor | QuantizedActivation:
    """out [num_tokens, num_heads, head_dim] as run returns it: itself, or quantized by its own kernel."""
    if quantize is None:
        return out
    return quantize_rows(out.view(out.shape[0], -1), quantize)


_UNIFIED = Launcher(unified_attention_kernel)
_SPLIT = Launcher(split_kv_decode_kernel)
_MERGE = Launcher(merge_splits_kernel)
_FP8_SM90 = Launcher(fp8_sm90.fp8_decode_sm90_kernel) if fp8_sm90.HAVE_GLUON else None


# the portable kernels: unified (prefill, mixed and decode) and split-KV decode, on every GPU
ATTENTION_SUPPORTS = Supports(
    dtypes=FLOATS,
    kv_dtypes=KV_WRITE_SUPPORTS.kv_dtypes,
    features=frozenset({"split_kv", "fp8_kv", "prefix", "chunked", "sliding_window", "sinks", "softcap"}),
)


@register("attention", "triton_unified", supports=ATTENTION_SUPPORTS, priority=10)
def plan_attention(
    *metadata: object, kv_dtype: torch.dtype | None = None, sliding_window: int | None = None,
    merge_in_kernel: bool | None = None,
) -> AttentionPlan:  # fmt: skip
    """A step's attention set-up for every layer of one shape: AttentionPlan's positional arguments
    (block_tables, seq_lens, query_start_loc, max_query_len, max_seq_len, num_heads, num_kv_heads,
    head_dim, block_size), portable kernels only; sliding_window: the layers' window, which bounds the
    keys split-KV divides; merge_in_kernel: AttentionPlan's. Its runs return one shared output buffer:
    each layer consumes its attention output before the next layer runs."""
    return AttentionPlan(
        *metadata, kv_dtype=kv_dtype, fp8_gluon=False, reuse_output=True, sliding_window=sliding_window,
        merge_in_kernel=merge_in_kernel,
    )  # fmt: skip


@register("attention", "triton_unified")
def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    max_query_len: int,
    max_seq_len: int,
    scale: float,
    *,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    plan: AttentionPlan | None = None,
    k_new: torch.Tensor | None = None,
    v_new: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    sliding_window: int | None = None,
    sinks: torch.Tensor | None = None,
    softcap: float | None = None,
    quantize: OutputQuant | None = None,
    rope: FoldedRope | None = None,
) -> torch.Tensor | QuantizedActivation:
    """Causal attention of a flat ragged batch over the paged KV cache.

    q [num_tokens, num_heads, head_dim]; caches [num_blocks, block_size, num_kv_heads, head_dim];
    block_tables [num_seqs, max_blocks] int32; seq_lens [num_seqs] (ctx_len + q_len);
    query_start_loc [num_seqs + 1]. Query row j of sequence i sits at absolute position
    ctx_len + j and attends to cache positions 0..ctx_len + j. Query head h reads KV head
    h // (num_heads // num_kv_heads). FP8 caches hold K / k_scale and V / v_scale (see
    write_kv_cache): their values are multiplied by the scales; other caches ignore them.
    `plan`, built once per step from the same metadata, skips the per-call set-up. k_new, v_new
    [num_tokens, num_kv_heads, head_dim] (optional): the step's new K/V, already in the cache, read
    contiguously by the descriptor path where the plan takes it.
    Returns [num_tokens, num_heads, head_dim] in q's dtype: `out` when given (contiguous, that shape
    and dtype), written in place, else a new tensor (or the plan's shared output buffer).
    Optional features, as kernels/reference.py's paged_attention: `sliding_window` W (a query at p
    sees keys p - W < k <= p), `sinks` float32 [num_heads] (one logit per head in the softmax
    denominator only), `softcap` c (scores = c * tanh(scores / c) after scaling, before masking).
    `quantize` (the next linear layer's input quantization): the output [num_tokens, num_heads * head_dim]
    quantized as quant.quantize_rows does it, a QuantizedActivation (by the split kernel itself where
    it merges, else by a quantization kernel after the attention).
    `rope` (where the plan `folds_rope`: split-KV decode): q unrotated; the kernel applies RoPE to q and the
    step's keys and writes them and the values into the caches itself (kernels/attention_rope.py).
    """
    if plan is None:
        plan = AttentionPlan(block_tables, seq_lens, query_start_loc, max_query_len, max_seq_len, q.shape[1],
                             k_cache.shape[2], q.shape[2], k_cache.shape[1], kv_dtype=k_cache.dtype,
                             sliding_window=sliding_window)  # fmt: skip
    return plan.run(
        q, k_cache, v_cache, scale, k_scale=k_scale, v_scale=v_scale, k_new=k_new, v_new=v_new, out=out,
        sliding_window=sliding_window, sinks=sinks, softcap=softcap, quantize=quantize, rope=rope,
    )  # fmt: skip


def _fp8_decode_sm90_available() -> str | None:
    if fp8_sm90.available():
        return None
    return "needs an NVIDIA sm90 GPU and a Triton whose Gluon compiles the kernel (attention_fp8_decode_sm90.py)"


# pure-decode steps over an FP8 cache on sm90: the Gluon kernel (where the shape allows), every other
# step: the portable kernels. auto prefers it where it runs: 128 x 8192 decode 530 us vs 713 us. The
# Gluon kernel has no sliding window, sinks or soft-capping: undeclared, so auto takes triton_unified
# for models that use them
FP8_DECODE_SM90_SUPPORTS = Supports(
    dtypes=frozenset({torch.bfloat16, torch.float16}),
    kv_dtypes=frozenset(FP8_KV_DTYPES),
    platforms=frozenset({"cuda"}),
    features=frozenset({"split_kv", "fp8_kv", "prefix", "chunked", "fp8_decode_gluon"}),
    available=_fp8_decode_sm90_available,
)


@register("attention", "triton_fp8_decode_sm90", entry="plan_attention", supports=FP8_DECODE_SM90_SUPPORTS,
          priority=20)  # fmt: skip
def plan_attention_fp8_decode_sm90(
    *metadata: object, kv_dtype: torch.dtype | None = None, sliding_window: int | None = None,
    merge_in_kernel: bool | None = None,
) -> AttentionPlan:  # fmt: skip
    """`plan_attention`, with the sm90 Gluon kernel for pure-decode steps it serves (without features)."""
    return AttentionPlan(
        *metadata, kv_dtype=kv_dtype, fp8_gluon=None, reuse_output=True, sliding_window=sliding_window,
        merge_in_kernel=merge_in_kernel,
    )  # fmt: skip


@register("attention", "triton_fp8_decode_sm90", entry="paged_attention")
def paged_attention_fp8_decode_sm90(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor, seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor, max_query_len: int, max_seq_len: int, scale: float, *,
    plan: AttentionPlan | None = None, **kwargs: object,
) -> torch.Tensor:  # fmt: skip
    """`paged_attention` (same contract), planned by `plan_attention_fp8_decode_sm90` when no plan is given."""
    if plan is None:
        plan = AttentionPlan(block_tables, seq_lens, query_start_loc, max_query_len, max_seq_len, q.shape[1],
                             k_cache.shape[2], q.shape[2], k_cache.shape[1], kv_dtype=k_cache.dtype, fp8_gluon=None)  # fmt: skip
    args = (q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, max_query_len, max_seq_len, scale)
    return paged_attention(*args, plan=plan, **kwargs)


def paged_attention_with_tiles(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    max_query_len: int,
    max_seq_len: int,
    scale: float,
    tiles: AttentionTiles,
    *,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    num_splits: int = 1,
    fp8_dot_f16: bool | None = None,
    fp8_qk: bool | None = None,
    new_kv_desc: bool | None = None,
    fp8_gluon: bool | None = False,
    k_new: torch.Tensor | None = None,
    v_new: torch.Tensor | None = None,
    sliding_window: int | None = None,
    sinks: torch.Tensor | None = None,
    softcap: float | None = None,
    merge_in_kernel: bool | None = None,
    quantize: OutputQuant | None = None,
    rope: FoldedRope | None = None,
) -> torch.Tensor | QuantizedActivation:
    """`paged_attention` with explicit tiles and split count (tests and sweeps); same contract
    otherwise. num_splits > 1 takes the split-KV path, which serves pure-decode batches only
    (max_query_len <= 1); tiles.block_m then counts the query heads of one KV head. The tiles are
    the Triton kernels', so the sm90 FP8 decode kernel is off unless fp8_gluon asks for it.
    merge_in_kernel: AttentionPlan's (split-KV merged by the split kernel: None where it can)."""
    plan = AttentionPlan(
        block_tables, seq_lens, query_start_loc, max_query_len, max_seq_len, q.shape[1], k_cache.shape[2],
        q.shape[2], k_cache.shape[1], tiles=tiles, num_splits=num_splits, fp8_dot_f16=fp8_dot_f16, fp8_qk=fp8_qk,
        new_kv_desc=new_kv_desc, fp8_gluon=fp8_gluon, merge_in_kernel=merge_in_kernel,
    )  # fmt: skip
    return plan.run(
        q, k_cache, v_cache, scale, k_scale=k_scale, v_scale=v_scale, k_new=k_new, v_new=v_new,
        sliding_window=sliding_window, sinks=sinks, softcap=softcap, quantize=quantize, rope=rope,
    )  # fmt: skip
