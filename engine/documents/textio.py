"""Bytes to clean text: encoding detection, streamed decoding, whitespace normalization."""
from __future__ import annotations

import codecs
import re
import unicodedata
from pathlib import Path
from typing import BinaryIO

from engine.errors import DocumentError

CHUNK = 1 << 20  # bytes per read when streaming a file
SNIFF = 64 * 1024  # bytes looked at to decide text vs binary
DETECT_SAMPLE = 1 << 20  # bytes charset-normalizer sees (it is slow on whole books)
MAX_NUL_SHARE = 0.01  # more NUL bytes than this share (outside UTF-16/32) means binary, not junk in a text

# Leading bytes of formats people rename by mistake -> what to call them in the error.
MAGIC = (
    (b"%PDF-", "a PDF"),
    (b"PK\x03\x04", "a ZIP archive (a DOCX, EPUB or similar)"),
    (b"\xd0\xcf\x11\xe0", "an old Microsoft Office file (.doc/.xls)"),
    (b"\x89PNG", "a PNG image"),
    (b"\xff\xd8\xff", "a JPEG image"),
    (b"GIF8", "a GIF image"),
    (b"\x1f\x8b", "a gzip archive"),
    (b"7z\xbc\xaf", "a 7-Zip archive"),
    (b"\x7fELF", "a program"),
)

_BOMS = (
    (codecs.BOM_UTF32_LE, "utf-32"),  # before UTF-16 LE: it starts with the same two bytes
    (codecs.BOM_UTF32_BE, "utf-32"),
    (codecs.BOM_UTF8, "utf-8-sig"),
    (codecs.BOM_UTF16_LE, "utf-16"),
    (codecs.BOM_UTF16_BE, "utf-16"),
)

# Line/paragraph separators become newlines; odd spaces become plain spaces; invisible marks go.
_TRANSLATE = {c: None for c in range(32) if c not in (9, 10, 12, 13)}
_TRANSLATE.update({0x7F: None, 0xFEFF: None, 0x200B: None, 0xAD: None})
_TRANSLATE.update({0x0B: "\n", 0x0C: "\n\n", 0x85: "\n", 0x2028: "\n", 0x2029: "\n\n"})
_TRANSLATE.update({c: " " for c in (0xA0, 0x1680, 0x202F, 0x205F, 0x3000, *range(0x2000, 0x200B))})
_ODD_CHARS = re.compile("[" + "".join(re.escape(chr(c)) for c in _TRANSLATE) + "]")
_CONTROL = re.compile(r"[\x00-\x08\x0e-\x1f\x7f]")


def sniff_kind(head: bytes) -> str | None:
    """Name a binary format from its leading bytes, or None."""
    return next((kind for magic, kind in MAGIC if head.startswith(magic)), None)


def decode_file(path: Path, fh: BinaryIO, max_bytes: int, hint: str | None = None,
                notes: list[str] | None = None) -> tuple[str, str]:
    """Decode a whole text file, streamed; returns (text, encoding).

    BOMs first, then strict UTF-8, then `hint` (e.g. an HTML <meta charset>), then
    charset-normalizer on a sample. A few NUL bytes (junk in old text files) are dropped, and
    `notes` hears one line saying so. Raises DocumentError for binary data or bytes no encoding explains.
    """
    head = fh.read(SNIFF)
    if sniff_kind(head):
        raise _binary_error(path, head)
    encoding = _bom_encoding(head)
    if encoding is None and b"\x00" in head:
        encoding = _utf16_without_bom(head)
        if encoding is None and head.count(0) > MAX_NUL_SHARE * len(head):
            raise _binary_error(path, head)
    try:
        text, nuls = _stream(fh, head, encoding or "utf-8", max_bytes, path)
        used = encoding or "utf-8"
    except UnicodeDecodeError:
        if encoding is not None:
            raise _undecodable(path, encoding) from None
        text, used, nuls = _stream_fallback(path, fh, max_bytes, hint)
    sample = text[:SNIFF]
    if nuls > MAX_NUL_SHARE * (len(text) + nuls) or (
            sample and len(_CONTROL.findall(sample)) > 0.01 * len(sample)):
        raise _binary_error(path, head)
    if nuls and notes is not None:
        notes.append(f'"{path.name}": dropped {nuls} NUL byte{"s" * (nuls != 1)} (junk, not text) '
                     f"while reading it as {used}")
    return text, used


def _stream_fallback(path: Path, fh: BinaryIO, max_bytes: int, hint: str | None) -> tuple[str, str, int]:
    # Not UTF-8: try the document's own declaration, then charset-normalizer's guess.
    fh.seek(0)
    candidates = [hint] if hint and _known_codec(hint) else []
    candidates.append(_detect(path, fh.read(DETECT_SAMPLE).replace(b"\x00", b"")))
    for encoding in candidates:
        fh.seek(0)
        try:
            text, nuls = _stream(fh, b"", encoding, max_bytes, path)
            return text, encoding, nuls
        except UnicodeDecodeError:
            continue
    raise _undecodable(path, candidates[-1])


def _known_codec(name: str) -> bool:
    try:
        return codecs.lookup(name).name not in ("utf-8", "utf-16", "utf-32")  # those already failed
    except LookupError:
        return False


def _bom_encoding(head: bytes) -> str | None:
    return next((enc for bom, enc in _BOMS if head.startswith(bom)), None)


