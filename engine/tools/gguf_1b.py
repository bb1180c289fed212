"""A 1B-shaped GGUF for memory and speed at a realistic size (a maintainer's tool, not a test).

    python3 -m engine.tools.gguf_1b --out ~/gguf-1b [--kinds Q4_K_M,Q4_0,Q8_0]

Writes Llama-3.2-1B's shape (hidden 2048, 16 layers, 32 heads, 8 KV heads, intermediate 8192,
vocabulary 128,256, tied embeddings, RoPE theta 500,000 with llama3 scaling: factor 32, low 1,
high 4 over 8,192 original positions, stored as llama.cpp stores it, a rope_freqs tensor) with
random weights as an F16 GGUF, then quantizes it with llama.cpp's llama-quantize to each kind
(`--pure`: every tensor in that kind, except Q4_K_M, which is llama.cpp's own mix).

The tokenizer in the metadata is the bundled SmolLM2 BPE tokenizer (49,152 tokens, its merges and
chat template) padded to 128,256 with control tokens <|reserved_N|>, so the file carries a real
tokenizer and its vocabulary matches the embedding. The weights are random: the model's text is
noise, its size and arithmetic are a 1B model's.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

SHAPE = dict(hidden=2048, layers=16, heads=32, kv_heads=8, ffn=8192, vocab=128256, context=131072,
             theta=500000.0, eps=1e-5, factor=32.0, low=1.0, high=4.0, original=8192)
LLAMA_QUANTIZE = Path.home() / ".cache" / "llama-cpp-peer" / "build" / "bin" / "llama-quantize"


def llama3_divisors(head_dim: int, theta: float, factor: float, low: float, high: float, original: int) -> np.ndarray:
    """The per-frequency divisors llama.cpp stores as rope_freqs for llama3 RoPE scaling: 1 for the
    high frequencies, `factor` for the low ones, a smooth blend between."""
    inv_freq = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    smooth = np.clip((original / (2 * np.pi / inv_freq) - low) / (high - low), 0.0, 1.0)
    return (1.0 / ((1 - smooth) / factor + smooth)).astype(np.float32)


def write_f16(path: Path, seed: int = 0) -> None:
    """The F16 GGUF, tensor by tensor (never more than one tensor in memory)."""
    import gguf

    from engine.store.gguf_file import read_header
    from engine.store.models import bundled_gguf_path

    s = SHAPE
    source = read_header(bundled_gguf_path(), ("tokenizer.ggml.tokens", "tokenizer.ggml.merges"))
    tokens = list(source.metadata["tokenizer.ggml.tokens"])
    types = [int(t) for t in source.metadata["tokenizer.ggml.token_type"]]
    pad = s["vocab"] - len(tokens)
    tokens += [f"<|reserved_{i}|>" for i in range(pad)]
    types += [int(gguf.TokenType.CONTROL)] * pad
    head_dim = s["hidden"] // s["heads"]
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("random-llama-3.2-1b-shape")
    w.add_context_length(s["context"])
    w.add_embedding_length(s["hidden"])
    w.add_block_count(s["layers"])
    w.add_feed_forward_length(s["ffn"])
    w.add_head_count(s["heads"])
    w.add_head_count_kv(s["kv_heads"])
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(s["theta"])
    w.add_layer_norm_rms_eps(s["eps"])
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_vocab_size(s["vocab"])
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(str(source.metadata.get("tokenizer.ggml.pre", "smollm")))
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(list(source.metadata["tokenizer.ggml.merges"]))
    for name in ("bos", "eos", "unknown", "padding"):
        value = source.metadata.get(f"tokenizer.ggml.{name}_token_id")
        if value is not None:
            getattr(w, {"bos": "add_bos_token_id", "eos": "add_eos_token_id", "unknown": "add_unk_token_id",
                        "padding": "add_pad_token_id"}[name])(int(value))
    w.add_chat_template(str(source.metadata["tokenizer.chat_template"]))
    kv_rows = s["kv_heads"] * head_dim
    tensors = [("rope_freqs.weight", (head_dim // 2,), "ropefreqs"), ("token_embd.weight", (s["vocab"], s["hidden"]), "w")]
    for i in range(s["layers"]):
        tensors += [(f"blk.{i}.attn_norm.weight", (s["hidden"],), "norm"),
                    (f"blk.{i}.attn_q.weight", (s["hidden"], s["hidden"]), "w"),
                    (f"blk.{i}.attn_k.weight", (kv_rows, s["hidden"]), "w"),
                    (f"blk.{i}.attn_v.weight", (kv_rows, s["hidden"]), "w"),
                    (f"blk.{i}.attn_output.weight", (s["hidden"], s["hidden"]), "w"),
                    (f"blk.{i}.ffn_norm.weight", (s["hidden"],), "norm"),
                    (f"blk.{i}.ffn_gate.weight", (s["ffn"], s["hidden"]), "w"),
                    (f"blk.{i}.ffn_up.weight", (s["ffn"], s["hidden"]), "w"),
                    (f"blk.{i}.ffn_down.weight", (s["hidden"], s["ffn"]), "w")]
    tensors.append(("output_norm.weight", (s["hidden"],), "norm"))
    for name, shape, role in tensors:
        dtype = np.float16 if role == "w" else np.float32
        w.add_tensor_info(name, shape, np.dtype(dtype), int(np.prod(shape)) * np.dtype(dtype).itemsize)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    rng = np.random.default_rng(seed)
    for name, shape, role in tensors:
        if role == "ropefreqs":
            value = llama3_divisors(head_dim, s["theta"], s["factor"], s["low"], s["high"], s["original"])
        elif role == "norm":
            value = np.ones(shape, np.float32)
        else:  # N(0, 0.02), generated in float32 a row block at a time
            value = np.empty(shape, np.float16)
            for start in range(0, shape[0], 4096):
                value[start:start + 4096] = rng.standard_normal((min(4096, shape[0] - start), shape[1]),
                                                                np.float32) * 0.02
        w.write_tensor_data(value)
    w.close()


def quantize(f16: Path, kind: str, out: Path, binary: Path = LLAMA_QUANTIZE) -> None:
    """llama-quantize F16 -> `kind` (every tensor in `kind` except for the *_M/*_S mixes)."""
    if not binary.is_file():
        raise SystemExit(f"{binary} is missing: build llama.cpp first (see the project's shared tools)")
    pure = [] if kind.endswith(("_M", "_S", "_L")) else ["--pure"]
    env = dict(os.environ, LD_LIBRARY_PATH=f"{binary.parent}:{os.environ.get('LD_LIBRARY_PATH', '')}")
    subprocess.run([str(binary), *pure, str(f16), str(out), kind, str(os.cpu_count() or 1)], check=True, env=env,
                   stdout=subprocess.DEVNULL)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for the files")
    parser.add_argument("--kinds", default="Q4_K_M,Q4_0,Q8_0", help="llama-quantize kinds to make from the F16 file")
    parser.add_argument("--keep-f16", action="store_true", help="keep the 2.5 GB F16 file")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    f16 = args.out / "llama-3.2-1b-shape-F16.gguf"
    if not f16.is_file():
        print(f"writing {f16}", file=sys.stderr)
        write_f16(f16.with_suffix(".tmp"))
        f16.with_suffix(".tmp").rename(f16)
    for kind in filter(None, args.kinds.split(",")):
        out = args.out / f"llama-3.2-1b-shape-{kind}.gguf"
        if not out.is_file():
            print(f"quantizing to {kind}: {out}", file=sys.stderr)
            quantize(f16, kind, out)
        print(out)
    if not args.keep_f16:
        f16.unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main())
