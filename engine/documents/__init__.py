"""Read a document (text, Markdown, HTML, PDF, EPUB, DOCX) into clean text with a title.

`read_document(path)` is the one entry point; every failure a user can cause is a
`DocumentError` whose message names the file and says what to do.
"""
from __future__ import annotations

import hashlib
import os
import re
import stat
import zipfile
from pathlib import Path
from typing import BinaryIO

from engine.documents.markup import html_to_text
from engine.documents.textio import SNIFF, clean_text, decode_file, size_error, sniff_kind
from engine.errors import DocumentError
from engine.events import DocumentText

__all__ = ["read_document", "text_sha256", "FORMATS", "MAX_BYTES"]

MAX_BYTES = 50 * 2**20

FORMATS = {  # extension -> format name
    **dict.fromkeys((".txt", ".text", ".log", ".csv", ".tsv", ".rst", ".org", ".asc", ".nfo"), "text"),
    **dict.fromkeys((".md", ".markdown", ".mdown", ".mkd", ".mdx"), "markdown"),
    **dict.fromkeys((".html", ".htm", ".xhtml", ".xht"), "html"),
    ".pdf": "pdf",
    ".epub": "epub",
    ".docx": "docx",
}

# Formats people try that we cannot read -> what to do instead.
_UNSUPPORTED = {
    **dict.fromkeys((".doc", ".rtf", ".odt", ".pages", ".wpd"), "save it as .docx or PDF and open that"),
    **dict.fromkeys((".mobi", ".azw", ".azw3", ".kfx", ".fb2", ".lit"), "convert it to EPUB (e.g. with Calibre) and open that"),
    **dict.fromkeys((".djvu", ".png", ".jpg", ".jpeg", ".gif", ".tif", ".tiff", ".bmp", ".webp", ".heic"),
                    "it is an image: run OCR on it (e.g. make a searchable PDF) and open the result"),
    **dict.fromkeys((".xls", ".xlsx", ".ods", ".ppt", ".pptx", ".odp", ".key"), "export it to PDF or text and open that"),
    **dict.fromkeys((".zip", ".gz", ".tgz", ".bz2", ".xz", ".7z", ".rar", ".tar"), "extract it first and open the files inside"),
}
_SUPPORTED_TEXT = "text, Markdown, HTML, PDF, EPUB or DOCX"


def read_document(path: str | os.PathLike, max_bytes: int = MAX_BYTES, progress=None, cancel=None) -> DocumentText:
    """Read `path` into a DocumentText with clean text and a title.

    meta holds: format, bytes (file size), sha256 (of the UTF-8 text; the store's key), chars,
    and per format: encoding (text), pages/empty_pages (pdf), chapters (epub), tables (docx).
    notes (when present): lines worth showing the user, e.g. junk NUL bytes dropped from a text.
    Raises DocumentError for anything wrong with the file (missing, too large, empty, binary,
    encrypted, scanned, damaged, unsupported).
    progress(done, total) hears each page of a PDF, the one slow format; cancel() is checked
    before each page (True raises engine.errors.ReadCancelled).
    """
    path = Path(path)
    size = _checked_size(path, max_bytes)
    fmt = FORMATS.get(path.suffix.lower())
    if fmt is None and path.suffix.lower() in _UNSUPPORTED:
        raise DocumentError(f'"{path.name}" is a {path.suffix} file, which cannot be read: '
                            f"{_UNSUPPORTED[path.suffix.lower()]}.")
    try:
        with path.open("rb") as fh:
            if fmt is None:
                fmt = _sniff_format(path, fh)
            text, title, extra = _read(path, fh, fmt, max_bytes, progress, cancel)
    except FileNotFoundError:
        raise DocumentError(f'"{path.name}" disappeared while it was being read (moved or deleted?). '
                            "Check that the file is still there and open it again.") from None
    except PermissionError:
        raise DocumentError(f'"{path.name}" cannot be read: permission denied. '
                            "Check the file's permissions, or copy it somewhere you own.") from None
    except IsADirectoryError:
        raise _folder_error(path) from None
    except OSError as exc:
        raise DocumentError(f'"{path.name}" could not be read ({exc.strerror or exc}). If it is on a network '
                            "drive or removable disk, copy it to a local folder and try again.") from None
    if not text:
        raise DocumentError(f'"{path.name}" contains no text. Open a document with text in it.')
    size = size or len(text.encode("utf-8", "surrogatepass"))  # a /proc file's size is what it held
    meta = {"format": fmt, "bytes": size, "sha256": text_sha256(text), "chars": len(text), **extra}
    return DocumentText(title=title or _stem_title(path), text=text, source=str(path.absolute()), meta=meta)


def text_sha256(text: str) -> str:
    """sha256 of the UTF-8 text, hashed in slices so a big book is not encoded whole at once."""
    digest = hashlib.sha256()
    step = 1 << 20
    for start in range(0, len(text), step):
        digest.update(text[start:start + step].encode("utf-8", "surrogatepass"))
    return digest.hexdigest()


