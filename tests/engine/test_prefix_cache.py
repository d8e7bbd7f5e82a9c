"""The prefix cache is exact: at temperature 0 every request gives the output it gives without the
cache, for a dense and a hybrid (Gated DeltaNet) random model, with speculation and with a
compressed KV cache, across hits, partial hits, misses and a request stopped early; and the hit
tokens are what the rules say (any shared length on a dense model, a snapshot on a hybrid one)."""

import pytest

from tests.engine.toy import toy_loaded
from treeflash.engine.engine import Engine, EngineConfig
from treeflash.engine.prefix_cache import PrefixCacheConfig
from treeflash.engine.request import GenerationRequest
from treeflash.spec.drafter import DraftOptions
from treeflash.spec.sampling import SamplingParams

GREEDY = SamplingParams(temperature=0.0)
SMALL = PrefixCacheConfig(max_mb=64, block=16, chunk=32)  # small blocks and chunks: toy prompts cross them
OFF = PrefixCacheConfig(max_mb=0, chunk=32)  # the same prefill chunks, no cache (a centred K cache's centre is the first chunk's mean)


def run(engine, prompt, max_tokens=12):
    _, ids, last = engine.complete(GenerationRequest(tuple(prompt), GREEDY, max_tokens, ignore_eos=True))
    return ids, last.usage.cached_tokens


def conversation(first_out):
    """Prompts as an agent sends them: a first one, the same grown by its output and a new turn,
    one sharing only its start, an unrelated one, then the first again."""
    p1 = [(7 * i) % 90 + 3 for i in range(70)]
    p2 = p1 + first_out + [5, 6, 7, 8, 9]
    p3 = p1[:40] + [11, 12, 13]
    p4 = [50 + i % 7 for i in range(45)]
    return p1, p2, p3, p4, p1


@pytest.mark.parametrize("arch", ["qwen3", "qwen3_5"])
@pytest.mark.parametrize("draft", [None, "ngram"])
def test_outputs_equal_the_uncached_ones(arch, draft):
    loaded = toy_loaded(arch)
    opts = DraftOptions(num_draft=4)
    plain = Engine(loaded, EngineConfig(max_context=512, prefix_cache=OFF))
    cached = Engine(loaded, EngineConfig(max_context=512, draft=draft, draft_options=opts, prefix_cache=SMALL))
    out1, hit = run(cached, conversation([])[0])
    assert hit == 0
    hits = []
    for prompt in conversation(out1):
        want, none = run(plain, prompt)
        got, hit = run(cached, prompt)
        assert got == want, (arch, draft, len(prompt), hit)
        assert none == 0
        hits.append(hit)
    p1, p2, p3, p4, _ = conversation(out1)
    if arch == "qwen3":  # attention rows: any shared length (one token is always prefilled)
        assert hits == [69, len(p1) + len(out1) - 1, 40, 0, 0]
    else:  # recurrent state: the longest snapshot inside the shared prefix
        # snapshots: every 16 prompt tokens, the prompt's end (70), the output's end (70 + 12 - 1 committed)
        assert hits == [64, len(p1) + len(out1) - 1, 32, 0, 0], hits
    assert cached.prefix.hits == sum(h > 0 for h in hits)


def test_a_request_stopped_early_leaves_an_exact_cache():
    loaded = toy_loaded("qwen3_5")
    plain = Engine(loaded, EngineConfig(max_context=512, prefix_cache=OFF))
    cached = Engine(loaded, EngineConfig(max_context=512, prefix_cache=SMALL))
    prompt = [(5 * i) % 80 + 2 for i in range(50)]
    stream = cached.stream(GenerationRequest(tuple(prompt), GREEDY, 30, ignore_eos=True))
    for _, ev in zip(range(3), stream):
        pass
    stream.close()  # the client left after three steps
    again = prompt + [4, 4, 4]
    assert run(cached, again) == (run(plain, again)[0], 50)  # resumed at the prompt's end snapshot


def test_compressed_keys_resume_only_with_the_same_first_chunk():
    loaded = toy_loaded("qwen3")
    kv = dict(max_context=512, cache_type_k="q8_0", cache_type_v="q8_0")
    plain = Engine(loaded, EngineConfig(**kv, prefix_cache=OFF))
    cached = Engine(loaded, EngineConfig(**kv, prefix_cache=SMALL))
    p = [(3 * i) % 70 + 1 for i in range(60)]
    for prompt, want_hit in ((p, 0), (p + [90, 90], 60), (p[:20] + [1, 2], 0)):  # the last shares less than the 32-token first chunk
        want, _ = run(plain, prompt)
        got, hit = run(cached, prompt)
        assert got == want and hit == want_hit, (len(prompt), hit)


