"""The bad-input table: each case runs `main.py` in a subprocess and must fail cleanly.

Clean means: exit code 2 and exactly one line on stderr, starting `error:` (no traceback, no
library's own warning before it). A few inputs are not errors but odd files we read anyway;
those must exit 0 and say what we did in one `note:` line (or, for a snapshot that cannot be
saved, one `warning:` line), and a special file like /proc/cpuinfo is read with nothing to say.
Lines main.py's venv set-up prints (`[setup] ...`) are left out of the judgement. The app home
starts with one chat of one answered question; afterwards it must hold exactly that:
a failed answer leaves no junk turn, and no case loses a stored message.
"""
from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tests.reliability import sandbox

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Case:
    name: str
    argv: Callable[["Files"], list[str]]  # the command line, given the prepared files
    env: Callable[["Files"], dict[str, str]] = lambda f: {}
    expect: str = "error"  # "error": exit 2 + one `error:` line; "note"/"warning": exit 0 + one such line;
    # "ok": exit 0, nothing on stderr but the answer's notes
    quick: bool = False  # part of the small version run by the test suite
    wrap: Callable[["Files"], list[str] | None] | None = None  # a command prefix (sandbox); None from it: skipped
    applies: Callable[[], bool] = lambda: True  # False: the input is not bad on this machine (skipped)


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
    for name, weights in (("random_weights", os.urandom(100_000)),  # safetensors of random bytes
                          ("huge_header", struct.pack("<Q", 2**62) + b"{}")):  # a header length past the file
        folder = root / f"model-{name.replace('_', '-')}"
        shutil.copytree(model, folder, dirs_exist_ok=True)
        (folder / "model.safetensors").write_bytes(weights)
        p[name] = folder
    p["book"] = root / "book.md"  # long enough (over 1,024 tokens) for its prefill to be snapshotted
    p["book"].write_text((REPO / "resources" / "sample" / "hamlet.md").read_text(encoding="utf-8")[:8000],
                         encoding="utf-8")
    (p["home"] / "snapshots").mkdir(parents=True, exist_ok=True)  # the full-disk case mounts over it
    p["ro_home"] = root / "read-only-home"
    _home_with_one_chat(p["ro_home"])
    (p["ro_home"] / "snapshots").mkdir()  # a home used before: everything there, nothing writable
    _home_with_one_chat(p["home"])
    return files


KEPT = ("Which play is this?", "Hamlet.")  # the one turn every app home starts with


def _home_with_one_chat(home: Path) -> None:
    from engine.store.chats import ChatStore

    store = ChatStore(home / "chats.sqlite3")
    chat = store.create_chat("kept", model_spec="bundled")
    store.begin_turn(chat.id, KEPT[0]).finish(KEPT[1])
    store.close()


def check_home(home: Path) -> tuple[int, int]:
    """(junk turns, lost messages) in an app home that started as _home_with_one_chat made it."""
    from engine.store.chats import ChatStore

    store = ChatStore(home / "chats.sqlite3")
    try:
        messages = [m for chat in store.list_chats() for m in store.messages(chat.id)]
    finally:
        store.close()
    kept = [m for m in messages if (m.text, m.state) in ((KEPT[0], "done"), (KEPT[1], "done"))]
    return sum(m.role == "user" for m in messages) - sum(m.role == "user" for m in kept), 2 - len(kept)


