"""Attention KV cache with compressed rows (q8_0, q4_0, tq3_0; K and V formats chosen separately).

Every row written (prefill, decode, verify node) is quantized on write, and attention reads the
stored rows only, the new ones included: the result of a step does not depend on how the
tokens before it were batched. Rows are quantized one token and one KV head at a time along
head_dim, so `commit` (compacting the accepted verify nodes) is a row gather in the planes.

On CUDA, writes and decode/verify attention run Triton kernels (treeflash/kernels/kv/kv_quant.py,
treeflash/kernels/attention/quant_attention.py) that read the packed blocks directly; long steps
(prefill) and CPU runs dequantize the rows and call SDPA (the plain-torch reference path).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from treeflash.kernels.kv import kv_formats as formats
from treeflash.kv.attention_cache import attention_reference, new_token_attention

if TYPE_CHECKING:
    from treeflash.kv.spec import CacheSpec

MAX_KERNEL_TOKENS = 128  # steps with more new tokens (prefill) take the dequantize + SDPA path
DEQUANT_ROWS = 16384  # a prefill chunk's reads dequantize this many rows of one KV head at a time
ROTATED_KEY_FORMATS = ("q8_0", "q4_0")  # K formats stored rotated under CacheSpec.rotate_keys (tq3_0 always is)


@dataclass
class _Rows:
    """One cache tensor (K or V): its format and its planes."""

    fmt: formats.CacheFormat
    scales: torch.Tensor | None  # [max_len, Hkv, D / 32] fp16; None when dense
    codes: torch.Tensor  # [max_len, Hkv, code_bytes] (dense: [max_len, Hkv, D] of the dense dtype)

    @staticmethod
    def allocate(fmt: formats.CacheFormat, max_len: int, num_kv_heads: int, head_dim: int, device) -> "_Rows":
        fmt.check_head_dim(head_dim)
        if fmt.is_dense:
            return _Rows(fmt, None, torch.zeros(max_len, num_kv_heads, head_dim, dtype=fmt.dense_dtype, device=device))
        scales = torch.zeros(max_len, num_kv_heads, fmt.num_scales(head_dim), dtype=torch.float16, device=device)
        codes = torch.zeros(max_len, num_kv_heads, fmt.code_bytes(head_dim), dtype=fmt.code_dtype, device=device)
        return _Rows(fmt, scales, codes)

    def write(self, slots: int | torch.Tensor, x: torch.Tensor, use_kernel: bool) -> None:
        """x: [N, Hkv, D] -> slots start..start+N-1 (slots: int start) or slots[i] ([N] long tensor)."""
        n = x.shape[0]
        if use_kernel and not self.fmt.is_dense:
            from treeflash.kernels.kv.kv_quant import quantize_into

            quantize_into(self.fmt.name, x.contiguous(), self.scales, self.codes, slots)
            return
        s, c = formats.quantize(self.fmt.name, x)
        if isinstance(slots, int):
            self.codes[slots : slots + n] = c
            if s is not None:
                self.scales[slots : slots + n] = s
        else:
            self.codes.index_copy_(0, slots, c)
            if s is not None:
                self.scales.index_copy_(0, slots, s)

    def write_rotated(self, slots: int | torch.Tensor, x: torch.Tensor, offset: torch.Tensor | None) -> None:
        """Kernel path, q8_0 / q4_0: (x - offset) rotated, then quantized, in one launch (keys under rotate_keys)."""
        from treeflash.kernels.kv.kv_quant import quantize_rotated_into

        quantize_rotated_into(self.fmt.name, x if x.stride(-1) == 1 else x.contiguous(), self.scales, self.codes, slots, offset)

    def read(self, length: int, dtype: torch.dtype) -> torch.Tensor:
        """Rows [0, length), dequantized (tq3_0: un-rotated; q8_0 / q4_0 keys under rotate_keys stay
        rotated) -> [length, Hkv, D] in dtype."""
        if self.scales is None:
            return self.codes[:length].to(dtype)
        return formats.dequantize(self.fmt.name, self.scales[:length], self.codes[:length]).to(dtype)

    def read_head(self, length: int, head: int, head_dim: int, dtype: torch.dtype, chunk: int = DEQUANT_ROWS) -> torch.Tensor:
        """Rows [0, length) of one KV head, as `read` gives them -> [length, 1, D] in dtype, dequantized
        `chunk` rows at a time (each row's values depend on that row alone: the same as `read`'s)."""
        out = torch.empty(length, 1, head_dim, dtype=dtype, device=self.codes.device)
        for i in range(0, length, chunk):
            j = min(i + chunk, length)
            codes = self.codes[i:j, head : head + 1]
            out[i:j] = codes if self.scales is None else formats.dequantize(self.fmt.name, self.scales[i:j, head : head + 1], codes)
        return out

    def move(self, dest: torch.Tensor, src: torch.Tensor) -> None:
        """Rows src -> rows dest ([N] long each; index_select copies first, so overlap is safe)."""
        for t in (self.scales, self.codes):
            if t is not None:
                t.index_copy_(0, dest, t.index_select(0, src))

    def planes(self, rotated: bool = False):
        from treeflash.kernels.kv.kv_quant import Planes

        return Planes(self.fmt.name, self.scales, self.codes, rotated)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.scales, self.codes) if t is not None)


class QuantizedAttentionCache:
    def __init__(self, num_kv_heads: int, head_dim: int, spec: "CacheSpec"):
        device = torch.device(spec.device)
        fmt_k = formats.get_format(spec.cache_type_k, spec.dtype)
        fmt_v = formats.get_format(spec.cache_type_v, spec.dtype)
        self.k = _Rows.allocate(fmt_k, spec.max_len, num_kv_heads, head_dim, device)
        self.v = _Rows.allocate(fmt_v, spec.max_len, num_kv_heads, head_dim, device)
        pow2 = head_dim & (head_dim - 1) == 0 and 32 <= head_dim <= 256
        self.use_kernels = device.type == "cuda" and pow2  # other head dims: the reference path
        # Compressed keys are stored minus a per-head offset m, the mean key of the first chunk
        # written (the prompt). softmax(q.(k - m)) = softmax(q.k) for any m fixed per head, so
        # attention is unchanged; but where a shared mean holds most of the keys' energy
        # (Qwen2.5: ~95%), the per-token part quantizes with far smaller error once m is out.
        # m is set by the first eager write at position 0 and stays fixed until reset(); graphs
        # subtract the buffer as it is, so they see whatever the prefill put there.
        center = spec.center_keys and not fmt_k.is_dense
        self.key_offset = torch.zeros(num_kv_heads, head_dim, dtype=torch.float32, device=device) if center else None
        self._offset_fixed = False
        # q8_0 / q4_0 keys stored rotated (R k, R the orthonormal Hadamard rotation of tq3_0, which
        # rotates its own): q.k = (R q).(R k), so attention reads them with the query rotated. The
        # rotation flattens a row (peak / RMS ~4 -> ~2.5), and a block's error scales with its
        # largest value: on Qwen2.5-0.5B, q8_0 K's KL 3x lower, q4_0 K +35% -> +20% perplexity
        # (docs/kv.md, "Rotated q8_0 / q4_0 keys").
        self.rotate_keys = spec.rotate_keys and fmt_k.name in ROTATED_KEY_FORMATS
        if self.rotate_keys:  # the rotation's one copy on this device now, not inside a CUDA-graph capture
            formats.tq3_rotation(min(formats.TQ3_GROUP, head_dim), device)

    def _stored_keys(self, k: torch.Tensor, start: int | None) -> torch.Tensor:
        """k [N, Hkv, D] as the K rows store it: centered, then rotated (each where the cache does it)."""
        k = self._centered(k, start)
        return formats.rotate(k) if self.rotate_keys else k

    def _write_keys(self, slots: int | torch.Tensor, k: torch.Tensor, start: int | None) -> None:
        if self.rotate_keys and self.use_kernels:  # centered, rotated and quantized in one launch
            self._fix_offset(k, start)
            self.k.write_rotated(slots, k, self.key_offset)
        else:
            self.k.write(slots, self._stored_keys(k, start), self.use_kernels)

    def _key_planes(self):
        return self.k.planes(rotated=self.rotate_keys)

    def _reference_query(self, q: torch.Tensor) -> torch.Tensor:
        """The query against the K rows as read (dequantized, still rotated when rotate_keys)."""
        return formats.rotate(q).to(q.dtype) if self.rotate_keys else q

    def _centered(self, k: torch.Tensor, start: int | None) -> torch.Tensor:
        """k [N, Hkv, D] -> k - m in fp32 (start: the eager write's first position; None in graphs)."""
        if self.key_offset is None:
            return k
        self._fix_offset(k, start)
        return k.float() - self.key_offset

    def _fix_offset(self, k: torch.Tensor, start: int | None) -> None:
        """The first eager write sets the key offset: k's mean at position 0 (None: graphs never set it)."""
        if self.key_offset is not None and start is not None and not self._offset_fixed:
            if start == 0:
                self.key_offset.copy_(k.float().mean(0))
            self._offset_fixed = True  # rows already written without an offset keep it zero

    def attend(self, q, k, v, start, tree_mask, scale):
        # q: [T, H, D], k/v: [T, Hkv, D], tree_mask: [T, T] bool or None -> [T, H, D]
        n = q.shape[0]
        self._write_keys(start, k, start)
        self.v.write(start, v, self.use_kernels)
        if self.use_kernels and n <= MAX_KERNEL_TOKENS:
            from treeflash.kernels.attention.quant_attention import quant_attention

            return quant_attention(q, self._key_planes(), self.v.planes(), start, tree_mask, scale)
        if n > MAX_KERNEL_TOKENS:
            return self._prefill_attention(self._reference_query(q), start, tree_mask, scale)
        keys = self.k.read(start + n, q.dtype)
        values = self.v.read(start + n, q.dtype)
        return new_token_attention(self._reference_query(q), keys, values, start, tree_mask, scale)

    def _prefill_attention(self, q: torch.Tensor, start: int, tree_mask, scale: float) -> torch.Tensor:
        """A prefill chunk's attention over the whole prefix, one KV head's rows dequantized at a time and
        one query head per SDPA call (no rows repeated per query head): the rows held at once are one
        head's K and V in q's dtype, not every head's and their GQA copies (the 27B shape at 128K with
        q4_0: 0.13 GB instead of 1.75 GB). SDPA's heads are independent, so each head's output is the
        one the grouped call computes. q: [T, H, D] -> [T, H, D]."""
        n, hkv = q.shape[0], self.k.codes.shape[1]
        group = q.shape[1] // hkv
        out = torch.empty_like(q)
        for h in range(hkv):
            keys = self.k.read_head(start + n, h, q.shape[-1], q.dtype)  # [L, 1, D]
            values = self.v.read_head(start + n, h, q.shape[-1], q.dtype)
            for j in range(h * group, (h + 1) * group):
                out[:, j : j + 1] = new_token_attention(q[:, j : j + 1], keys, values, start, tree_mask, scale)
        return out

    def attend_static(self, q, k, v, slots, key_mask, scale):
        # slots: [T] long, key_mask: [T, max_len] bool; fixed shapes, no host sync on the kernel path
        self._write_keys(slots, k, None)
        self.v.write(slots, v, self.use_kernels)
        if self.use_kernels and q.shape[0] <= MAX_KERNEL_TOKENS:
            from treeflash.kernels.attention.quant_attention import quant_attention_masked

            return quant_attention_masked(q, self._key_planes(), self.v.planes(), key_mask, scale, slots=slots)
        length = key_mask.shape[-1]
        keys, values = self.k.read(length, q.dtype), self.v.read(length, q.dtype)
        return attention_reference(self._reference_query(q), keys, values, key_mask, scale, static=True)

    def commit(self, start: int, path: list[int]) -> None:
        if path == list(range(len(path))):
            return  # already contiguous
        src = torch.tensor(path, device=self.k.codes.device) + start
        dest = torch.arange(start, start + len(path), device=src.device)
        self.commit_static(dest, src)

    def commit_static(self, dest: torch.Tensor, src: torch.Tensor, path_len: torch.Tensor | None = None) -> None:
        """Rows src -> rows dest ([N] long each): the accepted nodes' slots into contiguous ones
        (all N: the padding entries past path_len copy rows beyond the committed length)."""
        self.k.move(dest, src)
        self.v.move(dest, src)

    def reset(self) -> None:
        # slots past seq_len are never read; the next sequence picks its own key offset
        if self.key_offset is not None:
            self.key_offset.zero_()
        self._offset_fixed = False

    def nbytes(self) -> int:
        return self.k.nbytes() + self.v.nbytes()
