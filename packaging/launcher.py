"""Frozen-app entry point for pyside6-deploy / Nuitka (the installed app runs `triforce-chat`,
i.e. app.main_window:run_app, directly). Kept tiny so the compiler finds every import from here."""
import sys

from app.main_window import run_app

if __name__ == "__main__":
    sys.exit(run_app())
