"""HTML/XHTML to plain text with the stdlib parser: blocks become paragraphs, scripts vanish."""
from __future__ import annotations

import re
from html.parser import HTMLParser

_BLOCK = frozenset(
    "address article aside blockquote body caption center dd details dialog dir div dl dt fieldset "
    "figcaption figure footer form h1 h2 h3 h4 h5 h6 header hgroup hr html legend li main menu nav "
    "ol p pre section summary table tbody tfoot thead tr ul".split())
_SKIP = frozenset("script style noscript template svg math head iframe object canvas select".split())
_HEADINGS = frozenset("h1 h2 h3 h4 h5 h6".split())
_WS = re.compile(r"\s+")


class _TextExtractor(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.title_parts: list[str] = []
        self.heading: str = ""
        self._heading_parts: list[str] | None = None
        self._skip: list[str] = []  # open skipped elements (head is skipped except its <title>)
        self._in_title = False
        self._pre = 0
        self._cells_in_row = 0
        self._newlines = 0  # newlines at the end of the output so far

    # -- output helpers -------------------------------------------------------------------
    def _emit(self, text: str) -> None:
        self.parts.append(text)
        stripped = text.rstrip("\n")
        self._newlines = len(text) - len(stripped) + (self._newlines if not stripped else 0)

    def _break(self, newlines: int) -> None:
        """End the current line/paragraph: make the output end with `newlines` newlines."""
        if not self.parts:
            return
        if self._newlines == 0 and self.parts[-1].endswith(" "):
            self.parts[-1] = self.parts[-1].rstrip(" ")
        if self._newlines < newlines:
            self._emit("\n" * (newlines - self._newlines))

    # -- parser callbacks -----------------------------------------------------------------
    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "title":
            self._in_title = True
            return
        if tag in _SKIP:
            self._skip.append(tag)
            return
        if self._skip:
            return
        if tag == "br":
            self._emit("\n")
        elif tag in ("td", "th"):
            if self._cells_in_row:
                self._emit(" | ")
            self._cells_in_row += 1
        elif tag in _BLOCK:
            self._break(2 if tag not in ("li", "tr", "dd", "dt") else 1)
            if tag == "li":
                self._emit("- ")
            elif tag == "tr":
                self._cells_in_row = 0
            elif tag == "pre":
                self._pre += 1
            if tag in _HEADINGS and not self.heading:
                self._heading_parts = []

    def handle_endtag(self, tag: str) -> None:
        if tag == "title":
            self._in_title = False
            return
        if self._skip:
            if tag in self._skip:  # tolerate unclosed children of a skipped element
                while self._skip and self._skip.pop() != tag:
                    pass
            return
        if tag in _BLOCK:
            if tag == "pre":
                self._pre = max(0, self._pre - 1)
            if tag in _HEADINGS and self._heading_parts is not None:
                self.heading = _WS.sub(" ", "".join(self._heading_parts)).strip()
                self._heading_parts = None
            self._break(2 if tag not in ("li", "tr", "dd", "dt") else 1)

    def handle_data(self, data: str) -> None:
        if self._in_title:
            self.title_parts.append(data)
            return
        if self._skip:
            return
        if not self._pre:
            data = _WS.sub(" ", data)
            if not self.parts or self._newlines or self.parts[-1].endswith(" "):
                data = data.lstrip(" ")
        if data:
            self._emit(data)
            if self._heading_parts is not None:
                self._heading_parts.append(data)


def html_to_text(markup: str) -> tuple[str, str]:
    """Return (text, title): title from <title>, else the first heading, else ""."""
    parser = _TextExtractor()
    parser.feed(markup)
    parser.close()
    title = _WS.sub(" ", "".join(parser.title_parts)).strip() or parser.heading
    return "".join(parser.parts), title
