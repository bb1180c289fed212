"""`chat`'s answer: streamed to stdout and saved as one turn in the chat store as it grows.

The question and an empty answer are written together before the first token; the answer is
checkpointed at most once a second and finished with its mark in one transaction. Any exception
while the answer streams (SIGINT and SIGTERM, raised as KeyboardInterrupt by engine.cli, a
UserError, a bug) saves the text printed so far, marked "interrupted"; an answer that printed
nothing leaves no turn at all (and no chat, if it was made for this question). The answer line and
any prefill progress line are ended first, so the CLI's "interrupted" stands on its own line.
"""
from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Sequence

from engine.events import DocumentText, Finished, PrefillProgress, TokenText


class AnswerPrinter:
    """Writes the answer to stdout and prefill progress to stderr, keeping lines whole."""

    def __init__(self, progress: bool) -> None:
        self.progress = progress
        self.text = ""
        self.spans: list[tuple[int, int, int]] = []  # (start, end, level) of the printed text
        self._progress_open = False  # a "\rprefill ..." line on stderr not yet ended

    def token(self, event: TokenText) -> None:
        self._end_progress()
        start = len(self.text)
        self.text += event.text
        if event.text:
            if self.spans and self.spans[-1][2] == int(event.level) and self.spans[-1][1] == start:
                self.spans[-1] = (self.spans[-1][0], len(self.text), int(event.level))
            else:
                self.spans.append((start, len(self.text), int(event.level)))
        sys.stdout.write(event.text)
        sys.stdout.flush()

    def prefill(self, event: PrefillProgress) -> None:
        if self.progress:
            self._progress_open = True  # first: a signal right after the print must still end the line
            print(f"\rprefill {event.done}/{event.total} (+{event.reused} reused)", end="", file=sys.stderr, flush=True)

    def end_lines(self) -> None:
        """End the answer's line on stdout and the progress line on stderr (a closed stdout, e.g. a
        pipe whose reader left, is let be: the answer still has to be saved)."""
        self._end_progress()
        try:
            sys.stdout.write("\n")
            sys.stdout.flush()
        except BrokenPipeError:
            pass

    def _end_progress(self) -> None:
        if self._progress_open:
            print(file=sys.stderr, flush=True)
            self._progress_open = False


def stream_turn(events: Iterable, printer: AnswerPrinter, store, chat_id: int | None, question: str,
                new_docs: Sequence[DocumentText], model_spec: str, stats_of: Callable[[Finished, int], dict],
                on_chat: Callable[[int], None] | None = None) -> tuple[Finished | None, int | None]:
    """Print `events` and (with a store) save the turn as it streams; returns (Finished, chat id).

    stats_of(final, chat_id) gives the stats dict stored with a finished answer; on_chat(chat_id)
    runs in the transaction that adds the chat's new documents and the question.
    """
    turn, created = None, False
    if store is not None:
        with store.transaction():  # the chat, its new documents and the question land together
            if chat_id is None:
                chat_id, created = store.create_chat(question[:60], model_spec=model_spec).id, True
            for doc in new_docs:
                store.add_document(chat_id, doc)
            if on_chat is not None:
                on_chat(chat_id)
            turn = store.begin_turn(chat_id, question)
    final = None
    try:
        for event in events:
            if isinstance(event, TokenText):
                printer.token(event)
                if turn is not None:
                    turn.checkpoint(printer.text, printer.spans)
            elif isinstance(event, PrefillProgress):
                printer.prefill(event)
            elif isinstance(event, Finished):
                final = event
        if turn is not None and final is not None:
            # committed before the line ends: an answer seen whole on the terminal is saved whole
            state = "done" if final.reason.value in ("eos", "stop", "length") else "stopped"
            turn.finish(final.text, state=state, stats=stats_of(final, chat_id),
                        level_spans=_fit_spans(printer.spans, final.text))
    except BaseException:  # Ctrl+C, SIGTERM, a UserError or a bug: keep what printed, nothing else
        printer.end_lines()
        if turn is not None and not turn.finished:
            _drop_or_keep_partial(store, turn, printer, chat_id if created else None)
        raise
    if turn is not None and not turn.finished:  # the events ended without an answer's end
        _drop_or_keep_partial(store, turn, printer, chat_id if created else None)
    printer.end_lines()
    return final, chat_id


def _drop_or_keep_partial(store, turn, printer: AnswerPrinter, created_chat: int | None) -> None:
    """An answer cut off by any exception: what printed is kept, marked "interrupted"; one that
    printed nothing leaves no turn (and no chat, when the chat was made for this question)."""
    if printer.text:
        turn.finish(printer.text, state="interrupted", stats={"partial": True}, level_spans=printer.spans)
    elif created_chat is not None:
        store.delete_chat(created_chat)
    else:
        turn.discard()


def _fit_spans(spans: Sequence[tuple[int, int, int]], text: str) -> list[tuple[int, int, int]]:
    # the final text may be shorter than what streamed (a stop string trimmed): cut the spans to it
    return [(a, min(b, len(text)), level) for a, b, level in spans if a < len(text)]
