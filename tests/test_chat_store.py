"""ChatStore: API, cascade, search, export, two threads at once, migrations, kill -9 survival."""
from __future__ import annotations

import json
import random
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from engine.store.chats import MIGRATIONS, ChatStore, Migration
from engine.errors import StoreError
from engine.events import DocumentText, FinishReason, Finished

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def store(tmp_path):
    s = ChatStore(tmp_path / "chats.sqlite3")
    yield s
    s.close()


def doc(text: str, title: str = "Book") -> DocumentText:
    return DocumentText(title=title, text=text, source=f"/books/{title}.txt", meta={"format": "text", "bytes": len(text)})


def test_default_path_follows_triforce_home(tmp_path, monkeypatch):
    monkeypatch.setenv("TRIFORCE_HOME", str(tmp_path / "home"))
    s = ChatStore()
    assert s.path == tmp_path / "home" / "chats.sqlite3" and s.path.exists()
    s.close()


def test_wal_and_foreign_keys(store):
    conn = store._conn()
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA foreign_keys").fetchone()[0] == 1


def test_chat_and_messages_round_trip(store):
    chat = store.create_chat("First", model_spec="bundled", settings={"budget": 1024})
    m0 = store.add_message(chat.id, "user", "What is in chapter 2?")
    m1 = store.add_message(chat.id, "assistant", "A storm.", stats={"tokens_per_s": 12.5},
                           level_spans=[(0, 2, 0), (2, 8, 2)])
    got = store.get_chat(chat.id)
    assert (got.title, got.model_spec, got.settings) == ("First", "bundled", {"budget": 1024})
    assert [m.idx for m in got.messages] == [0, 1] == [m0.idx, m1.idx]
    assert got.messages[1].stats == {"tokens_per_s": 12.5}
    assert got.messages[1].level_spans == ((0, 2, 0), (2, 8, 2))
    assert got.messages[0].stats == {} and got.messages[0].level_spans == ()
    assert got.updated >= got.created


def test_rename_settings_and_update(store):
    chat = store.create_chat()
    store.rename_chat(chat.id, "Renamed")
    store.set_chat_settings(chat.id, {"gamma1": 3})
    store.set_chat_model(chat.id, "Qwen/Qwen2.5-7B-Instruct-1M")
    assert store.get_chat_settings(chat.id) == {"gamma1": 3}
    store.add_message(chat.id, "user", "q")
    store.add_message(chat.id, "assistant", "")  # placeholder while streaming
    metrics = Finished(reason=FinishReason.EOS, text="full answer")  # a dataclass is stored as its dict
    updated = store.update_message(chat.id, 1, text="full answer", stats=metrics, level_spans=[(0, 4, 1)])
    assert updated.text == "full answer" and updated.stats["reason"] == "eos"
    got = store.get_chat(chat.id)
    assert got.title == "Renamed" and got.model_spec.startswith("Qwen") and got.messages[1].level_spans == ((0, 4, 1),)
    with pytest.raises(StoreError, match="no longer exists"):
        store.update_message(chat.id, 7, text="x")


def test_delete_messages_from_for_regenerate(store):
    chat = store.create_chat()
    for i in range(5):
        store.add_message(chat.id, "user" if i % 2 == 0 else "assistant", f"m{i}")
    assert store.delete_messages_from(chat.id, 3) == 2
    assert [m.text for m in store.messages(chat.id)] == ["m0", "m1", "m2"]
    assert store.add_message(chat.id, "assistant", "again").idx == 3


def test_missing_chat_and_bad_input(store):
    with pytest.raises(StoreError, match="Chat 99 does not exist"):
        store.add_message(99, "user", "x")
    with pytest.raises(StoreError, match="does not exist"):
        store.get_chat(99)
    chat = store.create_chat()
    with pytest.raises(ValueError, match="role"):
        store.add_message(chat.id, "robot", "x")
    with pytest.raises(ValueError, match="level spans"):
        store.add_message(chat.id, "assistant", "x", level_spans=[(5, 2, 0)])


