"""Render a conversation (+ documents) into prompt tokens with the model's chat template.

Documents go first, in the system message, so the long prefix stays identical across turns and
the session reuses its cache (and snapshots) for every question about the same book.
"""
from __future__ import annotations

from typing import Sequence

from engine.events import ChatMessage, DocumentText

DEFAULT_SYSTEM = "You are a helpful assistant. Answer questions about the documents accurately and concisely."


def system_text(system: str | None, documents: Sequence[DocumentText]) -> str | None:
    parts = [system if system is not None else (DEFAULT_SYSTEM if documents else None)]
    for doc in documents:
        parts.append(f"<document title=\"{doc.title}\">\n{doc.text}\n</document>")
    parts = [p for p in parts if p]
    return "\n\n".join(parts) if parts else None


def render_tokens(tokenizer, messages: Sequence[ChatMessage], documents: Sequence[DocumentText] = (),
                  system: str | None = None, add_generation_prompt: bool = True) -> list[int]:
    """Token ids of the conversation as the model's chat template lays it out."""
    chat = []
    sys_text = system_text(system, documents)
    if sys_text:
        chat.append({"role": "system", "content": sys_text})
    chat += [{"role": m.role, "content": m.content} for m in messages]
    if getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template(chat, add_generation_prompt=add_generation_prompt, tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        return list(ids)
    # no template (base models): plain text turns
    text = "".join(f"{m['role']}: {m['content']}\n" for m in chat) + ("assistant: " if add_generation_prompt else "")
    return tokenizer(text, add_special_tokens=True)["input_ids"]
