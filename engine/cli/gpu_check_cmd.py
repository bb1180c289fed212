"""`main.py gpu-check`: measure bandwidth, per-level step times and the offload overlap on this GPU
(random weights of Llama-3.1-8B's shapes, nothing downloaded); print a table, optionally JSON."""
from __future__ import annotations

import argparse

from engine.cli import validate as v


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("gpu-check", help="measure GPU bandwidth, level step times and KV offload overlap",
                              description="Random Llama-3.1-8B-shaped bf16 weights on the GPU (no download): pinned "
                                          "bandwidth, CPU attention on the host, L1/L2 forwards at 32K and 128K eager and "
                                          "CUDA-graphed, offloaded verification stream-only vs hybrid vs on-chip, draft "
                                          "step, composed TriForce vs AR ms/token, the paper's setting modelled.")
    p.add_argument("--device", type=v.device, default="cuda",
                   help="cuda (default), cuda:N, or cpu (tiny shapes: exercises the code)")
    p.add_argument("--quick", action="store_true", help="fewer repetitions and shorter contexts (16K, 32K)")
    p.add_argument("--contexts", type=v.integer_list(64, 2**31 - 1, "tokens"), default=None,
                   help="comma-separated context lengths, e.g. 32768,131072")
    p.add_argument("--json", metavar="OUT", default=None, help="also write the results as JSON to OUT")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import sys

    from engine.api import check_device
    from engine.tools.gpu_check import format_table, run_check, write_json

    if not str(args.device).startswith("cuda"):  # run_check says what a missing GPU means for gpu-check
        check_device(args.device)
    contexts = tuple(args.contexts) if args.contexts else None
    result = run_check(args.device, args.quick, contexts, log=lambda m: print(m, file=sys.stderr, flush=True))
    print(format_table(result))
    if args.json:
        write_json(result, args.json)
        print(f"wrote {args.json}")
    return 0
