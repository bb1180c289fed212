"""The n-gram drafter's index follows a sequence that also moves back (L1's rejected drafts, lookups
behind the end): every proposal must equal what a drafter indexed from scratch proposes."""
import random

from engine.decoding.drafters import NgramDrafter
from engine.settings import Sampling


def _propose(drafter: NgramDrafter, seq: list[int], count: int = 6) -> list[int]:
    return drafter.propose(seq, count, Sampling(), None).tokens


def test_proposals_after_rollbacks_equal_a_fresh_index():
    rng = random.Random(3)
    book = [rng.randrange(12) for _ in range(700)]  # a small vocabulary: many repeated n-grams
    drafter = NgramDrafter()
    drafter.prime(book[:400])
    seq = book[:400]
    rebuilt = 0
    for step in range(300):
        move = rng.random()
        if move < 0.5:  # the sequence grows by committed tokens
            seq = seq + book[len(seq):len(seq) + rng.randrange(1, 5)]
        elif move < 0.8:  # speculation that will be rejected: a diverging tail
            seq = seq[:len(seq) - rng.randrange(0, 3)] + [rng.randrange(12) for _ in range(rng.randrange(1, 6))]
        else:  # a lookup behind the end (a shadow lookup at an earlier position)
            seq = seq[:max(5, len(seq) - rng.randrange(1, 30))]
        index_before = id(drafter._index)
        got = _propose(drafter, seq)
        rebuilt += id(drafter._index) != index_before
        assert got == _propose(NgramDrafter(), list(seq)), step
    assert rebuilt == 0  # every rollback here is within UNDO positions: undone, never re-indexed


def test_a_rollback_deeper_than_the_log_reindexes_and_stays_right():
    rng = random.Random(5)
    seq = [rng.randrange(9) for _ in range(2 * NgramDrafter.UNDO + 50)]
    drafter = NgramDrafter()
    assert _propose(drafter, seq) == _propose(NgramDrafter(), seq)
    short = seq[:40] + [1, 2, 3]
    index_before = id(drafter._index)
    assert _propose(drafter, short) == _propose(NgramDrafter(), short)
    assert id(drafter._index) != index_before  # past the log: a fresh index
    assert len(drafter._undo) <= NgramDrafter.UNDO
