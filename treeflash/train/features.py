"""TargetTwin: the frozen target as a batched transformers model, for data generation and features.

Our CausalLM runs one sequence at a time (the latency setting speculative decoding is for);
training wants hundreds of sequences per pass. The twin is transformers' implementation of the
same architecture built over the *same weight tensors* (no copy: parameter names are equal), so
it batches (padding masks, `generate`) while everything the drafter later meets at inference
(embedding, head, hidden states) is the target's own. Rotary frequencies are copied from our
model, so GGUF frequency factors and llama3 scaling carry over exactly.

Captured features follow the DFlash convention (and `DFlashDrafter.observe`): the outputs of
layers `target_layer_ids`, concatenated in that order; the last layer's output, if asked for,
after the final norm (transformers' `hidden_states[-1]`).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch

from treeflash.errors import ModelLoadError
from treeflash.models.config import ModelConfig
from treeflash.models.transformer import CausalLM
from treeflash.train.data import Generated, pad_right


def hf_config(c: ModelConfig):
    """Our ModelConfig -> the transformers config of the same architecture."""
    import transformers as tf

    rope = {"rope_type": "default", "rope_theta": c.rope_theta}
    kw = dict(
        vocab_size=c.vocab_size,
        hidden_size=c.hidden_size,
        intermediate_size=c.intermediate_size,
        num_hidden_layers=c.num_layers,
        num_attention_heads=c.num_heads,
        num_key_value_heads=c.num_kv_heads,
        head_dim=c.head_dim,
        rms_norm_eps=c.rms_norm_eps,
        max_position_embeddings=c.max_position_embeddings,
        tie_word_embeddings=c.tie_word_embeddings,
    )
    if c.arch == "llama":
        return tf.LlamaConfig(**kw, attention_bias=c.attention_bias, rope_parameters=rope)
    if c.arch == "qwen2":
        return tf.Qwen2Config(**kw, rope_parameters=rope)
    if c.arch == "qwen3":
        return tf.Qwen3Config(**kw, rope_parameters=rope)
    if c.arch == "qwen3_5":
        return tf.Qwen3_5TextConfig(
            **kw,
            rope_parameters={**rope, "partial_rotary_factor": c.partial_rotary_factor},
            layer_types=list(c.layer_types),
            linear_conv_kernel_dim=c.linear_conv_kernel_dim,
            linear_key_head_dim=c.linear_key_head_dim,
            linear_value_head_dim=c.linear_value_head_dim,
            linear_num_key_heads=c.linear_num_key_heads,
            linear_num_value_heads=c.linear_num_value_heads,
        )
    raise ModelLoadError(f"train-drafter: no transformers twin for architecture {c.arch!r}")


GEN_ENGINES = ("auto", "treeflash", "hf")


class TargetTwin:
    def __init__(self, target: CausalLM, capture_layers: tuple[int, ...], eos_ids: tuple[int, ...], pad_id: int,
                 static_shape: tuple[int, int] | None = None, engine: str = "auto"):
        self.target, self.capture_layers = target, tuple(capture_layers)
        self.eos_ids, self.pad_id = tuple(eos_ids), int(pad_id)
        # who answers the prompts: treeflash's BatchGenerator (train/batch_gen.py: static cache, the
        # decode step as a CUDA graph; dense targets), or transformers' generate; auto = treeflash
        # for a dense target on CUDA, else transformers
        if engine not in GEN_ENGINES:
            raise ValueError(f"generation engine {engine!r}: one of {', '.join(GEN_ENGINES)}")
        from treeflash.train import batch_gen

        if engine == "treeflash" and not batch_gen.supports(target):
            raise ModelLoadError(f"train-drafter: --gen-engine treeflash takes dense llama/qwen2/qwen3 targets, "
                                 f"not {target.config.arch!r} (use --gen-engine hf)")
        use_ours = engine == "treeflash" or (engine == "auto" and target.device.type == "cuda" and batch_gen.supports(target))
        self.batch_gen = batch_gen.BatchGenerator(target, self.eos_ids) if use_ours else None
        self.engine = "treeflash" if use_ours else "hf"
        # (batch, prompt width): every transformers `generate` call padded to this one shape with a static
        # KV cache, which transformers compiles on CUDA (one compile for the whole run); None: dynamic cache
        self.static_shape = None if use_ours else static_shape
        self.hf = _build_twin(target)
        self.num_layers = target.config.num_layers
        bad = [i for i in self.capture_layers if not 0 <= i < self.num_layers]
        if bad:
            raise ModelLoadError(f"train-drafter: capture layers {bad} outside the target's {self.num_layers} layers")

    @property
    def device(self) -> torch.device:
        return self.target.device

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], max_new_tokens: int, temperature: float = 0.0, seed: int = 0) -> list[Generated]:
        """One batched `generate` over left-padded prompts; greedy at temperature 0. With static_shape
        (and prompts that fit it) the call is padded to that shape, rows repeating the first prompt,
        and runs on a static cache; if that fails the twin says so once and goes on dynamically."""
        if self.batch_gen is not None:
            try:
                return self.batch_gen.generate(prompts, max_new_tokens, temperature, seed)
            except RuntimeError as e:  # out of memory (transformers' cache grows instead), a capture failure: say why once
                self._fall_back(e)
        shape = self.static_shape
        if shape is not None and len(prompts) <= shape[0] and max(len(p) for p in prompts) <= shape[1]:
            try:
                padded = list(prompts) + [prompts[0]] * (shape[0] - len(prompts))
                return self._generate(padded, max_new_tokens, temperature, seed, width=shape[1])[: len(prompts)]
            except Exception as e:  # noqa: BLE001 - transformers' compile path: fall back, say why
                warnings.warn(f"train-drafter: generation with a static cache failed ({type(e).__name__}: {e}); "
                              "going on with a dynamic cache")
                self.static_shape = None
        return self._generate(prompts, max_new_tokens, temperature, seed)

    def _fall_back(self, e: Exception) -> None:
        warnings.warn(f"train-drafter: treeflash's batched generation failed ({type(e).__name__}: {e}); "
                      "going on with transformers' generate")
        self.batch_gen, self.engine = None, "hf"
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def _generate(self, prompts, max_new_tokens, temperature, seed, width: int | None = None) -> list[Generated]:
        from transformers import GenerationConfig

        static = width is not None
        width = width or max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, p in enumerate(prompts):
            ids[i, width - len(p):] = torch.tensor(p)
            mask[i, width - len(p):] = 1
        sampled = temperature > 0
        config = GenerationConfig(
            max_new_tokens=max_new_tokens,
            do_sample=sampled,
            temperature=temperature if sampled else None,
            top_k=None,
            top_p=None,
            eos_token_id=list(self.eos_ids) or None,
            pad_token_id=self.pad_id,
            **({"cache_implementation": "static"} if static else {}),
        )
        if sampled:
            torch.manual_seed(seed)
        out = self.hf.generate(input_ids=ids.to(self.device), attention_mask=mask.to(self.device), generation_config=config)
        result = []
        for p, row in zip(prompts, out[:, width:].tolist()):
            end = next((j for j, t in enumerate(row) if t in self.eos_ids), None)
            result.append(Generated(list(p), row if end is None else row[: end + 1], end is not None))
        return result

    @torch.no_grad()
    def capture(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """input_ids, attention_mask: [S, T] right-padded -> features [S, T, len(capture_layers) * hidden].

        no_grad, not inference_mode: the features enter the drafter's autograd graph as inputs."""
        outputs: dict[int, torch.Tensor] = {}
        layers = self.hf.model.layers
        hooks = [layers[i].register_forward_hook(_keep(outputs, i)) for i in set(self.capture_layers)]
        try:
            self.hf.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
        finally:
            for h in hooks:
                h.remove()
        last = self.num_layers - 1
        if last in outputs:  # the DFlash convention: the final layer's output is taken after the norm
            outputs[last] = self.hf.model.norm(outputs[last])
        return torch.cat([outputs[i] for i in self.capture_layers], dim=-1)