def test_delete_chat_cascades_and_drops_orphan_documents(store):
    a, b = store.create_chat("a"), store.create_chat("b")
    store.add_message(a.id, "user", "hello")
    shared, own = doc("shared text", "Shared"), doc("only in a", "Own")
    store.add_document(a.id, shared)
    store.add_document(a.id, own)
    store.add_document(b.id, shared)
    store.delete_chat(a.id)
    conn = store._conn()
    assert conn.execute("SELECT COUNT(*) FROM messages").fetchone()[0] == 0
    assert conn.execute("SELECT COUNT(*) FROM chat_documents").fetchone()[0] == 1
    assert [r[0] for r in conn.execute("SELECT title FROM documents")] == ["Shared"]
    assert [c.title for c in store.list_chats()] == ["b"]
    with pytest.raises(StoreError):
        store.delete_chat(a.id)


def test_documents_dedupe_order_and_token_counts(store):
    chat = store.create_chat()
    first = store.add_document(chat.id, doc("The whole book.", "Book"))
    again = store.add_document(chat.id, doc("The whole book.", "Same text, other name"))
    second = store.add_document(chat.id, doc("Another text.", "Notes"))
    assert first == again and (first.position, second.position) == (0, 1)
    store.set_token_count(chat.id, first.sha256, "bundled", 1234)
    store.set_token_count(chat.id, first.sha256, "llama-3.1-8b", 1100)
    docs = store.chat_documents(chat.id)
    assert [d.title for d in docs] == ["Book", "Notes"] and docs[0].text == "The whole book."
    assert docs[0].token_counts == {"bundled": 1234, "llama-3.1-8b": 1100}
    assert store.chat_documents(chat.id, with_text=False)[0].text == ""
    other = store.create_chat()
    store.add_document(other.id, doc("The whole book."))
    assert store._conn().execute("SELECT COUNT(*) FROM documents").fetchone()[0] == 2
    store.remove_document(chat.id, second.sha256)
    assert [d.title for d in store.chat_documents(chat.id)] == ["Book"]
    assert store._conn().execute("SELECT COUNT(*) FROM documents").fetchone()[0] == 1


def test_list_and_search(store):
    a = store.create_chat("Hamlet questions")
    b = store.create_chat("Contract")
    c = store.create_chat("Über Kafka")
    store.add_message(b.id, "user", "Who is the LANDLORD in 50% of cases?")
    store.add_message(c.id, "assistant", "Gregor wacht auf. STRAẞE")
    assert [s.id for s in store.list_chats()] == [c.id, b.id, a.id]  # most recently updated first
    assert [s.message_count for s in store.list_chats()] == [1, 1, 0]
    assert [s.id for s in store.list_chats("hamlet")] == [a.id]
    assert [s.id for s in store.list_chats("landlord")] == [b.id]
    assert [s.id for s in store.list_chats("50%")] == [b.id]  # LIKE wildcards are escaped
    assert store.list_chats("5_%") == []
    assert [s.id for s in store.list_chats("über")] == [c.id]  # non-ASCII: casefolded match
    assert [s.id for s in store.list_chats("straße")] == [c.id]
    assert store.list_chats("nothing like it") == []


def test_global_settings(store):
    assert store.get_setting("theme", "light") == "light"
    store.set_setting("theme", "dark")
    store.set_setting("budgets", {"retrieval": 4096})
    store.set_setting("theme", "auto")
    assert store.get_setting("theme") == "auto" and store.get_setting("budgets") == {"retrieval": 4096}


