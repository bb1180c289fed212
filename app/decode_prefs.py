"""Decoding settings as the prefs and the chat store keep them (plain dicts / JSON), Qt-free."""
from __future__ import annotations

import dataclasses
import json
from typing import Any

from engine.errors import InvalidSettingError
from engine.settings import DecodeSettings, Sampling


def settings_to_dict(s: DecodeSettings) -> dict[str, Any]:
    d = dataclasses.asdict(s)
    d["stop"] = list(s.stop)
    return d


def settings_from_dict(d: dict[str, Any] | str | None, base: DecodeSettings | None = None) -> DecodeSettings:
    """Rebuild settings from a stored dict (unknown keys ignored, bad ones fall back to `base`)."""
    base = base or DecodeSettings()
    if isinstance(d, str):
        try:
            d = json.loads(d)
        except ValueError:
            return base
    if not isinstance(d, dict):
        return base
    fields = {f.name for f in dataclasses.fields(DecodeSettings)}
    sampling_fields = {f.name for f in dataclasses.fields(Sampling)}
    kw = {k: v for k, v in d.items() if k in fields and k != "sampling"}
    if "stop" in kw:
        kw["stop"] = tuple(kw["stop"] or ())
    try:
        sampling = base.sampling
        if isinstance(d.get("sampling"), dict):
            sampling = dataclasses.replace(base.sampling, **{k: v for k, v in d["sampling"].items()
                                                             if k in sampling_fields})
        out = base.replace(sampling=sampling, **kw)
        out.validate()
        return out
    except (TypeError, ValueError, InvalidSettingError):
        return base


def apply_limits(engine: Any, prefs: Any, document_mib: int, snapshot_gib: int, save: bool = True) -> None:
    """Storage limits from the Settings panel: the engine uses them at once; kept in the prefs."""
    engine.set_limits(document_mib * 2**20, snapshot_gib * 2**30)
    if save:
        prefs.setValue("limits/max_document_mib", int(document_mib))
        prefs.setValue("limits/snapshot_cache_gib", int(snapshot_gib))
        prefs.sync()
