"""`main.py bench`: every decoding method on the same prompt, interleaved repeats, as a table and JSON."""
from __future__ import annotations

import argparse
import json
import sys
import time

from engine.cli import validate as v
from engine.cli.chat_cmd import add_decode_arguments, build_settings
from engine.errors import InvalidSettingError
from engine.settings import BENCH_MODES

ALL_METHODS = BENCH_MODES + ("hf", "hf-lookup", "llama.cpp")


def register(subparsers) -> None:
    parser = subparsers.add_parser("bench", help="time every decoding method on the same prompt")
    parser.add_argument("--doc", default=None, help="text to use (default: the bundled sample play)")
    parser.add_argument("--context", type=v.integer_list(64, 2**31 - 1, "tokens"), default="8192",
                        help="context tokens; a comma-separated list gives the speedup curve, e.g. 1024,2048,4096,8192; "
                             "past the model's trained context it runs stretched to it and the answer (YaRN)")
    parser.add_argument("--new-tokens", type=v.integer(1, 2**31 - 1, "tokens"), default=64)
    parser.add_argument("--methods", default="auto,ar,triforce,draft-only,retrieval-only,hf,llama.cpp",
                        help=f"comma-separated, any of {','.join(ALL_METHODS)} (llama.cpp: its own llama-server where "
                             "../shared/tools/build-llama-cpp-server.sh built it, else llama-cpp-python's venv; "
                             "llama.cpp:TYPE runs the server's --spec-type TYPE, e.g. llama.cpp:ngram-simple)")
    parser.add_argument("--workload", default="continue", choices=("continue", "qa", "both", "reopen", "passages"),
                        help="continue a passage (PG-19 setting), answer a question about it, both, or reopen: "
                             "time to first token on a document with and without its prefill snapshot, or passages: "
                             "time to first token on a whole play answered from its most relevant passages")
    parser.add_argument("--repeats", type=v.integer(1, 10_000), default=2)
    parser.add_argument("--max-steal", type=v.real(0, 99, "per cent"), default=None, metavar="PERCENT",
                        help="set aside and re-run a repeat during which the host (hypervisor) stole more than "
                             "PERCENT of the CPU, at most --repeats extra times (Linux guests; default: keep all)")
    parser.add_argument("--interleave", default="step", choices=("step", "answer"),
                        help="step (default): our methods answer side by side, each in its own session, asked for "
                             "tokens in turn, so a slow spell of the host hits them alike; answer: one answer after "
                             "another in one session")
    parser.add_argument("--json", metavar="OUT", default=None)
    parser.add_argument("--report", nargs="+", metavar="GRID_JSON", default=None,
                        help="print the targets read from grids that --json wrote (pooled over several), run nothing")
    add_decode_arguments(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.report:
        from engine.tools.grid_report import print_report

        return print_report(args.report)
    from engine.tools.bench import Peers, format_report, run_bench
    from engine.tools.peers import gguf_for
    from engine.api import Engine, check_device, read_document

    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    from engine.tools.llama_server import SPEC_TYPES

    unknown = [m for m in methods if m not in ALL_METHODS and not (
        m.startswith("llama.cpp:") and m.partition(":")[2] in SPEC_TYPES)]
    if unknown:
        raise InvalidSettingError(f"unknown method(s) {', '.join(unknown)}: use any of {', '.join(ALL_METHODS)}")
    contexts = args.context  # whole numbers from 64 up (validate.integer_list)
    build_settings(argparse.Namespace(**{**vars(args), "max_new_tokens": args.new_tokens}), max(contexts))
    check_device(args.device)  # every flag checked before the model loads
    if args.doc:
        text = read_document(args.doc).text
    else:
        from engine.tools.sample_text import sample_text

        text = sample_text("hamlet")
    # opened like the app and chat open models; the bench shares one loaded model across sessions
    engine = Engine(devices=args.device, snapshots=False, file_blocks=None if args.weights == "file" else False)
    model = engine.load_weights(engine.resolve(args.model))
    draft = args.draft if args.draft in ("ngram", "none") else engine.load_weights(engine.resolve(args.draft))
    if args.workload == "passages":
        from engine.tools.bench_passages import run_passages_workload

        return run_passages_workload(args, model, draft, build_settings(
            argparse.Namespace(**{**vars(args), "max_new_tokens": args.new_tokens}), model.max_context))
    if args.workload == "reopen":
        from engine.tools.bench import run_reopen_bench

        report = run_reopen_bench(model, text, contexts[0], args.repeats,
                                  log=lambda m: print(m, file=sys.stderr, flush=True))
        report["date"] = time.strftime("%Y-%m-%d")
        print(f"{report['model']}: reopening a chat on a {report['context_tokens']}-token document: "
              f"fresh prefill {report['fresh_prefill_s']:.1f} s ({report['tokens_computed_fresh']} tokens computed), "
              f"from snapshot {report['from_snapshot_s']:.1f} s ({report['tokens_computed_from_snapshot']} tokens "
              f"computed; snapshot {report['snapshot_bytes'] / 2**20:.0f} MiB)")
        if args.json:
            with open(args.json, "w", encoding="utf-8") as fh:
                json.dump(report, fh, indent=2)
        return 0
    workloads = ["continue", "qa"] if args.workload == "both" else [args.workload]
    reports = []
    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    peers = Peers(model, gguf_for(args.model) if any(m.startswith("llama.cpp") for m in methods) else None, log=log)
    trained = model.max_context
    for context in contexts:  # a context past the trained one runs the model stretched to it (YaRN)
        model = _model_for(engine, args, context, model, trained)
        peers.use_model(model)
        for workload in workloads:
            if context + args.new_tokens + 64 > model.max_context:
                raise InvalidSettingError(f"--context {context} + {args.new_tokens} new tokens exceed the model's "
                                          f"{model.max_context}-token context: use a shorter context")
            settings = build_settings(argparse.Namespace(**{**vars(args), "max_new_tokens": args.new_tokens}), context)
            report = run_bench(model, text, context, args.new_tokens, methods, settings, draft, workload,
                               args.repeats, log=log, peers=peers, max_steal=args.max_steal,
                               interleave=args.interleave)
            report["date"] = time.strftime("%Y-%m-%d")
            print(format_report(report), flush=True)
            reports.append(report)
            if args.json:  # after every cell: a long curve interrupted late still leaves its numbers
                _write(args.json, reports)
    peers.close_llama()
    if args.json:
        print(f"wrote {args.json}")
    return 0


def _model_for(engine, args, context: int, model, trained: int):
    """The loaded model for a `context`-token prompt: `model` while the prompt fits the trained
    context, else the model stretched to the prompt and its answer (YaRN by window / trained,
    engine/model/stretch.py; llama.cpp's server holds no more than trained x factor tokens, so the
    peer runs the same factor), loaded once per context."""
    from engine.api import Stretch

    window = context + args.new_tokens + 64
    if context <= trained:  # a prompt within the trained context never stretches (too long an answer is refused)
        return model if model.max_context == trained else engine.load_weights(engine.resolve(args.model))
    if model.max_context == window:
        return model
    return engine.load_weights(engine.resolve(args.model), context=Stretch(window))


def _write(path: str, reports: list[dict]) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(reports[0] if len(reports) == 1 else reports, fh, indent=2)
