"""read_document: every format from files made here, and every bad input with its advice."""
from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from engine.documents import read_document, text_sha256
from engine.errors import DocumentError, ReadCancelled

WESTERN = ("The café’s “special” was crème brûlée — naïve, but déjà vu for everyone. "
           "It’s 5 € a slice, and the Straße to the Brücke is long.\n\n"
           "Second paragraph: Ça va très bien, merci. Où est la bibliothèque?\n")


def write(path: Path, data: bytes | str) -> Path:
    path.write_bytes(data.encode("utf-8") if isinstance(data, str) else data)
    return path


# -- plain text, Markdown, HTML -----------------------------------------------------------

def test_utf8_text_is_cleaned_and_keeps_paragraphs(tmp_path):
    path = write(tmp_path / "my_book.txt", "  Line one   has\truns  \r\nline two\r\n\r\n\r\n\r\nNext\u00a0para \n")
    doc = read_document(path)
    assert doc.text == "Line one has runs\nline two\n\nNext para"
    assert doc.title == "my book"
    assert doc.meta["format"] == "text" and doc.meta["encoding"] == "utf-8"
    assert doc.meta["bytes"] == path.stat().st_size
    assert doc.meta["sha256"] == text_sha256(doc.text)
    assert doc.source == str(path.absolute())


@pytest.mark.parametrize("encoding", ["cp1252", "utf-16", "utf-8-sig", "utf-16-le"])
def test_legacy_and_bom_encodings(tmp_path, encoding):
    doc = read_document(write(tmp_path / "w.txt", WESTERN.encode(encoding)))
    assert doc.text == WESTERN.strip()


def test_cyrillic_cp1251(tmp_path):
    text = "Привет, как дела? Это длинный текст в старой кодировке Windows, его надо прочитать. " * 3
    doc = read_document(write(tmp_path / "ru.txt", text.encode("cp1251")))
    assert doc.text == text.strip() and doc.meta["encoding"] == "cp1251"


def test_markdown_keeps_markup_and_takes_first_heading(tmp_path):
    md = "```\n# not a title\n```\n\nIntro  text\n\n## The   Real Title ##\n\n    code   block\n\n- item\n"
    doc = read_document(write(tmp_path / "notes.md", md))
    assert doc.title == "The Real Title"
    assert "Intro  text\n\n## The   Real Title ##\n\n    code   block\n\n- item" in doc.text
    assert doc.meta["format"] == "markdown"


def test_markdown_setext_heading(tmp_path):
    doc = read_document(write(tmp_path / "s.markdown", "Big Title\n=========\n\nbody\n"))
    assert doc.title == "Big Title"


def test_html_skips_script_and_style(tmp_path):
    html = """<!DOCTYPE html><html><head><meta charset="windows-1252"><title>The  Page</title>
    <style>p { color: red }</style><script>alert("no")</script></head><body>
    <h1>Heading</h1><p>First   <b>bold</b>
    paragraph &amp; more.</p><ul><li>one</li><li>two</li></ul>
    <table><tr><th>k</th><th>v</th></tr><tr><td>a</td><td>1</td></tr></table>
    <p>caf\xe9<br>next line</p><noscript>hidden</noscript></body></html>"""
    doc = read_document(write(tmp_path / "page.html", html.encode("cp1252")))
    assert doc.title == "The Page"
    assert doc.text == ("Heading\n\nFirst bold paragraph & more.\n\n- one\n- two\n\nk | v\na | 1\n\ncafé\nnext line")
    assert doc.meta["encoding"] == "windows-1252"


def test_html_title_falls_back_to_first_heading(tmp_path):
    doc = read_document(write(tmp_path / "p.htm", "<body><h2>Only heading</h2><p>x</p></body>"))
    assert doc.title == "Only heading"


def test_unknown_extension_read_as_text_when_it_decodes(tmp_path):
    doc = read_document(write(tmp_path / "README", "plain words\n"))
    assert doc.text == "plain words" and doc.meta["format"] == "text"


