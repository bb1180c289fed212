"""A compact forward for the Llama family (Llama 2/3/3.1/3.2, Mistral, Qwen2, SmolLM2).

The runner owns only weights. Every forward takes a chunk of tokens, their absolute positions and
a cache object (see cache_base.py) that owns K/V and does the attention, so the full, retrieval,
streaming and offloaded caches all run through the same few matmuls.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import torch
import torch.nn.functional as F
from safetensors import safe_open

from engine import native
from engine.kv.base import KVCache
from engine.kv.full import FullCache
from engine.errors import ModelFormatError, UnsupportedModelError
from engine.kv.rope import Rotary
from engine.model.fused_layers import FusedLayers

if TYPE_CHECKING:
    from engine.model.draft_vocab import DraftVocabulary

SUPPORTED_TYPES = ("llama", "mistral", "qwen2")


@dataclass(frozen=True)
class Architecture:
    """The shape of a Llama-family model, read from its transformers config."""

    model_type: str
    vocab_size: int
    hidden: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    intermediate: int
    rms_eps: float
    qkv_bias: bool
    tie_embeddings: bool
    max_context: int

    @classmethod
    def from_config(cls, config) -> "Architecture":
        model_type = getattr(config, "model_type", "?")
        if model_type not in SUPPORTED_TYPES:
            raise UnsupportedModelError(
                f"model type {model_type!r} is not supported: use a Llama-family model ({', '.join(SUPPORTED_TYPES)})")
        if getattr(config, "hidden_act", "silu") != "silu":
            raise UnsupportedModelError(f"activation {config.hidden_act!r} is not supported (Llama family uses silu)")
        n_heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // n_heads
        return cls(
            model_type=model_type,
            vocab_size=config.vocab_size,
            hidden=config.hidden_size,
            n_layers=config.num_hidden_layers,
            n_heads=n_heads,
            n_kv_heads=getattr(config, "num_key_value_heads", None) or n_heads,
            head_dim=head_dim,
            intermediate=config.intermediate_size,
            rms_eps=config.rms_norm_eps,
            qkv_bias=bool(getattr(config, "attention_bias", False)) or model_type == "qwen2",
            tie_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
            max_context=int(getattr(config, "max_position_embeddings", 4096)),
        )


@dataclass
class LayerWeights:
    """One decoder layer's weights, as the forward reads them (fused q|k|v and gate|up)."""
    attn_norm: torch.Tensor  # [hidden]
    wqkv: torch.Tensor  # [(Hq + 2 Hkv) * D, hidden]; this and wo, w_gate_up, w_down may be quant.QuantWeight
    bqkv: torch.Tensor | None  # [(Hq + 2 Hkv) * D]
    wo: torch.Tensor  # [hidden, Hq * D]
    mlp_norm: torch.Tensor  # [hidden]
    w_gate_up: torch.Tensor  # [2 * I, hidden]
    w_down: torch.Tensor  # [hidden, I]
    gate_up_packed: torch.Tensor | None = None  # oneDNN-prepacked w_gate_up (CPU float32)

    def nbytes(self) -> int:
        """Bytes of the weights (the prepacked copy is a cache of w_gate_up, not counted)."""
        return sum(weight_bytes(t) for name, t in vars(self).items() if t is not None and not name.endswith("_packed"))


def weight_bytes(weight) -> int:
    """Bytes of a float tensor, or of a file-blocks weight (engine.model.quant.QuantWeight)."""
    return weight.numel() * weight.element_size() if isinstance(weight, torch.Tensor) else weight.nbytes()


def state_tensor(state: dict[str, torch.Tensor], name: str) -> torch.Tensor:
    """A checkpoint tensor by its name with or without the "model." prefix."""
    for key in (name, "model." + name):
        if key in state:
            return state[key]
    raise ModelFormatError(f"weights lack tensor {name!r}: the checkpoint is incomplete or not Llama-family")


