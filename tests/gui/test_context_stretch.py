"""A longer context as a user option, in the app (issue 68): the model picker lists the trained
context and its YaRN stretches (x2, x4) and loads the model at the one chosen; the choice is kept
with the app's settings; the overflow dialog offers the smallest stretch that holds a document
(never past 4x the trained context) and, picked, reloads the model at it and adds the document."""
from __future__ import annotations

import pytest
from PySide6.QtCore import QSettings

from app.job_messages import ModelInfo
from app.model_picker import ModelChoice
from app.overflow import overflow_from, window_label, with_stretch
from engine.events import FinishReason
from tests.gui.fakes import FakeBackend

STRETCH_8K = "Stretch this model to {}"


def _buttons(box) -> list[str]:
    return [b.text() for b in box.buttons()]


def _click(box, label: str) -> None:
    next(b for b in box.buttons() if b.text() == label).click()


def _drop_too_long(qtbot, window, path, text: str):
    """Attach `path` (holding `text`), which does not fit: returns the overflow dialog."""
    path.write_text(text, encoding="utf-8")
    window._overflow_box = None
    with qtbot.waitSignal(window.errorShown, timeout=60_000):
        window.attach_file(str(path))
    qtbot.waitUntil(lambda: window._overflow_box is not None and window._overflow_box.isVisible(), timeout=10_000)
    return window._overflow_box


def _picker_on(qtbot, window, spec: str):
    """The window's model picker with `spec` (a folder, as "Open folder…" adds it) selected."""
    window.choose_model()
    picker = window._picker
    qtbot.waitUntil(picker.isVisible)
    picker.add_choice(ModelChoice("tiny  (folder)", spec, "ngram", spec, spec))
    return picker


def test_the_picker_lists_stretched_contexts_and_loads_the_model_at_the_one_chosen(qtbot, make_window, tiny_model_dir,
                                                                                     shots):
    spec = str(tiny_model_dir("llama", max_position_embeddings=256))
    window = make_window(spec)
    assert window.model.max_context == 256 and window.model.context == 0
    picker = _picker_on(qtbot, window, spec)
    choice = picker.window_choice
    labels = [choice.itemText(i) for i in range(choice.count())]
    assert labels == ["256 — as trained",
                      "512 — stretched 2x (YaRN): lower quality beyond the trained 256",
                      "1K — stretched 4x (YaRN): lower quality beyond the trained 256"]
    assert choice.currentIndex() == 0 and picker.chosen_window() == 0
    choice.setCurrentIndex(2)
    assert picker.context.value() == 1024  # the cache is planned for the window chosen
    qtbot.waitUntil(lambda: picker.verdict.text().startswith("Fits") and picker.load_button.isEnabled(), timeout=10_000)
    shots(picker, "model-picker-context")
    with qtbot.waitSignal(window.modelReady, timeout=60_000) as ready:
        picker.load_button.click()
    info = ready.args[0]
    assert (info.max_context, info.context, info.trained_context) == (1024, 1024, 256)
    target = window.engine.session().target
    assert target.max_context == 1024
    rope = target.config.rope_parameters
    assert rope["rope_type"] == "yarn" and rope["factor"] == 4 and rope["original_max_position_embeddings"] == 256
    assert window.context_label.text() == "1,024-token context"  # the meter and budgets use the window
    assert window.settings_panel._context == 1024
    # opened again, the picker shows the window the model runs at
    picker = _picker_on(qtbot, window, spec)
    assert picker.chosen_window() == 1024 and picker.context.value() == 1024
    picker.reject()


