"""`plan` subcommand, run in a subprocess like a user would (offline, no weights)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LLAMA = ["--model", "meta-llama/Llama-3.1-8B-Instruct", "--draft", "meta-llama/Llama-3.2-1B-Instruct"]


def run_plan(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    # main.py is being written elsewhere; the CLI registry is the same entry point.
    code = f"from engine.cli import main; raise SystemExit(main({['plan', *args]!r}))"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path / "hf"), "TRIFORCE_HOME": str(tmp_path)}
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def test_preset_on_one_4090_prints_a_table(tmp_path) -> None:
    r = run_plan(tmp_path, *LLAMA, "--context", "131072", "--devices", "4090")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "7 of 32 on-chip, 25 offloaded to pinned CPU memory" in out
    assert "cuda:0" in out and "offloaded_kv" in out and "headroom" in out
    assert "L2 full-cache forward" in out and "modelled end-to-end" in out
    assert "offload mode: hybrid (CPU attention at 60 GB/s" in out and "stream-only L2" in out
    assert "at tuned gammas" in out


def test_cpu_attention_bandwidth_flag(tmp_path) -> None:
    r = run_plan(tmp_path, *LLAMA, "--context", "131072", "--devices", "4090", "--json", "--cpu-attn-gbps", "0")
    assert r.returncode == 0, r.stderr
    obj = json.loads(r.stdout)
    assert obj["offload_mode"] == "stream" and obj["cpu_attn_gbps"] == 0 and obj["modelled_ms_per_token"] > 0
    r = run_plan(tmp_path, *LLAMA, "--context", "131072", "--devices", "4090", "--json", "--cpu-attn-gbps", "90")
    fast = json.loads(r.stdout)
    assert fast["offload_mode"] == "hybrid" and fast["modelled_ms_per_token"] < obj["modelled_ms_per_token"]
    r = run_plan(tmp_path, *LLAMA, "--context", "131072", "--devices", "4090x2", "--json")
    assert json.loads(r.stdout)["offload_mode"] == "resident"


def test_json_two_4090s(tmp_path) -> None:
    r = run_plan(tmp_path, *LLAMA, "--context", "131072", "--devices", "4090x2", "--json")
    assert r.returncode == 0, r.stderr
    obj = json.loads(r.stdout)
    assert obj["fits"] is True and obj["kv_layers_offloaded"] == 0 and obj["mode"] == "tensor-parallel"
    assert {a["mode"] for a in obj["alternatives"]} == {"layer-split", "tensor-parallel"}
    r = run_plan(tmp_path, *LLAMA, "--context", "131072", "--devices", "4090x2", "--json", "--no-tensor-parallel")
    assert json.loads(r.stdout)["mode"] == "layer-split"


def test_preset_draft_is_the_default(tmp_path) -> None:
    r = run_plan(tmp_path, "--model", "NousResearch/Yarn-Llama-2-7b-128k", "--context", "131072", "--devices", "4090",
                 "--json")
    obj = json.loads(r.stdout)
    assert obj["draft"] == "JackFram/llama-68m" and obj["kv_layers_offloaded"] > 16


def test_bundled_model_on_cpu(tmp_path) -> None:
    r = run_plan(tmp_path, "--model", "HuggingFaceTB/SmolLM2-135M-Instruct", "--context", "8192", "--devices", "cpu")
    assert r.returncode == 0, r.stderr
    assert "KV layers: all 30 in RAM" in r.stdout


def test_unknown_model_is_one_line_exit_2(tmp_path) -> None:
    r = run_plan(tmp_path, "--model", "nobody/no-such-model", "--context", "1000", "--devices", "cpu")
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0
    assert "not a preset and not in the local cache" in r.stderr and "Traceback" not in r.stderr


def test_misfit_prints_plan_then_exits_2(tmp_path) -> None:
    r = run_plan(tmp_path, "--model", "NousResearch/Yarn-Llama-2-7b-128k", "--context", "131072",
                 "--devices", "4090", "--ram-gib", "32")
    assert r.returncode == 2
    assert "DOES NOT FIT" in r.stdout
    assert r.stderr.startswith("error: offloaded KV needs")


def test_a_context_past_the_trained_one_is_planned_stretched_and_past_4x_exits_2(tmp_path) -> None:
    """As `chat --context`: 20,000 tokens on an 8K model plan its YaRN stretch (KV for all of them);
    more than the largest stretch (8x) is refused in one line that says how far it can go."""
    ok = run_plan(tmp_path, "--model", "HuggingFaceTB/SmolLM2-135M-Instruct", "--context", "20000", "--devices", "cpu")
    assert ok.returncode == 0 and "20000 tokens" in ok.stdout
    r = run_plan(tmp_path, "--model", "HuggingFaceTB/SmolLM2-135M-Instruct", "--context", "70000", "--devices", "cpu")
    assert r.returncode == 2 and "at most 65536 tokens" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_a_headroom_past_the_card_is_refused_not_planned_as_negative_memory(tmp_path) -> None:
    r = run_plan(tmp_path, *LLAMA, "--context", "4096", "--devices", "4090", "--headroom-gib", "30")
    assert r.returncode == 2 and r.stdout == "" and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith("error: a headroom of 30 GiB does not fit cuda:0 (NVIDIA GeForce RTX 4090")


def test_the_planner_refuses_what_the_flags_refuse_for_callers_without_them() -> None:
    from engine.errors import InvalidSettingError
    from engine.offload.planner import GiB, plan_placement
    from engine.offload.shapes import shape_for
    from engine.settings import DecodeSettings

    target = shape_for("meta-llama/Llama-3.1-8B-Instruct")
    for knobs, says in (({"cpu_attn_gbps": float("nan")}, "is not finite"),
                        ({"headroom_bytes": 1 << 80}, "does not fit cuda:0"),
                        ({"headroom_bytes": -GiB}, "does not fit cuda:0")):
        with pytest.raises(InvalidSettingError, match=says):
            plan_placement(target, None, 4096, DecodeSettings(), "4090", **knobs)