def _checked_size(path: Path, max_bytes: int) -> int:
    try:
        st = path.stat()
    except FileNotFoundError:
        raise DocumentError(f'"{path}" does not exist (moved, renamed or deleted?). '
                            "Check the path and try again.") from None
    except PermissionError:
        raise DocumentError(f'"{path}" cannot be opened: permission denied. Check the folder\'s permissions.') from None
    except OSError as exc:
        raise DocumentError(f'"{path}" cannot be opened ({exc.strerror or exc}). Check the path and try again.') from None
    if stat.S_ISDIR(st.st_mode):
        raise _folder_error(path)
    if not stat.S_ISREG(st.st_mode):
        raise DocumentError(f'"{path.name}" is not a regular file (a device or pipe?). Open a document file.')
    if st.st_size > max_bytes:
        raise size_error(path, st.st_size, max_bytes)
    if st.st_size == 0 and not _has_bytes(path):  # /proc and /sys files report 0 bytes but have text: read them
        raise DocumentError(f'"{path.name}" is empty (0 bytes). Open a document with text in it.')
    return st.st_size


def _has_bytes(path: Path) -> bool:
    try:
        with path.open("rb") as fh:
            return bool(fh.read(1))
    except OSError as exc:
        raise DocumentError(f'"{path}" cannot be read ({exc.strerror or exc}). Check the path and try again.') from None


def _folder_error(path: Path) -> DocumentError:
    return DocumentError(f'"{path.name}" is a folder, not a document. Open the files inside it one by one.')


def _sniff_format(path: Path, fh: BinaryIO) -> str:
    """Unknown extension: recognize PDF/EPUB/DOCX by content, else treat as text."""
    head = fh.read(SNIFF)
    fh.seek(0)
    if head.startswith(b"%PDF-"):
        return "pdf"
    if head.startswith(b"PK\x03\x04"):
        try:
            names = set(zipfile.ZipFile(fh).namelist())
        except zipfile.BadZipFile:
            names = set()
        fh.seek(0)
        if "word/document.xml" in names:
            return "docx"
        if "META-INF/container.xml" in names:
            return "epub"
    kind = sniff_kind(head)
    if kind:
        raise DocumentError(f'"{path.name}" is {kind}, not a document. Open a {_SUPPORTED_TEXT} file.')
    return "text"


def _read(path: Path, fh: BinaryIO, fmt: str, max_bytes: int, progress=None, cancel=None) -> tuple[str, str, dict]:
    if fmt == "pdf":
        from engine.documents.pdf import read_pdf
        return read_pdf(path, fh, progress, cancel)
    if fmt == "epub":
        from engine.documents.epub import read_epub
        return read_epub(path, fh, max_bytes)
    if fmt == "docx":
        from engine.documents.word import read_docx
        return read_docx(path, fh)
    notes: list[str] = []  # e.g. "dropped 3 NUL bytes": worth telling the user, not an error
    if fmt == "html":
        raw, encoding = decode_file(path, fh, max_bytes, hint=_meta_charset(fh), notes=notes)
        text, title = html_to_text(raw)
        return clean_text(text), clean_text(title)[:200], {"encoding": encoding, **({"notes": notes} if notes else {})}
    if fmt == "text" and path.suffix.lower() not in FORMATS:
        try:
            raw, encoding = decode_file(path, fh, max_bytes, notes=notes)
        except DocumentError as exc:
            raise DocumentError(
                f'"{path.name}" has an unknown type ({path.suffix or "no extension"}) and is not readable text. '
                f"Open a {_SUPPORTED_TEXT} file.") from exc
    else:
        raw, encoding = decode_file(path, fh, max_bytes, notes=notes)
    if fmt == "markdown":
        text = clean_text(raw, keep_spaces=True)
        return text, _markdown_title(text), {"encoding": encoding, **({"notes": notes} if notes else {})}
    return clean_text(raw), "", {"encoding": encoding, **({"notes": notes} if notes else {})}


def _meta_charset(fh: BinaryIO) -> str | None:
    head = fh.read(4096)
    fh.seek(0)
    found = re.search(rb"""<meta[^>]+charset\s*=\s*["']?([A-Za-z0-9_.:-]+)""", head, re.IGNORECASE)
    return found.group(1).decode("ascii") if found else None


_ATX = re.compile(r"^ {0,3}#{1,6}[ \t]+(.+?)(?:[ \t]+#+)?[ \t]*$")


def _markdown_title(text: str) -> str:
    """The first heading (ATX `# Title` or setext underline), skipping fenced code."""
    lines = text.splitlines()[:2000]
    fenced = False
    for i, line in enumerate(lines):
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
            continue
        if fenced:
            continue
        if m := _ATX.match(line):
            return " ".join(m.group(1).split())[:200]
        if line.strip() and i + 1 < len(lines) and re.fullmatch(r" {0,3}(=+|-{2,})[ \t]*", lines[i + 1]):
            return " ".join(line.split())[:200]
    return ""


def _stem_title(path: Path) -> str:
    return re.sub(r"[_]+", " ", path.stem).strip() or path.name
