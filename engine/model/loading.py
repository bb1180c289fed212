"""Load a model spec into a runner + tokenizer ready for the session."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from engine.errors import ModelFormatError, UnsupportedModelError
from engine.kv.rope_scaling import NATIVE_TYPES
from engine.model.runner import LlamaRunner, read_safetensors

LIGHT_ROPE = ("default", *NATIVE_TYPES)  # RoPE variants a GGUF's config needs no transformers for

Progress = Callable[[str, float | None], None]


@dataclass
class LoadedModel:
    """A target or draft model: weights in a runner, its tokenizer, and where it came from."""

    folder: object  # engine.store.models.ModelFolder
    config: object
    tokenizer: object
    runner: LlamaRunner  # or a TensorParallelRunner: the same interface
    eos_ids: tuple[int, ...]

    @property
    def device(self) -> torch.device:
        return self.runner.device

    @property
    def where(self) -> str:
        """Where the weights run: "cpu", "cuda:0", "cuda:0+cuda:1 (tensor parallel)"..."""
        return self.runner.describe()

    @property
    def max_context(self) -> int:
        return self.runner.arch.max_context

    @property
    def model_id(self) -> str:
        return getattr(self.folder, "model_id", str(self.folder))


def pick_device(device: str = "auto") -> tuple[torch.device, torch.dtype]:
    """float32 on the CPU (bf16 is slower there), bfloat16 on CUDA."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(device)
    return dev, (torch.bfloat16 if dev.type == "cuda" else torch.float32)


def _eos_ids(folder: Path, config, tokenizer) -> tuple[int, ...]:
    ids: set[int] = set()
    gen = folder / "generation_config.json"
    if gen.is_file():
        value = json.loads(gen.read_text(encoding="utf-8")).get("eos_token_id")
        ids.update(value if isinstance(value, list) else [value] if value is not None else [])
    value = getattr(config, "eos_token_id", None)
    ids.update(value if isinstance(value, list) else [value] if value is not None else [])
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return tuple(sorted(i for i in ids if i is not None))


def load_config(path: Path):
    """The folder's transformers config; a config.json with wrong types or bad JSON is a ModelFormatError.
    A GGUF's metadata folder whose RoPE engine/kv/rope_scaling.py computes gives its config.json as
    attributes (no transformers import)."""
    if _light_folder(path):
        from engine.model.folder_tokenizer import FolderConfig

        config = FolderConfig.from_folder(path)
        if dict(getattr(config, "rope_parameters", None) or {}).get("rope_type", "default") in LIGHT_ROPE:
            return config
    from huggingface_hub.errors import StrictDataclassError
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(path, local_files_only=True)
    except (ValueError, TypeError, KeyError, StrictDataclassError) as exc:
        detail = " ".join(str(exc).split())[:300]
        raise ModelFormatError(f"{path / 'config.json'} is not a valid model config ({detail}): fix the file, "
                               "or convert or download the model again") from exc


def _light_folder(path: Path) -> bool:
    """Whether `path` is a GGUF's metadata folder (its tokenizer and config read without transformers)."""
    from engine.store.models import is_gguf_folder

    return is_gguf_folder(Path(path))


def load_tokenizer(path: Path):
    """The folder's tokenizer (no weights read)."""
    if _light_folder(path):
        from engine.model.folder_tokenizer import FolderTokenizer

        return FolderTokenizer.shared(path)
    if (path / "config.json").is_file():
        load_config(path)  # AutoTokenizer reads it too: a broken config must not surface as a traceback
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError) as exc:
        raise ModelFormatError(f"{path} has no usable tokenizer ({exc}): the folder needs tokenizer files") from exc


