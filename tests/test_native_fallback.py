"""Without the native kernels (no C compiler, one that does not run, kernels.c missing or not
compiling) the engine logs one line and runs the torch paths: no exception reaches the user."""
from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from streams import answer_tokens
from test_quant import K_TINY_CONFIG, K_TINY_KINDS, quantize_rows, write_tiny_gguf

from engine import native
from engine.decoding.session import ChatSession
from engine.events import ChatMessage, DocumentText
from engine.model.loading import load_folder
from engine.model.quant import SUPPORTED, QuantWeight
from engine.settings import DecodeSettings


def _break(breakage: str, monkeypatch, tmp_path) -> None:
    monkeypatch.setattr(native, "_loaded", [])  # decide again in this test (restored afterwards)
    monkeypatch.setenv("TRIFORCE_NATIVE", "1")
    monkeypatch.setenv("TRIFORCE_KERNEL_DIR", str(tmp_path / "kernels"))  # nothing cached there
    if breakage == "no compiler":
        monkeypatch.setattr(native, "_compiler", lambda: None)
    elif breakage == "compiler does not run":
        monkeypatch.setattr(native, "_compiler", lambda: str(tmp_path / "no-such-cc"))
    elif breakage == "kernels.c missing":
        monkeypatch.setattr(native, "SOURCE", tmp_path / "kernels.c")
    else:  # a source the compiler rejects
        bad = tmp_path / "kernels.c"
        bad.write_text("this is not C;\n")
        monkeypatch.setattr(native, "SOURCE", bad)


@pytest.mark.parametrize("breakage", ["no compiler", "compiler does not run", "kernels.c missing", "does not compile"])
def test_a_missing_or_unbuildable_kernel_falls_back_with_one_log_line(breakage, monkeypatch, tmp_path, caplog):
    _break(breakage, monkeypatch, tmp_path)
    with caplog.at_level(logging.DEBUG, logger="engine.native"):
        assert native.library() is None and not native.available()
        assert not native.available()  # decided once: no second line
    lines = [r for r in caplog.records if r.name == "engine.native" and r.levelno >= logging.INFO]
    assert len(lines) == 1, [r.getMessage() for r in lines]
    assert lines[0].levelno == logging.WARNING and "torch paths run" in lines[0].getMessage()
    x = torch.randn(3, 256, generator=torch.Generator().manual_seed(0))
    for kind in SUPPORTED:  # every kind still computes, on the torch path
        rows = np.random.default_rng(1).standard_normal((64, 256)).astype(np.float32)
        weight = QuantWeight(kind, quantize_rows(rows, kind), 256)
        assert not weight.native
        oracle = x @ weight.dequantize().T
        got = weight.matmul(x)
        assert got.shape == (3, 64)
        assert (got - oracle).abs().max() <= 0.04 * oracle.pow(2).mean().sqrt()  # int4 kinds: bfloat16 activations


def test_a_k_quant_model_answers_on_the_torch_path_and_every_mode_stays_ar(tiny_model_dir, tmp_path, monkeypatch,
                                                                          sample_text, caplog):
    _break("no compiler", monkeypatch, tmp_path)
    folder = write_tiny_gguf(tiny_model_dir("llama", **K_TINY_CONFIG), tmp_path, K_TINY_KINDS)
    with caplog.at_level(logging.WARNING, logger="engine.native"):
        model = load_folder(folder, file_blocks=True)
        layer = model.runner.layers[0]
        assert isinstance(layer.wqkv, QuantWeight) and not layer.wqkv.native
        doc = [DocumentText("Hamlet", sample_text[:2000])]
        messages = [ChatMessage("user", "Repeat the first line of the play.")]
        base = DecodeSettings(max_new_tokens=16)
        reference, _ = answer_tokens(ChatSession(model, base.replace(mode="ar"), draft="none", capacity=2048),
                                     messages, doc)
        assert reference
        fast = ChatSession(model, base.replace(mode="triforce", budget=64, chunk=16, gamma1=3, gamma2=4),
                           draft="ngram", capacity=2048)
        got, _ = answer_tokens(fast, messages, doc)
    assert got == reference
    assert len([r for r in caplog.records if r.name == "engine.native"]) == 1
