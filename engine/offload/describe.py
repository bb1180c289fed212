"""The plan as text for people: what goes where, GB per device, per-level floors, why this mode."""
from __future__ import annotations

from engine.offload.devices import GB, DeviceSpec
from engine.offload.layouts import Layout
from engine.offload.plan_types import ModeOption, Plan


def mode_reason(best: Layout, alternatives: tuple[ModeOption, ...], spec: DeviceSpec, allow_tp: bool = True) -> str:
    off = sum(d == "cpu" for d in best.kv_devices)
    streamed = f"{off} layers' KV offloaded to pinned CPU memory and streamed over PCIe per L2 forward"
    if any(best.cpu_heads):
        streamed = (f"{off} layers' KV offloaded to pinned CPU memory; per L2 forward the CPU attends some of their KV"
                    " heads where they live while PCIe streams the rest (hybrid)")
    if best.mode == "cpu":
        return ("no GPU: everything in RAM, the file's blocks as stored (fp32 arithmetic)" if best.weights_as_stored
                else "no GPU: everything in RAM, fp32")
    if len(spec.gpus) == 1:
        return streamed if off else "everything on the one GPU"
    if best.mode == "tensor-parallel":
        why = ("each card holds its share of every layer's KV heads, so an offloaded layer crosses every PCIe link"
               " at once and each card reads 1/n of the bytes" if off else
               "all KV fits on-chip and each card reads 1/n of the bytes per forward")
        why += "; layer-split cards take turns, so one card (and one link) works at a time"
    elif best.mode == "layer-split":
        why = ("lowest modelled floor" + ("" if allow_tp else " once tensor parallel is ruled out")
               + "; " + (streamed if off else "all KV on-chip"))
    else:
        why = "it all fits on one card; splitting adds hand-offs or all-reduces without reading fewer bytes per card"
    others = []
    for a in alternatives:
        if a.fits:
            built = "" if allow_tp or a.mode != "tensor-parallel" else ", ruled out"
            others.append(f"{a.mode} {a.floors.end_to_end_ms:.1f} ms/token (L2 {a.floors.l2_ms:.1f} ms{built})")
        else:
            others.append(f"{a.mode} does not fit ({a.detail})")
    return f"{why}. Considered: " + "; ".join(others)


def format_bytes(nbytes: float) -> str:
    """Bytes as decimal GB (MB, kB below that) for tables."""
    if abs(nbytes) >= 1e9:
        return f"{nbytes / GB:.2f} GB"
    return f"{nbytes / 1e6:.1f} MB" if abs(nbytes) >= 1e6 else f"{nbytes / 1e3:.1f} kB"


