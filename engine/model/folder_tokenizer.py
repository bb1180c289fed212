"""The tokenizer and config of a GGUF's metadata folder, read without transformers.

The folder's tokenizer.json was built by transformers' GGUF converter (engine/model/gguf_meta.py),
so the `tokenizers` backend holds every rule (normalizer, pre-tokenizer, post-processor, decoder):
the few calls the engine makes (encode, decode, the chat template, the vocabulary) go straight to
it, and the chat template renders in a jinja2 sandbox set up as transformers sets up its own. A
test holds this tokenizer to transformers' on the bundled model. Importing transformers takes about
as long as importing torch; a warm start of a GGUF needs neither it nor its config classes.
"""
from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any, Sequence

SPECIAL_NAMES = ("bos_token", "eos_token", "unk_token", "pad_token")


class FolderConfig:
    """A config.json as attributes (what the runner and the planner read); to_dict() gives it back."""

    def __init__(self, values: dict) -> None:
        self._values = dict(values)
        self.__dict__.update(values)

    def to_dict(self) -> dict:
        return dict(self._values)

    @classmethod
    def from_folder(cls, path: Path) -> "FolderConfig":
        return cls(json.loads((Path(path) / "config.json").read_text(encoding="utf-8")))


class FolderTokenizer:
    """tokenizer.json + tokenizer_config.json (+ chat_template.jinja) through the `tokenizers` library."""

    def __init__(self, path: Path) -> None:
        from tokenizers import Tokenizer

        path = Path(path)
        self.backend = Tokenizer.from_file(str(path / "tokenizer.json"))
        settings = json.loads((path / "tokenizer_config.json").read_text(encoding="utf-8")) \
            if (path / "tokenizer_config.json").is_file() else {}
        template = path / "chat_template.jinja"
        self.chat_template = template.read_text(encoding="utf-8") if template.is_file() else \
            settings.get("chat_template")
        self.special_tokens_map = {name: _content(settings[name]) for name in SPECIAL_NAMES
                                   if settings.get(name) is not None}
        for name in SPECIAL_NAMES:
            token = self.special_tokens_map.get(name)
            setattr(self, name, token)
            setattr(self, f"{name}_id", self.backend.token_to_id(token) if token is not None else None)
        self._template = None

    @staticmethod
    def shared(path: Path) -> "FolderTokenizer":
        """The folder's tokenizer, built once per process while its files stay the same (a chat
        reads it to fit the prompt, then again to load the model: the second is free)."""
        stamp = [(f.stat().st_size, f.stat().st_mtime_ns) if f.is_file() else None
                 for f in (Path(path) / name for name in ("tokenizer.json", "tokenizer_config.json",
                                                          "chat_template.jinja"))]
        return _built(str(Path(path).resolve()), repr(stamp))

    def __len__(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=False)

    def get_vocab(self) -> dict[str, int]:
        return self.backend.get_vocab(with_added_tokens=True)

    def __call__(self, text: str | Sequence[str], add_special_tokens: bool = True,
                 return_offsets_mapping: bool = False) -> dict[str, Any]:
        """{"input_ids": ids (a list per text for a batch), "offset_mapping" when asked}."""
        batch = not isinstance(text, str)
        encodings = self.backend.encode_batch(list(text), add_special_tokens=add_special_tokens) if batch else \
            [self.backend.encode(text, add_special_tokens=add_special_tokens)]
        out: dict[str, Any] = {"input_ids": [e.ids for e in encodings]}
        if return_offsets_mapping:
            out["offset_mapping"] = [list(e.offsets) for e in encodings]
        return out if batch else {key: value[0] for key, value in out.items()}

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False,
               clean_up_tokenization_spaces: bool = False) -> str:
        """Text of `ids` (the backend's decoder; no clean-up of spaces, as the GGUF tokenizers set it)."""
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def convert_ids_to_tokens(self, ids):
        return self.backend.id_to_token(ids) if isinstance(ids, int) else [self.backend.id_to_token(i) for i in ids]

    def convert_tokens_to_ids(self, tokens):
        return self.backend.token_to_id(tokens) if isinstance(tokens, str) else \
            [self.backend.token_to_id(t) for t in tokens]

    def apply_chat_template(self, conversation: list[dict], add_generation_prompt: bool = False,
                            tokenize: bool = True, **kwargs) -> list[int] | str:
        """The conversation laid out by the model's chat template: its token ids (tokenize) or text."""
        if not self.chat_template:
            raise ValueError("this tokenizer has no chat template")
        if self._template is None:
            self._template = _compile(self.chat_template)
        text = self._template.render(messages=conversation, tools=None, documents=None,
                                     add_generation_prompt=add_generation_prompt,
                                     **{**self.special_tokens_map, **kwargs})
        return self.backend.encode(text, add_special_tokens=False).ids if tokenize else text


@lru_cache(maxsize=4)
def _built(path: str, _stamp: str) -> FolderTokenizer:
    return FolderTokenizer(Path(path))


def _content(token) -> str:
    return token["content"] if isinstance(token, dict) else str(token)


def _compile(template: str):
    """A chat template in jinja2's immutable sandbox, with transformers' settings and helpers."""
    import jinja2
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(template)
