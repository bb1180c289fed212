"""Fast GUI checks on a scripted engine (tests/gui/fakes.py): input keys, Markdown without HTML,
chat list operations, settings snapping and persistence, shortcuts, token coalescing, errors."""
from __future__ import annotations

import logging
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QKeySequence
from PySide6.QtWidgets import QApplication, QFileDialog, QInputDialog, QMessageBox

from app.chat_view import ChatView
from app.composer import Composer
from app.settings_panel import CHUNKS, SettingsPanel
from app.worker import TokenBatch
from engine.events import FinishReason
from tests.gui.fakes import FakeBackend

pytestmark = pytest.mark.gui


def test_enter_sends_and_shift_enter_adds_a_line(qtbot):
    composer = Composer()
    qtbot.addWidget(composer)
    sent = []
    composer.sendRequested.connect(sent.append)
    qtbot.keyClicks(composer.edit, "first line")
    qtbot.keyClick(composer.edit, Qt.Key.Key_Return, Qt.KeyboardModifier.ShiftModifier)
    qtbot.keyClicks(composer.edit, "second line")
    assert sent == [] and composer.text() == "first line\nsecond line"
    qtbot.keyClick(composer.edit, Qt.Key.Key_Return)
    assert sent == ["first line\nsecond line"] and composer.text() == ""
    composer.set_generating(True)
    qtbot.keyClicks(composer.edit, "not while answering")
    qtbot.keyClick(composer.edit, Qt.Key.Key_Return)
    assert len(sent) == 1 and composer.stop.isVisibleTo(composer) and not composer.send.isVisibleTo(composer)


def test_markdown_renders_without_html_and_code_is_monospaced(qtbot):
    view = ChatView()
    qtbot.addWidget(view)
    view.resize(700, 500)
    w = view.add_message("assistant", "Say **hi** <b>raw</b> <script>x()</script>\n\n```python\nprint(1)\n```\n")
    doc = w.body.document()
    plain = doc.toPlainText()
    assert "<b>raw</b>" in plain and "<script>x()</script>" in plain  # shown as text, never interpreted
    assert "**" not in plain and "hi" in plain  # Markdown itself is rendered
    block = doc.findBlock(plain.index("print(1)"))
    assert block.charFormat().font().fixedPitch() or QApplication.font().family() != \
        block.charFormat().font().family()
    frag_font = next(iter_fragments(block)).charFormat().font()
    assert frag_font.fixedPitch() or "mono" in frag_font.family().lower() or frag_font.styleHint() == frag_font.StyleHint.Monospace


def iter_fragments(block):
    it = block.begin()
    while not it.atEnd():
        yield it.fragment()
        it += 1


def test_streaming_answer_and_colour_by_level(qtbot):
    view = ChatView()
    qtbot.addWidget(view)
    view.resize(700, 500)
    view.start_answer()
    for text, level in (("Drafted ", 0), ("by ", 0), ("retrieval ", 1), ("and full.", 2)):
        view.append_tokens(text, level)
    qtbot.waitUntil(lambda: "and full." in view._widgets[-1].body.toPlainText())
    view.set_color_levels(True)
    w = view.finish_answer(None, "4 tokens")
    doc = w.body.document()
    colours = {frag.charFormat().foreground().color().name() for frag in iter_fragments(doc.begin())}
    assert len(colours) == 3  # one colour per level
    assert w.message.segments == [("Drafted by ", 0), ("retrieval ", 1), ("and full.", 2)]
    view.set_color_levels(False)
    assert doc.toPlainText() == "Drafted by retrieval and full."


def test_settings_controls_only_make_valid_settings(qtbot):
    panel = SettingsPanel()
    qtbot.addWidget(panel)
    panel.set_context(8192)
    emitted = []
    panel.settingsChanged.connect(emitted.append)
    for chunk_i in range(len(CHUNKS)):
        panel.chunk.slider.setValue(chunk_i)
        for step in (panel.budget.slider.minimum(), panel.budget.slider.maximum(), 7):
            panel.budget.slider.setValue(step)
            s = panel.settings()
            s.validate(8192)  # never raises: the controls cannot express an invalid budget
            assert s.budget % s.chunk == 0 and 2 * s.chunk <= s.budget <= 8192
    panel.flush()
    assert emitted and emitted[-1] == panel.settings()
    # a smaller model shrinks the budget's range and clamps the value
    panel.budget.slider.setValue(panel.budget.slider.maximum())
    panel.set_context(2048)
    assert panel.settings().budget <= 2048 and "2,048 tokens" in panel.budget.range.text()
    # auto-tune takes over gamma and budget
    panel.auto.setChecked(True)
    assert not panel.gamma1.isEnabled() and not panel.budget.isEnabled()
    # plain AR has no drafter and no retrieval cache
    panel.auto.setChecked(False)
    panel.mode.setCurrentIndex(panel.mode.findData("ar"))
    assert not panel.gamma1.isEnabled() and not panel.chunk.isEnabled()


