"""What a new user tripped on in the app (issue 70): cited passages kept with the answer and shown on
reopen and in exports, Load refused for a GPU this machine lacks, banners that clear with their
cause, the first-token time counting the reading, the Live panel and meter of a fresh start."""
from __future__ import annotations

import json

from app.passages_fit import CitedPassage, PassagesUsed
from engine.events import Finished, FinishReason
from engine.store.chat_schema import MIGRATIONS
from engine.store.chats import ChatStore
from tests.gui.fakes import FakeBackend
from tests.gui.test_controller import rig  # noqa: F401 - a fixture: a controller on a recording view

CITED = (CitedPassage("Hamlet", "Act 5, Scene 2", "QUEEN. No, no, the drink",
                      "QUEEN. No, no, the drink, the drink! O my dear Hamlet! The drink, the drink! I am poison'd."),
         CitedPassage("Hamlet", "Act 1, Scene 5", "GHOST. I am thy father's spirit",
                      "GHOST. I am thy father's spirit, doom'd for a certain term to walk the night."))


def _used(passages=CITED) -> PassagesUsed:
    return PassagesUsed(tuple(passages), 2400, 8000, (("Hamlet", "passages", 2300),))


def test_cited_passages_are_stored_with_the_answer_and_exported(rig):  # noqa: F811
    controller, _view, engine, repo = rig
    controller.send("What happens when the Queen drinks?")
    job = len(engine.jobs)
    controller.on_engine_event(job, _used())
    controller.on_engine_event(job, Finished(FinishReason.EOS, "She is poisoned."))
    controller.on_job_done(job)
    question, answer = repo.messages(controller.chat_id)
    assert question.passages is None
    assert [p["label"] for p in answer.passages] == ["Act 5, Scene 2", "Act 1, Scene 5"]
    assert answer.passages[0]["text"].endswith("I am poison'd.")

    markdown = repo.export(controller.chat_id, "markdown")
    assert "Answered from 2 passages of “Hamlet”" in markdown
    assert "- **Hamlet, Act 5, Scene 2:** QUEEN. No, no, the drink" in markdown
    assert markdown.index("She is poisoned.") < markdown.index("Act 5, Scene 2")
    exported = json.loads(repo.export(controller.chat_id, "json"))
    assert "passages" not in exported["messages"][0]
    assert exported["messages"][1]["passages"][1] == {
        "document": "Hamlet", "label": "Act 1, Scene 5", "first_words": "GHOST. I am thy father's spirit",
        "text": CITED[1].text}


def test_a_store_from_before_passages_opens_and_upgrades(tmp_path):
    path = tmp_path / "chats.db"
    old = ChatStore(path, migrations=MIGRATIONS[:3])
    chat = old.create_chat("Before")
    old.add_message(chat.id, "user", "Hi")
    old.add_message(chat.id, "assistant", "Hello")
    old.close()
    store = ChatStore(path)
    assert store.schema_version == 4 and [m.passages for m in store.messages(chat.id)] == [None, None]
    answer = store.update_message(chat.id, 1, passages=CITED[:1])
    assert answer.passages == ({"document": "Hamlet", "label": "Act 5, Scene 2",
                                "first_words": CITED[0].first_words, "text": CITED[0].text},)
    assert "Answered from" not in store.export_markdown(chat.id).split("## Assistant")[0]
    store.close()
    assert (tmp_path / "chats.db.v3.bak").exists()  # the upgrade kept a copy


def test_passages_are_listed_again_when_the_chat_is_reopened(qtbot, make_window):
    window = make_window("fake-model", backend=FakeBackend(step_s=0.05, tokens=8))
    with qtbot.waitSignal(window.answerFinished, timeout=10_000):
        window.send("What happens when the Queen drinks?")
        window.engine.engineEvent.emit(window.controller.jobs.stream, _used())  # as the worker sends it
    live = window.chat_view.passage_lists
    assert len(live) == 1 and [link.text() for link in live[0].links]
    live_lines = [link.text() for link in live[0].links]
    chat_id = window.chat_id

    window.new_chat()
    assert window.chat_view.passage_lists == []
    window.open_chat(chat_id)
    (reopened,) = window.chat_view.passage_lists
    assert [link.text() for link in reopened.links] == live_lines
    assert reopened.passages == CITED
    reopened.links[0].click()
    qtbot.waitUntil(lambda: window.passages.dialog is not None and window.passages.dialog.isVisible())
    assert "Act 5, Scene 2" in window.passages.dialog.windowTitle()
    window.passages.dialog.close()