def _utf16_without_bom(head: bytes) -> str | None:
    # UTF-16 text of mostly Latin script has a NUL in every other byte and nowhere else.
    sample = head[: len(head) // 2 * 2]
    if len(sample) < 16:
        return None
    even, odd = sample[0::2].count(0), sample[1::2].count(0)
    half = len(sample) // 2
    if odd > 0.4 * half and even == 0:
        return "utf-16-le"
    if even > 0.4 * half and odd == 0:
        return "utf-16-be"
    return None


def _stream(fh: BinaryIO, head: bytes, encoding: str, max_bytes: int, path: Path) -> tuple[str, int]:
    """(text, NUL bytes dropped). NULs are junk in every 8-bit encoding and in UTF-8 (never part of
    a multi-byte character), so they go before decoding; UTF-16/32 keep theirs."""
    decoder = codecs.getincrementaldecoder(encoding)(errors="strict")
    wide = codecs.lookup(encoding).name.startswith(("utf-16", "utf-32"))
    nuls = 0

    def drop_nuls(data: bytes) -> bytes:
        nonlocal nuls
        if wide or b"\x00" not in data:
            return data
        nuls += data.count(0)
        return data.replace(b"\x00", b"")

    parts = [decoder.decode(drop_nuls(head))]
    seen = len(head)
    while chunk := fh.read(CHUNK):
        seen += len(chunk)
        if seen > max_bytes:  # the file grew after we checked its size
            raise size_error(path, seen, max_bytes)
        parts.append(decoder.decode(drop_nuls(chunk)))
    parts.append(decoder.decode(b"", final=True))
    return "".join(parts), nuls


def _detect(path: Path, sample: bytes) -> str:
    import charset_normalizer  # imported late: its import is slow and most files are UTF-8

    # Cut at a line end so the sample does not end inside a multi-byte character.
    cut = sample.rfind(b"\n")
    if len(sample) == DETECT_SAMPLE and cut > 0:
        sample = sample[:cut]
    best = charset_normalizer.from_bytes(sample).best()
    if best is None:
        raise _binary_error(path, sample[:SNIFF])
    return _prefer_cp1252(sample, best.encoding)


# charset-normalizer often reads short Windows-1252 text (accents, smart quotes) as another
# Latin code page (cp1257, cp1250) or even big5. If cp1252 explains every byte with Western
# letters and punctuation only, it is by far the likelier source.
_WESTERN = frozenset("ÀÁÂÃÄÅÆÇÈÉÊËÌÍÎÏÑÒÓÔÕÖØÙÚÛÜÝßàáâãäåæçèéêëìíîïñòóôõöøùúûüýÿŒœŠšŽžŸ"
                     "‘’‚“”„–—…€•™°«»¿¡§©®£¢¥±·´¨ºª½¼¾²³µ¶")
_WESTERN_CONFUSABLE = ("cp1250", "cp1257", "iso8859", "latin", "mac_", "cp775", "cp850", "cp437",
                       "big5", "gb", "euc", "shift_jis", "cp932", "cp949", "johab", "hz")


def _prefer_cp1252(sample: bytes, guess: str) -> str:
    if not guess.lower().replace("-", "_").startswith(_WESTERN_CONFUSABLE):
        return guess
    try:
        decoded = sample.decode("cp1252")
    except UnicodeDecodeError:
        return guess
    return "cp1252" if {c for c in set(decoded) if ord(c) > 127} <= _WESTERN else guess


def _binary_error(path: Path, head: bytes) -> DocumentError:
    kind = sniff_kind(head)
    if kind:
        return DocumentError(
            f'"{path.name}" is not text: it is {kind} with a text extension. '
            "Rename it to its real extension (e.g. .pdf, .docx, .epub) or open the original file.")
    return DocumentError(
        f'"{path.name}" is not text: it contains binary data. '
        "Open a text, Markdown, HTML, PDF, EPUB or DOCX file instead.")


def _undecodable(path: Path, encoding: str) -> DocumentError:
    return DocumentError(
        f'"{path.name}" has bytes that are not valid {encoding} text. '
        "Re-save it as UTF-8 in a text editor and open it again.")


def size_error(path: Path, size: int, max_bytes: int) -> DocumentError:
    return DocumentError(
        f'"{path.name}" is {_mib(size)}, over the {_mib(max_bytes)} limit for documents. '
        "Split it into smaller files, or raise the maximum document size in the settings.")


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n % 2**20 else f"{n // 2**20} MiB"


def clean_text(text: str, keep_spaces: bool = False) -> str:
    """Normalize newlines and whitespace runs; keep paragraph breaks (at most one blank line).

    keep_spaces keeps runs of spaces and tabs inside lines (Markdown code blocks and tables).
    """
    text = unicodedata.normalize("NFC", text.replace("\r\n", "\n").replace("\r", "\n"))
    # str.translate is slow on non-ASCII text (~7 s for a 20 MB book); a regex over the rare hits is not.
    text = _ODD_CHARS.sub(lambda m: _TRANSLATE[ord(m.group())] or "", text)
    # Plain str methods and guarded regexes: a 20 MB book must clean in well under a second.
    if keep_spaces:
        text = "\n".join(line.rstrip() for line in text.split("\n"))
    else:
        text = text.replace("\t", " ")
        if "  " in text:
            text = re.sub(" {2,}", " ", text)
        text = "\n".join(line.strip(" ") for line in text.split("\n"))
    if "\n\n\n" in text:
        text = re.sub(r"\n{3,}", "\n\n", text)
    return text.strip("\n").rstrip() if keep_spaces else text.strip()