def test_the_picker_opens_on_the_current_window_and_offers_no_stretch_for_a_scaled_rope(qtbot, tiny_model_dir):
    from app.model_picker import ModelPicker
    spec = str(tiny_model_dir("llama", max_position_embeddings=256))
    picker = ModelPicker(current=spec, current_window=512)
    qtbot.addWidget(picker)
    picker.add_choice(ModelChoice("tiny  (folder)", spec, "ngram", spec, spec))
    assert picker.chosen_window() == 512 and picker.window_choice.isEnabled()
    scaled = str(tiny_model_dir("llama", max_position_embeddings=256,
                                rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}))
    picker.add_choice(ModelChoice("scaled  (folder)", scaled, "ngram", scaled, scaled))
    assert picker.window_choice.count() == 1 and not picker.window_choice.isEnabled()
    assert picker.chosen_window() == 0 and "already scales its RoPE" in picker.window_note.text()


def test_the_context_choice_survives_a_restart(qtbot, make_window, triforce_home):
    first = FakeBackend(max_context=8192)
    window = make_window("fake-model", backend=first)
    with qtbot.waitSignal(window.modelReady, timeout=10_000):
        window._on_model_chosen("fake-model", "ngram", 32768)  # what the picker's Load sends
    assert first.loads == [0, 32768] and window.model.max_context == 32768
    # written at once, as the model spec is: a crash now keeps it
    saved = QSettings(str(triforce_home / "app-settings.ini"), QSettings.Format.IniFormat)
    assert saved.value("model/spec") == "fake-model" and int(saved.value("model/context")) == 32768
    window.shutdown()

    again = FakeBackend(max_context=8192)
    restarted = make_window("fake-model", backend=again)
    assert again.loads == [32768] and restarted.model.max_context == 32768
    assert restarted.context_label.text() == "32,768-token context"
    restarted.shutdown()
    other = FakeBackend(max_context=8192)  # another model at start ($TRIFORCE_MODEL): as trained
    make_window("other-model", backend=other)
    assert other.loads == [0]


def test_the_overflow_dialog_offers_the_smallest_stretch_that_holds_the_document(qtbot, make_window, tmp_path, shots):
    backend = FakeBackend(max_context=8192)  # offers 16K and 32K (FakeBackend.stretches)
    window = make_window("fake-model", backend=backend)
    window.settings_panel.max_new.setValue(256)
    window.settings_panel.flush()
    box = _drop_too_long(qtbot, window, tmp_path / "huge.md", "x" * 4 * 40_000)  # 40,000 tokens > 4 x 8K
    assert not any(label.startswith("Stretch") for label in _buttons(box))
    assert "Choose another model…" in _buttons(box)
    box.close()
    box = _drop_too_long(qtbot, window, tmp_path / "play.md", "x" * 4 * 20_000)  # 20,000 tokens: 32K holds it
    assert STRETCH_8K.format("32K") in _buttons(box) and STRETCH_8K.format("16K") not in _buttons(box)
    box.close()
    box = _drop_too_long(qtbot, window, tmp_path / "book.md", "x" * 4 * 12_000)  # 12,000 tokens: 16K holds it
    assert STRETCH_8K.format("16K") in _buttons(box)
    button = next(b for b in box.buttons() if b.text() == STRETCH_8K.format("16K"))
    assert button.toolTip().startswith("Lower quality beyond its trained 8K")
    assert "past the 8K tokens it was trained on (YaRN x2)" in box.informativeText()
    assert "model" not in box.informativeText()  # the ways out are the buttons, listed once
    shots(box, "overflow-stretch")
    assert any("“book.md” was not added" in w.message.text for w in window.chat_view._widgets)
    with qtbot.waitSignal(window.prefillFinished, timeout=20_000) as done:
        button.click()
    assert done.args[0].reason in (FinishReason.STOP, FinishReason.LENGTH)  # read to its end
    assert backend.loads[-1] == 16384 and window.model.max_context == 16384
    qtbot.waitUntil(lambda: len(window.chips.chips) == 1, timeout=10_000)
    assert window.chips.chips[0].tokens == 12_000 and window.chips.chips[0].fit == "whole"
    assert not any("“book.md” was not added" in w.message.text for w in window.chat_view._widgets)


