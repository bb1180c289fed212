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


def test_propose_each_equals_a_proposal_per_prefix():
    """The auto policy's lookup log asks for a lookup at every position of a cycle in one call."""
    rng = random.Random(7)
    book = [rng.randrange(10) for _ in range(600)]
    drafter, seq = NgramDrafter(), book[:300]
    for step in range(120):
        emitted = book[len(seq):len(seq) + rng.randrange(1, 7)]
        if rng.random() < 0.3:  # a cycle after rejected speculation: the drafter saw another tail
            _propose(drafter, seq[:-1] + [rng.randrange(10), rng.randrange(10)])
        known = seq + emitted
        got = drafter.propose_each(known, len(seq), 8)
        assert got == [_propose(NgramDrafter(), known[:p], 8) for p in range(len(seq), len(known))], step
        seq = known
    assert drafter.propose_each([1, 2], 0, 8) == [[], []]  # too short to hold an n-gram


def test_a_caller_changing_its_list_in_place_is_seen():
    """The drafter keeps its own copy of what it indexed: a list the caller later edits in place is
    compared against that copy, not against itself."""
    for seed in range(30):
        rng = random.Random(seed)
        seq = [rng.randrange(8) for _ in range(300)]
        drafter = NgramDrafter()
        _propose(drafter, seq)
        del seq[-20:]
        seq += [rng.randrange(8) for _ in range(25)]
        assert _propose(drafter, seq) == _propose(NgramDrafter(), list(seq)), seed
