"""The bundled model re-quantized by llama.cpp's quantizer, for testing the K-quant kinds on real text
(a maintainer's tool: llama.cpp is never an app or test-suite dependency).

    .venv/bin/python -m engine.tools.requantize [--types Q4_K_M,Q6_K] [--out DIR] [--quantize PATH]

writes DIR/SmolLM2-135M-Instruct-<TYPE>.gguf for each type (the source's name without its kind) (default DIR ~/.cache/triforce-test-models,
quantizer $TRIFORCE_LLAMA_QUANTIZE, else the one tools/build-llama-cpp-server.sh builds under
~/.cache/llama-cpp-peer/build/bin) and prints each file's block kinds and whether all of them run
natively. The bundled file is Q4_1, so the quantizer re-quantizes (--allow-requantize): the weights
are Q4_1's, rounded again, not the original float16 model's. Where a row is not a whole number of
256-weight super-blocks (SmolLM2-135M's hidden size is 576), llama.cpp stores that tensor in a
32-weight kind instead (Q5_0 for Q4_K, Q8_0 for Q6_K).
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

DEFAULT_OUT = Path.home() / ".cache" / "triforce-test-models"
DEFAULT_QUANTIZE = Path.home() / ".cache" / "llama-cpp-peer" / "build" / "bin" / "llama-quantize"


def quantizer() -> Path | None:
    """llama-quantize: $TRIFORCE_LLAMA_QUANTIZE, else the peer build's; None where neither exists."""
    env = os.environ.get("TRIFORCE_LLAMA_QUANTIZE")
    path = Path(env).expanduser() if env else DEFAULT_QUANTIZE
    return path if path.is_file() else None


def quantize_command(tool: Path, source: Path, dest: Path, qtype: str) -> list[str]:
    """The quantizer's command line for one output file."""
    return [str(tool), "--allow-requantize", str(source), str(dest), qtype]


def block_kinds(path: Path) -> Counter:
    """How many of the file's tensors are stored in each kind (F32, Q4_K, ...)."""
    from gguf import GGUFReader

    return Counter(t.tensor_type.name for t in GGUFReader(str(path)).tensors)


def requantize(source: Path, out: Path, types: list[str], tool: Path) -> list[Path]:
    """Write out/<source stem without its kind>-<TYPE>.gguf for each type; returns the paths."""
    out.mkdir(parents=True, exist_ok=True)
    stem = re.sub(r"[.-](I?Q\d\w*|F16|BF16|F32)$", "", source.stem, flags=re.IGNORECASE)  # drop the kind
    written = []
    for qtype in types:
        dest = out / f"{stem}-{qtype}.gguf"
        tmp = dest.with_name(dest.name + ".tmp")
        result = subprocess.run(quantize_command(tool, source, tmp, qtype), capture_output=True, text=True)
        if result.returncode != 0:
            tmp.unlink(missing_ok=True)
            raise RuntimeError(f"{tool.name} {qtype} failed: {result.stderr.strip()[-400:]}")
        os.replace(tmp, dest)
        written.append(dest)
    return written


def main(argv: list[str] | None = None) -> int:
    from engine.model.quant import SUPPORTED
    from engine.store.models import bundled_gguf_path

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--types", default="Q4_K_M,Q6_K", help="llama-quantize types, comma-separated")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--quantize", type=Path, default=None, help="llama-quantize (default: see above)")
    parser.add_argument("--source", type=Path, default=None, help="the GGUF to re-quantize (default: the bundled one)")
    args = parser.parse_args(argv)
    tool = args.quantize or quantizer()
    if tool is None or not tool.is_file():
        print("llama-quantize not found: build llama.cpp (tools/build-llama-cpp-server.sh) or pass --quantize",
              file=sys.stderr)
        return 2
    source = args.source or bundled_gguf_path()
    for path in requantize(source, args.out.expanduser(), [t.strip() for t in args.types.split(",") if t.strip()], tool):
        kinds = block_kinds(path)
        foreign = sorted(k for k in kinds if k not in SUPPORTED and k not in ("F32", "F16", "BF16"))
        listed = ", ".join(f"{k} x{n}" for k, n in sorted(kinds.items()))
        verdict = "every block kind runs natively" if not foreign else f"not native: {', '.join(foreign)}"
        print(f"{path} ({path.stat().st_size / 1e6:.1f} MB): {listed}; {verdict}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