def load_folder(folder_info, device: str = "auto", max_positions: int | None = None,
                placement=None, file_blocks: bool | None = None, context=None) -> LoadedModel:
    """Load a resolved model folder (anything with `.path`, or a plain path).

    placement: an `engine.model.placement.Placement` (from a planner plan): the weights go to its
    card(s), as one card, a layer split or tensor parallel; `device` then only picks the dtype.
    file_blocks: on the CPU, a GGUF (its metadata folder, engine/store/models.py) runs the file's own
    low-bit blocks, memory-mapped (engine/model/gguf_weights.py): None = whenever it can, True = must
    (else a typed error), False = widened to float32 (the oracle the quantized target is tested
    against). An older float32 conversion folder swaps its source GGUF's blocks in the same way.
    context: a window past the trained context (tokens, or an engine.model.stretch.Stretch): the
    config's RoPE becomes YaRN with the smallest factor that fits (engine/model/stretch.py)."""
    path = Path(getattr(folder_info, "path", folder_info))
    from engine.store.models import gguf_model_file

    gguf = gguf_model_file(path)
    if gguf is not None:
        return _load_gguf(folder_info, path, gguf, device, max_positions, placement, file_blocks, context)
    if not (path / "config.json").is_file():
        raise ModelFormatError(f"{path} has no config.json: pass a model folder saved by transformers")
    config = load_config(path)
    _stretch(config, context)
    tokenizer = load_tokenizer(path)
    if placement is None:
        dev, dtype = pick_device(device)
        runner = LlamaRunner.from_folder(path, config, dev, dtype, max_positions)
    else:
        _, dtype = pick_device(placement.first_device if device == "auto" else device)
        runner = placement.build_runner(config, read_safetensors(path), dtype, max_positions)
    if file_blocks is not False:
        _use_file_blocks(runner, path, required=bool(file_blocks))
    return LoadedModel(folder_info, config, tokenizer, runner, _eos_ids(path, config, tokenizer))


def _load_gguf(folder_info, path: Path, gguf: Path, device: str, max_positions: int | None, placement,
               file_blocks: bool | None, context=None) -> LoadedModel:
    """A GGUF's metadata folder: the weights come from the file. On the CPU they run as stored
    (memory-mapped blocks: engine/model/gguf_weights.py) unless file_blocks is False; elsewhere
    (and for the float32 oracle) they are widened tensor by tensor."""
    from engine.store.gguf_file import read_header
    from engine.model.gguf_weights import check_tensors, file_runner, state_dict

    config = load_config(path)
    _stretch(config, context)
    tokenizer = load_tokenizer(path)
    header = read_header(gguf)
    check_tensors(header, config)
    dev, dtype = pick_device(device if placement is None or device != "auto" else placement.first_device)
    if placement is None and dev.type == "cpu" and file_blocks is not False:
        runner = file_runner(header, config, max_positions)
        if file_blocks and not runner.weights_tag:
            raise UnsupportedModelError(f"{gguf.name} holds no tensor in a kind that runs as stored "
                                        "(Q4_0, Q4_1, Q8_0...): load it in float32")
    elif file_blocks:
        raise UnsupportedModelError(f"{gguf.name} cannot run its GGUF blocks as stored (it does not run on the "
                                    "CPU alone): load it in float32")
    elif placement is None:
        runner = LlamaRunner(config, state_dict(header, config, dtype), dev, dtype, max_positions)
    else:
        runner = placement.build_runner(config, state_dict(header, config, dtype), dtype, max_positions)
    return LoadedModel(folder_info, config, tokenizer, runner, _eos_ids(path, config, tokenizer))


def _stretch(config, context) -> None:
    """Apply a stretched window (YaRN) to `config` in place; None leaves it as trained."""
    if context is not None:
        from engine.model.stretch import stretch_config

        stretch_config(config, context)


def _use_file_blocks(runner, path: Path, required: bool) -> None:
    """Swap in the source GGUF's own blocks when the runner is one CPU runner and the folder was
    converted from a GGUF that is still in place; GPUs and safetensors models keep float32."""
    from engine.model.file_blocks import CACHE_FILE, use_file_blocks
    from engine.store.models import gguf_source

    on_cpu = isinstance(runner, LlamaRunner) and all(d.type == "cpu" for d in runner.layer_devices)
    gguf = gguf_source(path) if on_cpu else None
    swapped = use_file_blocks(runner, gguf, cache=path / CACHE_FILE) if gguf is not None else 0
    if required and not swapped:
        why = "it does not run on the CPU alone" if not on_cpu else \
            "no source GGUF with Q4_0/Q4_1/Q8_0 tensors is in place"
        raise UnsupportedModelError(f"{path.name} cannot run its GGUF blocks as stored ({why}): load it in float32")


def load_model(spec: str, device: str = "auto", progress: Progress | None = None,
               cancel: Callable[[], bool] | None = None, max_positions: int | None = None,
               placement=None) -> LoadedModel:
    """Resolve a spec (bundled, hub repo id, folder, .gguf) and load it."""
    from engine.store.models import resolve_model

    folder = resolve_model(spec, progress=progress, cancel=cancel)
    if progress:
        progress("loading weights", None)
    model = load_folder(folder, device, max_positions, placement)
    if progress:
        progress("ready", 1.0)
    return model
