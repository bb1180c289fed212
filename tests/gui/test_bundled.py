"""The app on the real bundled SmolLM2-135M (realistic speed and text): cancel mid-prefill, then
a document and a streamed answer with the panels live. Also writes the main screenshots."""
from __future__ import annotations

from pathlib import Path

import pytest
from PySide6.QtCore import Qt

from app.job_messages import TokenBatch
from engine.events import FinishReason, PrefillProgress
from tests.gui.helpers import drop_files

pytestmark = [pytest.mark.gui, pytest.mark.bundled]


@pytest.mark.alone  # it times the GUI thread
def test_cancel_prefill_then_answer_with_live_panels(qtbot, make_window, sample_text, tmp_path: Path, shots,
                                                     heartbeat):
    window = make_window("bundled")
    shots(window, "empty")
    window.settings_panel.max_new.setValue(32)
    window.settings_panel.flush()
    long_doc = tmp_path / "hamlet.md"
    long_doc.write_text(sample_text[:2_600], encoding="utf-8")  # ~700 tokens: three prefill chunks on the CPU

    # cancel mid-prefill: the document goes away, nothing is stored, the GUI never stalls
    progress: list[PrefillProgress] = []
    window.engine.engineEvent.connect(lambda _j, ev: progress.append(ev) if isinstance(ev, PrefillProgress) else None)
    heartbeat.start()
    with qtbot.waitSignal(window.prefillFinished, timeout=60_000) as cancelled:
        drop_files(window, [long_doc])
        qtbot.waitUntil(lambda: any(0 < p.done < p.total for p in progress), timeout=30_000)
        assert window.prefill_strip.isVisible() and len(window.chips.chips) == 1
        assert "/ " in window.prefill_strip.numbers.text()
        heartbeat.pause()  # grabbing the window is the test's own work on the GUI thread
        shots(window, "document-loading")
        heartbeat.resume()
        qtbot.mouseClick(window.prefill_strip.cancel, Qt.MouseButton.LeftButton)
    heartbeat.stop()
    assert cancelled.args[0].reason == FinishReason.CANCELLED
    assert progress[-1].done < progress[-1].total
    assert window.chips.chips == [] and window.documents.items == [] and window.repo.list_chats() == []
    qtbot.waitUntil(lambda: not window.is_busy(), timeout=5_000)
    assert not window.prefill_strip.isVisible()
    assert heartbeat.max_gap_ms < 100, f"GUI thread blocked {heartbeat.max_gap_ms:.0f} ms during the prefill"
    note = window.chat_view._widgets[-1]
    assert note.message.role == "notice" and "Stopped reading" in note.message.text
    qtbot.mouseClick(note.dismiss_button, Qt.MouseButton.LeftButton)  # notes and errors can be dismissed
    assert window.chat_view.messages == []

    # a short document, then a question: the answer streams with the panels live
    short_doc = tmp_path / "hamlet-opening.md"
    short_doc.write_text(sample_text[:1_100], encoding="utf-8")
    with qtbot.waitSignal(window.prefillFinished, timeout=60_000) as ready:
        window.attach_file(str(short_doc))
    assert ready.args[0].reason != FinishReason.CANCELLED and len(window.chips.chips) == 1
    streamed: list[str] = []  # the answer as the GUI thread received it, batch by batch
    window.engine.engineEvent.connect(lambda _j, ev: streamed.append(ev.text) if isinstance(ev, TokenBatch) else None)
    with qtbot.waitSignal(window.answerFinished, timeout=120_000) as answered:
        window.composer.set_text("Who is on guard at the start of the play, and who relieves him?")
        qtbot.keyClick(window.composer.edit, Qt.Key.Key_Return)
        # the screenshot wants a dozen words on screen mid-answer; the answer's length depends on the
        # CPU's float rounding (another CPU's greedy answer can be shorter), so its end also does
        qtbot.waitUntil(lambda: len(window.chat_view.streaming_text().split()) >= 12 or answered.signal_triggered,
                        timeout=60_000)
        qtbot.waitUntil(lambda: window.acceptance_panel.stats["decode"].text() != "–", timeout=30_000)
        shots(window, "answering")
    finished = answered.args[0]
    assert finished.text.strip() and finished.metrics.new_tokens > 0
    assert streamed and "".join(streamed) == finished.text  # every token reached the view before the end
    assert window.cache_panel.full.fraction() > 0
    stored = window.repo.messages(window.chat_id)
    assert [m.role for m in stored] == ["user", "assistant"] and stored[1].text == finished.text
    window.settings_panel.color_levels.setChecked(True)
    shots(window, "answer-coloured-by-level")
    window.show_settings()
    shots(window, "settings")
    window.right.setCurrentIndex(0)
    window.settings_panel.color_levels.setChecked(False)
    # a file that cannot be read: its message, and nothing else changes
    bad = tmp_path / "scan.pdf"
    bad.write_bytes(b"%PDF-1.4\n%broken\n")
    with qtbot.waitSignal(window.errorShown, timeout=30_000):
        window.attach_file(str(bad))
    assert len(window.chips.chips) == 1 and len(window.repo.messages(window.chat_id)) == 2
    shots(window, "error")
