"""CausalLM: the one decoder-only model class for every architecture we run.

Parameter names equal the Hugging Face ones (model.layers.N.self_attn.q_proj.weight, ...), so a
safetensors checkpoint loads by name and the transformers oracle can be copied in by state_dict.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from treeflash.kernels.linear import projection
from treeflash.kernels.linear.gemv import GemvTables
from treeflash.kv.cache import ATTENTION, RECURRENT, CacheLayout, CacheSpec, ModelCache
from treeflash.kv.recurrent_cache import RecurrentShape
from treeflash.models.attention import Attention
from treeflash.models.config import FULL_ATTENTION, ModelConfig
from treeflash.models.layers import MLP, RMSNorm, Rotary
from treeflash.models.packed_linear import PackedLinear
from treeflash.models.step import StepInput

# A "small" model: every projection weight at most this many bytes (the folded paths below are for those).
# (Measured and removed, docs/journal.md: the fused layers, norms, SwiGLU and residual adds inside Triton
# projections for verify steps; inside the step graphs on the H200 DDTree-32's step took 1.478 ms with them
# against 1.435 without.)
SMALL_WEIGHT_BYTES = 8 << 20
# Steps of 2..FOLDED_ROWS tokens may run forward_folded: each RMSNorm's scale folded into the projection
# after it (a second copy of the q/k/v and gate/up weights), its 1 / rms applied by the rotary and SiLU-mul
# kernels that follow, the residual adds inside cuBLAS (beta = 1): 8 launches a layer instead of 10. For
# small dense attention-only models (every projection at most SMALL_WEIGHT_BYTES), where the step is
# bound by launches, not bytes; fuse_projections chooses it. 64: the node counts checked on the H200 with
# the real default model (DDTree-48, bench/results/s23/); the 128-row bucket (trees of 64+ nodes) keeps
# the norm launches: not timed folded. (Stop 23's sampled NaN was not the folded math: a second Engine's
# fuse_projections freed the folded copies under the first one's graphs; fixed in stop 24, fold_into.)
FOLDED_ROWS = 64
# Folded everywhere: every step of a foldable model on CUDA, plain one-token steps and prefill included, runs
# forward_folded, with the norms' gains folded into the fused q/k/v and gate/up weights in place (no copy). On
# a one-token step the qkv and gate/up GEMVs read the raw stream, o_proj and down add into it in their epilogue,
# and 1 / rms comes from the rotary kernel and gemv_swiglu's own pass over the stream: 7 launches a layer
# instead of 9 (no RMSNorm kernel). On by default for the small models that take FOLDED_ROWS: on the H200
# (stop 28, bench/results/s28/), the SmolLM2 shape decodes at 2,078-2,081 tokens/s pipelined against
# 1,813-1,823 unfolded (the real default model: 2,061 against 1,831), while the Qwen3-8B shape lost (229.6
# against 235.9-236.2; where, is not separated: docs/performance.md "Stop 28"), so larger models keep it off.
# fuse_projections(folded_decode=True / False) forces it on / off for any foldable model. Irreversible for a
# loaded model (fuse_projections refuses to unfold).
# new_cache reserves the rotary table this far past max_len: positions stay below max_len by construction,
# and an index past the table would be a device-side assert inside a CUDA graph
ROPE_MARGIN = 256


def folded_decode_default(on_gpu: bool, foldable: bool, small: bool) -> bool:
    """fuse_projections' choice of folded decode when the caller does not make it: on CUDA (bf16 / fp16)
    for a small foldable model."""
    return on_gpu and foldable and small


@dataclass
class ForwardOutput:
    logits: torch.Tensor | None  # [T', vocab] fp32 (T' = len(logits_at) or T)
    hidden: torch.Tensor  # [T, hidden] final hidden state, after the final norm
    captured: torch.Tensor | None  # [T, len(capture_layers) * hidden]: outputs of the chosen layers
    argmax: torch.Tensor | None = None  # [T'] long: logits.argmax(-1), when a CUDA graph computed it in the step


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer_type: str):
        super().__init__()
        self.layer_type = layer_type
        eps, off = config.rms_norm_eps, config.norm_unit_offset
        self.input_layernorm = RMSNorm(config.hidden_size, eps, off)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps, off)
        if layer_type == FULL_ATTENTION:
            self.self_attn = Attention(config)
        else:
            from treeflash.models.gated_deltanet import GatedDeltaNet

            self.linear_attn = GatedDeltaNet(config)
        self.mlp = MLP(config.hidden_size, config.intermediate_size)
        self.folded_in_place = False  # fold_norms(in_place=True) ran: the gains are in the fused weights

    def forward(self, x, rope, step: StepInput, cache) -> torch.Tensor:
        out, residual = self.forward_residual(x, None, rope, step, cache)
        return out + residual

    def forward_folded(self, s: torch.Tensor, rope, step: StepInput, cache) -> torch.Tensor:
        """The layer on the residual stream s [T, hidden], updated in place, with both norms folded into
        the projections after them (Attention.forward_folded, MLP.forward_folded; needs fold_norms)."""
        s = self.self_attn.forward_folded(s, rope, step, cache, self.input_layernorm.eps)
        return self.mlp.forward_folded(s, self.post_attention_layernorm.eps)

    def fold_norms(self, fold: bool = True, in_place: bool = False) -> None:
        """Build (or refresh in place) the folded weight copies forward_folded reads. fold False builds
        none; copies built earlier stay: a CUDA graph captured over them (another Engine's, on this
        shared model) must not read freed memory. in_place: fold the gains into the fused q/k/v and
        gate/up weights themselves, once (no copy; every step must then run forward_folded)."""
        if not fold:
            return
        if in_place:
            if not self.folded_in_place:
                attn, mlp = self.self_attn, self.mlp
                attn.qkv_weight.copy_(self.input_layernorm.fold_into(attn.qkv_weight))
                mlp.gate_up.copy_(self.post_attention_layernorm.fold_into(mlp.gate_up))
                self.folded_in_place = True
            self.self_attn.qkv_folded, self.mlp.gate_up_folded = self.self_attn.qkv_weight, self.mlp.gate_up
            return
        self.self_attn.fold_norm(self.input_layernorm)
        self.mlp.fold_norm(self.post_attention_layernorm)

    def forward_residual(self, x, residual, rope, step: StepInput, cache):
        """The layer with the residual add fused into each norm: the stream is x + residual.
        (x, residual) -> (mlp output, residual)."""
        h, residual = self.input_layernorm.add_forward(x, residual)
        if self.layer_type == FULL_ATTENTION:
            h = self.self_attn(h, rope, step, cache)
        else:
            h = self.linear_attn(h, step, cache)
        h, residual = self.post_attention_layernorm.add_forward(h, residual)
        return self.mlp(h), residual

    def fuse(self) -> None:
        (self.self_attn if self.layer_type == FULL_ATTENTION else self.linear_attn).fuse()
        self.mlp.fuse()

    def use_gemv_tables(self, tables: GemvTables) -> None:
        """Which of this layer's one-row projections take the GEMVs (kernels/linear/gemv.py)."""
        (self.self_attn if self.layer_type == FULL_ATTENTION else self.linear_attn).gemv_tables = tables
        self.mlp.gemv_tables = tables


