"""Streaming detokenization with stop strings: emit text as soon as it is final."""
from __future__ import annotations


class StreamingText:
    """Turns a growing list of answer tokens into text increments.

    Text is held back while it ends in an incomplete UTF-8 sequence or could be the start of a
    stop string; `stopped` becomes True once a stop string appears (it is cut from the text).
    """

    def __init__(self, tokenizer, stop: tuple[str, ...] = ()) -> None:
        self.tokenizer, self.stop = tokenizer, tuple(s for s in stop if s)
        self.tokens: list[int] = []
        self.text = ""  # all final text so far (emitted or held back)
        self.emitted = 0  # characters handed out
        self.stopped = False
        self._prefix = 0  # token offsets for incremental decoding (decode only a short window)
        self._read = 0

    def _decode(self, tokens: list[int]) -> str:
        return self.tokenizer.decode(tokens, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def add(self, tokens: list[int]) -> str:
        """Add tokens; return the new text that is safe to show."""
        if self.stopped:
            return ""
        self.tokens += tokens
        before = self._decode(self.tokens[self._prefix:self._read])
        after = self._decode(self.tokens[self._prefix:])
        if after.endswith("\ufffd"):
            return ""  # wait for the rest of a multi-byte character
        self.text += after[len(before):]
        self._prefix, self._read = self._read, len(self.tokens)
        return self._release()

    def _release(self) -> str:
        limit = len(self.text)
        for stop in self.stop:
            found = self.text.find(stop)
            if found != -1:
                self.stopped = True
                self.text = self.text[:found]
                limit = found
                break
        if not self.stopped:
            for stop in self.stop:  # hold back a possible partial stop string at the end
                for n in range(min(len(stop) - 1, len(self.text)), 0, -1):
                    if self.text.endswith(stop[:n]):
                        limit = min(limit, len(self.text) - n)
                        break
        out = self.text[self.emitted:limit]
        self.emitted = max(self.emitted, limit)
        return out

    def flush(self) -> str:
        """At the end: everything not yet shown (a partial stop string is just text)."""
        out = self.text[self.emitted:]
        self.emitted = len(self.text)
        return out
