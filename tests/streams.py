"""Reading a session's event stream in tests: the answer's token ids and its Finished event."""
from __future__ import annotations

from engine.events import Finished, TokenText


def answer_tokens(session, messages, documents=()) -> tuple[list[int], Finished | None]:
    """Run one turn; return every generated token id (in order) and the final event."""
    tokens: list[int] = []
    final = None
    for event in session.stream(messages, documents):
        if isinstance(event, TokenText):
            tokens += event.token_ids
        elif isinstance(event, Finished):
            final = event
    return tokens, final
