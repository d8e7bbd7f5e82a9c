"""4-bit weights on the CPU: GGUF Q4_0 / Q4_1 layers kept at 4 bits, multiplied by PyTorch's int4 kernel.

Decoding at batch 1 reads every weight once per token. The loader dequantizes a GGUF's 4.5-bit
blocks to fp32, 7x the bytes, and a CPU core streams ~8-18 GB/s: the embedded SmolLM2-135M is
537 MB of fp32 per token. `use_int4_weights(model)` swaps each linear layer whose weight is
4-bit representable for an `Int4Linear` that keeps the 4-bit codes and runs
`torch.ops.aten._weight_int4pack_mm_for_cpu` (groups of 32 along the input, per group a scale s
and a zero z: w = (q - 8) * s + z).

Which weights: recovered from the dequantized tensor, block by block, and checked. A Q4_1 block
is w = d * q + m with q in 0..15 (llama.cpp's quantizer puts the block's min at q = 0 and its max at
q = 15), so d = (max - min) / 15, m = min; a Q4_0 block is w = d * (q - 8) with the largest-
magnitude value at q = 0, so d = -that / 8. Every block must reproduce its dequantized values
(to 1e-3 of its step) in one of the two forms, or the layer stays float. The Q8_0 embedding (the
tied head of SmolLM2) is not 4-bit and stays float.

Numerics: the kernel's fast path takes bf16 activations and bf16 scales and zeros. Rounding a
block's scale to bf16 moves each weight by at most 8 * 2^-9 of the block's step (under 2% of the
4-bit rounding the file already has), and activations are rounded to bf16 at each such layer.
So this is the GGUF's own 4-bit model computed at about bf16 precision, like llama.cpp's CPU path
(which rounds activations to 8 bits); it is not bit-identical to the fp32 dequantized model.
The kernel is batch-invariant, but the fp32 ops between these layers (attention, norms) differ by
~1e-7 between a verify batch and a one-token step, and the bf16 rounding here can turn that into a
different greedy token at a near-tie: speculative decoding over int4 weights is exact only up to
bf16-level precision (docs/core.md has the measurement).
"""

from __future__ import annotations

import torch
from torch import nn

from treeflash.models.packed_linear import PackedLinear

GROUP = 32


def int4_kernel_available() -> bool:
    return hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu") and hasattr(torch.ops.aten, "_convert_weight_to_int4pack_for_cpu")


def recover_q4(w: torch.Tensor, group: int = GROUP) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """w [N, K] (dequantized Q4_0/Q4_1) -> (q [N, K] int32 in 0..15, scale [N, K/g], zero [N, K/g]) fp32
    with w = (q - 8) * scale + zero, or None when some block is not 4-bit in either form."""
    n, k = w.shape
    if k % group or n == 0:
        return None
    b = w.detach().float().reshape(n, k // group, group)
    lo, hi = b.amin(-1), b.amax(-1)
    # Q4_1: w = d * q + m
    d1 = (hi - lo) / 15
    q1 = torch.where(d1[..., None] > 0, ((b - lo[..., None]) / d1[..., None].clamp_min(1e-30)).round(), torch.zeros_like(b)).clamp(0, 15)
    ok1 = ((q1 * d1[..., None] + lo[..., None] - b).abs() <= 1e-3 * d1[..., None] + 1e-12).all(-1)
    # Q4_0: w = d * (q - 8), the largest-magnitude value at q = 0
    big = torch.where(hi.abs() > lo.abs(), hi, lo)
    d0 = -big / 8
    q0 = torch.where(d0[..., None] != 0, (b / d0[..., None].masked_fill(d0[..., None] == 0, 1.0) + 8).round(), torch.full_like(b, 8.0)).clamp(0, 15)
    ok0 = (((q0 - 8) * d0[..., None] - b).abs() <= 1e-3 * d0[..., None].abs() + 1e-12).all(-1)
    if not bool((ok1 | ok0).all()):
        return None
    q = torch.where(ok1[..., None], q1, q0)
    scale = torch.where(ok1, d1, d0)
    zero = torch.where(ok1, lo + 8 * d1, torch.zeros_like(d0))
    return q.reshape(n, k).to(torch.int32), scale, zero


class Int4Linear(PackedLinear):
    """y = x @ W^T (+ b) with W held as 4-bit codes, bf16 group scales and zeros (see the module doc)."""

    def __init__(self, q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, bias: torch.Tensor | None = None):
        super().__init__()
        self.out_features, self.in_features = q.shape
        self.register_buffer("packed", torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.contiguous(), 1), persistent=False)
        # [K/g, N, 2]: the kernel's layout
        self.register_buffer("scales_zeros", torch.stack((scale.t(), zero.t()), dim=-1).to(torch.bfloat16).contiguous(), persistent=False)
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x [..., K] -> [..., N] in x.dtype
        lead = x.shape[:-1]
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(x.reshape(-1, self.in_features).to(torch.bfloat16), self.packed, GROUP, self.scales_zeros)
        y = y.to(x.dtype).reshape(*lead, self.out_features)
        return y if self.bias is None else y + self.bias

    def dequantized(self) -> torch.Tensor:
        """[N, K] fp32: the weights this layer multiplies by (after the bf16 rounding of its scales)."""
        eye = torch.eye(self.in_features, dtype=torch.bfloat16)
        return torch.ops.aten._weight_int4pack_mm_for_cpu(eye, self.packed, GROUP, self.scales_zeros).float().t()

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int4 groups of {GROUP}"


