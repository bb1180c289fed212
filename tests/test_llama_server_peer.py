"""The llama-server peer's plumbing (engine/tools/llama_server.py) without llama.cpp: its command line
(same file, threads, YaRN flags, --spec-type), the /completion request (token ids, greedy, cached
prompt), its replies' timings, and a whole start-ask-close cycle against a fake server on 127.0.0.1."""
from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

from engine.tools.llama_server import (LlamaServerPeer, completion_request, parse_completion, server_command)

CANNED = {"content": " ungentle", "tokens": [7, 8, 9, 10], "stop": True,
          "timings": {"cache_n": 0, "prompt_n": 16000, "prompt_ms": 200000.0, "prompt_per_second": 80.0,
                      "predicted_n": 4, "predicted_ms": 260.0, "predicted_per_token_ms": 65.0,
                      "draft_n": 6, "draft_n_accepted": 2}}


def test_the_command_line_carries_the_stretch_and_the_decoder():
    cmd = server_command(Path("/bin/llama-server"), Path("/m.gguf"), 16512, 2, 8080, rope=(2.0, 8192),
                         spec_type="ngram-simple")
    line = " ".join(cmd)
    assert "-m /m.gguf" in line and "-c 16512" in line and "-t 2 -tb 2" in line and "--host 127.0.0.1" in line
    assert "--rope-scaling yarn --rope-scale 2.0 --yarn-orig-ctx 8192" in line
    assert "--spec-type ngram-simple" in line
    plain = " ".join(server_command(Path("s"), Path("m"), 4096, 2, 1))
    assert "--rope" not in plain and "--yarn" not in plain and "--spec-type" not in plain


def test_the_request_sends_token_ids_greedy_with_the_prompt_cached():
    body = completion_request([1, 2, 3], 64)
    assert body["prompt"] == [1, 2, 3] and body["n_predict"] == 64
    assert body["cache_prompt"] and body["return_tokens"] and body["ignore_eos"]
    assert body["top_k"] == 1 and body["temperature"] == 0.0 and body["samplers"] == ["top_k"]


def test_a_reply_gives_tokens_prefill_and_decode_rates():
    got = parse_completion(CANNED)
    assert got.tokens == [7, 8, 9, 10]
    assert got.prompt_tokens_per_s == pytest.approx(80.0)
    assert got.ms_per_token == pytest.approx(65.0)
    assert (got.draft_tokens, got.draft_accepted) == (6, 2)
    with pytest.raises(ValueError, match="without tokens or timings"):
        parse_completion({"content": "x"})


FAKE_SERVER = textwrap.dedent('''
    import json, sys
    from http.server import BaseHTTPRequestHandler, HTTPServer
    args = sys.argv[1:]
    port = int(args[args.index("--port") + 1])
    record = sys.argv[0] + ".requests"
    canned = json.loads(open(sys.argv[0] + ".reply").read())
    with open(sys.argv[0] + ".argv", "w") as fh:
        json.dump(args, fh)
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass
        def _send(self, body):
            data = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        def do_GET(self):
            self._send({"status": "ok"} if self.path == "/health" else {"build_info": "b-fake"})
        def do_POST(self):
            request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if canned.get("refuse"):
                self.send_response(400)
                self.end_headers()
                self.wfile.write(canned["refuse"].encode())
                return
            with open(record, "a") as fh:
                fh.write(json.dumps(request) + "\\n")
            n = request["n_predict"]
            first = not canned.get("seen")
            canned["seen"] = True
            timings = dict(canned["timings"], prompt_n=len(request["prompt"]) if first else 1,
                           predicted_n=n)
            self._send(dict(canned, tokens=list(range(n)), timings=timings))
    HTTPServer(("127.0.0.1", port), Handler).serve_forever()
''')


