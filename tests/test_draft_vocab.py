"""The draft vocabulary's bookkeeping: its member count and what it adds, whichever way it scans."""
import random
from types import SimpleNamespace

import numpy as np

from engine.model.draft_vocab import SHORT_SCAN, DraftVocabulary


def _vocab(size: int = 500, common: int = 50) -> DraftVocabulary:
    return DraftVocabulary(SimpleNamespace(arch=SimpleNamespace(vocab_size=size)), common=common)


def test_count_and_novel_tokens_match_a_set_over_short_and_long_scans():
    rng = random.Random(3)
    vocab, seq, members = _vocab(), [], set(range(50))
    for step in range(300):
        if step % 60 == 0:  # a new prompt, longer than a short scan: scanned whole, by numpy
            seq = [rng.randrange(-2, 520) for _ in range(SHORT_SCAN + 40)]
        emitted = [rng.randrange(-2, 520) for _ in range(rng.randint(1, 8))]  # a cycle: the loop
        members |= {t for t in seq if 0 <= t < 500}  # (the prompt joins first)
        novel = vocab.note(seq, emitted)
        assert novel == len({t for t in emitted if 0 <= t < 500} - members)
        members |= {t for t in emitted if 0 <= t < 500}
        assert set(np.flatnonzero(vocab._member).tolist()) == members
        assert vocab.count == len(members)
        seq = seq + emitted
    assert vocab.count > 200


def test_a_scan_that_adds_nothing_keeps_the_head_slice():
    vocab = _vocab()
    vocab.note([1, 2, 3], [4])
    vocab._ids = "built"  # stands for the head's slice: dropped only when the subset grows
    vocab.note([1, 2, 3, 4], [5, 6])
    assert vocab._ids == "built"
    vocab.note([1, 2, 3, 4, 5, 6], [70])
    assert vocab._ids is None and vocab.count == 51
    assert np.flatnonzero(vocab._member).tolist() == list(range(50)) + [70]