def test_an_answer_whose_passages_matched_nothing_says_so_on_reopen(qtbot, make_window):
    window = make_window("fake-model", backend=FakeBackend(step_s=0.05, tokens=4))
    with qtbot.waitSignal(window.answerFinished, timeout=10_000):
        window.send("xyzzy?")
        window.engine.engineEvent.emit(window.controller.jobs.stream, _used(()))
    chat_id = window.chat_id
    window.new_chat()
    window.open_chat(chat_id)
    (reopened,) = window.chat_view.passage_lists
    assert reopened.passages == () and reopened.links == []


def _pick(dialog, spec: str) -> None:
    from PySide6.QtCore import Qt
    for i in range(dialog.list.count()):
        c = dialog.list.item(i).data(Qt.ItemDataRole.UserRole)
        if c is not None and c.spec == spec:
            dialog.list.setCurrentRow(i)


def test_load_is_refused_for_a_plan_made_for_a_gpu_this_machine_lacks(qtbot, monkeypatch):
    from app import model_picker
    monkeypatch.setattr(model_picker, "gpus_here", lambda: 0)  # a CPU-only machine
    dialog = model_picker.ModelPicker(current="bundled")
    qtbot.addWidget(dialog)
    dialog.show()
    chosen = []
    dialog.modelChosen.connect(lambda spec, draft: chosen.append(spec))
    _pick(dialog, "meta-llama/Llama-3.1-8B-Instruct")
    dialog.profile.setCurrentIndex(dialog.profile.findData("4090"))
    qtbot.waitUntil(lambda: "cuda:0" in dialog.plan_text.toPlainText(), timeout=10_000)  # the plan is still made
    qtbot.waitUntil(lambda: not dialog.load_button.isEnabled(), timeout=5_000)
    assert "this computer has no GPU" in dialog.verdict.text() and "One RTX 4090" in dialog.verdict.text()
    assert dialog.load_button.toolTip() and "no GPU" in dialog.load_button.toolTip()
    dialog.load_button.click()
    dialog._on_load()  # Enter on the dialog: nothing loads either
    assert chosen == []
    # planning for two cards on a one-card machine: refused too
    monkeypatch.setattr(dialog, "_gpu_count", 1)
    dialog.profile.setCurrentIndex(dialog.profile.findData("4090x2"))
    qtbot.waitUntil(lambda: "this computer has 1 GPU," in dialog.verdict.text(), timeout=10_000)
    assert not dialog.load_button.isEnabled()
    # this machine's own profile loads what fits
    _pick(dialog, "bundled")
    dialog.profile.setCurrentIndex(dialog.profile.findData("cpu"))
    qtbot.waitUntil(lambda: dialog.verdict.text().startswith("Fits ("), timeout=10_000)
    assert dialog.load_button.isEnabled() and dialog.load_button.toolTip() == ""


def _banners(window) -> list[str]:
    return [w.message.text for w in window.chat_view._widgets if w.message.role in ("error", "notice")]


def test_the_not_added_banner_goes_once_the_book_is_added_as_passages(qtbot, make_window, tmp_path):
    window = make_window("fake-model", backend=FakeBackend(max_context=8192))
    book = tmp_path / "othello.md"
    book.write_text("Put out the light, and then put out the light. " * 1200, encoding="utf-8")  # ~14K tokens
    with qtbot.waitSignal(window.errorShown, timeout=10_000):
        window.attach_file(str(book))
    qtbot.waitUntil(lambda: window._overflow_box is not None and window._overflow_box.isVisible())
    assert any("“othello.md” was not added" in text for text in _banners(window))
    with qtbot.waitSignal(window.prefillFinished, timeout=10_000):
        next(b for b in window._overflow_box.buttons() if b.text() == "Answer from the most relevant passages").click()
    qtbot.waitUntil(lambda: len(window.chips.chips) == 1)
    assert window.chips.chips[0].fit == "passages"
    assert _banners(window) == []


