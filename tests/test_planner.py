"""Offload planner: hand-checkable placements, computed here from first principles."""
from __future__ import annotations

import json

import pytest

from engine import native
from engine.errors import (ContextOverflowError, IncompatibleDraftError, InvalidSettingError, ModelNotFoundError,
                           OutOfMemoryPlanError)
from engine.offload.shapes import ModelShape, shape_for
from engine.offload.planner import DeviceSpec, GpuSpec, RTX_4090, device_spec, plan_placement
from engine.store.presets import PRESETS, preset_config_path
from engine.settings import DecodeSettings

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
LLAMA31, LLAMA32_1B = "meta-llama/Llama-3.1-8B-Instruct", "meta-llama/Llama-3.2-1B-Instruct"
YARN, LLAMA68M = "NousResearch/Yarn-Llama-2-7b-128k", "JackFram/llama-68m"
SMOL135, SMOL17 = "HuggingFaceTB/SmolLM2-135M-Instruct", "HuggingFaceTB/SmolLM2-1.7B-Instruct"
QWEN7, QWEN05 = "Qwen/Qwen2.5-7B-Instruct-1M", "Qwen/Qwen2.5-0.5B-Instruct"
CTX = 131072
S = DecodeSettings()  # budget 1024, chunk 16, sinks 4 + window 252, gamma1 4, gamma2 6


def test_every_preset_ships_a_config() -> None:
    for preset in PRESETS:
        for repo in filter(None, (preset.target, preset.draft)):
            assert preset_config_path(repo).is_file(), repo
            shape_for(repo)


@pytest.mark.parametrize("repo, params", [
    # published parameter counts
    (LLAMA31, 8_030_261_248), (LLAMA32_1B, 1_235_814_400), (YARN, 6_738_415_616),
    (SMOL135, 134_515_008), (QWEN05, 494_032_768), (QWEN7, 7_615_616_512),
])
def test_param_counts_match_published(repo: str, params: int) -> None:
    assert shape_for(repo).param_count() == params


def test_kv_bytes_per_token() -> None:
    # layers * kv heads * head dim * (K,V) * bf16
    assert shape_for(LLAMA31).kv_bytes_per_token(2) == 32 * 8 * 128 * 2 * 2 == 128 * KiB
    assert shape_for(YARN).kv_bytes_per_token(2) == 32 * 32 * 128 * 2 * 2 == 512 * KiB
    assert shape_for(SMOL135).kv_bytes_per_token(4) == 30 * 3 * 64 * 2 * 4


def test_shape_from_transformers_config() -> None:
    from transformers import LlamaConfig

    cfg = json.loads(preset_config_path(LLAMA31).read_text())
    shape = ModelShape.from_config(LlamaConfig(**cfg), name="x")
    assert shape == ModelShape.from_config(cfg, name="x")


