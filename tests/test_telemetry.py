"""Memory telemetry: works with no GPU and no NVML; parses NVML when there is one (faked here)."""
from __future__ import annotations

import subprocess
import sys
import types
from pathlib import Path

import pytest

from engine.offload import telemetry
from engine.offload.telemetry import sample_memory

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def fake_nvml(monkeypatch):
    """Install a fake `pynvml` and make telemetry initialise NVML afresh (and again afterwards)."""

    def install(module: types.ModuleType) -> None:
        monkeypatch.setitem(sys.modules, "pynvml", module)
        telemetry._nvml.cache_clear()
        # a detected GPU makes `auto` measure CPU attention (seconds on a busy 2-core box): stand in
        monkeypatch.setattr("engine.offload.devices.measured_cpu_attn_gbps", lambda: 42.0)

    yield install
    telemetry._nvml.cache_clear()


def _nvml_module(cards: list[dict], init_error: Exception | None = None) -> types.ModuleType:
    m = types.ModuleType("pynvml")
    m.NVML_CLOCK_MEM = 2

    def init() -> None:
        if init_error:
            raise init_error

    m.nvmlInit = init
    m.nvmlDeviceGetCount = lambda: len(cards)
    m.nvmlDeviceGetHandleByIndex = lambda i: cards[i]
    m.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(total=h["total"], used=h["used"], free=h["total"] - h["used"])
    m.nvmlDeviceGetName = lambda h: h["name"]
    m.nvmlDeviceGetPciInfo = lambda h: types.SimpleNamespace(busId=h["bus"])
    m.nvmlDeviceGetMemoryBusWidth = lambda h: 384
    m.nvmlDeviceGetMaxClockInfo = lambda h, clock: 10501
    m.nvmlDeviceGetMaxPcieLinkGeneration = lambda h: 4
    m.nvmlDeviceGetMaxPcieLinkWidth = lambda h: 16
    return m


def test_this_machine_samples_ram_and_rss() -> None:
    s = sample_memory()
    assert s.process_rss_bytes > 0
    assert s.ram_total_bytes >= s.ram_available_bytes > 0
    if not s.gpus:  # the CPU-only build machine
        assert s.gpus == () and s.gpu_note


def test_no_nvml_library_reports_zero_gpus(fake_nvml) -> None:
    fake_nvml(_nvml_module([], init_error=RuntimeError("NVML Shared Library Not Found")))
    s = sample_memory()
    assert s.gpus == ()
    assert s.gpu_note.startswith("no NVIDIA GPU found")
    assert s.process_rss_bytes > 0


def test_driver_without_gpus(fake_nvml) -> None:
    fake_nvml(_nvml_module([]))
    s = sample_memory()
    assert s.gpus == () and s.gpu_note == "no NVIDIA GPU found"


def test_nvml_gpus_are_parsed(fake_nvml) -> None:
    cards = [{"name": b"NVIDIA GeForce RTX 4090", "bus": b"00000000:01:00.0", "total": 24564 << 20, "used": 1 << 30},
             {"name": "NVIDIA GeForce RTX 4090", "bus": "00000000:02:00.0", "total": 24564 << 20, "used": 0}]
    fake_nvml(_nvml_module(cards))
    s = sample_memory()
    assert s.gpu_note == "" and len(s.gpus) == 2
    g = s.gpus[0]
    assert g.name == "NVIDIA GeForce RTX 4090" and g.pci_bus_id == "00000000:01:00.0"
    assert g.total_bytes == 24564 << 20 and g.used_bytes == 1 << 30 and g.free_bytes == g.total_bytes - g.used_bytes
    assert g.bandwidth_gbs == pytest.approx(1008.1, abs=0.1)  # 384-bit x 10501 MHz x 2
    assert g.pcie_gbs == pytest.approx(25.2, abs=0.1)  # 4.0 x16, 80% of 31.5 GB/s
    assert g.torch_index is None and g.torch_allocated_bytes is None  # CUDA not initialised here


def test_auto_profile_uses_detected_gpus(fake_nvml) -> None:
    from engine.offload.planner import device_spec

    fake_nvml(_nvml_module([{"name": "NVIDIA GeForce RTX 4090", "bus": "00000000:01:00.0",
                             "total": 24564 << 20, "used": 2 << 30}]))
    spec = device_spec("auto")
    assert len(spec.gpus) == 1 and spec.gpus[0].free_bytes == (24564 << 20) - (2 << 30)
    assert spec.cpu_attn_gbps == 42.0 and "CPU attention measured at 42.0 GB/s" in spec.note  # sizes the hybrid split


def test_auto_profile_plans_only_the_cards_torch_sees_in_its_order(fake_nvml, monkeypatch) -> None:
    """NVML lists every card in bus order; torch numbers only the visible ones (CUDA_VISIBLE_DEVICES,
    CUDA_DEVICE_ORDER). The plan's cuda:i must be torch's cuda:i."""
    from engine.offload.planner import device_spec

    cards = [{"name": "card A", "bus": "00000000:01:00.0", "total": 24564 << 20, "used": 0},
             {"name": "card B", "bus": "00000000:02:00.0", "total": 24564 << 20, "used": 0},
             {"name": "card C", "bus": "00000000:03:00.0", "total": 24564 << 20, "used": 0}]
    fake_nvml(_nvml_module(cards))
    monkeypatch.setattr(telemetry, "_torch_devices_by_bus", lambda: {(0, 3, 0): 0, (0, 1, 0): 1})
    spec = device_spec("auto")
    assert [g.name for g in spec.gpus] == ["card C", "card A"]


def test_bus_id_parsing() -> None:
    assert telemetry._bus_key("00000000:65:00.0") == (0, 0x65, 0)
    assert telemetry._bus_key("0001:0A:1F.3") == (1, 0x0A, 0x1F)


def test_sampling_never_imports_torch() -> None:
    code = "import sys; from engine.offload.telemetry import sample_memory; sample_memory(); assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=120)
