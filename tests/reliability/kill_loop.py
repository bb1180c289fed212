"""A bounded kill -9 loop over `main.py chat` on a temp TRIFORCE_HOME, then the store is checked.

Each run asks a question with a unique tag (a document too, so there is a prefill to kill), and
is SIGKILLed at a random moment: most during prefill or the answer (after the first progress
line), some anywhere from the start. Some runs continue one shared chat, the rest start new ones.
Afterwards:
  corrupt: the SQLite file fails `PRAGMA integrity_check` or the store does not open;
  lost:    a run whose answer ended (exit 0, or its --stats line printed, which follows the commit)
           has no stored answer "done" equal to what printed, or a stored answer is not a prefix
           of what the terminal showed;
  orphans: a question with no answer after it that is not marked "interrupted", or an answer
           still "streaming" after the store reopened (nobody is writing any more);
  behind:  the most characters a killed answer had printed but not yet checkpointed.
"""
from __future__ import annotations

import os
import random
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


@dataclass
class Run:
    tag: str
    killed: bool
    returncode: int
    stdout: str
    stderr: str
    tail_s: float | None = None  # a run that finished: seconds from its first prefill line to its end


@dataclass
class KillCounts:
    kills: int = 0
    completed: int = 0
    corrupt: int = 0
    lost: int = 0
    orphans: int = 0
    interrupted_marked: int = 0
    behind_chars: int = 0  # printed but not saved, worst killed run
    temps_left: int = 0
    problems: list[str] = field(default_factory=list)

    def line(self) -> str:
        return (f"kills {self.kills} (+{self.completed} ran to the end) / corrupt {self.corrupt} / lost "
                f"{self.lost} / orphans {self.orphans}; {self.interrupted_marked} turns marked interrupted, "
                f"at most {self.behind_chars} printed chars not yet saved, {self.temps_left} snapshot temp files left")


class _Reader(threading.Thread):
    """Collects a pipe as it comes; `seen` fires at the first chunk containing `marker`."""

    def __init__(self, stream, marker: str | None = None) -> None:
        super().__init__(daemon=True)
        self.stream, self.marker, self.parts = stream, marker, []
        self.seen = threading.Event()

    def run(self) -> None:
        for chunk in iter(lambda: self.stream.read1(4096) if hasattr(self.stream, "read1") else self.stream.read(1), b""):
            self.parts.append(chunk)
            if self.marker and self.marker.encode() in b"".join(self.parts[-2:]):
                self.seen.set()
        self.seen.set()

    def text(self) -> str:
        return b"".join(self.parts).decode("utf-8", "replace")


def chat_argv(model: Path, doc: Path, tag: str, chat_id: int | None, max_new_tokens: int) -> list[str]:
    argv = [sys.executable, str(REPO / "main.py"), "chat", "--model", str(model), "--device", "cpu", "--doc", str(doc),
            "--ask", f"[{tag}] What happens in this passage?", "--max-new-tokens", str(max_new_tokens), "--progress", "--stats"]
    return argv + (["--chat", str(chat_id)] if chat_id is not None else [])


def one_run(argv: list[str], env: dict, tag: str, rng: random.Random, answer_s: float, startup_s: float) -> Run:
    """Start one chat and SIGKILL it at a random moment (or let it finish if the moment is past its end)."""
    proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = _Reader(proc.stdout), _Reader(proc.stderr, marker="prefill")
    out.start(), err.start()
    marked = time.monotonic()
    if rng.random() < 0.8:  # during prefill or the answer
        err.seen.wait(timeout=startup_s * 4)
        marked = time.monotonic()
        delay = rng.uniform(0.0, answer_s * 1.1)
    else:  # anywhere: start-up, recovery of the last kill, model load
        delay = rng.uniform(0.0, startup_s + answer_s)
    try:
        proc.wait(timeout=delay)
        killed = False
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        killed = True
    out.join(10), err.join(10)
    return Run(tag, killed, proc.returncode, out.text(), err.text(), None if killed else time.monotonic() - marked)


def calibrate(argv: list[str], env: dict) -> tuple[float, float, Run]:
    """(seconds to the first prefill line, seconds from there to the end, the run) of one undisturbed run."""
    start = time.monotonic()
    proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    err = _Reader(proc.stderr, marker="prefill")
    out = _Reader(proc.stdout)
    err.start(), out.start()
    err.seen.wait(timeout=600)
    loaded = time.monotonic()
    proc.wait(timeout=600)
    out.join(10), err.join(10)
    if proc.returncode != 0:
        raise RuntimeError(f"the calibration chat failed (exit {proc.returncode}):\n{err.text()[-3000:]}")
    run = Run("calibrate", False, proc.returncode, out.text(), err.text())
    return loaded - start, max(0.5, time.monotonic() - loaded), run


