"""How the step-cost table prices a forward smaller than any timed at its level (StepCosts.estimate
below the smallest timed size): scaled as L2's forwards scale, not by the line through the level's
own sizes, which two noisy points ran to nothing."""
from __future__ import annotations

import pytest

from engine.decoding.measurements import PRIOR_SLOPE, StepCosts

CHECK_1K_MS = (28.3, 36.4, 44.4, 52.4, 60.5, 68.5, 76.6)  # L2 by tokens checked, about as measured at 1K


def _costs(l1_ms: dict[int, float], l2: bool = True) -> StepCosts:
    costs = StepCosts()
    if l2:
        for n, ms in enumerate(CHECK_1K_MS, start=1):
            costs.record("l2", n, ms / 1000)
    for n, ms in l1_ms.items():
        costs.record("l1", n, ms / 1000)
    return costs


def test_an_l1_forward_below_the_sizes_timed_costs_what_l2_says_not_what_a_steep_line_says():
    """L1 timed at 5 and 7 tokens only, 15 ms apart (a quiet forward and a busy one): the line
    through them reached 0 at 1 token. (At continue 1K auto once priced never-run retrieval-only at
    15.6 ms/token, 27.3 run, a price that needs such a forward near 0.) L2's one-token check is
    0.47x its 5-token one."""
    costs = _costs({5: 25.0, 7: 40.0})
    one = costs.estimate("l1", 1)
    assert one == pytest.approx(0.025 * CHECK_1K_MS[0] / CHECK_1K_MS[4])
    assert costs.estimate("l1", 3) == pytest.approx(0.025 * CHECK_1K_MS[2] / CHECK_1K_MS[4])
    assert costs.estimate("l1", 6) == pytest.approx(0.0325)  # between timed sizes: the line, as before
    assert costs.estimate("l1", 5) == pytest.approx(0.025)


def test_without_l2_timings_a_smaller_forward_follows_the_prior_slope():
    costs = _costs({7: 45.0}, l2=False)
    expected = 0.045 * (1 + PRIOR_SLOPE * 1) / (1 + PRIOR_SLOPE * 6)
    assert costs.estimate("l1", 2) == pytest.approx(expected)
    assert costs.estimate("l1", 1) < costs.estimate("l1", 2) < costs.estimate("l1", 7)


def test_a_level_never_prices_a_smaller_forward_above_its_smallest_timed_one():
    costs = StepCosts()
    for n, ms in ((1, 30.0), (2, 29.0), (3, 31.0)):  # L2 flat and noisy: 2 tokens timed under 1
        costs.record("l2", n, ms / 1000)
    costs.record("l1", 3, 0.020)
    assert costs.estimate("l1", 1) <= costs.estimate("l1", 3)
    assert costs.estimate("l1", 2) == pytest.approx(0.020 * 29.0 / 31.0)


def test_a_stale_size_moved_with_a_spiked_smallest_one_is_believed_up_to_its_last_timing():
    """The 1-token check first timed in a spike (20 ms), a 3-token one at 13.6 ms, then the 1-token
    one quiet at 9 ms: the 3-token size, left stale, reads 13.6 x 9 / 20. Timed again at 13.6 ms it
    is back at 13.6 (Zen 4, continue 1K: it read 5.6 and slower timings moved it 10 % each, so auto
    ran γ1 = 2-3 for three answers at up to 1.2x fixed γ1 = 4's ms/token)."""
    costs = StepCosts()
    costs.record("l2", 1, 0.020)
    costs.record("l2", 3, 0.0136)
    for _ in range(12):
        costs.record("l2", 1, 0.009)
    assert not costs.fresh("l2", 3)
    assert costs.estimate("l2", 3) < 0.5 * 0.0136  # moved with the smallest size
    costs.record("l2", 3, 0.0136)
    assert costs.estimate("l2", 3) == pytest.approx(0.0136)
    costs.record("l2", 3, 0.030)  # fresh again: a spike moves it a little
    assert costs.estimate("l2", 3) < 0.016


def test_a_new_size_s_first_timing_is_capped_by_the_fresh_sizes_not_by_stale_ones_read_low():
    """Every size timed while the 1-token check ran at twice its cost, then only 1 and 5 timed, quiet:
    the stale sizes, read as moving with the 1-token check, fall to about half their cost. A first
    timing of 9 tokens capped at 1.5x the line through them stood a third under its quiet cost
    (and, slower samples believed a tenth at a time, ran for many cycles at that price); the fresh
    sizes put it where it is."""
    costs = StepCosts()
    for n, ms in enumerate(CHECK_1K_MS, start=1):
        costs.record("l2", n, (2.0 if n == 1 else 1.0) * ms / 1000)
    for _ in range(12):
        for n in (1, 5):
            costs.record("l2", n, CHECK_1K_MS[n - 1] / 1000)
    assert costs.estimate("l2", 7) < 0.7 * CHECK_1K_MS[6] / 1000  # the stale sizes read low
    quiet_9 = (CHECK_1K_MS[6] + 2 * (CHECK_1K_MS[6] - CHECK_1K_MS[5])) / 1000
    costs.record("l2", 9, quiet_9)
    assert costs.estimate("l2", 9) == pytest.approx(quiet_9)
