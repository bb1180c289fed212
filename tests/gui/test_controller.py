"""The window's controller without a window: a recording view and a scripted engine handle drive
`ChatController` directly, so each job's outcome and end can be sent in any order (issue 10)."""
from __future__ import annotations

from typing import Any

import pytest

from app.chat_controller import ChatController
from app.chat_documents import ChatDocuments
from app.chat_repo import ChatRepo
from app.job_messages import DocumentReady, JobFailed, ModelInfo, TokenBatch
from engine.errors import Cancelled, ContextOverflowError, UserError
from engine.events import DocumentText, Finished, FinishReason, Level, TokenText


class RecordingView:
    """Every call the controller makes, as (name, args); settings as the panel would give them."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple]] = []

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return lambda *args, **kw: self.calls.append((name, args + tuple(kw.values())))

    def decode_settings(self):
        from engine.settings import DecodeSettings
        return DecodeSettings()

    def system_prompt(self) -> str:
        return ""

    def named(self, name: str) -> list[tuple]:
        return [args for n, args in self.calls if n == name]


class ScriptedEngine:
    """The EngineController's methods the controller calls; jobs are numbered, nothing runs."""

    def __init__(self) -> None:
        self.jobs: list[tuple[str, Any]] = []
        self.cancelled: list[int] = []

    def _job(self, kind: str, arg: Any = None) -> int:
        self.jobs.append((kind, arg))
        return len(self.jobs)

    def load(self, spec, draft="ngram", context=0):
        return self._job("load", spec)

    def stream(self, conversation):
        return self._job("stream", conversation)

    def ingest(self, paths, conversation):
        return self._job("ingest", paths)

    def count(self, documents):
        return self._job("count", documents)

    def cancel(self, job=None):
        self.cancelled.append(job)

    def apply_settings(self, settings):
        pass

    def session(self):
        return None


class Chips:
    def add(self, *a): pass  # noqa: E704
    def remove(self, *a): pass  # noqa: E704
    def clear(self): pass  # noqa: E704
    def find(self, *a): return None  # noqa: E704


class Prefs:
    def __init__(self) -> None:
        self.values: dict[str, Any] = {}

    def setValue(self, key: str, value: Any) -> None:  # noqa: N802 - QSettings' name
        self.values[key] = value

    def value(self, key: str, default: Any = None, type: Any = None) -> Any:  # noqa: A002
        return self.values.get(key, default)

    def sync(self) -> None:
        pass


@pytest.fixture
def rig(triforce_home):
    view, engine = RecordingView(), ScriptedEngine()
    repo = ChatRepo(triforce_home / "chats.db")
    controller = ChatController(view, engine, repo, ChatDocuments(repo, Chips()), Prefs())
    controller.load_model("m")
    controller.on_model_loaded(len(engine.jobs), ModelInfo("m", "M", "m", "cpu", 8192, "ngram"))
    yield controller, view, engine, repo
    repo.close()


def _tokens(text: str) -> TokenBatch:
    return TokenBatch((TokenText(text, (1,), Level.L2),))


def test_an_answer_ends_once_however_its_job_ends(rig):
    controller, view, engine, repo = rig
    controller.send("Who is Horatio?")
    job = len(engine.jobs)
    assert engine.jobs[-1][0] == "stream" and engine.jobs[-1][1].messages[-1].content == "Who is Horatio?"
    controller.on_engine_event(job, _tokens("A friend"))
    controller.on_engine_event(job, Finished(FinishReason.EOS, "A friend."))
    controller.on_job_done(job)  # the end comes after the outcome: nothing more happens
    assert len(view.named("emit")) == 2 and view.named("emit")[-1][0] == "answerFinished"  # modelReady, then this
    assert len(view.named("end_answer")) == 1
    assert [(m.role, m.state, m.text) for m in repo.messages(controller.chat_id)] == [
        ("user", "done", "Who is Horatio?"), ("assistant", "done", "A friend.")]


def test_a_failed_stream_and_a_silent_end_are_interrupted_answers(rig):
    controller, view, engine, repo = rig
    controller.send("First")
    job = len(engine.jobs)
    controller.on_failed(JobFailed(job, "stream", "Unexpected error (RuntimeError): boom", False, "trace"))
    controller.on_job_done(job)
    controller.send("Second")  # the engine ended this one without Finished
    controller.on_job_done(len(engine.jobs))
    ends = view.named("end_answer")
    assert len(ends) == 2 and all(retry for _text, _footer, retry in ends)
    assert [m.state for m in repo.messages(controller.chat_id)] == ["done", "interrupted"] * 2
    errors = [args[0] for args in view.named("show_error")]
    assert "boom" in errors[0] and errors[1] == "The answer ended unexpectedly."


def test_cancellation_is_the_class_not_the_name(rig):
    controller, view, engine, _repo = rig

    class ResolveCancelled(Exception):  # named like one, but not an engine.errors.Cancelled
        pass

    for error in (Cancelled("stop"), ResolveCancelled("stop")):
        controller.load_model("other")
        job = len(engine.jobs)
        controller.on_failed(JobFailed(job, "load", str(error), True, error=error))
        controller.on_job_done(job)
    statuses = [args[0] for args in view.named("set_status") if "loading" in args[0]]
    assert statuses == ["Model loading cancelled — still using M", "Model loading failed — still using M"]
    assert len(view.named("show_error")) == 1  # only the one that is not a cancellation


def test_overflow_names_the_file_and_drops_what_was_not_saved(rig, tmp_path):
    controller, view, engine, repo = rig
    controller.attach_files([str(tmp_path / "war-and-peace.txt")])
    job = len(engine.jobs)
    controller.on_document_ready(DocumentReady(job, str(tmp_path / "war-and-peace.txt"),
                                               DocumentText("untitled", "x" * 100, "war-and-peace.txt"), 25))
    assert [a.document.title for a in controller.documents] == ["war-and-peace"]  # not "untitled"
    error = ContextOverflowError("the conversation needs 600,000 prompt tokens + 256 for the answer = 600,256, "
                                 "but this model's context holds 8,192: remove a document, …")
    controller.on_failed(JobFailed(job, "ingest", str(error), True, error=error))
    controller.on_job_done(job)
    (overflow,), = view.named("show_overflow")
    assert overflow.names == ("war-and-peace.txt",) and overflow.context_to_ask_for == 1 << 20
    assert list(controller.documents) == [] and repo.list_chats() == []  # nothing was added
    assert [ev.reason for name, ev in view.named("emit") if name == "prefillFinished"] == [FinishReason.ERROR]


def test_a_user_error_while_removing_a_document_is_shown(rig):
    controller, view, _engine, _repo = rig
    attached = controller.documents.add(DocumentText("Notes", "text", "notes.md"), 2, sha256="abc")
    controller.chat_id = 999  # a chat that is gone
    controller.repo.remove_document = lambda *a: (_ for _ in ()).throw(UserError("the chat was deleted"))
    controller.remove_document(attached.key)
    assert view.named("show_error")[-1][0] == "Could not remove the document: the chat was deleted"
