"""llama.cpp's own llama-server as a benchmark peer (never a dependency of the app).

The server runs the same GGUF with the same thread count and, for a stretched context, the same
YaRN (`--rope-scaling yarn --rope-scale F --yarn-orig-ctx N`); prompts go to its /completion
endpoint on 127.0.0.1 as token ids, greedy (top-k 1), with `cache_prompt` so a cell's prompt is
prefilled once and every later answer recomputes only its last token, as our sessions do. The
server's own timings give the prefill (prompt tokens/s of the request that computed the prompt)
and the decode (ms per generated token); its peak RSS comes from /proc. `spec_type` runs one of
its speculative decoders (`--spec-type ngram-simple`, ...), whose output it does not promise
to be its plain decoding's.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

SERVER_ENV = "TRIFORCE_LLAMA_SERVER"
SERVER_DEFAULT = Path.home() / ".cache" / "llama-cpp-peer" / "build" / "bin" / "llama-server"
SPEC_TYPES = ("ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache")


def llama_server_binary() -> Path | None:
    """The llama-server binary ($TRIFORCE_LLAMA_SERVER, else the peer build's), or None."""
    path = Path(os.environ.get(SERVER_ENV) or SERVER_DEFAULT)
    return path if path.is_file() and os.access(path, os.X_OK) else None


@dataclass(frozen=True)
class ServerReply:
    """One /completion answer: the tokens and the server's own timings."""

    tokens: list[int]
    prompt_tokens: int  # tokens the server computed for the prompt (1 when the rest was cached)
    prompt_ms: float
    predicted_tokens: int
    predicted_ms: float
    draft_tokens: int = 0
    draft_accepted: int = 0

    @property
    def ms_per_token(self) -> float:
        """Decode time per generated token, as the server times it (prompt processing excluded)."""
        return self.predicted_ms / max(1, self.predicted_tokens)

    @property
    def prompt_tokens_per_s(self) -> float:
        return self.prompt_tokens * 1000.0 / self.prompt_ms if self.prompt_ms > 0 else float("nan")


def parse_completion(body: dict) -> ServerReply:
    """A /completion JSON reply -> ServerReply (raises ValueError when it lacks tokens or timings)."""
    timings = body.get("timings")
    tokens = body.get("tokens")
    if not isinstance(timings, dict) or not isinstance(tokens, list):
        raise ValueError(f"llama-server reply without tokens or timings: {sorted(body)}")
    return ServerReply(tokens=[int(t) for t in tokens], prompt_tokens=int(timings.get("prompt_n", 0)),
                       prompt_ms=float(timings.get("prompt_ms", 0.0)),
                       predicted_tokens=int(timings.get("predicted_n", len(tokens))),
                       predicted_ms=float(timings.get("predicted_ms", 0.0)),
                       draft_tokens=int(timings.get("draft_n", 0)),
                       draft_accepted=int(timings.get("draft_n_accepted", 0)))


def completion_request(prompt: list[int], new_tokens: int) -> dict:
    """The /completion body: token ids, greedy, exactly `new_tokens` tokens, the prompt cached."""
    return {"prompt": list(prompt), "n_predict": new_tokens, "ignore_eos": True, "cache_prompt": True,
            "return_tokens": True, "temperature": 0.0, "top_k": 1, "top_p": 1.0, "min_p": 0.0,
            "repeat_penalty": 1.0, "samplers": ["top_k"], "stream": False}


def server_command(binary: Path, gguf: Path, n_ctx: int, threads: int, port: int,
                   rope: tuple[float, int] | None = None, spec_type: str | None = None) -> list[str]:
    """The llama-server command line: one slot, `threads` threads for decode and batch, and YaRN
    (factor, trained context) when the context is stretched."""
    cmd = [str(binary), "-m", str(gguf), "-c", str(n_ctx), "-t", str(threads), "-tb", str(threads),
           "--host", "127.0.0.1", "--port", str(port), "-np", "1", "--no-webui"]
    if rope is not None:
        factor, trained = rope
        # the exact factor: the server holds at most trained x factor tokens
        cmd += ["--rope-scaling", "yarn", "--rope-scale", repr(float(factor)), "--yarn-orig-ctx", str(trained)]
    if spec_type:
        cmd += ["--spec-type", spec_type]
    return cmd


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def peak_rss_bytes(pid: int) -> int | None:
    """A live process's peak resident set (VmHWM), or None where /proc cannot tell."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


class LlamaServerPeer:
    """A llama-server process for one context size, stretch and decoder; `run` answers a prompt."""

    def __init__(self, binary: Path, gguf: Path, n_ctx: int, threads: int, rope: tuple[float, int] | None = None,
                 spec_type: str | None = None, start_timeout_s: float = 300.0, port: int | None = None) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.spec_type = spec_type
        env = {**os.environ, "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE")}
        self.command = server_command(binary, gguf, n_ctx, threads, self.port, rope, spec_type)
        self.log = tempfile.TemporaryFile()  # its log, read back only when it fails to start
        self.proc = subprocess.Popen(self.command, env=env, stdin=subprocess.DEVNULL, stdout=self.log,
                                     stderr=subprocess.STDOUT)
        self.version = "?"
        self.last_prefill: ServerReply | None = None
        self._wait_ready(start_timeout_s)

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.log.seek(0)
                err = self.log.read().decode(errors="replace")[-600:]
                raise RuntimeError(f"llama-server exited (code {self.proc.returncode}): {err}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=5) as reply:
                    if reply.status == 200:
                        self.version = self._version()
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.5)
        self.close()
        raise RuntimeError(f"llama-server did not answer on {self.url} within {timeout_s:.0f} s")

    def _version(self) -> str:
        try:
            with urllib.request.urlopen(self.url + "/props", timeout=5) as reply:
                return str(json.loads(reply.read()).get("build_info", "?"))
        except (urllib.error.URLError, OSError, ValueError):
            return "?"

    def complete(self, prompt: list[int], new_tokens: int) -> ServerReply:
        """One greedy answer of `new_tokens` tokens to the token ids `prompt`."""
        data = json.dumps(completion_request(prompt, new_tokens)).encode()
        request = urllib.request.Request(self.url + "/completion", data=data,
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=7200) as reply:
                got = parse_completion(json.loads(reply.read()))
        except urllib.error.HTTPError as exc:  # the server's own reason (e.g. a context it does not hold)
            raise RuntimeError(f"llama-server answered {exc.code}: {exc.read()[:300].decode(errors='replace')}") from None
        if got.prompt_tokens > 1:  # this request computed the prompt: its prefill rate
            self.last_prefill = got
        return got

    def run(self, prompt: list[int], new_tokens: int) -> tuple[list[int], float]:
        """Tokens and ms/token, the bench's peer interface."""
        got = self.complete(prompt, new_tokens)
        return got.tokens, got.ms_per_token

    def peak_rss_bytes(self) -> int | None:
        return peak_rss_bytes(self.proc.pid)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
