"""What the planner may use: GPU and host specs, the named profiles, and detection (`auto`)."""
from __future__ import annotations

import functools
from dataclasses import dataclass

from engine.errors import InvalidSettingError

MiB = 1 << 20
GiB = 1 << 30
GB = 1e9  # user-facing sizes are decimal GB, like the errors ("needs 16.1 GB")

DEFAULT_HEADROOM = int(1.5 * GiB)  # per GPU: CUDA context, cuBLAS workspace, fragmentation
DEFAULT_CPU_HEADROOM = 2 * GiB  # kept free in RAM for the app and the OS
PROFILES = ("cpu", "4090", "4090x2", "auto")
# CPU attention over offloaded KV (hybrid offload) reads host RAM at about its bandwidth when the
# CPU has the cores for it: dual-channel DDR5-5600 (89.6 GB/s peak) delivers 60-70 GB/s to a
# multi-threaded read on a desktop. 60 GB/s is the stated default for such a workstation (a small
# VM attends far slower); `plan --cpu-attn-gbps` and gpu-check's measurement replace it.
DEFAULT_CPU_ATTN_GBPS = 60.0


@dataclass(frozen=True)
class GpuSpec:
    name: str
    total_bytes: int
    free_bytes: int
    bandwidth_gbs: float  # device memory bandwidth
    pcie_gbs: float  # effective pinned host-to-device copy rate


# RTX 4090: 24564 MiB, 384-bit GDDR6X at 21 Gbps = 1008 GB/s; PCIe 4.0 x16 is 31.5 GB/s raw,
# about 25 GB/s for pinned host-to-device copies in practice.
RTX_4090 = GpuSpec("NVIDIA GeForce RTX 4090", 24564 * MiB, 24564 * MiB, 1008.0, 25.0)


@dataclass(frozen=True)
class DeviceSpec:
    """What the planner may use. RAM is what pinned offloaded KV must fit in."""

    profile: str
    ram_total_bytes: int
    ram_available_bytes: int
    cpu_bandwidth_gbs: float = 10.0  # nominal memory bandwidth of a small machine (a cloud VM's few cores)
    gpus: tuple[GpuSpec, ...] = ()
    hop_us: float = 20.0  # hand activations card->host->card (no P2P): layer-split, per boundary
    allreduce_us: float = 30.0  # one small all-reduce staged through host memory (no P2P)
    note: str = ""
    cpu_attn_gbps: float = DEFAULT_CPU_ATTN_GBPS  # CPU attention over offloaded KV (hybrid); 0: stream only


def device_spec(name: str, ram_bytes: int | None = None) -> DeviceSpec:
    """A named profile: `cpu` (this machine), `4090`, `4090x2`, or `auto` (detected).

    The GPU profiles describe a workstation with 128 GiB of RAM (8 GiB kept for the OS and
    desktop) unless `ram_bytes` says otherwise; `cpu` and `auto` measure this machine.
    """
    from engine.offload import telemetry

    if name in ("4090", "4090x2"):
        ram = ram_bytes or 128 * GiB
        count = 2 if name == "4090x2" else 1
        return DeviceSpec(name, ram, max(0, ram - 8 * GiB), gpus=(RTX_4090,) * count,
                          note=f"{count} x RTX 4090 (24 GiB, 1008 GB/s, PCIe 4.0 x16 ~25 GB/s, no P2P)")
    if name not in ("cpu", "auto"):
        raise InvalidSettingError(f"device profile {name!r} is unknown: use one of {', '.join(PROFILES)}")
    sample = telemetry.sample_memory()
    total = ram_bytes or sample.ram_total_bytes
    available = min(sample.ram_available_bytes, total)
    gpus: tuple[GpuSpec, ...] = ()
    note = "this machine's CPU and RAM"
    if name == "auto":
        cards = list(sample.gpus)
        if any(g.torch_index is not None for g in cards):
            # this process uses CUDA: plan only the cards torch sees (CUDA_VISIBLE_DEVICES), in its
            # order, so the plan's "cuda:i" is torch's cuda:i (NVML lists every card, in bus order)
            cards = sorted((g for g in cards if g.torch_index is not None), key=lambda g: g.torch_index)
        gpus = tuple(GpuSpec(g.name, g.total_bytes, g.free_bytes, g.bandwidth_gbs or 500.0, g.pcie_gbs or 12.0)
                     for g in cards)
        note = f"detected: {len(gpus)} GPU(s)" if gpus else f"detected: {sample.gpu_note}; planning for the CPU"
    if not gpus:
        return DeviceSpec("cpu", total, available, note=note)
    # the hybrid split must follow what this CPU really attends at, not a desktop's figure: a
    # slow CPU given heads would make L2 slower than streaming them
    attn = measured_cpu_attn_gbps()
    note += f"; CPU attention measured at {attn:.1f} GB/s"
    return DeviceSpec("auto", total, available, gpus=gpus, note=note, cpu_attn_gbps=attn)


@functools.lru_cache(maxsize=1)
def measured_cpu_attn_gbps() -> float:
    """GB/s at which this machine's CPU attends offloaded KV (engine/kv/cpu_attention.py):
    Llama-3.1-8B's per-layer shape, 32K positions of bf16 K/V (128 MiB, past most L3 caches),
    7 new tokens, the slower of 2 after a warm-up; measured once per process (tens of ms on a desktop)."""
    import torch

    from engine.kv.cpu_attention import measure_gbps

    return float(measure_gbps(8, 32, 128, 32768, 7, torch.bfloat16, reps=2)["gbps"])
