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