def _no_cuda() -> bool:
    import torch

    return not torch.cuda.is_available()


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
    # the hostile inputs a new user tried (each was a traceback or a slow failure)
    Case("chat --seed 2**64 under sampling, in chat 1",
         _chat("--temperature", "0.7", "--seed", str(2**64), "--chat", "1"), quick=True),
    Case("chat --seed -2**70", _chat("--temperature", "0.7", "--seed", str(-2**70))),
    Case("chat --temperature 1e-300 (inf logits)", _chat("--temperature", "1e-300")),
    Case("chat --top-p 1e-300 (0 in float32)", _chat("--temperature", "0.7", "--top-p", "1e-300")),
    Case("chat --device cuda without CUDA", lambda f: [*_chat()(f)[:-2], "--device", "cuda"], applies=_no_cuda),
    Case("chat --device bogus", lambda f: [*_chat()(f)[:-2], "--device", "bogus"], quick=True),
    Case("--model safetensors of random bytes", lambda f: _chat(model=f["random_weights"])(f)),
    Case("--model safetensors header of 2**62 bytes", lambda f: _chat(model=f["huge_header"])(f), quick=True),
    Case("--draft safetensors header of 2**62 bytes", lambda f: _chat("--draft", f["huge_header"])(f)),
    Case("chat --chat 2**70", _chat("--chat", str(2**70))),
    Case("chats --export 2**70", lambda f: ["chats", "--export", str(2**70)]),
    Case("chat --ask not UTF-8", lambda f: [*_chat()(f), "--ask", "hello \udcff\udcfe"]),
    Case("plan --headroom-gib nan", lambda f: [*_plan(), "--headroom-gib", "nan"], quick=True),
    Case("plan --headroom-gib inf", lambda f: [*_plan(), "--headroom-gib", "inf"]),
    Case("plan --headroom-gib 1e30", lambda f: [*_plan("4090"), "--headroom-gib", "1e30"]),
    Case("plan --headroom-gib 30 on a 24 GiB card", lambda f: [*_plan("4090"), "--headroom-gib", "30"]),
    Case("plan --ram-gib nan", lambda f: [*_plan(), "--ram-gib", "nan"]),
    Case("plan --ram-gib -5", lambda f: [*_plan(), "--ram-gib", "-5"]),
    Case("plan --cpu-attn-gbps nan", lambda f: [*_plan("4090"), "--cpu-attn-gbps", "nan"]),
    Case("bench --repeats 0", lambda f: ["bench", "--model", str(f.model), "--context", "256", "--new-tokens", "4",
                                         "--methods", "ar", "--repeats", "0", "--device", "cpu"]),
    Case("bench --context -5", lambda f: ["bench", "--model", str(f.model), "--context", "-5", "--device", "cpu"]),
    Case("read-only app home", lambda f: _chat("--doc", f["book"], "--no-save")(f), env=lambda f: {"TRIFORCE_HOME": f["ro_home"]},
         wrap=lambda f: sandbox.read_only(f.paths["ro_home"])),
    # read anyway, and say so
    Case("--doc latin-1 text with NUL bytes", lambda f: _chat("--doc", f["nul_latin1"], "--no-save")(f), expect="note"),
    Case("--doc /proc/cpuinfo (a file that says it is empty)", lambda f: _chat("--doc", "/proc/cpuinfo", "--no-save")(f),
         expect="ok", applies=lambda: os.path.isfile("/proc/cpuinfo")),
    Case("full snapshot folder", lambda f: _chat("--doc", f["book"], "--no-save")(f), expect="warning",
         wrap=lambda f: sandbox.full(f.root / "home" / "snapshots")),
)


def _plan(devices: str = "cpu") -> list[str]:
    return ["plan", "--model", "meta-llama/Llama-3.1-8B-Instruct", "--context", "4096", "--devices", devices]


@dataclass(frozen=True)
class Outcome:
    case: Case
    clean: bool
    returncode: int
    stderr: str
    skipped: bool = False


@dataclass
class TableCounts:
    tried: int = 0
    clean: int = 0
    skipped: int = 0  # not bad on this machine, or no sandbox for it
    tracebacks: int = 0
    junk: int = 0  # turns a failed command left in the app home
    lost: int = 0  # stored messages a command removed or changed

    def line(self) -> str:
        return (f"bad inputs tried {self.tried} / clean {self.clean} / skipped {self.skipped} / tracebacks "
                f"{self.tracebacks} / junk turns {self.junk} / lost messages {self.lost}")


def run_case(case: Case, files: Files, timeout: float = 300) -> Outcome:
    """Run one case in a fresh process with its own app home; judge it."""
    prefix = case.wrap(files) if case.wrap else []
    if prefix is None or not case.applies():
        return Outcome(case, False, 0, "", skipped=True)
    env = {**os.environ, "TRIFORCE_HOME": str(files.root / "home"), "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", **case.env(files)}
    run = subprocess.run([*prefix, sys.executable, str(REPO / "main.py"), *case.argv(files)], cwd=REPO, env=env,
                         capture_output=True, text=True, errors="replace", timeout=timeout)
    # main.py's own set-up lines (a venv being installed or brought up to date) are not the command's
    lines = [line for line in run.stderr.splitlines() if not line.startswith("[setup] ")]
    if case.expect == "error":
        clean = run.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: ")
    elif case.expect == "ok":
        clean = run.returncode == 0 and not any(line.startswith(("error", "warning", "Traceback")) for line in lines)
    else:
        clean = run.returncode == 0 and len(lines) == 1 and lines[0].startswith(f"{case.expect}: ")
    return Outcome(case, clean, run.returncode, run.stderr)


def run_table(files: Files, quick: bool = False, report=print) -> TableCounts:
    """Run the table (only the quick cases with quick=True), then check the app home."""
    counts = TableCounts()
    for case in [c for c in CASES if c.quick or not quick]:
        outcome = run_case(case, files)
        if outcome.skipped:
            counts.skipped += 1
            report(f"  skipped    {case.name}  (not bad here, or no sandbox for it)")
            continue
        counts.tried += 1
        counts.clean += outcome.clean
        counts.tracebacks += "Traceback" in outcome.stderr
        first = outcome.stderr.strip().splitlines()[:1] or [""]
        report(f"  {'clean' if outcome.clean else 'NOT CLEAN'}  {case.name}  (exit {outcome.returncode}): "
               f"{first[0][:110]}" + ("" if outcome.clean else f"\n{outcome.stderr[-2000:]}"))
    counts.junk, counts.lost = check_home(files.root / "home")
    return counts
