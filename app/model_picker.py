"""Choose a model: the bundled one, the presets, models on this computer, a folder, a .gguf file,
or a Hugging Face repo id (downloaded with progress when loaded). Before loading, the planner's
plan shows what goes where and whether it fits.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtGui import QFontDatabase
from PySide6.QtWidgets import (QComboBox, QDialog, QDialogButtonBox, QFileDialog, QFormLayout, QHBoxLayout, QLabel,
                               QLineEdit, QListView, QListWidget, QListWidgetItem, QPlainTextEdit, QPushButton, QSpinBox,
                               QSplitter, QVBoxLayout, QWidget)

from app.overflow import window_label
from app.wheel_guard import guard_wheel
from engine.errors import UserError
from engine.api import BUNDLED_ID, PRESETS

PROFILES = (("auto", "This computer (detected)"), ("cpu", "CPU only"), ("4090", "One RTX 4090 (24 GB)"),
            ("4090x2", "Two RTX 4090s (2 × 24 GB)"))
GPUS_NEEDED = {"4090": 1, "4090x2": 2}  # a plan for another computer: Load needs this many GPUs here


def gpus_here() -> int:
    """How many GPUs this machine has (NVML), 0 when none or when it cannot tell."""
    try:
        from engine.api import sample_memory
        return len(sample_memory().gpus)
    except Exception:  # noqa: BLE001 - no telemetry: plan only, never load for a GPU we cannot see
        return 0


def load_refusal(profile: str, gpus: int) -> str:
    """Why a plan for `profile` cannot be loaded on a machine with `gpus` GPUs ("" when it can)."""
    needed = GPUS_NEEDED.get(profile, 0)
    if gpus >= needed:
        return ""
    label = dict(PROFILES)[profile]
    have = "no GPU" if gpus == 0 else f"{gpus} GPU{'s' if gpus != 1 else ''}"
    return (f"This plan is for {label}; this computer has {have}, so it cannot load it here. "
            "Choose \"This computer (detected)\" to see what loads on this machine.")


@dataclass(frozen=True)
class ModelChoice:
    label: str
    spec: str  # what load_model gets
    draft: str  # "ngram" or a model spec
    shape_spec: str  # what the planner reads the shape from
    note: str = ""


def builtin_choices() -> list[ModelChoice]:
    out = [ModelChoice("SmolLM2-135M-Instruct (bundled)", "bundled", "ngram", BUNDLED_ID,
                       "Ships with the app; runs on any CPU; n-gram drafting")]
    for p in PRESETS:
        if p.target == BUNDLED_ID:
            continue
        draft = p.draft or "ngram"
        short = p.target.split("/")[-1]
        label = f"{short}\n   + {p.draft.split('/')[-1]} (draft)" if p.draft else short  # two short lines, never cut
        out.append(ModelChoice(label, p.target, draft, p.target, f"{p.note} · downloads from Hugging Face"))
    return out


def local_choices() -> list[ModelChoice]:
    try:
        from engine.api import list_local_models
        models = list_local_models()
    except Exception:  # noqa: BLE001 - a broken cache folder must not break the picker
        return []
    out = []
    for m in models:
        if m.source == "bundled":
            continue
        size = f"{m.size_bytes / 1e9:.1f} GB" if m.size_bytes >= 1e8 else f"{m.size_bytes / 1e6:.0f} MB"
        blocks = f" · {m.kinds} · needs {m.ram_bytes / 1e9:.1f} GB RAM at {m.context:,} tokens · {m.runs}" \
            if getattr(m, "kinds", "") else ""  # a GGUF: its block kinds, RAM and which kinds run natively
        out.append(ModelChoice(f"{m.name}  ({m.source})", str(m.path), "ngram", str(m.path),
                               f"{m.model_type} · {size}{blocks} · {m.path}"))
    return out


def window_choice_label(window: int, trained: int) -> str:
    """How the context choice reads: "8K — as trained", "32K — stretched 4x (YaRN): lower quality
    beyond the trained 8K"."""
    if window <= trained:
        return f"{window_label(trained)} — as trained"
    return (f"{window_label(window)} — stretched {window / trained:g}x (YaRN): lower quality beyond the "
            f"trained {window_label(trained)}")


