"""CLI errors a user causes are one `error:` line and exit 2; Ctrl+C and SIGTERM keep the partial answer."""
from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import struct
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


# --- rule (a): every value is checked as it is parsed, before anything slow --------------------------
LLAMA_PLAN = ["plan", "--model", "meta-llama/Llama-3.1-8B-Instruct", "--context", "4096"]
NO_MODEL = ["--model", "/no/such/model", "--ask", "hi"]  # a value checked later would fail on this instead


@pytest.mark.parametrize("argv, says", [
    (["chat", *NO_MODEL, "--temperature", "0.7", "--seed", str(2**64)], "argument --seed: 18446744073709551616 is out of range"),
    (["chat", *NO_MODEL, "--seed", str(-2**70)], "argument --seed: -1180591620717411303424 is out of range"),
    (["chat", *NO_MODEL, "--device", "bogus"], "argument --device: 'bogus' is not a device"),
    (["chat", *NO_MODEL, "--chat", str(2**70)], "argument --chat: 1180591620717411303424 is out of range: use 1 to"),
    (["chats", "--export", str(2**70)], "argument --export: 1180591620717411303424 is out of range: use 1 to"),
    (["chats", "--export", "0"], "argument --export: 0 is out of range"),
    (["chat", "--model", "/no/such/model", "--ask", "hello \udcff\udcfe"], 'argument --ask: "hello \\xff\\xfe" is not UTF-8'),
    (["chat", *NO_MODEL, "--system", "\udcc3"], "argument --system: "),
    (["chat", *NO_MODEL, "--temperature", "nan"], "argument --temperature: nan is not a finite number"),
    (["chat", *NO_MODEL, "--temperature", "1e-300"], "argument --temperature: 1e-300 is too small to sample with"),
    (["chat", *NO_MODEL, "--top-p", "1e-300"], "argument --top-p: 1e-300 is out of range"),  # 0 in float32
    (["chat", *NO_MODEL, "--max-new-tokens", str(2**70)], "argument --max-new-tokens: "),
    ([*LLAMA_PLAN, "--headroom-gib", "nan"], "argument --headroom-gib: nan is not a finite number"),
    ([*LLAMA_PLAN, "--headroom-gib", "inf"], "argument --headroom-gib: inf is not a finite number"),
    ([*LLAMA_PLAN, "--headroom-gib", "1e30"], "argument --headroom-gib: 1e30 is out of range: use 0 to 1024 GiB"),
    ([*LLAMA_PLAN, "--ram-gib", "nan"], "argument --ram-gib: nan is not a finite number"),
    ([*LLAMA_PLAN, "--ram-gib", "-5"], "argument --ram-gib: -5 is out of range"),
    ([*LLAMA_PLAN, "--cpu-attn-gbps", "nan"], "argument --cpu-attn-gbps: nan is not a finite number"),
    (["bench", "--model", "/no/such/model", "--methods", "ar", "--repeats", "0"], "argument --repeats: 0 is out of range"),
    (["bench", "--model", "/no/such/model", "--context", "-5"], "argument --context: -5 is out of range"),
    (["bench", "--model", "/no/such/model", "--context", "1024,-5"], "argument --context: -5 is out of range"),
    (["gpu-check", "--device", "cuda:x"], "argument --device: 'cuda:x' is not a device"),
])
def test_hostile_values_are_one_line_before_anything_loads(argv, says, capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1 and err.startswith(f"error: {says}"), err


def test_bench_checks_its_decoding_settings_before_the_model_loads(capsys) -> None:
    assert main(["bench", "--model", "/no/such/model", "--context", "512", "--gamma1", "99"]) == 2
    assert capsys.readouterr().err == "error: gamma1 99 is out of range: use 1 to 16\n"


def test_every_option_of_every_command_reads_its_value_through_a_checked_type() -> None:
    from engine.cli import build_parser
    from engine.cli.validate import unchecked_options

    assert unchecked_options(build_parser()) == []


@pytest.mark.parametrize("declared, value, accepted", [
    (int, str(2**63), False), (int, "-1", False), (int, "12", True),
    (float, "nan", False), (float, "-inf", False), (float, "1e999", False), (float, "-2.5", True),
    (None, "caf\udce9", False), (None, "café", True), (str, "\udcff", False),
])
def test_a_flag_added_later_with_a_bare_type_is_checked_all_the_same(declared, value, accepted, capsys) -> None:
    from engine.cli import OneLineParser
    from engine.cli.validate import harden

    parser = OneLineParser(prog="t")
    parser.add_argument("--new", type=declared)
    harden(parser)
    if accepted:
        assert parser.parse_args(["--new", value]).new == (declared or str)(value)
        return
    with pytest.raises(SystemExit):
        parser.parse_args(["--new", value])
    assert capsys.readouterr().err.startswith("error: argument --new: ")


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="this machine has CUDA: cuda is not a bad device here")
def test_cuda_without_cuda_is_refused_before_the_model_spec_is_read(capsys) -> None:
    assert main(["chat", *NO_MODEL, "--device", "cuda"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: device 'cuda' is not available") and err.count("\n") == 1


def _header(table: dict) -> bytes:
    raw = json.dumps(table).encode()
    return struct.pack("<Q", len(raw)) + raw


@pytest.mark.parametrize("weights, says", [
    (b"\x93\x12" + bytes(range(256)) * 40, "its header claims"),  # random bytes: a nonsense header length
    (struct.pack("<Q", 2**62) + b"{}", "its header claims 4,611,686,018,427,387,904 bytes"),
    (struct.pack("<Q", 3) + b"[1]", "not a table of tensors"),
    (struct.pack("<Q", 2) + b"\xff\xfe", "not JSON"),
    (_header({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}) + bytes(4), "lies outside the file"),
])
@pytest.mark.parametrize("flag", ["--model", "--draft"])
def test_broken_safetensors_are_a_model_format_error(flag, weights, says, tiny_model_dir, tmp_path, capsys) -> None:
    tiny = tiny_model_dir("llama")
    capsys.readouterr()  # the fixture's own progress lines, when it makes the model
    broken = tmp_path / "broken"
    shutil.copytree(tiny, broken)
    (broken / "model.safetensors").write_bytes(weights)
    model = str(broken if flag == "--model" else tiny)
    argv = ["chat", "--model", model, "--ask", "hi", "--device", "cpu", "--no-save"]
    assert main(argv + ([flag, str(broken)] if flag == "--draft" else [])) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {broken / 'model.safetensors'} is not a valid safetensors file (") and says in err
    assert err.count("\n") == 1


def test_a_good_safetensors_file_passes_the_header_check(tiny_model_dir) -> None:
    from engine.store.weights_check import check_safetensors_folder

    check_safetensors_folder(tiny_model_dir("llama"))  # raises on a bad one (above)


@pytest.mark.skipif(not Path("/proc/cpuinfo").is_file(), reason="no /proc")
def test_a_proc_file_that_reports_0_bytes_is_read() -> None:
    from engine.api import read_document

    doc = read_document("/proc/cpuinfo")
    assert doc.text and doc.meta["bytes"] > 0 and doc.title == "cpuinfo"


def test_a_read_only_home_is_refused_before_the_model_loads(tmp_path) -> None:
    from tests.reliability import sandbox

    home = tmp_path / "home"
    (home / "snapshots").mkdir(parents=True)
    prefix = sandbox.read_only(home)
    if prefix is None:
        pytest.skip("no mount namespaces here: cannot make a folder read-only for this user")
    env = {**os.environ, "TRIFORCE_HOME": str(home), "HF_HUB_OFFLINE": "1"}
    code = f"from engine.cli import main; raise SystemExit(main({['chat', *NO_MODEL, '--no-save']!r}))"
    run = subprocess.run([*prefix, sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 2 and run.stderr.count("\n") == 1, run.stderr
    assert run.stderr.startswith(f"error: {home / 'snapshots'} is not writable (Read-only file system)"), run.stderr


def test_a_snapshot_that_cannot_be_saved_is_one_warning_line(tiny_model_dir, tmp_path, monkeypatch, capsys) -> None:
    import engine.store.snapshots as snapshots

    def disk_full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(snapshots, "_write_safetensors", disk_full)
    book = tmp_path / "book.md"  # over 1,024 tokens: its prefill is worth a snapshot
    book.write_text((REPO / "resources" / "sample" / "hamlet.md").read_text(encoding="utf-8")[:8000], encoding="utf-8")
    argv = ["chat", "--model", str(tiny_model_dir("llama")), "--device", "cpu", "--doc", str(book), "--ask", "hi",
            "--max-new-tokens", "2", "--no-save"]
    capsys.readouterr()
    assert main(argv) == 0
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("warning: prefill snapshot not saved: Cannot save the prefilled-book "
                                                   "snapshot in ") and "(No space left on device)" in lines[0], lines
    assert not list((Path(os.environ["TRIFORCE_HOME"]) / "snapshots").glob(".*.tmp"))  # no temp file left


# --- rule (b): an answer that fails leaves at most its printed part ----------------------------------
def _inject_failure(monkeypatch, after_tokens: int | None, error: BaseException) -> None:
    """Make every answer raise `error`: at once (None), or when its token number `after_tokens` arrives."""
    from engine.decoding.session import ChatSession
    from engine.events import TokenText

    stream = ChatSession.stream

    def failing(self, *args, **kwargs):
        if after_tokens is None:
            raise error
        tokens = 0
        for event in stream(self, *args, **kwargs):
            if isinstance(event, TokenText):
                if tokens == after_tokens:
                    raise error
                tokens += 1
            yield event

    monkeypatch.setattr(ChatSession, "stream", failing)


def _ask(model: Path, *extra: str) -> list[str]:
    return ["chat", "--model", str(model), "--device", "cpu", "--ask", "What is new?", "--max-new-tokens", "12",
            "--temperature", "0", *extra]


@pytest.mark.parametrize("after_tokens", [None, 0])  # before the prefill, or after it and before the first token
def test_an_answer_that_fails_before_its_first_token_leaves_no_turn(after_tokens, tiny_model_dir, monkeypatch,
                                                                     capsys) -> None:
    store = ChatStore()
    kept = store.create_chat("kept")
    store.begin_turn(kept.id, "Which play?").finish("Hamlet.")
    _inject_failure(monkeypatch, after_tokens, RuntimeError("injected"))
    for extra in ([], ["--chat", str(kept.id)]):  # a new chat, and the user's existing one
        with pytest.raises(RuntimeError, match="injected"):  # a bug stays loud
            main(_ask(tiny_model_dir("llama"), *extra))
    assert [c.id for c in store.list_chats()] == [kept.id]
    assert [(m.text, m.state) for m in store.messages(kept.id)] == [("Which play?", "done"), ("Hamlet.", "done")]
    store.close()


def test_a_user_error_before_the_first_token_leaves_no_turn_and_exits_2(tiny_model_dir, monkeypatch, capsys) -> None:
    from engine.errors import ContextOverflowError

    _inject_failure(monkeypatch, 0, ContextOverflowError("the cache is full: start a new chat"))
    argv = _ask(tiny_model_dir("llama"))
    capsys.readouterr()
    assert main(argv) == 2
    assert capsys.readouterr().err == "error: the cache is full: start a new chat\n"
    store = ChatStore()
    assert store.list_chats() == []
    store.close()


def test_an_answer_that_fails_midway_keeps_what_printed_marked_interrupted(tiny_model_dir, monkeypatch,
                                                                           capsys) -> None:
    _inject_failure(monkeypatch, 5, RuntimeError("injected"))
    argv = _ask(tiny_model_dir("llama"))
    capsys.readouterr()
    with pytest.raises(RuntimeError, match="injected"):
        main(argv)
    printed = capsys.readouterr().out
    store = ChatStore()
    (chat,) = store.list_chats()
    question, answer = store.messages(chat.id)
    store.close()
    assert (question.text, question.state) == ("What is new?", "done")
    assert answer.state == "interrupted" and answer.text and printed == answer.text + "\n"


@pytest.mark.slow
def test_an_answer_piped_into_a_reader_that_leaves_ends_quietly_and_keeps_what_was_sent(tiny_model_dir) -> None:
    argv = [sys.executable, str(REPO / "main.py"), "chat", "--model", str(tiny_model_dir("llama")), "--device", "cpu",
            "--ask", "Tell me more", "--max-new-tokens", "400", "--temperature", "0", "--mode", "ar"]
    proc = subprocess.Popen(argv, cwd=REPO, env=dict(os.environ), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first = proc.stdout.read1(64)  # the answer has begun: then the reader leaves, as `| head -c 64` does
    proc.stdout.close()
    err = proc.stderr.read().decode()
    proc.wait(timeout=300)
    assert first and proc.returncode == 141, err
    assert not [line for line in err.splitlines() if not line.startswith("[setup] ")]  # no traceback, nothing
    store = ChatStore()
    (chat,) = store.list_chats()
    question, answer = store.messages(chat.id)
    store.close()
    assert question.text == "Tell me more" and answer.state == "interrupted"
    assert answer.text.encode().startswith(first)
