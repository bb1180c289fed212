"""engine.api: one way to open a model and a session; settings travel like commands and apply
between two steps on the engine thread; every job has its own cancel token."""
from __future__ import annotations

import threading

import pytest

import engine.decoding.session as session_module
from engine.api import Engine, OpenedModel
from engine.decoding.drafters import ModelDrafter
from engine.errors import Cancelled, InvalidSettingError, ReadCancelled
from engine.events import ChatMessage, Finished, FinishReason, TokenText
from engine.model.loading import load_folder
from engine.settings import DecodeSettings
from engine.store.models import ResolveCancelled
from streams import answer_tokens

SETTINGS = DecodeSettings(mode="ar", budget=32, chunk=8, max_new_tokens=12, ignore_eos=True)
ASK = [ChatMessage("user", "Tell me about the sea.")]


@pytest.fixture(scope="module")
def tiny_dir(tiny_model_dir):
    return tiny_model_dir("llama")


def test_open_gives_the_same_answer_as_a_session_built_by_hand(tiny_dir):
    engine = Engine(devices="cpu", snapshots=False)
    session = engine.open(str(tiny_dir), "ngram", SETTINGS)
    by_hand = session_module.ChatSession(load_folder(tiny_dir, device="cpu"), SETTINGS, draft="ngram")
    assert answer_tokens(session, ASK)[0] == answer_tokens(by_hand, ASK)[0]
    info = engine.describe(str(tiny_dir), session)
    assert isinstance(info, OpenedModel)
    assert info.device == "cpu" and info.draft == "ngram" and info.plan_mode is None
    assert info.max_context == session.target.max_context


def test_prompt_length_needs_only_the_tokenizer(tiny_dir):
    engine = Engine(devices="cpu", snapshots=False)
    session = engine.open(str(tiny_dir), "none", SETTINGS)
    assert Engine.prompt_length(tiny_dir, ASK) == len(session.prompt_tokens(ASK))


def test_settings_apply_between_steps_on_the_engine_thread(tiny_dir, monkeypatch):
    """A new draft window asked for from another thread builds its drafter on the thread that runs
    the stream, at the next step; until then the running settings are untouched."""
    engine = Engine(devices="cpu", snapshots=False)
    draft = load_folder(tiny_dir, device="cpu")
    settings = SETTINGS.replace(mode="draft-only", draft_sinks=2, draft_window=16)
    session = engine.session(load_folder(tiny_dir, device="cpu"), settings, draft)
    built_on: list[str] = []
    original = ModelDrafter.__init__

    def recording(self, *args, **kwargs):
        built_on.append(threading.current_thread().name)
        original(self, *args, **kwargs)

    monkeypatch.setattr(ModelDrafter, "__init__", recording)
    wanted = settings.replace(draft_window=24)
    asker = threading.Thread(target=session.update_settings, args=(wanted,), name="gui")
    asker.start()
    asker.join()
    assert built_on == []  # nothing built on the asking thread
    assert session.settings == wanted  # what the panel shows: the latest asked for
    assert session.decoder.settings.draft_window == 16  # not running yet
    runner = threading.Thread(target=lambda: answer_tokens(session, ASK), name="engine")
    runner.start()
    runner.join()
    assert built_on == ["engine"]
    assert session.decoder.settings.draft_window == 24 and session.drafter.cache.window == 24


def test_a_setting_changed_mid_answer_applies_at_the_next_step(tiny_dir):
    engine = Engine(devices="cpu", snapshots=False)
    session = engine.session(load_folder(tiny_dir, device="cpu"), SETTINGS.replace(max_new_tokens=40))
    answer: list[int] = []
    final = None
    for event in session.stream(ASK):
        if isinstance(event, TokenText):
            answer.extend(event.token_ids)
            if len(answer) == 3:
                session.update_settings(session.settings.replace(max_new_tokens=5))
        elif isinstance(event, Finished):
            final = event
    assert final.reason == FinishReason.LENGTH
    assert final.metrics.new_tokens == 5  # ar emits one token per step: the limit bit at once


def test_an_invalid_setting_is_refused_at_once_and_nothing_is_queued(tiny_dir):
    engine = Engine(devices="cpu", snapshots=False)
    session = engine.session(load_folder(tiny_dir, device="cpu"), SETTINGS)
    with pytest.raises(InvalidSettingError):
        session.update_settings(SETTINGS.replace(chunk=7))  # does not divide the budget
    assert session.settings == SETTINGS


def test_each_job_has_its_own_cancel_token(tiny_dir):
    """A stop that arrives before the job starts still stops it; an old job's stop never reaches
    the next job (a shared flag cleared at the start of every stream lost the first, and a late
    cancel of a finished job would have stopped the next)."""
    engine = Engine(devices="cpu", snapshots=False)
    session = engine.session(load_folder(tiny_dir, device="cpu"), SETTINGS)
    stopped_early = threading.Event()
    stopped_early.set()
    events = list(session.stream(ASK, cancel=stopped_early))
    assert events[-1].reason == FinishReason.CANCELLED and not any(isinstance(e, TokenText) for e in events)
    stopped_early.set()  # a late stop of the old job...
    final = list(session.stream(ASK, cancel=threading.Event()))[-1]
    assert final.reason == FinishReason.LENGTH and final.metrics.new_tokens == SETTINGS.max_new_tokens


def test_cancellations_share_one_base_class():
    assert issubclass(ReadCancelled, Cancelled) and issubclass(ResolveCancelled, Cancelled)


def test_an_overflow_carries_its_numbers(tiny_dir):
    from engine.errors import ContextOverflowError

    engine = Engine(devices="cpu", snapshots=False)
    session = engine.session(load_folder(tiny_dir, device="cpu"), SETTINGS, capacity=64)
    with pytest.raises(ContextOverflowError) as caught:
        session.check_fits([ChatMessage("user", "word " * 80)])
    err = caught.value
    assert err.context_tokens == 64 and err.answer_tokens == SETTINGS.max_new_tokens
    assert err.prompt_tokens + err.answer_tokens > 64 and f"{err.prompt_tokens:,} prompt tokens" in str(err)


def test_the_weights_choice_reaches_the_loader(tiny_dir, monkeypatch):
    """`chat --weights float32` (Engine(file_blocks=False)) loads the float32 conversion of a GGUF,
    the default (None) lets the loader run the file's own blocks wherever it can."""
    import engine.model.loading as loading

    seen = []
    real = loading.load_folder
    monkeypatch.setattr(loading, "load_folder", lambda *a, **k: seen.append(k.get("file_blocks")) or real(*a, **k))
    Engine(devices="cpu", snapshots=False, file_blocks=False).open(str(tiny_dir), "none", SETTINGS)
    Engine(devices="cpu", snapshots=False).open(str(tiny_dir), "none", SETTINGS)
    assert seen == [False, None]