@pytest.fixture
def fake_window(make_window):
    return lambda **kw: make_window("fake-model", backend=FakeBackend(**kw))


def test_chat_list_new_rename_delete_search(qtbot, fake_window, monkeypatch):
    window = fake_window(tokens=3)
    for question in ("What is the ghost?", "Where is Elsinore?"):
        window.new_chat()
        with qtbot.waitSignal(window.answerFinished, timeout=10_000):
            window.send(question)
    lst = window.chat_list.list
    assert lst.count() == 2 and lst.item(0).text() == "Where is Elsinore?"
    # Ctrl+N: an empty chat, nothing stored until something is sent
    qtbot.keyClick(window, Qt.Key.Key_N, Qt.KeyboardModifier.ControlModifier)
    assert window.chat_id is None and window.chat_view.messages == [] and lst.count() == 2
    # rename (double-click opens the dialog)
    monkeypatch.setattr(QInputDialog, "getText", lambda *a, **k: ("Ghost questions", True))
    window.chat_list._rename(lst.item(1))
    assert {lst.item(i).text() for i in range(2)} == {"Ghost questions", "Where is Elsinore?"}
    # search matches titles and message text
    window.chat_list.search.setText("elsinore")
    qtbot.waitUntil(lambda: lst.count() == 1)
    assert lst.item(0).text() == "Where is Elsinore?"
    window.chat_list.search.setText("")
    qtbot.waitUntil(lambda: lst.count() == 2)
    # open, then delete the open chat
    window.chat_list.list.setCurrentRow(0)
    opened = window.chat_id
    assert opened is not None and [m.role for m in window.chat_view.messages] == ["user", "assistant"]
    monkeypatch.setattr(QMessageBox, "question", lambda *a, **k: QMessageBox.StandardButton.Yes)
    window.chat_list._delete(lst.currentItem())
    assert lst.count() == 1 and window.chat_id is None
    assert all(c.id != opened for c in window.repo.list_chats())


def test_settings_persist_per_chat_and_globally(qtbot, make_window):
    window = make_window("fake-model", backend=FakeBackend(tokens=2))
    panel = window.settings_panel
    panel.temperature.slider.setValue(70)
    panel.flush()
    with qtbot.waitSignal(window.answerFinished, timeout=10_000):
        window.send("Keep my settings")
    chat_id = window.chat_id
    session = window.engine.session()
    assert session.settings.sampling.temperature == pytest.approx(0.7)
    panel.gamma1.slider.setValue(9)  # a later change goes to this chat too
    panel.flush()
    assert session.settings.gamma1 == 9
    window.close()
    again = make_window("fake-model", backend=FakeBackend(tokens=2))
    # global (QSettings): the last settings come back in a new window
    assert again.settings_panel.settings().gamma1 == 9
    again.settings_panel.gamma1.slider.setValue(3)
    again.settings_panel.flush()
    again.open_chat(chat_id)  # per chat: the chat's own settings win
    s = again.settings_panel.settings()
    assert s.gamma1 == 9 and s.sampling.temperature == pytest.approx(0.7)
    assert again.engine.session().settings.gamma1 == 9


def test_shortcuts(qtbot, fake_window, monkeypatch, tmp_path):
    window = fake_window()
    keys = {a.text(): a.shortcut() for a in window.actions()}
    assert keys["New chat"] == QKeySequence(QKeySequence.StandardKey.New)
    assert keys["Attach…"] == QKeySequence(QKeySequence.StandardKey.Open)
    assert keys["Stop"] == QKeySequence(Qt.Key.Key_Escape)
    assert keys["Settings"] == QKeySequence("Ctrl+,")
    window.settings_action.trigger()
    assert window.right.currentWidget() is window.settings_panel
    doc = tmp_path / "notes.md"
    doc.write_text("# Notes\n\nSome notes about the play.", encoding="utf-8")
    monkeypatch.setattr(QFileDialog, "getOpenFileNames", lambda *a, **k: ([str(doc)], ""))
    with qtbot.waitSignal(window.prefillFinished, timeout=10_000):
        window.attach_action.trigger()
    assert [c.title for c in window.chips.chips] == ["notes"]


