"""Books that do not fit (issue 14), in the app: the refusal offers "Answer from the most relevant
passages"; the chip then says "passages"; the answer lists the passages it was given (a click shows
one); the header's context meter breaks the context down and warns before a question overflows."""
from __future__ import annotations

from PySide6.QtWidgets import QTextBrowser

from engine.events import FinishReason
from tests.conftest import SAMPLE_DIR


def test_refusal_then_passages_then_a_cited_answer(qtbot, make_window, tiny_model, tmp_path, shots):
    window = make_window(tiny_model)
    window.settings_panel.max_new.setValue(16)
    window.settings_panel.flush()
    book = SAMPLE_DIR / "hamlet.md"  # the whole play, ~57K tokens, against an 8,192-token context

    with qtbot.waitSignal(window.errorShown, timeout=60_000):
        window.attach_file(str(book))
    box = window._overflow_box
    qtbot.waitUntil(box.isVisible)
    labels = [b.text() for b in box.buttons()]
    assert "Answer from the most relevant passages" in labels and "Choose another model…" in labels
    assert window.chips.chips == []  # nothing was added yet
    shots(box, "overflow-passages")

    with qtbot.waitSignal(window.prefillFinished, timeout=60_000) as done:
        next(b for b in box.buttons() if b.text() == "Answer from the most relevant passages").click()
    assert done.args[0].reason != FinishReason.ERROR
    qtbot.waitUntil(lambda: len(window.chips.chips) == 1, timeout=10_000)
    chip = window.chips.chips[0]
    assert chip.fit == "passages" and chip.fit_label.text() == "passages" and chip.tokens > 40_000
    stored = window.repo.store.chat_documents(window.chat_id, with_text=False)
    assert [d.fit for d in stored] == ["passages"]  # kept with the chat

    # the meter: used / total, and a breakdown with the document as passages and the reserve
    meter = window.context_meter
    assert meter.isVisible() and meter.text().endswith("/ 8,192 tokens") and not meter.budget.overflows
    lines = [a.text() for a in meter.breakdown.actions()]
    assert any(line.startswith("“Hamlet” (passages)") for line in lines)
    assert any(line.startswith("Reserve for the answer: 16 tokens") for line in lines)

    with qtbot.waitSignal(window.answerFinished, timeout=120_000) as finished:
        window.send("In the fencing match, what happens when the Queen drinks from the poisoned cup?")
    assert finished.args[0].reason in (FinishReason.EOS, FinishReason.LENGTH, FinishReason.STOP)
    listing = window.passages.lists[-1]
    cited = listing.passages
    assert 3 <= len(cited) and all(p.document == "Hamlet" for p in cited)
    assert any("I am poison'd" in p.text for p in cited)  # the passage that names the answer is cited
    assert listing.isVisible() and len(listing.links) == len(cited)
    assert listing.links[0].text().startswith(cited[0].label + " — ")
    # the engine measured the real prompt: within the context, with the answer's reserve kept free
    last = window.passages.last
    assert 2_000 < last.prompt_tokens <= last.limit == 8192 - 16 - 64
    assert len(window.engine.session().held) < 8192  # the session got the passages, not the whole play
    assert "≈" not in meter.breakdown.actions()[1].text()  # the passages' size is now the measured one
    shots(window, "answer-with-passages")

    # a click shows the passage
    target = next(i for i, p in enumerate(cited) if "I am poison'd" in p.text)
    listing.links[target].click()
    qtbot.waitUntil(lambda: window.passages.dialog is not None and window.passages.dialog.isVisible())
    body = window.passages.dialog.findChild(QTextBrowser)
    assert "I am poison'd" in body.toPlainText() and cited[target].label in window.passages.dialog.windowTitle()
    shots(window.passages.dialog, "passage-shown")
    window.passages.dialog.close()


def test_the_meter_warns_while_a_question_is_too_long(qtbot, make_window, tmp_path):
    from tests.gui.fakes import FakeBackend

    window = make_window("fake-model", backend=FakeBackend(max_context=8192))
    doc = tmp_path / "notes.md"
    doc.write_text("word " * 4000, encoding="utf-8")  # 5,000 tokens (the fake counts 4 characters a token)
    with qtbot.waitSignal(window.prefillFinished, timeout=10_000):
        window.attach_file(str(doc))
    meter = window.context_meter
    qtbot.waitUntil(lambda: meter.budget is not None and meter.budget.parts[1].tokens == 5000)
    assert not meter.budget.overflows and "⚠" not in meter.text()
    window.composer.edit.setPlainText("why? " * 2500)  # ~3,100 tokens more: over 8,192 with the answer
    assert meter.budget.overflows and meter.text().startswith("⚠")
    assert "would not fit" in meter.toolTip() and "too many" in meter.breakdown.actions()[-1].text()
    window.composer.edit.setPlainText("Short question?")
    assert not meter.budget.overflows
