"""The repetition penalty as a warp: counts per position, the warp, and the recommended defaults."""
from __future__ import annotations

import pytest
import torch

from engine.decoding.acceptance import penalty_counts, sample_token, target_probs, verify
from engine.errors import InvalidSettingError
from engine.settings import FALLBACK_SAMPLING, Sampling, recommended_sampling

PENALIZED = Sampling(temperature=1.0, presence_penalty=0.5, frequency_penalty=0.25)


def test_counts_per_position_include_the_earlier_drafts_of_the_same_forward() -> None:
    counts = penalty_counts(PENALIZED, answer=[2, 2, 5], drafts=[5, 1, 2], vocab=6)
    assert counts.shape == (4, 6)
    assert counts[0].tolist() == [0, 0, 2, 0, 0, 1]  # before the first draft: the answer only
    assert counts[1].tolist() == [0, 0, 2, 0, 0, 2]  # + draft 0 (5)
    assert counts[3].tolist() == [0, 1, 3, 0, 0, 2]  # + drafts 0..2
    assert penalty_counts(Sampling(temperature=1.0), [2, 2], [1], 6) is None  # no penalty: nothing counted


def test_warp_subtracts_presence_once_and_frequency_per_occurrence() -> None:
    logits = torch.zeros(1, 4)
    counts = torch.tensor([[0.0, 1.0, 3.0, 0.0]])
    probs = target_probs(logits, PENALIZED, counts)[0]
    expected = torch.softmax(torch.tensor([0.0, -0.75, -1.25, 0.0]), -1)
    assert torch.allclose(probs, expected)
    # greedy: the argmax of the penalized logits
    assert sample_token(torch.tensor([1.0, 1.2, 0.0]), Sampling(frequency_penalty=0.5),
                        counts=torch.tensor([0.0, 1.0, 0.0]))[0] == 0
    assert verify([1], None, torch.tensor([[1.0, 1.2, 0.0], [0.0, 0.0, 3.0]]), Sampling(frequency_penalty=0.5),
                  counts=torch.tensor([[0.0, 1.0, 0.0], [0.0, 2.0, 0.0]])).accepted == 0


def test_penalties_validated() -> None:
    with pytest.raises(InvalidSettingError, match="frequency penalty 3.0 is out of range: use -2 to 2"):
        Sampling(frequency_penalty=3.0).validate()
    with pytest.raises(InvalidSettingError, match="presence penalty"):
        Sampling(presence_penalty=-2.5).validate()


def test_recommended_sampling_from_generation_config() -> None:
    qwen = recommended_sampling({"do_sample": True, "temperature": 0.7, "top_p": 0.8, "top_k": 20})
    assert (qwen.temperature, qwen.top_p, qwen.top_k) == (0.7, 0.8, 20) and qwen.penalized
    assert recommended_sampling({"do_sample": True, "temperature": 0.6}).top_p == 1.0  # transformers' default
    assert recommended_sampling({"do_sample": False}).greedy
    fallback = recommended_sampling({"bos_token_id": 1})  # says nothing about sampling
    assert (fallback.temperature, fallback.top_p, fallback.top_k) == (
        FALLBACK_SAMPLING.temperature, FALLBACK_SAMPLING.top_p, FALLBACK_SAMPLING.top_k)
    assert recommended_sampling({"do_sample": True, "temperature": -4}).temperature == FALLBACK_SAMPLING.temperature
    assert recommended_sampling(None).penalized