def test_tokens_are_coalesced_and_panels_throttled(qtbot, fake_window):
    window = fake_window(step_s=0.002, tokens=300)  # ~500 tokens/s from the engine
    pieces, metrics = [], []
    window.engine.engineEvent.connect(lambda _j, ev: pieces.append(ev) if isinstance(ev, TokenBatch) else None)
    window.engine.engineEvent.connect(lambda _j, ev: metrics.append(ev) if type(ev).__name__ == "Metrics" else None)
    with qtbot.waitSignal(window.answerFinished, timeout=20_000) as done:
        window.send("Fast please")
    text = "".join(p.text for p in pieces)
    assert text == done.args[0].text
    # 300 tokens (levels alternating) in ~0.6-1.5 s arrive as one batch per ~50 ms, not 300 signals
    assert len(pieces) < 60
    assert sum(len(b.pieces) for b in pieces) == 300  # nothing merged across levels
    assert len(metrics) <= 25


def test_unexpected_engine_error_is_shown_logged_and_app_keeps_working(qtbot, fake_window, caplog):
    window = fake_window(tokens=3)
    session = window.engine.session()
    original = session.stream

    def broken(*a, **k):
        raise RuntimeError("kaboom")
        yield  # pragma: no cover

    session.stream = broken
    with caplog.at_level(logging.ERROR):
        with qtbot.waitSignal(window.errorShown, timeout=10_000) as shown:
            window.send("Will this break?")
    assert "kaboom" in shown.args[0] and "RuntimeError" in shown.args[0]
    assert any("Traceback" in r.getMessage() or r.exc_info for r in caplog.records) or "kaboom" in caplog.text
    assert window.composer.send.isVisible()
    stored = window.repo.messages(window.chat_id)
    # the question is kept with an answer row marked interrupted, offered again with Retry
    assert [(m.role, m.state) for m in stored] == [("user", "done"), ("assistant", "interrupted")]
    assert stored[1].text == "" and "error" in stored[1].stats.get("footer", "")
    last = window.chat_view._widgets[-2]  # the error bubble follows the answer
    assert last.message.role == "assistant" and last.retry_button.isVisibleTo(window)
    session.stream = original
    with qtbot.waitSignal(window.answerFinished, timeout=10_000) as ok:
        window.send("And now?")
    assert ok.args[0].reason == FinishReason.EOS


def test_memory_panel_without_gpu(qtbot):
    from app.panels import MemoryPanel
    from engine.offload.telemetry import MemorySample
    panel = MemoryPanel()
    qtbot.addWidget(panel)
    panel.show()
    panel.update_sample(MemorySample(0.0, 16 << 30, 12 << 30, 900 << 20, (), "no NVIDIA driver"))
    assert panel.no_gpu.isVisible() and "No GPU" in panel.no_gpu.text()
    assert "4.0 GiB / 16.0 GiB" in panel.ram.value.text()
    assert "900.0 MiB" in panel.process.text()


def test_model_picker_shows_the_plan(qtbot, shots, monkeypatch):
    from app import model_picker
    from app.model_picker import ModelPicker
    monkeypatch.setattr(model_picker, "gpus_here", lambda: 1)  # a machine with a GPU: a 4090 plan loads
    dialog = ModelPicker(current="bundled")
    qtbot.addWidget(dialog)
    dialog.show()
    assert dialog.chosen().spec == "bundled"
    qtbot.waitUntil(lambda: dialog.plan_text.toPlainText() != "", timeout=5_000)
    assert "Fits" in dialog.verdict.text()
    # a preset with a draft model, planned for one RTX 4090
    for i in range(dialog.list.count()):
        c = dialog.list.item(i).data(Qt.ItemDataRole.UserRole)
        if c is not None and c.spec == "meta-llama/Llama-3.1-8B-Instruct":
            dialog.list.setCurrentRow(i)
    dialog.profile.setCurrentIndex(dialog.profile.findData("4090"))
    qtbot.waitUntil(lambda: "cuda:0" in dialog.plan_text.toPlainText(), timeout=5_000)
    shots(dialog, "model-picker")
    chosen = []
    dialog.modelChosen.connect(lambda spec, draft: chosen.append((spec, draft)))
    dialog.load_button.click()
    assert chosen == [("meta-llama/Llama-3.1-8B-Instruct", "meta-llama/Llama-3.2-1B-Instruct")]


