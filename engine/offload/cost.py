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
               rates: tuple[float, float], cpu_heads: dict[str, int] | None = None) -> Floors:
    """The layout's floors. With CPU attention (spec.cpu_attn_gbps > 0) each card's offloaded
    layers split their KV heads: `cpu_heads[card]` in total are attended on the CPU (None: the
    count with the lowest L2 time). The split is kept in lay.cpu_split (per card) and
    lay.cpu_heads (per layer)."""
    def bw(dev: str) -> float:
        return spec.cpu_bandwidth_gbs if dev == "cpu" else spec.gpus[int(dev.split(":")[1])].bandwidth_gbs

    def ms(nbytes: float, gbs: float) -> float:
        return nbytes / (gbs * GB) * 1e3

    devs = list(lay.l2_read)
    hbm = {d: ms(lay.l2_read[d], bw(d)) for d in devs}  # counts the CPU heads' KV too: a slight overestimate
    pcie = {d: ms(lay.l2_pcie[d], spec.gpus[int(d.split(":")[1])].pcie_gbs) if lay.l2_pcie[d] else 0.0 for d in devs}
    l0 = ms(s.draft_read, bw(lay.draft_device)) if lay.draft_device else 0.0  # n-gram lookup: ~0
    tp = lay.mode == "tensor-parallel"
    if tp:
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
    window = drafting_ms(settings, l0, l1, rates)
    heads = target.kv_heads // (len(devs) if tp else 1)  # KV heads of one offloaded layer on one card
    # the host's memory serves every card's CPU heads at once under tensor parallel
    sharing = len([d for d in devs if lay.off_layers.get(d)]) if tp else 1

    def card(d: str, k: int) -> tuple[float, float, float, float, float]:
        """(L2, AR, streamed PCIe, CPU attention, prefetched) ms of card d with k CPU heads over
        its offloaded layers."""
        off = lay.off_layers.get(d, 0)
        if not off:
            return max(hbm[d], pcie[d]), max(hbm[d], pcie[d]), pcie[d], 0.0, 0.0
        streamed = pcie[d] * (off * heads - k) / (off * heads)
        cpu = ms(lay.l2_pcie[d] * k / (off * heads) * sharing, spec.cpu_attn_gbps) if k else 0.0
        # per hybrid layer: the new q/k/v go down and the output comes back (a round trip)
        cpu += min(k, off) * spec.hop_us / 1e3
        # The side stream copies while the card computes and the CPU attends; the CPU's part is on
        # each layer's critical path (its output feeds the next layer), so it adds to compute.
        # While the lower levels draft, the idle link fills the staging buffers with the first
        # offloaded layers, which then cross PCIe off the L2 critical path (AR has no such window).
        credit = min(window, streamed * min(off, STAGING_SLOTS) / off)
        return max(hbm[d] + cpu, streamed - credit), max(hbm[d] + cpu, streamed), streamed, cpu, credit

    if cpu_heads is not None:
        best = {d: cpu_heads.get(d, 0) for d in devs}
    elif spec.cpu_attn_gbps > 0 and spec.gpus:
        best = {d: _balanced(lambda k, d=d: card(d, k)[0],
                             lambda k, d=d: hbm[d] + card(d, k)[3] >= card(d, k)[2] - card(d, k)[4],
                             lay.off_layers.get(d, 0) * heads) for d in devs}
    else:
        best = {d: 0 for d in devs}
    parts = {d: card(d, best[d]) for d in devs}
    lay.cpu_split, lay.cpu_heads = best, _per_layer(lay, best)
    l2 = combine(p[0] for p in parts.values()) + sync
    ar = combine(p[1] for p in parts.values()) + sync
    l2_hbm, l2_pcie = combine(hbm.values()) + sync, combine(p[2] for p in parts.values())
    l2_cpu = combine(p[3] for p in parts.values())
    serial = l2_hbm + l2_pcie + l2_cpu
    prefetched = combine(p[4] for p in parts.values())
    stream_only = combine(card(d, 0)[0] for d in devs) + sync
    e2e = end_to_end(settings, l0, l1, l2, rates)
    return Floors(l0, l1, l2, l2_hbm, l2_pcie, serial, prefetched, ar_ms=ar, end_to_end_ms=e2e,
                  l2_cpu_ms=l2_cpu, l2_stream_only_ms=stream_only)


def _balanced(cost, cpu_binds, most: int) -> int:
    """The CPU head count in 0..most with the lowest cost. The CPU's time grows with k and the
    link's shrinks, so the best k sits where they cross: binary search for the first k at which
    the CPU side binds, then take the cheaper of it and the one before."""
    lo, hi = 0, most
    while lo < hi:
        mid = (lo + hi) // 2
        if cpu_binds(mid):
            hi = mid
        else:
            lo = mid + 1
    return min({max(0, lo - 1), lo}, key=lambda k: (cost(k), k))


def _per_layer(lay: Layout, per_card: dict[str, int]) -> list[int]:
    """Spread each card's CPU heads over its offloaded layers as evenly as possible (per card share
    under tensor parallel, where every card holds the same layers)."""
    out = [0] * len(lay.kv_devices)
    for d, k in per_card.items():
        mine = [i for i, (w, kv) in enumerate(zip(lay.layer_devices, lay.kv_devices))
                if kv == "cpu" and (w == d or d in w.split("+"))]
        for j, i in enumerate(mine):  # every card of a tensor-parallel layer holds the same count
            out[i] = max(out[i], k // len(mine) + (1 if j < k % len(mine) else 0))
    return out


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
