"""`python -m tests.reliability`: the bad-input table and the kill -9 loop, with counts."""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from tests.reliability.bad_inputs import make_files, run_table
from tests.reliability.kill_loop import run_kills

REPO = Path(__file__).resolve().parents[2]


def tiny_model(dest: Path) -> Path:
    """A tiny random Llama (2 layers, hidden 64) with the bundled model's tokenizer: fast to load
    and to run, so the loop spends its time on what it tests (saving, killing, recovering)."""
    import json
    import shutil

    import torch
    import transformers

    from engine.store.models import resolve_model

    from engine.store.models import BUNDLED_NAME

    cached = REPO / ".test-cache" / "home" / "models" / BUNDLED_NAME  # the test suite's converted copy
    bundled = cached if (cached / "tokenizer.json").is_file() else resolve_model("bundled").path
    vocab = json.loads((bundled / "config.json").read_text(encoding="utf-8"))
    config = transformers.LlamaConfig(
        vocab_size=vocab["vocab_size"], hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, intermediate_size=128, max_position_embeddings=8192, head_dim=16,
        tie_word_embeddings=False, bos_token_id=vocab.get("bos_token_id"), eos_token_id=vocab.get("eos_token_id"))
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(dest)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json"):
        if (bundled / name).is_file():
            shutil.copy2(bundled / name, dest / name)
    return dest


def passage(dest: Path, chars: int = 3000) -> Path:
    """The start of the bundled sample play: a document worth a visible prefill."""
    text = (REPO / "resources" / "sample" / "hamlet.md").read_text(encoding="utf-8")[:chars]
    dest.write_text(text, encoding="utf-8")
    return dest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.reliability", description=__doc__)
    parser.add_argument("--kills", type=int, default=100, help="SIGKILLed chats (default 100; 0 skips the loop)")
    parser.add_argument("--model", type=Path, default=None, help="model folder (default: a tiny random model)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="only the quick bad inputs")
    parser.add_argument("--no-table", action="store_true", help="skip the bad-input table")
    parser.add_argument("--max-minutes", type=float, default=None, help="stop killing after this long (then check)")
    parser.add_argument("--doc-chars", type=int, default=3000, help="document size each chat prefills")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="triforce-reliability-") as tmp:
        root = Path(tmp)
        model = args.model or tiny_model(root / "tiny-model")
        if not args.no_table:
            print("bad inputs (each a fresh `main.py` process):", flush=True)
            started = time.monotonic()
            table = run_table(make_files(root / "inputs", model), quick=args.quick,
                              report=lambda line: print(line, flush=True))
            print(f"{table.line()} ({time.monotonic() - started:.0f} s)", flush=True)
        if args.kills:
            print(f"kill -9 loop ({args.kills} kills, seed {args.seed}):", flush=True)
            started = time.monotonic()
            counts = run_kills(args.kills, model, passage(root / "passage.md", args.doc_chars), root / "kill-home",
                               seed=args.seed, max_new_tokens=args.max_new_tokens,
                               report=lambda line: print(line, flush=True),
                               max_seconds=None if args.max_minutes is None else args.max_minutes * 60)
            for problem in counts.problems[:20]:
                print(f"  problem: {problem}", flush=True)
            print(f"{counts.line()} ({time.monotonic() - started:.0f} s)", flush=True)
            if counts.corrupt or counts.lost or counts.orphans:
                return 1
        table_ok = args.no_table or (table.clean == table.tried and not (table.tracebacks or table.junk or table.lost))
        return 0 if table_ok else 1


if __name__ == "__main__":
    sys.exit(main())
