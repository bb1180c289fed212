"""How long the drafts are that auto explores an L1 structure with (Policy._explored_at): the
settings' γ2 where L2 checks a long draft for little more than one token, fewer where each checked
token costs L2 a large share more (8K on two Zen 1 cores: 46 ms for one token, 107 for four, 179
for seven), and never the model's longer best."""
from __future__ import annotations

from engine.decoding.policy import EXPLORE_CYCLES, Policy
from engine.decoding.retrieval_choice import EXPLORE_CHECK
from engine.decoding.structure import Structure
from engine.settings import DecodeSettings, Mode

AUTO = DecodeSettings(mode="auto")
CHECK_8K_MS = (46, 71, 86, 107, 130, 154, 179, 203)  # L2 by tokens checked, measured at 8K
CHECK_FLAT_MS = tuple(100 + 3 * n for n in range(13))  # a check costs little more than one token


def _policy(check_ms, l1_ms: float) -> Policy:
    """Every structure but retrieval-only measured; L2's checks timed at `check_ms` by size."""
    p = Policy()
    for n, ms in enumerate(check_ms, start=1):
        p.costs.record("l2", n, ms / 1000)
    p.costs.record("l1", 1, l1_ms / 1000)
    for _ in range(200):
        p.observe("l0_l2", 4, 0)  # no n-gram draft holds: draft-only and triforce are out
        p.observe("l0_l1", 4, 0)
    for m in (Mode.AR, Mode.DRAFT_ONLY, Mode.TRIFORCE):
        p.tried[m] = EXPLORE_CYCLES
    return p


def _explored(p: Policy, remaining: int | None = None) -> Structure:
    chosen = p.choose(AUTO, has_l0=True, context_tokens=8000, remaining=remaining)
    assert chosen.mode is Mode.RETRIEVAL_ONLY and p.tried[Mode.RETRIEVAL_ONLY] == 1, chosen  # exploring
    return chosen


def test_where_a_long_check_is_dear_l1_is_explored_with_the_drafts_it_can_afford():
    """8K's checks: a 7-token check costs 3.9 one-token ones; the longest within EXPLORE_CHECK is 4
    tokens, a 3-token draft (exploring at γ2 = 6 cost qa 8K's first answer 96 ms/token against 52 for its ar cycles)."""
    chosen = _explored(_policy(CHECK_8K_MS, l1_ms=30))
    assert chosen.gamma2 == 3
    assert CHECK_8K_MS[chosen.gamma2] <= EXPLORE_CHECK * CHECK_8K_MS[0] < CHECK_8K_MS[chosen.gamma2 + 1]


def test_where_a_long_check_is_cheap_l1_is_explored_at_the_settings_draft_length():
    """A long first draft reads L1's acceptance deep into the draft (explored at γ2 = 1-2, its
    acceptance stayed near the prior and retrieval-only was never chosen at qa 1-2K)."""
    assert _explored(_policy(CHECK_FLAT_MS, l1_ms=30)).gamma2 == AUTO.gamma2
    assert _explored(_policy(CHECK_FLAT_MS, l1_ms=30), remaining=4).gamma2 == 3  # not past the answer


def test_exploration_does_not_grow_past_the_settings_draft_length():
    """With long checks timed cheap and L1 nearly free, the model's best draft is longer than the
    settings' γ2; exploring there ran an 11-token check at continue 8K (548 ms, priced at 291)."""
    p = _policy(CHECK_FLAT_MS, l1_ms=2)
    by_model = min((p.seconds_per_token(Structure(Mode.RETRIEVAL_ONLY, 1, g)), g) for g in range(1, 13))[1]
    assert by_model > AUTO.gamma2
    assert _explored(p).gamma2 == AUTO.gamma2
