"""Shared fixtures: an isolated app home per test, the bundled model (converted once, kept
between runs in <repo>/.test-cache), tiny random models, and the sample text."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
TEST_CACHE = REPO / ".test-cache"  # gitignored; survives runs so the ~40 s conversion happens once
BUNDLED_HOME = TEST_CACHE / "home"
SAMPLE_DIR = REPO / "resources" / "sample"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json")

# Tests never reach the network: fail fast instead of waiting on timeouts.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")


def _converted_bundled() -> Path:
    from engine.store.models import BUNDLED_NAME

    return BUNDLED_HOME / "models" / BUNDLED_NAME


@pytest.fixture(autouse=True)
def triforce_home(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own empty app home and HF cache. If the bundled model was already
    converted (in .test-cache), it is linked into the test's model cache so nothing reconverts it.
    A test that resolves "bundled" itself (e.g. through a CLI subprocess) should request
    `bundled_model_dir` or carry `@pytest.mark.bundled`, which converts it first if needed.
    Tests must not modify that linked folder."""
    if request.node.get_closest_marker("bundled"):
        request.getfixturevalue("bundled_model")
    home = tmp_path / "triforce-home"
    monkeypatch.setenv("TRIFORCE_HOME", str(home))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    bundled = _converted_bundled()
    if bundled.is_dir():
        (home / "models").mkdir(parents=True, exist_ok=True)
        (home / "models" / bundled.name).symlink_to(bundled, target_is_directory=True)
    return home


@pytest.fixture(scope="session")
def bundled_model():
    """The bundled SmolLM2-135M-Instruct as a `ModelFolder`, converted once into .test-cache."""
    from filelock import FileLock

    from engine.store.models import resolve_model

    saved = os.environ.get("TRIFORCE_HOME")
    os.environ["TRIFORCE_HOME"] = str(BUNDLED_HOME)
    BUNDLED_HOME.mkdir(parents=True, exist_ok=True)
    try:
        # parallel workers (pytest-xdist) convert it once between them: the others wait here
        with FileLock(str(TEST_CACHE / "bundled-conversion.lock")):
            return resolve_model("bundled")
    finally:
        if saved is None:
            os.environ.pop("TRIFORCE_HOME", None)
        else:
            os.environ["TRIFORCE_HOME"] = saved


@pytest.fixture(scope="session")
def bundled_model_dir(bundled_model) -> Path:
    """The bundled model's folder: config.json and tokenizer files read from its GGUF (weights stay there)."""
    return bundled_model.path


@pytest.fixture(scope="session")
def bundled_float32_dir(bundled_model_dir: Path) -> Path:
    """The bundled GGUF converted to float32 safetensors by transformers' own GGUF loader, kept in
    .test-cache: an oracle made independently of our reader (the app never writes such a copy)."""
    from filelock import FileLock

    from engine.store.models import bundled_gguf_path

    dest = TEST_CACHE / "bundled-float32"
    with FileLock(str(TEST_CACHE / "bundled-float32.lock")):
        if not (dest / "model.safetensors").is_file():
            import torch
            from transformers import AutoModelForCausalLM

            gguf = bundled_gguf_path()
            model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
            model.hf_quantizer = None  # already widened: save plain safetensors
            if hasattr(model.config, "quantization_config"):
                del model.config.quantization_config
            tmp = TEST_CACHE / f".tmp-bundled-float32-{os.getpid()}"
            shutil.rmtree(tmp, ignore_errors=True)
            model.save_pretrained(tmp)
            for name in TOKENIZER_FILES:
                if (bundled_model_dir / name).is_file():
                    shutil.copy2(bundled_model_dir / name, tmp / name)
            shutil.rmtree(dest, ignore_errors=True)
            tmp.rename(dest)
    return dest


