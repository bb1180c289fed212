"""Books that do not fit (issue 14): passages keep the book's boundaries, the selection covers the
passages that name the answer, keeps document order, never exceeds the budget, and the same
question twice reuses the KV prefix."""
from __future__ import annotations

import re

import pytest

from engine.decoding.passage_fit import fit_prompt
from engine.documents import read_document
from engine.documents.passages import (fit_documents, rank_passages, render_selection, select_passages,
                                       split_passages)
from engine.errors import ContextOverflowError
from engine.events import ChatMessage, DocumentText
from tests.conftest import SAMPLE_DIR

HAMLET = SAMPLE_DIR / "hamlet.md"
MACBETH = SAMPLE_DIR / "macbeth.md"


def words(texts):
    """A stand-in token counter (whitespace words): fast, and exact enough for splitting tests."""
    return [len(t.split()) for t in texts]


@pytest.fixture(scope="module")
def hamlet() -> DocumentText:
    return read_document(HAMLET)


def test_passages_never_cross_a_scene_and_cover_the_play(hamlet):
    passages = split_passages(hamlet, words, max_tokens=200)
    assert len(passages) > 100
    for p in passages:
        assert hamlet.text[p.start:p.start + 40] == p.text[:40]  # offsets point into the document
        # headings may open a passage ("## ACT V" then "### SCENE I."), never sit inside one
        heads = [para.startswith("#") for para in p.text.split("\n\n")]
        assert heads == sorted(heads, reverse=True), p.label
        assert p.tokens <= 200 + 40, (p.label, p.tokens)  # the cap, give or take the joins
    # every word of the play is in exactly one passage, in order
    assert " ".join(" ".join(p.text.split()) for p in passages).split() == hamlet.text.split()
    assert [p.index for p in passages] == list(range(len(passages)))
    assert all(a.start < b.start for a, b in zip(passages, passages[1:]))
    last = passages[-1]
    assert last.label.startswith("ACT V, SCENE II. A hall in the castle. (part ") and "Fortinbras" in last.text.title()
    assert re.fullmatch(r"ACT I, SCENE I\. .+ \(part 1 of \d+\)", passages[0].label)


def test_pdf_pages_are_passage_boundaries(tmp_path):
    fpdf = pytest.importorskip("fpdf")
    pdf = fpdf.FPDF()
    pdf.set_font("helvetica", size=11)
    for n in range(1, 4):
        pdf.add_page()
        pdf.multi_cell(0, 6, f"Page {n} opens here. " + " ".join(f"word{n}x{i}" for i in range(60)))
    path = tmp_path / "three.pdf"
    pdf.output(str(path))
    doc = read_document(path)
    passages = split_passages(doc, words, max_tokens=25)
    assert [p.label.split(" (")[0] for p in passages if "(part 1 " in p.label] == ["page 1", "page 2", "page 3"]
    for p in passages:
        page = int(p.label.split()[1])
        assert all(w.startswith(f"word{page}x") or not w.startswith("word") for w in p.text.split()), p.label


def test_plain_text_chapters_and_paragraphs():
    text = ("CHAPTER I\n\nThe first chapter has a dog.\n\nAnd a second paragraph.\n\n"
            "CHAPTER II\n\nThe second chapter has a cat.")
    passages = split_passages(DocumentText("Tale", text, meta={"format": "text"}), words, max_tokens=50)
    assert [p.label for p in passages] == ["CHAPTER I", "CHAPTER II"]
    unlabelled = split_passages(DocumentText("Notes", "one two\n\nthree four\n\nfive", meta={"format": "text"}),
                                words, max_tokens=2)
    assert [(p.label, p.text) for p in unlabelled] == [("passage 1", "one two"), ("passage 2", "three four"),
                                                       ("passage 3", "five")]


