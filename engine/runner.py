"""A compact forward for the Llama family (Llama 2/3/3.1/3.2, Mistral, Qwen2, SmolLM2).

The runner owns only weights. Every forward takes a chunk of tokens, their absolute positions and
a cache object (see cache_base.py) that owns K/V and does the attention, so the full, retrieval,
streaming and offloaded caches all run through the same few matmuls.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import safe_open

from engine.cache_base import KVCache
from engine.errors import ModelFormatError, UnsupportedModelError
from engine.rope import Rotary

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
class _Layer:
    attn_norm: torch.Tensor  # [hidden]
    wqkv: torch.Tensor  # [(Hq + 2 Hkv) * D, hidden]
    bqkv: torch.Tensor | None  # [(Hq + 2 Hkv) * D]
    wo: torch.Tensor  # [hidden, Hq * D]
    mlp_norm: torch.Tensor  # [hidden]
    w_gate_up: torch.Tensor  # [2 * I, hidden]
    w_down: torch.Tensor  # [hidden, I]
    gate_up_packed: torch.Tensor | None = None  # oneDNN-prepacked w_gate_up (CPU float32)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Llama RMSNorm: normalise in float32, scale in the weights' dtype (as transformers does)."""
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


def linear(x: torch.Tensor, weight: torch.Tensor, packed: torch.Tensor | None) -> torch.Tensor:
    """x [T, in] @ weight[out, in].T, through the prepacked oneDNN copy when there is one."""
    if packed is not None:
        return torch._C._nn.mkldnn_linear(x.contiguous().to_mkldnn(), packed, None).to_dense()
    return F.linear(x, weight)