def run_kills(kills: int, model: Path, doc: Path, home: Path, seed: int = 0, max_new_tokens: int = 48,
              report=print, max_seconds: float | None = None) -> KillCounts:
    """`kills` SIGKILLed chats (runs that finish first do not count as kills), then the checks;
    with `max_seconds`, fewer kills if time runs out (the counts say how many)."""
    rng = random.Random(seed)
    env = {**os.environ, "TRIFORCE_HOME": str(home), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    startup_s, answer_s, whole = calibrate(chat_argv(model, doc, "calibrate", None, max_new_tokens), env)
    report(f"  one chat: {startup_s:.1f} s to the first prefill line, {answer_s:.1f} s prefill + answer")
    counts, runs, shared_chat, i = KillCounts(), [whole], 1, 0  # the undisturbed run is checked too
    started = time.monotonic()
    while counts.kills < kills and (max_seconds is None or time.monotonic() - started < max_seconds):
        i += 1
        tag = f"run{i}"
        chat_id = shared_chat if rng.random() < 0.5 else None
        run = one_run(chat_argv(model, doc, tag, chat_id, max_new_tokens), env, tag, rng, answer_s, startup_s)
        runs.append(run)
        counts.kills += run.killed
        counts.completed += not run.killed
        if run.tail_s is not None and run.tail_s < answer_s:  # the machine got faster: aim the kills again
            answer_s = (answer_s + run.tail_s) / 2
        if not run.killed and run.returncode != 0:
            counts.problems.append(f"{tag}: exit {run.returncode}: {run.stderr[-500:]}")
        if i % 10 == 0:
            report(f"  ... {counts.kills} kills so far")
    check_store(home, runs, counts)
    return counts


def check_store(home: Path, runs: list[Run], counts: KillCounts) -> None:
    """Fill corrupt / lost / orphans / behind from the store after every writer is dead."""
    from engine.store.chats import ChatStore
    from engine.store.snapshots import SnapshotStore

    path = home / "chats.sqlite3"
    conn = sqlite3.connect(path)
    try:
        ok = conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok" and not conn.execute(
            "PRAGMA foreign_key_check").fetchall()
    except sqlite3.DatabaseError as exc:
        ok = False
        counts.problems.append(f"integrity check failed: {exc}")
    finally:
        conn.close()
    try:
        store = ChatStore(path)  # opening marks what the killed writers left
    except Exception as exc:  # any failure to open counts as a corrupt store
        counts.corrupt += 1
        counts.problems.append(f"store does not open: {exc}")
        return
    counts.corrupt += not ok
    turns: dict[str, tuple] = {}
    for summary in store.list_chats():
        messages = store.messages(summary.id)
        for n, m in enumerate(messages):
            if m.state == "streaming":
                counts.orphans += 1
                counts.problems.append(f"chat {summary.id} message {m.idx} still streaming")
            if m.role == "user":
                answer = messages[n + 1] if n + 1 < len(messages) and messages[n + 1].role == "assistant" else None
                if answer is None and m.state != "interrupted":
                    counts.orphans += 1
                    counts.problems.append(f"chat {summary.id} question {m.idx} has no answer and no mark")
                tag = m.text[1:m.text.find("]")] if m.text.startswith("[") else ""
                turns[tag] = (m, answer)
            counts.interrupted_marked += m.state == "interrupted"
    store.close()
    for run in runs:
        printed = run.stdout  # the answer as far as it got, and a newline once it ended
        # the stats line is printed after the answer was committed: seen, the answer ended
        ended = (not run.killed and run.returncode == 0) or '"finish_reason"' in run.stderr
        question, answer = turns.get(run.tag, (None, None))
        if ended and (answer is None or answer.state != "done" or answer.text + "\n" != printed):
            counts.lost += 1
            counts.problems.append(f"{run.tag}: answer shown whole but stored as "
                                   f"{None if answer is None else (answer.state, answer.text[:40])}")
        elif answer is not None and not printed.startswith(answer.text):
            counts.lost += 1
            counts.problems.append(f"{run.tag}: stored answer {answer.text[:40]!r} is not what printed {printed[:40]!r}")
        elif answer is not None and run.killed and answer.state != "done":
            counts.behind_chars = max(counts.behind_chars, len(printed) - len(answer.text))
    snapshots = SnapshotStore(home / "snapshots")
    counts.temps_left = len(snapshots._temps())

