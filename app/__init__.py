"""TriForce Chat desktop app (PySide6). Talks to engine/ only through its event dataclasses."""
