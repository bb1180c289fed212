"""The app end to end on the real engine (tiny random model): drop -> prefill -> ask -> stream ->
panels -> persisted; stop mid-answer; settings reach the session; bad and oversized files."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
from PySide6.QtCore import Qt

from engine.events import Finished, FinishReason, Metrics, PrefillProgress
from tests.gui.helpers import drop_files

pytestmark = pytest.mark.gui


def _doc(tmp_path: Path, text: str, chars: int, name: str = "hamlet-act1.md") -> Path:
    path = tmp_path / name
    path.write_text(text[:chars], encoding="utf-8")
    return path


def _record(window) -> dict[str, list]:
    """Every engine event the window receives, by type (collected on the GUI thread)."""
    seen: dict[str, list] = {"progress": [], "metrics": [], "finished": []}

    def on_event(_job, ev):
        if isinstance(ev, PrefillProgress):
            seen["progress"].append(ev)
        elif isinstance(ev, Metrics):
            seen["metrics"].append(ev)
        elif isinstance(ev, Finished):
            seen["finished"].append(ev)

    window.engine.engineEvent.connect(on_event)
    return seen


def _ask(qtbot, window, question: str) -> None:
    window.composer.edit.setFocus()
    window.composer.set_text(question)
    qtbot.keyClick(window.composer.edit, Qt.Key.Key_Return)


@pytest.mark.alone  # it times the GUI thread
def test_drop_prefill_ask_stream_panels_and_reopen(qtbot, make_window, tiny_model, sample_text, tmp_path, shots,
                                                   heartbeat):
    window = make_window(tiny_model)
    shots(window, "tiny-empty")
    seen = _record(window)
    doc = _doc(tmp_path, sample_text, 4_000)  # ~1K tokens: a few prefill chunks on the CPU
    window.settings_panel.max_new.setValue(24)
    # a fixed mode: auto's choice follows this machine's timings, and once (1 run in 4) it proposed
    # a single draft, rejected, leaving the acceptance panel nothing to show
    panel_mode = window.settings_panel.mode
    panel_mode.setCurrentIndex(panel_mode.findData("triforce"))
    window.settings_panel.flush()

    heartbeat.start()
    with qtbot.waitSignal(window.prefillFinished, timeout=60_000) as done:
        drop_files(window, [doc])
        qtbot.waitUntil(lambda: len(window.chips.chips) == 1, timeout=30_000)
    heartbeat.stop()
    assert done.args[0].reason != FinishReason.CANCELLED
    chip = window.chips.chips[0]
    assert chip.title == "Hamlet" or "hamlet" in chip.title.lower()
    assert chip.tokens and chip.tokens > 500 and f"{chip.tokens:,} tokens" in chip.count.text()
    # the progress strip got the prefill's numbers, up to done == total
    assert seen["progress"] and seen["progress"][-1].done == seen["progress"][-1].total > 500
    assert window.prefill_strip.total == seen["progress"][-1].total
    assert window.prefill_strip.bar.value() == 1000
    assert not window.prefill_strip.isVisible()
    assert heartbeat.max_gap_ms < 100, f"GUI thread blocked {heartbeat.max_gap_ms:.0f} ms during the prefill"

    # ask: Enter sends; tokens stream into the view
    with qtbot.waitSignal(window.answerFinished, timeout=120_000) as answered:
        _ask(qtbot, window, "Who is at his post when the play begins?")
        assert window.composer.stop.isVisible()
        qtbot.waitUntil(lambda: len(window.chat_view.streaming_text()) > 0 or answered.signal_triggered, timeout=60_000)
    finished = answered.args[0]
    assert finished.reason in (FinishReason.EOS, FinishReason.LENGTH, FinishReason.STOP)
    answer = window.chat_view.messages[-1]
    assert answer.role == "assistant" and answer.text == finished.text and finished.text
    assert window.composer.send.isVisible() and not window.composer.stop.isVisible()

    # live panels saw non-zero acceptance and cache numbers
    m = finished.metrics
    assert m is not None and m.new_tokens > 0
    assert [lv.name for lv in m.levels] == ["l0_l1", "l1_l2"]  # the panel's mode reached the session
    assert any(lv.proposed > 0 and lv.accepted > 0 for lv in m.levels), m.levels
    acc = window.acceptance_panel
    assert any(bar.fraction() > 0 for bar in acc.bars.values())
    assert acc.stats["tokens"].text() == f"{m.new_tokens:,}"
    full = window.cache_panel.full
    assert full.fraction() > 0 and "/ " in full.value.text()
    assert seen["metrics"], "no live metrics reached the panels"

    # persisted: close, reopen on the same store
    chat_id = window.chat_id
    window.close()
    again = make_window(tiny_model)
    ids = [again.chat_list.list.item(i).data(Qt.ItemDataRole.UserRole) for i in range(again.chat_list.list.count())]
    assert chat_id in ids
    again.open_chat(chat_id)
    roles = [m.role for m in again.chat_view.messages]
    assert roles == ["user", "assistant"]
    assert again.chat_view.messages[1].text == finished.text
    assert [c.title for c in again.chips.chips] == [chip.title]
    qtbot.waitUntil(lambda: again.chips.chips[0].tokens == chip.tokens, timeout=10_000)


def test_stop_mid_answer_keeps_partial_and_app_usable(qtbot, make_window, tiny_model):
    window = make_window(tiny_model)
    window.settings_panel.max_new.setValue(4000)
    window.settings_panel.flush()
    with qtbot.waitSignal(window.answerFinished, timeout=60_000) as stopped:
        _ask(qtbot, window, "Tell me a very long story.")
        qtbot.waitUntil(lambda: len(window.chat_view.streaming_text()) > 20, timeout=60_000)
        qtbot.keyClick(window, Qt.Key.Key_Escape)
    assert stopped.args[0].reason == FinishReason.CANCELLED
    stored = window.repo.messages(window.chat_id)
    assert [m.role for m in stored] == ["user", "assistant"]
    assert stored[1].stats.get("partial") is True and stored[1].text == window.chat_view.messages[-1].text
    assert "stopped" in window.chat_view.messages[-1].footer
    assert window.composer.send.isVisible()
    # still usable: the next question is answered (short, to keep it quick)
    window.settings_panel.max_new.setValue(8)
    window.settings_panel.flush()
    with qtbot.waitSignal(window.answerFinished, timeout=60_000) as again:
        _ask(qtbot, window, "And briefly?")
    assert again.args[0].reason in (FinishReason.EOS, FinishReason.LENGTH, FinishReason.STOP)
    assert [m.role for m in window.repo.messages(window.chat_id)] == ["user", "assistant", "user", "assistant"]


def test_budget_slider_reaches_the_engine_at_next_rebuild(qtbot, make_window, tiny_model, sample_text, tmp_path):
    window = make_window(tiny_model)
    panel = window.settings_panel
    panel.mode.setCurrentIndex(panel.mode.findData("triforce"))  # auto tunes the budget itself (slider greyed)
    assert panel.budget.isEnabled()
    session = window.engine.session()
    context = window.model.max_context
    chunk = panel.settings().chunk
    # the slider can only make valid budgets: whole chunks, at most the context
    assert panel.budget.slider.maximum() * chunk <= context
    assert panel.budget.slider.minimum() * chunk == 2 * chunk
    panel.budget.slider.setValue(24)  # 24 chunks
    panel.flush()
    wanted = 24 * chunk
    qtbot.waitUntil(lambda: session.settings.budget == wanted, timeout=5_000)
    assert panel.budget.value.text() == f"{wanted:,} tokens"
    # the next rebuild (a new question) uses it
    panel.max_new.setValue(8)
    panel.flush()
    with qtbot.waitSignal(window.answerFinished, timeout=60_000) as answered:
        _ask(qtbot, window, "Where are they?")
    retrieval = next(c for c in answered.args[0].metrics.caches if c.name == "retrieval")
    assert f"budget {wanted}" in retrieval.detail
    assert f"budget={wanted}" in answered.args[0].metrics.settings_summary
    # changing the chunk snaps the budget to a multiple of the new chunk
    panel.chunk.slider.setValue(panel.chunk.slider.value() + 1)
    panel.flush()
    s = panel.settings()
    assert s.budget % s.chunk == 0 and s.budget <= context
    qtbot.waitUntil(lambda: session.settings.chunk == s.chunk and session.settings.budget == s.budget, timeout=5_000)


def test_bad_file_shows_message_and_changes_nothing(qtbot, make_window, tiny_model, tmp_path, shots):
    window = make_window(tiny_model)
    bad = tmp_path / "photo.png"
    bad.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 8)
    chats_before = window.repo.list_chats()
    with qtbot.waitSignal(window.errorShown, timeout=30_000) as shown:
        drop_files(window, [bad])
    assert "photo.png" in shown.args[0]
    shots(window, "tiny-error")
    assert window.chips.chips == [] and window.documents.items == []
    assert window.repo.list_chats() == chats_before and window.chat_id is None
    assert window.chat_view.messages[-1].role == "error"
    assert not window.prefill_strip.isVisible()
    assert window.composer.edit.isEnabled() and not window.is_busy()


def test_document_too_long_for_the_context_says_so_with_numbers(qtbot, make_window, tiny_model, sample_text,
                                                                  tmp_path):
    window = make_window(tiny_model)
    big = _doc(tmp_path, sample_text, 120_000, "hamlet.md")  # ~30K tokens > 8K context
    with qtbot.waitSignal(window.errorShown, timeout=60_000) as shown:
        window.attach_file(str(big))
    message = shown.args[0]
    # one sentence that starts with a capital, names the file and gives the numbers
    assert message.startswith("“hamlet.md” was not added") and "8,192" in message
    needed = int(re.search(r"= ([\d,]+)", message).group(1).replace(",", ""))  # prompt + answer
    box = window._overflow_box
    labels = [b.text() for b in box.buttons()]
    assert box.isVisible() and "hamlet.md" in box.windowTitle() and box.text() == message
    assert ". The conversation needs" in message  # the engine's sentence, starting with a capital
    assert labels.count("Choose another model…") == 1 and "New chat" in labels
    assert "Shorter answer…" not in labels  # the prompt alone is over 8,192: a shorter answer cannot help
    assert "model" not in box.informativeText().lower()  # the ways out are the buttons, listed once
    # "Choose another model…" plans for the context needed, rounded up to a power of two
    next(b for b in box.buttons() if b.text() == "Choose another model…").click()
    qtbot.waitUntil(lambda: getattr(window, "_picker", None) is not None and window._picker.isVisible())
    wanted = 1 << (needed - 1).bit_length()
    assert needed <= wanted < 2 * needed and window._picker.context.value() == wanted
    window._picker.reject()
    assert window.chips.chips == [] and window.repo.list_chats() == []


def test_closing_mid_answer_keeps_the_partial_answer(qtbot, make_window, tiny_model):
    window = make_window(tiny_model)
    window.settings_panel.max_new.setValue(4000)
    window.settings_panel.flush()
    _ask(qtbot, window, "Talk for a long time.")
    qtbot.waitUntil(lambda: len(window.chat_view.streaming_text()) > 10, timeout=60_000)
    chat_id = window.chat_id
    window.close()  # cancels, saves what came out, stops the engine thread
    assert not window.engine.thread.isRunning()
    again = make_window(None)
    stored = again.repo.messages(chat_id)
    assert [m.role for m in stored] == ["user", "assistant"]
    assert stored[1].text and stored[1].stats.get("partial") is True


def test_edit_a_past_question_replaces_what_followed_it(qtbot, make_window, tiny_model, monkeypatch, shots):
    window = make_window(tiny_model)
    window.settings_panel.max_new.setValue(6)
    window.settings_panel.flush()
    for question in ("Who is Horatio?", "And Marcellus?"):
        with qtbot.waitSignal(window.answerFinished, timeout=60_000):
            _ask(qtbot, window, question)
    assert [m.role for m in window.repo.messages(window.chat_id)] == ["user", "assistant"] * 2
    user_bubbles = [w for w in window.chat_view.messages if w.role == "user"]
    assert len(user_bubbles) == 2
    edit_buttons = [w.edit_button for w in window.chat_view._widgets if w.message.role == "user"]
    assert all(not b.isHidden() for b in edit_buttons)
    shots(window, "edit-question")

    # Cancel in the dialog changes nothing
    from PySide6.QtWidgets import QInputDialog
    monkeypatch.setattr(QInputDialog, "getMultiLineText", lambda *a, **k: ("ignored", False))
    window.chat_view.editRequested.emit(0)
    assert len(window.repo.messages(window.chat_id)) == 4 and len(window.messages) == 4

    # OK: the first question is replaced, everything after it goes (view, store, engine prompt)
    monkeypatch.setattr(QInputDialog, "getMultiLineText", lambda *a, **k: ("Who is Bernardo?", True))
    with qtbot.waitSignal(window.answerFinished, timeout=60_000) as done:
        edit_buttons[0].click()
    assert done.args[0].reason in (FinishReason.EOS, FinishReason.LENGTH, FinishReason.STOP)
    stored = window.repo.messages(window.chat_id)
    assert [(m.role, m.text) for m in stored][0] == ("user", "Who is Bernardo?")
    assert [m.role for m in stored] == ["user", "assistant"]
    assert [m.role for m in window.messages] == ["user", "assistant"]
    assert [(m.role, m.text) for m in window.chat_view.messages if m.role == "user"] == [("user", "Who is Bernardo?")]
    assert "Marcellus" not in window.chat_view.all_text()


def test_backend_loads_weights_and_kv_where_a_two_card_plan_says(tiny_model_dir):
    """The app's backend path on a CUDA machine, with the CPU standing in for both cards: a
    tensor-parallel plan loads a split runner and the session gets a sharded cache."""
    import dataclasses

    from app.worker import EngineBackend
    from engine.kv.sharded import ShardedFullCache
    from engine.events import ChatMessage
    from engine.model.loading import load_folder
    from engine.offload.shapes import ModelShape
    from engine.offload.planner import DeviceSpec, GpuSpec, plan_placement
    from engine.model.runner_tp import TensorParallelRunner
    from engine.settings import DecodeSettings

    folder = tiny_model_dir("llama", num_hidden_layers=3, num_attention_heads=8, num_key_value_heads=4,
                            intermediate_size=96)
    shape = ModelShape.from_config(load_folder(folder).config, name="tiny")
    gpu = GpuSpec("test GPU", 1 << 34, 1 << 34, 1000.0, 25.0)
    spec = DeviceSpec("test", 1 << 36, 1 << 36, gpus=(gpu, gpu), allreduce_us=0.0)
    settings = DecodeSettings(budget=64, chunk=16, max_new_tokens=4)
    plan = plan_placement(shape, None, 2048, settings, spec, headroom_bytes=0)
    assert plan.mode == "tensor-parallel"
    on_cpu = dataclasses.replace(plan, layer_devices=("cpu+cpu",) * 3, draft_device="cpu")
    backend = EngineBackend()
    target = backend.load(folder, on_cpu)
    assert isinstance(target.runner, TensorParallelRunner) and target.where == "cpu+cpu (tensor parallel)"
    session = backend.session(target, settings, "ngram", on_cpu)
    assert isinstance(session.full, ShardedFullCache)
    session.generate([ChatMessage("user", "Hi")])
    assert session.full.length == len(session.held) > 0 and all(p.length == session.full.length
                                                                 for p in session.full.parts)


def test_a_pdf_shows_its_pages_being_read(qtbot, make_window, tiny_model, tmp_path):
    from tests.test_documents import make_pdf

    window = make_window(tiny_model)
    pdf = make_pdf(tmp_path / "manual.pdf", [f"Section {i}: keep the valve closed." for i in range(1, 7)])
    strip, shown = window.prefill_strip, []
    update = strip.update_reading

    def recording(name, done, total):
        update(name, done, total)
        shown.append((strip.label.text(), strip.numbers.text(), strip.bar.value()))

    strip.update_reading = recording
    drop_files(window, [pdf])
    qtbot.waitUntil(lambda: len(window.chips.chips) == 1 and not window.is_busy(), timeout=60_000)
    assert shown[0][:2] == ("Reading manual.pdf", "page 1 / 6")  # the first page, then at most every 0.1 s
    assert shown[-1] == ("Reading manual.pdf", "page 6 / 6", 1000)  # and always the last
