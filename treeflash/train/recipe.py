"""The DFlash training recipe (z-lab, arXiv 2602.06036; SpecForge's trainer): anchors, masks, loss.

Vocabulary (shared with trainer.py):
- sequence: prompt + response token ids; the target's features exist at every position.
- anchor a: a response position; its block is [token a, MASK x (B-1)] at positions a .. a+B-1.
- context of a block: the target features at positions 0 .. a-1 (strictly before the anchor),
  exactly what the drafter has at inference when token a is the root.
- block position k (0 .. B-1): k = 0 is the anchor; k >= 1 predicts the sequence's token a+k
  (its label), which the target itself produced. Depth k = block position k.

One forward pass drafts many blocks of many sequences: the queries are all blocks' tokens, the
keys are [context features ; all blocks' tokens], and the mask lets each block see its own
context and its own B tokens (bidirectionally) and nothing of the other blocks. The loss is
cross-entropy at depths 1 .. B-1 weighted by exp(-(k-1)/gamma): early depths matter most, because
a depth-k token only counts if depths 1 .. k-1 were all accepted.

`draft_hidden` recomputes DFlashModel's layers batched and with autograd (its own forward is one
block at a time over a cache, and on CUDA its norms run Triton kernels without a backward); a
parity test holds the two equal.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from treeflash.errors import InvalidRequestError
from treeflash.kernels.pointwise.norm import rmsnorm_ref
from treeflash.models.config import ModelConfig
from treeflash.models.layers import apply_rotary
from treeflash.spec.dflash_model import DFlashConfig, DFlashModel

IGNORE = -100  # label of block positions past the sequence end (and of padding blocks)


def target_layer_ids(num_target_layers: int, num_features: int) -> tuple[int, ...]:
    """The reference's spread: round(1 + i * (L - 4) / (n - 1)), i = 0 .. n-1 (one layer: the middle)."""
    if num_features == 1:
        return (num_target_layers // 2,)
    span = num_target_layers - 4
    ids = tuple(int(round(1 + i * span / (num_features - 1))) for i in range(num_features))
    if len(set(ids)) != len(ids) or min(ids) < 0:
        raise InvalidRequestError(f"--layers {num_features}: a target of {num_target_layers} layers has too few layers to read "
                                  f"{num_features} distinct ones (they would be {list(ids)}); use fewer draft layers", "layers")
    return ids


def drafter_config(target: ModelConfig, num_layers: int, block_size: int, mask_token_id: int) -> DFlashConfig:
    """A DFlash drafter shaped like one target layer (Qwen3-style), reading `num_layers` target layers.

    As in z-lab's drafters, the number of captured target layers equals the number of draft layers."""
    rope = ModelConfig.from_hf_dict(
        {
            "model_type": "qwen3",
            "vocab_size": target.vocab_size,
            "hidden_size": target.hidden_size,
            "intermediate_size": target.intermediate_size,
            "num_hidden_layers": num_layers,
            "num_attention_heads": target.num_heads,
            "num_key_value_heads": target.num_kv_heads,
            "head_dim": target.head_dim,
            "rope_theta": target.rope_theta,
            "rope_parameters": dict(target.rope_scaling) or None,
            "max_position_embeddings": target.max_position_embeddings,
        }
    )
    return DFlashConfig(
        hidden_size=target.hidden_size,
        intermediate_size=target.intermediate_size,
        num_layers=num_layers,
        num_heads=target.num_heads,
        num_kv_heads=target.num_kv_heads,
        head_dim=target.head_dim,
        target_layer_ids=target_layer_ids(target.num_layers, num_layers),
        mask_token_id=mask_token_id,
        block_size=block_size,
        rms_norm_eps=target.rms_norm_eps,
        rope=rope,
    )


# -- anchors and masks -----------------------------------------------------------------------------


@dataclass
class Blocks:
    """N blocks per sequence (padding blocks where a sequence has fewer anchor positions)."""

    anchors: torch.Tensor  # [S, N] long, block j of sequence s starts at position anchors[s, j]
    valid: torch.Tensor  # [S, N] bool, False for padding blocks
    input_ids: torch.Tensor  # [S, N*B] long, [anchor token, MASK x (B-1)] per block
    positions: torch.Tensor  # [S, N*B] long, anchor + k
    labels: torch.Tensor  # [S, N, B-1] long, the sequence's token at anchor + k (k = 1 .. B-1), IGNORE past the end


def sample_blocks(
    input_ids: torch.Tensor,  # [S, T] long, right-padded sequences
    lengths: torch.Tensor,  # [S] long, real length of each sequence
    response_start: torch.Tensor,  # [S] long, first response position (>= 1)
    num_blocks: int,
    block_size: int,
    mask_token_id: int,
    generator: torch.Generator,
) -> Blocks:
    """Random distinct anchors in each response (positions response_start .. length-2: every
    anchor has at least one label), sorted; fewer when the response is short."""
    s_count = input_ids.shape[0]
    anchors = torch.zeros(s_count, num_blocks, dtype=torch.long)
    valid = torch.zeros(s_count, num_blocks, dtype=torch.bool)
    for s in range(s_count):
        lo, hi = int(response_start[s]), int(lengths[s]) - 1  # anchors in [lo, hi)
        count = max(hi - lo, 0)
        if count == 0:
            continue
        pick = torch.randperm(count, generator=generator)[:num_blocks].sort().values + lo
        anchors[s, : len(pick)] = pick
        valid[s, : len(pick)] = True
    return make_blocks(input_ids.cpu(), lengths.cpu(), anchors, valid, block_size, mask_token_id)


def make_blocks(input_ids, lengths, anchors, valid, block_size: int, mask_token_id: int) -> Blocks:
    s_count, n = anchors.shape
    b = block_size
    offs = torch.arange(b)
    pos = anchors[:, :, None] + offs  # [S, N, B]
    ids = torch.full((s_count, n, b), mask_token_id, dtype=torch.long)
    ids[:, :, 0] = input_ids.gather(1, anchors)
    label_pos = pos[:, :, 1:]
    in_seq = (label_pos < lengths[:, None, None]) & valid[:, :, None]
    labels = input_ids.gather(1, label_pos.clamp(max=input_ids.shape[1] - 1).reshape(s_count, -1)).view(s_count, n, b - 1)
    labels = torch.where(in_seq, labels, torch.full_like(labels, IGNORE))
    return Blocks(anchors, valid, ids.view(s_count, n * b), pos.view(s_count, n * b), labels)


def block_attention_mask(
    anchors: torch.Tensor,  # [S, N] long
    context_len: int,  # T: context rows per sequence (positions 0 .. T-1)
    block_size: int,
    causal: bool = False,
    window: int | None = None,
) -> torch.Tensor:  # [S, N*B, T + N*B] bool, True = the query row may attend to the key
    """Queries: the blocks' rows. Keys: [context rows ; block rows]. A block sees the context
    strictly before its anchor and its own rows (all of them, or only earlier ones when `causal`),
    never another block; a sliding window (as in DFlashAttention) cuts keys farther than `window`."""
    s_count, n = anchors.shape
    b = block_size
    dev = anchors.device
    q_pos = (anchors[:, :, None] + torch.arange(b, device=dev)).view(s_count, n * b)  # [S, NB]
    q_anchor = anchors.repeat_interleave(b, dim=1)  # [S, NB]
    ctx_pos = torch.arange(context_len, device=dev)
    sees_ctx = ctx_pos[None, None, :] < q_anchor[:, :, None]  # [S, NB, T]
    block_id = torch.arange(n, device=dev).repeat_interleave(b)  # [NB]
    sees_blk = (block_id[:, None] == block_id[None, :])[None].expand(s_count, -1, -1)  # [S, NB, NB]
    mask = torch.cat((sees_ctx, sees_blk), dim=2)
    if causal or window is not None:
        k_pos = torch.cat((ctx_pos[None].expand(s_count, -1), q_pos), dim=1)  # [S, T + NB]
        diff = q_pos[:, :, None] - k_pos[:, None, :]  # query position - key position
        if causal:
            mask &= diff >= 0
        if window is not None:
            mask &= diff < window
            if not causal:
                mask &= diff > -window
    return mask


# -- the batched drafter forward -------------------------------------------------------------------


def draft_hidden(
    model: DFlashModel,
    features: torch.Tensor,  # [S, T, n*H] target features (context rows at positions 0 .. T-1)
    block_embeds: torch.Tensor,  # [S, NB, H] the blocks embedded by the target (times input_embedding_scale)
    block_positions: torch.Tensor,  # [S, NB] long
    anchors: torch.Tensor,  # [S, N] long
) -> torch.Tensor:  # [S, NB, H] after the final norm
    c = model.config
    s_count, t, _ = features.shape
    nb = block_embeds.shape[1]
    ctx = _norm(model.hidden_norm, model.fc(features))  # [S, T, H]
    ctx_pos = torch.arange(t, device=features.device)[None].expand(s_count, -1)
    cos, sin = model.rotary.cos_sin(torch.cat((ctx_pos, block_positions), dim=1).reshape(-1), block_embeds.dtype)
    cos, sin = cos.view(s_count, t + nb, -1), sin.view(s_count, t + nb, -1)
    masks: dict[tuple, torch.Tensor] = {}
    x = block_embeds
    for i, layer in enumerate(model.layers):
        attn = layer.self_attn
        key = (attn.causal, attn.window)
        if key not in masks:
            masks[key] = block_attention_mask(anchors, t, c.block_size, attn.causal, attn.window)[:, None]
        h = _norm(layer.input_layernorm, x)
        x = x + _attention(attn, h, ctx, cos, sin, masks[key])
        x = x + layer.mlp(_norm(layer.post_attention_layernorm, x))
    return _norm(model.norm, x)


def _norm(norm, x: torch.Tensor) -> torch.Tensor:
    return rmsnorm_ref(x, norm.weight, norm.eps)[0]  # differentiable (the Triton kernel has no backward)


def _attention(attn, x, ctx, cos, sin, mask) -> torch.Tensor:
    """DFlashAttention over many blocks: q from the blocks, k/v from [context ; blocks]."""
    s_count, nb, _ = x.shape
    t = ctx.shape[1]
    both = torch.cat((ctx.to(x.dtype), x), dim=1)  # [S, T + NB, H]
    hq, hk, d = attn.num_heads, attn.num_kv_heads, attn.head_dim
    q = _norm(attn.q_norm, attn.q_proj(x).view(s_count, nb, hq, d))
    k = _norm(attn.k_norm, attn.k_proj(both).view(s_count, t + nb, hk, d))
    v = attn.v_proj(both).view(s_count, t + nb, hk, d)
    q = apply_rotary(q.reshape(-1, hq, d), cos[:, t:].reshape(-1, cos.shape[-1]), sin[:, t:].reshape(-1, sin.shape[-1])).view(s_count, nb, hq, d)
    k = apply_rotary(k.reshape(-1, hk, d), cos.reshape(-1, cos.shape[-1]), sin.reshape(-1, sin.shape[-1])).view(s_count, t + nb, hk, d)
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2).to(q.dtype)  # [S, heads, rows, D]
    k = k.to(q.dtype)
    if hq != hk:
        k, v = k.repeat_interleave(hq // hk, dim=1), v.repeat_interleave(hq // hk, dim=1)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=attn.scale)  # [S, hq, NB, D]
    return attn.o_proj(out.transpose(1, 2).reshape(s_count, nb, hq * d))


# -- loss and acceptance ---------------------------------------------------------------------------


def depth_weights(block_size: int, gamma: float | None, device=None) -> torch.Tensor:
    """[B-1]: exp(-(k-1)/gamma) for depths k = 1 .. B-1 (all ones when gamma is None)."""
    k = torch.arange(1, block_size, device=device, dtype=torch.float32)
    return torch.ones_like(k) if gamma is None else torch.exp(-(k - 1) / gamma)


@dataclass
class BlockResult:
    loss: torch.Tensor  # scalar: weighted mean cross-entropy over the labelled depths
    correct: torch.Tensor  # [S, N, B-1] bool, top-1 == label (False where the label is IGNORE)
    labelled: torch.Tensor  # [S, N, B-1] bool


def block_loss(
    logits_fn,  # hidden [R, H] -> logits [R, vocab] fp32 (the target's head)
    hidden: torch.Tensor,  # [S, NB, H] from draft_hidden
    labels: torch.Tensor,  # [S, N, B-1]
    gamma: float | None,
) -> BlockResult:
    s_count, n, depth = labels.shape
    h = hidden.view(s_count, n, depth + 1, -1)[:, :, 1:]  # depths 1 .. B-1
    labelled = labels != IGNORE
    rows = h[labelled]  # only labelled rows reach the (vocab-sized) head
    logits = logits_fn(rows)
    ce = F.cross_entropy(logits.float(), labels[labelled], reduction="none")
    w = depth_weights(depth + 1, gamma, hidden.device).expand(s_count, n, depth)[labelled]
    loss = (ce * w).sum() / w.sum().clamp(min=1e-9) if rows.shape[0] else hidden.sum() * 0.0
    correct = torch.zeros_like(labelled)
    correct[labelled] = logits.argmax(-1) == labels[labelled]
    return BlockResult(loss, correct, labelled)


def accepted_lengths(correct: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """[S, N, B-1] top-1 hits -> [number of valid blocks] accepted draft length of greedy chain
    verification: the run of hits from depth 1 (tau of a block = this + 1, the bonus token)."""
    run = torch.cumprod(correct.long(), dim=-1).sum(-1)  # [S, N]
    return run[valid].float()


def lr_at(step: int, total: int, peak: float, warmup: float = 0.04, floor: float = 0.1) -> float:
    """Linear warmup over `warmup` of the steps, then cosine down to floor * peak."""
    warm = max(1, int(total * warmup))
    if step < warm:
        return peak * (step + 1) / warm
    progress = min(1.0, (step - warm) / max(1, total - warm))
    return peak * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress)))