def _keep(outputs: dict[int, torch.Tensor], i: int):
    def hook(module, args, output):
        outputs[i] = output[0] if isinstance(output, tuple) else output

    return hook


def _build_twin(target: CausalLM):
    import transformers as tf

    config = hf_config(target.config)
    config._attn_implementation = "sdpa"
    with torch.device("meta"):
        hf = tf.AutoModelForCausalLM.from_config(config, dtype=target.dtype)
    state = {n: t for n, t in target.state_dict().items() if not n.startswith(("mtp.", "rotary."))}
    if target.config.tie_word_embeddings:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    missing, unexpected = hf.load_state_dict(state, strict=False, assign=True)
    missing = [m for m in missing if "rotary_emb" not in m]
    if missing or unexpected:
        raise ModelLoadError(f"train-drafter: the transformers twin does not match the target: missing {missing[:3]}, unexpected {unexpected[:3]}")
    # rotary tables are computed, not loaded: rebuild them for real, with our (possibly scaled) frequencies
    for name, module in list(hf.named_modules()):
        if name.endswith("rotary_emb"):
            parent_name, _, leaf = name.rpartition(".")
            fresh = type(module)(config=module.config).to(target.device)
            ours = target.rotary.inv_freq
            if fresh.inv_freq.shape == ours.shape:
                fresh.inv_freq = ours.clone()
                fresh.original_inv_freq = ours.clone()
            setattr(hf.get_submodule(parent_name), leaf, fresh)
    for name, t in list(hf.named_parameters()) + list(hf.named_buffers()):
        if t.is_meta:
            raise ModelLoadError(f"train-drafter: the transformers twin left {name} unset")
    hf.requires_grad_(False)
    return hf.eval()


