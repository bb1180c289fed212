"""The `auto` policy (docs/design/auto.md): a cost model prices every structure by seconds per
generated token, a schedule runs the cheapest, explores and re-times on a bounded schedule, and the
running structure's draft lengths follow the +2/-1 rule."""
from engine.decoding.auto.policy import AutoPolicy

__all__ = ["AutoPolicy"]
