"""Attention that reads a (possibly) compressed KV cache directly: decode and tree verify.

Query token i (of T new tokens written at slots start..start+T-1) sees every committed key
s < start, and new key start + j iff tree_mask[i, j] (causal when tree_mask is None).

`quant_attention_masked` is the static-shape variant (CUDA graphs): it reads the first S slots
under an explicit [T, S] key mask, with no host-side lengths.

Flash-decoding: the key axis [0, start + T) is cut into splits so that one query token still
fills the GPU. Program (m_tile, kv_head, split) takes BLOCK_M query rows of one KV head's GQA
group (row = token * G + g, head = kv_head * G + g), dequantizes BLOCK_N keys and values at a
time in registers, and keeps an online softmax (m, l, acc) that it writes out unnormalized;
`_combine_kernel` merges the splits of each row.

tq3_0 keys (and q8_0 / q4_0 keys of a cache with rotate_keys: Planes.rotated) are stored rotated,
so queries are rotated the same way (R is orthonormal: q.k is unchanged); tq3_0 values are stored
rotated, so the output is accumulated rotated and un-rotated once at the end.

Under the "split" scheme (kernels/attention/kv_split.py) a q4_0 or tq3_0 side (q8_0 too with split_q8) is never
rebuilt as [BLOCK_N, D]: its fp16 parts meet the query's (or the output's) channels, one dot per part.

Measured and removed (docs/journal.md): q.k on int8 tensor cores for a q8_0 K (no faster than
"flat" on the H200).
"""

from __future__ import annotations


import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from treeflash.kernels.launch import pdl
from treeflash.kernels.attention.attention_combine import _combine_kernel

from treeflash.kernels.kv import kv_formats as formats
from treeflash.kernels.attention.attention_launch import (  # noqa: F401  (FMT_IDS: re-exported)
    FMT_IDS, MAX_SPLITS, LaunchConfig, _dot_dtypes, _next_pow2, _schemes, launch_config, plan_splits, split_count,
)
from treeflash.kernels.kv.kv_dequant import DEQ_IDS, DEQ_SPLIT, _columns, _dequant
from treeflash.kernels.attention.kv_split import _load_k, _out_columns, _split_accumulate, _split_query, _split_scores, _split_zeros
from treeflash.kernels.kv.kv_quant import Planes
from treeflash.kernels.pointwise.norm import _interpreting
from treeflash.kernels.kv.rotate import rotate_rows

LOG2E = 1.4426950408889634
COMBINE_CHUNK = 64
# Static mode (slots given): the splits share the filled blocks (up to the step's last slot, read on the
# device) equally (`balanced`), as many as plan_splits would plan (split_count: ~2 programs an SM, at most
# one per buffer block) unless num_splits says. Splits over fixed stretches of the whole buffer left a short
# context in the CLI's 8193-slot buffer to the first of 22-88 long splits: on the H200 (SmolLM2 shape, 300
# tokens of context) a 33-node verify's attention took 14.0 us against 9.3 in a 600-slot buffer, and the
# DDTree-32 step 2.38 ms against 1.47 (docs/journal.md, stop 22).
# One split (splits == 1: a key axis of one block, or num_splits=1) writes the output itself, with no
# combine launch. Planning one split for short contexts on purpose was measured slower on the H200
# (SmolLM2 decode graph 1.07 ms against 0.82, 8B 4.85 against 4.45 ms at 11 key blocks): a handful of
# programs walking the keys one block after another cost more than the combine launch they save, so
# plan_splits still spreads the keys over the SMs.
# Measured and removed (docs/journal.md): the last split program merging the splits (an atomic ticket, no
# combine launch: 0.95 against 0.82 ms), a cap on key blocks per split over a long buffer (no faster).


@triton.jit
def _dot(a, b, DOT: tl.constexpr):
    if DOT == tl.float32:
        out = tl.dot(a, b, input_precision="ieee")
    else:
        out = tl.dot(a.to(DOT), b.to(DOT))
    return out


