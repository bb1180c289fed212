"""Model pairs worth shipping (DESIGN.md "Models"). Their config.json files live in
resources/presets/<org>--<name>.json so the planner works offline before any download."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

PRESET_CONFIG_DIR = Path(__file__).resolve().parents[2] / "resources" / "presets"

BUNDLED_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"


@dataclass(frozen=True)
class Preset:
    name: str
    target: str  # Hugging Face repo id
    draft: str | None  # repo id of the L0 draft model, or None (use n-gram)
    note: str


PRESETS: tuple[Preset, ...] = (
    Preset("smollm2-135m", BUNDLED_ID, None, "bundled; runs on any CPU; n-gram drafter"),
    Preset("llama3.1-8b", "meta-llama/Llama-3.1-8B-Instruct", "meta-llama/Llama-3.2-1B-Instruct", "128K context"),
    Preset("qwen2.5-7b-1m", "Qwen/Qwen2.5-7B-Instruct-1M", "Qwen/Qwen2.5-0.5B-Instruct", "1M context (YaRN/DCA)"),
    Preset("llama2-7b-128k", "NousResearch/Yarn-Llama-2-7b-128k", "JackFram/llama-68m", "the paper's setting"),
    Preset("smollm2-1.7b", "HuggingFaceTB/SmolLM2-1.7B-Instruct", BUNDLED_ID, "8K context"),
)


def preset_config_path(repo_id: str) -> Path:
    return PRESET_CONFIG_DIR / (repo_id.replace("/", "--") + ".json")


def shipped_config(repo_id: str) -> dict | None:
    """The config.json we ship for a preset model, or None if we ship none."""
    path = preset_config_path(repo_id)
    if not path.is_file():
        return None
    return json.loads(path.read_text(encoding="utf-8"))


def find_preset(name: str) -> Preset | None:
    return next((p for p in PRESETS if name in (p.name, p.target)), None)