@pytest.mark.parametrize("question, needle", [
    ("What does the Queen drink, and what does she cry when she is poisoned?", "I am poison'd"),
    ("Whose skull does the gravedigger show? Alas, poor Yorick.", "Alas, poor Yorick"),
    ("Who arrives from Poland with the English ambassadors at the end, and who gets the crown?", "Fortinbras"),
])
def test_selection_covers_the_passage_that_names_the_answer(hamlet, question, needle):
    passages = split_passages(hamlet, words)
    scores = rank_passages(passages, question)
    chosen = select_passages(passages, scores, budget=3000)
    assert any(needle in p.text for p in chosen), [p.label for p in chosen]
    assert [p.index for p in chosen] == sorted(p.index for p in chosen)  # document order
    assert sum(p.tokens for p in chosen) <= 3000
    # a question sharing no word with the play selects nothing rather than filler
    assert select_passages(passages, rank_passages(passages, "zxqv wkjh"), 3000) == []


def test_render_is_deterministic_and_in_document_order(hamlet):
    passages = split_passages(hamlet, words)
    chosen = select_passages(passages, rank_passages(passages, "Ophelia drowned willow brook"), 2000)
    text = render_selection(hamlet.title, chosen, len(passages))
    assert text == render_selection(hamlet.title, list(chosen), len(passages))
    offsets = [text.index(f"[{p.label}]\n") for p in chosen]
    assert offsets == sorted(offsets) and len(chosen) >= 3


@pytest.mark.parametrize("context", [2048, 4096, 8192])
def test_the_budget_is_never_exceeded(bundled_tokenizer, context):
    """Measured on the real rendered prompt (chat template, history, both plays)."""
    docs = [read_document(HAMLET), read_document(MACBETH)]
    history = [ChatMessage("user", "Who is Banquo?"), ChatMessage("assistant", "A general, and Macbeth's friend. " * 20)]
    for question in ("Who kills Polonius, and where?", "What do the witches promise Banquo?",
                     "sleep no more", "the"):
        messages = history + [ChatMessage("user", question)]
        result = fit_prompt(bundled_tokenizer, messages, docs, ["passages", "passages"], None, context, 256)
        from engine.decoding.prompt import render_tokens

        real = len(render_tokens(bundled_tokenizer, messages, list(result.documents)))
        assert real == result.prompt_tokens <= result.limit == context - 256 - 64
        if question == "the":  # only a stopword: no passage shares a word with it, none is taken
            assert all(not sel.passages for sel in result.selections)
        else:  # the budget is used, not left empty (history reserve + at most a passage or two)
            assert result.limit - real < context // 8 + 800
        for sel in result.selections:
            assert [p.index for p in sel.passages] == sorted(p.index for p in sel.passages)


def test_whole_is_the_default_refusal_and_names_passages(bundled_tokenizer):
    doc = read_document(HAMLET)
    with pytest.raises(ContextOverflowError, match=r"--fit passages") as err:
        fit_prompt(bundled_tokenizer, [ChatMessage("user", "Who is Hamlet?")], [doc], ["whole"], None, 8192, 256)
    assert "\n" not in str(err.value) and "8,192" in str(err.value)
    with pytest.raises(ValueError):
        fit_documents([doc], ["most"], "q", len, 100, words)


def test_no_room_even_without_passages_is_refused(bundled_tokenizer):
    doc = read_document(HAMLET)
    long_history = [ChatMessage("user", "word " * 3000), ChatMessage("assistant", "ok"), ChatMessage("user", "And?")]
    with pytest.raises(ContextOverflowError, match="even without any passage"):
        fit_prompt(bundled_tokenizer, long_history, [doc], ["passages"], None, 2048, 256)


