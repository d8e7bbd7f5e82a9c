"""Gated DeltaNet: the math references agree with each other, and a verify step over a draft tree
equals feeding each node's path with plain steps (logits, and the cache after commit(path))."""

import copy
import random

import pytest
import torch

from treeflash.kernels.gdn.gdn_tree import recurrent_path_ref, tree_conv_ref, tree_recurrent_ref
from treeflash.kv.recurrent_cache import RecurrentCache
from treeflash.models.config import ModelConfig
from treeflash.models.gated_deltanet import causal_conv, delta_rule_chunked, delta_rule_tree, l2norm
from treeflash.models.step import StepInput
from treeflash.models.transformer import CausalLM

TOL = 1e-5
VOCAB = 61


def tiny_model() -> CausalLM:
    config = ModelConfig(
        arch="qwen3_5",
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_layers=4,
        num_heads=2,
        num_kv_heads=1,
        head_dim=16,
        partial_rotary_factor=0.25,
        qk_norm=True,
        norm_unit_offset=True,
        attn_output_gate=True,
        layer_types=("linear_attention", "full_attention", "linear_attention", "full_attention"),
        linear_conv_kernel_dim=4,
        linear_key_head_dim=8,
        linear_value_head_dim=8,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
    )
    torch.manual_seed(1)
    model = CausalLM(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("A_log"):  # slow decays, so the state carries far
                p.copy_(torch.empty_like(p).uniform_(0.01, 0.5).log())
            elif p.dim() == 1:  # norms, dt_bias: away from their identity init
                p.add_(torch.randn_like(p) * 0.1)
    return model


@pytest.fixture(scope="module")
def model():
    return tiny_model()


def random_delta_inputs(num_tokens: int, heads: int = 3, dk: int = 8, dv: int = 5):
    q = l2norm(torch.randn(num_tokens, heads, dk)) * dk**-0.5
    k = l2norm(torch.randn(num_tokens, heads, dk))
    v = torch.randn(num_tokens, heads, dv)
    g = -torch.rand(num_tokens, heads) * 0.5
    beta = torch.rand(num_tokens, heads)
    state = torch.randn(heads, dk, dv)
    return q, k, v, g, beta, state


@pytest.mark.parametrize("num_tokens,chunk", [(1, 64), (5, 64), (70, 16), (64, 64)])
def test_chunked_equals_stepwise(num_tokens, chunk):
    q, k, v, g, beta, state = random_delta_inputs(num_tokens)
    out, final = delta_rule_chunked(q, k, v, g, beta, state, chunk_size=chunk)
    s = state.clone()
    for t in range(num_tokens):  # the recurrence as the module docstring writes it
        s = s * g[t].exp()[:, None, None]
        s = s + k[t][:, :, None] * (beta[t][:, None] * (v[t] - torch.einsum("hkv,hk->hv", s, k[t])))[:, None, :]
        assert (out[t] - torch.einsum("hkv,hk->hv", s, q[t])).abs().max().item() < TOL
    assert (final - s).abs().max().item() < TOL


def test_tree_references_on_a_chain_equal_prefill_math():
    """The verify / commit references (kernels' gdn_tree) on a chain equal the prefill path."""
    n, hk, hv, dk, dv, kernel = 6, 2, 4, 8, 5, 4
    channels = 2 * hk * dk + hv * dv
    parents = torch.arange(-1, n - 1)
    x, window, weight = torch.randn(n, channels), torch.randn(channels, kernel - 1), torch.randn(channels, kernel)
    y_seq, _ = causal_conv(x, window, weight)
    y = tree_conv_ref(x, window, weight, parents)
    assert (y - y_seq).abs().max().item() < TOL
    a, b, a_log, dt_bias, state = torch.randn(n, hv), torch.randn(n, hv), torch.randn(hv) * 0.3, torch.randn(hv), torch.randn(hv, dk, dv)
    q, k, v = y.split([hk * dk, hk * dk, hv * dv], dim=-1)
    q = (l2norm(q.reshape(n, hk, dk)) * dk**-0.5).repeat_interleave(hv // hk, 1)
    k = l2norm(k.reshape(n, hk, dk)).repeat_interleave(hv // hk, 1)
    g = -a_log.exp() * torch.nn.functional.softplus(a + dt_bias)
    out, final = delta_rule_chunked(q, k, v.reshape(n, hv, dv), g, torch.sigmoid(b), state)
    assert (tree_recurrent_ref(y, a, b, a_log, dt_bias, state, parents, hk, dk, dv) - out).abs().max().item() < TOL
    committed = state.clone()  # commit of the first 4 nodes of a padded path
    recurrent_path_ref(y, a, b, a_log, dt_bias, committed, torch.tensor([0, 1, 2, 3, 3, 3]), torch.tensor([4]), hk, dk, dv)
    _, final4 = delta_rule_chunked(q[:4], k[:4], v[:4].reshape(4, hv, dv), g[:4], torch.sigmoid(b[:4]), state)
    assert (committed - final4).abs().max().item() < TOL


def test_tree_wy_form_equals_a_step_per_node():
    """The CPU's verify outputs (delta_rule_tree) equal the kernel reference's, node by node, on a bushy tree."""
    parents = [-1, 0, 0, 0, 1, 1, 2, 4, 4, 7, 3, 10]
    n, hk, hv, dk, dv = len(parents), 2, 4, 8, 5
    y = torch.randn(n, 2 * hk * dk + hv * dv)
    a, b, a_log, dt_bias, state = torch.randn(n, hv), torch.randn(n, hv), torch.randn(hv) * 0.3, torch.randn(hv), torch.randn(hv, dk, dv)
    ref = tree_recurrent_ref(y, a, b, a_log, dt_bias, state, torch.tensor(parents), hk, dk, dv)
    mask = torch.zeros(n, n, dtype=torch.bool)
    for i, p in enumerate(parents):
        mask[i] = mask[p] if p >= 0 else mask[i]
        mask[i, i] = True
    q, k, v = y.split([hk * dk, hk * dk, hv * dv], dim=-1)
    q = (l2norm(q.reshape(n, hk, dk)) * dk**-0.5).repeat_interleave(hv // hk, 1)
    k = l2norm(k.reshape(n, hk, dk)).repeat_interleave(hv // hk, 1)
    g = -a_log.exp() * torch.nn.functional.softplus(a + dt_bias)
    out = delta_rule_tree(q, k, v.reshape(n, hv, dv), g, torch.sigmoid(b), state, mask)
    assert (out - ref).abs().max().item() < TOL


def path_to(parents: list[int], node: int) -> list[int]:
    path = [node]
    while parents[path[-1]] >= 0:
        path.append(parents[path[-1]])
    return path[::-1]


def random_tree(num_nodes: int, rng: random.Random) -> list[int]:
    return [-1] + [rng.randrange(i) for i in range(1, num_nodes)]


def recurrent_layers(cache) -> list[RecurrentCache]:
    return [layer for layer in cache.layers if isinstance(layer, RecurrentCache)]


def check_verify_then_commit(model, prefix_len: int, parents: list[int], commit_path: list[int], seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    prefix = torch.randint(0, VOCAB, (prefix_len,), generator=gen)
    nodes = torch.randint(0, VOCAB, (len(parents),), generator=gen)
    base = model.new_cache(64)
    model(StepInput.plain(prefix, 0), base)

    # verify: every node's logits equal a plain forward of its path from the same committed state
    cache = copy.deepcopy(base)
    logits = model(StepInput.tree(nodes, parents, prefix_len), cache).logits
    for before, after in zip(recurrent_layers(base), recurrent_layers(cache)):
        assert torch.equal(before.conv, after.conv) and torch.equal(before.state, after.state)
    for i in range(len(parents)):
        path = path_to(parents, i)
        ref = model(StepInput.plain(nodes[path], prefix_len), copy.deepcopy(base)).logits[-1]
        assert (logits[i] - ref).abs().max().item() < TOL, f"node {i}, path {path}"

    # commit(path) == a cache fed only the path's tokens, one plain step at a time
    cache.commit(commit_path)
    ref_cache = copy.deepcopy(base)
    for j, node in enumerate(commit_path):
        model(StepInput.plain(nodes[node : node + 1], prefix_len + j), ref_cache)
    assert cache.seq_len == ref_cache.seq_len == prefix_len + len(commit_path)
    for ours, ref in zip(recurrent_layers(cache), recurrent_layers(ref_cache)):
        assert (ours.conv - ref.conv).abs().max().item() < TOL
        assert (ours.state - ref.state).abs().max().item() < TOL
        assert ours.pending is None
    following = torch.randint(0, VOCAB, (3,), generator=gen)
    start = cache.seq_len
    out = model(StepInput.plain(following, start), cache).logits
    ref_out = model(StepInput.plain(following, start), ref_cache).logits
    assert (out - ref_out).abs().max().item() < TOL


@torch.inference_mode()
@pytest.mark.parametrize("prefix_len", [2, 9])  # 2: the committed conv window still holds its zero start
def test_chain(model, prefix_len):
    chain = list(range(-1, 7))
    check_verify_then_commit(model, prefix_len, chain, commit_path=list(range(5)), seed=prefix_len)
    check_verify_then_commit(model, prefix_len, chain, commit_path=list(range(8)), seed=prefix_len + 1)


@torch.inference_mode()
def test_bushy_tree(model):
    # siblings at every depth, and nodes not sorted by depth (10 hangs off 3, 11 off 10)
    parents = [-1, 0, 0, 0, 1, 1, 2, 4, 4, 7, 3, 10]
    check_verify_then_commit(model, 6, parents, commit_path=[0, 1, 4, 7, 9], seed=3)
    check_verify_then_commit(model, 6, parents, commit_path=[0, 3, 10, 11], seed=4)


@torch.inference_mode()
def test_commit_root_only(model):
    check_verify_then_commit(model, 5, [-1, 0, 0, 1, 2], commit_path=[0], seed=5)


@torch.inference_mode()
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_trees(model, seed):
    rng = random.Random(seed)
    parents = random_tree(rng.randint(2, 12), rng)
    commit_path = path_to(parents, rng.randrange(len(parents)))
    check_verify_then_commit(model, rng.randint(1, 10), parents, commit_path, seed=10 + seed)


@torch.inference_mode()
def test_two_verify_rounds(model):
    """Committed state carries into the next verify step exactly as plain decoding would."""
    gen = torch.Generator().manual_seed(7)
    prefix, a, b = (torch.randint(0, VOCAB, (n,), generator=gen) for n in (4, 5, 6))
    cache, ref = model.new_cache(64), model.new_cache(64)
    model(StepInput.plain(prefix, 0), cache)
    model(StepInput.plain(prefix, 0), ref)
    model(StepInput.tree(a, [-1, 0, 1, 0, 3], 4), cache)
    cache.commit([0, 3, 4])
    model(StepInput.plain(a[[0, 3, 4]], 4), ref)
    out = model(StepInput.tree(b, [-1, 0, 0, 2, 2, 4], 7), cache).logits
    cache.commit([0, 2, 4, 5])
    ref_out = model(StepInput.plain(b[[0, 2, 4, 5]], 7), ref).logits
    assert (out[[0, 2, 4, 5]] - ref_out).abs().max().item() < TOL
    nxt = torch.tensor([3])
    diff = model(StepInput.plain(nxt, 11), cache).logits - model(StepInput.plain(nxt, 11), ref).logits
    assert diff.abs().max().item() < TOL
