"""Memory: per-GPU VRAM (all processes, and this one), system RAM and this process's RSS.

Samples come from `engine.offload.telemetry.sample_memory()` on a small sampler thread (NVML calls
can take milliseconds; the GUI thread never waits on them), twice a second.
"""
from __future__ import annotations

import logging
from typing import Any

from PySide6.QtCore import QObject, QThread, QTimer, Signal, Slot
from PySide6.QtWidgets import QLabel, QWidget

from app.panels.common import Card, LabelledBar, fmt_bytes

log = logging.getLogger(__name__)
SAMPLE_INTERVAL_MS = 500


def _sample() -> Any:
    from engine.api import sample_memory
    return sample_memory()


class MemorySampler(QObject):
    """Lives on its own thread; emits one sample every `SAMPLE_INTERVAL_MS`."""

    sampled = Signal(object)

    def __init__(self) -> None:
        super().__init__()
        self._timer: QTimer | None = None
        self._failed = False

    @Slot()
    def start(self) -> None:
        self._timer = QTimer(self)
        self._timer.setInterval(SAMPLE_INTERVAL_MS)
        self._timer.timeout.connect(self.sample)
        self._timer.start()
        self.sample()

    @Slot()
    def stop(self) -> None:
        if self._timer is not None:
            self._timer.stop()

    @Slot()
    def sample(self) -> None:
        try:
            self.sampled.emit(_sample())
        except Exception:  # noqa: BLE001 - telemetry must never take the app down; say it once
            if not self._failed:
                log.exception("memory sampling failed")
                self._failed = True
            if self._timer is not None:
                self._timer.stop()


class MemoryPanel(Card):
    """GPU bars (or "no GPU"), a RAM bar, this process's footprint."""

    _startRequested = Signal()
    _stopRequested = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__("Memory", parent)
        self.no_gpu = QLabel("No GPU — running on the CPU")
        self.no_gpu.setObjectName("muted")
        self.body.addWidget(self.no_gpu)
        self.gpu_bars: list[LabelledBar] = []
        self.ram = LabelledBar("System RAM")
        self.body.addWidget(self.ram)
        self.process = QLabel("This app: –")
        self.process.setObjectName("muted")
        self.body.addWidget(self.process)
        self._thread: QThread | None = None
        self._sampler: MemorySampler | None = None
        self.last_sample: Any = None

    def start(self, enabled: bool = True) -> None:
        if not enabled or self._thread is not None:
            return
        self._thread = QThread()
        self._thread.setObjectName("triforce-telemetry")
        self._sampler = MemorySampler()
        self._sampler.moveToThread(self._thread)
        self._sampler.sampled.connect(self.update_sample)
        self._startRequested.connect(self._sampler.start)
        self._stopRequested.connect(self._sampler.stop)
        self._thread.finished.connect(self._sampler.deleteLater)
        self._thread.start()
        self._startRequested.emit()

    def stop(self, wait_ms: int = 5000) -> None:
        if self._thread is None:
            return
        self._stopRequested.emit()
        self._thread.quit()
        self._thread.wait(wait_ms)
        self._thread = None

    def update_sample(self, s: Any) -> None:
        """Show one `engine.offload.telemetry.MemorySample`."""
        self.last_sample = s
        gpus = list(s.gpus)
        self.no_gpu.setVisible(not gpus)
        if not gpus:
            self.no_gpu.setText("No GPU — running on the CPU")
            self.no_gpu.setToolTip(s.gpu_note or "no CUDA device found")
        while len(self.gpu_bars) < len(gpus):
            bar = LabelledBar("GPU", "l1")
            self.body.insertWidget(2 + len(self.gpu_bars), bar)
            self.gpu_bars.append(bar)
        for bar, gpu in zip(self.gpu_bars, gpus):
            used, total = gpu.used_bytes, gpu.total_bytes
            where = f"cuda:{gpu.torch_index}" if gpu.torch_index is not None else f"GPU {gpu.nvml_index}"
            bar.name.setText(f"{where} · {gpu.name}")
            mine = gpu.torch_reserved_bytes if gpu.torch_reserved_bytes is not None else gpu.torch_allocated_bytes
            detail = (f"all processes {fmt_bytes(used)}\nthis app {fmt_bytes(mine)}"
                      + (f" ({fmt_bytes(gpu.torch_allocated_bytes)} in tensors)"
                         if gpu.torch_allocated_bytes is not None else "")
                      if mine is not None else f"all processes {fmt_bytes(used)}\nthis app: none")
            bar.set(used / total if total else None, f"{fmt_bytes(used)} / {fmt_bytes(total)}", detail)
            bar.show()
        for bar in self.gpu_bars[len(gpus):]:
            bar.hide()
        total = s.ram_total_bytes
        used = max(0, total - s.ram_available_bytes)
        self.ram.set(used / total if total else None, f"{fmt_bytes(used)} / {fmt_bytes(total)}", "all processes")
        self.process.setText(f"This app: {fmt_bytes(s.process_rss_bytes)} resident in RAM")