def test_the_stretch_offer_loads_the_real_model_at_the_window_that_holds_the_document(qtbot, make_window,
                                                                                    tiny_model_dir, tmp_path):
    spec = str(tiny_model_dir("llama", max_position_embeddings=256))
    window = make_window(spec)
    window.settings_panel.max_new.setValue(16)
    window.settings_panel.flush()
    with qtbot.waitSignal(window.modelReady, timeout=60_000):  # a session made with a 16-token answer
        window.load_model(spec)
    assert window.engine.session().settings.max_new_tokens == 16
    assert window.model.stretches == (512, 1024)  # the planner fits both here
    words = "Put out the light, and then put out the light. "
    box = _drop_too_long(qtbot, window, tmp_path / "long.md", words * 120)  # over 1,024 tokens: no stretch holds it
    assert not any(label.startswith("Stretch") for label in _buttons(box))
    box.close()
    box = _drop_too_long(qtbot, window, tmp_path / "scene.md", words * 20)  # 241 tokens + the template and answer: over 256, under 512
    assert STRETCH_8K.format("512") in _buttons(box) and box.text().endswith("context holds 256.")
    with qtbot.waitSignal(window.prefillFinished, timeout=60_000) as done:
        _click(box, STRETCH_8K.format("512"))
    assert done.args[0].reason in (FinishReason.STOP, FinishReason.LENGTH)  # read to its end
    assert window.model.max_context == 512 and window.engine.session().target.max_context == 512
    qtbot.waitUntil(lambda: len(window.chips.chips) == 1, timeout=10_000)
    assert window.chips.chips[0].tokens > 200  # the scene is in the chat, whole


def test_the_stretch_offered_is_the_smallest_window_that_holds_what_is_needed():
    info = ModelInfo("m", "M", "m", "cpu", 8192, "ngram", trained_context=8192, stretches=(16384, 32768))
    message = ("the conversation needs {:,} prompt tokens + 256 for the answer = {:,}, but this model's context "
               "holds 8,192: remove a document, …")
    fits_16k = with_stretch(overflow_from(message.format(9000, 9256), ["a.md"]), info)
    assert fits_16k.stretch_to == 16384 and [a.key for a in fits_16k.actions()][:2] == ["model", "stretch"]
    assert with_stretch(overflow_from(message.format(30000, 30256), ["a.md"]), info).stretch_to == 32768
    too_long = with_stretch(overflow_from(message.format(40000, 40256), ["a.md"]), info)
    assert too_long.stretch_to is None and "stretch" not in [a.key for a in too_long.actions()]
    unstretchable = dataclass_replace(info, stretches=())  # a RoPE already scaled, or no memory for it
    assert with_stretch(overflow_from(message.format(9000, 9256), ["a.md"]), unstretchable).stretch_to is None
    assert [window_label(n) for n in (8192, 16384, 1 << 20, 1000)] == ["8K", "16K", "1M", "1,000"]


def dataclass_replace(obj, **changes):
    import dataclasses
    return dataclasses.replace(obj, **changes)


def test_the_engine_says_which_stretches_a_model_allows(tiny_model_dir):
    from engine.api import BUNDLED_ID, context_options
    bundled = context_options(BUNDLED_ID)
    assert (bundled.trained, bundled.stretched, bundled.refusal) == (8192, (16384, 32768), "")
    scaled = context_options("meta-llama/Llama-3.1-8B-Instruct")  # llama3 RoPE scaling: no YaRN on top
    assert scaled.stretched == () and "already scales its RoPE (llama3)" in scaled.refusal
    tiny = context_options(str(tiny_model_dir("llama", max_position_embeddings=256)))
    assert (tiny.trained, tiny.stretched) == (256, (512, 1024))


@pytest.mark.bundled
def test_the_bundled_model_loads_stretched_as_the_app_asks(triforce_home):
    from app.engine_backend import EngineBackend
    backend = EngineBackend()
    folder = backend.resolve("bundled", lambda *_: None, lambda: False)
    target = backend.load(folder, None, context=16384)
    assert target.max_context == 16384
