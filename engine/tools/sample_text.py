"""The bundled sample text (Shakespeare, public domain; see resources/sample/NOTICE.md) and
passages of it cut to a token count, for tests, benchmarks and the app's "try it" button."""
from __future__ import annotations

from pathlib import Path

SAMPLE_DIR = Path(__file__).resolve().parents[2] / "resources" / "sample"
PLAYS = ("hamlet", "macbeth")


def sample_path(play: str = "hamlet") -> Path:
    """Path of a bundled play as Markdown."""
    if play not in PLAYS:
        raise ValueError(f"unknown sample play {play!r}: one of {PLAYS}")
    return SAMPLE_DIR / f"{play}.md"


def sample_text(play: str = "hamlet") -> str:
    """A whole play (Hamlet: about 190 KB, roughly 50K tokens)."""
    return sample_path(play).read_text(encoding="utf-8")


def sample_passage(n_tokens: int, tokenizer, play: str = "hamlet") -> str:
    """The start of a play, cut at a line end so it is at most `n_tokens` tokens of `tokenizer`.

    Cut by character offsets rather than decode(ids[:n]) so the passage is the original text."""
    text = sample_text(play)
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    offsets = encoded["offset_mapping"]
    if n_tokens >= len(offsets):
        return text
    end = offsets[n_tokens][0]  # start of the first token that no longer fits
    cut = text.rfind("\n", 0, end)
    return text[: cut + 1 if cut > 0 else end]
