"""Random-weight models at real shapes (Qwen3-8B, Qwen3.5-27B, and tiny ones to check scripts),
the bytes a decode step reads from them, and how the GPU benchmarks time work and measure the
card's copy bandwidth. Shared by bench/gpu_speed.py and the other GPU scripts.

    from bench.gpu_shapes import SHAPES, build_model, cuda_time   # scripts run as python -m bench.NAME
"""

from __future__ import annotations

import statistics
import time

import torch

from treeflash.models.config import ModelConfig
from treeflash.models.transformer import CausalLM

SHAPES = {
    # Qwen3-8B: 36 layers, hidden 4096, 32 q heads / 8 kv heads of 128, MLP 12288, vocab 151936
    "qwen3-8b": dict(arch="qwen3", vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_layers=36,
                     num_heads=32, num_kv_heads=8, head_dim=128, qk_norm=True, rope_theta=1e6),
    # Qwen3.5-27B: 64 layers (48 Gated DeltaNet + 16 gated attention), hidden 5120, MLP 17408,
    # attention 24 q / 4 kv heads of 256 (partial rotary 0.25), linear 16 k / 48 v heads of 128
    "qwen3.5-27b": dict(arch="qwen3_5", vocab_size=248320, hidden_size=5120, intermediate_size=17408, num_layers=64,
                        num_heads=24, num_kv_heads=4, head_dim=256, qk_norm=True, attn_output_gate=True,
                        norm_unit_offset=True, partial_rotary_factor=0.25, rope_theta=1e7,
                        layer_types=tuple("full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(64)),
                        linear_conv_kernel_dim=4, linear_key_head_dim=128, linear_value_head_dim=128,
                        linear_num_key_heads=16, linear_num_value_heads=48),
    # SmolLM2-135M-Instruct (the embedded default): llama, 30 layers, hidden 576, 9 q / 3 kv heads of 64, MLP 1536
    "smollm2-135m": dict(arch="llama", vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30,
                         num_heads=9, num_kv_heads=3, head_dim=64, tie_word_embeddings=True, rope_theta=100000.0),
    # small shapes to check the script itself
    "tiny-dense": dict(arch="qwen3", vocab_size=1000, hidden_size=256, intermediate_size=512, num_layers=4,
                       num_heads=4, num_kv_heads=2, head_dim=64, qk_norm=True),
    "tiny-hybrid": dict(arch="qwen3_5", vocab_size=1000, hidden_size=256, intermediate_size=512, num_layers=4,
                        num_heads=4, num_kv_heads=2, head_dim=64, qk_norm=True, attn_output_gate=True,
                        norm_unit_offset=True, partial_rotary_factor=0.25,
                        layer_types=("linear_attention", "linear_attention", "linear_attention", "full_attention"),
                        linear_key_head_dim=32, linear_value_head_dim=32, linear_num_key_heads=2, linear_num_value_heads=4),
}


def cuda_time(fn, iters: int = 20, warmup: int = 3) -> float:
    """Median seconds of fn() by CUDA events (device time, launches included)."""
    if not torch.cuda.is_available():
        return wall_time(fn, iters, warmup)
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1000)
    return statistics.median(times)


def wall_time(fn, iters: int = 20, warmup: int = 3) -> float:
    """Median seconds of fn() by the host clock; fn must synchronize (e.g. read a token back)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure_bandwidth(gib: float = 4.0) -> float:
    n = int(gib * 2**30) // 2
    src = torch.randn(n, device=DEV, dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    t = cuda_time(lambda: dst.copy_(src), iters=10)
    del src, dst
    return 2 * n * 2 / t  # bytes read + written per second


DEV = "cuda" if torch.cuda.is_available() else "cpu"


def sync() -> None:
    if DEV == "cuda":
        torch.cuda.synchronize()


def build_model(shape: str, device=None, dtype=torch.bfloat16, layers: int | None = None) -> CausalLM:
    """A random-weight model of a SHAPES entry (weights ~ N(0, 0.02), norms as initialized); with
    `layers`, only its first layers (the per-layer work is the same)."""
    device = device or DEV
    kw = dict(SHAPES[shape])
    if layers is not None:
        kw["num_layers"] = layers
        if "layer_types" in kw:
            kw["layer_types"] = tuple(kw["layer_types"][:layers])
    cfg = ModelConfig(**kw)
    torch.manual_seed(0)
    with torch.device(device):
        prev = torch.get_default_dtype()
        torch.set_default_dtype(dtype)
        try:
            model = CausalLM(cfg)
        finally:
            torch.set_default_dtype(prev)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0, 0.02)
    return model.eval()


def weight_bytes(model: CausalLM) -> int:
    """Bytes a decode step reads: every parameter once, except the embedding table (one row), and every
    GGUF block kept quantized (QuantLinear blocks, scales included; fused layers' parts are views of one
    storage, counted once)."""
    from treeflash.models.quant_linear import QuantLinear

    total = sum(p.numel() * p.element_size() for p in model.parameters())
    emb = getattr(model.model.embed_tokens, "weight", None)  # None: a QuantEmbedding (its blocks are no parameter)
    if model.lm_head is not None and emb is not None:
        total -= emb.numel() * emb.element_size()
    storages = {}
    for m in model.modules():
        if isinstance(m, QuantLinear):
            s = m.blocks.untyped_storage()
            storages[s.data_ptr()] = s.nbytes()
    return total + sum(storages.values())


def state_bytes(model: CausalLM) -> int:
    """Recurrent bytes one decode step reads and writes: the fp32 state of every Gated DeltaNet layer."""
    c = model.config
    if not c.is_hybrid:
        return 0
    return len(c.linear_layer_ids) * c.linear_num_value_heads * c.linear_key_head_dim * c.linear_value_head_dim * 4 * 2


def step_bytes(model: CausalLM, cache, context: int) -> int:
    c = model.config
    kv = len(c.attention_layer_ids) * context * c.num_kv_heads * c.head_dim * 2 * 2  # bf16 K and V
    return weight_bytes(model) + kv + state_bytes(model)


def random_drafter(model: CausalLM, layers: int, block_size: int, budget: int = 64, tree: bool = True):
    """A DFlashDrafter over a random DFlash drafter of `layers` layers and `block_size` for `model`
    (its weights as the trainer initializes them), on the model's device and dtype."""
    from treeflash.spec.dflash import DFlashDrafter
    from treeflash.spec.dflash_model import DFlashModel
    from treeflash.train.recipe import drafter_config
    from treeflash.train.trainer import init_weights

    c = model.config
    draft = DFlashModel(drafter_config(c, layers, block_size, c.vocab_size - 1))
    init_weights(draft, seed=1)
    draft = draft.to(device=model.device, dtype=model.dtype).eval()
    return DFlashDrafter(model, draft, budget=budget, tree=tree)


