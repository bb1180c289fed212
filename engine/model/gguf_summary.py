"""What a GGUF holds and what running it takes, for listings: its block kinds (share of the file's
tensor bytes), which of them run as stored and which are widened to float32, and the RAM a CPU run
needs (the mapped file, widened tensors in float32, the float16 K/V of a context)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from engine.errors import ModelFormatError
from engine.store.gguf_file import GgufFile, read_header
from engine.store.gguf_meta import ARCHITECTURES
from engine.store.model_folders import LocalModel

LISTING_CONTEXT = 8192  # the app's default context; a model with a shorter one is listed at its own
KV_BYTES = 2  # float16 K/V on the CPU (runner.kv_dtype)


@dataclass(frozen=True)
class KindShare:
    kind: str  # "Q4_K", "F32", ...
    share: float  # of the file's tensor bytes, 0..1
    native: bool  # runs as stored (a block kernel, or plain floats); else widened to float32


@dataclass(frozen=True)
class GgufSummary:
    architecture: str
    kinds: tuple[KindShare, ...]  # largest share first
    mapped_bytes: int  # tensor bytes that run from the mapped file
    widened_bytes: int  # float32 bytes of the tensors widened at load
    kv_bytes: int  # K/V of `context` tokens
    context: int

    @property
    def ram_bytes(self) -> int:
        return self.mapped_bytes + self.widened_bytes + self.kv_bytes

    @property
    def widened_kinds(self) -> tuple[str, ...]:
        return tuple(k.kind for k in self.kinds if not k.native)

    def kinds_text(self) -> str:
        """"Q4_K 60%, Q6_K 40%" (kinds under half a percent left out: the norms)."""
        shown = [f"{k.kind} {k.share:.0%}" for k in self.kinds if k.share >= 0.005]
        return ", ".join(shown) or "-"

    def runs_text(self) -> str:
        """Plainly which kinds run as stored and which do not."""
        if not self.widened_kinds:
            return "every kind runs natively"
        native = [k.kind for k in self.kinds if k.native and k.share >= 0.005]
        return (f"{', '.join(native) or 'nothing'} native; {', '.join(self.widened_kinds)} widened to float32 "
                "(slower, more RAM)")


def summarize(path: Path, context: int = LISTING_CONTEXT) -> GgufSummary:
    """The summary of the GGUF at `path` (its header only; raises ModelFormatError if damaged)."""
    return summarize_file(read_header(Path(path)), context)


def summarize_file(gguf: GgufFile, context: int = LISTING_CONTEXT) -> GgufSummary:
    from engine.model.gguf_weights import runs_natively

    total = sum(t.nbytes for t in gguf.tensors.values()) or 1
    by_kind: dict[str, int] = {}
    mapped = widened = 0
    for t in gguf.tensors.values():
        by_kind[t.kind] = by_kind.get(t.kind, 0) + t.nbytes
        if runs_natively(t.kind):
            mapped += t.nbytes
        else:
            widened += 4 * t.elements
    kinds = tuple(sorted((KindShare(k, n / total, runs_natively(k)) for k, n in by_kind.items()),
                         key=lambda k: -k.share))
    key = gguf.arch_key
    context = min(context, int(key("context_length", context) or context))
    heads = int(key("attention.head_count", 1) or 1)
    head_dim = int(key("attention.key_length", 0) or int(key("embedding_length", 0) or 0) // heads)
    kv = 2 * int(key("block_count", 0) or 0) * int(key("attention.head_count_kv", heads) or heads) * head_dim \
        * context * KV_BYTES
    return GgufSummary(gguf.architecture, kinds, mapped, widened, kv, context)


def describe(model: LocalModel) -> LocalModel:
    """A listing row with its GGUF's kinds, what runs natively and the RAM it needs (rows that are
    not .gguf files come back as they are; a damaged file's row says what to do)."""
    if model.path.suffix.lower() != ".gguf":
        return model
    try:
        summary = summarize(model.path)
    except ModelFormatError as exc:
        return dataclasses.replace(model, model_type="?", runs=str(exc))
    model_type = ARCHITECTURES.get(summary.architecture, f"{summary.architecture} (not supported)")
    return dataclasses.replace(model, model_type=model_type, kinds=summary.kinds_text(), runs=summary.runs_text(),
                               widened=summary.widened_kinds, ram_bytes=summary.ram_bytes, context=summary.context)