def test_the_stopped_reading_note_goes_once_the_document_is_attached_again(qtbot, make_window, tmp_path):
    window = make_window("fake-model", backend=FakeBackend(prefill_step_s=0.05))
    doc = tmp_path / "notes.md"
    doc.write_text("word " * 4000, encoding="utf-8")  # 20 prefill steps
    with qtbot.waitSignal(window.prefillFinished, timeout=10_000):
        window.attach_file(str(doc))
        qtbot.waitUntil(lambda: len(window.chips.chips) == 1)  # read and counted; now being prefilled
        window.stop()
    assert any(text.startswith("Stopped reading “notes”") for text in _banners(window))
    with qtbot.waitSignal(window.prefillFinished, timeout=10_000) as done:
        window.attach_file(str(doc))
    assert done.args[0].reason == FinishReason.STOP and len(window.chips.chips) == 1
    assert _banners(window) == []


def test_a_model_load_error_goes_once_a_model_loads(qtbot, make_window):
    window = make_window("fake-model", backend=FakeBackend())
    window.controller.view.show_error("Could not load the model: no such repo", about=("model",))
    window.show_error("Something unrelated went wrong")
    with qtbot.waitSignal(window.modelReady, timeout=10_000):
        window.load_model("fake-model")
    assert _banners(window) == ["Something unrelated went wrong"]


def _seconds(footer: str, label: str) -> float:
    import re
    m = re.search(rf"{label} (\d+(?:\.\d+)?) (ms|s)\b", footer)
    assert m, f"no “{label} …” in {footer!r}"
    return float(m.group(1)) / (1000 if m.group(2) == "ms" else 1)


def test_the_first_token_time_counts_the_reading_of_a_fresh_document(qtbot, make_window, tmp_path):
    window = make_window("fake-model", backend=FakeBackend(prefill_step_s=0.05, tokens=6))
    doc = tmp_path / "play.md"
    doc.write_text("word " * 4000, encoding="utf-8")  # 5,000 tokens: 20 reading steps of 0.05 s
    with qtbot.waitSignal(window.answerFinished, timeout=20_000):
        window.attach_file(str(doc))
        qtbot.waitUntil(lambda: len(window.chips.chips) == 1)  # read and counted: now being prefilled
        window.send("What is it about?")  # asked while the document is still being read
    assert window.title_label.text() == "play"  # the chat is named after its document, not the question
    footer = window.chat_view._chat_widgets()[-1].message.footer
    read, first = _seconds(footer, "document read"), _seconds(footer, "first token")
    assert read >= 1.0  # the document's reading, as the engine timed it
    assert first > read  # from the question: the reading it waited for is in it (the engine alone says 0.42 s)
    assert footer.index("read") < footer.index("first token")
    stored = window.repo.messages(window.chat_id)[-1]
    assert stored.stats["footer"] == footer  # the same footer on reopen
    # the next answer has nothing fresh to read: no reading time, and its own first token
    with qtbot.waitSignal(window.answerFinished, timeout=20_000):
        window.send("And then?")
    again = window.chat_view._chat_widgets()[-1].message.footer
    assert "document read" not in again and again.startswith("prompt: ")  # the fake engine reads it all again
    assert footer.startswith("document read ")


def test_an_answer_from_passages_says_where_its_time_went(qtbot, make_window):
    window = make_window("fake-model", backend=FakeBackend(prefill_step_s=0.02, tokens=4))
    with qtbot.waitSignal(window.answerFinished, timeout=10_000):
        window.send("What happens when the Queen drinks?")
        window.engine.engineEvent.emit(window.controller.jobs.stream, _used())
    footer = window.chat_view._chat_widgets()[-1].message.footer
    assert "chose 2 passages in " in footer and "first token " in footer


def _live_numbers(window) -> dict[str, str]:
    return {name: label.text() for name, label in window.acceptance_panel.stats.items()}