def test_unknown_spec_is_model_not_found(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(ModelNotFoundError, match="not a preset and not in the local cache"):
        shape_for("nobody/no-such-model")


def test_local_folder(tmp_path) -> None:
    (tmp_path / "config.json").write_text(preset_config_path(SMOL135).read_text())
    assert shape_for(str(tmp_path)).layers == 30


# -- the hand-checkable cases ---------------------------------------------------------------
def _fixed_gpu_bytes(t: ModelShape, d: ModelShape | None, ctx: int = CTX) -> int:
    """What the planner puts on the card before any full KV: weights, retrieval, draft, working."""
    layer_tok = 2 * t.kv_heads * t.head_dim * 2
    retrieval = t.layers * (S.budget + 128) * layer_tok  # RetrievalCache: budget + 128 slots of headroom
    kv_row = t.kv_heads * t.head_dim
    # fp32 chunk means (no fp32 copy of the layer), one 16K-token piece of offloaded keys, indices, gathered K/V
    rebuild = ctx // S.chunk * kv_row * 4 + 16384 * kv_row * 2 + S.budget * t.kv_heads * 8 + 2 * S.budget * kv_row * 2
    draft = 0
    if d:  # StreamingCache: sinks + window + 64 slack
        draft = d.param_count() * 2 + (S.draft_sinks + S.draft_window + 64) * d.kv_bytes_per_token(2)
    activations = 1024 * (3 * t.hidden + (t.heads + 2 * t.kv_heads) * t.head_dim + 3 * t.intermediate) * 2
    logits = (max(S.gamma1, S.gamma2) + 1) * t.vocab * 4 * 3
    return t.param_count() * 2 + retrieval + rebuild + draft + activations + logits


def test_llama31_8b_128k_on_one_4090_offloads_most_layers() -> None:
    t, d = shape_for(LLAMA31), shape_for(LLAMA32_1B)
    plan = plan_placement(t, d, CTX, S, "4090", cpu_attn_gbps=0)  # stream only (hybrid: below)
    assert plan.offload_mode == "stream" and plan.cpu_heads == (0,) * 32
    room = 24564 * MiB - int(1.5 * GiB)
    layer_kv = CTX * 8 * 128 * 2 * 2  # 512 MiB
    resident = (room - _fixed_gpu_bytes(t, d) - 2 * layer_kv) // layer_kv
    assert layer_kv == 512 * MiB and resident == 7
    assert plan.fits and plan.mode == "single-gpu"
    assert plan.kv_layers_total == 32
    assert plan.kv_layers_offloaded == 32 - resident == 25  # most layers offloaded
    gpu, cpu = plan.device("cuda:0"), plan.device("cpu")
    assert gpu.component("full_kv") == resident * layer_kv
    assert gpu.component("staging") == 2 * layer_kv
    assert cpu.component("offloaded_kv") == 25 * layer_kv
    assert gpu.spare_bytes >= 0
    # Floors: bytes / bandwidth. L2 is PCIe bound: 25 layers x 512 MiB at 25 GB/s.
    f = plan.floors
    assert f.l2_pcie_ms == pytest.approx(25 * layer_kv / 25e9 * 1e3)  # 536.9 ms
    assert f.ar_ms == pytest.approx(f.l2_pcie_ms)  # plain AR pays the whole stream
    head = t.vocab * t.hidden * 2 + t.hidden * 2
    l1_bytes = t.layers * t.layer_params() * 2 + head + 32 * (1024 + 7) * 4096
    assert f.l1_ms == pytest.approx(l1_bytes / 1008e9 * 1e3)
    # the draft's tied embedding matrix is read once, as its lm_head; + its 320-slot StreamingLLM cache
    assert f.l0_ms == pytest.approx((d.param_count() * 2 + 320 * 32 * KiB) / 1008e9 * 1e3)
    # both staging slots are filled while L1 drafts (6 tokens at ~9.3 ms each > 2 x 21.5 ms)
    assert f.l2_prefetched_ms == pytest.approx(2 * layer_kv / 25e9 * 1e3)
    assert f.l2_ms == pytest.approx(f.l2_pcie_ms - f.l2_prefetched_ms)
    assert f.l2_serial_ms > f.l2_pcie_ms
    assert f.l1_ms < f.end_to_end_ms < f.ar_ms


def test_llama31_8b_128k_on_two_4090s_fits_on_chip() -> None:
    t, d = shape_for(LLAMA31), shape_for(LLAMA32_1B)
    total_kv = 32 * CTX * 4096  # 16 GiB
    assert t.param_count() * 2 + d.param_count() * 2 + total_kv < 2 * (24564 * MiB - int(1.5 * GiB))
    plan = plan_placement(t, d, CTX, S, "4090x2", tensor_parallel=True)
    assert plan.fits and plan.kv_layers_offloaded == 0
    assert plan.mode == "tensor-parallel"
    assert all(dev.spare_bytes >= 0 for dev in plan.devices)
    assert plan.device("cpu").used_bytes == 0
    assert plan.device("cuda:0").component("full_kv") == total_kv // 2
    alt = {a.mode: a for a in plan.alternatives}
    assert alt["layer-split"].fits and alt["tensor-parallel"].fits
    # each card reads half the bytes, paying 65 host-staged all-reduces of 30 us
    assert alt["tensor-parallel"].floors.l2_ms < alt["layer-split"].floors.l2_ms
    half = (t.layers * t.layer_params() * 2 + t.vocab * t.hidden * 2 + t.hidden * 2 + total_kv) / 2
    assert plan.floors.l2_ms == pytest.approx(half / 1008e9 * 1e3 + 65 * 0.030, rel=1e-6)


@pytest.mark.parametrize("profile", ["4090", "4090x2"])
def test_llama2_7b_128k_offloads_on_both_profiles(profile: str) -> None:
    t, d = shape_for(YARN), shape_for(LLAMA68M)
    assert CTX * 512 * KiB == 64 * GiB > 2 * 24 * GiB  # cannot all be on-chip even on two cards
    plan = plan_placement(t, d, CTX, S, profile)
    assert plan.fits and plan.kv_layers_offloaded > 16
    assert plan.device("cpu").component("offloaded_kv") == plan.kv_layers_offloaded * CTX * 512 * KiB // 32


def test_two_gpus_with_offload_prefer_splitting_heads_over_layers() -> None:
    """Layer-split cards take turns, so one PCIe link works at a time; splitting every offloaded
    layer's KV heads across the cards keeps both links busy and halves L2."""
    t, d = shape_for(YARN), shape_for(LLAMA68M)
    plan = plan_placement(t, d, CTX, S, "4090x2", tensor_parallel=True, cpu_attn_gbps=0)  # the links alone
    alt = {a.mode: a for a in plan.alternatives}
    assert plan.mode == "tensor-parallel"
    assert alt["layer-split"].fits
    assert plan.floors.l2_ms < 0.6 * alt["layer-split"].floors.l2_ms
    only_split = plan_placement(t, d, CTX, S, "4090x2", tp_offload=False, tensor_parallel=True)
    assert only_split.mode == "layer-split"
    assert "does not fit" in only_split.mode_reason


def test_default_choice_on_two_cards_is_tensor_parallel_for_the_presets() -> None:
    """Both multi-card modes are built; the plan picks the lower floor, which for both presets is
    tensor parallel (engine/model/runner_tp.py). Ruling it out gives the layer split, and says so."""
    for shape, draft in ((LLAMA31, LLAMA32_1B), (YARN, LLAMA68M)):
        plan = plan_placement(shape_for(shape), shape_for(draft), CTX, S, "4090x2")
        alt = {a.mode: a for a in plan.alternatives}
        assert plan.mode == "tensor-parallel" and "not built" not in plan.mode_reason
        assert plan.layer_devices == ("cuda:0+cuda:1",) * shape_for(shape).layers
        assert plan.floors.end_to_end_ms == pytest.approx(alt["tensor-parallel"].floors.end_to_end_ms)
        assert plan.floors.end_to_end_ms < alt["layer-split"].floors.end_to_end_ms
        split = plan_placement(shape_for(shape), shape_for(draft), CTX, S, "4090x2", tensor_parallel=False)
        assert split.mode == "layer-split" and "tensor parallel is ruled out" in split.mode_reason


def test_tensor_parallel_keeps_the_embedding_table_on_the_first_card() -> None:
    t, d = shape_for(LLAMA31), shape_for(LLAMA32_1B)
    plan = plan_placement(t, d, CTX, S, "4090x2")
    table = t.vocab * t.hidden * 2
    assert plan.device("cuda:0").component("target_embeddings") == table
    assert plan.device("cuda:1").component("target_embeddings") == 0
    # untied: each card holds half of lm_head's rows (plus the final norm)
    assert plan.device("cuda:1").component("target_lm_head") == pytest.approx(table / 2, rel=1e-3)


def test_tensor_parallel_needs_divisible_heads() -> None:
    plan = plan_placement(shape_for(SMOL135), None, 8192, S, "4090x2")  # 9 heads, 3 KV heads
    assert plan.mode == "single-gpu"  # fits one card; splitting only adds hand-offs
    assert {a.mode: a for a in plan.alternatives}["tensor-parallel"].fits is False


def test_smollm2_135m_fits_on_cpu() -> None:
    t = shape_for(SMOL135)
    plan = plan_placement(t, None, 8192, S, "cpu")
    assert plan.fits and plan.mode == "cpu" and plan.dtype_bytes == 4
    assert plan.kv_layers_offloaded == 0
    kv_bytes = 2 if native.available() else 4  # the CPU runner stores float16 K/V where the native kernels run
    assert plan.device("cpu").component("full_kv") == 8192 * 30 * 3 * 64 * 2 * kv_bytes
    # the process (runtime included, ~1.07 GB) and the 2 GiB kept free: an 8 GiB laptop with 3.5 GiB
    # available fits it, one with 2.5 GiB available does not
    assert plan_placement(t, None, 8192, S, DeviceSpec("cpu", 8 * GiB, int(3.5 * GiB))).fits
    assert not plan_placement(t, None, 8192, S, DeviceSpec("cpu", 4 * GiB, int(2.5 * GiB)), raise_on_misfit=False).fits


def test_qwen_pair_with_padded_vocab_is_compatible() -> None:
    t, d = shape_for(QWEN7), shape_for(QWEN05)
    assert t.vocab != d.vocab  # 152064 vs 151936: same tokenizer, padded embedding rows
    assert plan_placement(t, d, 32768, S, "4090").fits


# -- bad inputs ----------------------------------------------------------------------------
def test_context_longer_than_model_max() -> None:
    with pytest.raises(ContextOverflowError, match="9000.*8192"):
        plan_placement(shape_for(SMOL135), None, 9000, S, "cpu")


def test_draft_with_other_vocabulary() -> None:
    with pytest.raises(IncompatibleDraftError, match="32000.*128256"):
        plan_placement(shape_for(LLAMA31), shape_for(LLAMA68M), 8192, S, "4090")


def test_zero_free_memory() -> None:
    spec = DeviceSpec("x", 64 * GiB, 60 * GiB, gpus=(GpuSpec("busy", 24 * GiB, 0, 1008.0, 25.0),))
    with pytest.raises(OutOfMemoryPlanError, match="0 bytes free"):
        plan_placement(shape_for(SMOL135), None, 1024, S, spec)


def test_weights_that_do_not_fit_name_the_numbers() -> None:
    spec = DeviceSpec("x", 64 * GiB, 60 * GiB, gpus=(GpuSpec("16 GB card", 16 * GiB, 16 * GiB, 500.0, 12.0),))
    with pytest.raises(OutOfMemoryPlanError, match=r"target weights need 16\.1 GB but cuda:0 has 15\.6 GB free"):
        plan_placement(shape_for(LLAMA31), None, 8192, S, spec)


def test_offloaded_kv_must_fit_in_ram() -> None:
    t, d = shape_for(YARN), shape_for(LLAMA68M)
    with pytest.raises(OutOfMemoryPlanError, match="pinned CPU memory"):
        plan_placement(t, d, CTX, S, device_spec("4090", ram_bytes=32 * GiB))
    plan = plan_placement(t, d, CTX, S, device_spec("4090", ram_bytes=32 * GiB), raise_on_misfit=False)
    assert not plan.fits and plan.shortfalls


def test_bad_numbers_are_setting_errors() -> None:
    with pytest.raises(InvalidSettingError):
        plan_placement(shape_for(SMOL135), None, 0, S, "cpu")
    with pytest.raises(InvalidSettingError):
        device_spec("3090x4")


def test_budget_larger_than_context_is_clamped() -> None:
    plan = plan_placement(shape_for(SMOL135), None, 256, S.replace(budget=2048), "cpu")
    assert plan.budget_tokens == 256


def test_ar_mode_plans_no_retrieval_or_draft() -> None:
    plan = plan_placement(shape_for(LLAMA31), shape_for(LLAMA32_1B), 8192, S.replace(mode="ar"), "4090")
    comps = plan.bytes_by_component()
    assert "retrieval_cache" not in comps and "draft_weights" not in comps
    assert plan.floors.end_to_end_ms == plan.floors.ar_ms


# -- JSON --------------------------------------------------------------------------------------
def test_json_has_the_promised_keys() -> None:
    plan = plan_placement(shape_for(LLAMA31), shape_for(LLAMA32_1B), CTX, S, "4090")
    obj = json.loads(plan.to_json())
    for key in ("fits", "mode", "kv_layers_total", "kv_layers_offloaded", "devices", "bytes_by_component",
                "floor_ms_per_token", "assumptions", "kv_devices"):
        assert key in obj
    assert isinstance(obj["fits"], bool) and isinstance(obj["kv_layers_offloaded"], int)
    for key in ("l0_ms", "l1_ms", "l2_ms", "end_to_end_ms", "ar_ms"):
        assert obj["floor_ms_per_token"][key] > 0
    gpu = next(dev for dev in obj["devices"] if dev["name"] == "cuda:0")
    assert gpu["components"]["target_layers"] == 32 * shape_for(LLAMA31).layer_params() * 2
    assert gpu["headroom_bytes"] == int(1.5 * GiB)
    assert obj["assumptions"]["l1_by_l2"] == 0.9
    assert obj["kv_devices"].count("cpu") == obj["kv_layers_offloaded"]


def test_headroom_is_a_parameter() -> None:
    t, d = shape_for(LLAMA31), shape_for(LLAMA32_1B)
    loose = plan_placement(t, d, CTX, S, "4090", headroom_bytes=512 * MiB)
    tight = plan_placement(t, d, CTX, S, "4090")
    assert loose.kv_layers_offloaded < tight.kv_layers_offloaded


def test_named_profiles() -> None:
    assert device_spec("4090").gpus == (RTX_4090,)
    assert len(device_spec("4090x2").gpus) == 2
    assert device_spec("cpu").gpus == ()
    assert device_spec("auto").profile == "cpu"  # this machine has no GPU


def test_end_to_end_with_perfect_acceptance() -> None:
    """All drafts accepted: one L2 forward per gamma2 + 1 tokens, after gamma2 L1 forwards."""
    from engine.offload.planner import Acceptance

    t = shape_for(LLAMA31)
    settings = S.replace(mode="retrieval-only")
    plan = plan_placement(t, None, 32768, settings, "4090", acceptance=Acceptance(1.0, 1.0, 1.0))
    f = plan.floors
    assert f.end_to_end_ms == pytest.approx((6 * f.l1_ms + f.l2_ms) / 7)


# -- hybrid offload --------------------------------------------------------------------------
def test_hybrid_split_balances_the_cpu_and_the_link() -> None:
    """At 60 GB/s of CPU attention against 25 GB/s of PCIe, about 60/85 of each offloaded layer's
    KV heads are attended on the CPU; moving one head either way would make one side the slower."""
    t, d = shape_for(LLAMA31), shape_for(LLAMA32_1B)
    stream = plan_placement(t, d, CTX, S, "4090", cpu_attn_gbps=0)
    plan = plan_placement(t, d, CTX, S, "4090", cpu_attn_gbps=60)
    assert plan.offload_mode == "hybrid" and plan.kv_devices == stream.kv_devices and plan.cpu_attn_gbps == 60
    heads = [c for c, kv in zip(plan.cpu_heads, plan.kv_devices) if kv == "cpu"]
    assert len(heads) == 25 and max(heads) - min(heads) <= 1
    assert all(c == 0 for c, kv in zip(plan.cpu_heads, plan.kv_devices) if kv != "cpu")
    assert 0.55 < sum(heads) / (25 * 8) < 60 / 85  # below 60/85: the card's own reads sit on the CPU side too
    f = plan.floors
    head_kv = CTX * 128 * 2 * 2  # one KV head of one layer, K and V, bf16
    one_head_ms = head_kv / 25e9 * 1e3 + head_kv / 60e9 * 1e3 + 0.02
    cpu_side, link_side = f.l2_hbm_ms + f.l2_cpu_ms, f.l2_pcie_ms - f.l2_prefetched_ms
    assert abs(cpu_side - link_side) < one_head_ms
    assert f.l2_ms == pytest.approx(max(cpu_side, link_side))
    assert f.l2_pcie_ms == pytest.approx((25 * 8 - sum(heads)) * head_kv / 25e9 * 1e3)
    assert f.l2_cpu_ms == pytest.approx(sum(heads) * head_kv / 60e9 * 1e3 + 25 * 0.020)
    assert f.l2_stream_only_ms == pytest.approx(stream.floors.l2_ms)
    assert f.l2_ms < 0.4 * stream.floors.l2_ms
    assert plan.floors.end_to_end_ms < stream.floors.end_to_end_ms


def test_slow_cpu_attention_keeps_streaming() -> None:
    t, d = shape_for(LLAMA31), shape_for(LLAMA32_1B)
    slow = plan_placement(t, d, CTX, S, "4090", cpu_attn_gbps=0.5)
    assert slow.offload_mode in ("stream", "hybrid") and sum(slow.cpu_heads) <= 25
    assert slow.floors.l2_ms <= plan_placement(t, d, CTX, S, "4090", cpu_attn_gbps=0).floors.l2_ms
    with pytest.raises(InvalidSettingError, match="negative"):
        plan_placement(t, d, CTX, S, "4090", cpu_attn_gbps=-1)


def test_resident_when_nothing_is_offloaded() -> None:
    plan = plan_placement(shape_for(LLAMA31), shape_for(LLAMA32_1B), CTX, S, "4090x2")
    assert plan.kv_layers_offloaded == 0 and plan.offload_mode == "resident" and plan.cpu_heads == ()


def test_tensor_parallel_splits_each_cards_share_with_one_shared_cpu() -> None:
    """Two cards: each streams its share of an offloaded layer over its own link while the CPU
    attends both cards' CPU heads, reading host memory for both."""
    t, d = shape_for(YARN), shape_for(LLAMA68M)
    plan = plan_placement(t, d, CTX, S, "4090x2", cpu_attn_gbps=60)
    assert plan.mode == "tensor-parallel" and plan.offload_mode == "hybrid"
    heads = [c for c, kv in zip(plan.cpu_heads, plan.kv_devices) if kv == "cpu"]
    assert max(heads) <= 16  # a card holds 16 of the 32 KV heads
    # the shared CPU serves 2 x 30 GB/s against a 25 GB/s link per card: 30/55 of each share
    assert sum(heads) / (16 * len(heads)) == pytest.approx(30 / 55, abs=0.08)


@pytest.mark.parametrize("profile,limit", [("4090", 150.0), ("4090x2", 70.0)])
def test_paper_setting_modelled_under_the_issue_limits(profile: str, limit: float) -> None:
    """Llama-2-7B-128K at 127K tokens (the paper's 312 / 108 ms/token), CPU attention at 60 GB/s,
    the planner's stated acceptance and tuned gammas."""
    plan = plan_placement(shape_for(YARN), shape_for(LLAMA68M), 127 * 1024, S.replace(mode="triforce"), profile,
                          cpu_attn_gbps=60)
    assert plan.offload_mode == "hybrid"
    assert plan.modelled_ms_per_token <= limit
    assert plan.modelled_ms_per_token <= plan.floors.end_to_end_ms
    assert 1 <= plan.tuned_gamma1 <= 8 and 1 <= plan.tuned_gamma2 <= 32
    stream = plan_placement(shape_for(YARN), shape_for(LLAMA68M), 127 * 1024, S.replace(mode="triforce"), profile,
                            cpu_attn_gbps=0)
    assert stream.modelled_ms_per_token > limit  # stream-only does not reach it: the CPU half is what does


def test_json_has_offload_mode_and_modelled_ms() -> None:
    obj = json.loads(plan_placement(shape_for(LLAMA31), shape_for(LLAMA32_1B), CTX, S, "4090").to_json())
    assert obj["offload_mode"] == "hybrid" and obj["modelled_ms_per_token"] > 0
    assert len(obj["cpu_heads"]) == 32 and obj["tuned_gammas"]["gamma2"] >= 1
    assert obj["floor_ms_per_token"]["l2_cpu_ms"] > 0 and obj["floor_ms_per_token"]["l2_stream_only_ms"] > 0


@pytest.mark.parametrize("context", [1000, 4096])
def test_the_cpu_plan_counts_the_bytes_the_caches_allocate(tiny_model_dir, context) -> None:
    """On the CPU the plan's full KV and retrieval-cache figures are the bytes the runner's caches
    allocate for that context: their storage dtype (float16 where the native kernels run) and their
    padded lengths."""
    from engine.model.loading import load_folder

    folder = tiny_model_dir("llama")
    model = load_folder(folder)
    shape = ModelShape.from_config(json.loads((folder / "config.json").read_text(encoding="utf-8")))
    settings = DecodeSettings(budget=256).fit_budget(context)
    plan = plan_placement(shape, None, context, settings, "cpu")
    full = model.runner.new_full_cache(context)
    retrieval = full.retrieval(shape.heads, plan.budget_tokens, settings.chunk, settings.retrieval_headroom())

    def held(cache) -> int:
        return sum(t.numel() * t.element_size() for t in (*cache.keys, *cache.values))

    cpu = plan.device("cpu")
    assert cpu.component("full_kv") == held(full)
    assert cpu.component("retrieval_cache") == held(retrieval)


def test_a_gguf_on_the_cpu_is_planned_as_its_blocks_plus_the_prefill_copy_and_the_runtime(bundled_model_dir,
                                                                                        tmp_path) -> None:
    """The CPU runs a GGUF's own blocks memory-mapped: the plan counts the file's tensor bytes for the
    weights (not float32), the float32 copy a long prefill keeps of the projections, and the process's
    runtime (torch and the tokenizer), so its total is what the process holds. A card still counts
    the weights widened to bf16."""
    import gguf

    from engine.offload.layouts import RUNTIME_BYTES, TOKENIZER_BYTES_PER_TOKEN
    from tiny_gguf import write_gguf

    path = tmp_path / "mixed.gguf"
    write_gguf(path, bundled_model_dir, {"q": "Q4_0", "k": "Q8_0", "v": "Q4_0", "o": "Q8_0", "gate": "Q4_1",
                                         "up": "Q4_1", "down": "Q8_0", "embed": "Q8_0"}, vocab_size=512)
    stored = {t.name: int(t.n_bytes) for t in gguf.GGUFReader(str(path)).tensors}
    shape = shape_for(str(path))
    assert shape.file_bytes == (sum(b for n, b in stored.items() if n.startswith("blk.")), stored["token_embd.weight"],
                                sum(b for n, b in stored.items() if not n.startswith("blk.") and n != "token_embd.weight"))
    cpu = plan_placement(shape, None, 1024, S.fit_budget(1024), "cpu").device("cpu")
    if native.available():
        weights = sum(cpu.component(c) for c in ("target_layers", "target_embeddings", "target_lm_head"))
        assert abs(weights - sum(stored.values())) < shape.layers  # per-layer share rounds down
        assert cpu.component("prefill_weights_f32") == 4 * shape.layers * (shape.layer_params() - 2 * shape.hidden)
    assert cpu.component("runtime") == RUNTIME_BYTES + TOKENIZER_BYTES_PER_TOKEN * shape.vocab
    card = plan_placement(shape, None, 1024, S.fit_budget(1024), "4090").device("cuda:0")
    assert card.component("target_layers") == shape.layers * shape.layer_params() * 2
    assert card.component("prefill_weights_f32") == 0 and card.component("runtime") == 0