def test_a_peer_starts_answers_and_closes(tmp_path):
    script = tmp_path / "llama-server"
    script.write_text(f"#!{sys.executable}\n" + FAKE_SERVER)
    script.chmod(0o755)
    (tmp_path / "llama-server.reply").write_text(json.dumps(CANNED))
    peer = LlamaServerPeer(script, tmp_path / "m.gguf", 2048, 2, rope=(4.0, 8192), spec_type="ngram-mod",
                           start_timeout_s=60)
    try:
        assert peer.version == "b-fake"
        tokens, ms = peer.run(list(range(100, 1100)), 5)
        assert tokens == [0, 1, 2, 3, 4] and ms == pytest.approx(260.0 / 5)
        assert peer.last_prefill is not None and peer.last_prefill.prompt_tokens == 1000
        peer.run(list(range(100, 1100)), 5)  # the cached prompt: one token computed, the prefill kept
        assert peer.last_prefill.prompt_tokens == 1000
        assert peer.peak_rss_bytes() is None or peer.peak_rss_bytes() > 0
    finally:
        peer.close()
    assert peer.proc.poll() is not None  # the server is gone
    argv = json.loads((tmp_path / "llama-server.argv").read_text())
    assert argv[argv.index("--rope-scale") + 1] == "4.0" and argv[argv.index("--spec-type") + 1] == "ngram-mod"
    requests = [json.loads(line) for line in (tmp_path / "llama-server.requests").read_text().splitlines()]
    assert [r["prompt"][:2] for r in requests] == [[100, 101], [100, 101]] and all(r["cache_prompt"] for r in requests)


def test_a_refused_request_raises_with_the_servers_reason(tmp_path):
    script = tmp_path / "llama-server"
    script.write_text(f"#!{sys.executable}\n" + FAKE_SERVER)
    script.chmod(0o755)
    (tmp_path / "llama-server.reply").write_text(json.dumps(dict(CANNED, refuse="exceeds the available context")))
    peer = LlamaServerPeer(script, tmp_path / "m.gguf", 2048, 2, start_timeout_s=60)
    try:
        with pytest.raises(RuntimeError, match="answered 400: exceeds the available context"):
            peer.run([1, 2, 3], 4)
    finally:
        peer.close()


def test_a_server_that_exits_is_reported_with_its_log(tmp_path):
    script = tmp_path / "llama-server"
    script.write_text(f"#!{sys.executable}\nimport sys\nprint('error: unknown argument --rope-scale')\nsys.exit(1)\n")
    script.chmod(0o755)
    with pytest.raises(RuntimeError, match="unknown argument"):
        LlamaServerPeer(script, tmp_path / "m.gguf", 2048, 2, start_timeout_s=60)


def test_the_bench_header_gives_the_floor_prefill_and_peak_rss():
    from engine.tools.bench import format_report

    report = {"model": "m", "rope": "YaRN x2 over a trained 8192", "device": "cpu", "workload": "continue",
              "context_tokens": 16384, "new_tokens": 64, "settings": {}, "skipped": {},
              "memory_floor": {"bytes_per_step": 475_000_000, "read_gbps": 19.0, "floor_ms": 25.0},
              "prefill": {"ours": {"tokens": 16384, "tokens_per_s": 90.5}, "llama.cpp": {"tokens": 16384,
                                                                                        "tokens_per_s": 80.0}},
              "peak_rss_bytes": {"ours": 2**30, "llama.cpp": 2**29},
              "results": [{"method": "ar", "ms_per_token": 50.0, "tokens_per_s": 20.0, "speedup_vs_ar": 1.0,
                           "acceptance": {}, "identical_to_ar": True}]}
    table = format_report(report)
    assert "m stretched (YaRN x2 over a trained 8192) on cpu" in table
    assert "plain step floor: 475 MB a step / 19.0 GB/s measured = 25.0 ms; ar 50.0 ms = 2.00x it" in table
    assert "prefill: ours 90.5 tok/s (16384 tokens), llama.cpp 80.0 tok/s (16384 tokens)" in table
    assert "peak RSS: ours 1024 MiB, llama.cpp 512 MiB" in table


def test_a_spec_type_without_llama_server_is_skipped_with_a_reason(monkeypatch, tmp_path):
    from types import SimpleNamespace

    from engine.tools.bench import Peers

    monkeypatch.setenv("TRIFORCE_LLAMA_SERVER", str(tmp_path / "none"))
    lines: list[str] = []
    peers = Peers(SimpleNamespace(config=None), gguf=tmp_path / "m.gguf", log=lines.append)
    assert peers.llama(4096, "llama.cpp:ngram-simple") is None
    assert "llama-server" in peers.skipped["llama.cpp:ngram-simple"] and lines
