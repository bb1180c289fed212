"""Books that do not fit: split a document into passages, rank them against the question with
BM25 (the `bm25s` library), and keep the best ones, in document order, within a token budget.

Passages never cross a page, chapter or heading: the boundaries come from the reader
(`meta["sections"]`: PDF pages, EPUB chapters), from Markdown headings, or from heading-like
lines of plain text ("CHAPTER IV", "ACT V"); inside a section, paragraphs are packed up to a
token cap. The selection renders deterministically (same passages -> same text), so the chat
session's longest-common-prefix rule reuses the KV of every passage the next question keeps.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Sequence

from engine.errors import ContextOverflowError
from engine.events import DocumentText

__all__ = ["Passage", "PassageSelection", "FitResult", "FITS", "split_passages", "rank_passages",
           "select_passages", "render_selection", "fit_documents", "token_counter"]

FITS = ("whole", "passages")  # how a document goes into the prompt
PASSAGE_TOKENS = 320  # cap per passage: small enough to be precise, big enough to keep a speech whole
FIRST_WORDS = 8

# count_tokens(texts) -> one token count per text (batched: the tokenizer is fast on lists)
TokenCounter = Callable[[Sequence[str]], list[int]]


@dataclass(frozen=True)
class Passage:
    """One piece of a document that never crosses a page/chapter/heading boundary."""

    index: int  # position among the document's passages
    label: str  # "page 12", "ACT V, SCENE II (part 3 of 14)", "Chapter 4", "passage 17"
    text: str
    start: int  # character offset in the document's text
    tokens: int  # tokens of `text` alone

    @property
    def first_words(self) -> str:
        """The passage's first few words, markup stripped: how the answer cites it."""
        words = re.sub(r"[*_#>`|]+", " ", self.text).split()
        head = " ".join(words[:FIRST_WORDS])
        return head + (" ..." if len(words) > FIRST_WORDS else "")


@dataclass(frozen=True)
class PassageSelection:
    """The passages of one document chosen for one question, in document order."""

    title: str
    passages: tuple[Passage, ...]
    total_passages: int
    total_tokens: int  # the whole document's passages, summed

    @property
    def tokens(self) -> int:
        return sum(p.tokens for p in self.passages)

    def citations(self) -> list[dict]:
        """Plain dicts for --stats, the chat store and the export."""
        return [{"index": p.index, "label": p.label, "first_words": p.first_words, "start": p.start,
                 "tokens": p.tokens} for p in self.passages]


@dataclass(frozen=True)
class FitResult:
    """What goes into the prompt: documents (passage ones rendered), and what was chosen."""

    documents: tuple[DocumentText, ...]
    selections: tuple[PassageSelection | None, ...]  # per document: None where it went in whole
    prompt_tokens: int
    limit: int  # the most prompt tokens allowed (context minus the answer's reserve)


# --- splitting -----------------------------------------------------------------------------------
_ATX = re.compile(r"^ {0,3}(#{1,6})[ \t]+(.+?)(?:[ \t]+#+)?[ \t]*$")
# plain-text heading lines as Gutenberg books and plays have them
_PLAIN_HEADING = re.compile(r"^ {0,3}((?:CHAPTER|Chapter|BOOK|Book|PART|Part|ACT|Act|SCENE|Scene|CANTO|Canto)"
                            r"\b[^\n]{0,60}|[IVXLC]+\.?)[ \t]*$")
_BLANK = re.compile(r"\n[ \t]*\n+")


def _sections(doc: DocumentText) -> list[tuple[str, int, int]]:
    """(label, start, end) character ranges that passages must not cross."""
    text = doc.text
    marks = doc.meta.get("sections") if doc.meta else None
    if marks:  # the reader knew the pages/chapters
        starts = [(str(label), int(start)) for label, start in marks]
    else:
        starts = _heading_starts(text, doc.meta.get("format") if doc.meta else None, doc.title)
    if not starts or starts[0][1] > 0:
        starts.insert(0, ("", 0))
    bounds = [s for _, s in starts[1:]] + [len(text)]
    out: list[tuple[str, int, int]] = []
    carry = None  # start of heading-only sections ("# Hamlet", "## ACT I"): they join the next one
    for (label, start), end in zip(starts, bounds):
        body = text[start:end].strip()
        if not body:
            continue
        if "\n" not in body and end < len(text) and marks is None:
            carry = start if carry is None else carry
            continue
        out.append((label, start if carry is None else carry, end))
        carry = None
    return out