def describe(plan: Plan) -> str:
    """The plan as a readable table: what goes where, GB per device, headroom, per-level floors."""
    devs = plan.devices
    names = [d.name for d in devs]
    rows = []
    draft = f" + draft {plan.draft}" if plan.draft else " (n-gram drafting)" if plan.decode_mode == "triforce" else ""
    rows.append(f"Plan: {plan.target}{draft}, {plan.context_tokens} tokens, {plan.dtype_bytes * 8}-bit,"
                f" retrieval budget {plan.budget_tokens}, mode {plan.decode_mode}")
    rows.append(f"Devices: {plan.profile} ({plan.profile_note})")
    rows.append(f"Placement: {plan.mode}. {plan.mode_reason}")
    rows.append(f"KV layers: {plan.kv_layers_total - plan.kv_layers_offloaded} of {plan.kv_layers_total} on-chip,"
                f" {plan.kv_layers_offloaded} offloaded to pinned CPU memory"
                if plan.mode != "cpu" else f"KV layers: all {plan.kv_layers_total} in RAM")
    if plan.kv_layers_offloaded:
        rows.append("  offloaded layers: " + ",".join(str(i) for i, d in enumerate(plan.kv_devices) if d == "cpu"))
        rows.append(_offload_line(plan))
    components = []
    for d in devs:
        components += [c for c, _ in d.components if c not in components]
    width = max([len(c) for c in components] + [16])
    rows.append("")
    rows.append(f"{'component':<{width}}" + "".join(f"{n:>14}" for n in names))
    for comp in components:
        rows.append(f"{comp:<{width}}" + "".join(f"{format_bytes(d.component(comp)) if d.component(comp) else '-':>14}"
                                                  for d in devs))
    for label, get in (("total planned", lambda d: d.used_bytes), ("headroom", lambda d: d.headroom_bytes),
                       ("free now", lambda d: d.free_bytes), ("spare", lambda d: d.spare_bytes)):
        rows.append(f"{label:<{width}}" + "".join(f"{format_bytes(get(d)):>14}" for d in devs))
    f = plan.floors
    rows.append("")
    rows.append("Per-token floor (bytes read / bandwidth; GB = 1e9 bytes):")
    if plan.draft_device:
        rows.append(f"  L0 draft step            {f.l0_ms:9.2f} ms")
    elif plan.decode_mode == "triforce":
        rows.append("  L0 n-gram lookup              ~0 ms")
    if plan.budget_tokens:
        rows.append(f"  L1 retrieval forward     {f.l1_ms:9.2f} ms")
    link = "" if not f.l2_pcie_ms and not f.l2_cpu_ms else (
        f" (HBM {f.l2_hbm_ms:.1f} ms, PCIe {f.l2_pcie_ms:.1f} ms overlapped per card,"
        f" {f.l2_prefetched_ms:.1f} ms of it prefetched while drafting"
        + (f", CPU attention {f.l2_cpu_ms:.1f} ms; stream-only L2 {f.l2_stream_only_ms:.1f} ms"
           if plan.offload_mode == "hybrid" else "") + f"; serial {f.l2_serial_ms:.1f} ms)")
    rows.append(f"  L2 full-cache forward    {f.l2_ms:9.2f} ms{link}")
    rows.append(f"  plain autoregressive     {f.ar_ms:9.2f} ms/token")
    a = plan.acceptance
    rates = f"L0->L1 {a.l0_by_l1 if plan.draft else a.ngram_by_l1:.2f}, L1->L2 {a.l1_by_l2:.2f}"
    rows.append(f"  modelled end-to-end      {f.end_to_end_ms:9.2f} ms/token ({f.tokens_per_s:.1f} tok/s,"
                f" {f.speedup_vs_ar:.1f}x AR) assuming acceptance {rates}, gamma1 {plan.gamma1}, gamma2 {plan.gamma2}")
    if plan.decode_mode != "ar" and plan.tuned_gamma2:
        rows.append(f"  at tuned gammas          {plan.modelled_ms_per_token:9.2f} ms/token (gamma1 {plan.tuned_gamma1},"
                    f" gamma2 {plan.tuned_gamma2}; the same acceptance)")
    if plan.alternatives:
        rows.append("")
        rows.append("Two-GPU modes considered:")
        for alt in plan.alternatives:
            if alt.fits:
                rows.append(f"  {alt.mode:<16} fits: L1 {alt.floors.l1_ms:.1f} ms, L2 {alt.floors.l2_ms:.1f} ms,"
                            f" end-to-end {alt.floors.end_to_end_ms:.1f} ms/token ({alt.detail})")
            else:
                rows.append(f"  {alt.mode:<16} does not fit: {alt.detail}")
    if plan.shortfalls:
        rows.append("")
        rows.append("DOES NOT FIT: " + "; ".join(plan.shortfalls))
    return "\n".join(rows)


def _offload_line(plan: Plan) -> str:
    """How offloaded layers are read in decode/verification: streamed, or split with the CPU."""
    if plan.offload_mode != "hybrid":
        return "  offload mode: stream (every offloaded head crosses PCIe per L2 forward)"
    heads = [(i, c) for i, (c, d) in enumerate(zip(plan.cpu_heads, plan.kv_devices)) if d == "cpu"]
    share = " per card" if plan.mode == "tensor-parallel" else ""
    return (f"  offload mode: hybrid (CPU attention at {plan.cpu_attn_gbps:g} GB/s; the rest streamed),"
            f" KV heads attended on the CPU{share} per offloaded layer: " + ",".join(f"{i}:{c}" for i, c in heads))
