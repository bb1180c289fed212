"""The bad-input table: each case runs `main.py` in a subprocess and must fail cleanly.

Clean means: exit code 2 and exactly one line on stderr, starting `error:` (no traceback, no
library's own warning before it). A few inputs are not errors but odd files we read anyway;
those must exit 0 and say what we did in one `note:` line.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Case:
    name: str
    argv: Callable[["Files"], list[str]]  # the command line, given the prepared files
    env: Callable[["Files"], dict[str, str]] = lambda f: {}
    expect: str = "error"  # "error": exit 2 + one `error:` line; "note": exit 0 + a `note:` line
    quick: bool = False  # part of the small version run by the test suite


@dataclass
class Files:
    """The inputs the cases point at, made once in `root`."""

    root: Path
    model: Path  # a working model folder
    paths: dict[str, Path] = field(default_factory=dict)

    def __getitem__(self, name: str) -> str:
        return str(self.paths[name])


def make_files(root: Path, model: Path) -> Files:
    """Write every broken input the table uses into `root`."""
    from fpdf import FPDF

    root.mkdir(parents=True, exist_ok=True)
    files = Files(root, model)
    p = files.paths
    p["file"] = root / "a-file"
    p["file"].write_text("not a folder")
    p["below_file"] = p["file"] / "home"
    p["home"] = root / "home"
    bad_types = root / "model-bad-types"
    shutil.copytree(model, bad_types, dirs_exist_ok=True)
    config = json.loads((model / "config.json").read_text(encoding="utf-8"))
    (bad_types / "config.json").write_text(json.dumps({**config, "hidden_size": "big", "num_hidden_layers": [2]}))
    p["bad_types"] = bad_types
    bad_json = root / "model-bad-json"
    shutil.copytree(model, bad_json, dirs_exist_ok=True)
    (bad_json / "config.json").write_text('{"hidden_size": 64,')
    p["bad_json"] = bad_json
    pdf = FPDF()
    pdf.set_font("helvetica", size=12)
    pdf.add_page()
    pdf.multi_cell(0, 8, "A page of text. " * 20)
    good = bytes(pdf.output())
    p["cut_pdf"] = root / "cut.pdf"
    p["cut_pdf"].write_bytes(good[: len(good) // 2])
    p["garbage_pdf"] = root / "garbage.pdf"
    p["garbage_pdf"].write_bytes(b"%PDF-1.4\n" + os.urandom(4000))
    body = "Caf\u00e9 cr\u00e8me br\u00fbl\u00e9e, na\u00efve fa\u00e7ade, \u00e0 la carte. " * 60
    raw = body.encode("latin-1")
    p["nul_latin1"] = root / "old-latin1.txt"
    p["nul_latin1"].write_bytes(raw[:200] + b"\x00\x00" + raw[200:1500] + b"\x00" + raw[1500:])
    p["binary_txt"] = root / "data.txt"
    p["binary_txt"].write_bytes(bytes(range(256)) * 64)
    p["empty_txt"] = root / "empty.txt"
    p["empty_txt"].write_bytes(b"")
    p["gguf"] = root / "broken.gguf"
    p["gguf"].write_bytes(b"GGUF" + os.urandom(2000))
    return files


def _chat(*extra: str, model: str | None = None) -> Callable[[Files], list[str]]:
    return lambda f: ["chat", "--model", model or str(f.model), "--ask", "hi", "--max-new-tokens", "4",
                      "--device", "cpu", *extra]


CASES: tuple[Case, ...] = (
    # settings out of range (were a ZeroDivisionError, or silently replaced by the defaults)
    Case("chat --chunk 0", _chat("--chunk", "0"), quick=True),
    Case("chat --gamma1 0", _chat("--gamma1", "0"), quick=True),
    Case("chat --gamma2 0", _chat("--gamma2", "0")),
    Case("chat --budget 7 (not 2 chunks)", _chat("--budget", "7")),
    Case("chat --max-new-tokens 0", _chat("--max-new-tokens", "0")),
    Case("chat --temperature -1", _chat("--temperature", "-1")),
    Case("chat --top-p 0", _chat("--top-p", "0")),
    # argparse: one line and a hint to use --help
    Case("chat --chunk x", _chat("--chunk", "x"), quick=True),
    Case("chat --mode bogus", _chat("--mode", "bogus")),
    Case("chat without --ask", lambda f: ["chat", "--model", str(f.model)]),
    Case("unknown option", lambda f: ["models", "--bogus"]),
    Case("unknown command", lambda f: ["frobnicate"]),
    # the app home
    Case("TRIFORCE_HOME is a file", _chat(), env=lambda f: {"TRIFORCE_HOME": f["file"]}, quick=True),
    Case("TRIFORCE_HOME below a file", _chat(), env=lambda f: {"TRIFORCE_HOME": f["below_file"]}),
    Case("chats with TRIFORCE_HOME a file", lambda f: ["chats"], env=lambda f: {"TRIFORCE_HOME": f["file"]}),
    # models
    Case("--model config.json with wrong types", lambda f: _chat(model=f["bad_types"])(f)),
    Case("--model config.json not JSON", lambda f: _chat(model=f["bad_json"])(f)),
    Case("--model missing folder", lambda f: _chat(model=str(f.root / "no-such-model"))(f)),
    Case("--model broken .gguf", lambda f: _chat(model=f["gguf"])(f)),
    # documents
    Case("--doc damaged PDF (cut)", lambda f: _chat("--doc", f["cut_pdf"])(f), quick=True),
    Case("--doc garbage PDF", lambda f: _chat("--doc", f["garbage_pdf"])(f)),
    Case("--doc binary .txt", lambda f: _chat("--doc", f["binary_txt"])(f)),
    Case("--doc empty .txt", lambda f: _chat("--doc", f["empty_txt"])(f)),
    Case("--doc missing file", lambda f: _chat("--doc", str(f.root / "nope.txt"))(f)),
    Case("--doc a folder", lambda f: _chat("--doc", str(f.root))(f)),
    Case("--chat 999 (no such chat)", _chat("--chat", "999")),
    Case("chats --export 999", lambda f: ["chats", "--export", "999"]),
    # read anyway, and say so
    Case("--doc latin-1 text with NUL bytes", lambda f: _chat("--doc", f["nul_latin1"], "--no-save")(f), expect="note"),
)


@dataclass(frozen=True)
class Outcome:
    case: Case
    clean: bool
    returncode: int
    stderr: str


def run_case(case: Case, files: Files, timeout: float = 300) -> Outcome:
    """Run one case in a fresh process with its own app home; judge it."""
    env = {**os.environ, "TRIFORCE_HOME": str(files.root / "home"), "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", **case.env(files)}
    run = subprocess.run([sys.executable, str(REPO / "main.py"), *case.argv(files)], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=timeout)
    lines = run.stderr.splitlines()
    if case.expect == "error":
        clean = run.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: ")
    else:
        clean = run.returncode == 0 and sum(line.startswith("note: ") for line in lines) == 1 \
            and not any(line.startswith(("error", "Traceback")) for line in lines)
    return Outcome(case, clean, run.returncode, run.stderr)


def run_table(files: Files, quick: bool = False, report=print) -> tuple[int, int]:
    """Run the table (only the quick cases with quick=True); returns (tried, clean)."""
    cases = [c for c in CASES if c.quick or not quick]
    clean = 0
    for case in cases:
        outcome = run_case(case, files)
        clean += outcome.clean
        first = outcome.stderr.strip().splitlines()[:1] or [""]
        report(f"  {'clean' if outcome.clean else 'NOT CLEAN'}  {case.name}  (exit {outcome.returncode}): "
               f"{first[0][:110]}" + ("" if outcome.clean else f"\n{outcome.stderr[-2000:]}"))
    return len(cases), clean