def test_export_markdown_and_json(store):
    chat = store.create_chat("Storm talk", model_spec="bundled")
    store.add_document(chat.id, doc("It was a dark and stormy night.", "Novel"))
    store.add_message(chat.id, "user", "How does it start?")
    store.add_message(chat.id, "assistant", "With a storm.", stats={"new_tokens": 4}, level_spans=[(0, 5, 0)])
    md = store.export_markdown(chat.id)
    assert md.startswith("# Storm talk\n")
    assert "- Model: bundled" in md and "- Document: Novel (text, 31 bytes)" in md
    assert "## User\n\nHow does it start?\n\n## Assistant\n\nWith a storm.\n" in md
    data = store.export_json(chat.id)
    json.dumps(data)  # serializable as is
    assert data["format"] == "triforce-chat" and data["chat"]["title"] == "Storm talk"
    assert [m["role"] for m in data["messages"]] == ["user", "assistant"]
    assert data["messages"][1]["level_spans"] == [[0, 5, 0]] and data["messages"][1]["stats"] == {"new_tokens": 4}
    assert "text" not in data["documents"][0]
    assert store.export_json(chat.id, include_document_text=True)["documents"][0]["text"].startswith("It was")


def test_transaction_groups_writes_and_rolls_back(store):
    with pytest.raises(RuntimeError):
        with store.transaction():
            chat = store.create_chat("doomed")
            store.add_message(chat.id, "user", "x")
            raise RuntimeError("boom")
    assert store.list_chats() == []
    with store.transaction():
        keep = store.create_chat("kept")
        try:
            with store.transaction():  # a nested block is a savepoint
                store.add_message(keep.id, "user", "undone")
                raise KeyError("inner")
        except KeyError:
            pass
        store.add_message(keep.id, "user", "done")
    assert [m.text for m in store.messages(keep.id)] == ["done"]


def test_gui_thread_and_worker_thread_at_once(store):
    chat = store.create_chat("shared")
    errors: list[BaseException] = []

    def writer(role: str) -> None:
        try:
            for i in range(60):
                store.add_message(chat.id, role, f"{role} {i}")
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    def reader() -> None:
        try:
            for _ in range(60):
                store.list_chats("user")
                msgs = store.messages(chat.id)
                assert [m.idx for m in msgs] == list(range(len(msgs)))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(r,)) for r in ("user", "assistant")]
    threads.append(threading.Thread(target=reader))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    msgs = store.messages(chat.id)
    assert len(msgs) == 120 and sorted(m.idx for m in msgs) == list(range(120))


# -- schema versions ----------------------------------------------------------------------

def test_newer_schema_refused_with_advice(tmp_path):
    path = tmp_path / "chats.sqlite3"
    ChatStore(path).close()
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE schema_version SET version = 7")
    conn.close()
    with pytest.raises(StoreError, match=rf"newer TriForce Chat \(schema v7.*up to v{len(MIGRATIONS)}\).*Update the app"):
        ChatStore(path)


def test_older_schema_is_migrated_with_a_backup(tmp_path):
    path = tmp_path / "chats.sqlite3"
    old = ChatStore(path)
    chat = old.create_chat("from the current schema")
    old.add_message(chat.id, "user", "kept")
    old.close()
    now = len(MIGRATIONS)
    pin = Migration(now + 1, "pin chats", ("ALTER TABLE chats ADD COLUMN pinned INTEGER NOT NULL DEFAULT 0",))
    new = ChatStore(path, migrations=(*MIGRATIONS, pin))
    assert new._conn().execute("SELECT version FROM schema_version").fetchone()[0] == now + 1
    assert new._conn().execute("SELECT pinned FROM chats").fetchone()[0] == 0
    assert [m.text for m in new.messages(chat.id)] == ["kept"]
    new.close()
    backup = sqlite3.connect(tmp_path / f"chats.sqlite3.v{now}.bak")
    assert backup.execute("SELECT version FROM schema_version").fetchone()[0] == now
    backup.close()