def test_same_question_twice_reuses_the_prefix(tiny_model_dir, bundled_tokenizer):
    """Through ChatSession with a tiny model: the second turn's passages render identically, so
    only the new turn is prefilled; another question re-prefills from its first changed passage."""
    from engine.decoding.session import ChatSession, common_prefix
    from engine.model.loading import load_folder
    from engine.settings import DecodeSettings

    folder = tiny_model_dir("llama")
    target = load_folder(folder, device="cpu")
    settings = DecodeSettings(mode="ar", max_new_tokens=8)
    session = ChatSession(target, settings, draft="none", capacity=4096)
    doc = read_document(HAMLET)
    question = "Who kills Polonius behind the arras?"

    def turn(messages):
        fitted = fit_prompt(target.tokenizer, messages, [doc], ["passages"], None, 4096, 8)
        before = session.prefilled_tokens_total
        answer = session.generate(messages, list(fitted.documents))
        return fitted, session.prefilled_tokens_total - before, answer

    first, prefilled1, answer = turn([ChatMessage("user", question)])
    assert prefilled1 == first.prompt_tokens > 2000
    messages = [ChatMessage("user", question), ChatMessage("assistant", answer), ChatMessage("user", question)]
    second, prefilled2, _ = turn(messages)
    assert second.selections[0].passages == first.selections[0].passages
    assert second.documents[0].text == first.documents[0].text
    # the new turn only, from the start of the 256-token prefill chunk it begins in: the
    # passages' KV was reused
    assert prefilled2 < 100 + 256, prefilled2
    # a different question keeps the KV up to its first changed passage
    other = messages + [ChatMessage("assistant", "x"), ChatMessage("user", "What does the ghost ask of Hamlet?")]
    held = list(session.held)
    third, prefilled3, _ = turn(other)
    assert third.selections[0].passages != first.selections[0].passages
    kept = common_prefix(held, session.prompt_tokens(other, list(third.documents)))
    assert 0 < kept < third.prompt_tokens
    assert prefilled3 == third.prompt_tokens - kept // 256 * 256  # from the chunk the first change is in


def test_the_fit_is_kept_with_the_chat_and_exported(tmp_path):
    from engine.store.chats import ChatStore

    store = ChatStore(tmp_path / "chats.sqlite3")
    chat = store.create_chat("a book")
    book = store.add_document(chat.id, DocumentText("Hamlet", "To be or not to be", meta={"format": "markdown"}))
    other = store.add_document(chat.id, DocumentText("Note", "a short note"))
    assert [d.fit for d in store.chat_documents(chat.id)] == ["whole", "whole"]
    store.set_document_fit(chat.id, book.sha256, "passages")
    assert [d.fit for d in store.chat_documents(chat.id, with_text=False)] == ["passages", "whole"]
    assert [d["fit"] for d in store.export_json(chat.id)["documents"]] == ["passages", "whole"]
    assert "Hamlet (markdown, 18 bytes, answered from its most relevant passages)" in store.export_markdown(chat.id)
    with pytest.raises(ValueError):
        store.set_document_fit(chat.id, other.sha256, "half")
    store.close()


def test_bench_workload_cites_the_answer_passage_of_each_last_act_question(tiny_model_dir):
    """The `bench --workload passages` runner, on a tiny model: every run reaches its first token,
    prefills only the selected passages, and cites the passage that holds the answer."""
    from engine.model.loading import load_folder
    from engine.settings import DecodeSettings
    from engine.tools.bench_passages import LAST_ACT_QUESTIONS, format_passages_report, run_passages_bench

    model = load_folder(tiny_model_dir("llama"), device="cpu")
    report = run_passages_bench(model, read_document(HAMLET), DecodeSettings(mode="ar", max_new_tokens=4),
                                draft="none", log=lambda _m: None)
    assert len(report["runs"]) == len(LAST_ACT_QUESTIONS) and report["document_tokens"] > 40_000
    for run in report["runs"]:
        assert run["time_to_first_token_s"] > 0 and 2_000 < run["prefill_tokens"] <= 8192 - 4 - 64
        assert run["answer_passage_cited"] and run["answer_passage_cited"].startswith("ACT V")
    assert report["answer_passage_cited"] == 3 and "median" in format_passages_report(report)
