"""`main.py plan`: where every byte would go, and the per-token floor that implies. No weights needed."""
from __future__ import annotations

import argparse

from engine.api import describe_plan, find_preset, plan_defaults, plan_for
from engine.cli import validate as v
from engine.errors import OutOfMemoryPlanError
from engine.settings import MODES, DecodeSettings

GiB = 1 << 30
MAX_HEADROOM_GIB = 1024.0  # more than any card holds: a headroom past the card's memory is refused by the planner
MIN_RAM_GIB, MAX_RAM_GIB = 0.25, 65536.0  # past the smallest and the largest machine
MAX_CPU_ATTN_GBPS = 10_000.0  # past any memory system's bandwidth


def register(subparsers: argparse._SubParsersAction) -> None:
    defaults = plan_defaults()
    p = subparsers.add_parser("plan", help="plan memory placement and per-token floor (no weights needed)",
                              description="Plan where weights, KV caches and the draft go on the chosen devices, "
                                          "before anything is allocated.")
    p.add_argument("--model", required=True, help="preset repo id, local folder, .gguf file, or a cached repo id")
    p.add_argument("--draft", default="preset",
                   help="draft model spec; 'preset' (default) uses the preset's draft, 'none' drafts by n-gram lookup")
    p.add_argument("--context", type=v.integer(1, 2**31 - 1, "tokens"), required=True,
                   help="tokens the cache must hold (document + history + answer)")
    p.add_argument("--devices", default="auto", choices=defaults.profiles, help="device profile (default: auto-detect)")
    p.add_argument("--budget", type=v.integer(1, 2**31 - 1, "tokens"), default=DecodeSettings.budget,
                   help="retrieval cache budget in tokens")
    p.add_argument("--chunk", type=v.integer(1, 1024, "tokens"), default=DecodeSettings.chunk,
                   help="retrieval chunk size in tokens")
    p.add_argument("--mode", default="triforce", choices=MODES, help="decoding mode")
    p.add_argument("--headroom-gib", type=v.real(0, MAX_HEADROOM_GIB, "GiB"), default=defaults.headroom_bytes / GiB,
                   help="GPU memory kept free per card for CUDA context and fragmentation (GiB)")
    p.add_argument("--ram-gib", type=v.real(MIN_RAM_GIB, MAX_RAM_GIB, "GiB"), default=None,
                   help="RAM of the planned machine (GiB); default: 128 for the 4090 profiles, measured otherwise")
    p.add_argument("--tp-offload", action=argparse.BooleanOptionalAction, default=True,
                   help="let tensor parallel offload KV too (each card streams its share of the heads)")
    p.add_argument("--tensor-parallel", action=argparse.BooleanOptionalAction, default=None,
                   help="may the plan choose tensor parallel on two GPUs (default: yes, when its floor is lower)")
    p.add_argument("--cpu-attn-gbps", type=v.real(0, MAX_CPU_ATTN_GBPS, "GB/s"), default=defaults.cpu_attn_gbps,
                   help=f"GB/s at which the CPU attends offloaded KV where it lives (hybrid offload; default "
                        f"{defaults.cpu_attn_gbps:g}: what a dual-channel DDR5 desktop reads; gpu-check measures it). "
                        "0 streams every offloaded head over PCIe")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    draft_spec = args.draft
    if draft_spec == "preset":
        preset = find_preset(args.model)
        draft_spec = preset.draft if preset and preset.target == args.model else None
    settings = DecodeSettings(mode=args.mode, budget=args.budget, chunk=args.chunk)
    plan = plan_for(args.model, draft_spec, args.context, settings, args.devices,
                    ram_bytes=None if args.ram_gib is None else int(args.ram_gib * GiB),
                    headroom_bytes=int(args.headroom_gib * GiB), tp_offload=args.tp_offload,
                    tensor_parallel=args.tensor_parallel, cpu_attn_gbps=args.cpu_attn_gbps)
    print(plan.to_json() if args.json else describe_plan(plan))
    if not plan.fits:
        raise OutOfMemoryPlanError("; ".join(plan.shortfalls))
    return 0
