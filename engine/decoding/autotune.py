"""The "auto" setting: pick gamma1, gamma2 and the retrieval budget from measured step times and
rolling acceptance. Only speed depends on these; the output is the same for any choice."""
from __future__ import annotations

from engine.settings import DecodeSettings


def expected_tokens(acceptance: float, gamma: int) -> float:
    """Tokens one verification of `gamma` drafts yields when each is accepted with prob `acceptance`
    (accepted prefix + the correction/bonus token)."""
    a = min(max(acceptance, 0.0), 0.999)
    return (1.0 - a ** (gamma + 1)) / (1.0 - a)


def best_gamma(acceptance: float, draft_s_per_token: float, verify_s: float, max_gamma: int) -> int:
    """The gamma that maximises tokens per second of one draft-then-verify cycle."""
    def rate(g: int) -> float:
        return expected_tokens(acceptance, g) / (g * draft_s_per_token + verify_s)

    return max(range(1, max_gamma + 1), key=rate)


def retune(settings: DecodeSettings, context_tokens: int, l1_acceptance: float | None, l0_acceptance: float | None,
           l0_s: float | None, l1_s: float | None, l2_s: float | None) -> DecodeSettings:
    """New settings for the next cycles; unchanged where nothing has been measured yet."""
    changes: dict = {}
    if l1_acceptance is not None and l1_s and l2_s:
        # L1 produces (with L0's help) expected_tokens(l0, gamma1) tokens per L1 forward
        per_l1_forward = expected_tokens(l0_acceptance, settings.gamma1) if (l0_acceptance is not None) else 1.0
        l1_per_token = (l1_s + settings.gamma1 * (l0_s or 0.0)) / per_l1_forward
        changes["gamma2"] = best_gamma(l1_acceptance, l1_per_token, l2_s, 16)
        # a larger selection buys acceptance when L1 is cheap next to L2; a smaller one buys speed
        if l1_acceptance < 0.7 and l1_s < 0.5 * l2_s:
            budget = min(settings.budget * 2, max(2 * settings.chunk, context_tokens // 2 // settings.chunk * settings.chunk))
            changes["budget"] = max(budget, settings.budget)
        elif l1_acceptance > 0.95 and settings.budget >= 4 * settings.chunk and l1_s > 0.5 * l2_s:
            changes["budget"] = settings.budget // 2 // settings.chunk * settings.chunk
    if l0_acceptance is not None and l0_s and l1_s:
        changes["gamma1"] = best_gamma(l0_acceptance, l0_s, l1_s, 8)
    return settings.replace(**changes) if changes else settings