def use_int4_weights(model: nn.Module) -> dict[str, int]:
    """Swap every nn.Linear of `model` whose weight is 4-bit representable (CPU only) for an Int4Linear.

    Returns counts: {"int4": layers swapped, "float": linear layers left float}."""
    if not int4_kernel_available():
        raise RuntimeError(f"this PyTorch ({torch.__version__}) has no CPU int4 kernel (_weight_int4pack_mm_for_cpu)")
    swapped = kept = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if not isinstance(child, nn.Linear):
                continue
            if child.weight.device.type != "cpu":
                raise RuntimeError("int4 weights run on the CPU only")
            got = recover_q4(child.weight)
            if got is None:
                kept += 1
                continue
            setattr(parent, name, Int4Linear(*got, bias=child.bias))
            swapped += 1
    return {"int4": swapped, "float": kept}


def _fuse(parent: nn.Module, names: tuple[str, ...]) -> Int4Linear | None:
    """One Int4Linear over the concatenated outputs of parent's linear layers `names` (one GEMV, one
    activation conversion instead of several); the layers themselves become int4 slices of it."""
    lins = [getattr(parent, n, None) for n in names]
    if not all(isinstance(lin, nn.Linear) for lin in lins) or len({lin.bias is None for lin in lins}) != 1:
        return None
    got = recover_q4(torch.cat([lin.weight.detach() for lin in lins]))
    if got is None:
        return None
    q, scale, zero = got
    bias = None if lins[0].bias is None else torch.cat([lin.bias.detach() for lin in lins])
    start = 0
    for name, lin in zip(names, lins):
        end = start + lin.out_features
        setattr(parent, name, Int4Linear(q[start:end], scale[start:end], zero[start:end], None if bias is None else bias[start:end]))
        start = end
    return Int4Linear(q, scale, zero, bias)


def use_int4_model(model) -> dict[str, int]:
    """A CausalLM's linear layers to int4 where 4-bit representable, and its head to bf16.

    q/k/v of each attention layer and gate/up of each MLP also get one fused Int4Linear
    (`qkv_packed`, `gate_up_packed`), which their forward passes use. The head (SmolLM2: the tied Q8_0
    embedding, 49152 x 576) is not 4-bit; a bf16 copy halves the bytes it reads per token.
    Returns the counts."""
    if not int4_kernel_available():
        raise RuntimeError(f"this PyTorch ({torch.__version__}) has no CPU int4 kernel (_weight_int4pack_mm_for_cpu)")
    fused = 0
    for mod in list(model.model.modules()):
        if hasattr(mod, "qkv_packed") and getattr(mod, "qkv_weight", None) is None:
            qkv = _fuse(mod, ("q_proj", "k_proj", "v_proj"))
            if qkv is not None:
                mod.qkv_packed, fused = qkv, fused + 1
        if hasattr(mod, "gate_up_packed") and getattr(mod, "gate_up", None) is None:
            gu = _fuse(mod, ("gate_proj", "up_proj"))
            if gu is not None:
                mod.gate_up_packed, fused = gu, fused + 1
    kept = use_int4_weights(model.model)["float"]
    stats: dict = {"int4": sum(isinstance(m, Int4Linear) for m in model.model.modules()) - fused, "fused": fused, "float": kept}
    w = model.model.embed_tokens.weight if model.lm_head is None else model.lm_head.weight
    model.register_buffer("head_weight_bf16", w.detach().to(torch.bfloat16).contiguous(), persistent=False)
    stats["head"] = "bf16"
    model.weights_format = "int4"
    return stats


# -- from the stored GGUF blocks (--weights native on the CPU) --

INT4_FORMATS = ("Q4_0", "Q4_1", "Q4_K")  # every 32 values: 4-bit codes q, w = a * q + b


def _f16(b: torch.Tensor) -> torch.Tensor:
    """[..., 2] uint8 -> [...] fp32 (one little-endian fp16 each)."""
    return b.contiguous().view(torch.float16).squeeze(-1).float()


