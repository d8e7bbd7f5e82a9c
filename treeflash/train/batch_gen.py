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
W + n. The model runs its own layers over the B rows (CausalLM.forward_layers with StepInput.rows);
the K/V caches are kv/batch_rows.py's [B, Hkv, L, D] per layer, where the rows' attention happens.
"""

from __future__ import annotations

import torch

from treeflash.kv.batch_rows import RowsCache
from treeflash.models.config import FULL_ATTENTION
from treeflash.models.runner import capture_graph
from treeflash.models.step import StepInput
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
                 cache: RowsCache) -> torch.Tensor:
        """ids, pos: [B, T] long; cols: [T] long, the grid columns they fill; mask: [B, T, L] bool (which
        columns each token sees) -> logits of the last column [B, vocab] fp32. The model's own layers
        (CausalLM.forward_layers) over a batched-rows step: every row its own positions and mask."""
        b, t = ids.shape
        last = torch.arange(b, device=ids.device) * t + (t - 1)  # [B]: each row's last token
        return self.model.forward_layers(StepInput.rows(ids, pos, cols, mask), cache, logits_at=last).logits

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
        cache = RowsCache.zeros(b, m.config.num_layers, self.hkv, width, self.head_dim, m.dtype, dev)
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
            logits.append(self._forward(ids[r0:r1], pos[r0:r1], col[:w], see, cache.rows(r0, r1)))
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
            lg = self._forward(s["tok"][:, None], s["pos"][:, None], s["slot"], s["valid"][:, None, :], cache)
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