def test_big_text_file_streams(tmp_path):
    line = "It was the best of times, it was the worst of times, it was the age of wisdom.\n"
    path = write(tmp_path / "big.txt", line * (20 * 2**20 // len(line)))
    doc = read_document(path)
    assert doc.meta["bytes"] >= 19 * 2**20
    assert doc.text.startswith("It was the best") and doc.text.count("\n") == 20 * 2**20 // len(line) - 1


# -- PDF, EPUB, DOCX ----------------------------------------------------------------------

def make_pdf(path: Path, pages: list[str], title: str | None = None, scanned: bool = False) -> Path:
    from fpdf import FPDF

    pdf = FPDF()
    pdf.set_font("helvetica", size=12)
    if title:
        pdf.set_title(title)
    for text in pages:
        pdf.add_page()
        if scanned:
            pdf.rect(20, 20, 100, 60, style="F")
        else:
            pdf.multi_cell(0, 8, text)
    pdf.output(str(path))
    return path


def test_pdf_pages_and_metadata_title(tmp_path):
    path = make_pdf(tmp_path / "book.pdf", ["First page text.", "Second page text."], title="A PDF Book")
    doc = read_document(path)
    assert doc.title == "A PDF Book"
    assert doc.text == "First page text.\n\nSecond page text."
    assert doc.meta["pages"] == 2 and doc.meta["format"] == "pdf"


def test_pdf_reports_each_page_and_stops_when_cancelled(tmp_path):
    path = make_pdf(tmp_path / "manual.pdf", [f"Page {i} of the manual." for i in range(1, 6)])
    seen: list[tuple[int, int]] = []
    doc = read_document(path, progress=lambda done, total: seen.append((done, total)))
    assert seen == [(i, 5) for i in range(1, 6)] and doc.meta["pages"] == 5
    seen.clear()
    with pytest.raises(ReadCancelled):
        read_document(path, progress=lambda done, total: seen.append((done, total)), cancel=lambda: len(seen) >= 2)
    assert seen == [(1, 5), (2, 5)]  # stopped before the third page


def test_pdf_title_from_first_line(tmp_path):
    doc = read_document(make_pdf(tmp_path / "t.pdf", ["Opening line\nmore"]))
    assert doc.title == "Opening line"


def test_encrypted_pdf(tmp_path):
    from pypdf import PdfReader, PdfWriter

    plain = make_pdf(tmp_path / "plain.pdf", ["secret text"])
    writer = PdfWriter()
    for page in PdfReader(plain).pages:
        writer.add_page(page)
    writer.encrypt("pw")
    with open(tmp_path / "locked.pdf", "wb") as fh:
        writer.write(fh)
    with pytest.raises(DocumentError, match="encrypted.*locked.pdf|locked.pdf.*encrypted") as err:
        read_document(tmp_path / "locked.pdf")
    assert "Decrypt it" in str(err.value)


def test_pdf_with_empty_user_password_opens(tmp_path):
    from pypdf import PdfReader, PdfWriter

    writer = PdfWriter()
    for page in PdfReader(make_pdf(tmp_path / "p.pdf", ["owner only"])).pages:
        writer.add_page(page)
    writer.encrypt("", owner_password="owner")
    with open(tmp_path / "restricted.pdf", "wb") as fh:
        writer.write(fh)
    assert read_document(tmp_path / "restricted.pdf").text == "owner only"


def test_scanned_pdf_suggests_ocr(tmp_path):
    path = make_pdf(tmp_path / "scan.pdf", ["", ""], scanned=True)
    with pytest.raises(DocumentError, match="scan.pdf.*no text layer.*OCR"):
        read_document(path)


def test_corrupt_pdf(tmp_path):
    with pytest.raises(DocumentError, match="bad.pdf.*damaged PDF"):
        read_document(write(tmp_path / "bad.pdf", b"%PDF-1.7\n" + bytes(range(256)) * 8))


def make_epub(path: Path, chapters: dict[str, str], title: str = "An EPUB Book", spine: list[str] | None = None) -> Path:
    manifest = "".join(f'<item id="{n}" href="text/{n}.xhtml" media-type="application/xhtml+xml"/>' for n in chapters)
    itemrefs = "".join(f'<itemref idref="{n}"/>' for n in (spine or list(chapters)))
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("mimetype", "application/epub+zip", compress_type=zipfile.ZIP_STORED)
        zf.writestr("META-INF/container.xml",
                    '<?xml version="1.0"?><container version="1.0" xmlns="urn:oasis:names:tc:opendocument:xmlns:container">'
                    '<rootfiles><rootfile full-path="OEBPS/content.opf" media-type="application/oebps-package+xml"/>'
                    "</rootfiles></container>")
        zf.writestr("OEBPS/content.opf",
                    '<?xml version="1.0"?><package xmlns="http://www.idpf.org/2007/opf" version="3.0">'
                    f'<metadata xmlns:dc="http://purl.org/dc/elements/1.1/"><dc:title>{title}</dc:title></metadata>'
                    f"<manifest>{manifest}</manifest><spine>{itemrefs}</spine></package>")
        for name, body in chapters.items():
            zf.writestr(f"OEBPS/text/{name}.xhtml",
                        '<?xml version="1.0" encoding="utf-8"?><html xmlns="http://www.w3.org/1999/xhtml">'
                        f"<head><title>{name}</title><style>x{{}}</style></head><body>{body}</body></html>")
    return path


def test_epub_follows_spine_order(tmp_path):
    path = make_epub(tmp_path / "b.epub", {"c1": "<h1>One</h1><p>Alpha  text.</p>", "c2": "<p>Beta.</p>"},
                     spine=["c2", "c1"])
    doc = read_document(path)
    assert doc.title == "An EPUB Book"
    assert doc.text == "Beta.\n\nOne\n\nAlpha text."
    assert doc.meta["chapters"] == 2 and doc.meta["format"] == "epub"


def test_corrupt_epub(tmp_path):
    good = make_epub(tmp_path / "g.epub", {"c1": "<p>x</p>"}).read_bytes()
    with pytest.raises(DocumentError, match="cut.epub.*damaged EPUB"):
        read_document(write(tmp_path / "cut.epub", good[: len(good) // 2]))
    with zipfile.ZipFile(tmp_path / "nocontainer.epub", "w") as zf:
        zf.writestr("mimetype", "application/epub+zip")
    with pytest.raises(DocumentError, match="damaged EPUB"):
        read_document(tmp_path / "nocontainer.epub")


def test_drm_epub_is_refused(tmp_path):
    path = make_epub(tmp_path / "drm.epub", {"c1": "<p>x</p>"})
    with zipfile.ZipFile(path, "a") as zf:
        zf.writestr("META-INF/encryption.xml",
                    '<encryption xmlns="urn:oasis:names:tc:opendocument:xmlns:container" '
                    'xmlns:enc="http://www.w3.org/2001/04/xmlenc#"><enc:EncryptedData><enc:CipherData>'
                    '<enc:CipherReference URI="OEBPS/text/c1.xhtml"/></enc:CipherData></enc:EncryptedData></encryption>')
    with pytest.raises(DocumentError, match="drm.epub.*DRM-protected"):
        read_document(path)


def make_docx(path: Path) -> Path:
    import docx

    document = docx.Document()
    document.add_heading("Contract   Terms", level=1)
    document.add_paragraph("Before the table.")
    table = document.add_table(rows=2, cols=3)
    for r, row in enumerate([["Name", "Qty", "Price"], ["Widget", "2", "3.50"]]):
        for c, value in enumerate(row):
            table.cell(r, c).text = value
    document.add_paragraph("After the table.")
    document.save(str(path))
    return path


def test_docx_paragraphs_and_tables_in_order(tmp_path):
    doc = read_document(make_docx(tmp_path / "c.docx"))
    assert doc.text == ("Contract Terms\n\nBefore the table.\n\nName | Qty | Price\nWidget | 2 | 3.50\n\n"
                        "After the table.")
    assert doc.title == "Contract Terms"
    assert doc.meta["tables"] == 1 and doc.meta["format"] == "docx"


def test_corrupt_docx(tmp_path):
    with pytest.raises(DocumentError, match="bad.docx.*damaged"):
        read_document(write(tmp_path / "bad.docx", b"PK\x03\x04 this is not really a zip"))


def test_content_sniffed_when_extension_unknown(tmp_path):
    docx_bytes = make_docx(tmp_path / "c.docx").read_bytes()
    assert read_document(write(tmp_path / "download", docx_bytes)).meta["format"] == "docx"
    pdf_bytes = make_pdf(tmp_path / "p.pdf", ["sniffed"]).read_bytes()
    assert read_document(write(tmp_path / "file.bin", pdf_bytes)).text == "sniffed"


# -- bad input ----------------------------------------------------------------------------

def test_binary_renamed_txt(tmp_path):
    with pytest.raises(DocumentError, match="data.txt.*not text.*binary"):
        read_document(write(tmp_path / "data.txt", bytes(range(256)) * 64))


def test_pdf_renamed_txt_names_the_real_type(tmp_path):
    pdf_bytes = make_pdf(tmp_path / "p.pdf", ["x"]).read_bytes()
    with pytest.raises(DocumentError, match="notes.txt.*a PDF.*Rename"):
        read_document(write(tmp_path / "notes.txt", pdf_bytes))


def test_empty_file_and_whitespace_only(tmp_path):
    with pytest.raises(DocumentError, match="e.txt.*empty"):
        read_document(write(tmp_path / "e.txt", b""))
    with pytest.raises(DocumentError, match="w.md.*no text"):
        read_document(write(tmp_path / "w.md", " \n\t\n  \n"))


def test_over_size_limit_says_size_limit_and_how_to_raise(tmp_path):
    path = write(tmp_path / "huge.txt", b"a" * (3 * 2**20 + 2**19))
    with pytest.raises(DocumentError, match=r"huge.txt.*3.5 MiB.*over the 2 MiB limit.*raise the maximum"):
        read_document(path, max_bytes=2 * 2**20)


def test_missing_path_and_directory(tmp_path):
    with pytest.raises(DocumentError, match="nothere.txt.*does not exist"):
        read_document(tmp_path / "nothere.txt")
    (tmp_path / "folder.txt").mkdir()
    with pytest.raises(DocumentError, match="folder.txt.*is a folder"):
        read_document(tmp_path / "folder.txt")


def test_file_vanishing_while_opened(tmp_path, monkeypatch):
    path = write(tmp_path / "gone.txt", "soon gone")
    real_open = Path.open

    def vanish_then_open(self, *args, **kwargs):
        if self == path:
            self.unlink()
        return real_open(self, *args, **kwargs)

    monkeypatch.setattr(Path, "open", vanish_then_open)
    with pytest.raises(DocumentError, match="gone.txt.*disappeared"):
        read_document(path)


def test_undecodable_bytes_after_bom(tmp_path):
    # A UTF-8 BOM promises UTF-8, but the rest is not.
    with pytest.raises(DocumentError, match="bom.txt.*not valid utf-8.*UTF-8"):
        read_document(write(tmp_path / "bom.txt", b"\xef\xbb\xbfok then \xff\xfe\xfa bad"))


def test_unknown_extension_binary(tmp_path):
    with pytest.raises(DocumentError, match=r"blob.xyz.*unknown type \(.xyz\)"):
        read_document(write(tmp_path / "blob.xyz", bytes(range(256)) * 64))


def test_known_unsupported_extension(tmp_path):
    with pytest.raises(DocumentError, match=r"old.doc.*\.docx"):
        read_document(write(tmp_path / "old.doc", b"\xd0\xcf\x11\xe0rest"))


def test_latin1_text_with_a_few_nul_bytes_loads_and_says_so(tmp_path):
    # old DOS/Windows texts carry stray NUL padding: read them with the junk dropped, not refused as binary
    body = (WESTERN.replace("’", "'").replace("“", '"').replace("”", '"').replace("—", "-").replace("€", "EUR") * 20)
    raw = body.encode("latin-1")
    raw = raw[:100] + b"\x00\x00" + raw[100:900] + b"\x00" + raw[900:]
    doc = read_document(write(tmp_path / "old.txt", raw))
    assert "\x00" not in doc.text and "crème brûlée" in doc.text
    assert doc.meta["encoding"] in ("cp1252", "latin-1", "iso8859-1", "iso-8859-1")
    assert doc.meta["notes"] == ['"old.txt": dropped 3 NUL bytes (junk, not text) while reading it as '
                                 f'{doc.meta["encoding"]}']
    clean = read_document(write(tmp_path / "clean.txt", body.encode("latin-1")))
    assert "notes" not in clean.meta and clean.text == doc.text


def test_nul_bytes_beyond_a_few_are_binary(tmp_path):
    with pytest.raises(DocumentError, match="many.txt.*not text.*binary"):
        read_document(write(tmp_path / "many.txt", (b"word \x00" * 4000)))


def test_damaged_pdf_prints_nothing_but_our_error(tmp_path):
    # a fresh interpreter: pytest's own log capture would hide what a terminal shows
    import subprocess
    import sys

    good = make_pdf(tmp_path / "good.pdf", ["Some text"]).read_bytes()
    at = good.rfind(b"startxref")
    bad = [write(tmp_path / "badxref.pdf", good[:at] + b"startxref\n12\n%%EOF\n"),
           write(tmp_path / "cut.pdf", good[: len(good) // 2])]
    script = ("import sys\nfrom engine.documents import read_document\nfrom engine.errors import DocumentError\n"
              "for p in sys.argv[1:]:\n    try:\n        read_document(p)\n"
              "    except DocumentError as e:\n        print('error:', e)\n")
    run = subprocess.run([sys.executable, "-c", script, *map(str, bad)], capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parent.parent, timeout=120)
    assert run.stderr == ""  # pypdf's "incorrect startxref pointer" and friends stay quiet
    assert run.stdout.count("error:") == 1 and "cut.pdf" in run.stdout  # the readable one reads despite its flaw
