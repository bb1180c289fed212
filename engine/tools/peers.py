"""The bench's peers: transformers' generate and llama.cpp, each timed the way our methods are
(ms per token after the first token, prefill excluded) and each prefilled once per prompt."""
from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

from engine.model.loading import LoadedModel

LLAMA_PYTHON_ENV = "TRIFORCE_LLAMA_CPP_PYTHON"
LLAMA_PYTHON_DEFAULT = Path.home() / ".cache" / "llama-cpp-peer" / "venv" / "bin" / "python"  # the build script's


class HFPeer:
    """transformers' generate on the same weights, greedy, its prompt prefix cached once."""

    def __init__(self, model: LoadedModel) -> None:
        from transformers import AutoModelForCausalLM

        path = getattr(model.folder, "path", model.folder)
        # the loaded model's config: a stretched context (YaRN) runs stretched here too
        self.hf = AutoModelForCausalLM.from_pretrained(path, config=copy.deepcopy(model.config),
                                                       dtype=model.runner.dtype).to(model.device).eval()
        self._prefix: tuple[list[int], object] | None = None

    def _cached(self, prompt: list[int]):
        """A fresh copy of the K/V of prompt[:-1] (computed once per prompt)."""
        if self._prefix is None or self._prefix[0] != prompt:
            with torch.no_grad():
                out = self.hf(torch.tensor([prompt[:-1]], device=self.hf.device), use_cache=True)
            self._prefix = (list(prompt), out.cache)
        return copy.deepcopy(self._prefix[1])

    def _generate(self, prompt: list[int], new_tokens: int, lookup: bool) -> tuple[list[int], float]:
        ids = torch.tensor([prompt], device=self.hf.device)
        extra = {"prompt_lookup_num_tokens": 10} if lookup else {}
        cache = self._cached(prompt)
        started = time.perf_counter()
        with torch.no_grad():
            out = self.hf.generate(ids, cache=cache, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                                   do_sample=False, eos_token_id=None, pad_token_id=0, **extra)
        return out[0, len(prompt):].tolist(), time.perf_counter() - started

    def run(self, prompt: list[int], new_tokens: int, lookup: bool = False) -> tuple[list[int], float]:
        """Tokens and ms/token, as (t(N tokens) - t(1 token)) / (N - 1): the last prompt token and the
        first new token cancel out, exactly what our methods' ms/token leaves out too."""
        _, one = self._generate(prompt, 1, lookup)
        generated, full = self._generate(prompt, new_tokens, lookup)
        return generated, (full - one) * 1000.0 / max(1, len(generated) - 1)


def llama_cpp_python() -> Path | None:
    """The python of llama-cpp-python's own venv ($TRIFORCE_LLAMA_CPP_PYTHON, else the build
    script's default), or None when it is not there."""
    path = Path(os.environ.get(LLAMA_PYTHON_ENV) or LLAMA_PYTHON_DEFAULT)
    return path if path.is_file() else None


def gguf_for(spec: str) -> Path | None:
    """The GGUF file a model spec names (the bundled one included), or None for other formats."""
    from engine.store.models import BUNDLED_ALIASES, bundled_gguf_path

    if (spec or "").strip().lower() in BUNDLED_ALIASES:
        return bundled_gguf_path()
    path = Path(spec).expanduser()
    return path if path.suffix.lower() == ".gguf" and path.is_file() else None


class LlamaCppPeer:
    """llama.cpp (llama-cpp-python) in a subprocess of its own venv, kept alive for one prompt
    size so its prefill is done once; same GGUF, same token ids, same thread count, greedy."""

    def __init__(self, python: Path, gguf: Path, n_ctx: int, threads: int) -> None:
        script = Path(__file__).with_name("llama_peer.py")
        # passive OpenMP waits: on a shared CPU, llama.cpp's spinning threads ran 15x slower (measured)
        env = {**os.environ, "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE")}
        self.proc = subprocess.Popen([str(python), str(script), str(gguf), str(n_ctx), str(threads)], env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=sys.stderr, text=True)
        hello = self._read()
        self.version = hello.get("version", "?")

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the llama.cpp peer exited (code {self.proc.poll()})")
        return json.loads(line)

    def run(self, prompt: list[int], new_tokens: int) -> tuple[list[int], float]:
        self.proc.stdin.write(json.dumps({"prompt": prompt, "new_tokens": new_tokens}) + "\n")
        self.proc.stdin.flush()
        reply = self._read()
        return reply["tokens"], reply["ms_per_token"]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