def test_memory_bound_evicts_snapshots_first_in_first_out():
    loaded = toy_loaded("qwen3_5")
    tiny = PrefixCacheConfig(max_mb=0.05, block=16, chunk=32)
    cached = Engine(loaded, EngineConfig(max_context=512, prefix_cache=tiny))
    prompt = [(5 * i) % 80 + 2 for i in range(100)]
    run(cached, prompt)
    pc = cached.prefix
    assert pc._used() <= pc.max_bytes and len(pc.snapshots) >= 1
    assert max(pc.snapshots) == len(pc.tokens)  # the newest (the output's end) survived; the oldest went


def test_a_drafter_on_hidden_states_is_rebuilt_from_the_stored_rows():
    # MTP conditions on the target's last hidden states (capture_layers): a hit hands it the stored
    # rows of the shared prefix, so its drafts (and so the output) are those of an uncached run
    from tests.engine.toy import ToyLoaded, ToyTokenizer
    from tests.spec.test_mtp_drafter import mtp_target

    target = mtp_target()
    loaded = ToyLoaded(target, ToyTokenizer(), target.config)
    plain = Engine(loaded, EngineConfig(max_context=512, prefix_cache=OFF))
    cached = Engine(loaded, EngineConfig(max_context=512, draft="mtp", draft_options=DraftOptions(num_draft=3), prefix_cache=SMALL))
    assert cached.prefix.wants_hidden
    out1, _ = run(cached, conversation([])[0])
    hits = []
    for prompt in conversation(out1):
        got, hit = run(cached, prompt)
        assert got == run(plain, prompt)[0], (len(prompt), hit)
        hits.append(hit)
    assert hits[0] == 64 and hits[1] == 70  # at most the stored prompt's rows: the grown prompt resumes at its end
    assert hits[2] == 32


@pytest.mark.parametrize("arch", ["qwen3", "qwen3_5"])
def test_a_short_tail_runs_as_one_static_verify(arch, monkeypatch):
    # on a GPU the runner replays captured graphs: a hit's few new tokens go through one verify graph of a
    # chain (then committed whole) instead of an eager prefill of a launch per op; the same static code runs
    # eagerly here (use_graphs=False), and the outputs stay the uncached ones
    from treeflash.engine.stack import build_runner
    from treeflash.spec.decoder import Decoder

    loaded = toy_loaded(arch)
    plain = Engine(loaded, EngineConfig(max_context=512, prefix_cache=OFF))
    cached = Engine(loaded, EngineConfig(max_context=512, draft="ngram", draft_options=DraftOptions(num_draft=4), prefix_cache=SMALL))
    cached.runner = build_runner(cached.model, cached.cache, cached.drafter, use_graphs=False)
    tails = []
    chain_tail = Decoder._chain_tail
    monkeypatch.setattr(Decoder, "_chain_tail", lambda self, tail: tails.append(len(tail)) or chain_tail(self, tail))
    out1, _ = run(cached, conversation([])[0])
    assert tails == [70 - 64]  # the prompt's last chunk ends at 64 (block 16, chunk 32 boundaries), 6 tokens left
    for prompt in conversation(out1)[1:]:
        got, hit = run(cached, prompt)
        assert got == run(plain, prompt)[0], (arch, len(prompt), hit)
    p2 = conversation(out1)[1]
    assert len(p2) - (len(conversation([])[0]) + len(out1) - 1) in tails  # the grown prompt's hit: its new turn, as a chain


@pytest.mark.parametrize("arch", ["qwen3", "qwen3_5"])
def test_a_pipelined_output_is_cached_whole(arch):
    # greedy plain decoding through a graph runner enqueues each step before the last token is read, so
    # the cache ends one row past the output: that row is the last output token, which the grown prompt
    # repeats; a hybrid model then resumes past the whole output, not at the previous prompt's end
    from treeflash.engine.stack import build_runner

    loaded = toy_loaded(arch)
    plain = Engine(loaded, EngineConfig(max_context=512, prefix_cache=OFF))
    cached = Engine(loaded, EngineConfig(max_context=512, prefix_cache=SMALL))
    cached.runner = build_runner(cached.model, cached.cache, None, use_graphs=False)
    out1, _ = run(cached, conversation([])[0])
    p1, p2 = conversation(out1)[:2]
    got, hit = run(cached, p2)
    assert got == run(plain, p2)[0]
    assert hit == len(p1) + len(out1)
