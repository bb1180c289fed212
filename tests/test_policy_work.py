"""auto prices a structure by the forwards its cycles really ran (engine/decoding/realized.py: the
work ratio), not by filtering their spread as noise."""
from __future__ import annotations

import pytest

from engine.decoding.policy import Policy, Structure
from engine.decoding.session import ChatSession
from engine.model.loading import load_folder
from engine.events import ChatMessage, DocumentText
from engine.settings import Mode
from streams import answer_tokens
from test_policy import AUTO, _measured_policy

TRIFORCE = Structure(Mode.TRIFORCE, 2, 6)
# triforce's L1 drafts until it holds γ2 tokens: a cycle whose L0 guesses held runs two 3-token L1
# forwards, one whose first guesses found no n-gram runs four 1-token ones and then a 3-token one
# that accepted past γ2, so L2 checks 8 tokens instead of 7
LUCKY = [("l1", 3), ("l1", 3), ("l2", 7)]
UNLUCKY = [("l1", 1)] * 4 + [("l1", 3), ("l2", 8)]


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    return load_folder(tiny_model_dir("llama"))


def _run(p: Policy, cycles: int, with_forwards: bool) -> tuple[float, float]:
    """Feed `cycles` triforce cycles, lucky and unlucky in turn, each taking exactly the model's
    seconds for the forwards it ran and yielding the tokens the model promises. Returns (the total
    wall seconds, tokens)."""
    wall = tokens = 0.0
    for i in range(cycles):
        forwards = LUCKY if i % 2 else UNLUCKY
        seconds = sum(p._c(level, n) for level, n in forwards)
        _, expected = p.cycle_cost(TRIFORCE)
        p.realized(TRIFORCE, seconds, round(expected), checked=forwards[-1][1],
                   forwards=forwards if with_forwards else ())
        wall, tokens = wall + seconds, tokens + round(expected)
    return wall, tokens


def test_a_structure_is_priced_at_the_forwards_its_cycles_ran_not_at_their_quietest():
    """At continue 8K, triforce's cycles ran 1.18x the forwards the model expected, and the time
    filter (which believes a fast cycle at once and a slow one a little, as noise only adds time)
    read 1.15 where the cycles' wall time ran 1.27-1.31x the model: auto priced triforce within a
    few per cent of draft-only, which ran 0.84-0.90x its ms/token. A spread that is work, not
    noise, must be averaged."""
    truth = []
    for with_forwards in (False, True):
        p = _measured_policy(l0_l2=0.5, l1_l2=0.9, l0_l1=0.6, l1_share=0.4)
        wall, tokens = _run(p, 40, with_forwards)
        truth.append((p.seconds_per_token(TRIFORCE), wall / tokens))
    (blind, real), (seen, real_again) = truth
    assert real == pytest.approx(real_again)
    assert blind < 0.9 * real  # without the forwards, the spread read as noise: priced too low ...
    assert seen == pytest.approx(real, rel=0.04)  # ... with them, at what its cycles took
    p = _measured_policy(l0_l2=0.5, l1_l2=0.9, l0_l1=0.6, l1_share=0.4)
    _run(p, 40, True)
    assert p.ratios.time_ratio(TRIFORCE) == pytest.approx(1.0)  # no noise in these cycles: none read
    assert p.ratios.work_ratio(TRIFORCE) > 1.05


def test_noise_over_the_forwards_run_is_still_filtered():
    """The forwards a cycle ran, at its modelled size, and a burst of load on one cycle: the price
    moves little (the work ratio stays 1, the time filter takes a slow cycle in by a tenth)."""
    p = _measured_policy(l0_l2=0.5, l1_l2=0.9, l0_l1=0.6, l1_share=0.4)
    ro = Structure(Mode.RETRIEVAL_ONLY, 1, 4)
    forwards = [("l1", 1)] * 4 + [("l2", 5)]
    for i in range(20):
        seconds = sum(p._c(level, n) for level, n in forwards)
        _, expected = p.cycle_cost(ro)
        p.realized(ro, seconds * (2.0 if i == 10 else 1.0), round(expected), forwards=forwards)
    assert p.ratios.work_ratio(ro) == pytest.approx(1.0)
    assert p.ratios.time_ratio(ro) < 1.06


def test_the_decoder_reports_the_forwards_each_cycle_ran(tiny, sample_text):
    """Each cycle's report to the policy lists its forwards: L1's, each at the tokens it checked,
    then L2's one check of the draft and the pending token (ar: that check alone)."""
    doc = [DocumentText("Hamlet", sample_text[:3000])]
    session = ChatSession(tiny, AUTO.replace(mode="auto-legacy", max_new_tokens=24), draft="ngram", capacity=2048)
    decoder = session.decoder
    decoder.policy.forced = [Structure(Mode.AR), Structure(Mode.TRIFORCE, 2, 3), Structure(Mode.RETRIEVAL_ONLY, 1, 3)]
    seen, realized = [], decoder.policy.realized

    def spy(s, seconds, tokens, checked=0, forwards=()):
        seen.append((s, checked, list(forwards)))
        realized(s, seconds, tokens, checked=checked, forwards=forwards)

    decoder.policy.realized = spy
    answer_tokens(session, [ChatMessage("user", "Repeat the first line of the play.")], doc)
    assert {s.mode for s, _, _ in seen} == {Mode.AR, Mode.TRIFORCE, Mode.RETRIEVAL_ONLY}
    for s, checked, forwards in seen:
        assert forwards[-1] == ("l2", checked)  # L2's check of the draft, last
        l1 = [n for level, n in forwards[:-1] if level == "l1"]
        assert [level for level, _ in forwards[:-1]] == ["l1"] * len(l1)  # n-gram lookups are not timed
        if s.mode is Mode.AR:
            assert forwards == [("l2", 1)]
        elif s.mode is Mode.RETRIEVAL_ONLY:
            assert l1 == [1] * s.gamma2 and checked == s.gamma2 + 1
        else:  # L1 forwards check 1 to γ1 + 1 tokens, until the draft holds γ2 (or one more)
            assert l1 and all(1 <= n <= s.gamma1 + 1 for n in l1)
            assert s.gamma2 + 1 <= checked <= s.gamma2 + 2