def test_dark_theme(qtbot, qapp, make_window, shots, tmp_path):
    from app import theme
    c = theme.apply_theme(qapp, dark=True)
    assert c.dark and qapp.palette().color(qapp.palette().ColorRole.Window).lightness() < 80
    window = make_window("fake-model", backend=FakeBackend(tokens=24))
    doc = tmp_path / "Hamlet.md"
    doc.write_text("# Hamlet\n\nWho's there? Nay, answer me: stand, and unfold yourself.", encoding="utf-8")
    with qtbot.waitSignal(window.prefillFinished, timeout=10_000):
        window.attach_file(str(doc))
    with qtbot.waitSignal(window.answerFinished, timeout=10_000):
        window.send("Who speaks first?")
    assert window.chat_view._colors.dark
    shots(window, "dark")


def test_several_files_at_once_and_while_reading(qtbot, make_window, tmp_path):
    from tests.gui.helpers import drop_files
    window = make_window("fake-model", backend=FakeBackend(prefill_step_s=0.02))
    files = []
    for name in ("act1.md", "broken.pdf", "act2.md", "act3.md"):
        path = tmp_path / name
        path.write_text(f"# {name}\n\n" + "Words of the play. " * 200, encoding="utf-8")
        files.append(path)
    errors = []
    window.errorShown.connect(errors.append)
    finished = []
    window.prefillFinished.connect(finished.append)
    drop_files(window, files[:3])  # one good, one unreadable, one good: read together, one prefill
    drop_files(window, files[3:])  # dropped while that runs: waits, then sees the first two
    qtbot.waitUntil(lambda: len(finished) == 2, timeout=20_000)
    assert [c.title for c in window.chips.chips] == ["act1", "act2", "act3"]
    assert len(errors) == 1 and "broken.pdf" in errors[0]
    session = window.engine.session()
    stored = window.repo.documents(window.chat_id)
    assert [d.title for d in stored] == ["act1", "act2", "act3"]
    assert all(c.tokens for c in window.chips.chips)
    with qtbot.waitSignal(window.answerFinished, timeout=10_000):
        window.send("Summarise the acts.")
    assert [d.title for d in session.streams[-1][1]] == ["act1", "act2", "act3"]


def test_model_loading_shows_progress_and_can_be_cancelled(qtbot, make_window):
    window = make_window("fake-model", backend=FakeBackend())
    before = window.model
    window.engine.worker._backend.load_s = 20.0  # a slow "download"
    window.load_model("some/repo-id")
    qtbot.waitUntil(lambda: window.load_bar.isVisible() and window.load_bar.value() > 0, timeout=10_000)
    assert "Downloading some/repo-id" in window.status_label.text()
    assert window.load_cancel.isVisible() and not window.model_button.isEnabled()
    qtbot.mouseClick(window.load_cancel, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not window.load_bar.isVisible(), timeout=10_000)
    assert "cancelled" in window.status_label.text() and "still using" in window.status_label.text()
    assert window.model is before and window.model_button.isEnabled()
    assert not any(m.role == "error" for m in window.chat_view.messages)  # cancelling is not an error
    # the previous model still answers
    with qtbot.waitSignal(window.answerFinished, timeout=10_000) as done:
        window.send("Still there?")
    assert done.args[0].reason == FinishReason.EOS


def _gpu_sample():
    """Numbers read on an NVIDIA H200 by tests/gui/data_gpu_sample.json's device run."""
    import json
    from engine.events import CacheStats, LevelStats, Metrics
    from engine.offload.telemetry import GpuSample, MemorySample
    data = json.loads((Path(__file__).parent / "data_gpu_sample.json").read_text(encoding="utf-8"))
    mem = dict(data["memory"])
    mem["gpus"] = tuple(GpuSample(**g) for g in mem["gpus"])
    m = dict(data["metrics"])
    m["levels"] = tuple(LevelStats(**lv) for lv in m["levels"])
    m["caches"] = tuple(CacheStats(**c) for c in m["caches"])
    return MemorySample(**mem), Metrics(**m)


def test_panels_with_numbers_from_a_real_gpu(qtbot, make_window, shots):
    sample, metrics = _gpu_sample()
    window = make_window("fake-model", backend=FakeBackend(), sample_memory=False)
    window.memory.update_sample(sample)
    window.cache_panel.update_metrics(metrics)
    window.acceptance_panel.update_metrics(metrics)
    bar = window.memory.gpu_bars[0]
    assert not window.memory.no_gpu.isVisible() and bar.isVisible()
    assert "cuda:0 · NVIDIA H200" == bar.name.text()
    assert bar.value.text() == "1.4 GiB / 140.4 GiB"
    assert "this app 80.0 MiB (46.3 MiB in tensors)" in bar.detail.text()
    assert window.cache_panel.full.value.text() == "3,935 / 8,192" and "cuda" in window.cache_panel.full.detail.text()
    assert window.acceptance_panel.stats["decode"].text() == "18.0"
    assert window.acceptance_panel.bars["l1_l2"].value.text() == "34%"
    shots(window, "gpu-panels")


