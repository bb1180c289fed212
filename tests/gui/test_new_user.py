"""What a new user tripped on (issue 13, app half), each fixed and pinned on the scripted engine:
the menu bar and Ctrl+Q, the wheel over the Settings panel, Stop before the first token, a
question cut off by a crash, placeholder PDF titles, export names, the overflow dialog, the Live
panel between chats, and the model picker."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from PySide6.QtCore import QPoint, QPointF, Qt
from PySide6.QtGui import QKeySequence, QWheelEvent
from PySide6.QtWidgets import QApplication, QFileDialog

from app.overflow import overflow_from
from engine.events import DocumentText, FinishReason
from tests.gui.fakes import FakeBackend
from tests.gui.helpers import drop_files

pytestmark = pytest.mark.gui
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def fake_window(make_window):
    return lambda **kw: make_window("fake-model", backend=FakeBackend(**kw))


def test_the_controller_needs_no_qt_widgets():
    code = ("import sys, app.chat_controller, app.jobs, app.overflow, app.chat_naming\n"
            "print(sorted(m for m in sys.modules if m.startswith(('PySide6.Qt', 'pyqtgraph'))))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_menu_bar_quit_and_about(qtbot, fake_window, monkeypatch, triforce_home, shots):
    window = fake_window(tokens=2)
    menus = {a.text().replace("&", ""): [x.text() for x in a.menu().actions() if x.text()]
             for a in window.menuBar().actions()}
    assert list(menus) == ["File", "Chat", "Help"]
    assert menus["File"] == ["New chat", "Attach…", "Export chat…", "Quit"]
    assert menus["Chat"] == ["Regenerate answer", "Stop", "Settings"] and menus["Help"] == ["About TriForce Chat"]
    assert window.quit_action.shortcut() == QKeySequence("Ctrl+Q")
    chat_menu = window.menuBar().actions()[1].menu()
    chat_menu.aboutToShow.emit()  # idle, no answer: Stop and Regenerate are greyed out in the open menu
    assert not window.stop_action.isEnabled() and not window.regenerate_action.isEnabled()
    chat_menu.aboutToHide.emit()  # closed: their shortcuts (Esc, Ctrl+R) work again
    assert window.stop_action.isEnabled() and window.regenerate_action.isEnabled()
    from app.window_menus import about_text
    about = about_text()
    for needle in ("Python", "torch", "Qt", "PySide6", str(triforce_home), "0.1.0"):
        assert needle in about, needle
    window.show_about()
    assert window._about.isVisible() and "torch" in window._about.text()
    shots(window._about, "about")
    window._about.close()
    window.activateWindow()  # a window shortcut needs its window active
    qtbot.waitUntil(window.isActiveWindow)
    qtbot.keyClick(window, Qt.Key.Key_Q, Qt.KeyboardModifier.ControlModifier)
    qtbot.waitUntil(lambda: not window.isVisible())
    assert not window.engine.thread.isRunning()  # closed the proper way: engine stopped, store closed


def _wheel(widget, steps: int = 3) -> None:
    pos = QPointF(widget.width() / 2, widget.height() / 2)
    for _ in range(steps):
        event = QWheelEvent(pos, widget.mapToGlobal(pos), QPoint(0, 0), QPoint(0, -120), Qt.MouseButton.NoButton,
                            Qt.KeyboardModifier.NoModifier, Qt.ScrollPhase.NoScrollPhase, False)
        QApplication.sendEvent(widget, event)


def test_the_wheel_moves_only_a_focused_control(qtbot, fake_window):
    window = fake_window()
    window.show_settings()
    panel = window.settings_panel
    panel.resize(360, 300)  # short: the panel scrolls
    slider, spin = panel.temperature.slider, panel.max_new
    assert slider.isEnabled() and spin.isEnabled()  # (a disabled control ignores the wheel anyway)
    slider.setValue(50)
    before, spin_before = slider.value(), spin.value()
    bar = panel.verticalScrollBar()
    assert bar.maximum() > 0 and bar.value() == 0
    _wheel(slider)
    _wheel(spin)
    assert slider.value() == before and spin.value() == spin_before  # scrolling passes over them
    assert bar.value() > 0  # ... to the panel, which scrolls
    assert slider.focusPolicy() == Qt.FocusPolicy.StrongFocus  # the wheel alone never focuses one
    window.activateWindow()
    qtbot.waitUntil(window.isActiveWindow)
    slider.setFocus()  # as when clicked or tabbed to
    qtbot.waitUntil(slider.hasFocus)
    _wheel(slider)
    assert slider.value() != before  # a control the user clicked or tabbed to still takes the wheel


def test_stop_before_the_first_token_keeps_a_stopped_answer(qtbot, fake_window):
    window = fake_window(prefill_step_s=0.3, tokens=3)
    with qtbot.waitSignal(window.answerFinished, timeout=10_000) as stopped:
        window.send("A question stopped at once")
        window.stop()
    assert stopped.args[0].reason == FinishReason.CANCELLED and stopped.args[0].text == ""
    stored = window.repo.messages(window.chat_id)
    assert [(m.role, m.state, m.text) for m in stored] == [("user", "done", "A question stopped at once"),
                                                           ("assistant", "stopped", "")]
    answer = window.chat_view.messages[-1]
    assert answer.role == "assistant" and answer.footer == "stopped before the answer began"
    with qtbot.waitSignal(window.answerFinished, timeout=10_000):
        window.send("The next one")
    # never a bare question followed by the next question
    assert [m.role for m in window.repo.messages(window.chat_id)] == ["user", "assistant"] * 2


def test_a_question_cut_off_by_a_crash_offers_retry(qtbot, fake_window, shots):
    window = fake_window(tokens=3)
    repo = window.repo
    old = repo.create_chat("Before the crash")
    repo.add_message(old, "user", "Who is the ghost?")  # a store where no answer row followed
    cut = repo.create_chat("Killed mid-answer")
    repo.add_message(cut, "user", "Who is Ophelia?")
    repo.add_message(cut, "assistant", "Ophelia is", state="interrupted")  # marked by the store on open
    window.controller.refresh_chats()

    window.open_chat(cut)
    answer = window.chat_view._widgets[-1]
    assert answer.message.text == "Ophelia is" and "interrupted" in answer.message.footer
    qtbot.waitUntil(lambda: answer.retry_button.isVisibleTo(window))  # new bubbles show on the next event loop turn
    assert not answer.regen_button.isVisibleTo(window)
    shots(window, "interrupted-retry")

    window.open_chat(old)
    answer = window.chat_view._widgets[-1]
    assert answer.message.role == "assistant" and "interrupted" in answer.message.footer
    with qtbot.waitSignal(window.answerFinished, timeout=10_000) as done:
        answer.retry_button.click()
    assert done.args[0].reason == FinishReason.EOS
    stored = repo.messages(old)
    assert [(m.role, m.state) for m in stored] == [("user", "done"), ("assistant", "done")]
    assert stored[1].text == done.args[0].text and window.chat_view.messages[-1].text == done.args[0].text


@pytest.mark.parametrize("placeholder", ["untitled", "", "Untitled Document"])
def test_a_placeholder_title_gives_way_to_the_file_name(qtbot, make_window, tmp_path, monkeypatch, placeholder):
    backend = FakeBackend(tokens=2)
    backend.read_document = lambda path, progress=None, cancel=None: DocumentText(
        placeholder, Path(path).read_text(encoding="utf-8"), str(path))
    window = make_window("fake-model", backend=backend)
    doc = tmp_path / "lease-2024.md"
    doc.write_text("The tenant pays on the first of the month. " * 20, encoding="utf-8")
    with qtbot.waitSignal(window.prefillFinished, timeout=10_000):
        drop_files(window, [doc])
    assert [c.title for c in window.chips.chips] == ["lease-2024"]
    assert window.repo.title(window.chat_id) == "lease-2024" and window.title_label.text() == "lease-2024"
    offered = []
    monkeypatch.setattr(QFileDialog, "getSaveFileName", lambda *a, **k: offered.append(a[2]) or ("", ""))
    window.export_current()
    assert Path(offered[0]).name == "lease-2024.md"


def test_export_is_named_after_the_chat_and_marks_a_stopped_answer(qtbot, fake_window, monkeypatch, tmp_path):
    window = fake_window(step_s=0.05, tokens=200)
    with qtbot.waitSignal(window.answerFinished, timeout=10_000):
        window.send("Why does Hamlet wait? / a long answer")
        qtbot.waitUntil(lambda: len(window.chat_view.streaming_text()) > 10)
        window.stop()
    target = tmp_path / "out.md"
    offered = []
    monkeypatch.setattr(QFileDialog, "getSaveFileName", lambda *a, **k: offered.append(a) or (str(target), ""))
    window.chat_list.exportRequested.emit(window.chat_id, "markdown")
    assert Path(offered[0][2]).name == "Why does Hamlet wait- - a long answer.md"  # no "/" in a file name
    text = target.read_text(encoding="utf-8")
    assert "*(stopped by the user: partial answer)*" in text
    assert text.index("## Assistant") < text.index("partial answer")


def test_overflow_offers_a_shorter_answer_only_when_it_helps(qtbot, fake_window, tmp_path, shots):
    window = fake_window(max_context=8192)
    window.settings_panel.max_new.setValue(4000)
    window.settings_panel.flush()
    doc = tmp_path / "report.md"
    doc.write_text("x" * 24_000, encoding="utf-8")  # 6,000 tokens: fits alone, not with a 4,000-token answer
    with qtbot.waitSignal(window.errorShown, timeout=10_000) as shown:
        window.attach_file(str(doc))
    assert shown.args[0].startswith("“report.md” was not added to the chat. The conversation needs 6,000")
    box = window._overflow_box
    labels = [b.text() for b in box.buttons()]
    assert labels.count("Shorter answer…") == 1 and labels.count("Choose another model…") == 1
    qtbot.waitUntil(box.isVisible)
    shots(box, "overflow-dialog")
    next(b for b in box.buttons() if b.text() == "Shorter answer…").click()
    assert window.right.currentWidget() is window.settings_panel


def test_overflow_numbers_and_the_context_to_ask_for():
    o = overflow_from("the conversation needs 35,955 prompt tokens + 256 for the answer = 36,211, but this "
                      "model's context holds 8,192: remove a document, …", ["/books/hamlet.md"])
    assert (o.prompt_tokens, o.answer_tokens, o.context_tokens) == (35_955, 256, 8_192)
    assert o.context_to_ask_for == 65_536 and o.prompt_alone_overflows
    assert [a.key for a in o.actions()] == ["model", "passages", "new-chat"]
    assert o.text().endswith("but this model's context holds 8,192.")  # the ways out are not repeated
    o = overflow_from("the prompt is 7,000 tokens and the answer may take 2,000 more (9,000), but this model's "
                      "context holds 8,192: …", ["a.pdf", "b.pdf"])
    assert o.context_to_ask_for == 16_384 and not o.prompt_alone_overflows
    assert [a.key for a in o.actions()] == ["model", "passages", "answer-length", "new-chat"]
    assert o.title() == "“a.pdf” and “b.pdf” do not fit"


def test_live_panel_is_cleared_between_chats_and_fills_during_a_prefill(qtbot, fake_window, tmp_path):
    window = fake_window(tokens=10, prefill_step_s=0.05)
    acc, caches = window.acceptance_panel, window.cache_panel
    with qtbot.waitSignal(window.answerFinished, timeout=10_000):
        window.send("First chat")
    first = window.chat_id
    assert acc.stats["tokens"].text() == "10" and caches.full.fraction() > 0
    window.new_chat()
    assert acc.stats["tokens"].text() == "–" and caches.full.fraction() == 0
    assert all(bar.fraction() == 0 for bar in acc.bars.values())
    window.open_chat(first)
    assert acc.stats["tokens"].text() == "–"
    # the cache bars move while a document is read (not only once the answer starts)
    window.new_chat()
    doc = tmp_path / "long.md"
    doc.write_text("word " * 4000, encoding="utf-8")  # 5,000 tokens: ~20 prefill steps
    seen = []
    window.engine.engineEvent.connect(lambda _j, _ev: seen.append(caches.full.fraction()))
    with qtbot.waitSignal(window.prefillFinished, timeout=10_000):
        window.attach_file(str(doc))
    assert any(0 < f < 1 for f in seen) and max(seen) > 0.5  # 5,000 of 8,192 tokens before the answer
    # the empty plot: whole tokens from 0, acceptance 0..1, also after a cancelled prefill
    window.new_chat()
    with qtbot.waitSignal(window.prefillFinished, timeout=10_000):
        window.attach_file(str(doc))
        window.stop()
    (x0, x1), (y0, y1) = acc.plot.getViewBox().viewRange()
    assert x0 == 0 and x1 >= 1 and y0 <= 0 < 1 <= y1 < 1.5


def test_model_picker_wraps_names_plans_with_this_ram_and_blocks_what_does_not_fit(qtbot, monkeypatch):
    from app import model_picker
    from engine.api import sample_memory
    dialog = model_picker.ModelPicker(current="Qwen/Qwen2.5-7B-Instruct-1M")
    qtbot.addWidget(dialog)
    dialog.show()
    assert dialog.list.wordWrap() and dialog.list.textElideMode() == Qt.TextElideMode.ElideNone
    item = dialog.list.currentItem()
    assert dialog.chosen().label.strip() in item.toolTip()
    dialog.profile.setCurrentIndex(dialog.profile.findData("4090"))
    qtbot.waitUntil(lambda: "cuda:0" in dialog.plan_text.toPlainText(), timeout=10_000)
    assert not dialog.load_button.isEnabled() and dialog.verdict.text().startswith("Does not fit")
    ram = sample_memory().ram_total_bytes
    free = (ram - 8 * 2**30) / 1e9  # the profile keeps 8 GiB for the OS
    assert f"{free:.2f} GB" in dialog.plan_text.toPlainText() or ram > 120 * 2**30
    # a model that fits can be loaded
    dialog._select("bundled")
    dialog.profile.setCurrentIndex(dialog.profile.findData("cpu"))
    qtbot.waitUntil(lambda: dialog.load_button.isEnabled() and "Fits" in dialog.verdict.text(), timeout=10_000)


def test_after_a_crash_the_app_opens_the_cut_off_chat_with_retry(qtbot, make_window, triforce_home):
    """A process killed mid-answer (os._exit after a checkpoint): the next start shows that chat,
    the partial answer marked interrupted, and Retry answers the question again."""
    crash = ("import os\nfrom engine.api import ChatStore\n"
             "store = ChatStore()\nchat = store.create_chat('Crashed chat').id\n"
             "turn = store.begin_turn(chat, 'What does the ghost ask?')\n"
             "turn.checkpoint('Revenge for his', force=True)\nos._exit(9)\n")
    done = subprocess.run([sys.executable, "-c", crash], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 9, done.stderr
    window = make_window("fake-model", backend=FakeBackend(tokens=3))
    assert window.chat_id is not None and window.title_label.text() == "Crashed chat"
    stored = window.repo.messages(window.chat_id)
    assert [(m.role, m.state) for m in stored] == [("user", "done"), ("assistant", "interrupted")]
    answer = window.chat_view._widgets[-1]
    assert answer.message.text == "Revenge for his" and "interrupted" in answer.message.footer
    qtbot.waitUntil(lambda: answer.retry_button.isVisibleTo(window))
    with qtbot.waitSignal(window.answerFinished, timeout=10_000):
        answer.retry_button.click()
    assert [(m.role, m.state) for m in window.repo.messages(window.chat_id)] == [("user", "done"),
                                                                                ("assistant", "done")]


def test_sigterm_closes_the_window_and_keeps_the_partial_answer(qtbot, fake_window):
    import os
    import signal

    from app.quit_signals import close_on_signals
    window = fake_window(step_s=0.05, tokens=400)
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        close_on_signals(window, poll_ms=20)
        window.send("Talk for a long time.")
        qtbot.waitUntil(lambda: len(window.chat_view.streaming_text()) > 10)
        chat_id = window.chat_id
        os.kill(os.getpid(), signal.SIGTERM)
        qtbot.waitUntil(lambda: not window.engine.thread.isRunning())
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    from app.chat_repo import ChatRepo
    repo = ChatRepo()
    stored = repo.messages(chat_id)
    repo.close()
    assert [(m.role, m.state) for m in stored] == [("user", "done"), ("assistant", "interrupted")]
    assert stored[1].text.startswith("The prince") and stored[1].stats.get("partial") is True
