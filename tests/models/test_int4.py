"""--weights int4: GGUF Q4_0 / Q4_1 linear layers kept at 4 bits on the CPU (models/int4_linear.py).

The 4-bit codes are recovered exactly from the dequantized weights (gguf-py's own quantizer makes
the blocks); the kernel's semantics are checked against a plain-torch dequantization and it is
batch-invariant; a model runs within bf16 precision of its fp32 self; on these tiny models
speculative decoding over int4 weights equals plain decoding over them (on real models a near-tie
can flip: the fp32 ops around the 4-bit layers are not batch-invariant; docs/core.md)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.models.hf_oracle import make_pair
from tests.spec.oracle_drafter import OracleDrafter
from tests.spec.test_lossless_greedy import run
from treeflash.models.gguf_dequant import dequantize
from treeflash.models.int4_linear import GROUP, Int4Linear, int4_kernel_available, recover_q4, use_int4_model
from treeflash.models.step import StepInput

gguf = pytest.importorskip("gguf")
pytestmark = pytest.mark.skipif(not int4_kernel_available(), reason="this PyTorch has no CPU int4 kernel")


def gguf_roundtrip(w: torch.Tensor, kind: str) -> torch.Tensor:
    """w [N, K] -> gguf-py's quantization to `kind`, dequantized by treeflash (what the loader yields)."""
    qtype = getattr(gguf.GGMLQuantizationType, kind)
    raw = gguf.quants.quantize(w.numpy().astype(np.float32), qtype)
    return dequantize(torch.from_numpy(np.ascontiguousarray(raw)).view(torch.uint8).reshape(-1), int(qtype), tuple(w.shape), torch.float32)


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1"])
def test_recovers_the_4bit_codes_exactly(kind):
    g = torch.Generator().manual_seed(0)
    w = gguf_roundtrip(torch.randn(64, 256, generator=g) * 0.05, kind)
    q, scale, zero = recover_q4(w)
    assert q.dtype == torch.int32 and int(q.min()) >= 0 and int(q.max()) <= 15
    rebuilt = (q - 8).float() * scale.repeat_interleave(GROUP, 1) + zero.repeat_interleave(GROUP, 1)
    torch.testing.assert_close(rebuilt, w, atol=1e-6, rtol=0)


def test_float_weights_are_not_taken_for_4bit():
    g = torch.Generator().manual_seed(1)
    assert recover_q4(torch.randn(16, 64, generator=g)) is None  # a float tensor is not 4-bit
    assert recover_q4(gguf_roundtrip(torch.randn(16, 64, generator=g), "Q8_0")) is None  # nor is Q8_0
    assert recover_q4(torch.randn(16, 40, generator=g)) is None  # K not a multiple of 32


def test_int4_linear_against_plain_torch():
    g = torch.Generator().manual_seed(2)
    w = gguf_roundtrip(torch.randn(96, 128, generator=g) * 0.05, "Q4_1")
    q, scale, zero = recover_q4(w)
    layer = Int4Linear(q, scale, zero)
    # what the kernel multiplies by: codes with bf16 scales and zeros, computed independently here
    s16 = scale.to(torch.bfloat16).float().repeat_interleave(GROUP, 1)
    z16 = zero.to(torch.bfloat16).float().repeat_interleave(GROUP, 1)
    want_w = (q - 8).float() * s16 + z16
    torch.testing.assert_close(layer.dequantized(), want_w, atol=0, rtol=2**-8)  # the identity-GEMM read-out is bf16
    x = torch.randn(5, 128, generator=g)
    ref = x @ w.t()
    got = layer(x)
    assert got.dtype == torch.float32 and got.shape == (5, 96)
    assert (got - ref).abs().max() <= 2e-2 * ref.abs().max()  # bf16 activations, scales and output
    # batch-invariant: a row's result does not depend on the other rows (what verify needs)
    assert torch.equal(got, torch.cat([layer(x[i : i + 1]) for i in range(5)]))


def quantized_pair(arch: str):
    """A tiny random model whose linear layers hold Q4_1-representable weights (as from a Q4_1 GGUF)."""
    _, model = make_pair(arch)
    with torch.no_grad():
        for mod in model.model.modules():
            if isinstance(mod, torch.nn.Linear) and mod.weight.shape[1] % GROUP == 0:
                mod.weight.copy_(gguf_roundtrip(mod.weight.detach().clone(), "Q4_1"))
    return model


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_model_logits_within_bf16_of_fp32_and_spec_stays_exact(arch):
    model = quantized_pair(arch)
    ids = torch.randint(0, model.config.vocab_size, (24,), generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        ref = model(StepInput.plain(ids, 0), model.new_cache(32)).logits
    stats = use_int4_model(model)
    assert stats["int4"] > 0 and stats["fused"] == 2 * model.config.num_layers and stats["head"] == "bf16"
    with torch.inference_mode():
        got = model(StepInput.plain(ids, 0), model.new_cache(32)).logits
    assert (got - ref).abs().max() <= 3e-2 * ref.abs().max()
    # speculative decoding over the int4 weights == plain decoding over the same int4 weights
    prompt = ids[:10].tolist()
    plain, _ = run(model, prompt, 120)
    spec, stats = run(model, prompt, 120, OracleDrafter(model, depth=4, width=2, corrupt=0.3))
    assert spec == plain and stats.accepted_per_depth[0] > 0


def test_load_model_flag_errors():
    from treeflash.errors import InvalidRequestError
    from treeflash.models.loader import load_model

    with pytest.raises(InvalidRequestError, match="--weights"):
        load_model("unused.gguf", device="cpu", weights="int8")
    if torch.cuda.is_available():
        with pytest.raises(InvalidRequestError, match="CPU only"):
            load_model("unused.gguf", device="cuda", weights="int4")
