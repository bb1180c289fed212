"""Decoding controls: each shows its value and valid range; invalid combinations cannot be made.

The budget slider moves in whole chunks and stops at the model's context; the chunk
control snaps the budget to its multiple; the draft window leaves room for the sinks.
Changes are debounced and emitted as a complete, validated `DecodeSettings`.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtWidgets import (QCheckBox, QComboBox, QFormLayout, QGridLayout, QLabel, QPlainTextEdit, QScrollArea,
                               QSlider, QSpinBox, QVBoxLayout, QWidget)

from app.decode_prefs import settings_from_dict, settings_to_dict  # noqa: F401 - re-exported
from app.panels.common import Card
from app.theme import Colors, colors
from app.wheel_guard import guard_wheel
from engine.api import MAX_DOCUMENT_BYTES as MAX_BYTES
from engine.api import SNAPSHOT_CACHE_BYTES
from engine.errors import InvalidSettingError
from engine.settings import MODES, DecodeSettings, Mode

CHUNKS = (4, 8, 16, 32, 64, 128, 256)
MODE_LABELS = {"auto": "Auto (fastest structure, picked online)", "triforce": "TriForce (L0 → L1 → L2)", "ar": "Plain autoregressive", "retrieval-only":
               "Retrieval draft only (L1 → L2)", "draft-only": "Small draft only (L0 → L2)"}
DEFAULT_CONTEXT = 8192
DEFAULT_DOCUMENT_MIB = MAX_BYTES // 2**20
DEFAULT_SNAPSHOT_GIB = SNAPSHOT_CACHE_BYTES // 2**30


class _Slider(QWidget):
    """A slider with its name, current value and valid range. Works in integer steps."""

    changed = Signal()

    def __init__(self, name: str, lo: int, hi: int, fmt: Callable[[int], str], tip: str = "") -> None:
        super().__init__()
        self._fmt = fmt
        grid = QGridLayout(self)
        grid.setContentsMargins(0, 0, 0, 0)
        grid.setVerticalSpacing(2)
        self.name = QLabel(name)
        self.value = QLabel()
        self.value.setAlignment(Qt.AlignmentFlag.AlignRight)
        f = self.value.font()
        f.setBold(True)
        self.value.setFont(f)
        self.slider = QSlider(Qt.Orientation.Horizontal)
        self.slider.setObjectName(name)
        self.range = QLabel()
        self.range.setObjectName("muted")
        rf = self.range.font()
        rf.setPointSizeF(rf.pointSizeF() * 0.85)
        self.range.setFont(rf)
        grid.addWidget(self.name, 0, 0)
        grid.addWidget(self.value, 0, 1)
        grid.addWidget(self.slider, 1, 0, 1, 2)
        grid.addWidget(self.range, 2, 0, 1, 2)
        if tip:
            self.setToolTip(tip)
        self.slider.valueChanged.connect(self._on_value)
        self.set_range(lo, hi)

    def set_range(self, lo: int, hi: int) -> None:
        blocked = self.slider.blockSignals(True)
        self.slider.setRange(lo, max(lo, hi))
        self.slider.blockSignals(blocked)
        self.range.setText(f"valid {self._fmt(lo)} – {self._fmt(max(lo, hi))}")
        self._on_value(self.slider.value(), emit=False)

    def set(self, step: int) -> None:
        blocked = self.slider.blockSignals(True)
        self.slider.setValue(step)
        self.slider.blockSignals(blocked)
        self._on_value(self.slider.value(), emit=False)

    def get(self) -> int:
        return self.slider.value()

    def _on_value(self, step: int, emit: bool = True) -> None:
        self.value.setText(self._fmt(step))
        if emit:
            self.changed.emit()


class SettingsPanel(QScrollArea):
    """All decoding controls. `settingsChanged(DecodeSettings)` fires ~150 ms after the last change."""

    settingsChanged = Signal(object)
    colorLevelsChanged = Signal(bool)
    systemPromptChanged = Signal(str)
    limitsChanged = Signal(int, int)  # largest document (MiB), prefilled-book cache (GiB)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWidgetResizable(True)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        inner = QWidget()
        inner.setObjectName("rightPane")
        col = QVBoxLayout(inner)
        col.setContentsMargins(10, 10, 10, 10)
        col.setSpacing(10)
        self._context = DEFAULT_CONTEXT
        self._settings = DecodeSettings()
        self._loading = False

        mode_card = Card("Decoding")
        self.mode = QComboBox()
        self.mode.setObjectName("mode")
        self.mode.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        self.mode.setMinimumContentsLength(12)
        for m in MODES:
            self.mode.addItem(MODE_LABELS.get(m, m), m)
        form = QFormLayout()
        form.setContentsMargins(0, 0, 0, 0)
        form.addRow("Mode", self.mode)
        mode_card.body.addLayout(form)
        self.auto = QCheckBox("Auto-tune γ1, γ2 and budget")
        self.auto.setToolTip("With a fixed mode: pick γ1, γ2 and the retrieval budget from measured step times and acceptance")
        self.auto.setObjectName("auto")
        mode_card.body.addWidget(self.auto)
        self.color_levels = QCheckBox("Colour answers by level")
        self.color_levels.setToolTip("Green: drafted by L0 · Blue: drafted by L1 (retrieval) · Purple: L2 (full cache)")
        self.color_levels.toggled.connect(self.colorLevelsChanged.emit)
        mode_card.body.addWidget(self.color_levels)
        self.legend = QLabel()  # our own text (not model output), so rich text is safe here
        self.legend.setTextFormat(Qt.TextFormat.RichText)
        self.legend.setVisible(False)
        self.color_levels.toggled.connect(self.legend.setVisible)
        mode_card.body.addWidget(self.legend)
        self.set_colors(colors())
        col.addWidget(mode_card)

        retr = Card("Retrieval cache (L1)")
        self.chunk = _Slider("Chunk", 0, len(CHUNKS) - 1, lambda i: f"{CHUNKS[i]} tokens",
                             "Tokens per retrieval chunk; the budget is a whole number of chunks")
        self.budget = _Slider("Budget", 2, 64, self._budget_text,
                              "Tokens of the full cache that L1 attends to (top-scoring chunks + recent)")
        retr.body.addWidget(self.budget)
        retr.body.addWidget(self.chunk)
        col.addWidget(retr)

        draft = Card("Drafter (L0)")
        self.sinks = _Slider("Sinks", 0, 64, lambda v: f"{v} tokens", "Attention-sink tokens kept at the start")
        self.window = _Slider("Recent window", 1, 4096, lambda v: f"{v} tokens", "Most recent tokens kept")
        self.gamma1 = _Slider("γ1 · L0 drafts per L1 check", 1, 16, str)
        self.gamma2 = _Slider("γ2 · L1 drafts per L2 check", 1, 32, str)
        for w in (self.sinks, self.window, self.gamma1, self.gamma2):
            draft.body.addWidget(w)
        col.addWidget(draft)

        samp = Card("Sampling")
        self.temperature = _Slider("Temperature", 0, 200, lambda v: "0 (greedy)" if v == 0 else f"{v / 100:.2f}")
        self.top_p = _Slider("Top-p", 5, 100, lambda v: f"{v / 100:.2f}")
        # penalties are part of the target distribution, applied alike at every level (stays exact)
        self.frequency = _Slider("Repetition penalty", 0, 200, lambda v: "off" if v == 0 else f"{v / 100:.2f}",
                                 "Lowers a token's logit by this much for each time it is already in the answer")
        self.presence = _Slider("Presence penalty", 0, 200, lambda v: "off" if v == 0 else f"{v / 100:.2f}",
                                "Lowers a token's logit by this much once it appears in the answer")
        self.max_new = QSpinBox()
        self.max_new.setObjectName("max_new_tokens")
        self.max_new.setRange(1, 8192)
        self.max_new.setSingleStep(64)
        self.max_new.setToolTip("Longest answer, in tokens (valid 1 – 8192)")
        self.max_new.setMaximumWidth(110)
        samp.body.addWidget(self.temperature)
        samp.body.addWidget(self.top_p)
        samp.body.addWidget(self.frequency)
        samp.body.addWidget(self.presence)
        form2 = QFormLayout()
        form2.setContentsMargins(0, 0, 0, 0)
        form2.addRow("Max answer tokens", self.max_new)
        samp.body.addLayout(form2)
        col.addWidget(samp)

        sysc = Card("System prompt")
        self.system = QPlainTextEdit()
        self.system.setObjectName("systemPrompt")
        self.system.setPlaceholderText("Optional instructions for every answer in this chat")
        self.system.setMaximumHeight(80)
        sysc.body.addWidget(self.system)
        col.addWidget(sysc)

        store = Card("Storage")
        form3 = QFormLayout()
        self.max_document = QSpinBox(minimum=1, maximum=4096, suffix=" MiB", value=DEFAULT_DOCUMENT_MIB)
        self.max_document.setToolTip("Files larger than this are refused before reading (1 to 4096 MiB)")
        self.snapshot_cache = QSpinBox(minimum=1, maximum=4096, suffix=" GiB", value=DEFAULT_SNAPSHOT_GIB)
        self.snapshot_cache.setToolTip("Disk kept for prefilled books (KV snapshots), oldest dropped first "
                                       "(1 to 4096 GiB)")
        form3.addRow("Largest document", self.max_document)
        form3.addRow("Prefilled-book cache", self.snapshot_cache)
        store.body.addLayout(form3)
        col.addWidget(store)
        for box in (self.max_document, self.snapshot_cache):
            box.editingFinished.connect(self._emit_limits)

        self.error = QLabel()
        self.error.setObjectName("errorText")
        self.error.setWordWrap(True)
        self.error.hide()
        col.addWidget(self.error)
        col.addStretch(1)
        self.setWidget(inner)

        self._debounce = QTimer(self, singleShot=True, interval=150)
        self._debounce.timeout.connect(self._emit)
        self._system_debounce = QTimer(self, singleShot=True, interval=400)
        self._system_debounce.timeout.connect(lambda: self.systemPromptChanged.emit(self.system.toPlainText()))
        self.system.textChanged.connect(lambda: None if self._loading else self._system_debounce.start())
        for s in (self.budget, self.sinks, self.window, self.gamma1, self.gamma2, self.temperature, self.top_p,
                  self.frequency, self.presence):
            s.changed.connect(self._changed)
        self.chunk.changed.connect(self._on_chunk)
        self.sinks.changed.connect(self._on_sinks)
        self.mode.currentIndexChanged.connect(lambda _i: self._changed())
        self.auto.toggled.connect(lambda _on: self._changed())
        self.max_new.valueChanged.connect(lambda _v: self._changed())
        self._wheel_guard = guard_wheel(inner)  # scrolling the panel never moves a control under the pointer
        self.set_settings(self._settings)

    # --- public API ----------------------------------------------------------------------

    def set_colors(self, c: Colors) -> None:
        swatch = '<span style="color:{}">■</span> {}'
        self.legend.setText("&nbsp;&nbsp;".join(swatch.format(c.level(i), name) for i, name in
                                                enumerate(("L0 drafter", "L1 retrieval", "L2 full cache"))))

    def settings(self) -> DecodeSettings:
        """The settings the controls show now (always valid for the current context)."""
        chunk = CHUNKS[self.chunk.get()]
        mode = self.mode.currentData()
        return self._settings.replace(
            mode=mode, chunk=chunk, budget=self.budget.get() * chunk,
            draft_sinks=self.sinks.get(), draft_window=self.window.get(),
            gamma1=self.gamma1.get(), gamma2=self.gamma2.get(), auto=self.auto.isChecked(),
            max_new_tokens=self.max_new.value(),
            sampling=dataclasses.replace(self._settings.sampling, temperature=self.temperature.get() / 100,
                                         top_p=self.top_p.get() / 100, frequency_penalty=self.frequency.get() / 100,
                                         presence_penalty=self.presence.get() / 100))

    def set_context(self, max_context: int) -> None:
        """The model's context bounds the budget; re-clamp what is shown."""
        self._context = max(64, int(max_context or DEFAULT_CONTEXT))
        current = self.settings()
        self.set_settings(current)
        if self.settings() != current:
            self._changed()

    def set_settings(self, s: DecodeSettings) -> None:
        """Show `s`, snapped into the valid ranges (no signal)."""
        self._loading = True
        try:
            self._settings = s
            chunk_i = min(range(len(CHUNKS)), key=lambda i: abs(CHUNKS[i] - s.chunk))
            self.chunk.set(chunk_i)
            self._update_budget_range(s.budget)
            self.sinks.set(max(0, min(64, s.draft_sinks)))
            self._update_window_range(s.draft_window)
            self.gamma1.set(s.gamma1)
            self.gamma2.set(s.gamma2)
            self.temperature.set(round(min(2.0, s.sampling.temperature) * 100))
            self.top_p.set(round(max(0.05, s.sampling.top_p) * 100))
            self.frequency.set(round(min(2.0, max(0.0, s.sampling.frequency_penalty)) * 100))
            self.presence.set(round(min(2.0, max(0.0, s.sampling.presence_penalty)) * 100))
            self.mode.setCurrentIndex(max(0, self.mode.findData(s.mode)))
            self.auto.setChecked(s.auto)
            self.max_new.setValue(max(1, min(8192, s.max_new_tokens)))
            self._update_enabled()
            self._settings = self.settings()
        finally:
            self._loading = False

    def set_system_prompt(self, text: str) -> None:
        self._loading = True
        try:
            self.system.setPlainText(text or "")
        finally:
            self._loading = False

    def system_prompt(self) -> str:
        return self.system.toPlainText().strip()

    def show_error(self, message: str) -> None:
        self.error.setText(message)
        self.error.setVisible(bool(message))

    # --- internals -----------------------------------------------------------------------

    def _budget_text(self, chunks: int) -> str:
        chunk = CHUNKS[self.chunk.get()] if hasattr(self, "chunk") else 16
        return f"{chunks * chunk:,} tokens"

    def _update_budget_range(self, budget_tokens: int) -> None:
        chunk = CHUNKS[self.chunk.get()]
        hi = max(2, self._context // chunk)
        self.budget.set_range(2, hi)  # in chunks: every position is a multiple of the chunk
        self.budget.set(max(2, min(hi, round(budget_tokens / chunk))))

    def _update_window_range(self, window: int) -> None:
        hi = max(1, min(4096, self._context - self.sinks.get()))
        self.window.set_range(1, hi)
        self.window.set(max(1, min(hi, window)))

    def _update_enabled(self) -> None:
        mode = self.mode.currentData()
        auto = self.auto.isChecked() or mode == Mode.AUTO  # auto picks the gammas itself
        uses_l0, uses_l1 = Mode.of(mode).uses_l0, Mode.of(mode).uses_l1
        self.budget.setEnabled(uses_l1 and not auto)
        self.chunk.setEnabled(uses_l1)
        self.gamma1.setEnabled(uses_l0 and not auto)
        self.gamma2.setEnabled(uses_l1 and not auto)
        self.sinks.setEnabled(uses_l0)
        self.window.setEnabled(uses_l0)

    def _on_chunk(self) -> None:
        # keep the budget's token count as close as it can be, now in whole new chunks
        old_tokens = self._settings.budget
        self._update_budget_range(old_tokens)
        self._changed()

    def _on_sinks(self) -> None:
        self._update_window_range(self.window.get())

    def _changed(self) -> None:
        if self._loading:
            return
        self._update_enabled()
        self._settings = self.settings()
        self._debounce.start()

    def _emit(self) -> None:
        s = self.settings()
        try:
            s.validate(self._context)
        except InvalidSettingError as exc:  # should not happen: the controls prevent it
            self.show_error(str(exc))
            return
        self.show_error("")
        self.settingsChanged.emit(s)

    def limits(self) -> tuple[int, int]:
        """(largest document in MiB, prefilled-book cache in GiB)."""
        return self.max_document.value(), self.snapshot_cache.value()

    def set_limits(self, document_mib: int, snapshot_gib: int) -> None:
        for box, value in ((self.max_document, document_mib), (self.snapshot_cache, snapshot_gib)):
            blocked = box.blockSignals(True)
            box.setValue(int(value))
            box.blockSignals(blocked)

    def _emit_limits(self) -> None:
        self.limitsChanged.emit(*self.limits())

    def flush(self) -> None:
        """Emit a pending change now (tests, and before sending a message)."""
        if self._debounce.isActive():
            self._debounce.stop()
            self._emit()