class LlamaRunner:
    """Weights + forward. `device`/`dtype` are where the weights live and compute happens."""

    def __init__(self, config, state: dict[str, torch.Tensor], device: torch.device, dtype: torch.dtype,
                 max_positions: int | None = None, layer_devices=None) -> None:
        """layer_devices: optional device per layer (layer split across cards); the embedding
        table lives with layer 0 (== `device`), the final norm and lm_head with the last layer."""
        self.config = config
        self.arch = arch = Architecture.from_config(config)
        self.device, self.dtype = torch.device(device), dtype
        self.layer_devices = [torch.device(d) for d in layer_devices] if layer_devices else [self.device] * arch.n_layers
        if len(self.layer_devices) != arch.n_layers:
            raise ValueError(f"layer_devices has {len(self.layer_devices)} entries for {arch.n_layers} layers")
        self.device = self.layer_devices[0]
        self.head_device = self.layer_devices[-1]
        self.rope = Rotary(config, arch.head_dim, self.device, max_positions or arch.max_context)

        def take(name: str, where: torch.device | None = None) -> torch.Tensor:
            for key in (name, "model." + name):
                if key in state:
                    return state[key].to(where or self.device, dtype)
            raise ModelFormatError(f"weights lack tensor {name!r}: the checkpoint is incomplete or not Llama-family")

        self.embed = take("embed_tokens.weight")  # [V, hidden]
        self.norm = take("norm.weight", self.head_device)
        lm_head = state.get("lm_head.weight")
        if lm_head is None or arch.tie_embeddings:
            self.lm_head = self.embed if self.head_device == self.device else self.embed.to(self.head_device)
        else:
            self.lm_head = lm_head.to(self.head_device, dtype)
        self._lm_head_packed = self._pack_for_cpu(self.lm_head)
        self.layers: list[_Layer] = []
        for i in range(arch.n_layers):
            p = f"layers.{i}."
            dev = self.layer_devices[i]
            bias = None
            if arch.qkv_bias:
                bias = torch.cat([take(p + f"self_attn.{n}_proj.bias", dev) for n in "qkv"])
            self.layers.append(_Layer(
                attn_norm=take(p + "input_layernorm.weight", dev),
                wqkv=torch.cat([take(p + f"self_attn.{n}_proj.weight", dev) for n in "qkv"]),
                bqkv=bias,
                wo=take(p + "self_attn.o_proj.weight", dev),
                mlp_norm=take(p + "post_attention_layernorm.weight", dev),
                w_gate_up=torch.cat([take(p + "mlp.gate_proj.weight", dev), take(p + "mlp.up_proj.weight", dev)]),
                w_down=take(p + "mlp.down_proj.weight", dev),
            ))
            self.layers[-1].gate_up_packed = self._pack_for_cpu(self.layers[-1].w_gate_up)

    @classmethod
    def from_folder(cls, folder: Path, config, device: torch.device, dtype: torch.dtype,
                    max_positions: int | None = None, layer_devices=None) -> "LlamaRunner":
        """Load every *.safetensors file in `folder` (sharded checkpoints included)."""
        files = sorted(Path(folder).glob("*.safetensors"))
        if not files:
            raise ModelFormatError(f"{folder} has no .safetensors weights: pass a folder with a safetensors checkpoint")
        state: dict[str, torch.Tensor] = {}
        for path in files:
            with safe_open(str(path), framework="pt", device="cpu") as handle:
                for key in handle.keys():
                    state[key] = handle.get_tensor(key)
        return cls(config, state, device, dtype, max_positions, layer_devices)

    def nbytes(self) -> int:
        tensors = [self.embed, self.norm] + ([] if self.lm_head is self.embed else [self.lm_head])
        for layer in self.layers:
            tensors += [t for name, t in vars(layer).items() if t is not None and not name.endswith("_packed")]
        return sum(t.numel() * t.element_size() for t in tensors)

    @staticmethod
    def _pack_for_cpu(weight: torch.Tensor) -> torch.Tensor | None:
        """oneDNN-prepacked copy of the vocabulary projection for float32 on the CPU: the stock
        matmul repacks big matrices on every multi-token call (verification): at 5 tokens the
        vocabulary projection ran 2.3x and the gate/up projection 3x slower than prepacked on a
        2-core x86 CPU. None where oneDNN is unavailable."""
        if weight.device.type != "cpu" or weight.dtype != torch.float32 or not torch.backends.mkldnn.is_available():
            return None
        try:
            return weight.to_mkldnn()
        except RuntimeError:
            return None

    def _vocab_projection(self, h: torch.Tensor) -> torch.Tensor:
        """h [T, hidden] -> logits [T, V]."""
        return linear(h, self.lm_head, self._lm_head_packed)

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, cache: KVCache,
                last_only: bool = False) -> torch.Tensor:
        """tokens, positions [T] (int64) -> logits [T, V] float32 (or [1, V] with last_only)."""
        arch = self.arch
        n_new = tokens.shape[0]
        q_size, kv_size = arch.n_heads * arch.head_dim, arch.n_kv_heads * arch.head_dim
        x = self.embed[tokens]  # [T, hidden]
        cache.begin(positions, self.rope)
        for index, layer in enumerate(self.layers):
            if x.device != self.layer_devices[index]:  # layer split: hand the hidden state to the next card
                x = x.to(self.layer_devices[index])
            h = rms_norm(x, layer.attn_norm, arch.rms_eps)
            qkv = F.linear(h, layer.wqkv, layer.bqkv)  # [T, (Hq + 2 Hkv) * D]
            q = qkv[:, :q_size].view(n_new, arch.n_heads, arch.head_dim).transpose(0, 1)  # [Hq, T, D]
            k = qkv[:, q_size:q_size + kv_size].view(n_new, arch.n_kv_heads, arch.head_dim).transpose(0, 1)
            v = qkv[:, q_size + kv_size:].view(n_new, arch.n_kv_heads, arch.head_dim).transpose(0, 1)
            attn = cache.attend(index, q, k, v)  # [Hq, T, D]
            x = x + F.linear(attn.transpose(0, 1).reshape(n_new, q_size), layer.wo)
            h = rms_norm(x, layer.mlp_norm, arch.rms_eps)
            gate, up = linear(h, layer.w_gate_up, layer.gate_up_packed).chunk(2, dim=-1)  # [T, I] each
            x = x + F.linear(F.silu(gate) * up, layer.w_down)
        cache.end()
        if last_only:
            x = x[-1:]
        if x.device != self.head_device:
            x = x.to(self.head_device)
        logits = self._vocab_projection(rms_norm(x, self.norm, arch.rms_eps)).float()  # [T, V]
        return logits if logits.device == self.device else logits.to(self.device)


def read_config_json(folder: Path) -> dict:
    path = Path(folder) / "config.json"
    if not path.is_file():
        raise ModelFormatError(f"{folder} has no config.json: pass a model folder saved by transformers")
    return json.loads(path.read_text(encoding="utf-8"))
