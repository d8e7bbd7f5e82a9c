"""Stop strings cut exactly, also when a stop string spans several deltas."""

import random

from treeflash.engine.stops import StopMatcher


def run(chunks, stops):
    m = StopMatcher(tuple(stops))
    out = []
    for c in chunks:
        text, stopped = m.feed(c)
        out.append(text)
        if stopped:
            return "".join(out), True
    return "".join(out) + m.flush(), False


def test_cut_inside_one_delta():
    assert run(["hello world"], ["o w"]) == ("hell", True)


def test_cut_spanning_deltas_and_held_text_released():
    assert run(["ab", "cX", "Yd"], ["XYZ"]) == ("abcXYd", False)
    assert run(["ab", "cX", "Yd"], ["XY"]) == ("abc", True)


def test_random_chunkings_agree_with_str_find():
    rng = random.Random(0)
    for _ in range(300):
        text = "".join(rng.choice("abc") for _ in range(30))
        stops = ["".join(rng.choice("abc") for _ in range(rng.randint(1, 4))) for _ in range(2)]
        cuts = sorted(rng.sample(range(1, 30), 5))
        chunks = [text[i:j] for i, j in zip([0, *cuts], [*cuts, 30])]
        hits = [i for i in (text.find(s) for s in stops) if i >= 0]
        expect = (text[: min(hits)], True) if hits else (text, False)
        assert run(chunks, stops) == expect


def test_unarmed_text_never_stops_but_a_match_ending_in_armed_text_does():
    m = StopMatcher(("ab", "abcd"))
    assert m.feed("xab yab", armed=False) == ("xab y", False)  # "ab" inside: ignored; the tail may begin "abcd"
    assert m.feed("q") == ("abq", False)  # the held "ab" ended in unarmed text: it does not count
    m = StopMatcher(("END",))
    assert m.feed("xEN", armed=False) == ("x", False)
    assert m.feed("D and more") == ("", True) and m.matched == "END"  # spans the boundary, ends in armed text


def test_engine_min_tokens_ignores_an_early_stop_string_and_holds_eos():
    from tests.engine.toy import toy_loaded
    from treeflash.engine.engine import Engine, EngineConfig
    from treeflash.engine.request import GenerationRequest

    loaded = toy_loaded()
    plain = Engine(loaded, EngineConfig(max_context=256))
    spec = Engine(loaded, EngineConfig(max_context=256, draft="ngram"))
    base = dict(prompt_ids=tuple(range(5, 17)), max_tokens=40, ignore_eos=True)
    full, ids, _ = plain.complete(GenerationRequest(**base))
    stop, p = next((full[i:i + 2], full.find(full[i:i + 2], i + 2)) for i in range(30) if full.find(full[i:i + 2], i + 2) >= 0)
    first = full.find(stop)
    m = p + len(stop)  # the later match ends exactly in token m (one token per character)
    for eng in (plain, spec):
        text, _, last = eng.complete(GenerationRequest(**base, stop=(stop,), min_tokens=m))
        assert text == full[:p] and last.finish_reason == "stop" and first < p  # the earlier match was passed over
        text, _, _ = eng.complete(GenerationRequest(**base, stop=(stop,), min_tokens=m + 1))
        later = full.find(stop, p + 1)
        assert text == (full[:later] if later >= 0 else full)  # one token later, that match no longer counts
    plain.eos_ids = spec.eos_ids = {ids[2]}
    for eng in (plain, spec):
        _, got, last = eng.complete(GenerationRequest(**{**base, "ignore_eos": False}, min_tokens=25))
        assert ids[2] not in got[:25] and got[:2] == ids[:2]
