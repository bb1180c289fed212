"""Command-line interface. Each subcommand lives in its own module with `register(subparsers)`.

A `UserError` becomes one line on stderr and exit code 2, and so does a bad command line (with a
hint to use --help); anything else is a bug and shows its traceback. Ctrl+C and SIGTERM print
"interrupted" on a line of its own and exit 130 / 143 (`chat` saves the partial answer first); a
closed stdout (`| head`) ends the command quietly with 141, as for a shell tool.
Every option's value is checked as it is parsed (engine.cli.validate), before anything slow runs;
a warning the engine raises while a command runs is one `warning:` line, not Python's two.
"""
from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
import threading
import warnings

from engine.cli.validate import harden
from engine.errors import UserError

# subcommand name -> module under engine.cli (imported lazily so `plan` never imports torch models)
COMMANDS = {
    "chat": "engine.cli.chat_cmd",
    "chats": "engine.cli.chats_cmd",
    "bench": "engine.cli.bench_cmd",
    "plan": "engine.cli.plan_cmd",
    "models": "engine.cli.models_cmd",
    "gpu-check": "engine.cli.gpu_check_cmd",
}


class OneLineParser(argparse.ArgumentParser):
    """argparse whose errors are one `error:` line naming --help, and exit 2 (subparsers inherit it)."""

    def error(self, message: str):
        self.exit(2, f"error: {message} (see `{self.prog} --help`)\n")


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the main thread is, so cleanup runs as for Ctrl+C."""


def _raise_terminated(signum, frame) -> None:
    raise Terminated()


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="main.py", description="TriForce Chat: chat with whole books on your own GPU.")
    sub = parser.add_subparsers(dest="command", metavar="{" + ",".join(COMMANDS) + "}")
    for name, module_name in COMMANDS.items():
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name == module_name:
                continue  # not built yet
            raise
        module.register(sub)
    return harden(parser)


def main(argv: list[str] | None = None) -> int:
    """Run one subcommand; returns the process exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    in_main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _raise_terminated) if in_main else None
    try:
        with warnings.catch_warnings():
            warnings.showwarning = _one_line_warning
            return int(args.func(args) or 0)
    except UserError as exc:
        print(f"error: {_one_line(str(exc))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:
        print("interrupted", file=sys.stderr)
        return 143 if isinstance(exc, Terminated) else 130
    except BrokenPipeError:  # stdout's reader left (`| head`): stop quietly, as a shell tool does
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the exit's flush must not raise again
        return 141
    finally:
        if in_main:
            signal.signal(signal.SIGTERM, previous)


def _one_line_warning(message, category, filename, lineno, file=None, line=None) -> None:
    # `warning: text` on stderr: the user needs the text, not the engine's source line
    print(f"warning: {_one_line(str(message))}", file=file or sys.stderr)


def _one_line(message: str) -> str:
    # a message that quotes a file's content or a library's text must still be one line
    return " ".join(message.split())