@pytest.fixture(scope="session")
def bundled_tokenizer(bundled_model_dir: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(bundled_model_dir)


ARCH_CONFIGS = {
    "llama": ("LlamaConfig", {"head_dim": 16, "attention_bias": False}),
    "mistral": ("MistralConfig", {"head_dim": 16, "sliding_window": None}),
    "qwen2": ("Qwen2Config", {}),  # q/k/v projections carry a bias in Qwen2
}


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory, bundled_model_dir: Path) -> Callable[..., Path]:
    """Factory: `tiny_model_dir(arch="llama", **config_overrides) -> Path` of a tiny random model
    (2 layers, hidden 64, 4 heads, 2 KV heads, head_dim 16) with the bundled tokenizer.
    Overrides go to the transformers config, e.g. rope_parameters={...} for RoPE scalings.
    One folder per parameter set per session."""
    root = tmp_path_factory.mktemp("tiny-models")
    tok_config = json.loads((bundled_model_dir / "config.json").read_text(encoding="utf-8"))

    def make(arch: str = "llama", **overrides) -> Path:
        if arch not in ARCH_CONFIGS:
            raise ValueError(f"tiny_model_dir: arch must be one of {sorted(ARCH_CONFIGS)}, not {arch!r}")
        key = hashlib.sha256(json.dumps([arch, overrides], sort_keys=True, default=str).encode()).hexdigest()[:12]
        dest = root / f"{arch}-{key}"
        if (dest / "config.json").is_file():
            return dest
        import torch
        import transformers
        from transformers import AutoModelForCausalLM

        class_name, arch_defaults = ARCH_CONFIGS[arch]
        kwargs = dict(
            vocab_size=tok_config["vocab_size"],  # 49152: the bundled tokenizer's
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=128,
            max_position_embeddings=8192,
            rms_norm_eps=1e-5,
            tie_word_embeddings=False,
            bos_token_id=tok_config.get("bos_token_id"),
            eos_token_id=tok_config.get("eos_token_id"),
            pad_token_id=tok_config.get("pad_token_id"),
        )
        kwargs.update(arch_defaults)
        kwargs.update(overrides)
        config = getattr(transformers, class_name)(**kwargs)
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        tmp = root / f".tmp-{arch}-{key}"
        model.save_pretrained(tmp)
        for name in TOKENIZER_FILES:
            if (bundled_model_dir / name).is_file():
                shutil.copy2(bundled_model_dir / name, tmp / name)
        tmp.rename(dest)
        return dest

    return make


@pytest.fixture(scope="session")
def sample_text() -> str:
    """Hamlet as Markdown (public domain), about 190 KB / 50K tokens."""
    return (SAMPLE_DIR / "hamlet.md").read_text(encoding="utf-8")


@pytest.fixture(scope="session")
def sample_passage(bundled_tokenizer) -> Callable[[int], str]:
    """Factory: `sample_passage(n_tokens) -> str`, the start of Hamlet cut to at most n_tokens
    bundled-tokenizer tokens (1000 and 8000 are what tests and benchmarks use)."""
    from engine.tools.sample_text import sample_passage as cut

    return lambda n_tokens, play="hamlet": cut(n_tokens, bundled_tokenizer, play=play)


def xdist_workers() -> int:
    """How many pytest-xdist workers run the suite (1: none)."""
    return max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1))


def bundled_threads(alone: bool = False) -> int:
    """Threads a `bundled` test gets: every core, shared out between parallel workers so that they
    do not oversubscribe the cores (all of them for a test marked `alone`)."""
    return max(1, (os.cpu_count() or 1) // (1 if alone else xdist_workers()))


@pytest.fixture(autouse=True)
def alone_or_beside_others(request: pytest.FixtureRequest):
    """With parallel workers, a test marked `alone` runs while no other test does (it times the GUI
    thread, which a busy neighbour on a 2-core machine delays past its 100 ms bound): every test
    holds a shared lock, an `alone` one an exclusive lock. A gate lock, held by whoever waits for the
    exclusive one, keeps the other workers' next tests from starving it. POSIX only (fcntl)."""
    if xdist_workers() < 2 or os.name != "posix":
        yield
        return
    import fcntl

    TEST_CACHE.mkdir(parents=True, exist_ok=True)
    alone = request.node.get_closest_marker("alone") is not None
    with open(TEST_CACHE / "alone.gate", "a+b") as gate, open(TEST_CACHE / "alone.lock", "a+b") as lock:
        fcntl.flock(gate, fcntl.LOCK_EX)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        finally:
            if not alone:
                fcntl.flock(gate, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
            if alone:
                fcntl.flock(gate, fcntl.LOCK_UN)


@pytest.fixture(autouse=True)
def torch_threads(request: pytest.FixtureRequest):
    """Tiny models run far faster on one thread (thread hand-offs cost more than their matmuls);
    tests marked `bundled` use their share of the cores (bundled_threads) like the app does."""
    import torch

    before = torch.get_num_threads()
    alone = request.node.get_closest_marker("alone") is not None
    torch.set_num_threads(bundled_threads(alone) if request.node.get_closest_marker("bundled") else 1)
    yield
    torch.set_num_threads(before)
