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

    @property
    def label(self) -> str:
        if self.mode is Mode.AR:
            return "ar"
        if self.mode is Mode.DRAFT_ONLY:
            return f"draft-only g1={self.gamma1}"
        if self.mode is Mode.RETRIEVAL_ONLY:
            return f"retrieval-only g2={self.gamma2}"
        return f"triforce g1={self.gamma1} g2={self.gamma2}"

    def speculation_tokens(self) -> int:
        """Slots one cycle may add past the held tokens (as DecodeSettings.speculation_tokens)."""
        return {Mode.AR: 1, Mode.DRAFT_ONLY: self.gamma1 + 1, Mode.RETRIEVAL_ONLY: self.gamma2 + 1}.get(
            self.mode, self.gamma1 + self.gamma2 + 2)