class FeatureStore:
    """The target's features for every position of a Dataset, captured once before training.

    Capturing runs the whole frozen target over each batch: on a CPU that is most of a training
    step (SmolLM2-135M: ~5 s of a ~7 s step), and it is repeated every epoch. The store pays it
    once: rows [total, F] in the target's dtype, aligned with `Dataset.tokens`, filled by
    capturing length-sorted batches of at most `batch_tokens` padded positions. Right padding
    and causal attention make a sequence's rows independent of what it is batched with (up to
    floating-point batch-shape effects, as for any batched forward)."""

    def __init__(self, rows: torch.Tensor, offsets: torch.Tensor):
        self.rows = rows  # [total, F]
        self.offsets = offsets  # [num + 1] as Dataset.offsets

    @staticmethod
    def nbytes_for(data, twin: TargetTwin) -> int:
        c = twin.target.config
        return int(data.offsets[-1]) * len(twin.capture_layers) * c.hidden_size * twin.target.dtype.itemsize

    @staticmethod
    @torch.no_grad()
    def build(twin: TargetTwin, data, batch_tokens: int = 16384, progress: bool = True, desc: str = "features") -> "FeatureStore":
        from tqdm.auto import tqdm

        dev, c = twin.device, twin.target.config
        total = int(data.offsets[-1])
        rows = torch.empty(total, len(twin.capture_layers) * c.hidden_size, dtype=twin.target.dtype, device=dev)
        order = sorted(range(len(data)), key=data.length)
        batches, cur = [], []
        for i in order:  # ascending lengths: the newest sequence is the longest of its batch
            if cur and (len(cur) + 1) * data.length(i) > batch_tokens:
                batches.append(cur)
                cur = []
            cur.append(i)
        if cur:
            batches.append(cur)
        with tqdm(total=total, desc=desc, unit="tok", disable=not progress) as bar:
            for batch in batches:
                seqs = [data.sequence(i) for i in batch]
                ids, mask = pad_right(seqs)
                feats = twin.capture(ids.to(dev), mask.to(dev))  # [S, width, F]
                for j, i in enumerate(batch):
                    a, b = int(data.offsets[i]), int(data.offsets[i + 1])
                    rows[a:b] = feats[j, : b - a]
                bar.update(sum(len(s) for s in seqs))
        return FeatureStore(rows, data.offsets.clone())

    def batch(self, indices: list[int], width: int) -> torch.Tensor:
        """-> [S, width, F], sequence i's rows first, zeros after (as `capture` over right-padded ids gives,
        but with zeros where capture would give the padding's junk: those rows are masked off anyway)."""
        out = torch.zeros(len(indices), width, self.rows.shape[1], dtype=self.rows.dtype, device=self.rows.device)
        for j, i in enumerate(indices):
            a, b = int(self.offsets[i]), int(self.offsets[i + 1])
            out[j, : b - a] = self.rows[a:b]
        return out
