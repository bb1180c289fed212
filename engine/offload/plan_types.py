"""The planner's result types: per-device shares, per-level floors, the modes considered, the Plan."""
from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Acceptance:
    """Assumed per-token acceptance rates for the modelled end-to-end time (not measured)."""

    l0_by_l1: float = 0.7  # a draft model with a StreamingLLM cache, checked by L1
    ngram_by_l1: float = 0.35  # n-gram lookup in the context instead of a draft model
    l1_by_l2: float = 0.9  # the retrieval cache (budget >= 1K tokens), checked by the full cache


@dataclass(frozen=True)
class DevicePlan:
    """One device's share: bytes per component, and the bytes it moves per L2 forward."""

    name: str  # "cpu", "cuda:0"
    label: str
    total_bytes: int
    free_bytes: int
    headroom_bytes: int
    components: tuple[tuple[str, int], ...]  # (component, bytes), headroom not included
    bandwidth_gbs: float
    pcie_gbs: float | None = None
    l2_read_bytes: int = 0  # read from device memory per L2 forward
    l2_pcie_bytes: int = 0  # copied host-to-device per L2 forward (offloaded layers' KV)

    @property
    def used_bytes(self) -> int:
        return sum(b for _, b in self.components)

    @property
    def spare_bytes(self) -> int:
        """Free memory left after everything planned here and the headroom (negative: short)."""
        return self.free_bytes - self.headroom_bytes - self.used_bytes

    def component(self, name: str) -> int:
        return dict(self.components).get(name, 0)

    def to_dict(self) -> dict:
        out = dataclasses.asdict(self)
        out["components"] = dict(self.components)
        out.update(used_bytes=self.used_bytes, spare_bytes=self.spare_bytes)
        return out


@dataclass(frozen=True)
class Floors:
    """Bandwidth floors in milliseconds. l0/l1/l2: one forward of that level (a few tokens
    cost the same bytes as one). l2 overlaps the PCIe stream with compute (max); l2_serial
    is the no-overlap bound (sum) without prefetch. end_to_end: per generated token under
    `acceptance` at the settings' gammas. With hybrid offload l2_pcie is the streamed heads' share."""

    l0_ms: float
    l1_ms: float
    l2_ms: float
    l2_hbm_ms: float
    l2_pcie_ms: float
    l2_serial_ms: float
    l2_prefetched_ms: float  # PCIe time moved off the L2 path: staging filled while L0/L1 draft
    ar_ms: float  # plain autoregressive decoding, one token per full-cache forward (no prefetch window)
    end_to_end_ms: float
    l2_cpu_ms: float = 0.0  # hybrid offload: CPU attention over the CPU heads (on each layer's critical path)
    l2_stream_only_ms: float = 0.0  # the same L2 with every offloaded head streamed (no CPU attention)

    @property
    def tokens_per_s(self) -> float:
        return 1000.0 / self.end_to_end_ms if self.end_to_end_ms > 0 else math.inf

    @property
    def speedup_vs_ar(self) -> float:
        return self.ar_ms / self.end_to_end_ms if self.end_to_end_ms > 0 else 1.0

    def to_dict(self) -> dict:
        out = {k: round(v, 3) for k, v in dataclasses.asdict(self).items()}
        out.update(tokens_per_s=round(self.tokens_per_s, 2), speedup_vs_ar=round(self.speedup_vs_ar, 2))
        return out


@dataclass(frozen=True)
class ModeOption:
    """A way to use the GPUs that was considered, with its floors or why it does not fit."""

    mode: str
    fits: bool
    floors: Floors | None
    detail: str

    def to_dict(self) -> dict:
        return {"mode": self.mode, "fits": self.fits, "detail": self.detail,
                "floor_ms_per_token": self.floors.to_dict() if self.floors else None}


@dataclass(frozen=True)
class Plan:
    fits: bool
    mode: str  # "cpu", "single-gpu", "layer-split", "tensor-parallel"
    mode_reason: str
    target: str
    draft: str | None
    decode_mode: str
    context_tokens: int
    budget_tokens: int
    dtype_bytes: int
    kv_layers_total: int
    kv_layers_offloaded: int
    layer_devices: tuple[str, ...]  # where each layer's weights run
    kv_devices: tuple[str, ...]  # where each layer's full KV lives ("cpu" = pinned, offloaded)
    draft_device: str | None
    devices: tuple[DevicePlan, ...]
    floors: Floors
    acceptance: Acceptance
    gamma1: int
    gamma2: int
    alternatives: tuple[ModeOption, ...] = ()
    shortfalls: tuple[str, ...] = ()
    profile: str = ""
    profile_note: str = ""
    offload_mode: str = "resident"  # "resident" (no KV offloaded), "stream" or "hybrid"
    cpu_heads: tuple[int, ...] = ()  # per layer: KV heads (per card share) attended on the CPU; () if none offloaded
    cpu_attn_gbps: float = 0.0  # the CPU-attention bandwidth the hybrid split was sized with
    modelled_ms_per_token: float = 0.0  # end to end at the assumed acceptance and the tuned gammas
    tuned_gamma1: int = 0
    tuned_gamma2: int = 0

    def device(self, name: str) -> DevicePlan:
        return next(d for d in self.devices if d.name == name)

    def bytes_by_component(self) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        for dev in self.devices:
            for comp, n in dev.components:
                out.setdefault(comp, {})[dev.name] = n
        return out

    def to_dict(self) -> dict:
        return {
            "fits": self.fits, "mode": self.mode, "mode_reason": self.mode_reason,
            "profile": self.profile, "profile_note": self.profile_note,
            "target": self.target, "draft": self.draft, "decode_mode": self.decode_mode,
            "context_tokens": self.context_tokens, "budget_tokens": self.budget_tokens,
            "dtype_bytes": self.dtype_bytes,
            "kv_layers_total": self.kv_layers_total, "kv_layers_offloaded": self.kv_layers_offloaded,
            "layer_devices": list(self.layer_devices), "kv_devices": list(self.kv_devices),
            "draft_device": self.draft_device,
            "devices": [d.to_dict() for d in self.devices],
            "bytes_by_component": self.bytes_by_component(),
            "floor_ms_per_token": self.floors.to_dict(),
            "assumptions": {
                **dataclasses.asdict(self.acceptance), "gamma1": self.gamma1, "gamma2": self.gamma2,
                "floor": "bytes read / bandwidth per forward; L2's PCIe stream overlaps compute (max)",
                "kv_filled_tokens": self.context_tokens,
            },
            "offload_mode": self.offload_mode,
            "cpu_heads": list(self.cpu_heads), "cpu_attn_gbps": self.cpu_attn_gbps,
            "modelled_ms_per_token": round(self.modelled_ms_per_token, 3),
            "tuned_gammas": {"gamma1": self.tuned_gamma1, "gamma2": self.tuned_gamma2},
            "alternatives": [a.to_dict() for a in self.alternatives],
            "shortfalls": list(self.shortfalls),
        }

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)
