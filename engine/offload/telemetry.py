"""Memory telemetry, sampled on demand (no thread of its own).

GPUs come from NVML (nvidia-ml-py): every card the driver sees, with its used/total memory,
even ones torch does not use. When this process has already initialised CUDA, each card is
matched to its torch index by PCI bus id (CUDA_VISIBLE_DEVICES may reorder or hide cards) and
this process's torch allocations are added. We never create a CUDA context just to sample.
With no NVIDIA driver or no GPU we report `gpus=()` and say why in `gpu_note`.
"""
from __future__ import annotations

import functools
import os
import sys
import time
from dataclasses import dataclass
from typing import Any

import psutil

# Effective host<->device rate per PCIe lane in GB/s (after 8b/10b or 128b/130b encoding), by generation.
_PCIE_LANE_GBS = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}
_PCIE_EFFICIENCY = 0.8  # pinned cudaMemcpy reaches ~80% of the link (25 of 31.5 GB/s on 4.0 x16)


@dataclass(frozen=True)
class GpuSample:
    nvml_index: int
    torch_index: int | None  # cuda:N in this process, when CUDA is initialised and the card is visible
    name: str
    pci_bus_id: str  # "00000000:01:00.0"
    total_bytes: int
    used_bytes: int
    free_bytes: int
    torch_allocated_bytes: int | None  # this process's live tensors on the card
    torch_reserved_bytes: int | None  # ... plus what torch's caching allocator holds
    bandwidth_gbs: float | None  # memory bus width x max memory clock x 2 (DDR)
    pcie_gbs: float | None  # effective host-to-device rate of the card's max PCIe link


@dataclass(frozen=True)
class MemorySample:
    time_s: float  # time.monotonic() when sampled
    ram_total_bytes: int
    ram_available_bytes: int
    process_rss_bytes: int
    gpus: tuple[GpuSample, ...] = ()
    gpu_note: str = ""  # why gpus is empty, or "" when it is not


def sample_memory() -> MemorySample:
    """RAM, this process's RSS, and every NVIDIA GPU's memory right now. Never raises for a missing GPU."""
    vm = psutil.virtual_memory()
    rss = psutil.Process(os.getpid()).memory_info().rss
    gpus, note = _sample_gpus()
    return MemorySample(time.monotonic(), int(vm.total), int(vm.available), int(rss), gpus, note)


@functools.lru_cache(maxsize=1)
def _nvml() -> tuple[Any, str]:
    """(pynvml module, "") once NVML is initialised, or (None, why not). Initialised once per process:
    nvmlInit can take tens of ms and NVML reference-counts it, so leaving it open is the cheap, safe choice."""
    try:
        import pynvml
    except ImportError:
        return None, "no NVIDIA GPU found (nvidia-ml-py is not installed)"
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
        return None, f"no NVIDIA GPU found (no NVIDIA driver: {exc})"
    return pynvml, ""


def _sample_gpus() -> tuple[tuple[GpuSample, ...], str]:
    nvml, why = _nvml()
    if nvml is None:
        return (), why
    try:
        count = nvml.nvmlDeviceGetCount()
    except Exception as exc:
        return (), f"NVML could not count GPUs: {exc}"
    if count == 0:
        return (), "no NVIDIA GPU found"
    torch_by_bus = _torch_devices_by_bus()
    out = []
    for i in range(count):
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(i)
            mem = nvml.nvmlDeviceGetMemoryInfo(handle)
            name = nvml.nvmlDeviceGetName(handle)
            bus = nvml.nvmlDeviceGetPciInfo(handle).busId
        except Exception as exc:  # a card fell off the bus, or no permission
            return tuple(out), f"NVML failed on GPU {i}: {exc}"
        name = name.decode() if isinstance(name, bytes) else str(name)
        bus = bus.decode() if isinstance(bus, bytes) else str(bus)
        torch_index = torch_by_bus.get(_bus_key(bus))
        allocated = reserved = None
        if torch_index is not None:
            import torch

            allocated = int(torch.cuda.memory_allocated(torch_index))
            reserved = int(torch.cuda.memory_reserved(torch_index))
        out.append(GpuSample(i, torch_index, name, bus, int(mem.total), int(mem.used), int(mem.free),
                             allocated, reserved, _bandwidth_gbs(nvml, handle), _pcie_gbs(nvml, handle)))
    return tuple(out), ""


def _torch_devices_by_bus() -> dict[tuple[int, int, int], int]:
    """PCI (domain, bus, device) -> torch index, only if this process already initialised CUDA."""
    torch = sys.modules.get("torch")  # never import torch (or start CUDA) just to sample
    if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return {}
    out = {}
    for i in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(i)
        out[(props.pci_domain_id, props.pci_bus_id, props.pci_device_id)] = i
    return out


def _bus_key(bus_id: str) -> tuple[int, int, int]:
    """'00000000:01:00.0' -> (0, 1, 0): domain, bus, device (function dropped)."""
    domain, bus, rest = bus_id.strip().split(":")
    return int(domain, 16), int(bus, 16), int(rest.split(".")[0], 16)


def _bandwidth_gbs(nvml: Any, handle: Any) -> float | None:
    try:
        bits = nvml.nvmlDeviceGetMemoryBusWidth(handle)
        mhz = nvml.nvmlDeviceGetMaxClockInfo(handle, nvml.NVML_CLOCK_MEM)
    except Exception:
        return None
    return bits / 8 * mhz * 1e6 * 2 / 1e9 if bits and mhz else None


def _pcie_gbs(nvml: Any, handle: Any) -> float | None:
    try:
        gen = nvml.nvmlDeviceGetMaxPcieLinkGeneration(handle)
        width = nvml.nvmlDeviceGetMaxPcieLinkWidth(handle)
    except Exception:
        return None
    lane = _PCIE_LANE_GBS.get(gen)
    return lane * width * _PCIE_EFFICIENCY if lane and width else None
