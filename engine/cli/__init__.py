"""Command-line interface. Each subcommand lives in its own module with `register(subparsers)`.

A `UserError` becomes one line on stderr and exit code 2; anything else is a bug and shows its traceback.
"""
from __future__ import annotations

import argparse
import importlib
import sys

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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="main.py", description="TriForce Chat: chat with whole books on your own GPU.")
    sub = parser.add_subparsers(dest="command", metavar="{" + ",".join(COMMANDS) + "}")
    for name, module_name in COMMANDS.items():
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name == module_name:
                continue  # not built yet
            raise
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one subcommand; returns the process exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
