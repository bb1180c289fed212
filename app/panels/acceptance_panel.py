"""Per-level acceptance (L0->L1, L1->L2) with a live plot over the answer, and speed numbers."""
from __future__ import annotations

from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QGridLayout, QLabel, QVBoxLayout, QWidget

from app.panels.common import Card, LabelledBar, fmt_rate, fmt_seconds
from app.theme import Colors, colors
from engine.events import Metrics
from engine.settings import Mode

MIN_X_TOKENS = 32  # the empty plot's token axis: 0..32, never fractions or negative numbers
LEVELS = (("l0_l1", "L0 → L1  draft accepted", "l0"), ("l1_l2", "L1 → L2  retrieval accepted", "l1"))


class AcceptancePanel(Card):
    """Rates as bars, their course over the current answer as a plot, and the speed figures."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__("Acceptance & speed", parent)
        self.bars = {name: LabelledBar(label, level) for name, label, level in LEVELS}
        for bar in self.bars.values():
            self.body.addWidget(bar)
        # the plot (pyqtgraph: a second or more to import) is built after the window is up: its slot
        # keeps the room meanwhile, and the points so far are drawn when it comes
        self._plot_slot = QWidget()
        self._plot_slot.setMinimumHeight(100)
        self._plot_slot.setMaximumHeight(125)
        QVBoxLayout(self._plot_slot).setContentsMargins(0, 0, 0, 0)
        self.body.addWidget(self._plot_slot)
        self._plot: Any = None
        self.curves: dict[str, Any] = {}
        self._colors = colors()
        grid = QGridLayout()
        grid.setHorizontalSpacing(8)
        grid.setVerticalSpacing(8)
        self.stats: dict[str, QLabel] = {}
        names = (("decode", "decode tok/s"), ("ttft", "first token"), ("per_verify", "accepted / verify"),
                 ("prefill", "prefill tok/s"), ("tokens", "answer tokens"), ("mode", "mode"))
        for i, (key, label) in enumerate(names):
            tile = QVBoxLayout()
            tile.setSpacing(0)
            value = QLabel("–")
            value.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
            f = value.font()
            f.setPointSizeF(f.pointSizeF() * 1.3)
            f.setBold(True)
            value.setFont(f)
            name = QLabel(label)
            name.setObjectName("muted")
            nf = name.font()
            nf.setPointSizeF(nf.pointSizeF() * 0.85)
            name.setFont(nf)
            tile.addWidget(value)
            tile.addWidget(name)
            grid.addLayout(tile, i // 3, i % 3)
            self.stats[key] = value
        self.body.addLayout(grid)
        self.summary = QLabel()  # what the engine runs with now (auto-tune changes γ and budget)
        self.summary.setObjectName("muted")
        self.summary.setWordWrap(True)
        f = self.summary.font()
        f.setPointSizeF(f.pointSizeF() * 0.85)
        self.summary.setFont(f)
        self.body.addWidget(self.summary)
        self._points: dict[str, tuple[list[float], list[float]]] = {}
        self._last: dict[str, tuple[int, int]] = {}
        self.start_answer()

    @property
    def plot(self) -> Any:
        """The acceptance plot (a pyqtgraph PlotWidget), built now if it was not yet."""
        if self._plot is None:
            self.build_plot()
        return self._plot

    def build_plot(self) -> None:
        """Build the plot and draw the points so far (the window calls this once it is painted)."""
        if self._plot is not None:
            return
        import pyqtgraph as pg

        plot = self._plot = pg.PlotWidget()
        plot.setMenuEnabled(False)
        plot.setMouseEnabled(x=False, y=False)
        plot.hideButtons()
        plot.setYRange(0, 1.0, padding=0.12)  # room for the 0 and 100% labels at the ends
        plot.getViewBox().disableAutoRange()
        plot.getPlotItem().setContentsMargins(0, 4, 4, 0)
        plot.showGrid(x=False, y=True, alpha=0.15)
        plot.setLabel("bottom", "answer tokens")
        self.curves = {name: plot.plot([], []) for name, _l, _v in LEVELS}
        self._plot_slot.layout().addWidget(plot)
        self.set_colors(self._colors)
        self._draw_points()

    def _draw_points(self) -> None:
        if self._plot is None:
            return
        right = MIN_X_TOKENS
        for name, (xs, ys) in self._points.items():
            self.curves[name].setData(xs, ys)
            right = max(right, xs[-1] if xs else 0)
        self._plot.setXRange(0, right, padding=0.02 if right > MIN_X_TOKENS else 0)  # whole tokens from the start

    def set_colors(self, c: Colors) -> None:
        self._colors = c
        if self._plot is None:
            return
        import pyqtgraph as pg

        self.plot.setBackground(c.base)
        for axis in ("left", "bottom"):
            ax = self.plot.getAxis(axis)
            ax.setPen(pg.mkPen(c.border))
            ax.setTextPen(pg.mkPen(c.muted))
        self.plot.getAxis("left").setTicks([[(0, "0"), (0.5, "50%"), (1.0, "100%")]])
        for name, color in (("l0_l1", c.level_l0), ("l1_l2", c.level_l1)):
            self.curves[name].setPen(pg.mkPen(color, width=2))
            self.curves[name].setSymbol("o")  # a lone first point shows too
            self.curves[name].setSymbolSize(4)
            self.curves[name].setSymbolBrush(pg.mkBrush(color))
            self.curves[name].setSymbolPen(pg.mkPen(color))

    def start_answer(self) -> None:
        """Forget the previous answer's course (the bars keep the last totals until new numbers come)."""
        self._points = {name: ([], []) for name, _l, _v in LEVELS}
        self._last = {name: (0, 0) for name, _l, _v in LEVELS}
        self._draw_points()

    def reset(self) -> None:
        """No numbers at all: a new chat, another chat, or a new model."""
        self.start_answer()
        for bar in self.bars.values():
            bar.set(0.0, "–")
        for label in self.stats.values():
            label.setText("–")
        self.summary.setText("")

    def update_metrics(self, m: Metrics) -> None:
        for name, _label, _lv in LEVELS:
            stats = m.level(name)
            bar = self.bars[name]
            if stats is None:
                mode = Mode.of(m.mode)  # a level this mode never runs is "off"; auto's not-yet-run ones "–"
                runs = {"l0_l1": mode.uses_l0 and mode.uses_l1, "l1_l2": mode.uses_l1}[name]
                bar.set(0.0, "–" if runs else "off")
                continue
            bar.set(stats.rate, fmt_rate(stats.rate), f"{stats.accepted:,} of {stats.proposed:,} drafted tokens")
            # plot the rate over the last interval: what is happening now, not the running mean
            prev_p, prev_a = self._last[name]
            if stats.proposed > prev_p:
                xs, ys = self._points[name]
                xs.append(float(m.new_tokens))
                ys.append((stats.accepted - prev_a) / (stats.proposed - prev_p))
                if self._plot is not None:
                    self.curves[name].setData(xs, ys)
                    self._plot.setXRange(0, max(MIN_X_TOKENS, xs[-1]), padding=0.02)
            self._last[name] = (stats.proposed, stats.accepted)
        s = self.stats
        s["decode"].setText("–" if m.decode_tokens_per_s is None else f"{m.decode_tokens_per_s:.1f}")
        s["ttft"].setText(fmt_seconds(m.time_to_first_token_s))
        s["prefill"].setText("–" if m.prefill_tokens_per_s is None else f"{m.prefill_tokens_per_s:,.0f}")
        s["per_verify"].setText("–" if m.mean_accepted_per_verify is None else f"{m.mean_accepted_per_verify:.2f}")
        s["tokens"].setText(f"{m.new_tokens:,}")
        s["mode"].setText(m.mode)
        self.summary.setText("\n".join(summary_lines(m)))
        self.summary.setToolTip(self.summary.text())


def summary_lines(m: Metrics) -> list[str]:
    """What the engine runs now: the settings, and under auto the structure it picked and the
    expected ms/token of every structure it weighed (fastest first; "~" where still a prior)."""
    lines = [f"engine: {m.settings_summary}"] if m.settings_summary else []
    auto = m.mode == "auto"  # a fixed mode neither weighs structures nor switches between them
    if m.structure:
        switched = f" (switched {m.structure_switches}×)" if m.structure_switches and auto else ""
        lines.append(f"running: {m.structure}{switched}")
    if m.candidates and auto:
        ranked = sorted(m.candidates, key=lambda c: c.ms_per_token)
        lines.append("weighed: " + ", ".join(f"{c.structure} {'' if c.measured else '~'}{c.ms_per_token:.0f} ms"
                                             for c in ranked))
    return lines
