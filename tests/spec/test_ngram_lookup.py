"""Prompt lookup: the longest suffix match, its latest occurrence, and the overlapping copy."""

from treeflash.spec.ngram import lookup


def test_longest_suffix_latest_occurrence():
    seq = [1, 2, 3, 9, 1, 2, 3, 7, 5, 2, 3]
    assert lookup(seq, 4, 1, 3) == [7, 5, 2]  # "2 3" last seen before "7 5 2"; the 3-gram "5 2 3" never
    assert lookup([4, 5, 6], 4, 1, 3) == []  # no earlier occurrence
    assert lookup(seq, 4, 1, 0) == []


def test_overlapping_copy_fills_the_draft_inside_short_cycles():
    assert lookup([8, 36, 36, 36], 4, 1, 5) == [36, 36, 36, 36, 36]  # was [36]: one period only
    assert lookup([1, 2, 7, 8, 7, 8], 4, 1, 5) == [7, 8, 7, 8, 7]
    assert lookup([5, 1, 2, 3, 1, 2], 4, 1, 6) == [3, 1, 2, 3, 1, 2]


def test_index_equals_the_scan_on_growing_sequences():
    """NgramIndex answers exactly what lookup answers, step by step as tokens are committed
    (small vocabularies, so repeats and short cycles are common)."""
    import random

    from treeflash.spec.ngram import NgramIndex

    rng = random.Random(0)
    for trial in range(40):
        vocab = rng.choice([2, 3, 5, 50])
        n_max, n_min = rng.choice([(4, 1), (3, 2), (1, 1), (5, 3)])
        index = NgramIndex(n_max, n_min)
        tokens: list[int] = []
        for _ in range(rng.randint(1, 60)):
            root = rng.randrange(vocab)
            k = rng.randint(0, 7)
            assert index.lookup(tokens, root, k) == lookup(tokens + [root], n_max, n_min, k), (trial, tokens, root, k)
            tokens.extend(rng.randrange(vocab) for _ in range(rng.randint(1, 4)))  # a step commits 1-4 tokens


def test_index_starts_over_when_the_sequence_is_not_an_extension():
    from treeflash.spec.ngram import NgramIndex

    index = NgramIndex(4, 1)
    assert index.lookup([1, 2, 3, 1, 2], 3, 3) == [1, 2, 3]
    other = [7, 8, 9, 7, 8]  # same length, other tokens: re-indexed, not mixed with the first
    assert index.lookup(other, 9, 3) == lookup(other + [9], 4, 1, 3) == [7, 8, 9]
    assert index.lookup([5], 5, 2) == lookup([5, 5], 4, 1, 2) == [5, 5]  # shorter: re-indexed
    try:
        NgramIndex(2, 3)
    except ValueError as e:
        assert "n_min" in str(e)
    else:
        raise AssertionError("n_min > n_max accepted")
