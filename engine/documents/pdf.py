"""PDF to text with pypdf: pages joined by blank lines; scanned and encrypted files get clear errors."""
from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import BinaryIO, Callable

from engine.documents.textio import clean_text
from engine.errors import DocumentError, ReadCancelled

PageProgress = Callable[[int, int], None]  # (pages done, pages in the file)


def read_pdf(path: Path, fh: BinaryIO, progress: PageProgress | None = None,
             cancel: Callable[[], bool] | None = None) -> tuple[str, str, dict]:
    """Return (text, title, meta) of a PDF; pages are separated by a blank line. A long PDF takes
    a while (pypdf reads ~10-50 pages/s): `progress` hears each page, `cancel` is checked before
    each one (True raises ReadCancelled)."""
    from pypdf import PasswordType, PdfReader
    from pypdf.errors import DependencyError

    _quiet_pypdf()
    try:
        reader = PdfReader(fh)
        if reader.is_encrypted:
            # Many PDFs are "encrypted" with an empty user password (only editing is restricted).
            try:
                opened = reader.decrypt("")
            except DependencyError:
                opened = PasswordType.NOT_DECRYPTED
            if opened == PasswordType.NOT_DECRYPTED:
                raise DocumentError(
                    f'"{path.name}" is an encrypted (password-protected) PDF. Decrypt it first, e.g. '
                    "open it in a PDF viewer and save or print an unprotected copy, or run "
                    "`qpdf --decrypt --password=... in.pdf out.pdf`, then open that copy.")
        pages = []
        total = len(reader.pages)
        for page in reader.pages:
            if cancel is not None and cancel():
                raise ReadCancelled(f"reading {path.name} was cancelled")
            pages.append(clean_text(page.extract_text() or ""))
            if progress is not None:
                progress(len(pages), total)
        title = _metadata_title(reader)
    except (DocumentError, ReadCancelled):
        raise
    except Exception as exc:  # pypdf raises many types on malformed input; none of them is our bug
        raise DocumentError(
            f'"{path.name}" is a damaged PDF that cannot be read ({type(exc).__name__}: {exc}). '
            "Open it in a PDF viewer and save a new copy, or export the text another way.") from exc
    text = "\n\n".join(p for p in pages if p)
    sections, offset = [], 0  # (label, start offset) per page with text: passages keep page boundaries
    for number, page in enumerate(pages, 1):
        if page:
            sections.append((f"page {number}", offset))
            offset += len(page) + 2
    if not text:
        raise DocumentError(
            f'"{path.name}" has no text layer ({len(pages)} page(s) of images only: a scanned document?). '
            "Run it through OCR first (e.g. `ocrmypdf in.pdf out.pdf`) and open the result.")
    if not title:
        title = next(line.strip() for line in text.splitlines() if line.strip())[:200]
    return text, title, {"pages": len(pages), "empty_pages": sum(1 for p in pages if not p), "sections": sections}


def _quiet_pypdf() -> None:
    """pypdf logs and warns about every flaw it works around ("incorrect startxref pointer"): on a
    terminal that lands before our own one-line error, or as noise above a document that read fine.
    Our messages say what matters; pypdf's go nowhere (a NullHandler, or Python's last-resort
    handler would still print them)."""
    logger = logging.getLogger("pypdf")
    if not any(isinstance(h, logging.NullHandler) for h in logger.handlers):
        logger.addHandler(logging.NullHandler())
        logger.propagate = False
    from pypdf.errors import PdfReadWarning

    warnings.filterwarnings("ignore", category=PdfReadWarning)  # pypdf warns with stacklevel: match by type
    warnings.filterwarnings("ignore", module=r"pypdf(\.|$)")


def _metadata_title(reader) -> str:
    try:
        title = reader.metadata.title if reader.metadata else None
    except Exception:  # a broken info dictionary must not lose the text
        return ""
    return clean_text(str(title)) if title and str(title).strip() else ""
