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