def test_storage_limits_reach_the_engine_and_persist(qtbot, make_window, tmp_path):
    """The document-size refusal says to raise the limit in the settings: the control exists,
    the engine reads with it at once, and it survives a restart."""
    window = make_window(None)
    panel = window.settings_panel
    assert panel.limits() == (50, 20)
    big = tmp_path / "big.txt"
    big.write_text("word " * (400 * 1024), encoding="utf-8")  # 2 MiB
    panel.max_document.setValue(1)
    panel.max_document.editingFinished.emit()
    backend = window.engine.worker._backend
    assert backend.max_document_bytes == 2**20
    from engine.documents import read_document
    from engine.errors import DocumentError
    with pytest.raises(DocumentError, match="raise the maximum document size in the settings"):
        read_document(big, max_bytes=backend.max_document_bytes)
    panel.snapshot_cache.setValue(3)
    panel.snapshot_cache.editingFinished.emit()
    assert backend.snapshot_cap_bytes == 3 * 2**30
    assert window.prefs.value("limits/max_document_mib", type=int) == 1
    assert window.prefs.value("limits/snapshot_cache_gib", type=int) == 3
    again = make_window(None, settings=window.prefs)
    assert again.settings_panel.limits() == (1, 3)
    assert again.engine.worker._backend.max_document_bytes == 2**20


def test_cancelling_while_a_pdf_is_read_is_not_an_error(qtbot, make_window, tmp_path):
    """Cancel during a long PDF: the reader stops between pages (ReadCancelled); the app shows no
    error, attaches nothing and is ready for the next file."""
    from engine.errors import ReadCancelled
    from tests.gui.helpers import drop_files

    class CancelledWhileReading(FakeBackend):
        def read_document(self, path, progress=None, cancel=None):
            progress(3, 400)
            raise ReadCancelled("reading was cancelled")

    window = make_window("fake-model", backend=CancelledWhileReading())
    errors = []
    window.errorShown.connect(errors.append)
    path = tmp_path / "contract.pdf"
    path.write_bytes(b"%PDF-1.4")
    drop_files(window, [path])
    qtbot.waitUntil(lambda: not window.is_busy(), timeout=10_000)
    assert errors == [] and window.chips.chips == [] and not window.prefill_strip.isVisible()


def test_live_panel_shows_what_auto_runs_and_what_it_weighed(qtbot):
    from app.panels.acceptance_panel import AcceptancePanel
    from engine.events import CandidateCost, Metrics

    panel = AcceptancePanel()
    qtbot.addWidget(panel)
    m = Metrics(mode="auto", prompt_tokens=10, new_tokens=20, prefill_tokens=10, prefill_tokens_per_s=100.0,
                decode_tokens_per_s=12.0, time_to_first_token_s=0.5, settings_summary="auto budget=64",
                structure="draft-only g1=4", structure_switches=2,
                candidates=(CandidateCost("ar", 80.0), CandidateCost("draft-only g1=4", 41.5),
                            CandidateCost("triforce g1=2 g2=6", 60.0, measured=False)))
    panel.update_metrics(m)
    text = panel.summary.text()
    assert "running: draft-only g1=4 (switched 2×)" in text
    assert "weighed: draft-only g1=4 42 ms, triforce g1=2 g2=6 ~60 ms, ar 80 ms" in text


def test_a_first_run_samples_with_a_repetition_penalty_and_the_panel_sets_it(qtbot, make_window, tiny_model):
    """New users get the sampling local chat apps use (not greedy, which makes a small model loop),
    and the penalty is a control like the others."""
    window = make_window(tiny_model)
    panel = window.settings_panel
    s = panel.settings().sampling
    assert s.temperature == pytest.approx(0.7) and s.top_p == pytest.approx(0.9) and s.top_k == 40
    assert s.frequency_penalty == pytest.approx(0.3) and s.presence_penalty == 0.0
    assert panel.frequency.value.text() == "0.30"
    panel.frequency.slider.setValue(55)
    panel.presence.slider.setValue(20)
    panel.flush()
    session = window.engine.session()
    qtbot.waitUntil(lambda: session.settings.sampling.frequency_penalty == pytest.approx(0.55), timeout=5_000)
    assert session.settings.sampling.presence_penalty == pytest.approx(0.2)
