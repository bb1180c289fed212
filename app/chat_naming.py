"""Names: a chat's title from its first message or document, an export's file name, a document
whose own title is a placeholder (Qt-free)."""
from __future__ import annotations

import dataclasses
from pathlib import Path

from engine.events import DocumentText

PLACEHOLDER_TITLES = {"", "untitled", "untitled document", "document", "microsoft word - document1"}


def named_document(doc: DocumentText, path: str) -> DocumentText:
    """A document whose own title is a placeholder ("untitled", "Untitled Document", empty) is
    named after its file instead, in the chip, the chat's title and the export."""
    if doc.title.strip().lower() not in PLACEHOLDER_TITLES or not path:
        return doc
    return dataclasses.replace(doc, title=Path(path).stem)


def chat_title(text: str, limit: int = 60) -> str:
    """A chat's title from its first message: one line, no Markdown marks, cut at a word."""
    plain = " ".join(text.replace("**", "").replace("`", "").replace("#", "").split())
    if len(plain) > limit:
        plain = plain[:limit].rsplit(" ", 1)[0] + "…"
    return plain or "New chat"


def export_file_name(title: str, fmt: str) -> str:
    """`title` as a file name: no path separators or characters Windows refuses, at most 80 characters."""
    bad = '<>:"/\\|?*\n\r\t'
    name = "".join("-" if ch in bad else ch for ch in title).strip(" .-") or "chat"
    return name[:80].rstrip(" .") + (".md" if fmt == "markdown" else ".json")
