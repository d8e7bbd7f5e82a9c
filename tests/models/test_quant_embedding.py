"""The token embedding kept in its GGUF blocks (models/quant_embedding.py): a lookup equals the
dequantized table's rows bit for bit, through the loader too; a tied head then multiplies by the same
blocks; the MTP head is read only when asked (load_model's mtp)."""

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as T
from gguf import quants

from treeflash.models.gguf_synth import random_blocks, write_synth_gguf
from treeflash.models.loader import build_model, load_model, open_checkpoint
from treeflash.models.quant_embedding import QuantEmbedding
from treeflash.models.quant_linear import QuantLinear
from treeflash.models.step import StepInput


@pytest.mark.parametrize("qtype", [T.Q4_K, T.Q6_K, T.Q8_0, T.Q4_0, T.Q3_K], ids=lambda t: t.name)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_lookup_equals_the_dequantized_table(qtype, dtype):
    blocks = random_blocks(qtype, (50, 512), np.random.default_rng(0))
    table = torch.from_numpy(quants.dequantize(blocks, qtype)).to(dtype)  # gguf's dequantizer, then the loader's cast
    emb = QuantEmbedding(torch.from_numpy(blocks), qtype.name, 512, dtype)
    ids = torch.tensor([[3, 0, 49], [7, 7, 12]])
    out = emb(ids)
    assert out.shape == (2, 3, 512) and out.dtype == dtype
    assert torch.equal(out, table[ids])
    assert torch.equal(emb.dequantized(), table)
    assert emb.blocks.numel() < table.numel() * 2


def test_bad_blocks_raise():
    with pytest.raises(ValueError, match="do not hold rows"):
        QuantEmbedding(torch.zeros(4, 100, dtype=torch.uint8), "Q8_0", 256, torch.float32)


def test_loader_keeps_the_embedding_in_blocks(tmp_path):
    path = write_synth_gguf(tmp_path / "m.gguf", "tiny-dense", "q4_k_m", seed=1)
    keep = lambda fmt: True  # noqa: E731
    blocks = build_model(open_checkpoint(path), torch.device("cpu"), torch.float32, False, keep_quantized=keep, keep_embedding=True)
    table = build_model(open_checkpoint(path), torch.device("cpu"), torch.float32, False, keep_quantized=keep)
    assert isinstance(blocks.model.embed_tokens, QuantEmbedding) and blocks.model.embed_tokens.fmt == "Q4_K"
    assert isinstance(table.model.embed_tokens, torch.nn.Embedding)
    assert blocks.device == table.device and blocks.dtype == table.dtype == torch.float32
    ids = torch.arange(0, 512, 7)
    assert torch.equal(blocks.embed(ids), table.embed(ids))
    with torch.inference_mode():
        a = blocks(StepInput.plain(ids[:20], 0), blocks.new_cache(32)).logits
        b = table(StepInput.plain(ids[:20], 0), table.new_cache(32)).logits
    assert torch.equal(a, b)


def test_a_tied_head_multiplies_by_the_embedding_blocks(tmp_path):
    from tests.models.test_loaders import random_hf, write_gguf

    path = write_gguf(tmp_path / "tied.gguf", random_hf("qwen3", tie_word_embeddings=True), arch="qwen3")
    keep = lambda fmt: True  # noqa: E731
    blocks = build_model(open_checkpoint(path), torch.device("cpu"), torch.float32, False, keep_quantized=keep, keep_embedding=True)
    table = build_model(open_checkpoint(path), torch.device("cpu"), torch.float32, False, keep_quantized=keep)
    assert table.lm_head is None and isinstance(blocks.lm_head, QuantLinear)
    assert blocks.lm_head.blocks.data_ptr() == blocks.model.embed_tokens.blocks.data_ptr()  # one copy of the table
    hidden = torch.randn(3, blocks.config.hidden_size)
    torch.testing.assert_close(blocks.head(hidden), table.head(hidden), rtol=1e-5, atol=1e-5)


def test_mtp_head_only_when_asked(tmp_path):
    path = write_synth_gguf(tmp_path / "h.gguf", "tiny-hybrid", "q8_0", seed=2)
    assert load_model(str(path), device="cpu", progress=False).model.mtp is not None
    assert load_model(str(path), device="cpu", progress=False, mtp=False).model.mtp is None
