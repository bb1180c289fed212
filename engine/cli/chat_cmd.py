"""`main.py chat`: ask a question (optionally about documents) from the terminal.

The answer streams to stdout; `--stats` prints one JSON object to stderr at the end. Chats are
kept in the chat store, so `--chat ID` continues one (also one the app made).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from engine.cli import validate as v
from engine.errors import InvalidSettingError, ModelFormatError
from engine.events import ChatMessage, DocumentText, Finished
from engine.settings import (
    DEFAULT_FREQUENCY_PENALTY, DEFAULT_PRESENCE_PENALTY, FALLBACK_SAMPLING, MODES, DecodeSettings, Sampling,
    default_budget, recommended_sampling,
)


def add_decode_arguments(parser: argparse.ArgumentParser) -> None:
    """Options shared by `chat` and `bench`."""
    parser.add_argument("--model", default="bundled", help="bundled (default), a Hugging Face repo id, a folder or a .gguf file")
    parser.add_argument("--draft", default="ngram", help="L0 drafter: ngram (default), none, or a draft model spec")
    parser.add_argument("--mode", default="auto", choices=MODES,
                        help="auto (default: picks the fastest structure online) or a fixed one")
    parser.add_argument("--budget", type=int, default=None, help="retrieval-cache budget in tokens (default: auto)")
    parser.add_argument("--chunk", type=int, default=16, help="tokens per retrieval chunk")
    parser.add_argument("--gamma1", type=int, default=None, help="tokens L0 drafts per L1 check")
    parser.add_argument("--gamma2", type=int, default=None, help="tokens L1 drafts per L2 check")
    parser.add_argument("--device", type=v.device, default="auto", help="auto, cpu, cuda, cuda:1 ...")
    parser.add_argument("--weights", default="file", choices=("file", "float32"),
                        help="on the CPU, a GGUF model runs its own 4/8-bit blocks (file, default) or the float32 "
                             "conversion (float32: slower, the oracle the file's blocks are tested against)")
    parser.add_argument("--cuda-graphs", action="store_true",
                        help="on a GPU: replay fixed-shape steps from CUDA graphs (opt-in until measured)")
    parser.add_argument("--auto", action="store_true", help="with a fixed --mode: tune its gamma1/gamma2 online")


def build_settings(args: argparse.Namespace, context_tokens: int, recommended: Sampling | None = None) -> DecodeSettings:
    """Settings from CLI args; the retrieval budget defaults to ~1/8 of the context, multiple of chunk.
    Sampling flags left out take `recommended` (the model's, see recommended_sampling)."""
    chunk = args.chunk
    if not 1 <= chunk <= 1024:  # checked before the budget is sized from it (chunk 0 divided by zero)
        raise InvalidSettingError(f"--chunk {chunk} is out of range: use 1 to 1024 tokens")
    budget = default_budget(context_tokens, chunk) if args.budget is None else args.budget
    defaults = DecodeSettings()
    settings = DecodeSettings(
        mode=args.mode, budget=budget, chunk=chunk,  # an explicit 0 is refused by validate(), never replaced
        gamma1=defaults.gamma1 if args.gamma1 is None else args.gamma1,
        gamma2=defaults.gamma2 if args.gamma2 is None else args.gamma2,
        max_new_tokens=getattr(args, "max_new_tokens", defaults.max_new_tokens),
        stop=tuple(getattr(args, "stop", None) or ()),
        sampling=_sampling(args, recommended),
        auto=bool(getattr(args, "auto", False)),
    )
    settings.validate()  # a bad flag fails before any weight is read
    return settings


def _sampling(args: argparse.Namespace, recommended: Sampling | None) -> Sampling:
    """The sampling flags over `recommended`; a command without them (bench) decodes greedily."""
    if not hasattr(args, "temperature"):
        return Sampling(seed=getattr(args, "seed", None))
    base = recommended or recommended_sampling(None)
    chosen = {name: getattr(args, name) for name in ("temperature", "top_p", "top_k", "presence_penalty",
                                                     "frequency_penalty") if getattr(args, name, None) is not None}
    return dataclasses.replace(base, seed=getattr(args, "seed", None), **chosen)


def _generation_config(folder) -> dict | None:
    """The model folder's generation_config.json (its recommended sampling), if readable."""
    try:
        return json.loads((folder / "generation_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def register(subparsers) -> None:
    parser = subparsers.add_parser("chat", help="ask a question from the terminal (answer streams to stdout)")
    parser.add_argument("--ask", required=True, help="the question")
    parser.add_argument("--doc", action="append", default=[], help="a document to ask about (repeatable)")
    parser.add_argument("--system", default=None, help="system prompt")
    parser.add_argument("--chat", type=v.ROW_ID, default=None, help="continue stored chat ID (see `main.py chats`)")
    parser.add_argument("--no-save", action="store_true", help="do not keep this chat in the chat store")
    parser.add_argument("--no-snapshot", action="store_true", help="neither use nor save prefilled-book snapshots")
    parser.add_argument("--max-new-tokens", type=v.integer(1, 2**31 - 1, "tokens"), default=256)
    parser.add_argument("--context", type=v.integer(64, 2**31 - 1, "tokens"), default=None, metavar="N",
                        help="the chat's window in tokens; past the model's trained context it is stretched with "
                             "YaRN (the smallest factor that fits; lower quality beyond the trained length)")
    fallback = FALLBACK_SAMPLING
    parser.add_argument("--temperature", type=v.temperature, default=None,
                        help=f"0 = greedy (default: the model's recommended, from its generation_config.json, "
                             f"else {fallback.temperature})")
    parser.add_argument("--top-p", type=v.real(v.MIN_TOP_P, 1.0), default=None,
                        help=f"default: the model's, else {fallback.top_p}")
    parser.add_argument("--top-k", type=int, default=None, help=f"0 = off (default: the model's, else {fallback.top_k})")
    parser.add_argument("--presence-penalty", type=float, default=None,
                        help=f"lower the logit of a token already in the answer, -2 to 2 (default {DEFAULT_PRESENCE_PENALTY})")
    parser.add_argument("--frequency-penalty", type=float, default=None,
                        help=f"... by this per occurrence, -2 to 2 (default {DEFAULT_FREQUENCY_PENALTY}; 0 = off)")
    parser.add_argument("--seed", type=v.SEED, default=None, help=f"sampling seed, 0 to {v.SEED_MAX}")
    parser.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    parser.add_argument("--stats", action="store_true", help="print one JSON object of statistics to stderr")
    parser.add_argument("--progress", action="store_true", help="show prefill progress on stderr")
    add_decode_arguments(parser)
    from engine.cli.fit import add_fit_argument

    add_fit_argument(parser)
    parser.set_defaults(func=run)


def _load_conversation(args, store):
    """(chat id or None, prior messages, documents) from the store and the command line."""
    from engine.api import read_document

    messages: list[ChatMessage] = []
    documents: list[DocumentText] = []
    chat_id = args.chat
    if chat_id is not None:
        chat = store.get_chat(chat_id)
        messages = [ChatMessage(m.role, m.text) for m in chat.messages if m.role in ("user", "assistant")]
        documents = [DocumentText(d.title, d.text, d.source) for d in store.chat_documents(chat_id)]
    new_docs = [read_document(path) for path in args.doc]
    return chat_id, messages, documents, new_docs


def run(args: argparse.Namespace) -> int:
    from engine.api import ChatStore, Engine, check_device, check_writable

    build_settings(args, 1 << 16)  # every flag checked in a blink, before torch or a tokenizer loads
    saving = not (args.no_save and args.chat is None)
    check_writable(chats=saving, snapshots=not args.no_snapshot)  # a read-only home fails now, not after a prefill
    check_device(args.device)
    store = ChatStore() if saving else None
    chat_id, history, documents, new_docs = _load_conversation(args, store) if store else (None, [], [], [])
    if not store:
        from engine.api import read_document

        new_docs = [read_document(path) for path in args.doc]
    documents = documents + new_docs
    for doc in new_docs:  # e.g. junk NUL bytes dropped from an old text file: read, but say so
        for note in doc.meta.get("notes", ()):
            print(f"note: {note}", file=sys.stderr)
    messages = history + [ChatMessage("user", args.ask)]

    # resolve specs before importing torch/transformers, so a wrong spec fails in a blink
    if args.context is not None and args.context < 1:
        raise InvalidSettingError(f"--context {args.context} is out of range: use 1 or more tokens")
    engine = Engine(devices=args.device, snapshots=not args.no_snapshot, first_cache_tokens=None,
                    cuda_graphs=args.cuda_graphs, file_blocks=None if args.weights == "file" else False,
                    context=args.context)
    target_folder = engine.resolve(args.model, progress=_progress_printer(args))
    draft = args.draft if args.draft in ("ngram", "none") else engine.resolve(args.draft)
    # the prompt's length sizes the plan and the cache: check it before any weight is read
    from engine.cli.fit import document_fits, fit_conversation, fit_stats, print_passages, remember_fits

    max_context = _max_context(target_folder.path, args.context)
    fits = document_fits(args, store, chat_id, len(documents) - len(new_docs), len(new_docs))
    fitted = fit_conversation(args, target_folder, messages, documents, fits, max_context)  # refuses (exit 2)
    prompt_len, needed = fitted.prompt_tokens, fitted.prompt_tokens + args.max_new_tokens
    settings = build_settings(args, prompt_len, recommended_sampling(_generation_config(target_folder.path)))
    # on a GPU machine the plan places weights and KV (one card, layer split or tensor parallel,
    # offloaded KV layers) before any weight is read, and raises with the numbers if it cannot fit
    session = engine.load(target_folder, draft, settings, capacity=min(max_context, needed + 64))

    # the question and the growing answer are saved as one turn; Ctrl+C or SIGTERM keeps what printed
    from engine.cli.answer_out import AnswerPrinter, stream_turn

    final, chat_id = stream_turn(
        session.stream(messages, list(fitted.documents), args.system), AnswerPrinter(args.progress), store,
        chat_id, args.ask, new_docs, args.model,
        stats_of=lambda final, chat: _stats(final, chat) | fit_stats(fitted, fits, documents),
        on_chat=lambda chat: remember_fits(store, chat, documents, fits))
    if args.stats:
        opened = engine.describe(args.model, session)
        where = {"weights": opened.device, "kv_layers_offloaded": opened.kv_layers_offloaded,
                 "plan": opened.plan_mode}
        print_passages(fitted)
        print(json.dumps({**_stats(final, chat_id), "placement": where, **fit_stats(fitted, fits, documents)}), file=sys.stderr)
    return 0


def _max_context(folder, context: int | None = None) -> int:
    """The model's window: its trained context, or `context` (--context; a stretch is checked here)."""
    from engine.api import stretched_dict

    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        trained = int(config.get("max_position_embeddings") or 4096)
    except (OSError, ValueError, TypeError, AttributeError) as exc:
        raise ModelFormatError(f"{folder / 'config.json'} is not a valid model config ({exc}): fix the file, "
                               "or convert or download the model again") from None
    if context is None:
        return trained
    return min(context, int(stretched_dict(config, context, name=folder.name)["max_position_embeddings"]))


def _stats(final: Finished, chat_id) -> dict:
    m = final.metrics
    out = {
        "chat_id": chat_id,
        "finish_reason": final.reason.value,
        "mode": m.mode,
        "prompt_tokens": m.prompt_tokens,
        "new_tokens": m.new_tokens,
        "prefill_tokens": m.prefill_tokens,
        "prefill_tokens_per_s": m.prefill_tokens_per_s,
        "decode_tokens_per_s": m.decode_tokens_per_s,
        "time_to_first_token_s": m.time_to_first_token_s,
        "acceptance": {lv.name: lv.rate for lv in m.levels},
        "proposed_accepted": {lv.name: [lv.proposed, lv.accepted] for lv in m.levels},
        "mean_accepted_per_verify": m.mean_accepted_per_verify,
        "retrieval_rebuilds": m.retrieval_rebuilds,
        "settings": m.settings_summary,
        "structure": m.structure,  # what ran last (under auto: the policy's pick)
        "structure_switches": m.structure_switches,
        "candidates_ms_per_token": {c.structure: round(c.ms_per_token, 2) for c in m.candidates},
    }
    return out


def _progress_printer(args):
    if not args.progress:
        return None

    def show(message: str, fraction: float | None) -> None:
        suffix = f" {fraction:.0%}" if fraction is not None else ""
        print(f"{message}{suffix}", file=sys.stderr)

    return show