def test_the_live_panel_clears_after_a_cancelled_read_and_an_early_stop(qtbot, make_window, tmp_path):
    window = make_window("fake-model", backend=FakeBackend(prefill_step_s=0.05, tokens=6))
    with qtbot.waitSignal(window.answerFinished, timeout=10_000):
        window.send("Hello?")
    assert _live_numbers(window)["decode"] == "38.5"  # the answer's numbers
    doc = tmp_path / "notes.md"
    doc.write_text("word " * 4000, encoding="utf-8")
    with qtbot.waitSignal(window.prefillFinished, timeout=10_000) as read:
        window.attach_file(str(doc))
        qtbot.waitUntil(lambda: window.cache_panel.full.fraction() > 0)  # the bar fills as it reads
        window.stop()
    assert read.args[0].reason == FinishReason.CANCELLED
    assert set(_live_numbers(window).values()) == {"–"} and window.cache_panel.full.fraction() == 0

    with qtbot.waitSignal(window.answerFinished, timeout=10_000):
        window.send("Hello again?")
    assert _live_numbers(window)["decode"] == "38.5"
    window.attach_file(str(doc))  # prefilled by the next question's own reading
    qtbot.waitUntil(lambda: len(window.chips.chips) == 1, timeout=10_000)
    with qtbot.waitSignal(window.answerFinished, timeout=10_000) as stopped:
        window.send("Slowly?")
        window.stop()  # Esc before the first token
    assert stopped.args[0].reason == FinishReason.CANCELLED
    assert window.chat_view._chat_widgets()[-1].message.text == ""
    assert set(_live_numbers(window).values()) == {"–"}


def test_a_new_chat_shows_its_own_empty_meter(qtbot, make_window, tmp_path):
    window = make_window("fake-model", backend=FakeBackend())
    doc = tmp_path / "notes.md"
    doc.write_text("word " * 4000, encoding="utf-8")  # 5,000 tokens
    with qtbot.waitSignal(window.prefillFinished, timeout=10_000):
        window.attach_file(str(doc))
    meter = window.context_meter
    qtbot.waitUntil(lambda: meter.budget is not None and meter.budget.used > 5000)
    window.new_action.trigger()  # File > New chat (Ctrl+N)
    assert window.chips.chips == []
    assert meter.budget is not None and meter.budget.used < 1000, meter.text()
    assert not any(p.kind == "document" for p in meter.budget.parts)


# --- the smaller things -------------------------------------------------------------------------------

def test_a_long_passage_line_is_cut_with_an_ellipsis(qtbot):
    from PySide6.QtWidgets import QVBoxLayout, QWidget

    from app.passages_view import PassagesList
    long = CitedPassage("Hamlet", "Act 3, Scene 1", "To be, or not to be, that is the question: " * 4, "text")
    holder = QWidget()
    qtbot.addWidget(holder)
    QVBoxLayout(holder).addWidget(listing := PassagesList([long, CITED[0]]))
    holder.resize(320, 200)
    holder.show()
    qtbot.waitUntil(lambda: listing.links[0].width() > 0)
    cut, whole = listing.links
    assert cut.width() <= holder.width()  # the line does not widen the bubble
    assert cut.shown_text().endswith("…") and cut.shown_text().startswith("Act 3, Scene 1 — To be")
    assert cut.text() == f"Act 3, Scene 1 — {long.first_words}"  # the whole line stays the button's text


def test_the_passage_viewer_renders_markdown_under_a_heading(qtbot):
    from PySide6.QtWidgets import QTextBrowser, QWidget

    from app.passages_view import show_passage
    parent = QWidget()
    qtbot.addWidget(parent)
    passage = CitedPassage("Hamlet", "Act 5, Scene 2", "QUEEN.", "**QUEEN.** No, no, the drink, *the drink*!")
    dialog = show_passage(parent, passage)
    doc = dialog.findChild(QTextBrowser).document()
    first = doc.begin()
    assert first.text() == "Hamlet — Act 5, Scene 2" and first.blockFormat().headingLevel() == 2
    text = doc.toPlainText()
    assert "**" not in text and "QUEEN. No, no, the drink, the drink!" in text
    body = first.next()
    assert body.begin().fragment().charFormat().fontWeight() >= 600  # **QUEEN.** is bold
    dialog.close()