def quant_model(spec: str, gguf_dir: str) -> tuple[CausalLM, dict]:
    """SHAPE:MIX -> (the model of a random-weight GGUF of that shape and mix, its weight plan). The file is
    written on first use (gguf_synth; a 27B Q4_K_M takes a few minutes at disk speed)."""
    from pathlib import Path

    from treeflash.models.gguf_synth import write_synth_gguf
    from treeflash.models.loader import build_model as load_blocks, open_checkpoint, weight_plan
    from treeflash.kernels.quant import FORMATS, has_kernel

    shape, _, mix = spec.partition(":")
    path = Path(gguf_dir) / f"{shape}-{mix}.gguf"
    if not path.is_file():
        t0 = time.perf_counter()
        write_synth_gguf(path.with_suffix(".part"), shape, mix).rename(path)
        print(f"wrote {path} ({path.stat().st_size / 1e9:.2f} GB) in {time.perf_counter() - t0:.0f} s", flush=True)
    ckpt = open_checkpoint(path)
    keep = (lambda fmt: fmt in FORMATS and has_kernel(fmt)) if DEV == "cuda" else (lambda fmt: True)  # the CPU check runs the reference path on every block
    model = load_blocks(ckpt, torch.device(DEV), torch.bfloat16, progress=False, keep_quantized=keep)
    return model, {"gguf": str(path), "file_gb": path.stat().st_size / 1e9, "weights": weight_plan(ckpt, model)}


def quant_tuning(routes: str):
    """"GEMV/ROWS[/Q6ROWS[/Q6GEMV[/Q8GEMV]]][+fused|+unfused]" (the suffix of SHAPE:MIX@...) -> the QuantTuning of
    those kernel routes: Q4_K at M == 1, Q4_K at 2..128 rows, Q6_K at 2..128 rows, Q6_K at M == 1, Q8_0 at M == 1
    (an empty part keeps the default); +fused / +unfused: the dp4a kernels' split over K finished by the tile's
    last program / by a split-sum launch (Dp4aConfig.fused_split)."""
    import dataclasses

    from treeflash.kernels.quant.config import QuantTuning

    routes, plus, flag = routes.partition("+")
    if plus and flag not in ("fused", "unfused"):
        raise ValueError(f"quant routes: unknown flag +{flag} (known: +fused, +unfused)")
    if plus:
        t = quant_tuning(routes)
        return dataclasses.replace(t, **{f: dataclasses.replace(getattr(t, f), fused_split=flag == "fused")
                                         for f in ("q4k_dp4a", "q4k_lanes", "q6k_dp4a", "q6k_lanes", "q8_0_dp4a", "q3k_dp4a")})
    parts = routes.split("/")
    if len(parts) > 5:
        raise ValueError(f"quant routes are GEMV/ROWS[/Q6ROWS[/Q6GEMV[/Q8GEMV]]], got {routes!r}")
    names = ("q4k_gemv_route", "q4k_rows_route", "q6k_rows_route", "q6k_gemv_route", "q8_0_gemv_route")
    return QuantTuning(**{n: v for n, v in zip(names, parts) if v})


def load_shape(shape: str, gguf_dir: str) -> tuple[CausalLM, dict, object]:
    """SHAPE (random bf16 weights) or SHAPE:MIX[@ROUTES] (a random GGUF kept in its blocks, QuantTuning of
    ROUTES or None) -> (model, extra JSON fields, tuning). Apply the tuning with apply_tuning after fusing."""
    if ":" not in shape:
        return build_model(shape), {}, None
    spec, _, routes = shape.partition("@")
    model, extra = quant_model(spec, gguf_dir)
    tuning = quant_tuning(routes) if routes else None
    if tuning is not None:
        extra["quant_routes"] = {"gemv": tuning.q4k_gemv_route, "rows": tuning.q4k_rows_route, "q6k_rows": tuning.q6k_rows_route,
                                "q6k_gemv": tuning.q6k_gemv_route,
                                "q8_0_gemv": tuning.q8_0_gemv_route, "fused_split": tuning.q4k_dp4a.fused_split}
    return model, extra, tuning


def apply_tuning(model: CausalLM, tuning, extra: dict) -> None:
    """Set tuning on every QuantLinear (after fuse_projections: the fused layers are new ones)."""
    if tuning is not None:
        from treeflash.models.quant_linear import set_quant_tuning

        extra["quant_routes"]["layers"] = set_quant_tuning(model, tuning)