def _heading_starts(text: str, fmt: str | None, title: str) -> list[tuple[str, int]]:
    """Headings as (path label, offset); Markdown headings nest ("ACT V, SCENE II. ..."), plain ones do not."""
    out: list[tuple[str, int]] = []
    path: list[tuple[int, str]] = []
    offset = 0
    fenced = False
    for line in text.splitlines(keepends=True):
        stripped = line.strip()
        if stripped.startswith(("```", "~~~")):
            fenced = not fenced
        elif not fenced and (m := _ATX.match(line.rstrip("\n"))):
            level, name = len(m.group(1)), " ".join(m.group(2).split())[:80]
            path = [(lv, n) for lv, n in path if lv < level] + [(level, name)]
            names = [n for lv, n in path if not (lv == 1 and n == title)]  # the title adds nothing
            out.append((", ".join(names) or name, offset))
        elif not fenced and fmt != "markdown" and _PLAIN_HEADING.match(line.rstrip("\n")):
            out.append((" ".join(stripped.split())[:80], offset))
        offset += len(line)
    return out


def _paragraphs(text: str, start: int) -> list[tuple[int, str]]:
    """(absolute offset, paragraph) for the blank-line separated paragraphs of one section."""
    out, pos = [], 0
    for m in list(_BLANK.finditer(text)) + [None]:
        end = m.start() if m else len(text)
        piece = text[pos:end]
        if piece.strip():
            lead = len(piece) - len(piece.lstrip())
            out.append((start + pos + lead, piece.strip()))
        pos = m.end() if m else len(text)
    return out


