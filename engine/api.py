"""The engine's one facade: how the app, `chat`, `bench` and the model picker open models and sessions.

    engine = Engine()                                   # devices="auto": the planner decides
    session = engine.open("bundled", "ngram", DecodeSettings())
    for event in session.stream([ChatMessage("user", "Hi")]): ...

`open` is `resolve` (find, download or convert the files; slow, cancellable, no weights in memory)
followed by `load` (plan where weights and KV go from config.json, load the weights there, build the
session with its cache factory and snapshot store). The app calls the two halves itself so the old
model keeps answering while a new one downloads, and is dropped before the new weights load.

Besides `Engine`, this module re-exports what a front end needs from the layers below (the chat store,
documents, presets, paths, memory telemetry, plan previews), so front ends import nothing else from
the engine but the shared types (engine.events, engine.errors, engine.settings). Heavy modules (torch,
transformers) are imported only when a model is loaded.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from engine.documents import MAX_BYTES as MAX_DOCUMENT_BYTES
from engine.documents import read_document
from engine.decoding.passage_fit import FitResult, fit_prompt  # noqa: F401 - books that do not fit (issue 14)
from engine.errors import Cancelled
from engine.settings import DecodeSettings
from engine.store.chats import ChatStore, ChatSummary, Message, StoredDocument
from engine.store.paths import SNAPSHOT_CACHE_BYTES, app_home, model_cache_dir
from engine.store.presets import BUNDLED_ID, PRESETS

if TYPE_CHECKING:
    from engine.decoding.session import ChatSession
    from engine.model.loading import LoadedModel
    from engine.model.placement import GpuPlacement
    from engine.store.models import ModelFolder

__all__ = ["BUNDLED_ID", "MAX_DOCUMENT_BYTES", "PRESETS", "SNAPSHOT_CACHE_BYTES", "Cancelled", "ChatStore",
           "ChatSummary", "Engine", "Message", "OpenedModel", "StoredDocument", "app_home", "describe_plan",
           "FitResult", "fit_prompt", "list_local_models", "model_cache_dir", "preview_plan", "read_document", "sample_memory", "shape_for"]

Progress = Callable[[str, float | None], None]
DRAFTERS_WITHOUT_MODEL = ("ngram", "none")


@dataclass(frozen=True)
class OpenedModel:
    """What a front end shows about an open session: names, where the weights run, the plan."""

    spec: str
    name: str
    model_id: str
    device: str  # where the weights run: "cpu", "cuda:0", "cuda:0+cuda:1 (tensor parallel)"
    max_context: int
    draft: str
    source: str = ""
    plan_mode: str | None = None  # the planner's choice on a GPU machine; None on the CPU
    kv_layers_offloaded: int = 0


class Engine:
    """Opens sessions. One per front end; holds only configuration, never a model."""

    def __init__(self, devices: str = "auto", *, snapshots: bool = True,
                 snapshot_cap_bytes: int = SNAPSHOT_CACHE_BYTES, first_cache_tokens: int | None = 16384,
                 cuda_graphs: bool = False, file_blocks: bool | None = None, context: int | None = None) -> None:
        """devices: "auto" (the planner places weights and KV on the CUDA cards torch sees, or the
        CPU), or one device ("cpu", "cuda:1") used as it is, without planning.
        snapshots: keep prefilled books as KV snapshots on disk (at most snapshot_cap_bytes).
        first_cache_tokens: on a GPU, a session's full cache starts this big and grows with the chat
        (None: reserve the whole capacity at once).
        cuda_graphs: replay fixed-shape steps from CUDA graphs (opt-in until measured on a GPU).
        file_blocks: on the CPU, a model converted from a quantized GGUF runs the file's own blocks
        (None: whenever it can; False: the float32 conversion; True: must, else a typed error).
        context: a window in tokens; past the model's trained context the target is stretched to it
        (YaRN with the smallest factor that fits: engine/model/stretch.py), and planned for it."""
        self.devices = devices
        self.snapshots = snapshots
        self.snapshot_cap_bytes = snapshot_cap_bytes
        self.first_cache_tokens = first_cache_tokens
        self.cuda_graphs = cuda_graphs
        self.file_blocks = file_blocks
        self.context = context

    # --- the two halves of open ------------------------------------------------------------------
    @staticmethod
    def resolve(spec: str, progress: Progress | None = None,
                cancel: Callable[[], bool] | None = None) -> "ModelFolder":
        """The model's folder for `spec` (bundled, preset, hub repo id, folder, .gguf): downloaded or
        converted if needed. Raises a UserError subclass for a spec that names nothing usable, and a
        Cancelled subclass when `cancel()` said so."""
        from engine.store.models import resolve_model
        from engine.store.weights_check import check_safetensors_folder

        folder = resolve_model(spec, progress=progress, cancel=cancel)
        check_safetensors_folder(folder.path)  # garbage weights are named now, not once loading has begun
        return folder

    def place(self, target: "ModelFolder", draft: "ModelFolder | None", settings: DecodeSettings,
              capacity: int | None = None) -> "GpuPlacement | None":
        """Where weights and KV go, from config.json alone, before any weight is read (None: no
        planning, the CPU or the one device asked for). Raises OutOfMemoryPlanError with the numbers
        when the model cannot fit."""
        if self.devices != "auto":
            return None
        from engine.model.placement import placement_for_folders

        draft_path = None if draft is None else Path(getattr(draft, "path", draft))
        return placement_for_folders(Path(getattr(target, "path", target)), draft_path, capacity, settings,
                                     stretch=self.context)

    def load_weights(self, folder: "ModelFolder", placement: "GpuPlacement | None" = None,
                     draft: bool = False, context=None) -> "LoadedModel":
        """Load a resolved folder where `placement` (a GpuPlacement, or a planner Plan) puts it: the
        target on its cards, the draft on its draft card; on `devices` without one. context: the
        target's window (default: the engine's), a token count or an engine.model.stretch.Stretch."""
        from engine.model.loading import load_folder

        context = self.context if context is None and not draft else context
        if placement is None:
            return load_folder(folder, device=self.devices, file_blocks=self.file_blocks, context=context)
        plan = getattr(placement, "plan", placement)
        if draft:
            return load_folder(folder, device=plan.draft_device or "auto")
        from engine.model.placement import Placement

        return load_folder(folder, placement=Placement.from_plan(plan), context=context)

    def session(self, target: "LoadedModel", settings: DecodeSettings, draft: "LoadedModel | str" = "ngram",
                placement: "GpuPlacement | None" = None, capacity: int | None = None) -> "ChatSession":
        """A chat session over loaded models. With a GpuPlacement the full cache goes where the plan
        for each size says (starting at first_cache_tokens and growing with the chat); with a fixed
        planner Plan, where that plan says, at full size."""
        from engine.decoding.session import ChatSession
        from engine.kv.offload import cache_factory_for_plan

        context = int(target.max_context)
        settings = settings.fit_budget(min(capacity or context, context))
        snapshots = self._snapshot_store() if self.snapshots else None
        growable = hasattr(placement, "cache_factory")
        factory = placement.cache_factory() if growable else None
        if placement is not None and not growable:
            factory = cache_factory_for_plan(placement)
        first = self.first_cache_tokens if growable else None
        session = ChatSession(target, settings, draft=draft, capacity=capacity, snapshots=snapshots,
                              cache_factory=factory, initial_capacity=first, cuda_graphs=self.cuda_graphs)
        session.placement = placement
        return session

    def load(self, target: "ModelFolder", draft: "ModelFolder | str", settings: DecodeSettings,
             capacity: int | None = None, progress: Progress | None = None) -> "ChatSession":
        """Plan, load the weights (and the draft model's) and build the session."""
        draft_folder = None if isinstance(draft, str) else draft
        placement = self.place(target, draft_folder, settings, capacity)
        if progress:
            progress(f"Loading {getattr(target, 'name', target)}", None)
        model = self.load_weights(target, placement)
        drafter: Any = draft
        if draft_folder is not None:
            if progress:
                progress(f"Loading draft model {getattr(draft_folder, 'name', draft_folder)}", None)
            drafter = self.load_weights(draft_folder, placement, draft=True)
        return self.session(model, settings, drafter, placement, capacity)

    def open(self, model_spec: str = BUNDLED_ID, draft_spec: str = "ngram",
             settings: DecodeSettings = DecodeSettings(), *, capacity: int | None = None,
             progress: Progress | None = None, cancel: Callable[[], bool] | None = None) -> "ChatSession":
        """resolve + load: a ready session for `model_spec` with `draft_spec` ('ngram', 'none' or a
        model spec) as L0. capacity: the most tokens the conversation may hold (default: the model's
        context)."""
        target = self.resolve(model_spec, progress, cancel)
        draft: Any = draft_spec if draft_spec in DRAFTERS_WITHOUT_MODEL else self.resolve(draft_spec, progress, cancel)
        return self.load(target, draft, settings, capacity, progress)

    @staticmethod
    def prompt_length(target: "ModelFolder", messages, documents=(), system: str | None = None) -> int:
        """Tokens the chat template makes of this conversation with `target`'s tokenizer (only the
        tokenizer loads: a prompt that cannot fit is refused before any weight is read)."""
        from engine.decoding.prompt import render_tokens
        from engine.model.loading import load_tokenizer

        tokenizer = load_tokenizer(Path(getattr(target, "path", target)))
        return len(render_tokens(tokenizer, list(messages), list(documents), system))

    def _snapshot_store(self):
        from engine.store.snapshots import SnapshotStore

        return SnapshotStore(max_bytes=self.snapshot_cap_bytes)

    # --- what a front end shows --------------------------------------------------------------------
    @staticmethod
    def describe(spec: str, session: "ChatSession") -> OpenedModel:
        """Names and placement of an open session, for a status line or `--stats`."""
        target = session.target
        folder = getattr(target, "folder", None)
        name = str(getattr(folder, "name", None) or spec)
        drafter = session.drafter
        draft_folder = getattr(getattr(drafter, "runner", None), "folder", None)
        draft = drafter.name if draft_folder is None else str(getattr(draft_folder, "name", drafter.name))
        placement = getattr(session, "placement", None)
        plan = getattr(placement, "plan", None)
        return OpenedModel(spec=spec, name=name, model_id=str(getattr(folder, "model_id", None) or name),
                           device=str(target.where), max_context=int(target.max_context), draft=draft,
                           source=str(getattr(folder, "source", "") or ""),
                           plan_mode=getattr(plan, "mode", None),
                           kv_layers_offloaded=int(getattr(plan, "kv_layers_offloaded", 0) or 0))


# --- re-exports for front ends (each a thin door into one layer below) ------------------------------
def list_local_models() -> list:
    """Models already on this machine: GGUF files (with their block kinds and the RAM they need),
    older converted folders, the Hugging Face cache."""
    from engine.model.gguf_summary import describe
    from engine.store.models import list_local_models as local

    return [describe(m) for m in local()]


def sample_memory():
    """VRAM per GPU (all processes and this one) and RAM, for the Memory panel."""
    from engine.offload.telemetry import sample_memory as sample

    return sample()


def shape_for(spec: str):
    """A model's shape (layers, heads, context) from its config.json, without loading weights."""
    from engine.offload.shapes import shape_for as shape

    return shape(spec)


def preview_plan(target_spec: str, draft_spec: str, context: int, settings: DecodeSettings, profile: str,
                 ram_bytes: int | None = None, stretch: bool = False):
    """The offload plan for a model on a device profile ("auto", "cpu", "4090", "4090x2"), from config
    files only, never raising for a misfit (the plan says what does not fit). ram_bytes: the RAM a
    GPU profile assumes (the app passes this machine's; default 128 GiB). stretch: plan a context past
    the model's trained one as the YaRN stretch to it (else the context is cut to the trained one)."""
    from engine.offload.devices import device_spec
    from engine.offload.planner import plan_placement

    target = shape_for(target_spec)
    if stretch:
        from engine.model.stretch import stretched_shape

        target = stretched_shape(target, context)
    draft = shape_for(draft_spec) if draft_spec not in DRAFTERS_WITHOUT_MODEL else None
    context = min(context, target.max_context)
    devices = device_spec(profile, ram_bytes) if ram_bytes else profile
    return plan_placement(target, draft, context, settings.fit_budget(context), devices, raise_on_misfit=False)


def describe_plan(plan) -> str:
    """A plan as the text `main.py plan` prints."""
    from engine.offload.planner import describe

    return describe(plan)


# --- what the command line needs besides the above (each a thin door into one layer below) ----------
__all__ += ["FITS", "PlanDefaults", "bundled_dir", "bundled_gguf_path", "check_device", "check_writable",
            "find_preset", "is_bundled_converted", "load_tokenizer", "plan_defaults", "plan_for", "text_sha256"]

from engine.decoding.passage_fit import FITS  # noqa: E402 - how a document goes into the prompt
from engine.documents import text_sha256  # noqa: E402 - a document's key in the chat store
from engine.store.presets import find_preset  # noqa: E402


@dataclass(frozen=True)
class PlanDefaults:
    """What `plan` assumes unless told: the device profiles it knows, the GPU memory kept free per
    card, the CPU-attention bandwidth of hybrid offload."""

    profiles: tuple[str, ...]
    headroom_bytes: int
    cpu_attn_gbps: float


def plan_defaults() -> PlanDefaults:
    """The planner's defaults (its module loads only when asked: the app does not pay for it)."""
    from engine.offload.devices import DEFAULT_CPU_ATTN_GBPS, DEFAULT_HEADROOM, PROFILES

    return PlanDefaults(tuple(PROFILES), DEFAULT_HEADROOM, DEFAULT_CPU_ATTN_GBPS)


def bundled_gguf_path() -> Path:
    """The bundled model's GGUF file (raises ModelNotFoundError when its package is missing)."""
    from engine.store.models import bundled_gguf_path as gguf

    return gguf()


def bundled_dir() -> Path:
    """Where the bundled model's converted folder lives (or will, once converted)."""
    from engine.store.models import bundled_dir as folder

    return folder()


def is_bundled_converted() -> bool:
    """Has the bundled GGUF been converted into its folder yet?"""
    from engine.store.models import is_bundled_converted as converted

    return converted()


def load_tokenizer(target: "ModelFolder | Path"):
    """A resolved model's tokenizer alone (no weights read): to size a prompt before loading."""
    from engine.model.loading import load_tokenizer as tokenizer

    return tokenizer(Path(getattr(target, "path", target)))


def plan_for(target_spec: str, draft_spec: str | None, context: int, settings: DecodeSettings, profile: str, *,
             ram_bytes: int | None = None, headroom_bytes: int | None = None, tp_offload: bool = True,
             tensor_parallel: bool | None = None, cpu_attn_gbps: float | None = None):
    """The offload plan `main.py plan` prints, from config files only: like preview_plan, with every
    planner knob, and a context past the model's planned stretched as `chat --context` stretches it
    (one past what a stretch allows is refused with a typed error) instead of cut.
    A misfit returns the closest plan with fits=False; bad input raises a UserError."""
    from engine.offload.devices import DEFAULT_HEADROOM, device_spec
    from engine.offload.planner import plan_placement

    from engine.model.stretch import stretched_shape

    target = stretched_shape(shape_for(target_spec), context)  # past its trained context: YaRN, as chat --context
    draft = shape_for(draft_spec) if draft_spec and draft_spec not in DRAFTERS_WITHOUT_MODEL else None
    return plan_placement(target, draft, context, settings, device_spec(profile, ram_bytes=ram_bytes),
                          headroom_bytes=DEFAULT_HEADROOM if headroom_bytes is None else headroom_bytes,
                          tp_offload=tp_offload, tensor_parallel=tensor_parallel,
                          cpu_attn_gbps=cpu_attn_gbps, raise_on_misfit=False)


def check_device(devices: str) -> None:
    """Raise InvalidSettingError now, before anything loads, if `devices` ("auto", "cpu", "cuda",
    "cuda:N") names a device this machine does not have. Imports torch only for a CUDA device."""
    if devices in ("auto", "cpu"):
        return
    from engine.errors import InvalidSettingError

    if not devices.startswith("cuda"):
        raise InvalidSettingError(f"device {devices!r} is unknown: use auto, cpu, cuda or cuda:N")
    import torch

    if not torch.cuda.is_available():
        why = "this torch is built without CUDA" if torch.version.cuda is None else "torch sees no CUDA GPU"
        raise InvalidSettingError(f"device {devices!r} is not available ({why}): use auto or cpu")
    index = int(devices.partition(":")[2] or 0)
    count = torch.cuda.device_count()
    if index >= count:
        raise InvalidSettingError(f"device {devices!r} does not exist: torch sees {count} GPU(s), "
                                  f"cuda:0 to cuda:{count - 1}")


def check_writable(chats: bool = True, snapshots: bool = True) -> None:
    """Raise StoreError now, before anything loads, if the app home (where the chat store lives) or
    the snapshot folder cannot be written: a read-only home fails in a blink, not after a prefill."""
    import tempfile

    from engine.errors import StoreError
    from engine.store.paths import snapshot_dir

    folders = ([app_home()] if chats else []) + ([snapshot_dir()] if snapshots else [])
    for folder in folders:
        try:
            with tempfile.TemporaryFile(dir=folder):
                pass
        except OSError as exc:
            raise StoreError(f"{folder} is not writable ({exc.strerror or exc}): check its permissions, point "
                             "TRIFORCE_HOME to a writable folder, or pass --no-save and --no-snapshot") from None


def stretched_dict(cfg: dict, window: int | None, scale: int | None = None, name: str = "the model") -> dict:
    """A config dict's RoPE stretched to `window` tokens (YaRN, the smallest factor that fits), or a typed
    error naming the longest window allowed (engine/model/stretch.py)."""
    from engine.model.stretch import stretched_dict as stretch

    return stretch(cfg, window, scale, name)


def __getattr__(name: str):
    if name == "Stretch":  # an exact stretch to a window (the bench runs llama.cpp's server at the same factor)
        from engine.model.stretch import Stretch

        return Stretch
    raise AttributeError(name)


__all__ += ["stretched_dict"]  # and Stretch, lazily (__getattr__)


@dataclass(frozen=True)
class ContextOptions:
    """The windows a model may run at: its trained context, and the YaRN stretches offered past it
    (x2, x4: up to engine.model.stretch.OFFERED_FACTOR), smallest first; none, with the reason,
    for a model whose config already scales its RoPE."""

    trained: int
    stretched: tuple[int, ...]
    refusal: str = ""


def context_options(spec: str) -> ContextOptions:
    """A model's ContextOptions from its config alone (a preset, a folder, a .gguf file; no weight is
    read; a cached repo id's RoPE is checked once it loads). Raises a UserError when nothing local
    describes the model."""
    import json

    from engine.errors import UserError
    from engine.model.stretch import OFFERED_FACTOR
    from engine.model.stretch import stretched_dict as stretch

    shape = shape_for(spec)
    trained = int(shape.max_context)
    windows, factor = [], 2
    while factor <= OFFERED_FACTOR:
        windows.append(trained * factor)
        factor *= 2
    path = Path(spec).expanduser()
    cfg: dict = {"max_position_embeddings": trained}
    try:
        if path.is_file() and path.suffix == ".gguf":
            from engine.store.gguf_file import read_header

            header = read_header(path)
            arch = header.metadata.get("general.architecture")
            scaling = str(header.metadata.get(f"{arch}.rope.scaling.type", "none") or "none")
            if "rope_freqs.weight" in header.tensors:
                scaling = "llama3"
            cfg["rope_parameters"] = {"rope_type": "default" if scaling == "none" else scaling}
        else:
            from engine.store.presets import shipped_config

            config = shipped_config(spec)
            if config is None and (path / "config.json").is_file():
                config = json.loads((path / "config.json").read_text(encoding="utf-8"))
            cfg.update({k: v for k, v in (config or {}).items() if k in ("rope_scaling", "rope_parameters")})
        if windows:
            stretch(cfg, windows[0], name=shape.name)  # raises for a model that already scales its RoPE
    except UserError as exc:
        return ContextOptions(trained, (), str(exc))
    except (OSError, ValueError):  # an unreadable config: the load says why; offer no stretch
        return ContextOptions(trained, (), "")
    return ContextOptions(trained, tuple(windows))


__all__ += ["ContextOptions", "context_options"]