def test_v1_store_gains_message_states(tmp_path):
    """A store written before message states opens with every message "done", except a last
    question no answer follows, which a crash left behind: it comes back "interrupted"."""
    path = tmp_path / "chats.sqlite3"
    old = ChatStore(path, migrations=MIGRATIONS[:1])
    answered, orphan = old.create_chat("answered"), old.create_chat("orphan")
    for role, text in (("user", "q1"), ("assistant", "a1")):
        old._conn().execute("INSERT INTO messages (chat_id, idx, role, text, created) VALUES (?, ?, ?, ?, 0)",
                            (answered.id, 0 if role == "user" else 1, role, text))
    old._conn().execute("INSERT INTO messages (chat_id, idx, role, text, created) VALUES (?, 0, 'user', 'lost?', 0)",
                        (orphan.id,))
    old.close()
    new = ChatStore(path)
    assert [m.state for m in new.messages(answered.id)] == ["done", "done"]
    assert [m.state for m in new.messages(orphan.id)] == ["interrupted"]
    assert new.retry_question(orphan.id).text == "lost?" and new.retry_question(answered.id) is None
    new.close()


def test_foreign_or_damaged_file_refused(tmp_path):
    foreign = tmp_path / "other.sqlite3"
    with sqlite3.connect(foreign) as conn:
        conn.execute("CREATE TABLE notes (x)")
    conn.close()
    with pytest.raises(StoreError, match="not a TriForce Chat store"):
        ChatStore(foreign)
    junk = tmp_path / "junk.sqlite3"
    junk.write_bytes(b"this is not sqlite at all" * 100)
    with pytest.raises(StoreError, match="damaged.*Move it aside"):
        ChatStore(junk)


# -- crash safety -------------------------------------------------------------------------

WRITER = textwrap.dedent("""
    import random, sys
    from engine.store.chats import ChatStore
    store = ChatStore(sys.argv[1])
    rng = random.Random(int(sys.argv[2]))
    print("ready", flush=True)
    while True:
        with store.transaction():
            chat = store.create_chat("crash test")
            for j in range(int(sys.argv[3])):
                store.add_message(chat.id, "user" if j % 2 == 0 else "assistant", "x" * rng.randint(1, 20000))
        print(chat.id, flush=True)
""")


