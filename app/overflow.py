"""When documents do not fit: the numbers, the file names, and the ways out that would help (Qt-free).

The dialog (app/overflow_dialog.py) shows an `Overflow` and one button per `OverflowAction`;
a new way out (e.g. answering from the most relevant passages) is one more action here.
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

_NUMBERS = (  # the engine's messages, newest first: (prompt, answer, context)
    re.compile(r"prompt is ([\d,]+) tokens and the answer may take ([\d,]+) more.*?holds ([\d,]+)"),
    re.compile(r"needs ([\d,]+) prompt tokens \+ ([\d,]+) for the answer.*?holds ([\d,]+)"),
)


@dataclass(frozen=True)
class OverflowAction:
    """One way out: `key` names what the window does ("model", "answer-length", "new-chat", ...)."""

    key: str
    label: str
    hint: str


@dataclass(frozen=True)
class Overflow:
    """What did not fit and by how much (numbers None when the engine's message gave none)."""

    names: tuple[str, ...]
    message: str
    prompt_tokens: int | None = None
    answer_tokens: int | None = None
    context_tokens: int | None = None
    paths: tuple[str, ...] = ()  # the files that did not fit (what "passages" attaches again)
    trained_context: int | None = None  # what the model was trained on
    stretch_to: int | None = None  # the smallest stretched window (<= 4x trained) that holds it; None: none does

    @property
    def needed(self) -> int | None:
        if self.prompt_tokens is None or self.answer_tokens is None:
            return None
        return self.prompt_tokens + self.answer_tokens

    @property
    def prompt_alone_overflows(self) -> bool:
        """A shorter answer cannot help when the prompt by itself fills the context."""
        if self.prompt_tokens is None or self.context_tokens is None:
            return True
        return self.prompt_tokens >= self.context_tokens

    @property
    def context_to_ask_for(self) -> int | None:
        """The context a model needs for this, rounded up to a power of two (what the picker plans for)."""
        needed = self.needed
        return None if needed is None else 1 << max(0, needed - 1).bit_length()

    def title(self) -> str:
        if not self.names:
            return "The conversation does not fit"
        return f"{_names(self.names)} {'does' if len(self.names) == 1 else 'do'} not fit"

    def text(self) -> str:
        """One sentence with the numbers, starting with a capital; the ways out are the buttons."""
        numbers = re.split(r"(?<=\d): ", self.message, maxsplit=1)[0].strip().rstrip(".")
        numbers = numbers[:1].upper() + numbers[1:]
        verb = "was" if len(self.names) == 1 else "were"
        what = f"{_names(self.names)} {verb} not added to the chat." if self.names else "Nothing was added."
        return f"{what} {numbers}."

    def stretch_caveat(self) -> str:
        """What the stretch costs, in a sentence ("" when none is offered)."""
        if not (self.stretch_to and self.trained_context):
            return ""
        return (f"A stretch to {window_label(self.stretch_to)} reads past the {window_label(self.trained_context)} "
                f"tokens it was trained on (YaRN x{self.stretch_to / self.trained_context:g}): answers may be "
                "less accurate.")

    def actions(self) -> list[OverflowAction]:
        out = [OverflowAction("model", "Choose another model…",
                              f"one with a context of {self.context_to_ask_for:,} tokens or more"
                              if self.context_to_ask_for else "one with a longer context")]
        if self.stretch_to and self.trained_context:
            factor = self.stretch_to / self.trained_context
            out.append(OverflowAction("stretch", f"Stretch this model to {window_label(self.stretch_to)}",
                                      f"lower quality beyond its trained {window_label(self.trained_context)}: "
                                      f"the model reloads with its positions stretched {factor:g}x (YaRN), "
                                      "then the document is added"))
        if self.paths:  # keep the book, and answer each question from its passages that match it best
            out.append(OverflowAction("passages", "Answer from the most relevant passages",
                                      "add it anyway: each question is answered from its passages that match "
                                      "it best (page, chapter or section), and the answer lists them"))
        if not self.prompt_alone_overflows:
            room = (self.context_tokens or 0) - (self.prompt_tokens or 0)
            out.append(OverflowAction("answer-length", "Shorter answer…",
                                      f"an answer length under {room:,} tokens in Settings"))
        out.append(OverflowAction("new-chat", "New chat", "start again without this chat's history"))
        return out


def overflow_from(message: str, paths: Sequence[str] = (), error: BaseException | None = None) -> Overflow:
    """An `Overflow` from the engine's ContextOverflowError: its numbers when it carries them
    (prompt_tokens, answer_tokens, context_tokens), else parsed from its message."""
    prompt_tokens, answer_tokens, context_tokens = (getattr(error, name, None) for name in
                                                    ("prompt_tokens", "answer_tokens", "context_tokens"))
    if prompt_tokens is None:
        for pattern in _NUMBERS:
            m = pattern.search(message)
            if m:
                prompt_tokens, answer_tokens, context_tokens = (int(g.replace(",", "")) for g in m.groups())
                break
    names = tuple(Path(p).name for p in paths)
    return Overflow(names, message, prompt_tokens, answer_tokens, context_tokens, tuple(str(p) for p in paths))


def with_stretch(overflow: Overflow, model: Any) -> Overflow:
    """`overflow` with the stretch to offer: the smallest of the loaded model's stretched windows
    (`ModelInfo.stretches`: up to 4x its trained context, where the planner fits them) that holds
    what is needed, else none."""
    needed, trained = overflow.needed, int(getattr(model, "trained_context", 0) or 0)
    windows = tuple(getattr(model, "stretches", ()) or ())
    fitting = [w for w in windows if needed is not None and w >= needed and w > (overflow.context_tokens or 0)]
    if not trained or not fitting:
        return overflow
    return dataclasses.replace(overflow, trained_context=trained, stretch_to=min(fitting))


def window_label(tokens: int) -> str:
    """"8K" for 8,192 tokens, "1M" for 1,048,576, else the count ("1,000")."""
    for unit, size in (("M", 1 << 20), ("K", 1 << 10)):
        if tokens >= size and tokens % size == 0:
            return f"{tokens // size}{unit}"
    return f"{tokens:,}"


def _names(names: Sequence[str]) -> str:
    quoted = [f"“{n}”" for n in names]
    return quoted[0] if len(quoted) == 1 else ", ".join(quoted[:-1]) + " and " + quoted[-1]
