"""auto prices a draft by the acceptance at each of its depths (Acceptance.expected), not by one
i.i.d. rate: rejections bunch, so one rate overprices long drafts and underprices short ones."""
from __future__ import annotations

import pytest

from engine.decoding.measurements import Acceptance
from engine.decoding.policy import Policy, Structure
from engine.offload.cost import expected_tokens
from engine.settings import DecodeSettings, Mode

SHORT, LONG = Structure(Mode.RETRIEVAL_ONLY, 1, 1), Structure(Mode.RETRIEVAL_ONLY, 1, 6)


def _bunched(acc: Acceptance, cycles: int = 44) -> None:
    """What qa 8K showed: 1-token drafts nearly always held, 6-token ones held 2 on average."""
    for i in range(cycles):
        if i % 11 == 10:
            acc.add(6, 2)
        else:
            acc.add(1, 1)


def test_one_rate_at_every_depth_is_the_geometric_series():
    acc = Acceptance(0.8)
    assert [acc.expected(g) for g in range(8)] == pytest.approx([expected_tokens(0.8, g) for g in range(8)])
    assert acc.expected(3, 0.5) == pytest.approx(expected_tokens(0.4, 3))  # scaled (L1's vocabulary misses)
    for _ in range(30):  # a 3-token draft: depths 1-2 held, depth 3 rejected, deeper never reached
        acc.add(3, 2)
    assert acc.expected(2) == pytest.approx(3.0, abs=0.15)  # the two depths that always held
    assert acc.expected(3) - acc.expected(2) < 0.3  # the one always rejected adds little ...
    assert acc.expected(3) - acc.expected(2) > 0.0  # ... but not nothing (two checks at the rate)


def test_a_long_draft_is_priced_at_the_tokens_its_depths_yield():
    """44 cycles, 40 of one token (held) and 4 of six (2 held): one rate (0.92) promised 5.4 tokens
    for a 6-token draft; its depths yield 3."""
    p = Policy()
    p.costs.record("l2", 1, 0.1)
    p.costs.record("l1", 1, 0.03)
    _bunched(p.acceptance["l1_l2"])
    rate = p.acceptance["l1_l2"].rate
    assert expected_tokens(rate, 6) > 5.0  # the i.i.d. model
    assert 2.8 < p.cycle_cost(LONG)[1] < 3.8  # (3 and the priors of the depths few drafts reached)
    assert p.cycle_cost(SHORT)[1] > 1.9


def test_auto_drafts_short_where_long_drafts_fail_past_their_first_tokens():
    """Drafts that hold for two tokens and then mostly fail: the best draft is 2 tokens even where a
    long check costs little more than a short one (1K-like costs: L2 checks 1 token in 28 ms and 7 in
    40, L1 takes 8 ms a token). One rate, averaged over the depths (0.92), priced long drafts best."""
    p = Policy()
    for n, ms in ((1, 28), (2, 30), (7, 40), (8, 42)):
        p.costs.record("l2", n, ms / 1000)
    p.costs.record("l1", 1, 0.008)
    _bunched(p.acceptance["l1_l2"])
    for m in Mode:
        p.tried[m] = 3
    chosen = p.choose(DecodeSettings(mode="auto"), has_l0=False, context_tokens=8000)
    assert chosen.mode is Mode.RETRIEVAL_ONLY and chosen.gamma2 <= 2
    assert p.seconds_per_token(LONG) > 1.3 * p.seconds_per_token(Structure(Mode.RETRIEVAL_ONLY, 1, 2))
