"""`Structure`: one fixed way to decode (a mode that is not auto, with its draft lengths), what the
`auto` policy (engine/decoding/policy.py) chooses and the decoder composes its levels from."""
from __future__ import annotations

from dataclasses import dataclass

from engine.settings import Mode


@dataclass(frozen=True)
class Structure:
    """One fixed way to decode: a mode that is not auto, with its draft lengths."""

    mode: Mode
    gamma1: int = 1
    gamma2: int = 1
    # draft-only: the tokens drafted right after a cycle that kept its whole draft (0: gamma1 always;
    # engine/decoding/lookup_replay.py prices the rule)
    after_full: int = 0

    @property
    def longest_draft(self) -> int:
        """The most tokens L0 drafts for one check (draft-only: its two lengths' longer)."""
        return max(self.gamma1, self.after_full)

    @property
    def label(self) -> str:
        if self.mode is Mode.AR:
            return "ar"
        if self.mode is Mode.DRAFT_ONLY:
            return f"draft-only g1={self.gamma1}" + (f"/{self.after_full}" if self.after_full else "")
        if self.mode is Mode.RETRIEVAL_ONLY:
            return f"retrieval-only g2={self.gamma2}"
        return f"triforce g1={self.gamma1} g2={self.gamma2}"

    def speculation_tokens(self) -> int:
        """Slots one cycle may add past the held tokens (as DecodeSettings.speculation_tokens)."""
        return {Mode.AR: 1, Mode.DRAFT_ONLY: self.longest_draft + 1, Mode.RETRIEVAL_ONLY: self.gamma2 + 1}.get(
            self.mode, self.gamma1 + self.gamma2 + 2)
