"""Bench workload `passages`: time to first token on a whole play that does not fit the context,
answered from its most relevant passages (`main.py bench --workload passages`).

Each run starts a fresh session (nothing cached, no snapshot), so the time covers everything a
new question about the book costs: splitting and ranking the play, rendering the prompt, the
prefill of the selected passages, and the first answer token. Questions are about the play's
last act; each run also checks that the passage holding the answer is among the cited ones.
"""
from __future__ import annotations

import os
import statistics
import time

from engine.decoding.passage_fit import fit_prompt
from engine.decoding.session import ChatSession
from engine.events import ChatMessage, DocumentText, Finished, TokenText
from engine.model.loading import LoadedModel
from engine.settings import DecodeSettings

# (question about Act V of Hamlet, words found only in the passage that answers it)
LAST_ACT_QUESTIONS = (
    ("In the fencing match at the end, what happens to the Queen when she drinks from the cup?", "I am poison'd"),
    ("In the churchyard, whose skull does the gravedigger hand to Hamlet?", "poor Yorick"),
    ("Who comes from the Polish wars at the very end, and who does Hamlet give his dying voice to?", "dying voice"),
)


def run_passages_bench(model: LoadedModel, document: DocumentText, settings: DecodeSettings, draft="ngram",
                       repeats: int = 1, log=print) -> dict:
    """Time to first token for each last-act question (`repeats` times each), fresh session each run."""
    runs = []
    context = model.max_context
    for _ in range(repeats):
        for question, needle in LAST_ACT_QUESTIONS:
            messages = [ChatMessage("user", question)]
            started = time.perf_counter()
            fitted = fit_prompt(model.tokenizer, messages, [document], ["passages"], None, context,
                                settings.max_new_tokens)
            fit_s = time.perf_counter() - started
            session = ChatSession(model, settings, draft=draft, capacity=context)
            first_s, text, prefilled, prefill_rate = None, "", 0, None
            for event in session.stream(messages, list(fitted.documents)):
                if isinstance(event, TokenText) and first_s is None:
                    first_s = time.perf_counter() - started
                elif isinstance(event, Finished):
                    text, prefilled = event.text, event.metrics.prefill_tokens
                    prefill_rate = event.metrics.prefill_tokens_per_s
            selection = fitted.selections[0]
            cited = next((p.label for p in selection.passages if needle in p.text), None)
            runs.append({"question": question, "time_to_first_token_s": first_s, "fit_s": fit_s,
                         "prompt_tokens": fitted.prompt_tokens, "prefill_tokens": prefilled,
                         "prefill_tokens_per_s": prefill_rate, "load_average": os.getloadavg()[0],
                         "passages_used": len(selection.passages), "passages_total": selection.total_passages,
                         "answer_passage_cited": cited, "answer": text})
            log(f"{first_s:.1f} s to first token (fit {fit_s:.2f} s, {prefilled:,} tokens prefilled at "
                f"{prefill_rate or 0:.0f} tok/s, load average {os.getloadavg()[0]:.1f}, "
                f"{len(selection.passages)} of {selection.total_passages} passages; answer passage "
                f"{'cited: ' + cited if cited else 'NOT cited'}): {question}")
    times = [r["time_to_first_token_s"] for r in runs]
    return {  # a shared machine's load slows every run: the load average is part of the number
        "model": model.model_id, "document": document.title,
        "document_tokens": len(model.tokenizer(document.text, add_special_tokens=False)["input_ids"]),
        "context_tokens": context, "cpus": os.cpu_count(), "load_after": os.getloadavg()[0],
        "median_time_to_first_token_s": statistics.median(times), "max_time_to_first_token_s": max(times),
        "min_time_to_first_token_s": min(times),
        "answer_passage_cited": sum(1 for r in runs if r["answer_passage_cited"]), "runs": runs,
    }


def format_passages_report(report: dict) -> str:
    """The one-paragraph summary `main.py bench --workload passages` prints."""
    lines = [f"{report['model']}: time to first token on {report['document']} ({report['document_tokens']:,} "
             f"tokens, context {report['context_tokens']:,}) with --fit passages, fresh session each run: "
             f"median {report['median_time_to_first_token_s']:.1f} s (min {report['min_time_to_first_token_s']:.1f}, "
             f"max {report['max_time_to_first_token_s']:.1f}; {len(report['runs'])} runs); "
             f"answer passage cited in {report['answer_passage_cited']} of {len(report['runs'])}; "
             f"load average {report['load_after']:.1f} on {report['cpus']} CPUs"]
    for r in report["runs"]:
        lines.append(f"  {r['time_to_first_token_s']:.1f} s  {r['prefill_tokens']:,} prefilled at "
                     f"{r['prefill_tokens_per_s'] or 0:.0f} tok/s  "
                     f"{r['question']}\n    -> {' '.join(r['answer'].split())[:200]}")
    return "\n".join(lines)


def run_passages_workload(args, model: LoadedModel, draft, settings: DecodeSettings) -> int:
    """`main.py bench --workload passages [--doc BOOK] [--repeats N] [--new-tokens N] [--json OUT]`:
    three last-act questions, each asked `--repeats // 2` times (at least once)."""
    import json
    import sys

    from engine.documents import read_document
    from engine.tools.sample_text import sample_path

    document = read_document(args.doc or sample_path("hamlet"))
    report = run_passages_bench(model, document, settings, draft, max(1, args.repeats // 2),
                                log=lambda m: print(m, file=sys.stderr, flush=True))
    report["date"] = time.strftime("%Y-%m-%d")
    print(format_passages_report(report), flush=True)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(report, fh, indent=2)
    return 0
