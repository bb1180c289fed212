"""A restored prefilled-book snapshot gives bit-identical generations to a fresh prefill."""
from __future__ import annotations

import pytest

from engine.events import ChatMessage, DocumentText
from engine.model.loading import load_folder
from engine.decoding.session import ChatSession
from engine.settings import DecodeSettings
from engine.store.snapshots import SnapshotStore
from streams import answer_tokens


@pytest.mark.bundled
def test_restored_snapshot_generates_exactly_like_fresh_prefill(bundled_model_dir, sample_passage, tmp_path):
    model = load_folder(bundled_model_dir)
    doc = [DocumentText("Hamlet", sample_passage(1500))]
    question = [ChatMessage("user", "Who is on guard at the start of the play?")]
    settings = DecodeSettings(mode="triforce", budget=256, chunk=16, max_new_tokens=24)
    store = SnapshotStore(tmp_path / "snapshots")

    def answer(session):
        return answer_tokens(session, question, doc)

    fresh = ChatSession(model, settings, capacity=2048, snapshots=store)
    fresh_tokens, _ = answer(fresh)
    assert store.total_bytes() > 0  # the prefill was saved
    reopened = ChatSession(model, settings, capacity=2048, snapshots=store)
    restored_tokens, _ = answer(reopened)
    prompt_len = len(reopened.prompt_tokens(question, doc))
    assert reopened.prefilled_tokens_total < prompt_len // 4  # the book came from the snapshot
    assert restored_tokens == fresh_tokens
