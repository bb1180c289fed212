"""DOCX to text with python-docx: paragraphs and tables in document order."""
from __future__ import annotations

from pathlib import Path
from typing import BinaryIO

from engine.documents.textio import clean_text
from engine.errors import DocumentError


def read_docx(path: Path, fh: BinaryIO) -> tuple[str, str, dict]:
    """Return (text, title, meta); table rows become `cell | cell | cell` lines."""
    import docx
    from docx.table import Table

    try:
        document = docx.Document(fh)
        blocks: list[str] = []
        heading = ""
        tables = 0
        for block in document.iter_inner_content():
            if isinstance(block, Table):
                tables += 1
                blocks.append(_table_text(block))
                continue
            text = block.text
            style = (block.style.name if block.style is not None else "") or ""
            if not heading and text.strip() and style.startswith(("Title", "Heading")):
                heading = text
            blocks.append(text)
        title = document.core_properties.title or heading
    except Exception as exc:  # python-docx/lxml raise many types on malformed files; not our bug
        raise DocumentError(
            f'"{path.name}" is a damaged or unsupported DOCX ({type(exc).__name__}: {exc}). '
            "Open it in Word or LibreOffice and save it again as .docx, or export it to PDF.") from exc
    # Paragraphs are separate blocks: a blank line between them, as in the other formats.
    text = clean_text("\n\n".join(blocks))
    if not text:
        raise DocumentError(f'"{path.name}" contains no text. Open a document with text in it.')
    title = clean_text(title) if title and title.strip() else next(line for line in text.splitlines() if line)
    return text, title[:200], {"tables": tables}


def _table_text(table) -> str:
    rows = []
    for row in table.rows:
        cells, last = [], None
        for cell in row.cells:
            if cell._tc is last:  # a merged cell repeats once per grid column it spans
                continue
            last = cell._tc
            cells.append(" ".join(cell.text.split()))
        rows.append(" | ".join(cells))
    return "\n".join(rows)
