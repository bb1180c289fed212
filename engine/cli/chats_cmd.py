"""`main.py chats`: list stored chats, or export one as Markdown or JSON.

    main.py chats [--search TEXT]
    main.py chats --export ID [--format md|json] [--out FILE] [--with-documents]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import datetime
from pathlib import Path

from engine.api import ChatStore, ChatSummary
from engine.cli import validate as v
from engine.errors import StoreError


def register(subparsers) -> None:
    parser = subparsers.add_parser("chats", help="list stored chats, or export one as Markdown or JSON")
    parser.add_argument("--search", metavar="TEXT", help="only chats whose title or messages contain TEXT")
    parser.add_argument("--export", metavar="ID", type=v.ROW_ID, help="export the chat with this id")
    parser.add_argument("--format", choices=("md", "json"), default="md", help="export format (default: md)")
    parser.add_argument("--out", metavar="FILE", type=v.text, help="write the export to FILE instead of stdout")
    parser.add_argument("--with-documents", action="store_true", help="JSON export: include the documents' text")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    store = ChatStore()
    try:
        if args.export is None:
            print(format_chats(store.list_chats(args.search), store.path, args.search))
            return 0
        if args.format == "json":
            text = json.dumps(store.export_json(args.export, include_document_text=args.with_documents),
                              indent=2, ensure_ascii=False) + "\n"
        else:
            text = store.export_markdown(args.export)
    finally:
        store.close()
    if args.out is None:
        sys.stdout.write(text)
    else:
        _write(Path(args.out), text)
        print(f"wrote chat {args.export} to {args.out}", file=sys.stderr)
    return 0


def format_chats(chats: list[ChatSummary], path: Path, search: str | None = None) -> str:
    """A plain table: id, last update (local time), message count, title."""
    if not chats:
        return f"no chats matching {search!r}" if search else f"no chats yet (store: {path})"
    width = max(2, *(len(str(c.id)) for c in chats))
    lines = [f"{'ID':>{width}}  {'UPDATED':16}  {'MSGS':>4}  TITLE"]
    for c in chats:
        updated = datetime.fromtimestamp(c.updated).strftime("%Y-%m-%d %H:%M")
        lines.append(f"{c.id:>{width}}  {updated:16}  {c.message_count:>4}  {c.title}")
    return "\n".join(lines)


def _write(path: Path, text: str) -> None:
    # Write-then-rename: an interrupted export never leaves half a file under the real name.
    temp = path.with_name(f".{path.name}.tmp")
    try:
        temp.write_text(text, encoding="utf-8")
        os.replace(temp, path)
    except OSError as exc:
        temp.unlink(missing_ok=True)
        raise StoreError(f"Cannot write {path} ({exc.strerror or exc}). Check the folder exists and is writable.") from None