def layer_tensors(state: dict[str, torch.Tensor], index: int, qkv_bias: bool) -> dict[str, torch.Tensor]:
    """One decoder layer's checkpoint tensors, as stored: q/k/v/o, gate/up/down, the two norms
    (and q/k/v biases when the model has them)."""
    p = f"layers.{index}."
    names = {"q": "self_attn.q_proj.weight", "k": "self_attn.k_proj.weight", "v": "self_attn.v_proj.weight",
             "o": "self_attn.o_proj.weight", "gate": "mlp.gate_proj.weight", "up": "mlp.up_proj.weight",
             "down": "mlp.down_proj.weight", "attn_norm": "input_layernorm.weight",
             "mlp_norm": "post_attention_layernorm.weight"}
    if qkv_bias:
        names.update(q_bias="self_attn.q_proj.bias", k_bias="self_attn.k_proj.bias", v_bias="self_attn.v_proj.bias")
    return {key: state_tensor(state, p + name) for key, name in names.items()}


def read_safetensors(folder: Path) -> dict[str, torch.Tensor]:
    """Every tensor of every *.safetensors file in `folder` (sharded checkpoints included), on the CPU."""
    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        raise ModelFormatError(f"{folder} has no .safetensors weights: pass a folder with a safetensors checkpoint")
    state: dict[str, torch.Tensor] = {}
    for path in files:
        with safe_open(str(path), framework="pt", device="cpu") as handle:
            for key in handle.keys():
                state[key] = handle.get_tensor(key)
    return state


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Llama RMSNorm: normalise in float32, scale in the weights' dtype (as transformers does)."""
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


def linear(x: torch.Tensor, weight, packed: torch.Tensor | None = None,
           bias: torch.Tensor | None = None, draft: bool = False) -> torch.Tensor:
    """x [T, in] @ weight[out, in].T (+ bias), through the prepacked oneDNN copy when there is one.
    `weight` is a float tensor or the model file's own blocks (anything with .matmul: quant.py);
    `draft`: a drafting level's forward, which may take the blocks' int16-activation path."""
    if not isinstance(weight, torch.Tensor):
        y = weight.matmul_draft(x) if draft else weight.matmul(x)  # [T, out] float32
        return y if bias is None else y + bias
    if packed is not None and bias is None:
        return torch._C._nn.mkldnn_linear(x.contiguous().to_mkldnn(), packed, None).to_dense()
    return F.linear(x, weight, bias)