def _split_long(offset: int, para: str, tokens: int, cap: int) -> list[tuple[int, str]]:
    """A paragraph over the cap, cut at line ends (else word ends) into about-equal pieces."""
    pieces = -(-tokens // cap) + 1  # one spare: the cut is by characters, tokens are uneven
    size = -(-len(para) // pieces)
    out, pos = [], 0
    while pos < len(para):
        end = min(len(para), pos + size)
        if end < len(para):
            cut = para.rfind("\n", pos + 1, end)
            if cut <= pos:
                cut = para.rfind(" ", pos + 1, end)
            end = cut if cut > pos else end
        piece = para[pos:end]
        if piece.strip():
            out.append((offset + pos + len(piece) - len(piece.lstrip()), piece.strip()))
        pos = end
    return out


def split_passages(doc: DocumentText, count_tokens: TokenCounter, max_tokens: int = PASSAGE_TOKENS) -> list[Passage]:
    """The document as passages of at most about `max_tokens` tokens, never crossing a section."""
    sections = _sections(doc)
    raw: list[tuple[int, str, int, list[tuple[int, str]]]] = []  # (section, its label, its parts, pieces)
    labels_seen = [label for label, _, _ in sections]
    for section, (label, start, end) in enumerate(sections):
        paras = _paragraphs(doc.text[start:end], start)
        counts = count_tokens([p for _, p in paras])
        groups: list[list[tuple[int, str]]] = []
        group: list[tuple[int, str]] = []
        used = 0
        for (offset, para), n in zip(paras, counts):
            parts = [(offset, para)] if n <= max_tokens else _split_long(offset, para, n, max_tokens)
            part_counts = [n] if len(parts) == 1 else count_tokens([p for _, p in parts])
            for piece, m in zip(parts, part_counts):
                if group and used + m > max_tokens:
                    groups.append(group)
                    group, used = [], 0
                group.append(piece)
                used += m
        if group:
            groups.append(group)
        raw += [(section, label, len(groups), g) for g in groups]
    texts = ["\n\n".join(p for _, p in g) for *_, g in raw]
    counts = count_tokens(texts)
    passages, part = [], 0
    unlabelled = not any(labels_seen)
    for i, ((section, label, parts, group), text, n) in enumerate(zip(raw, texts, counts)):
        part = part + 1 if i and raw[i - 1][0] == section else 1
        if unlabelled:
            name = f"passage {i + 1}"
        elif parts > 1:
            name = f"{label or 'start'} (part {part} of {parts})"
        else:
            name = label or "start"
        passages.append(Passage(i, name, text, group[0][0], n))
    return passages


# --- ranking and selection -----------------------------------------------------------------------
def light_stem(word: str) -> str:
    """Strip a few English endings so "dies"/"died"/"dying" and "poisoned"/"poison" meet (no library needed)."""
    for suffix, keep in (("ies", "y"), ("ied", "y"), ("ying", "ie"), ("ing", ""), ("ed", ""), ("es", ""),
                         ("s", ""), ("ly", "")):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3 and not word.endswith("ss"):
            return word[: len(word) - len(suffix)] + keep
    return word


def rank_passages(passages: Sequence[Passage], question: str) -> list[float]:
    """BM25 score of every passage against the question (English stopwords dropped, endings stripped;
    0 = no word in common)."""
    import bm25s

    if not passages:
        return []
    corpus = bm25s.tokenize([p.text for p in passages], stopwords="en", show_progress=False,
                             stemmer=lambda words: [light_stem(w) for w in words])  # bm25s stems a list
    index = bm25s.BM25()
    index.index(corpus, show_progress=False)
    words = [light_stem(w) for w in
             bm25s.tokenize([question], stopwords="en", return_ids=False, show_progress=False)[0]]
    known = [w for w in words if w in corpus.vocab]  # get_scores wants words the corpus has
    if not known:
        return [0.0] * len(passages)
    return [float(s) for s in index.get_scores(known)]


def select_passages(passages: Sequence[Passage], scores: Sequence[float], budget: int,
                    overhead: int = 0) -> list[Passage]:
    """The best-scoring passages whose tokens (+ `overhead` each for the label) fit `budget`, in
    document order. Passages that share no word with the question (score 0) are never taken."""
    order = sorted(range(len(passages)), key=lambda i: (-scores[i], i))
    chosen, used = [], 0
    for i in order:
        if scores[i] <= 0:
            break
        cost = passages[i].tokens + overhead
        if used + cost <= budget:
            chosen.append(i)
            used += cost
    return [passages[i] for i in sorted(chosen)]


def render_selection(title: str, chosen: Sequence[Passage], total: int) -> str:
    """The text that replaces the whole document in the prompt: a note, then each passage under its label.
    Pure and deterministic, so an unchanged selection renders to the same tokens."""
    head = (f"(Excerpts: {len(chosen)} of the {total} passages of \"{title}\" most relevant to the question, "
            "in document order. Each starts with its place in the document in brackets.)")
    return "\n\n".join([head] + [f"[{p.label}]\n{p.text}" for p in chosen])


def token_counter(tokenizer) -> TokenCounter:
    """A batched token counter over a Hugging Face tokenizer."""
    def count(texts: Sequence[str]) -> list[int]:
        if not texts:
            return []
        return [len(ids) for ids in tokenizer(list(texts), add_special_tokens=False)["input_ids"]]
    return count


def fit_documents(documents: Sequence[DocumentText], fits: Sequence[str], question: str,
                  measure: Callable[[Sequence[DocumentText]], int], limit: int, count_tokens: TokenCounter,
                  passage_tokens: int = PASSAGE_TOKENS, history_reserve: int = 0) -> FitResult:
    """Replace each "passages" document with its passages most relevant to `question`.

    measure(documents) is the whole prompt's token count with these documents (system prompt,
    history and question included); `limit` is the most it may be (context minus the reserve for
    the answer). Passages of all such documents compete in one BM25 ranking; the result never
    measures over `limit`. history_reserve: tokens the passages leave free for the conversation to
    grow into (the caller subtracts what the history already uses), so the next question's
    selection is not cut short by the last answer, and the KV of an unchanged selection is reused.
    Raises ContextOverflowError when even no passage at all does not fit.
    """
    if len(fits) != len(documents) or any(f not in FITS for f in fits):
        raise ValueError(f"one fit per document, each one of {FITS}: got {list(fits)}")
    which = [i for i, f in enumerate(fits) if f == "passages"]
    if not which:
        docs = tuple(documents)
        return FitResult(docs, (None,) * len(docs), measure(docs), limit)
    split = {i: split_passages(documents[i], count_tokens, passage_tokens) for i in which}

    def render(chosen: dict[int, list[Passage]]) -> tuple[DocumentText, ...]:
        return tuple(DocumentText(d.title, render_selection(d.title, chosen[i], len(split[i])), d.source,
                                  {**(d.meta or {}), "fit": "passages"}) if i in chosen else d
                     for i, d in enumerate(documents))

    empty = {i: [] for i in which}
    base = measure(render(empty))
    if base > limit:
        raise ContextOverflowError(
            f"even without any passage the prompt is {base:,} tokens, over the {limit:,} this context allows "
            "after the answer's reserve: remove a document put in whole, start a new chat, or lower the answer length")
    pool = [(i, p) for i in which for p in split[i]]
    scores = rank_passages([p for _, p in pool], question)
    overhead = 2 + max(count_tokens([f"[{p.label}]" for _, p in pool[:50]]) or [0])
    budget = max(0, limit - base - max(0, history_reserve))
    picked = select_passages([p for _, p in pool], scores, budget, overhead)
    owner = {id(p): i for i, p in pool}
    while True:
        chosen = {i: [p for p in picked if owner[id(p)] == i] for i in which}
        docs = render(chosen)
        used = measure(docs)
        if used <= limit or not picked:
            break
        # the estimate was short (tokens merge differently once joined): drop the weakest and retry
        rank = {id(p): s for (_, p), s in zip(pool, scores)}
        picked.remove(min(picked, key=lambda p: (rank[id(p)], -p.index)))
    selections = tuple(PassageSelection(d.title, tuple(chosen[i]), len(split[i]), sum(p.tokens for p in split[i]))
                       if i in chosen else None for i, d in enumerate(documents))
    return FitResult(docs, selections, used, limit)