def codes_from_blocks(
    blocks: torch.Tensor,  # [N, K / block_values * block_bytes] uint8, a Q4_0 / Q4_1 / Q4_K weight as stored
    fmt: str,
    k: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # q [N, K] int32 0..15, scale, zero [N, K / 32] fp32
    """The blocks' codes with w = (q - 8) * scale + zero per group of 32 (no float round trip, so any
    block, not only what llama.cpp's quantizer writes). Q4_0: w = d (q - 8); Q4_1: w = d q + m;
    Q4_K: per sub-block j of 32, w = d sc_j q - dmin mn_j, its 6-bit sc / mn packed in 12 bytes (j < 4:
    low 6 bits of bytes j / j + 4; j >= 4: nibbles of byte j + 4, top 2 bits of bytes j - 4 / j)."""
    n = blocks.shape[0]
    if fmt in ("Q4_0", "Q4_1"):
        head = 2 if fmt == "Q4_0" else 4
        b = blocks.reshape(n, k // GROUP, head + 16)
        qs = b[..., head:]
        q = torch.cat((qs & 0x0F, qs >> 4), dim=-1)  # [N, K/32, 32]: low nibbles = values 0..15
        d = _f16(b[..., 0:2])
        zero = torch.zeros_like(d) if fmt == "Q4_0" else _f16(b[..., 2:4]) + 8 * d
        return q.reshape(n, k).to(torch.int32), d, zero
    if fmt == "Q4_K":
        b = blocks.reshape(n, k // 256, 144)
        d, dmin, s = _f16(b[..., 0:2])[..., None], _f16(b[..., 2:4])[..., None], b[..., 4:16]
        sc = torch.cat((s[..., 0:4] & 63, (s[..., 8:12] & 0x0F) | ((s[..., 0:4] >> 6) << 4)), dim=-1).float()
        mn = torch.cat((s[..., 4:8] & 63, (s[..., 8:12] >> 4) | ((s[..., 4:8] >> 6) << 4)), dim=-1).float()
        chunks = b[..., 16:144].reshape(n, k // 256, 4, 1, 32)  # chunk j: sub-block 2j low nibbles, 2j + 1 high
        q = torch.cat((chunks & 0x0F, chunks >> 4), dim=3).reshape(n, k)
        scale = (d * sc).reshape(n, k // GROUP)
        return q.to(torch.int32), scale, 8 * scale - (dmin * mn).reshape(n, k // GROUP)
    raise ValueError(f"{fmt} is not a 4-bit format ({', '.join(INT4_FORMATS)})")


def _group_order(in_index: torch.Tensor) -> torch.Tensor | None:
    """A QuantLinear's input gather as whole groups of 32 (the model's column j = the file's p[j]):
    the file's group per model group, or None when the permutation splits a group."""
    p = torch.argsort(in_index)
    g = p.reshape(-1, GROUP)
    if bool((g[:, 0] % GROUP != 0).any()) or not torch.equal(g - g[:, :1], torch.arange(GROUP).expand_as(g)):
        return None
    return g[:, 0] // GROUP


def int4_codes(lin) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """(q, scale, zero) of a QuantLinear in INT4_FORMATS, in the model's column order; None otherwise."""
    if lin.fmt not in INT4_FORMATS:
        return None
    q, scale, zero = codes_from_blocks(lin.blocks, lin.fmt, lin.in_features)
    if lin.in_index is not None:
        order = _group_order(lin.in_index)
        if order is None:
            return None
        cols = (order[:, None] * GROUP + torch.arange(GROUP)).reshape(-1)
        q, scale, zero = q[:, cols], scale[:, order], zero[:, order]
    return q, scale, zero


def use_int4_blocks(model) -> dict[str, int]:
    """Every QuantLinear of a CausalLM (loaded with keep_quantized for INT4_FORMATS) to an Int4Linear
    built from its codes, q/k/v and gate/up fused where all are 4-bit (`qkv_packed`, `gate_up_packed`);
    a layer that cannot be (its input gather splits a group) becomes a dequantized nn.Linear.
    Returns {"int4": layers, "fused": fused groups, "float": layers dequantized}."""
    from treeflash.models.quant_linear import QuantLinear

    if not int4_kernel_available():
        raise RuntimeError(f"this PyTorch ({torch.__version__}) has no CPU int4 kernel (_weight_int4pack_mm_for_cpu)")
    stats = {"int4": 0, "fused": 0, "float": 0}
    for parent in list(model.modules()):
        groups = {"qkv_packed": ("q_proj", "k_proj", "v_proj"), "gate_up_packed": ("gate_proj", "up_proj")}
        for slot, names in groups.items():
            lins = [getattr(parent, n, None) for n in names]
            if getattr(parent, slot, "absent") is not None or not all(isinstance(m, QuantLinear) for m in lins):
                continue
            codes = [int4_codes(m) for m in lins]
            if any(c is None for c in codes) or len({m.bias is None for m in lins}) != 1:
                continue
            bias = None if lins[0].bias is None else torch.cat([m.bias.detach() for m in lins])
            setattr(parent, slot, Int4Linear(*(torch.cat(parts) for parts in zip(*codes)), bias=bias))
            stats["fused"] += 1
        for name, child in list(parent.named_children()):
            if not isinstance(child, QuantLinear):
                continue
            codes = int4_codes(child)
            if codes is None:
                lin = nn.Linear(child.in_features, child.out_features, bias=child.bias is not None, device="meta")
                lin.weight = nn.Parameter(child.dequantized(), requires_grad=False)
                if child.bias is not None:
                    lin.bias = nn.Parameter(child.bias.detach(), requires_grad=False)
                setattr(parent, name, lin)
                stats["float"] += 1
            else:
                setattr(parent, name, Int4Linear(*codes, bias=child.bias))
                stats["int4"] += 1
    model.weights_format = "native"
    return stats
