"""DFlashModel: z-lab's DFlash block-diffusion drafter (arXiv 2602.06036), and its checkpoint loader.

A few Qwen3-style decoder layers with no embedding and no lm_head of their own (the block is
embedded with the target's embedding, logits come from the target's head):

    ctx   = hidden_norm(fc(cat(target hidden states at target_layer_ids)))     # [n, H]
    x     = target.embed([root, MASK, ..., MASK]) * input_embedding_scale      # [B, H]
    layer:  q from x only; k, v = k_proj / v_proj of [ctx ; x], k_norm, RoPE at absolute positions;
            no causal mask inside the block (bidirectional), except on `sliding_attention` layers
            (causal, windowed) or where config.json sets `is_causal`
    out   = norm(x)[1:] -> target head -> B - 1 draft distributions (depths 1 .. B-1)

Only the context rows' keys and values are kept in a DraftCache: every forward pass projects the
context rows committed since the last pass, appends them, and writes the block's keys and values
after them as scratch that the next pass overwrites (the reference crops them instead).

Checkpoint format (z-lab's `DFlashDraftModel.save_pretrained`): config.json is a Qwen3 config plus
`dflash_config` {target_layer_ids, mask_token_id, block_size}; tensors are named as in the
reference (`fc.weight`, `hidden_norm.weight`, `norm.weight`, `layers.{i}.self_attn.q_proj.weight`,
...), so they load by name. The sliding-window rules follow transformers' Qwen3Config:
`sliding_window` counts only when `use_sliding_window` is true, and missing `layer_types` are
derived from it and `max_window_layers` (spec/dflash_config.py reads them).
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from treeflash.errors import ModelLoadError
from treeflash.kernels.spec.draft_slots import draft_slot_ids, draft_slots
from treeflash.kernels.pointwise.rotary import norm_rotary_into_cache
from treeflash.kv.attention_cache import attention_reference, static_attention_reference, static_buffer_attention
from treeflash.models.layers import MLP, RMSNorm, Rotary, apply_rotary, fuse_linears
from treeflash.models.quant_linear import QuantLinear
from treeflash.spec.dflash_config import DFlashConfig


class DraftCache:
    """Keys and values of the committed context rows, per draft layer; `length` rows are final.

    Rows past `length` are scratch (the block of the last pass). Buffers grow by doubling."""

    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype, device: torch.device):
        self.shape = (num_kv_heads, head_dim)
        self.dtype, self.device = dtype, device
        self.k: list[torch.Tensor] = [self._empty(0) for _ in range(num_layers)]
        self.v: list[torch.Tensor] = [self._empty(0) for _ in range(num_layers)]
        self.length = 0

    def _empty(self, n: int) -> torch.Tensor:
        return torch.zeros(n, *self.shape, dtype=self.dtype, device=self.device)

    def reserve(self, total: int) -> None:
        cap = self.k[0].shape[0]
        if total <= cap:
            return
        cap = max(total, 2 * cap, 256)
        for bufs in (self.k, self.v):
            for i, old in enumerate(bufs):
                new = self._empty(cap)
                new[: self.length] = old[: self.length]
                bufs[i] = new

    def reset(self) -> None:
        self.length = 0


class DFlashAttention(nn.Module):
    def __init__(self, c: DFlashConfig, layer: int):
        super().__init__()
        h, d = c.hidden_size, c.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = c.num_heads, c.num_kv_heads, d
        self.q_proj = nn.Linear(h, c.num_heads * d, bias=c.attention_bias)
        self.k_proj = nn.Linear(h, c.num_kv_heads * d, bias=c.attention_bias)
        self.v_proj = nn.Linear(h, c.num_kv_heads * d, bias=c.attention_bias)
        self.o_proj = nn.Linear(c.num_heads * d, h, bias=c.attention_bias)
        self.q_norm = RMSNorm(d, c.rms_norm_eps)
        self.k_norm = RMSNorm(d, c.rms_norm_eps)
        self.causal, self.window = c.layer_causal(layer), c.layer_window(layer)
        self.scale = d**-0.5
        self.register_buffer("qkv_weight", None, persistent=False)  # [q + 2 kv outputs, hidden] once fused
        self.register_buffer("qkv_bias", None, persistent=False)
        self.qkv_packed: QuantLinear | None = None  # q8_0 drafter weights (load_dflash): q, k, v as one QuantLinear
        self.kv_packed: QuantLinear | None = None  # its k and v rows (views of the same blocks)

    def fuse(self) -> None:
        """One GEMM for q, k and v (their weights become views of one tensor; GGUF blocks: one QuantLinear)."""
        lins = [self.q_proj, self.k_proj, self.v_proj]
        if self.qkv_weight is not None or self.qkv_packed is not None:
            return
        if all(type(m) is nn.Linear for m in lins):
            self.qkv_weight, self.qkv_bias = fuse_linears(lins)
        elif QuantLinear.can_concat(lins):
            self.qkv_packed = QuantLinear.concat(lins)
            qo, fused = self.q_proj.out_features, self.qkv_packed
            self.kv_packed = QuantLinear(fused.blocks[qo:], fused.fmt, fused.in_features,
                                         None if fused.bias is None else fused.bias.data[qo:])
            self.kv_packed.tuning = fused.tuning

    def _qkv(self, rows: torch.Tensor, q_from: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q [R - q_from, heads, D] of rows[q_from:], k and v [R, kv heads, D] of every row. Fused and
        q_from = 0 (the static pass: a few context rows), one GEMM; else q apart (an eager pass's context
        can be a whole prompt, whose queries nothing reads) and k, v in one GEMM once fused."""
        r, qo = rows.shape[0], self.q_proj.out_features
        kv_sizes = [self.k_proj.out_features, self.v_proj.out_features]
        if self.qkv_packed is not None:
            if q_from == 0:
                q, k, v = self.qkv_packed(rows).split([qo, *kv_sizes], dim=-1)
            else:
                q = self.q_proj(rows[q_from:])
                k, v = self.kv_packed(rows).split(kv_sizes, dim=-1)
        elif self.qkv_weight is not None and q_from == 0:
            q, k, v = F.linear(rows, self.qkv_weight, self.qkv_bias).split([qo, *kv_sizes], dim=-1)
        else:
            q = self.q_proj(rows[q_from:])
            if self.qkv_weight is None:
                k, v = self.k_proj(rows), self.v_proj(rows)
            else:
                bias = None if self.qkv_bias is None else self.qkv_bias[qo:]
                k, v = F.linear(rows, self.qkv_weight[qo:], bias).split(kv_sizes, dim=-1)
        return (q.view(r - q_from, self.num_heads, self.head_dim), k.view(r, self.num_kv_heads, self.head_dim),
                v.view(r, self.num_kv_heads, self.head_dim))

    def forward(
        self,
        x: torch.Tensor,  # [B, H] the block
        ctx: torch.Tensor,  # [n, H] context features of the newly committed rows
        rope: tuple[torch.Tensor, torch.Tensor],  # cos, sin: [n + B, head_dim] at positions start .. start+n+B-1
        keys: torch.Tensor,  # [>= start + n + B, Hkv, D] this layer's DraftCache buffers
        values: torch.Tensor,
        start: int,  # committed context rows before ctx
        slots: torch.Tensor | None = None,  # static mode: [n + B] long, = start .. start+n+B-1 on the device
        key_pos: torch.Tensor | None = None,  # static mode: [S] long, arange over the whole cache buffer
        mask: torch.Tensor | None = None,  # static mode: [B, S] bool, this layer's `_mask` (None: computed here)
        rows: torch.Tensor | None = None,  # [n + B, H] = cat(ctx, x), already in one buffer (static passes)
    ) -> torch.Tensor:  # [B, H]
        b, n = x.shape[0], ctx.shape[0]
        both = rows if rows is not None else torch.cat((ctx, x)) if n else x
        if slots is not None and mask is None and self.needs_mask():
            mask = self._mask(slots[n:], key_pos, slots[-1:] + 1)
        if slots is not None and _rotary_kernel_fits(rope[0]):
            return self._static(both, b, rope, keys, values, slots, key_pos, mask)
        q, k, v = self._qkv(both, q_from=n)
        q, k = self.q_norm(q), self.k_norm(k)
        cos, sin = rope
        q, k = apply_rotary(q, cos[n:], sin[n:]), apply_rotary(k, cos, sin)
        if slots is None:  # eager: shapes follow the context length
            end = start + n + b
            keys[start:end] = k.to(keys.dtype)
            values[start:end] = v.to(values.dtype)
            mask = None  # the block sees every written row, unless causal or windowed
            if self.causal or self.window is not None:
                k_pos = torch.arange(end, device=x.device)
                mask = self._mask(k_pos[end - b :], k_pos, end)
            return self.o_proj(attention_reference(q, keys[:end].to(q.dtype), values[:end].to(q.dtype), mask, self.scale).reshape(b, -1))
        # static (CUDA graphs): the start lives on the device; the buffer under a mask
        assert key_pos is not None
        keys.index_copy_(0, slots, k.to(keys.dtype))
        values.index_copy_(0, slots, v.to(values.dtype))
        out = static_buffer_attention(q, keys, values, mask, self.scale, slots[n:], fallback=static_attention_reference)
        return self.o_proj(out.reshape(b, -1))

    def write_context(self, ctx: torch.Tensor, rope, keys: torch.Tensor, values: torch.Tensor, start: int) -> None:
        """ctx [n, H] context features -> their keys (k-norm, rotary at rope [n, rotary_dim]) and values
        into keys / values [start, start + n): what `forward` writes for them, without a block."""
        n = ctx.shape[0]
        _, k, v = self._qkv(ctx, q_from=n)  # no queries: nothing reads a context row's
        keys[start : start + n] = apply_rotary(self.k_norm(k), *rope).to(keys.dtype)
        values[start : start + n] = v.to(values.dtype)

    def _static(self, both, b, rope, keys, values, slots, key_pos, mask) -> torch.Tensor:
        """The static pass in few kernels (each costs ~3 us inside the drafter's graph on the H200,
        bytes next to nothing): q for every row (the context rows' are dropped: one GEMM's worth of
        FLOPs, no extra launch), then the q/k norms, rotary and the K/V cache writes as one kernel
        (kernels/rotary.norm_rotary_into_cache), replacing ~14 small ones."""
        n = both.shape[0] - b
        q, k, v = self._qkv(both)
        cos, sin = rope
        q = norm_rotary_into_cache(q, k, v, cos, sin, self.q_norm.weight, self.k_norm.weight, self.q_norm.eps, False,
                                   keys, values, slots)[n:]
        # on CUDA the split-K kernel, reading up to the block's last slot: SDPA over the whole buffer cost
        # ~240 us a layer in the CLI's 8193-slot cache on the H200, against ~13 in the evaluation's 600
        out = static_buffer_attention(q, keys, values, mask, self.scale, slots[n:], fallback=static_attention_reference)
        return self.o_proj(out.reshape(b, -1))

    def needs_mask(self) -> bool:
        """Whether a static pass needs a [B, S] key mask: not for a full layer, whose block sees every key up
        to the pass's last slot (static_buffer_attention without a mask)."""
        return self.causal or self.window is not None

    def _mask(self, q_pos: torch.Tensor, k_pos: torch.Tensor, total) -> torch.Tensor:
        """[B, S] bool: which key positions each block query sees.

        q_pos [B], k_pos [S]: absolute positions; keys at or past `total` (int or [1] tensor) are not
        written yet (static mode reads the whole buffer)."""
        q, k = q_pos[:, None], k_pos[None, :]
        visible = (k < total).expand(q.shape[0], -1)
        if self.causal:
            visible = visible & (k <= q)
        if self.window is not None:
            visible = visible & (q - k < self.window)
            if not self.causal:
                visible = visible & (k - q < self.window)
        return visible