class LlamaRunner:
    """Weights + forward. `device`/`dtype` are where the weights live and compute happens."""

    def __init__(self, config, state: dict[str, torch.Tensor], device: torch.device, dtype: torch.dtype,
                 max_positions: int | None = None, layer_devices=None) -> None:
        """layer_devices: optional device per layer (layer split across cards); the embedding
        table lives with layer 0 (== `device`), the final norm and lm_head with the last layer."""
        arch = self._place(config, device, dtype, max_positions, layer_devices)

        def take(name: str, where: torch.device | None = None) -> torch.Tensor:
            return state_tensor(state, name).to(where or self.device, dtype)

        self.embed = take("embed_tokens.weight")  # [V, hidden]
        self.norm = take("norm.weight", self.head_device)
        lm_head = state.get("lm_head.weight")
        if lm_head is None or arch.tie_embeddings:
            self.lm_head = self.embed if self.head_device == self.device else self.embed.to(self.head_device)
        else:
            self.lm_head = lm_head.to(self.head_device, dtype)
        self._lm_head_packed = self._pack_for_cpu(self.lm_head)
        self.layers: list[LayerWeights] = []
        for i in range(arch.n_layers):
            w = layer_tensors(state, i, arch.qkv_bias)
            dev = self.layer_devices[i]
            self.layers.append(LayerWeights(
                attn_norm=w["attn_norm"].to(dev, dtype),
                wqkv=torch.cat([w["q"], w["k"], w["v"]]).to(dev, dtype),
                bqkv=torch.cat([w["q_bias"], w["k_bias"], w["v_bias"]]).to(dev, dtype) if arch.qkv_bias else None,
                wo=w["o"].to(dev, dtype),
                mlp_norm=w["mlp_norm"].to(dev, dtype),
                w_gate_up=torch.cat([w["gate"], w["up"]]).to(dev, dtype),
                w_down=w["down"].to(dev, dtype),
            ))
            self.layers[-1].gate_up_packed = self._pack_for_cpu(self.layers[-1].w_gate_up)

    @classmethod
    def from_parts(cls, config, embed, norm: torch.Tensor, lm_head, layers: list[LayerWeights],
                   max_positions: int | None = None) -> "LlamaRunner":
        """A float32 CPU runner over weights built elsewhere: the layers' projections, the embedding
        and the vocabulary projection may be a model file's own blocks (engine.model.quant), read
        where they are stored instead of converted (engine/model/gguf_weights.py)."""
        self = cls.__new__(cls)
        self._place(config, torch.device("cpu"), torch.float32, max_positions, None)
        self.embed, self.norm, self.lm_head, self.layers = embed, norm, lm_head, layers
        self._lm_head_packed = self._pack_for_cpu(lm_head) if isinstance(lm_head, torch.Tensor) else None
        for layer in layers:
            if isinstance(layer.w_gate_up, torch.Tensor):
                layer.gate_up_packed = self._pack_for_cpu(layer.w_gate_up)
        return self

    def _place(self, config, device, dtype: torch.dtype, max_positions: int | None, layer_devices) -> Architecture:
        """Everything but the weights: the shape, where each layer computes, RoPE tables, K/V dtype."""
        self.config = config
        self.arch = arch = Architecture.from_config(config)
        self.device, self.dtype = torch.device(device), dtype
        self.weights_tag = ""  # names a non-default weight path (quant.py) in snapshot keys
        self.prefill_dtype: torch.dtype | None = None  # prefill chunks' attention dtype (FullCache), if not dtype
        self.layer_devices = [torch.device(d) for d in layer_devices] if layer_devices else [self.device] * arch.n_layers
        if len(self.layer_devices) != arch.n_layers:
            raise ValueError(f"layer_devices has {len(self.layer_devices)} entries for {arch.n_layers} layers")
        self.device = self.layer_devices[0]
        self.head_device = self.layer_devices[-1]
        self.rope = Rotary(config, arch.head_dim, self.device, max_positions or arch.max_context)
        # norms and silu * up in one native call each (float32 on the CPU; torch ops elsewhere)
        self.native_ops = dtype == torch.float32 and all(d.type == "cpu" for d in self.layer_devices) \
            and native.available()
        # K/V in float16 where the native kernel attends: half the bytes a step reads at 8K
        self.kv_dtype = torch.float16 if self.native_ops else dtype
        self._fused: FusedLayers | bool | None = None  # layers in one native call each (False: not taken)
        return arch

    @classmethod
    def from_folder(cls, folder: Path, config, device: torch.device, dtype: torch.dtype,
                    max_positions: int | None = None, layer_devices=None) -> "LlamaRunner":
        """Load every *.safetensors file in `folder` (sharded checkpoints included)."""
        return cls(config, read_safetensors(folder), device, dtype, max_positions, layer_devices)

    def new_full_cache(self, capacity: int, offloaded: Sequence[int] = (), **options) -> FullCache:
        """The target's full cache for this runner's placement: each layer's K/V on the card that
        computes it, or in pinned CPU memory for the `offloaded` layers (OffloadedCache options)."""
        a = self.arch
        if not offloaded and not options and all(d == self.device for d in self.layer_devices):
            return FullCache(a.n_layers, a.n_kv_heads, a.head_dim, capacity, self.dtype, self.device,
                             prefill_dtype=self.prefill_dtype, kv_dtype=self.kv_dtype)
        from engine.kv.offload import OffloadedCache

        return OffloadedCache(a.n_layers, a.n_kv_heads, a.head_dim, capacity, self.dtype, self.device, offloaded,
                              layer_devices=self.layer_devices, **options)

    def describe(self) -> str:
        """Where the weights run, for people: "cuda:0", or "cuda:0+cuda:1 (layer split)"."""
        cards = list(dict.fromkeys(str(d) for d in self.layer_devices))
        return cards[0] if len(cards) == 1 else "+".join(cards) + " (layer split)"

    def nbytes(self) -> int:
        tensors = [self.embed, self.norm] + ([] if self.lm_head is self.embed else [self.lm_head])
        return sum(weight_bytes(t) for t in tensors) + sum(layer.nbytes() for layer in self.layers)

    @staticmethod
    def _pack_for_cpu(weight: torch.Tensor) -> torch.Tensor | None:
        """oneDNN-prepacked copy of the vocabulary projection for float32 on the CPU: the stock
        matmul repacks big matrices on every multi-token call (verification), which costs more than
        the product itself for the vocabulary and gate/up projections. None where oneDNN is
        unavailable."""
        if weight.device.type != "cpu" or weight.dtype != torch.float32 or not torch.backends.mkldnn.is_available():
            return None
        try:
            return weight.to_mkldnn()
        except RuntimeError:
            return None

    def _vocab_projection(self, h: torch.Tensor) -> torch.Tensor:
        """h [T, hidden] -> logits [T, V]."""
        return linear(h, self.lm_head, self._lm_head_packed)

    @property
    def drafts_int16(self) -> bool:
        """Whether forward(draft=True) computes the layers' projections with int16 activations (the
        model file's 4-bit blocks on the native kernels): a cheaper, approximate forward for L1."""
        return any(getattr(w, "drafts_int16", False) for w in (self.layers[0].wqkv, self.layers[0].w_gate_up))

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, cache: KVCache,
                last_only: bool = False, draft: bool = False, vocab: DraftVocabulary | None = None) -> torch.Tensor:
        """tokens, positions [T] (int64) -> logits [T, V] float32 (or [1, V] with last_only).
        draft: a drafting level's forward (L1): the projections may run with int16 activations
        (drafts_int16), so its logits approximate the target's; the target's own forwards never set it.
        vocab: a drafting level's subset of the vocabulary (engine/model/draft_vocab.py): logits only
        for its tokens, -inf for the rest."""
        if self._fused is None:  # built at the first forward: the layers' weights are final by then
            self._fused = FusedLayers.build(self) or False
        if self._fused and self._fused.takes(cache, tokens.shape[0]):  # a layer a native call
            return self._fused.forward(tokens, positions, cache, last_only, draft, vocab)
        arch = self.arch
        n_new = tokens.shape[0]
        q_size, kv_end = arch.n_heads * arch.head_dim, arch.n_heads + arch.n_kv_heads
        x = self.embedding(tokens)  # [T, hidden]
        norm = self._norm
        cache.begin(positions, self.rope)
        for index, layer in enumerate(self.layers):
            if x.device != self.layer_devices[index]:  # layer split: hand the hidden state to the next card
                x = x.to(self.layer_devices[index])
            h = norm(x, layer.attn_norm, arch.rms_eps)
            heads = linear(h, layer.wqkv, bias=layer.bqkv, draft=draft).view(n_new, -1, arch.head_dim).transpose(0, 1)
            # [Hq + 2 Hkv, T, D]: views of q, k, v (the same strides as three separate views)
            attn = cache.attend(index, heads[:arch.n_heads], heads[arch.n_heads:kv_end], heads[kv_end:])  # [Hq, T, D]
            x = x + linear(attn.transpose(0, 1).reshape(n_new, q_size), layer.wo, draft=draft)
            h = norm(x, layer.mlp_norm, arch.rms_eps)
            gate_up = linear(h, layer.w_gate_up, layer.gate_up_packed, draft=draft)  # [T, 2I]: gate | up
            if self.native_ops:
                x = x + linear(native.silu_mul(gate_up), layer.w_down, draft=draft)
            else:
                gate, up = gate_up.chunk(2, dim=-1)  # [T, I] each
                x = x + linear(F.silu(gate) * up, layer.w_down, draft=draft)
        cache.end()
        return self.head(x, last_only, vocab)

    def embedding(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens [T] -> the first layer's input [T, hidden] (a GGUF table: only these rows dequantized)."""
        return self.embed[tokens] if isinstance(self.embed, torch.Tensor) else self.embed.rows(tokens)

    def head(self, x: torch.Tensor, last_only: bool = False, vocab: DraftVocabulary | None = None) -> torch.Tensor:
        """The last layer's output x [T, hidden] -> logits [T, V] float32 (or [1, V] with last_only):
        the final norm and the vocabulary projection (only `vocab`'s rows, the rest -inf, when given)."""
        if last_only:
            x = x[-1:]
        if x.device != self.head_device:
            x = x.to(self.head_device)
        h = self._norm(x, self.norm, self.arch.rms_eps)  # [T, hidden]
        logits = (vocab.logits(h) if vocab is not None else self._vocab_projection(h)).float()  # [T, V]
        return logits if logits.device == self.device else logits.to(self.device)

    @property
    def _norm(self):
        """The RMSNorm this runner uses: one native call (float32 on the CPU), else torch ops."""
        return native.rms_norm if self.native_ops else rms_norm


def read_config_json(folder: Path) -> dict:
    path = Path(folder) / "config.json"
    if not path.is_file():
        raise ModelFormatError(f"{folder} has no config.json: pass a model folder saved by transformers")
    return json.loads(path.read_text(encoding="utf-8"))
