"""EPUB to text, reading the zip ourselves: container.xml -> OPF -> spine order -> XHTML."""
from __future__ import annotations

import posixpath
import zipfile
from pathlib import Path
from typing import BinaryIO
from urllib.parse import unquote
from xml.etree import ElementTree

from engine.documents.markup import html_to_text
from engine.documents.textio import clean_text, size_error
from engine.errors import DocumentError

_HTML_TYPES = ("application/xhtml+xml", "text/html")


def read_epub(path: Path, fh: BinaryIO, max_bytes: int) -> tuple[str, str, dict]:
    """Return (text, title, meta) of an EPUB: chapters in reading order, blank line between."""
    try:
        with zipfile.ZipFile(fh) as zf:
            opf_path = _rootfile(zf)
            opf = _xml(zf, opf_path)
            _refuse_drm(path, zf)
            chapters = _spine(opf, posixpath.dirname(opf_path), zf)
            total = sum(zf.getinfo(name).file_size for name in chapters)
            if total > 4 * max_bytes:  # a zip bomb, or a book far past the document limit
                raise size_error(path, total, 4 * max_bytes)
            parsed = [html_to_text(_decode(zf.read(name))) for name in chapters]  # (text, title) each
    except DocumentError:
        raise
    except (zipfile.BadZipFile, KeyError, ElementTree.ParseError, EOFError, ValueError) as exc:
        raise DocumentError(
            f'"{path.name}" is a damaged EPUB ({type(exc).__name__}: {exc}). '
            "Download or export the book again, or convert it to PDF or text and open that.") from exc
    texts = [(clean_text(t), clean_text(title)) for t, title in parsed]
    text = "\n\n".join(t for t, _ in texts if t)
    sections, offset = [], 0  # (label, start offset) per chapter: passages keep chapter boundaries
    titles = [title for chapter, title in texts if chapter]
    for number, (chapter, title) in enumerate((c for c in texts if c[0]), 1):
        # many books repeat the book's title in every chapter's <title>: number those instead
        sections.append((title[:80] if title and titles.count(title) == 1 else f"chapter {number}", offset))
        offset += len(chapter) + 2
    if not text:
        raise DocumentError(f'"{path.name}" contains no text (an EPUB of images only?). Open a text version.')
    title = _dc_title(opf) or next(line for line in text.splitlines() if line.strip())[:200]
    return text, title, {"chapters": len(chapters), "sections": sections}


def _xml(zf: zipfile.ZipFile, name: str) -> ElementTree.Element:
    return ElementTree.fromstring(zf.read(name))


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def _rootfile(zf: zipfile.ZipFile) -> str:
    container = _xml(zf, "META-INF/container.xml")
    for el in container.iter():
        if _local(el.tag) == "rootfile" and el.get("full-path"):
            return el.get("full-path")
    raise ValueError("META-INF/container.xml names no rootfile")


def _spine(opf: ElementTree.Element, base: str, zf: zipfile.ZipFile) -> list[str]:
    manifest = {}
    for el in opf.iter():
        if _local(el.tag) == "item" and el.get("id") and el.get("href"):
            manifest[el.get("id")] = (el.get("href"), el.get("media-type", ""))
    names = set(zf.namelist())
    chapters = []
    for el in opf.iter():
        if _local(el.tag) != "itemref" or el.get("idref") not in manifest:
            continue
        href, media = manifest[el.get("idref")]
        name = posixpath.normpath(posixpath.join(base, unquote(href.split("#", 1)[0])))
        if name in names and (media in _HTML_TYPES or name.lower().endswith((".xhtml", ".html", ".htm"))):
            chapters.append(name)
    if not chapters:
        raise ValueError("the spine lists no readable chapters")
    return chapters


def _refuse_drm(path: Path, zf: zipfile.ZipFile) -> None:
    # encryption.xml also lists obfuscated fonts (harmless); DRM encrypts the chapters themselves.
    if "META-INF/encryption.xml" not in zf.namelist():
        return
    for el in _xml(zf, "META-INF/encryption.xml").iter():
        uri = el.get("URI", "") if _local(el.tag) == "CipherReference" else ""
        if uri.lower().endswith((".xhtml", ".html", ".htm")):
            raise DocumentError(
                f'"{path.name}" is DRM-protected: its chapters are encrypted. '
                "Open a DRM-free copy of the book (or a PDF/text export you are allowed to make).")


def _dc_title(opf: ElementTree.Element) -> str:
    for el in opf.iter():
        if _local(el.tag) == "title" and "purl.org/dc" in el.tag and (el.text or "").strip():
            return clean_text(el.text)
    return ""


def _decode(data: bytes) -> str:
    # XHTML in EPUBs is UTF-8 (or UTF-16 with a BOM) by the spec.
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        return data.decode("utf-16")
    return data.decode("utf-8-sig", errors="replace")
