"""engine/tools/requantize.py, the maintainer's re-quantizer, with a stand-in for llama-quantize."""
from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter
from kquant_pack import pack_k

from engine.tools import requantize


def _small_gguf(path, kind: str = "Q4_K") -> None:
    writer = GGUFWriter(str(path), "llama")
    rows = np.random.default_rng(0).standard_normal((4, 256)).astype(np.float32)
    writer.add_tensor("blk.0.ffn_down.weight", pack_k(kind, rows), raw_dtype=GGMLQuantizationType[kind])
    writer.add_tensor("output_norm.weight", np.ones(256, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_the_tool_runs_the_quantizer_per_type_and_lists_the_kinds(tmp_path, capsys):
    source = tmp_path / "Model.Q4_1.gguf"
    _small_gguf(source)
    fake = tmp_path / "llama-quantize"  # copies its input: args are --allow-requantize SRC DST TYPE
    fake.write_text('#!/bin/sh\n[ "$1" = --allow-requantize ] && cp "$2" "$3"\n')
    fake.chmod(0o755)
    out = tmp_path / "out"
    assert requantize.main(["--source", str(source), "--out", str(out), "--quantize", str(fake),
                            "--types", "Q4_K_M,Q6_K"]) == 0
    printed = capsys.readouterr().out
    assert (out / "Model-Q4_K_M.gguf").is_file() and (out / "Model-Q6_K.gguf").is_file()
    assert printed.count("every block kind runs natively") == 2 and "Q4_K x1" in printed


def test_a_kind_we_do_not_run_is_named(tmp_path, capsys):
    source = tmp_path / "m.gguf"
    writer = GGUFWriter(str(source), "llama")
    writer.add_tensor("blk.0.ffn_down.weight", np.zeros((4, 110), np.uint8), raw_dtype=GGMLQuantizationType.Q3_K)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    fake = tmp_path / "q"
    fake.write_text('#!/bin/sh\ncp "$2" "$3"\n')
    fake.chmod(0o755)
    assert requantize.main(["--source", str(source), "--out", str(tmp_path / "o"), "--quantize", str(fake),
                            "--types", "Q3_K_M"]) == 0
    assert "not native: Q3_K" in capsys.readouterr().out


def test_without_a_quantizer_it_says_what_to_do(tmp_path, capsys):
    assert requantize.main(["--quantize", str(tmp_path / "missing")]) == 2
    assert "llama-quantize not found" in capsys.readouterr().err