class DFlashLayer(nn.Module):
    def __init__(self, c: DFlashConfig, layer: int):
        super().__init__()
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.self_attn = DFlashAttention(c, layer)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.mlp = MLP(c.hidden_size, c.intermediate_size)

    def forward(self, x, ctx, rope, keys, values, start, slots=None, key_pos=None, mask=None,
                residual: torch.Tensor | None = None, rows: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The block's stream is x + residual (x alone when residual is None) -> (mlp output, residual):
        each residual add runs inside the norm after it (kernels/norm.rmsnorm), so the stream after this
        layer is their sum. The context features enter every layer as they are; only the block goes
        through the norms. `rows` [n + B, H] (static passes): ctx in its first n rows; the normed block is
        written after them, and the attention projects all of it without a concatenation."""
        h, residual = self.input_layernorm.add_forward(x, residual, out=None if rows is None else rows[ctx.shape[0]:])
        a = self.self_attn(h, ctx, rope, keys, values, start, slots, key_pos, mask, rows)
        h, residual = self.post_attention_layernorm.add_forward(a, residual)
        return self.mlp(h), residual

    def fuse(self) -> None:
        """One GEMM for q/k/v and one for gate/up (inference: spec/dflash.py fuses the drafter it is given)."""
        self.self_attn.fuse()
        self.mlp.fuse()


class DFlashModel(nn.Module):
    def __init__(self, config: DFlashConfig):
        super().__init__()
        c = self.config = config
        self.layers = nn.ModuleList(DFlashLayer(c, i) for i in range(c.num_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.fc = nn.Linear(len(c.target_layer_ids) * c.hidden_size, c.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.rotary = Rotary(c.rope)  # buffers only, not in the state dict

    def fuse(self) -> "DFlashModel":
        """Inference: one GEMM for each layer's q/k/v and one for its gate/up (the parameters become
        views of the fused weights, requires_grad off: not for a model being trained)."""
        for layer in self.layers:
            layer.fuse()
        return self

    @property
    def dtype(self) -> torch.dtype:
        """The runtime dtype (activations, caches): the norms' (the linear weights may be GGUF blocks)."""
        return self.hidden_norm.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.hidden_norm.weight.device

    def new_cache(self) -> DraftCache:
        c = self.config
        return DraftCache(c.num_layers, c.num_kv_heads, c.head_dim, self.dtype, self.device)

    def forward(
        self,
        context: torch.Tensor,  # [n, len(target_layer_ids) * H] target hidden states of rows start .. start+n-1
        block: torch.Tensor,  # [B, H] embedded block (already scaled by input_embedding_scale)
        cache: DraftCache,  # `cache.length` = start; the n context rows are appended and kept
    ) -> torch.Tensor:  # [B, H] after the final norm: feed rows 1.. to the target's head
        start, n, b = cache.length, context.shape[0], block.shape[0]
        cache.reserve(start + n + b)
        ctx = self.hidden_norm(self.fc(context)) if n else block[:0]
        positions = torch.arange(start, start + n + b, device=block.device)
        rope = self.rotary.cos_sin(positions, block.dtype, limit=start + n + b)
        x, residual = block, None
        for i, layer in enumerate(self.layers):
            x, residual = layer(x, ctx, rope, cache.k[i], cache.v[i], start, residual=residual)
        cache.length = start + n  # the block's rows stay scratch
        return self.norm.add_forward(x, residual)[0]

    @torch.inference_mode()
    def absorb(self, context: torch.Tensor, cache: DraftCache) -> None:
        """Append context rows to the cache without a block: their keys and values do not depend on
        the block (the context features enter every layer as they are), so this writes what the
        next pass would have. How a prompt's rows, more than a static pass takes, reach the cache."""
        start, n = cache.length, context.shape[0]
        cache.reserve(start + n)
        ctx = self.hidden_norm(self.fc(context))
        cos, sin = self.rotary.cos_sin(torch.arange(start, start + n, device=ctx.device), ctx.dtype, limit=start + n)
        for i, layer in enumerate(self.layers):
            layer.self_attn.write_context(ctx, (cos, sin), cache.k[i], cache.v[i], start)
        cache.length = start + n

    def forward_static(
        self,
        context: torch.Tensor,  # [n, len(target_layer_ids) * H], n >= 1
        block: torch.Tensor,  # [B, H]
        cache: DraftCache,  # buffers already reserved; `cache.length` is NOT read or advanced
        start: torch.Tensor,  # [1] long on the device: committed context rows before `context`
        key_pos: torch.Tensor,  # [S] long: arange over the cache buffers (S <= their capacity)
        count: torch.Tensor | None = None,  # [1] long on the device: rows of `context` that are real (None: all)
    ) -> torch.Tensor:  # [B, H] after the final norm
        """The same pass with fixed shapes for a CUDA graph: the start is read from device memory,
        keys and values are written at slots computed on the device, and attention reads the buffer up to
        the block's last slot (under a mask only for causal or windowed layers).

        With `count`, only the first `count` context rows are real (a pass whose row count is known on
        the device only): the block follows them, and the padding rows are written to the buffer's
        last slot, past the block's last, which no query reads (start + count + B must stay below S - 1)."""
        n, b = context.shape[0], block.shape[0]
        # [n + B, H]: the context rows, then each layer's normed block rows (its q/k/v GEMM's input): no torch.cat
        rows = torch.empty(n + b, block.shape[1], dtype=block.dtype, device=block.device)
        ctx = self.hidden_norm.add_forward(self.fc(context), None, out=rows[:n])[0]
        table, limit = self.rotary.table, key_pos.shape[0]  # slots index the buffer: all below its length
        if table is not None and table.dtype == block.dtype and table.device == block.device and limit <= table.shape[1]:
            # slot = position in the draft cache (padding rows: the buffer's last slot), and cos / sin there: one launch
            slots, cos_sin = draft_slots(start, count, n, b, limit - 1, table)
            rope = (cos_sin[0], cos_sin[1])
        else:
            slots = draft_slot_ids(start, count, n, b, limit - 1)
            rope = self.rotary.cos_sin(slots, block.dtype, limit=limit)
        x, residual = block, None
        masks: dict[tuple, torch.Tensor] = {}  # one per kind of layer (full / causal / windowed), not per layer
        for i, layer in enumerate(self.layers):
            attn = layer.self_attn
            kind = (attn.causal, attn.window)
            if kind not in masks:  # the kernel reads a mask as bytes; a full layer needs none
                masks[kind] = attn._mask(slots[n:], key_pos, slots[-1:] + 1).contiguous() if attn.needs_mask() else None
            x, residual = layer(x, ctx, rope, cache.k[i], cache.v[i], 0, slots, key_pos, masks[kind], residual, rows)
        return self.norm.add_forward(x, residual)[0]

    def logits(self, hidden: torch.Tensor, head) -> torch.Tensor:
        """hidden [T, H] (after norm) -> [T, vocab] fp32 through the target's head, plus the config's scaling."""
        c = self.config
        logits = head(hidden)
        if c.output_multiplier != 1.0:
            logits = logits * c.output_multiplier
        if c.final_logit_softcapping is not None:
            logits = torch.tanh(logits / c.final_logit_softcapping) * c.final_logit_softcapping
        return logits


