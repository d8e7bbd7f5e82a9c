"""BatchGenerator: the target answers a batch of prompts itself, on a static KV cache, with the
decode step as one CUDA graph (dense architectures: llama, qwen2, qwen3).

Why: transformers' `generate` is host-bound on the H200 (~125 ms a step for 1,024 rows of the 135M
default: 7.5K tokens/s), and a drafter learns from the target's answers, so the data budget is set
by this speed. Here a step is one graph replay over the whole batch.

Same semantics as the transformers twin's `generate` (features.TargetTwin): left-padded prompts,
each row's positions counting its own tokens only, pad keys masked, greedy at temperature 0,
Gumbel-max sampling above it; a row ends at its first end token (kept), or at max_new_tokens.

Layout: rows b, columns j of one [B, L] grid, L = the call's widest prompt W + max_new_tokens.
Prompt row b sits right-aligned in columns [W - len_b, W); new token n of every row goes to column
W + n. K/V caches [B, Hkv, L, D] per layer; grouped-query attention reads them without repeating:
the G query heads of a kv head become G query rows of one SDPA call.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from treeflash.models.config import FULL_ATTENTION
from treeflash.models.layers import apply_rotary
from treeflash.models.runner import capture_graph
from treeflash.models.transformer import CausalLM
from treeflash.train.data import Generated

DENSE = ("llama", "qwen2", "qwen3")
CHECK_EVERY = 16  # decode steps between host checks for "every row has ended"
PREFILL_MASK = 1 << 27  # attention-mask elements per prefill chunk of rows


def supports(model: CausalLM) -> bool:
    c = model.config
    return c.arch in DENSE and all(t == FULL_ATTENTION for t in c.layer_types) and not c.attn_output_gate


class BatchGenerator:
    def __init__(self, model: CausalLM, eos_ids: tuple[int, ...], graphs: bool | None = None):
        if not supports(model):
            raise ValueError(f"BatchGenerator: dense llama/qwen2/qwen3 targets only, not {model.config.arch!r}")
        self.model = model
        self.eos = torch.tensor(sorted(set(eos_ids)) or [-1], dtype=torch.long, device=model.device)
        self.graphs = model.device.type == "cuda" if graphs is None else graphs
        c = model.config
        self.hkv, self.group, self.head_dim = c.num_kv_heads, c.num_heads // c.num_kv_heads, c.head_dim

    # -- the computation (eager for the prompt, captured for a decode step) --

    def _forward(self, ids: torch.Tensor, pos: torch.Tensor, cols: torch.Tensor, mask: torch.Tensor,
                 caches: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        """ids, pos: [B, T] long; cols: [T] long, the grid columns they fill; mask: [B, 1, G*T or 1, L]
        bool (which columns each query sees) -> logits of the last column [B, vocab] fp32."""
        m = self.model
        b, t = ids.shape
        x = m.embed(ids)  # [B, T, hidden]
        cos, sin = m.rotary.cos_sin(pos.reshape(-1), x.dtype)  # [B*T, rotary_dim]
        for layer, (kc, vc) in zip(m.model.layers, caches):
            attn = layer.self_attn
            h = layer.input_layernorm(x)
            q = F.linear(h, attn.q_proj.weight, attn.q_proj.bias).view(b * t, -1, self.head_dim)
            k = F.linear(h, attn.k_proj.weight, attn.k_proj.bias).view(b * t, self.hkv, self.head_dim)
            v = F.linear(h, attn.v_proj.weight, attn.v_proj.bias).view(b, t, self.hkv, self.head_dim)
            if attn.q_norm is not None:
                q, k = attn.q_norm(q), attn.k_norm(k)
            q = apply_rotary(q, cos, sin).view(b, t, self.hkv, self.group, self.head_dim)
            k = apply_rotary(k, cos, sin).view(b, t, self.hkv, self.head_dim)
            kc.index_copy_(2, cols, k.transpose(1, 2))  # [B, Hkv, T, D] into columns `cols`
            vc.index_copy_(2, cols, v.transpose(1, 2))
            q = q.permute(0, 2, 3, 1, 4).reshape(b, self.hkv, self.group * t, self.head_dim)  # row g*T + t'
            o = F.scaled_dot_product_attention(q, kc, vc, attn_mask=mask, scale=attn.scale)  # [B, Hkv, G*T, D]
            o = o.view(b, self.hkv, self.group, t, self.head_dim).permute(0, 3, 1, 2, 4).reshape(b, t, -1)
            x = x + F.linear(o, attn.o_proj.weight)
            h = layer.post_attention_layernorm(x)
            mlp = layer.mlp
            x = x + F.linear(F.silu(F.linear(h, mlp.gate_proj.weight)) * F.linear(h, mlp.up_proj.weight), mlp.down_proj.weight)
        return m.head(m.model.norm(x[:, -1]))  # [B, vocab]

    def _pick(self, logits: torch.Tensor, temperature: float) -> torch.Tensor:
        if temperature <= 0:
            return logits.argmax(-1)
        u = torch.rand_like(logits).clamp_(min=1e-20)  # Gumbel-max: argmax(l / T + G) ~ softmax(l / T)
        return (logits / temperature - torch.log(-torch.log(u))).argmax(-1)

    # -- one call --

    @torch.inference_mode()
    def generate(self, prompts: list[list[int]], max_new_tokens: int, temperature: float = 0.0, seed: int = 0):
        """-> list[features.Generated], one per prompt, in order."""
        if not prompts or any(not p for p in prompts):
            raise ValueError("BatchGenerator.generate: every prompt needs at least one token")
        if max_new_tokens < 1:
            return [Generated(list(p), [], False) for p in prompts]
        m, dev = self.model, self.model.device
        b, w = len(prompts), max(len(p) for p in prompts)
        width = w + max_new_tokens
        lens = torch.tensor([len(p) for p in prompts], device=dev)
        ids = torch.zeros(b, w, dtype=torch.long, device=dev)
        for i, p in enumerate(prompts):
            ids[i, w - len(p):] = torch.tensor(p, device=dev)
        col = torch.arange(width, device=dev)
        start = (w - lens)[:, None]  # [B, 1]: each row's first prompt column
        valid = (col[None, :] >= start) & (col[None, :] < w)  # [B, L]: the prompt's tokens (a new column joins when written)
        pos = (col[None, :w] - start).clamp(min=0)  # [B, W]
        caches = [(torch.zeros(b, self.hkv, width, self.head_dim, dtype=m.dtype, device=dev),
                   torch.zeros(b, self.hkv, width, self.head_dim, dtype=m.dtype, device=dev)) for _ in range(m.config.num_layers)]
        if temperature > 0:
            torch.manual_seed(seed)
        # the prompt, PREFILL_MASK elements of attention mask at a time (rows of the batch): query
        # column j sees real columns <= j; a pad query sees itself (its output is never used)
        causal = col[None, :w, None] >= col[None, None, :]  # [1, W, L]
        rows = max(1, PREFILL_MASK // (self.group * w * width))
        logits = []
        for r0 in range(0, b, rows):
            r1 = min(b, r0 + rows)
            see = (causal & valid[r0:r1, None, :]) | (col[None, :w, None] == col[None, None, :])  # [R, W, L]
            see = see[:, None].expand(r1 - r0, self.group, w, width).reshape(r1 - r0, 1, self.group * w, width)
            logits.append(self._forward(ids[r0:r1], pos[r0:r1], col[:w], see, [(k[r0:r1], v[r0:r1]) for k, v in caches]))
        logits = torch.cat(logits)
        out = torch.zeros(b, max_new_tokens, dtype=torch.long, device=dev)
        tok = self._pick(logits, temperature)  # [B]
        out[:, 0] = tok
        done = (tok[:, None] == self.eos[None, :]).any(-1)
        # decode state: tok (the last new token, not yet cached), its position, its column, the out index
        state = dict(tok=tok, pos=lens.clone(), slot=torch.tensor([w], device=dev), n=torch.tensor([1], device=dev),
                     valid=valid.clone(), done=done)

        def step():
            s = state
            s["valid"].index_fill_(1, s["slot"], True)
            lg = self._forward(s["tok"][:, None], s["pos"][:, None], s["slot"], s["valid"][:, None, None, :], caches)
            nxt = self._pick(lg, temperature)
            out.index_copy_(1, s["n"], nxt[:, None])
            s["done"] |= (nxt[:, None] == self.eos[None, :]).any(-1)
            s["tok"].copy_(nxt)
            s["pos"].add_(1)
            s["slot"].add_(1)
            s["n"].add_(1)

        run = step
        if self.graphs and max_new_tokens > 1:
            run = _capture(step, state, out)
        produced = 1
        while produced < max_new_tokens:
            if produced % CHECK_EVERY == 0 and bool(state["done"].all()):
                break
            run()
            produced += 1
        rows = out[:, :produced].tolist()
        eos = set(self.eos.tolist())
        result = []
        for p, row in zip(prompts, rows):
            end = next((j for j, t in enumerate(row) if t in eos), None)
            result.append(Generated(list(p), row if end is None else row[: end + 1], end is not None))
        return result


def _capture(step, state: dict, out: torch.Tensor):
    """The decode step as one CUDA graph over the state's buffers (models.runner.capture_graph: warm-up
    on a side stream, no garbage collection while capturing). The warm-up advances the state; it is
    put back after the capture (which runs nothing), so the graph's first replay starts from the real one."""
    saved = {k: v.clone() for k, v in state.items()}
    saved_out = out.clone()
    graph, _ = capture_graph(step, None, warmups=1)
    for k, v in state.items():
        v.copy_(saved[k])
    out.copy_(saved_out)
    return graph.replay