class Backbone(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, t) for t in config.layer_types)
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, config.norm_unit_offset)


class CausalLM(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.model = Backbone(config)
        self.rotary = Rotary(config)
        if config.tie_word_embeddings:
            self.lm_head = None
        else:
            self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.mtp: nn.Module | None = None  # set by the loader when the checkpoint carries mtp.* weights
        self.folded_rows = 0  # steps of 2..folded_rows tokens run forward_folded (fuse_projections chooses it)
        self.folded_decode = False  # every step runs forward_folded, the weights folded in place (fuse_projections' folded_decode)

    def fuse_projections(self, folded_rows: int | None = None, folded_decode: bool | None = None,
                         gemv_tables: GemvTables | None = None) -> "CausalLM":
        """Fuse q/k/v, gate/up and the linear-attention input projections into single GEMVs
        (the per-projection parameters become views, so names and loading are unchanged), and
        choose how many tokens a step may have to take the folded-norm path (None: FOLDED_ROWS for
        bf16/fp16 weights on CUDA whose largest projection is at most SMALL_WEIGHT_BYTES, for the models
        foldable() accepts, else 0; a positive value needs foldable()), and whether one-token steps take it
        too, the weights folded in place (None: on CUDA for a small foldable model; True / False force it for any
        foldable one; True needs foldable(); once on it stays on: every path then runs folded).
        gemv_tables: which one-row projection shapes take the GEMVs, with which launch configurations
        (None: as they are, gemv.TUNED for a new model; a tool's sweep or a test's tiny shapes pass others).
        Call after the weights are placed on their device."""
        for layer in self.model.layers:
            layer.fuse()
            if gemv_tables is not None:
                layer.use_gemv_tables(gemv_tables)
        on_gpu = self.device.type == "cuda" and self.dtype in (torch.float16, torch.bfloat16)
        largest = max((p.numel() * p.element_size() for name, p in self.model.layers.named_parameters()
                       if name.endswith("weight") and p.dim() == 2), default=0)
        small = on_gpu and largest <= SMALL_WEIGHT_BYTES and not self.has_packed()
        foldable = self.foldable()
        if folded_rows is None:
            folded_rows = FOLDED_ROWS if small and foldable else 0
        if folded_decode is None:
            folded_decode = self.folded_decode or folded_decode_default(on_gpu, foldable, small)
        if (folded_rows or folded_decode) and not foldable:
            raise ValueError(f"fuse_projections: folded norms need a dense attention-only model without q/k/v bias, "
                             f"output gate or packed (int4, GGUF block) projections ({self.config.arch})")
        if self.folded_decode and not folded_decode:
            raise ValueError("fuse_projections: the norms are folded into this model's weights in place "
                             "(folded_decode); load the model again to run it unfolded")
        for layer in self.model.layers:  # built only where the path is on; refreshed in place on a second call
            layer.fold_norms(bool(folded_rows or folded_decode), in_place=bool(folded_decode))
        self.folded_rows, self.folded_decode = folded_rows, bool(folded_decode)
        return self

    def foldable(self) -> bool:
        """Whether forward_folded applies: every layer full attention, no q/k/v bias, no output gate, no
        packed projections (GatedDeltaNet and gated attention keep the norm launches)."""
        c = self.config
        return (all(t == FULL_ATTENTION for t in c.layer_types) and not c.attention_bias and not c.attn_output_gate
                and not self.has_packed())

    def has_packed(self) -> bool:
        """Whether some projection is a PackedLinear (int4 codes, GGUF blocks): no `.weight` for the
        fused and folded paths."""
        return any(isinstance(m, PackedLinear) for m in self.model.layers.modules())

    # -- shared with drafters (DFlash and MTP reuse the target's embedding and head) --
    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_tokens(input_ids)

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden (after the final norm): [T, hidden] -> logits [T, vocab] fp32."""
        low = getattr(self, "head_weight_bf16", None)  # set by models.int4_linear.use_int4_model
        if low is not None:
            return torch.nn.functional.linear(hidden.to(low.dtype), low).float()
        if isinstance(self.lm_head, PackedLinear):  # a head kept as GGUF blocks
            return self.lm_head(hidden).float()
        w = self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return projection.cpu_padded_linear(hidden, w, rows=projection.CPU_PAD_HEAD_ROWS).float()

    @property
    def device(self) -> torch.device:
        e = self.model.embed_tokens
        return e.weight.device if isinstance(e, nn.Embedding) else e.device  # else a QuantEmbedding (GGUF blocks)

    @property
    def dtype(self) -> torch.dtype:
        e = self.model.embed_tokens
        return e.weight.dtype if isinstance(e, nn.Embedding) else e.dtype

    def cache_layout(self) -> CacheLayout:
        c = self.config
        kinds = tuple(ATTENTION if t == FULL_ATTENTION else RECURRENT for t in c.layer_types)
        rec = None
        if c.is_hybrid:
            key_dim = c.linear_num_key_heads * c.linear_key_head_dim
            value_dim = c.linear_num_value_heads * c.linear_value_head_dim
            rec = RecurrentShape(
                conv_dim=2 * key_dim + value_dim,
                conv_kernel=c.linear_conv_kernel_dim,
                num_v_heads=c.linear_num_value_heads,
                k_head_dim=c.linear_key_head_dim,
                v_head_dim=c.linear_value_head_dim,
            )
        return CacheLayout(kinds, c.num_kv_heads, c.head_dim, rec)

    def new_cache(self, max_len: int, cache_type_k: str = "auto", cache_type_v: str = "auto", center_keys: bool = True,
                  k_exact_layers: int = 0, rotate_keys: bool = True) -> ModelCache:
        spec = CacheSpec(max_len, self.dtype, self.device, cache_type_k, cache_type_v, center_keys, k_exact_layers, rotate_keys)
        self.rotary.reserve(max_len + ROPE_MARGIN, self.dtype)  # forward_layers gathers cos/sin rows from it
        return ModelCache(self.cache_layout(), spec)

    def forward(
        self,
        step: StepInput,
        cache: ModelCache,
        capture_layers: tuple[int, ...] = (),
        logits_at: torch.Tensor | None = None,  # [T'] long: rows to compute logits for; None = all
        compute_logits: bool = True,
    ) -> ForwardOutput:
        n = step.num_tokens
        if step.start != cache.seq_len:
            raise RuntimeError(f"step.start {step.start} != committed length {cache.seq_len}")
        cache.begin(n, verify=step.is_verify)
        out = self.forward_layers(step, cache, capture_layers, logits_at, compute_logits)
        if not step.is_verify:
            cache.end_plain(n)
        return out

    def forward_layers(
        self,
        step: StepInput,
        cache: ModelCache,
        capture_layers: tuple[int, ...] = (),
        logits_at: torch.Tensor | None = None,
        compute_logits: bool = True,
    ) -> ForwardOutput:
        """The computation alone, without the cache's host bookkeeping (what a CUDA graph captures)."""
        x = self.embed(step.input_ids)
        rope = self.rotary.cos_sin(step.positions, x.dtype, limit=cache.max_len)  # positions < max_len
        captured = []
        if 1 < step.num_tokens <= self.folded_rows or self.folded_decode:
            # norms folded into the projections (the stream updated in place; folded_decode: every step)
            for i, layer in enumerate(self.model.layers):
                x = layer.forward_folded(x, rope, step, cache.layers[i])
                if i in capture_layers:
                    captured.append(x.clone())
            hidden = self.model.norm(x)
        else:
            residual = None
            for i, layer in enumerate(self.model.layers):
                x, residual = layer.forward_residual(x, residual, rope, step, cache.layers[i])
                if i in capture_layers:
                    captured.append(x + residual)  # the layer's output stream
            hidden, _ = self.model.norm.add_forward(x, residual)
        logits = None
        if compute_logits:
            logits = self.head(hidden if logits_at is None else hidden.index_select(0, logits_at))
        cap = None
        if capture_layers:
            order = {layer_id: j for j, layer_id in enumerate(sorted(capture_layers))}
            cap = torch.cat([captured[order[i]] for i in capture_layers], dim=-1)
        return ForwardOutput(logits=logits, hidden=hidden, captured=cap)