def test_kill_dash_nine_never_leaves_partial_chats(tmp_path):
    path, per_chat, rng = tmp_path / "crash.sqlite3", 8, random.Random(1234)
    ChatStore(path).close()
    committed: set[int] = set()
    for kill in range(20):
        proc = subprocess.Popen([sys.executable, "-c", WRITER, str(path), str(kill), str(per_chat)],
                                cwd=REPO, stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(rng.uniform(0.0, 0.25))
        proc.kill()  # SIGKILL: no cleanup, no rollback
        out, _ = proc.communicate()
        committed |= {int(line) for line in out.split()}
    assert len(committed) > 20  # the writer really wrote between kills

    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert conn.execute("PRAGMA foreign_key_check").fetchall() == []
    counts = dict(conn.execute("SELECT c.id, COUNT(m.id) FROM chats c LEFT JOIN messages m ON m.chat_id = c.id "
                               "GROUP BY c.id").fetchall())
    conn.close()
    assert set(counts.values()) == {per_chat}  # every chat is complete: all its messages or none at all
    assert committed <= set(counts)  # every commit the writer reported survived
    store = ChatStore(path)
    assert all(s.message_count == per_chat for s in store.list_chats())
    store.close()


# -- `main.py chats` ----------------------------------------------------------------------

def test_cli_lists_and_exports(tmp_path, capsys):
    from engine.cli import main

    assert main(["chats"]) == 0
    assert "no chats yet" in capsys.readouterr().out
    store = ChatStore()  # the conftest points TRIFORCE_HOME at this test's own folder
    chat = store.create_chat("Moby Dick questions")
    store.add_message(chat.id, "user", "Who is Ishmael?")
    store.add_message(chat.id, "assistant", "The narrator.")
    store.create_chat("Empty one")
    store.close()

    assert main(["chats"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["ID", "UPDATED", "MSGS", "TITLE"]
    assert out[1].split()[0] == "2" and out[1].endswith("Empty one")
    assert out[2].split()[0] == "1" and out[2].split()[3] == "2" and out[2].endswith("Moby Dick questions")
    assert main(["chats", "--search", "ishmael"]) == 0
    assert "Moby Dick" in capsys.readouterr().out

    assert main(["chats", "--export", str(chat.id)]) == 0
    assert "## Assistant\n\nThe narrator." in capsys.readouterr().out
    assert main(["chats", "--export", str(chat.id), "--format", "json", "--out", str(tmp_path / "c.json")]) == 0
    assert json.loads((tmp_path / "c.json").read_text())["messages"][0]["text"] == "Who is Ishmael?"


def test_cli_errors_are_one_line_and_exit_2(tmp_path, capsys):
    from engine.cli import main

    assert main(["chats", "--export", "42"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: Chat 42 does not exist") and err.count("\n") == 1
    store = ChatStore()
    chat = store.create_chat("x")
    store.close()
    assert main(["chats", "--export", str(chat.id), "--out", str(tmp_path / "no" / "such" / "dir.md")]) == 2
    assert "Cannot write" in capsys.readouterr().err


# -- turns: a question and its answer as one transaction ------------------------------------

def test_turn_writes_question_and_streaming_answer_together(store):
    chat = store.create_chat("turns")
    turn = store.begin_turn(chat.id, "Who is Ishmael?", checkpoint_s=3600)
    assert [(m.role, m.text, m.state) for m in store.messages(chat.id)] == [
        ("user", "Who is Ishmael?", "done"), ("assistant", "", "streaming")]
    assert not turn.checkpoint("The nar")  # within the interval: no write
    assert turn.checkpoint("The narr", [(0, 8, 1)], force=True)
    assert store.messages(chat.id)[1].text == "The narr" and store.messages(chat.id)[1].level_spans == ((0, 8, 1),)
    final = turn.finish("The narrator.", stats={"new_tokens": 4})
    assert (final.text, final.state, final.stats, final.partial) == ("The narrator.", "done", {"new_tokens": 4}, False)
    assert store.messages(chat.id)[1] == final
    assert not turn.checkpoint("late", force=True)  # a finished turn is never rewritten
    assert store.retry_question(chat.id) is None


def test_turn_checkpoints_at_most_once_per_interval(store):
    chat = store.create_chat("throttle")
    turn = store.begin_turn(chat.id, "q", checkpoint_s=0.2)
    saved, text, start = 0, "", time.monotonic()
    while time.monotonic() - start < 1.0:
        text += "x"
        saved += turn.checkpoint(text)
        time.sleep(0.005)
    assert 3 <= saved <= 6  # ~1 s / 0.2 s, never once per token (~150 calls)
    assert len(store.messages(chat.id)[1].text) >= len(text) - 60  # at most one interval behind


def test_stopped_and_interrupted_marks_and_export(store):
    chat = store.create_chat("marks")
    store.begin_turn(chat.id, "stop me").finish("", state="stopped")
    store.begin_turn(chat.id, "cut off").finish("Half an ans", state="interrupted")
    states = [(m.role, m.state, m.partial) for m in store.messages(chat.id)]
    assert states == [("user", "done", False), ("assistant", "stopped", True),
                      ("user", "done", False), ("assistant", "interrupted", True)]
    assert store.retry_question(chat.id).text == "cut off"
    md = store.export_markdown(chat.id)
    assert "*(stopped: partial answer)*" in md and "Half an ans\n\n*(interrupted: partial answer)*" in md
    assert [m["state"] for m in store.export_json(chat.id)["messages"]][1::2] == ["stopped", "interrupted"]
    with pytest.raises(ValueError, match="state must be one of"):
        store.begin_turn(chat.id, "x").finish("y", state="streaming")


def test_turn_on_a_deleted_chat_says_so(store):
    chat = store.create_chat("gone")
    turn = store.begin_turn(chat.id, "q")
    store.delete_chat(chat.id)
    assert not turn.checkpoint("a", force=True)
    with pytest.raises(StoreError, match="deleted or edited meanwhile"):
        turn.finish("answer")


def test_discarded_turn_leaves_nothing(store):
    chat = store.create_chat("failed turn")
    store.begin_turn(chat.id, "q").discard()
    assert store.messages(chat.id) == ()


TURN_WRITER = textwrap.dedent("""
    import sys, time
    from engine.store.chats import ChatStore
    store = ChatStore(sys.argv[1])
    turn = store.begin_turn(int(sys.argv[2]), "question from " + sys.argv[3], checkpoint_s=0.05)
    text = ""
    for i in range(int(sys.argv[4])):
        text += f"{i} "
        turn.checkpoint(text)
        time.sleep(0.01)
    if sys.argv[5] == "finish":
        turn.finish(text)
    print("done", flush=True)
    time.sleep(float(sys.argv[6]))  # stay alive (and owning the rows) for a while
""")


def test_crashed_writer_is_marked_interrupted_but_a_live_one_is_not(tmp_path):
    path = tmp_path / "turns.sqlite3"
    setup = ChatStore(path)
    chat = setup.create_chat("recovery").id
    setup.close()
    dead = subprocess.Popen([sys.executable, "-c", TURN_WRITER, str(path), str(chat), "dead", "30", "no", "60"],
                            cwd=REPO, stdout=subprocess.PIPE, text=True)
    assert dead.stdout.readline().strip() == "done"
    dead.kill()
    dead.communicate()
    alive = subprocess.Popen([sys.executable, "-c", TURN_WRITER, str(path), str(chat), "alive", "5", "no", "60"],
                             cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert alive.stdout.readline().strip() == "done"
        store = ChatStore(path)  # opening recovers what the killed writer left
        rows = [(m.role, m.text, m.state) for m in store.messages(chat)]
        assert rows[0] == ("user", "question from dead", "done")
        assert rows[1][2] == "interrupted" and rows[1][1].startswith("0 1 2 ") and len(rows[1][1]) >= 50
        assert rows[2] == ("user", "question from alive", "done")
        assert rows[3][2] == "streaming" and "0 1 2 3 4 ".startswith(rows[3][1])  # its last checkpoint
        assert store.retry_question(chat) is None  # the last turn is still being written
        store.close()
    finally:
        alive.kill()
        alive.communicate()
    store = ChatStore(path)
    assert [m.state for m in store.messages(chat)] == ["done", "interrupted", "done", "interrupted"]
    assert store.retry_question(chat).text == "question from alive"
    store.close()


def test_two_writers_never_split_a_turn(tmp_path):
    path = tmp_path / "two.sqlite3"
    setup = ChatStore(path)
    chat = setup.create_chat("shared").id
    setup.close()
    procs = [subprocess.Popen([sys.executable, "-c", TURN_WRITER, str(path), str(chat), name, "8", "finish", "0"],
                              cwd=REPO, stdout=subprocess.PIPE, text=True) for name in ("a", "b", "c")]
    for _ in range(2):  # a second turn each, racing the others'
        for p in procs:
            p.communicate(timeout=60)
        procs = [subprocess.Popen([sys.executable, "-c", TURN_WRITER, str(path), str(chat), name, "8", "finish", "0"],
                                  cwd=REPO, stdout=subprocess.PIPE, text=True) for name in ("a", "b", "c")]
    for p in procs:
        p.communicate(timeout=60)
    store = ChatStore(path)
    messages = store.messages(chat)
    store.close()
    assert len(messages) == 18
    for question, answer in zip(messages[0::2], messages[1::2]):
        assert (question.role, answer.role, answer.state) == ("user", "assistant", "done")
        assert answer.text == "0 1 2 3 4 5 6 7 "
