"""Cache budget bars: the target's full KV cache, L1's retrieval cache, the drafter's window."""
from __future__ import annotations

from PySide6.QtWidgets import QWidget

from app.panels.common import Card, LabelledBar, fmt_bytes, fmt_tokens
from engine.events import CacheStats, Metrics, PrefillProgress
from engine.settings import DecodeSettings, Mode


class CachePanel(Card):
    """Shows `Metrics.caches`; before the first metrics it shows the configured budgets."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__("Caches", parent)
        self.full = LabelledBar("Full KV (L2)", "l2")
        self.retrieval = LabelledBar("Retrieval (L1)", "l1")
        self.draft = LabelledBar("Draft window (L0)", "l0")
        for bar in (self.full, self.retrieval, self.draft):
            self.body.addWidget(bar)
        self._settings = DecodeSettings()
        self._context = 0
        self.show_idle()

    def set_context(self, max_context: int) -> None:
        self._context = max_context
        self.show_idle()

    def set_settings(self, settings: DecodeSettings) -> None:
        self._settings = settings

    def show_idle(self) -> None:
        s = self._settings
        self.full.set(0.0, f"0 / {fmt_tokens(self._context) if self._context else '–'}", "no prompt yet")
        self.retrieval.set(0.0, f"budget {s.budget:,}", f"chunks of {s.chunk} · {s.budget // s.chunk} per KV head")
        self.draft.set(0.0, f"{s.draft_sinks} + {s.draft_window}", "sinks + recent tokens")

    def update_prefill(self, ev: PrefillProgress) -> None:
        """While a prompt (a document) is read, the full cache fills: reused + computed tokens so far."""
        held = ev.reused + ev.done
        context = self._context or None
        fraction = min(1.0, held / context) if context else None
        self.full.set(fraction, f"{held:,} / {fmt_tokens(self._context) if context else '–'}",
                      f"reading the prompt: {ev.done:,} of {ev.total:,} new tokens")

    def update_metrics(self, metrics: Metrics) -> None:
        by_name = {c.name: c for c in metrics.caches}
        for name, bar in (("full", self.full), ("retrieval", self.retrieval), ("draft", self.draft)):
            stats = by_name.get(name)
            if stats is not None:
                bar.set(*self._describe(stats, metrics))
        mode = Mode.of(metrics.mode)  # auto may use every level: its caches show once it does
        uses_l0 = mode.uses_l0
        if "retrieval" not in by_name and not mode.uses_l1:
            self.retrieval.set(0.0, "off", f"not used in {metrics.mode} mode")
        if "draft" not in by_name:
            self.draft.set(0.0, "n-gram" if uses_l0 else "off",
                           "drafts by looking the context up: no KV cache" if uses_l0
                           else f"not used in {metrics.mode} mode")
        if "retrieval" in by_name and metrics.retrieval_rebuilds:
            self.retrieval.detail.setText(self.retrieval.detail.text()
                                          + f" · rebuilt {metrics.retrieval_rebuilds}×")
        self.retrieval.detail.setToolTip("Rebuilt after each prefill, when L1's acceptance drops, or every stride")

    @staticmethod
    def _describe(c: CacheStats, metrics: Metrics) -> tuple[float | None, str, str]:
        fraction = c.tokens / c.capacity if c.capacity else None
        value = f"{c.tokens:,} / {c.capacity:,}"
        first = " · ".join(p for p in (f"{fmt_bytes(c.bytes_used)} of {fmt_bytes(c.bytes_reserved)}"
                                         if c.bytes_reserved else "", c.device) if p)
        return fraction, value, "\n".join(p for p in (first, c.detail) if p)
