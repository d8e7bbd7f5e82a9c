"""The random-weight GGUF writer (models/gguf_synth.py): real shapes get llama.cpp's names, the mix's
types and the expected sizes; what it writes, the loader loads, and the model's logits are finite."""

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as T

from treeflash.models.gguf_loader import gguf_to_ours
from treeflash.models.gguf_synth import SHAPES, plan_bytes, tensor_plan, write_synth_gguf
from treeflash.models.loader import load_model
from treeflash.models.step import StepInput

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("shape,mix,low,high", [("qwen3.5-27b", "q4_k_m", 16.0e9, 17.5e9), ("qwen3.5-27b", "ud-q3_k_xl", 15.0e9, 16.5e9),
                                                ("qwen3-8b", "q4_k_m", 4.8e9, 5.3e9)])
def test_real_shapes_have_the_published_sizes(shape, mix, low, high):
    assert low < plan_bytes(SHAPES[shape], mix) < high  # Q4_K_M 27B ~16.5 GB, UD-Q3_K_XL ~15 GB, 8B Q4_K_M ~5.0 GB


def test_27b_plan_names_and_types():
    s = SHAPES["qwen3.5-27b"]
    plan = {t.name: t for t in tensor_plan(s, "ud-q3_k_xl")}
    assert sum(n.endswith("attn_qkv.weight") for n in plan) == 48 and sum(n.endswith("attn_q.weight") for n in plan) == 16 + 1  # + MTP
    assert plan["blk.3.attn_q.weight"].shape == (2 * 24 * 256, 5120) and plan["blk.0.attn_qkv.weight"].shape == (2 * 2048 + 6144, 5120)
    assert plan["blk.0.ssm_out.weight"].shape == (5120, 6144) and plan["token_embd.weight"].shape == (248320, 5120)
    assert {plan[f"blk.{i}.ffn_{p}.weight"].qtype for i in range(64) for p in ("gate", "up", "down")} == {T.Q3_K}  # dense FFN: 3-bit
    assert {plan[n].qtype for n in ("token_embd.weight", "output.weight", "blk.3.attn_v.weight", "blk.0.attn_qkv.weight")} == {T.Q6_K}
    assert plan["blk.64.nextn.eh_proj.weight"].qtype == T.Q8_0 and plan["blk.64.ffn_up.weight"].qtype == T.Q8_0  # the MTP block
    q4 = Counter(t.qtype for t in tensor_plan(s, "q4_k_m") if len(t.shape) == 2)
    assert q4[T.Q4_K] > q4[T.Q6_K] > 0
    for name in plan:  # every tensor outside the MTP block has a parameter in the loader's mapping
        assert name.startswith("blk.64.") or gguf_to_ours(name) is not None, name


@pytest.mark.parametrize("shape,mix", [("tiny-hybrid", "ud-q3_k_xl"), ("tiny-dense", "q4_k_m")])
def test_loader_loads_what_it_writes(shape, mix, tmp_path):
    path = write_synth_gguf(tmp_path / "m.gguf", shape, mix, seed=3)
    loaded = load_model(str(path), device="cpu", progress=False)
    s, c = SHAPES[shape], loaded.config
    assert (c.hidden_size, c.intermediate_size, c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim, c.vocab_size) == (
        s.hidden_size, s.intermediate_size, s.num_layers, s.num_heads, s.num_kv_heads, s.head_dim, s.vocab_size)
    if shape == "tiny-hybrid":
        assert c.layer_types == ("linear_attention", "linear_attention", "linear_attention", "full_attention")
        assert c.rotary_dim == 16 and c.linear_num_value_heads == 4 and c.mtp_num_layers == 1
    with torch.inference_mode():
        logits = loaded.model(StepInput.plain(torch.arange(40) % s.vocab_size, 0), loaded.model.new_cache(64)).logits
    assert logits.isfinite().all() and 0.01 < float(logits.std()) < 100
    assert loaded.tokenizer.decode(loaded.tokenizer("ab!").input_ids) == "ab!"
    again = write_synth_gguf(tmp_path / "again.gguf", shape, mix, seed=3)
    assert again.read_bytes() == path.read_bytes()  # the seed fixes the file


def test_make_gguf_tool(tmp_path):
    help_text = subprocess.run([sys.executable, "-m", "bench.make_gguf", "--help"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert "examples:" in help_text and "--mix" in help_text
    out = subprocess.run([sys.executable, "-m", "bench.make_gguf", "--shape", "tiny-llama", "--mix", "q4_k_m", "--out", str(tmp_path / "t.gguf")],
                         cwd=ROOT, capture_output=True, text=True, check=True).stdout
    res = json.loads(out)
    assert res["file_bytes"] == (tmp_path / "t.gguf").stat().st_size > res["tensor_bytes"] > 0
    assert set(res["bytes_by_type"]) == {"Q4_K", "Q6_K", "F32"}
    assert np.isclose(sum(res["bytes_by_type"].values()), res["tensor_bytes"])


def test_generate_weights_native_prints_the_plan(tmp_path):
    """`treeflash generate --weights native` on a Q4_K_M file: runs, and says per type what stayed quantized."""
    import os

    path = write_synth_gguf(tmp_path / "m.gguf", "tiny-dense", "q4_k_m")
    env = os.environ | {"PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "treeflash.cli.main", "generate", "--model", str(path), "--prompt", "ab", "--max-tokens", "4",
           "--ignore-eos", "--device", "cpu", "--threads", "1", "--weights", "native"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "weights on cpu (per GGUF type):" in proc.stderr
    assert "Q4_K       12 kept quantized,    1 dequantized" in proc.stderr  # 2 layers x 7 matrices but 2 at Q6_K; the embedding
    assert "Q6_K        0 kept quantized,    3 dequantized" in proc.stderr  # the head, attn_v / ffn_down of "more bits" layers