def test_answers_reopened_before_the_model_loads_are_labelled_with_the_model(qtbot, make_window, triforce_home):
    store = ChatStore()  # the app's store under TRIFORCE_HOME
    chat = store.create_chat("Cut off").id
    store.add_message(chat, "user", "What does the ghost ask?")
    store.add_message(chat, "assistant", "Revenge for his", state="interrupted")
    store.close()
    window = make_window("fake-model", backend=FakeBackend(), wait=False)
    assert window.chat_id == chat  # opened at start, with Retry, before any model
    qtbot.waitUntil(lambda: window.model is not None, timeout=10_000)
    answer = window.chat_view._chat_widgets()[-1]
    assert answer.message.role == "assistant" and answer.header.text() == "FakeLM-1M"


def test_export_says_where_it_wrote(qtbot, make_window, tmp_path):
    window = make_window("fake-model", backend=FakeBackend(tokens=3))
    with qtbot.waitSignal(window.answerFinished, timeout=10_000):
        window.send("Hi there")
    target = tmp_path / "chat.md"
    window.controller.export(window.chat_id, "markdown", str(target))
    assert target.read_text(encoding="utf-8").startswith("# Hi there")
    assert window.statusBar().currentMessage() == f"Exported “Hi there” as Markdown to {target}"


def test_a_long_chat_title_does_not_narrow_the_chat_list(qtbot, make_window):
    window = make_window("fake-model", backend=FakeBackend(tokens=3))
    qtbot.waitUntil(lambda: window.chat_list.width() > 0)
    before = window.splitter.sizes()
    title = "A very long question about the play " * 12
    with qtbot.waitSignal(window.answerFinished, timeout=10_000):
        window.send(title)
    window.controller.rename(window.chat_id, title.strip())
    window.title_label.setText(title.strip())
    qtbot.wait(50)  # let the layout settle (nothing is timed)
    assert window.splitter.sizes() == before
    assert window.title_label.shown_text().endswith("…")


def test_a_fixed_mode_shows_no_weighing_or_switching():
    import dataclasses

    from app.panels.acceptance_panel import summary_lines
    from engine.events import CandidateCost
    from tests.gui.fakes import FakeFolder, FakeModel, FakeSession
    from engine.settings import DecodeSettings
    base = FakeSession(FakeModel(FakeFolder()), DecodeSettings())._metrics(10)
    candidate = CandidateCost("triforce g1=2 g2=6", 41.0)
    auto = dataclasses.replace(base, mode="auto", structure="triforce g1=2 g2=6", structure_switches=1,
                               candidates=(candidate,))
    fixed = dataclasses.replace(auto, mode="triforce")
    assert any(line.startswith("weighed: ") for line in summary_lines(auto)) and "switched 1×" in "".join(
        summary_lines(auto))
    lines = summary_lines(fixed)
    assert not any("weighed" in line or "switched" in line for line in lines)
    assert "running: triforce g1=2 g2=6" in lines


def test_a_library_debug_line_never_reaches_stderr():
    import io
    import logging

    from app.app_main import configure_logging
    stream = io.StringIO()
    handler = configure_logging(stream)
    try:
        import bm25s  # noqa: F401 - turns its own logger to DEBUG when imported
        logging.getLogger("bm25s").debug("Building index from tokens")
        logging.getLogger("bm25s").warning("a real warning")
    finally:
        logging.getLogger().removeHandler(handler)
    assert "DEBUG" not in stream.getvalue() and "a real warning" in stream.getvalue()


def test_the_composer_scrollbar_handle_is_not_black(qtbot, make_window):
    from PySide6.QtGui import QColor
    window = make_window(None)
    edit = window.composer.edit
    edit.setPlainText("\n".join(f"line {i}" for i in range(60)))
    bar = edit.verticalScrollBar()
    qtbot.waitUntil(lambda: bar.isVisible() and bar.maximum() > 0)
    image = bar.grab().toImage()
    pixels = [QColor.fromRgba(image.pixel(x, y)) for x in range(image.width()) for y in range(image.height())]
    dark = sum(p.alpha() > 200 and p.lightness() < 60 for p in pixels)
    assert dark < image.width() * image.height() * 0.02  # before: a solid black handle
