"""`main.py plan`: where every byte would go, and the per-token floor that implies. No weights needed."""
from __future__ import annotations

import argparse

from engine.errors import OutOfMemoryPlanError
from engine.offload.shapes import shape_for
from engine.offload.planner import (DEFAULT_CPU_ATTN_GBPS, DEFAULT_HEADROOM, GiB, PROFILES, describe, device_spec,
                                   plan_placement)
from engine.store.presets import find_preset
from engine.settings import MODES, DecodeSettings


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("plan", help="plan memory placement and per-token floor (no weights needed)",
                              description="Plan where weights, KV caches and the draft go on the chosen devices, "
                                          "before anything is allocated.")
    p.add_argument("--model", required=True, help="preset repo id, local folder, .gguf file, or a cached repo id")
    p.add_argument("--draft", default="preset",
                   help="draft model spec; 'preset' (default) uses the preset's draft, 'none' drafts by n-gram lookup")
    p.add_argument("--context", type=int, required=True, help="tokens the cache must hold (document + history + answer)")
    p.add_argument("--devices", default="auto", choices=PROFILES, help="device profile (default: auto-detect)")
    p.add_argument("--budget", type=int, default=DecodeSettings.budget, help="retrieval cache budget in tokens")
    p.add_argument("--chunk", type=int, default=DecodeSettings.chunk, help="retrieval chunk size in tokens")
    p.add_argument("--mode", default="triforce", choices=MODES, help="decoding mode")
    p.add_argument("--headroom-gib", type=float, default=DEFAULT_HEADROOM / GiB,
                   help="GPU memory kept free per card for CUDA context and fragmentation (GiB)")
    p.add_argument("--ram-gib", type=float, default=None,
                   help="RAM of the planned machine (GiB); default: 128 for the 4090 profiles, measured otherwise")
    p.add_argument("--tp-offload", action=argparse.BooleanOptionalAction, default=True,
                   help="let tensor parallel offload KV too (each card streams its share of the heads)")
    p.add_argument("--tensor-parallel", action=argparse.BooleanOptionalAction, default=None,
                   help="may the plan choose tensor parallel on two GPUs (default: yes, when its floor is lower)")
    p.add_argument("--cpu-attn-gbps", type=float, default=DEFAULT_CPU_ATTN_GBPS,
                   help=f"GB/s at which the CPU attends offloaded KV where it lives (hybrid offload; default "
                        f"{DEFAULT_CPU_ATTN_GBPS:g}: what a dual-channel DDR5 desktop reads; gpu-check measures it). "
                        "0 streams every offloaded head over PCIe")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    target = shape_for(args.model)
    draft_spec = args.draft
    if draft_spec == "preset":
        preset = find_preset(args.model)
        draft_spec = preset.draft if preset and preset.target == args.model else None
    draft = shape_for(draft_spec) if draft_spec and draft_spec != "none" else None
    settings = DecodeSettings(mode=args.mode, budget=args.budget, chunk=args.chunk)
    devices = device_spec(args.devices, ram_bytes=int(args.ram_gib * GiB) if args.ram_gib else None)
    plan = plan_placement(target, draft, args.context, settings, devices,
                          headroom_bytes=int(args.headroom_gib * GiB), tp_offload=args.tp_offload,
                          tensor_parallel=args.tensor_parallel, cpu_attn_gbps=args.cpu_attn_gbps,
                          raise_on_misfit=False)
    print(plan.to_json() if args.json else describe(plan))
    if not plan.fits:
        raise OutOfMemoryPlanError("; ".join(plan.shortfalls))
    return 0
