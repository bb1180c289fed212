"""CLI errors a user causes are one `error:` line and exit 2; Ctrl+C and SIGTERM keep the partial answer."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engine.cli import main
from engine.store.chats import ChatStore

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("argv, message", [
    (["chat", "--ask", "hi", "--chunk", "x"], "argument --chunk: invalid int value: 'x' (see `main.py chat --help`)"),
    (["chat"], "the following arguments are required: --ask (see `main.py chat --help`)"),
    (["models", "--bogus"], "unrecognized arguments: --bogus (see `main.py --help`)"),
])
def test_argparse_errors_are_one_line_with_a_help_hint(argv, message, capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    assert capsys.readouterr().err == f"error: {message}\n"


@pytest.mark.parametrize("flags, message", [
    (["--chunk", "0"], "--chunk 0 is out of range: use 1 to 1024 tokens"),
    (["--gamma1", "0"], "gamma1 0 is out of range: use 1 to 16"),
    (["--gamma2", "0"], "gamma2 0 is out of range: use 1 to 32"),  # were silently replaced by the defaults
    (["--gamma1", "17"], "gamma1 17 is out of range: use 1 to 16"),
])
def test_bad_settings_refused_before_anything_loads(flags, message, capsys) -> None:
    assert main(["chat", "--model", "/no/such/model", "--ask", "hi", *flags]) == 2  # fails before the model spec
    assert capsys.readouterr().err == f"error: {message}\n"


def test_bench_refuses_a_steal_share_out_of_range_before_loading(capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["bench", "--model", "/no/such/model", "--max-steal", "150"])
    assert exit_.value.code == 2
    assert capsys.readouterr().err == ("error: argument --max-steal: 150 is out of range: use 0 to 99 per cent "
                                       "(see `main.py bench --help`)\n")


def test_triforce_home_a_file_or_below_one(tmp_path, monkeypatch, capsys) -> None:
    (tmp_path / "f").write_text("x")
    for home, says in ((tmp_path / "f", "is a file, not a folder"), (tmp_path / "f" / "sub", "a part of that path is a file")):
        monkeypatch.setenv("TRIFORCE_HOME", str(home))
        assert main(["chats"]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: TRIFORCE_HOME ") and says in err and err.count("\n") == 1


def _chat_until_output(model: Path, doc: Path, wait_for: str) -> tuple[subprocess.Popen, bytes]:
    """Start `chat --progress` and return once stdout (answer) or stderr (prefill) shows something."""
    argv = [sys.executable, str(REPO / "main.py"), "chat", "--model", str(model), "--device", "cpu", "--doc", str(doc),
            "--ask", "What happens?", "--max-new-tokens", "400", "--progress", "--mode", "ar"]
    # a shell's background job starts with SIGINT ignored, and so would the child: give it back the
    # default, as a terminal's foreground process has it (else Ctrl+C never reaches the CLI)
    restore = (lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)) if os.name == "posix" else None
    proc = subprocess.Popen(argv, cwd=REPO, env=dict(os.environ), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=restore)
    stream = proc.stdout if wait_for == "answer" else proc.stderr
    seen = b""
    deadline = time.monotonic() + 300
    while len(seen) < (40 if wait_for == "answer" else 1) and time.monotonic() < deadline:
        chunk = stream.read1(4096)
        if not chunk:
            break
        seen += chunk
    return proc, seen


@pytest.mark.slow
@pytest.mark.parametrize("signum, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signal_during_the_answer_saves_it_marked_interrupted(signum, code, tiny_model_dir, tmp_path) -> None:
    doc = tmp_path / "doc.md"
    doc.write_text((REPO / "resources" / "sample" / "hamlet.md").read_text(encoding="utf-8")[:3000], encoding="utf-8")
    proc, printed = _chat_until_output(tiny_model_dir("llama"), doc, "answer")
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=120)
    printed += out
    assert proc.returncode == code, err
    lines = err.decode().replace("\r", "\n").splitlines()
    assert lines[-1] == "interrupted"  # on its own line, never glued to a progress line
    assert printed.endswith(b"\n")  # the answer's line was ended before
    store = ChatStore()
    (chat,) = store.list_chats()
    question, answer = store.messages(chat.id)
    store.close()
    assert question.text == "What happens?" and answer.state == "interrupted"
    assert len(answer.text) >= 30 and printed.decode().startswith(answer.text)  # what printed is kept


@pytest.mark.slow
def test_ctrl_c_during_prefill_prints_interrupted_on_its_own_line(tiny_model_dir, tmp_path) -> None:
    doc = tmp_path / "doc.md"
    doc.write_text((REPO / "resources" / "sample" / "hamlet.md").read_text(encoding="utf-8")[:20000], encoding="utf-8")
    proc, shown = _chat_until_output(tiny_model_dir("llama"), doc, "prefill")
    assert shown.startswith(b"\rprefill")
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130
    text = (shown + err).decode()
    assert text.endswith("\ninterrupted\n") and "reused)interrupted" not in text