def pick_mask_token(tokenizer, vocab_size: int) -> int:
    """A token id the data never contains, for the MASK rows, in this order:
    - the tokenizer's mask token;
    - an embedding row past the tokenizer's vocabulary (padding rows, as Qwen checkpoints have);
    - the first of the padding rows a GGUF vocabulary names `[PAD<n>]` at its end (llama.cpp fills
      the rows past the real vocabulary with them: Qwen2.5's GGUF has [PAD151665] .. [PAD151935],
      so the GGUF target picks what its Hugging Face twin picks);
    - the highest-id added token that is neither special (bos/eos/pad/unk) nor a chat control token
      (`<|...|>`, e.g. <|im_start|>, which every chat prompt contains);
    - the last id."""
    mask = getattr(tokenizer, "mask_token_id", None)
    if mask is not None and 0 <= mask < vocab_size:
        return int(mask)
    if len(tokenizer) < vocab_size:
        return len(tokenizer)
    first_pad = vocab_size
    while first_pad > 0 and _is_gguf_pad(tokenizer.convert_ids_to_tokens(first_pad - 1)):
        first_pad -= 1
    if first_pad < vocab_size:
        return first_pad
    special = {getattr(tokenizer, f"{k}_token_id", None) for k in ("bos", "eos", "pad", "unk")}
    special |= set(getattr(tokenizer, "all_special_ids", []) or [])
    added = sorted((i for t, i in tokenizer.get_added_vocab().items()
                    if i not in special and i < vocab_size and not (t.startswith("<|") and t.endswith("|>"))), reverse=True)
    return int(added[0]) if added else vocab_size - 1


def _is_gguf_pad(token: str | None) -> bool:
    return bool(token) and token.startswith("[PAD") and token.endswith("]") and token[4:-1].isdigit()
