"""TriForce Chat desktop app (PySide6). Talks to engine/ only through its event dataclasses."""
from app._compat import immortalize_singletons

immortalize_singletons()
