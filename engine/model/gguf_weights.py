"""A runner's weights straight from a GGUF: the file's own blocks where a kernel runs them, float32
only where none does.

On the CPU every projection whose kind the kernels run (quant.SUPPORTED) becomes a QuantWeight
over the mapped file's bytes; the embedding looks up and widens only the rows it needs
(QuantWeight.rows), and a tied vocabulary projection shares the embedding's blocks. A tensor of any
other kind is widened to float32, tensor by tensor. Norms (F32) are small float32 copies.

llama.cpp's converter stores a Llama's Q and K rows interleaved per head (for its own RoPE); the
blocks stay as stored and the kernel writes each row's output to its column in transformers' order
(file_blocks.unpermute_rows, QuantWeight row_order), so the runner's RoPE is the one its float32 models
use. Qwen2 files are stored unpermuted. q|k|v and gate|up run as a StackedWeight of the stored
tensors: a file's projections are read from the mapped file, never copied (a small file's Q4_0 and
Q4_1 blocks are repacked: REPACK_MAX_BYTES).

`state_dict` is the same weights fully widened to float32 (or another dtype) under transformers'
names: the oracle a quantized target is tested against, and what a GPU placement loads.
"""
from __future__ import annotations

import numpy as np
import torch

from engine.model import file_blocks, quant
from engine.store.gguf_file import FLOAT_KINDS, GgufFile

PERMUTED_ARCHITECTURES = ("llama", "mistral")  # llama.cpp interleaves Q/K rows for these
# the runner's role -> GGUF tensor name inside blk.N; and transformers' name inside model.layers.N
LAYER_TENSORS = {"q": "attn_q", "k": "attn_k", "v": "attn_v", "o": "attn_output", "gate": "ffn_gate",
                 "up": "ffn_up", "down": "ffn_down", "attn_norm": "attn_norm", "mlp_norm": "ffn_norm"}
HF_LAYER_NAMES = {"q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj",
                  "o": "self_attn.o_proj", "gate": "mlp.gate_proj", "up": "mlp.up_proj", "down": "mlp.down_proj",
                  "attn_norm": "input_layernorm", "mlp_norm": "post_attention_layernorm"}
PLAIN_KINDS = ("F32", "F16", "BF16")
# Q4_0 / Q4_1 blocks are repacked for the kernel (float32 scales: a faster 1-token matmul, engine/native
# repack_q4) while the copy stays under this; a larger file's are read as stored, so its peak RSS
# stays about the file itself
REPACK_MAX_BYTES = 256 << 20


def runs_natively(kind: str) -> bool:
    """Whether a tensor of this kind runs as stored (a block kernel, or plain floats)."""
    return kind in quant.SUPPORTED or kind in PLAIN_KINDS


def _row_order(gguf: GgufFile, arch, role: str) -> np.ndarray | None:
    """The row permutation that puts a Q or K projection (or bias) back in transformers' order."""
    if gguf.architecture not in PERMUTED_ARCHITECTURES or role not in ("q", "k"):
        return None
    heads = arch.n_heads if role == "q" else arch.n_kv_heads
    return file_blocks.unpermute_rows(heads * arch.head_dim, heads)


def widen(gguf: GgufFile, name: str, rows: np.ndarray | None = None) -> torch.Tensor:
    """One tensor in float32, rows reordered by `rows`: the kernels' own dequantization for the
    kinds they run, gguf's reference dequantization for the others."""
    tensor = gguf.tensors[name]
    if tensor.kind in FLOAT_KINDS:
        out = torch.from_numpy(gguf.values(name).astype(np.float32))
    elif tensor.kind == "BF16":
        bits = torch.from_numpy(gguf.values(name).astype(np.int16))
        out = bits.view(torch.bfloat16).float()
    elif tensor.kind in quant.SUPPORTED:
        out = quant.dequantize_blocks(tensor.kind, gguf.blocks(name), tensor.shape[-1])
    else:
        from gguf import GGMLQuantizationType, quants

        raw = quants.dequantize(gguf.blocks(name), GGMLQuantizationType[tensor.kind])
        out = torch.from_numpy(np.ascontiguousarray(raw, dtype=np.float32)).view(tensor.shape)
    return out[torch.from_numpy(rows)].contiguous() if rows is not None else out


def reads_q4_as_stored(gguf: GgufFile) -> bool:
    """Whether the file's Q4_0 / Q4_1 blocks run as stored: their repacked copy (24 bytes a block)
    would exceed REPACK_MAX_BYTES."""
    copy = sum(t.nbytes * 24 // (18 if t.kind == "Q4_0" else 20)
               for t in gguf.tensors.values() if t.kind in ("Q4_0", "Q4_1"))
    return copy > REPACK_MAX_BYTES


