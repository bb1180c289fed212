"""llama.cpp as a benchmark peer: run by the python of llama-cpp-python's own venv (never a
dependency of the app; this file imports nothing from the engine, and no torch).

    python llama_peer.py MODEL.gguf N_CTX THREADS

reads one JSON request a line on stdin, {"prompt": [token ids], "new_tokens": N}, and answers one
JSON line: {"tokens": [...], "ms_per_token": x, "first_token_s": y}. Greedy; ms/token leaves out
the prefill and the first token, as the engine's bench does. TRIFORCE_LLAMA_EXTRA_BUFFERS=1 keeps
llama.cpp's repacked/AMX weight buffers (off by default: AMX faults in VMs that hide it). The prompt's prefix stays in
llama.cpp's KV between requests (only the last prompt token is recomputed), like our session.
"""
from __future__ import annotations

import json
import os
import sys
import time


def _without_extra_buffers() -> None:
    """Load models without llama.cpp's extra buffer types (weight repacking, AMX tiles): a CPU that
    reports AMX inside a VM that does not enable it faults on the first tile instruction."""
    import llama_cpp.llama_cpp as api

    defaults = api.llama_model_default_params

    def params():
        p = defaults()
        p.use_extra_bufts = False
        return p

    api.llama_model_default_params = params


def main() -> int:
    if os.environ.get("TRIFORCE_LLAMA_EXTRA_BUFFERS", "0") != "1":
        _without_extra_buffers()
    from llama_cpp import Llama

    path, n_ctx, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    llm = Llama(model_path=path, n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads, n_batch=256,
                verbose=False)
    print(json.dumps({"ready": True, "version": __import__("llama_cpp").__version__}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        prompt, n = request["prompt"], int(request["new_tokens"])
        tokens: list[int] = []
        started = time.perf_counter()
        first_at = None
        for token in llm.generate(prompt, temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0):
            tokens.append(int(token))
            if first_at is None:
                first_at = time.perf_counter()
            if len(tokens) >= n:
                break
        ended = time.perf_counter()
        ms = (ended - first_at) * 1000.0 / max(1, len(tokens) - 1)
        print(json.dumps({"tokens": tokens, "ms_per_token": ms, "first_token_s": first_at - started}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