def _rotary_kernel_fits(cos: torch.Tensor) -> bool:
    """norm_rotary_into_cache handles rotary dims whose half is a power of two."""
    half = cos.shape[-1] // 2
    return cos.shape[-1] % 2 == 0 and half > 0 and half & (half - 1) == 0


DRAFTER_WEIGHTS = ("float", "q8_0")  # load_dflash: the linear layers at the runtime dtype, or as GGUF Q8_0 blocks


def quantized_linear_names(model: nn.Module) -> set[str]:
    """The weights `load_dflash(weights="q8_0")` keeps as Q8_0 blocks: every nn.Linear's (fc and each layer's
    projections); norms stay at the runtime dtype. spec/drafter_memory.py counts the same."""
    return {f"{name}.weight" for name, m in model.named_modules() if type(m) is nn.Linear}


def load_dflash(path: str | Path, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
                weights: str = "float") -> DFlashModel:
    """A z-lab DFlash checkpoint directory (config.json + *.safetensors) -> DFlashModel in eval mode.

    weights="q8_0": each linear layer becomes a QuantLinear over Q8_0 blocks quantized on `device` as its
    tensor is read (kernels/quant/quantize.py, gguf's quantizer bit for bit): about 53% of the float
    bytes at bf16, one tensor's float copy at a time."""
    from safetensors import safe_open

    from treeflash.kernels.quant.quantize import quantize_q8_0
    from treeflash.models.hf_loader import read_config_json, weight_files

    if weights not in DRAFTER_WEIGHTS:
        raise ModelLoadError(f"dflash drafter weights must be one of {', '.join(DRAFTER_WEIGHTS)}, got {weights!r}")
    p = Path(path).expanduser()
    config_path = p / "config.json"
    raw = read_config_json(p, "a DFlash drafter directory")
    config = DFlashConfig.from_dict(raw, str(config_path))
    with torch.device("meta"):
        model = DFlashModel(config)
    expected = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    quantized = quantized_linear_names(model) if weights == "q8_0" else set()
    bad = [n for n in quantized if expected[n][1] % 32]
    if bad:
        raise ModelLoadError(f"{p}: --drafter-weights q8_0 needs input sizes that are multiples of 32; {bad[0]} is {expected[bad[0]]}")
    blocks: dict[str, torch.Tensor] = {}
    tensors: dict[str, torch.Tensor] = {}
    for file in weight_files(p):
        try:
            with safe_open(p / file, framework="pt") as f:
                for name in f.keys():
                    ours = name.removeprefix("model.")
                    if ours.endswith("rotary_emb.inv_freq"):
                        continue
                    if ours not in expected:
                        raise ModelLoadError(f"{p / file}: unexpected tensor {name}; is this a DFlash (v1) drafter?")
                    t = f.get_tensor(name)
                    if tuple(t.shape) != expected[ours]:
                        raise ModelLoadError(f"{p / file}: {name} has shape {tuple(t.shape)}, the config implies {expected[ours]}")
                    if ours in quantized:  # from the checkpoint's values (bf16 -> fp32 is exact)
                        blocks[ours] = quantize_q8_0(t.to(device=device))
                    else:
                        tensors[ours] = t.to(device=device, dtype=dtype)
        except ModelLoadError:
            raise
        except Exception as e:
            raise ModelLoadError(f"{p / file}: not a readable safetensors file: {e}") from None
    missing = sorted(set(expected) - set(tensors) - set(blocks))
    if missing:
        raise ModelLoadError(f"{p}: missing tensors: {', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}")
    for name, b in blocks.items():
        module_path = name.rpartition(".")[0]
        parent_path, _, child = module_path.rpartition(".")
        parent = model.get_submodule(parent_path)
        lin = getattr(parent, child)
        setattr(parent, child, QuantLinear(b, "Q8_0", lin.in_features, bias=tensors.pop(f"{module_path}.bias", None)))
    model.load_state_dict(tensors, assign=True, strict=True)
    model.rotary = Rotary(config.rope).to(device)
    return model.eval()
