"""The cost model: bandwidth floors per level, and ms per generated token under assumed acceptance.

Decoding a few tokens is bandwidth bound, so a forward costs at least bytes read / bandwidth.
"""
from __future__ import annotations

from engine.offload.devices import GB, DeviceSpec
from engine.offload.layouts import STAGING_SLOTS, Layout, Sizes
from engine.offload.plan_types import Floors
from engine.offload.shapes import ModelShape
from engine.settings import DecodeSettings


def floors_for(lay: Layout, s: Sizes, spec: DeviceSpec, target: ModelShape, settings: DecodeSettings,
            rates: tuple[float, float]) -> Floors:
    def bw(dev: str) -> float:
        return spec.cpu_bandwidth_gbs if dev == "cpu" else spec.gpus[int(dev.split(":")[1])].bandwidth_gbs

    def ms(nbytes: int, gbs: float) -> float:
        return nbytes / (gbs * GB) * 1e3

    devs = list(lay.l2_read)
    hbm = {d: ms(lay.l2_read[d], bw(d)) for d in devs}
    pcie = {d: ms(lay.l2_pcie[d], spec.gpus[int(d.split(":")[1])].pcie_gbs) if lay.l2_pcie[d] else 0.0 for d in devs}
    l0 = ms(s.draft_read, bw(lay.draft_device)) if lay.draft_device else 0.0  # n-gram lookup: ~0
    if lay.mode == "tensor-parallel":
        # Cards work at once on every layer (the slowest card sets the pace), with two
        # host-staged all-reduces per layer and one logits gather.
        sync = (2 * target.layers + 1) * spec.allreduce_us / 1e3
        combine = max
        l1 = max(ms(lay.l1_read[d], bw(d)) for d in devs) + sync
    else:
        # Cards take turns in layer order, handing activations across through host memory.
        sync = max(0, sum(1 for d in devs if lay.l2_read[d]) - 1) * spec.hop_us / 1e3
        combine = sum
        l1 = sum(ms(lay.l1_read[d], bw(d)) for d in devs) + sync
    # Within a card the double-buffered prefetch overlaps its PCIe stream with its compute,
    # so the card's time is the larger of the two, not their sum (l2_serial is the sum).
    l2_hbm, l2_pcie = combine(hbm.values()) + sync, combine(pcie.values())
    serial = l2_hbm + l2_pcie
    ar = combine(max(hbm[d], pcie[d]) for d in devs) + sync
    # While the lower levels draft, each card's link is idle and fills its staging buffers with
    # its first offloaded layers, which then cross PCIe off the L2 critical path.
    window = drafting_ms(settings, l0, l1, rates)
    credit = {d: min(window, pcie[d] * min(off, STAGING_SLOTS) / off) if (off := lay.off_layers.get(d, 0)) else 0.0
              for d in devs}
    l2 = combine(max(hbm[d], pcie[d] - credit[d]) for d in devs) + sync
    prefetched = combine(credit.values())
    e2e = end_to_end(settings, l0, l1, l2, rates)
    return Floors(l0, l1, l2, l2_hbm, l2_pcie, serial, prefetched, ar_ms=ar, end_to_end_ms=e2e)


def expected_tokens(rate: float, gamma: int) -> float:
    """Tokens one verification of `gamma` drafts yields (accepted + correction/bonus), i.i.d. acceptance."""
    return gamma + 1.0 if rate >= 1.0 else (1.0 - rate ** (gamma + 1)) / (1.0 - rate)


def drafting_ms(settings: DecodeSettings, l0: float, l1: float, rates: tuple[float, float]) -> float:
    """Time the lower levels spend drafting the tokens one L2 forward verifies. In TriForce, L1
    makes tokens for L2 at c1 ms each (its own speculative loop with L0) and L2 checks gamma2."""
    g1, g2 = settings.gamma1, settings.gamma2
    if settings.mode == "ar":
        return 0.0
    if settings.mode == "retrieval-only":
        return g2 * l1
    if settings.mode == "draft-only":
        return g1 * l0
    c1 = (g1 * l0 + l1) / expected_tokens(rates[0], g1)
    return g2 * c1


def end_to_end(settings: DecodeSettings, l0: float, l1: float, l2: float, rates: tuple[float, float]) -> float:
    """Modelled ms per generated token: drafting plus one L2 forward, over the tokens it yields."""
    if settings.mode == "ar":
        return l2
    a01, a12 = rates
    drafted = settings.gamma1 if settings.mode == "draft-only" else settings.gamma2
    rate = a01 * a12 if settings.mode == "draft-only" else a12
    return (drafting_ms(settings, l0, l1, rates) + l2) / expected_tokens(rate, drafted)