@triton.jit
def _partial_kernel(
    q_ptr, ks_ptr, kc_ptr, vs_ptr, vc_ptr, mask_ptr, end_ptr, m_ptr, l_ptr, acc_ptr, out_ptr,
    start, num_tokens, kv_len, end_idx, num_kv_heads, scale_log2, stride_qt, stride_qh,
    KEY_MASK: tl.constexpr, HAS_END: tl.constexpr, DYN_LOOP: tl.constexpr,
    NUM_SPLITS: tl.constexpr, DIRECT: tl.constexpr, GROUP: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCKS_PER_SPLIT: tl.constexpr, FMT_K: tl.constexpr, FMT_V: tl.constexpr, DOT: tl.constexpr,
    PREFETCH: tl.constexpr, DEQ: tl.constexpr, C0: tl.constexpr, C1: tl.constexpr, C2: tl.constexpr, C3: tl.constexpr,
    PDL: tl.constexpr = False, DEQ_V: tl.constexpr = 0, ASM: tl.constexpr = False,
    DOT_V: tl.constexpr = None, BALANCED: tl.constexpr = False, ALL_VISIBLE: tl.constexpr = False,
):
    pdl.enter(PDL)
    DV: tl.constexpr = DEQ_V if DEQ_V > 0 else DEQ  # V's dequantization scheme (0: K's)
    DOTV: tl.constexpr = DOT if DOT_V is None else DOT_V  # p.v's operand type (DOT: q.k's)
    # DEQ_SPLIT (q4_0 / tq3_0; q8_0 if split_q8): a tuple of parts per side, not one [*, D] tile (kv_split.py)
    SPLIT_K: tl.constexpr = DEQ == DEQ_SPLIT and FMT_K != 0
    SPLIT_V: tl.constexpr = DV == DEQ_SPLIT and FMT_V != 0
    pid_m, kvh, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    num_heads = num_kv_heads * GROUP
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < num_tokens * GROUP
    t = rows // GROUP
    h = kvh * GROUP + rows % GROUP
    # q.k and p.v only need K's (V's) columns in one consistent order: load q in K's unpack
    # order, and store the output from V's unpack order
    q_rows = q_ptr + t * stride_qt + h * stride_qh
    if SPLIT_K:
        qp = _split_query(q_rows, row_ok, FMT_K, D)  # K's parts of the query: [BLOCK_M, D/4] or [BLOCK_M, D/8] fp16
    else:
        q_cols = _columns(FMT_K, D, DEQ)
        q = tl.load(q_rows[:, None] + q_cols[None, :], mask=row_ok[:, None], other=0.0)
        q = q.to(DOT)
    m_i = tl.full((BLOCK_M,), -1.0e30, tl.float32)  # finite: a fully masked block leaves no NaN
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = _split_zeros(BLOCK_M, FMT_V, D) if SPLIT_V else (tl.zeros((BLOCK_M, D), tl.float32),)  # a tuple: V's parts
    # keys [0, end) are read: all kv_len slots, or (HAS_END: static mode) up to the last slot this
    # step writes, read from the device, so a CUDA graph over a long cache buffer reads only the
    # filled part (the key mask hides nothing past it); a split past the end does no block at all
    end = kv_len
    if HAS_END:
        end = tl.minimum(tl.load(end_ptr + end_idx).to(tl.int32) + 1, kv_len)
    if BALANCED:  # NUM_SPLITS equal shares of the blocks before the end (read on the device), not of the buffer
        total = (end + BLOCK_N - 1) // BLOCK_N
        per = (total + NUM_SPLITS - 1) // NUM_SPLITS  # <= BLOCKS_PER_SPLIT, the interpreter's static bound
        first = split.to(tl.int64) * per * BLOCK_N
        n_blocks = tl.minimum(total - split * per, per).to(tl.int32)  # <= 0: an empty split
    else:
        first = split.to(tl.int64) * (BLOCKS_PER_SPLIT * BLOCK_N)
        n_blocks = tl.minimum((end - first + BLOCK_N - 1) // BLOCK_N, BLOCKS_PER_SPLIT).to(tl.int32)  # <= 0 past the end
    # DYN_LOOP: stop at the end. The interpreter cannot take a loop bound derived from program_id,
    # so there it runs every block; past the end every load is masked off and the step is a no-op
    # (scores -inf: alpha 1, p 0)
    keys = first + tl.arange(0, BLOCK_N)
    # PREFETCH: the next block's bytes are loaded (into registers) before this block's math
    ka, kb, ks = _load_k(ks_ptr, kc_ptr, keys, kvh, num_kv_heads, keys < end, FMT_K, D, DEQ)
    va, vb, vs = _load_k(vs_ptr, vc_ptr, keys, kvh, num_kv_heads, keys < end, FMT_V, D, DV)
    for b in range(0, n_blocks if DYN_LOOP else BLOCKS_PER_SPLIT):
        keys = first + b * BLOCK_N + tl.arange(0, BLOCK_N)
        key_ok = (keys < end) & (b < n_blocks)  # (b < n_blocks: the interpreter's static loop; a balanced split's own keys)
        nxt = keys + BLOCK_N
        nxt_ok = (nxt < end) & (b + 1 < n_blocks)
        if PREFETCH:
            ka2, kb2, ks2 = _load_k(ks_ptr, kc_ptr, nxt, kvh, num_kv_heads, nxt_ok, FMT_K, D, DEQ)
        else:
            ka, kb, ks = _load_k(ks_ptr, kc_ptr, keys, kvh, num_kv_heads, key_ok, FMT_K, D, DEQ)
        if SPLIT_K:
            s = _split_scores(qp, ka, ks, FMT_K, C0, C1, C2, C3, ASM) * scale_log2
        else:
            k = _dequant(ka, kb, ks, FMT_K, BLOCK_N, D, C0, C1, C2, C3, DEQ, ASM)
            s = _dot(q, tl.trans(k), DOT) * scale_log2  # [BLOCK_M, BLOCK_N]
        if ALL_VISIBLE:  # static mode without a mask: every key before the end (a bidirectional block)
            visible = key_ok[None, :]
        elif KEY_MASK:  # mask [T, kv_len] over every slot (static mode)
            m2 = row_ok[:, None] & key_ok[None, :]
            visible = tl.load(mask_ptr + t[:, None] * kv_len + keys[None, :], mask=m2, other=0) != 0
        else:  # committed prefix, then the [T, T] tree mask over the keys written in this step
            new = keys - start
            is_new = (new >= 0)[None, :]
            vis = tl.load(
                mask_ptr + t[:, None] * num_tokens + new[None, :],
                mask=row_ok[:, None] & key_ok[None, :] & is_new,
                other=1,
            )
            visible = key_ok[None, :] & ((vis != 0) | (~is_new))
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        if PREFETCH:
            va2, vb2, vs2 = _load_k(vs_ptr, vc_ptr, nxt, kvh, num_kv_heads, nxt_ok, FMT_V, D, DV)
        else:
            va, vb, vs = _load_k(vs_ptr, vc_ptr, keys, kvh, num_kv_heads, key_ok, FMT_V, D, DV)
        if SPLIT_V:
            acc = _split_accumulate(acc, alpha, p, va, vs, FMT_V, C0, C1, C2, C3, ASM)
        else:
            v = _dequant(va, vb, vs, FMT_V, BLOCK_N, D, C0, C1, C2, C3, DV, ASM)
            acc = (acc[0] * alpha[:, None] + _dot(p, v, DOTV),)
        m_i = m_new
        if PREFETCH:
            ka, kb, ks, va, vb, vs = ka2, kb2, ks2, va2, vb2, vs2
    if DIRECT:  # the only split: the output itself
        fin = (t * num_heads + h).to(tl.int64)
        for j in tl.static_range(len(acc)):
            tl.store(out_ptr + fin[:, None] * D + _out_columns(FMT_V, D, DV, j)[None, :],
                     (acc[j] / l_i[:, None]).to(out_ptr.dtype.element_ty), mask=row_ok[:, None])
        return
    out_row = split.to(tl.int64) * (num_tokens * num_heads) + t * num_heads + h
    tl.store(m_ptr + out_row, m_i, mask=row_ok)
    tl.store(l_ptr + out_row, l_i, mask=row_ok)
    acc_ok = row_ok[:, None]
    if BALANCED:  # an empty split (past the end) leaves its acc rows unwritten (l = 0: the merge skips them)
        acc_ok = acc_ok & (n_blocks > 0)
    for j in tl.static_range(len(acc)):
        tl.store(acc_ptr + out_row[:, None] * D + _out_columns(FMT_V, D, DV, j)[None, :], acc[j], mask=acc_ok)


# ---------------------------------------------------------------- wrapper


def _check_planes(p: Planes, num_kv_heads: int, head_dim: int, kv_len: int, device: torch.device, what: str) -> None:
    fmt = formats.get_format(p.name)
    shape = (num_kv_heads, fmt.code_bytes(head_dim) if not fmt.is_dense else head_dim)
    if p.codes.dtype != (fmt.dense_dtype or fmt.code_dtype) or tuple(p.codes.shape[1:]) != shape:
        raise ValueError(f"quant_attention: {what} codes must be {fmt.dense_dtype or fmt.code_dtype} [S, {shape[0]}, {shape[1]}]")
    if not p.codes.is_contiguous() or p.codes.shape[0] < kv_len or p.codes.device != device:
        raise ValueError(f"quant_attention: {what} codes must be contiguous, on the query's device, >= {kv_len} rows")
    if fmt.is_dense:
        return
    s = p.scales
    if s is None or s.dtype != torch.float16 or tuple(s.shape) != (p.codes.shape[0], num_kv_heads, head_dim // 32):
        raise ValueError(f"quant_attention: {what} scales must be fp16 [S, {num_kv_heads}, {head_dim // 32}]")
    if not s.is_contiguous() or s.device != device:
        raise ValueError(f"quant_attention: {what} scales must be contiguous and on the query's device")


def _check_query(q: torch.Tensor, k: Planes, v: Planes, kv_len: int) -> None:
    if q.dim() != 3 or q.stride(-1) != 1 or q.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(f"quant_attention: q must be [T, H, D] float with a contiguous last dim, got {tuple(q.shape)}")
    _, num_heads, head_dim = q.shape
    num_kv_heads = k.codes.shape[1]
    if num_heads % num_kv_heads or head_dim & (head_dim - 1) or not 32 <= head_dim <= 256:
        raise ValueError(
            f"quant_attention: need H % Hkv == 0 and a power-of-two head_dim in 32..256 "
            f"(H={num_heads}, Hkv={num_kv_heads}, D={head_dim})"
        )
    _check_planes(k, num_kv_heads, head_dim, kv_len, q.device, "K")
    _check_planes(v, num_kv_heads, head_dim, kv_len, q.device, "V")


def quant_attention(
    q: torch.Tensor,  # [T, H, D] fp32/fp16/bf16 (rotary applied), last dim contiguous
    k: Planes,
    v: Planes,
    start: int,
    tree_mask: torch.Tensor | None,  # [T, T] bool; None = causal
    scale: float,
    num_splits: int | None = None,  # None: plan for the device
    config: LaunchConfig | None = None,  # None: launch_config(D, T * G)
) -> torch.Tensor:  # [T, H, D] q.dtype
    """Triton. The new rows (slots start..start+T-1) must already be written to k and v."""
    n = q.shape[0]
    _check_query(q, k, v, start + n)
    if tree_mask is None:
        vis = torch.ones(n, n, dtype=torch.int8, device=q.device).tril()
    elif tree_mask.shape != (n, n) or tree_mask.dtype != torch.bool:
        raise ValueError(f"quant_attention: tree_mask must be bool [{n}, {n}]")
    else:
        vis = tree_mask.to(device=q.device, dtype=torch.int8).contiguous()
    return _launch(q, k, v, vis, start, start + n, False, scale, num_splits, config)


def quant_attention_masked(
    q: torch.Tensor,  # [T, H, D]
    k: Planes,
    v: Planes,
    key_mask: torch.Tensor | None,  # [T, S] bool: which of the first S slots each query sees (None: see below)
    scale: float,
    num_splits: int | None = None,
    config: LaunchConfig | None = None,
    slots: torch.Tensor | None = None,  # [T] long on q's device: the slots this step wrote (the last is the highest)
) -> torch.Tensor:  # [T, H, D] q.dtype
    """Triton, static shapes: reads slots [0, S) under key_mask (no host sync: CUDA-graph capturable);
    with `slots`, only [0, slots[-1]] (key_mask must hide every slot past it).

    With `slots` the splits are balanced: they share the blocks up to slots[-1] equally, however long
    the buffer (num_splits of them, None: plan_splits' count).

    key_mask None (with `slots`): every query sees every slot up to slots[-1] (S: the whole buffer), as a
    bidirectional draft block does; no mask is built or read."""
    n = q.shape[0]
    if key_mask is None:
        if slots is None:
            raise ValueError("quant_attention_masked: without a key_mask the slots must be given (the keys end at slots[-1])")
        kv_len = k.codes.shape[0]
    else:
        kv_len = key_mask.shape[-1]
    _check_query(q, k, v, kv_len)
    if key_mask is None:
        vis = slots  # not read (ALL_VISIBLE)
    elif key_mask.shape != (n, kv_len) or key_mask.dtype != torch.bool or key_mask.device != q.device:
        raise ValueError(f"quant_attention_masked: key_mask must be bool [{n}, S] on {q.device}")
    else:
        vis = key_mask.view(torch.int8) if key_mask.is_contiguous() else key_mask.to(torch.int8).contiguous()  # no copy kernel per layer
    if slots is not None and (slots.dim() != 1 or slots.shape[0] != n or slots.device != q.device or slots.dtype != torch.long):
        raise ValueError(f"quant_attention_masked: slots must be long [{n}] on {q.device}")
    return _launch(q, k, v, vis, 0, kv_len, True, scale, num_splits, config, slots, balanced=slots is not None,
                   all_visible=key_mask is None)


def _launch(q, k, v, vis, start, kv_len, key_mask, scale, num_splits, config, slots=None, balanced=False, all_visible=False):
    n, num_heads, head_dim = q.shape
    num_kv_heads = k.codes.shape[1]
    group = num_heads // num_kv_heads
    fmt_k, fmt_v = FMT_IDS.get(k.name, 0), FMT_IDS.get(v.name, 0)
    cfg = config or launch_config(head_dim, n * group, dense_kv=fmt_k == fmt_v == 0, compressed_kv=fmt_k != 0 and fmt_v != 0,
                                  tq3_side=FMT_IDS["tq3_0"] in (fmt_k, fmt_v), formats=(k.name, v.name))
    block_m, block_n = cfg.block_m, cfg.block_n
    m_tiles = triton.cdiv(n * group, block_m)
    num_blocks = triton.cdiv(kv_len, block_n)
    if balanced:  # exactly that many shares of the filled blocks; per_split only bounds the interpreter's loop
        splits = max(1, min(num_splits, num_blocks, MAX_SPLITS)) if num_splits is not None else \
            split_count(num_blocks, m_tiles * num_kv_heads, q.device, cfg.programs_per_sm)
        per_split = _next_pow2(triton.cdiv(num_blocks, splits))
    elif num_splits is None:
        splits, per_split = plan_splits(num_blocks, m_tiles * num_kv_heads, q.device, cfg.programs_per_sm)
    else:
        per_split = _next_pow2(triton.cdiv(num_blocks, max(1, min(num_splits, num_blocks, MAX_SPLITS))))
        splits = triton.cdiv(num_blocks, per_split)

    in_dtype = q.dtype
    deq_k, deq_v = _schemes(cfg, fmt_k, fmt_v, in_dtype, head_dim)
    tl_types = {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}
    dot_torch_k, dot_torch_v = _dot_dtypes(deq_k, deq_v, in_dtype)
    dot, dot_v = tl_types[dot_torch_k], tl_types[dot_torch_v]
    if k.name == "tq3_0" or k.rotated:
        # rotated in fp32, then rounded to q.k's operand type, as the kernel would round it on load (the same
        # numbers; a 16-bit query is half the bytes)
        q = rotate_rows(q, dot_torch_k)  # one launch
    m = torch.empty(splits, n * num_heads, dtype=torch.float32, device=q.device)
    l = torch.empty_like(m)
    acc = torch.empty(splits, n * num_heads, head_dim, dtype=torch.float32, device=q.device)
    c0, c1, c2, c3 = formats.TQ3_CENTROIDS
    rotated_out = v.name == "tq3_0"
    out = torch.empty(n, num_heads, head_dim, dtype=torch.float32 if rotated_out else in_dtype, device=q.device)
    direct = splits == 1
    balanced = balanced and not direct
    _partial_kernel[(m_tiles, num_kv_heads, splits)](
        q, k.scales if fmt_k else k.codes, k.codes, v.scales if fmt_v else v.codes, v.codes, vis,
        slots if slots is not None else vis, m, l, acc, out,
        start, n, kv_len, n - 1, num_kv_heads, scale * LOG2E, q.stride(0), q.stride(1),
        KEY_MASK=key_mask, HAS_END=slots is not None, DYN_LOOP=not _interpreting(),
        NUM_SPLITS=splits if balanced else 1, DIRECT=direct,
        GROUP=group, D=head_dim, BLOCK_M=block_m, BLOCK_N=block_n, BLOCKS_PER_SPLIT=per_split,
        FMT_K=fmt_k, FMT_V=fmt_v, DOT=dot, PREFETCH=cfg.prefetch, DEQ=DEQ_IDS[deq_k], C0=c0, C1=c1, C2=c2, C3=c3,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        DEQ_V=DEQ_IDS[deq_v], ASM=not _interpreting(), DOT_V=dot_v, BALANCED=balanced, ALL_VISIBLE=all_visible, **pdl.kwargs(q),
    )
    if not direct:
        chunk = min(COMBINE_CHUNK if splits <= 128 else COMBINE_CHUNK // 2, head_dim)
        _combine_kernel[(n * num_heads, head_dim // chunk)](
            m, l, acc, out, n * num_heads, splits, D=head_dim, D_CHUNK=chunk, SPLITS=_next_pow2(splits),
            SKIP_EMPTY=balanced,
            num_warps=4, **pdl.kwargs(q),
        )
    return rotate_rows(out, in_dtype, inverse=True) if rotated_out else out


# ---------------------------------------------------------------- reference


def visibility(num_new: int, start: int, tree_mask: torch.Tensor | None, device: torch.device) -> torch.Tensor:
    """[T, start + T] bool: the committed prefix, then causal (or tree-ancestor) visibility of new tokens."""
    new = torch.ones(num_new, num_new, dtype=torch.bool, device=device).tril() if tree_mask is None else tree_mask
    prefix = torch.ones(num_new, start, dtype=torch.bool, device=device)
    return torch.cat((prefix, new.to(device)), dim=1)


def dequantize_planes(p: Planes, length: int, dtype: torch.dtype) -> torch.Tensor:
    """Rows [0, length) of one cache tensor -> [length, Hkv, D] in `dtype` (original domain)."""
    if p.scales is None:
        return p.codes[:length].to(dtype)
    rows = formats.dequantize(p.name, p.scales[:length], p.codes[:length])
    return (formats.unrotate(rows) if p.rotated else rows).to(dtype)


def quant_attention_reference(
    q: torch.Tensor, k: Planes, v: Planes, start: int, tree_mask: torch.Tensor | None, scale: float
) -> torch.Tensor:
    """Plain torch, same contract as `quant_attention`: dequantize the rows, then SDPA."""
    n, num_heads, _ = q.shape
    keys = dequantize_planes(k, start + n, q.dtype)
    values = dequantize_planes(v, start + n, q.dtype)
    mask = None if n == 1 else visibility(n, start, tree_mask, q.device)
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1), keys.transpose(0, 1), values.transpose(0, 1),
        attn_mask=mask, scale=scale, enable_gqa=keys.shape[1] != num_heads,
    )
    return out.transpose(0, 1)


def visible_up_to(slots: torch.Tensor, num_queries: int, kv_len: int) -> torch.Tensor:
    """[T, S] bool: every slot up to slots[-1] visible to every query (quant_attention_masked's key_mask None)."""
    return (torch.arange(kv_len, device=slots.device) <= slots[-1:]).expand(num_queries, kv_len)


def quant_attention_masked_reference(
    q: torch.Tensor, k: Planes, v: Planes, key_mask: torch.Tensor | None, scale: float, slots: torch.Tensor | None = None
) -> torch.Tensor:
    """Plain torch, same contract as `quant_attention_masked` (key_mask None: every slot up to slots[-1])."""
    if key_mask is None:
        key_mask = visible_up_to(slots, q.shape[0], k.codes.shape[0])
    kv_len = key_mask.shape[-1]
    keys = dequantize_planes(k, kv_len, q.dtype)
    values = dequantize_planes(v, kv_len, q.dtype)
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1), keys.transpose(0, 1), values.transpose(0, 1),
        attn_mask=key_mask, scale=scale, enable_gqa=keys.shape[1] != q.shape[1],
    )
    return out.transpose(0, 1)