def _file_weight(gguf: GgufFile, name: str, rows: np.ndarray | None, as_stored: bool = False):
    """A projection as the file's blocks when its kind runs natively (a QuantWeight over the mapped
    bytes as stored; reordered rows are the kernel's column order, not a copy), else widened to
    float32."""
    tensor = gguf.tensors[name]
    if tensor.kind not in quant.SUPPORTED:
        return widen(gguf, name, rows)
    return quant.QuantWeight(tensor.kind, gguf.blocks(name), tensor.shape[-1], row_order=rows, as_stored=as_stored)


class WidenedStack:
    """Projections stacked along `out` (q|k|v, gate|up) where some parts are widened to float32: each part runs
    its own kernel (or float32 matmul) and the outputs are concatenated: [T, out0 + out1 + ...]."""

    def __init__(self, parts: list) -> None:
        self.parts = parts
        self.in_features = int(parts[0].shape[1])
        self.out_features = sum(int(p.shape[0]) for p in parts)
        self.kind = "+".join(getattr(p, "kind", "F32") for p in parts)

    @property
    def shape(self) -> tuple[int, int]:
        return self.out_features, self.in_features

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, in] -> [T, out] float32."""
        return torch.cat([p.matmul(x) if isinstance(p, quant.QuantWeight) else x @ p.T for p in self.parts], dim=-1)

    def matmul_draft(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([p.matmul_draft(x) if isinstance(p, quant.QuantWeight) else x @ p.T for p in self.parts],
                         dim=-1)

    def dequantize(self) -> torch.Tensor:
        """[out, in] float32: the parts widened and stacked."""
        return torch.cat([p.dequantize() if isinstance(p, quant.QuantWeight) else p for p in self.parts])

    def nbytes(self) -> int:
        return sum(p.nbytes() if isinstance(p, quant.QuantWeight) else p.numel() * p.element_size()
                   for p in self.parts)


def _projection(gguf: GgufFile, arch, names: list[str], roles: list[str], as_stored: bool = False):
    """The projections `names` stacked along `out` (q|k|v, gate|up) as one weight: one QuantWeight
    over one view of the file where they share a kind the kernels run, are stored back to back and
    need no reordering; one repacked QuantWeight of the parts in the model's row order where they
    are all Q4_0 or all Q4_1 and repacked anyway; else a quant.StackedWeight of the parts as stored
    (views of the file, any kinds and row orders: no bytes copied); one float32 tensor when none
    runs natively, else a WidenedStack."""
    orders = [_row_order(gguf, arch, role) for role in roles]
    kinds = {gguf.tensors[n].kind for n in names}
    if len(kinds) == 1 and kinds <= set(quant.SUPPORTED) and all(o is None for o in orders):
        view = gguf.span(names)
        if view is not None:
            return quant.QuantWeight(kinds.pop(), view, gguf.tensors[names[0]].shape[-1], as_stored=as_stored)
    if len(names) > 1 and len(kinds) == 1 and kinds <= {"Q4_0", "Q4_1"} and not as_stored:
        # repacked anyway (a copy): one matrix in the model's row order, one kernel call
        blocks = [gguf.blocks(n) if o is None else gguf.blocks(n)[o] for n, o in zip(names, orders)]
        return quant.QuantWeight(kinds.pop(), np.concatenate(blocks), gguf.tensors[names[0]].shape[-1])
    parts = [_file_weight(gguf, n, o, as_stored) for n, o in zip(names, orders)]
    quantized = [p for p in parts if isinstance(p, quant.QuantWeight)]
    if len(quantized) == len(parts):
        return parts[0] if len(parts) == 1 else quant.StackedWeight(parts)  # one kernel call, no copy
    if not quantized:
        return parts[0] if len(parts) == 1 else torch.cat(parts)
    return WidenedStack(parts)


def _layer_name(index: int, role: str, suffix: str = "weight") -> str:
    return f"blk.{index}.{LAYER_TENSORS[role]}.{suffix}"


def file_runner(gguf: GgufFile, config, max_positions: int | None = None):
    """A CPU LlamaRunner over the GGUF as stored (see the module docstring)."""
    from engine.model.runner import Architecture, LayerWeights, LlamaRunner

    arch = Architecture.from_config(config)
    as_stored = reads_q4_as_stored(gguf)
    layers = []
    for i in range(arch.n_layers):
        def projection(*roles: str):
            return _projection(gguf, arch, [_layer_name(i, r) for r in roles], list(roles), as_stored)

        layers.append(LayerWeights(
            attn_norm=widen(gguf, _layer_name(i, "attn_norm")),
            wqkv=projection("q", "k", "v"),
            bqkv=_qkv_bias(gguf, arch, i),
            wo=projection("o"),
            mlp_norm=widen(gguf, _layer_name(i, "mlp_norm")),
            w_gate_up=projection("gate", "up"),
            w_down=projection("down"),
        ))
        built = layers[-1]  # its file pages leave the resident set as soon as the layer is built
        _release_copied(gguf, [built.wqkv, built.wo, built.w_gate_up, built.w_down],
                        [n for n in gguf.tensors if n.startswith(f"blk.{i}.")])
    embed = _file_weight(gguf, "token_embd.weight", None, as_stored)
    lm_head = embed if "output.weight" not in gguf.tensors else _file_weight(gguf, "output.weight", None, as_stored)
    runner = LlamaRunner.from_parts(config, embed, widen(gguf, "output_norm.weight"), lm_head, layers, max_positions)
    weights = [embed, lm_head] + [w for layer in layers for w in (layer.wqkv, layer.wo, layer.w_gate_up, layer.w_down)]
    blocks = [w for w in weights if isinstance(w, quant.QuantWeight)]
    if blocks:  # a different target from float32's, and one per kernel (snapshot keys)
        runner.weights_tag = quant.blocks_tag(blocks)
        if as_stored and runner.weights_tag.startswith("gguf-native-f32"):  # AVX-512 sums these apart from the repacked tile
            runner.weights_tag += "-q4-stored"
        runner.prefill_dtype = quant.cpu_prefill_attention_dtype()
    _release_copied(gguf, [embed, lm_head], [n for n in gguf.tensors if not n.startswith("blk.")])
    return runner


def _release_copied(gguf: GgufFile, weights: list, names: list[str]) -> None:
    """Drop from this process's resident set the pages of tensors `names` that building `weights`
    read and no kernel reads again (copied: repacked, reordered, widened); the pages a kernel reads
    in place (Q8_0 blocks, the embedding's rows) stay mapped as they are."""
    parts = [p for w in weights for p in (w.parts if isinstance(w, quant.StackedWeight) else [w])]
    natives = [p.native_part() for p in parts if isinstance(p, quant.QuantWeight)]
    read_in_place = [n[0].array for n in natives if n is not None and gguf.holds(n[0].array)]
    for name in names:
        view = gguf.blocks(name)
        if not any(np.may_share_memory(view, a) for a in read_in_place):
            gguf.release(name)


def _qkv_bias(gguf: GgufFile, arch, index: int) -> torch.Tensor | None:
    if not arch.qkv_bias:
        return None
    return torch.cat([widen(gguf, _layer_name(index, role, "bias"), _row_order(gguf, arch, role))
                      for role in ("q", "k", "v")])


def state_dict(gguf: GgufFile, config, dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """Every weight widened (float32, or `dtype` tensor by tensor) under transformers' names."""
    from engine.model.runner import Architecture

    arch = Architecture.from_config(config)
    state = {"model.embed_tokens.weight": widen(gguf, "token_embd.weight").to(dtype),
             "model.norm.weight": widen(gguf, "output_norm.weight").to(dtype)}
    if "output.weight" in gguf.tensors:
        state["lm_head.weight"] = widen(gguf, "output.weight").to(dtype)
    for i in range(arch.n_layers):
        for role, hf in HF_LAYER_NAMES.items():
            state[f"model.layers.{i}.{hf}.weight"] = widen(gguf, _layer_name(i, role),
                                                           _row_order(gguf, arch, role)).to(dtype)
        if arch.qkv_bias:
            for role in ("q", "k", "v"):
                state[f"model.layers.{i}.{HF_LAYER_NAMES[role]}.bias"] = widen(
                    gguf, _layer_name(i, role, "bias"), _row_order(gguf, arch, role)).to(dtype)
    return state


def check_tensors(gguf: GgufFile, config) -> None:
    """ModelFormatError unless the file holds every tensor a Llama-family runner of `config` reads."""
    from engine.errors import ModelFormatError
    from engine.model.runner import Architecture

    arch = Architecture.from_config(config)
    names = ["token_embd.weight", "output_norm.weight"]
    names += [_layer_name(i, role) for i in range(arch.n_layers) for role in LAYER_TENSORS]
    if arch.qkv_bias:
        names += [_layer_name(i, role, "bias") for i in range(arch.n_layers) for role in ("q", "k", "v")]
    missing = [n for n in names if n not in gguf.tensors]
    if missing:
        raise ModelFormatError(f"{gguf.path.name} lacks {len(missing)} tensors a Llama-family model needs "
                               f"({', '.join(missing[:3])}...): it is incomplete or not a Llama-family GGUF")