class ModelPicker(QDialog):
    """Emits `modelChosen(spec, draft)` and `loadChosen(spec, draft, window)` on Load (window: the
    context chosen, 0 = as trained); the main window loads it in the worker."""

    modelChosen = Signal(str, str)
    loadChosen = Signal(str, str, int)

    def __init__(self, parent: QWidget | None = None, current: str | None = None, context: int | None = None,
                 current_window: int = 0) -> None:
        """`context`: plan for this many tokens (what a document that did not fit needs) instead of
        each model's whole context, and choose the smallest window that holds it. `current_window`:
        the window `current` runs at now (0: as trained)."""
        super().__init__(parent)
        self._wanted_context = context
        self._current = current
        self._current_window = int(current_window or 0)
        self._trained = 0  # the chosen model's trained context (0: unknown)
        self._gpu_count: int | None = None  # GPUs on this machine, looked up once
        self.setWindowTitle("Choose a model")
        self.resize(1060, 600)
        lay = QVBoxLayout(self)
        split = QSplitter(Qt.Orientation.Horizontal)
        left = QWidget()
        ll = QVBoxLayout(left)
        ll.setContentsMargins(0, 0, 0, 0)
        self.list = QListWidget()
        self.list.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.list.setWordWrap(True)  # long preset names wrap instead of being cut off
        self.list.setResizeMode(QListView.ResizeMode.Adjust)  # ... and re-wrap when the list is resized
        self.list.setTextElideMode(Qt.TextElideMode.ElideNone)
        self.list.setSpacing(1)
        ll.addWidget(self.list, 1)
        row = QHBoxLayout()
        self.open_folder = QPushButton("Open folder…")
        self.open_gguf = QPushButton("Open .gguf…")
        row.addWidget(self.open_folder)
        row.addWidget(self.open_gguf)
        ll.addLayout(row)
        hub = QHBoxLayout()
        self.repo_id = QLineEdit()
        self.repo_id.setPlaceholderText("Hugging Face repo id, e.g. HuggingFaceTB/SmolLM2-360M-Instruct")
        self.use_repo = QPushButton("Use")
        hub.addWidget(self.repo_id, 1)
        hub.addWidget(self.use_repo)
        ll.addLayout(hub)
        split.addWidget(left)

        right = QWidget()
        rl = QVBoxLayout(right)
        rl.setContentsMargins(8, 0, 0, 0)
        self.title = QLabel()
        f = self.title.font()
        f.setBold(True)
        f.setPointSizeF(f.pointSizeF() * 1.15)
        self.title.setFont(f)
        self.title.setWordWrap(True)
        rl.addWidget(self.title)
        self.note = QLabel()
        self.note.setObjectName("muted")
        self.note.setWordWrap(True)
        rl.addWidget(self.note)
        form = QFormLayout()
        self.profile = QComboBox()
        for key, label in PROFILES:
            self.profile.addItem(label, key)
        self.context = QSpinBox()
        self.context.setRange(256, 1 << 20)
        self.context.setSingleStep(4096)
        self.context.setSuffix(" tokens")
        self.context.setToolTip("How many tokens (documents + conversation + answer) to plan the cache for")
        self.window_choice = QComboBox()
        self.window_choice.setToolTip("How many tokens the model reads. Past what it was trained on, its positions "
                               "are stretched (YaRN, the smallest factor that fits): it reads more, less well.")
        self.window_note = QLabel()
        self.window_note.setObjectName("muted")
        self.window_note.setWordWrap(True)
        self.window_note.hide()
        form.addRow("Plan for", self.profile)
        form.addRow("Context window", self.window_choice)
        form.addRow("", self.window_note)
        form.addRow("Plan the cache for", self.context)
        rl.addLayout(form)
        self.verdict = QLabel()
        self.verdict.setWordWrap(True)
        rl.addWidget(self.verdict)
        self.plan_text = QPlainTextEdit()
        self.plan_text.setReadOnly(True)
        self.plan_text.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
        self.plan_text.setLineWrapMode(QPlainTextEdit.LineWrapMode.WidgetWidth)  # no plan line is cut off
        rl.addWidget(self.plan_text, 1)
        split.addWidget(right)
        split.setSizes([360, 700])
        lay.addWidget(split, 1)
        self.buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Cancel)
        self.load_button = self.buttons.addButton("Load", QDialogButtonBox.ButtonRole.AcceptRole)
        self.load_button.setObjectName("primary")
        self.buttons.accepted.connect(self._on_load)
        self.buttons.rejected.connect(self.reject)
        lay.addWidget(self.buttons)

        self._choices: list[ModelChoice] = []
        self._add_section("Bundled & presets", builtin_choices())
        self._add_section("On this computer", local_choices())
        self._plan_timer = QTimer(self, singleShot=True, interval=120)
        self._plan_timer.timeout.connect(self._update_plan)
        self.list.currentItemChanged.connect(lambda *_: self._on_selected())
        self.profile.currentIndexChanged.connect(lambda _i: self._plan_timer.start())
        self.context.valueChanged.connect(lambda _v: self._plan_timer.start())
        self.window_choice.currentIndexChanged.connect(lambda _i: self._on_window_changed())
        self.open_folder.clicked.connect(self._pick_folder)
        self.open_gguf.clicked.connect(self._pick_gguf)
        self.use_repo.clicked.connect(self._use_repo)
        self.repo_id.returnPressed.connect(self._use_repo)
        self._guard = guard_wheel(self)
        self._select(current)

    def chosen(self) -> ModelChoice | None:
        item = self.list.currentItem()
        data = item.data(Qt.ItemDataRole.UserRole) if item else None
        return data if isinstance(data, ModelChoice) else None

    def chosen_window(self) -> int:
        """The context window chosen: 0 = as trained, else the stretched window in tokens."""
        window = self.window_choice.currentData()
        return int(window) if window and window > self._trained else 0

    def add_choice(self, choice: ModelChoice) -> None:
        """A folder, file or repo id the user typed: add it to the list and select it."""
        item = QListWidgetItem(choice.label)
        item.setData(Qt.ItemDataRole.UserRole, choice)
        item.setToolTip(_tooltip(choice))
        self.list.addItem(item)
        self.list.setCurrentItem(item)

    # --- internals -----------------------------------------------------------------------

    def _add_section(self, title: str, choices: list[ModelChoice]) -> None:
        if not choices:
            return
        header = QListWidgetItem(title.upper())
        header.setFlags(Qt.ItemFlag.NoItemFlags)
        f = header.font()
        f.setBold(True)
        f.setPointSizeF(f.pointSizeF() * 0.85)
        header.setFont(f)
        self.list.addItem(header)
        for c in choices:
            item = QListWidgetItem("   " + c.label)
            item.setData(Qt.ItemDataRole.UserRole, c)
            item.setToolTip(_tooltip(c))
            self.list.addItem(item)

    def _select(self, spec: str | None) -> None:
        first = None
        for i in range(self.list.count()):
            c = self.list.item(i).data(Qt.ItemDataRole.UserRole)
            if isinstance(c, ModelChoice):
                first = first if first is not None else i
                if spec and c.spec == spec:
                    self.list.setCurrentRow(i)
                    return
        if first is not None:
            self.list.setCurrentRow(first)

    def _on_selected(self) -> None:
        c = self.chosen()
        self.load_button.setEnabled(c is not None and not load_refusal(self.profile.currentData(), self._gpus_here()))
        if c is None:
            return
        self.title.setText(" ".join(c.label.split()))
        self.note.setText(c.note)
        shape = self._shape(c.shape_spec)
        self._fill_windows(c, shape)
        if shape is not None or self._wanted_context:
            planned = self._wanted_context or self.window_choice.currentData() or shape.max_context
            blocked = self.context.blockSignals(True)
            self.context.setValue(min(planned, 1 << 20))
            self.context.blockSignals(blocked)
        self._plan_timer.start()

    def _fill_windows(self, c: ModelChoice, shape) -> None:
        """The context choices for `c`: as trained, and the stretches engine.api offers (x2, x4); the
        one selected holds what is wanted, else the current model's window, else the trained one."""
        from engine.api import context_options
        blocked = self.window_choice.blockSignals(True)
        self.window_choice.clear()
        self._trained = 0
        try:
            options = context_options(c.shape_spec) if shape is not None else None
        except (UserError, ImportError):
            options = None
        if options is not None:
            self._trained = options.trained
            for window in (options.trained, *options.stretched):
                self.window_choice.addItem(window_choice_label(window, options.trained), window)
            self.window_note.setText(options.refusal and "No longer context: " + options.refusal)
            self.window_note.setVisible(bool(options.refusal))
            wanted = self._wanted_context or (self._current_window if c.spec == self._current else 0)
            windows = [options.trained, *options.stretched]
            pick = next((i for i, w in enumerate(windows) if w >= wanted), 0) if wanted else 0
            self.window_choice.setCurrentIndex(pick)
        self.window_choice.setEnabled(self.window_choice.count() > 1)
        self.window_choice.blockSignals(blocked)

    def _on_window_changed(self) -> None:
        """A window chosen: plan the cache for it."""
        window = self.window_choice.currentData()
        if window:
            self.context.setValue(min(int(window), 1 << 20))  # replans (valueChanged)
        self._plan_timer.start()

    @staticmethod
    def _shape(spec: str):
        try:
            from engine.api import shape_for
            return shape_for(spec)
        except (UserError, ImportError):
            return None

    def _update_plan(self) -> None:
        c = self.chosen()
        if c is None:
            return
        try:
            from engine.api import describe_plan, preview_plan
            plan = preview_plan(c.shape_spec, c.draft, self.context.value(), self._decode_settings(),
                                self.profile.currentData(), ram_bytes=self._machine_ram(),
                                stretch=self.chosen_window() > 0)
        except UserError as exc:
            self._show_verdict(None, str(exc))
            self.plan_text.setPlainText("")
            # the plan could not be made: loading will say why (unless the plan is for another computer)
            self.load_button.setEnabled(not load_refusal(self.profile.currentData(), self._gpus_here()))
            return
        except ImportError:
            self._show_verdict(None, "The planner is not available in this build.")
            return
        self.plan_text.setPlainText(describe_plan(plan))
        self._mark_fitting_windows(c)
        shape = self._shape(c.shape_spec)
        reads = self.chosen_window() or (shape.max_context if shape is not None else 0)
        if shape is not None and self.context.value() > reads:
            longer = [self.window_choice.itemData(i) for i in range(self.window_choice.count())
                      if self.window_choice.itemData(i) >= self.context.value() and self._window_enabled(i)]
            hint = (f"Choose the {window_label(longer[0])} context window, or a model with a longer context."
                    if longer else "Pick a model with a longer context.")
            self._show_verdict(False, f"Does not fit: at this window the model reads at most {reads:,} tokens, "
                                      f"{self.context.value():,} are needed. {hint}")
            self.load_button.setEnabled(False)
            return
        self.load_button.setEnabled(plan.fits)  # the reason is the verdict under the title
        if plan.fits:
            f = plan.floors
            self._show_verdict(True, f"Fits ({plan.mode}). Modelled speed: {f.tokens_per_s:.1f} tokens/s, "
                                     f"{f.speedup_vs_ar:.1f}× plain decoding.")
        else:
            self._show_verdict(False, "Does not fit: " + "; ".join(map(str, plan.shortfalls))
                               + ". Try a shorter context, a smaller model, or another device profile.")
        refusal = load_refusal(self.profile.currentData(), self._gpus_here())
        self.load_button.setToolTip(refusal)
        if refusal:  # planning for other hardware is fine; loading for it here is not
            self.load_button.setEnabled(False)
            if plan.fits:
                self._show_verdict(False, f"Fits there ({plan.mode}), not here: {refusal}")

    def _mark_fitting_windows(self, c: ModelChoice) -> None:
        """Grey out the stretched windows whose plan does not fit on the chosen profile (the planner's
        check, engine.api.preview_plan)."""
        from app.engine_backend import fitting_stretches
        if self.window_choice.count() < 2:
            return
        _, fitting = fitting_stretches(c.shape_spec, c.draft, self._decode_settings(), self.profile.currentData(),
                                       self._machine_ram())
        model = self.window_choice.model()
        for i in range(1, self.window_choice.count()):
            window = self.window_choice.itemData(i)
            item = model.item(i)
            item.setEnabled(window in fitting)
            base = window_choice_label(window, self._trained)
            self.window_choice.setItemText(i, base if window in fitting else base + " — does not fit here")

    def _window_enabled(self, index: int) -> bool:
        item = self.window_choice.model().item(index)
        return item is None or item.isEnabled()

    def _gpus_here(self) -> int:
        if self._gpu_count is None:
            self._gpu_count = gpus_here()
        return self._gpu_count

    def _machine_ram(self) -> int | None:
        """This machine's RAM: a GPU profile plans with it (not a 128 GB workstation's)."""
        if self.profile.currentData() not in ("4090", "4090x2"):
            return None
        try:
            from engine.api import sample_memory
            return int(sample_memory().ram_total_bytes) or None
        except Exception:  # noqa: BLE001 - no telemetry: the profile's own figure
            return None

    def _decode_settings(self):
        from engine.settings import DecodeSettings
        parent = self.parent()
        panel = getattr(parent, "settings_panel", None)
        return panel.settings() if panel is not None else DecodeSettings()

    def _show_verdict(self, fits: bool | None, text: str) -> None:
        color = {True: "#2e8b57", False: "#c53b3b", None: ""}[fits]
        self.verdict.setStyleSheet(f"color: {color}; font-weight: 600;" if color else "")
        self.verdict.setText(text)

    def _pick_folder(self) -> None:
        path = QFileDialog.getExistingDirectory(self, "Model folder (config.json + *.safetensors)")
        if path:
            self.add_choice(ModelChoice(Path(path).name + "  (folder)", path, "ngram", path, path))

    def _pick_gguf(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "GGUF model", "", "GGUF models (*.gguf)")
        if path:
            self.add_choice(ModelChoice(Path(path).name, path, "ngram", path, f"{path} · converted once on first load"))

    def _use_repo(self) -> None:
        repo = self.repo_id.text().strip()
        if repo:
            self.add_choice(ModelChoice(repo, repo, "ngram", repo, "downloads from Hugging Face when loaded"))

    def _on_load(self) -> None:
        c = self.chosen()
        if c is not None and self.load_button.isEnabled():
            self.modelChosen.emit(c.spec, c.draft)
            self.loadChosen.emit(c.spec, c.draft, self.chosen_window())
            self.accept()


def _tooltip(c: ModelChoice) -> str:
    return f"{c.label.strip()}\n{c.note}" if c.note else c.label.strip()
