"""The one config loader: dataclasses filled from YAML files plus `key=value` overrides.

Unknown keys are errors naming the file (or override) and the key, so a typo in a config never
silently falls back to a default.
"""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml

T = TypeVar("T")


class ConfigError(ValueError):
    pass


def _is_dataclass_type(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def from_dict(cls: type[T], data: dict, where: str = "config") -> T:
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping for {cls.__name__}, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {f.name for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in data.items():
        if key not in fields:
            raise ConfigError(f"{where}: unknown key '{key}' for {cls.__name__}; known: {sorted(fields)}")
        tp = hints[key]
        kwargs[key] = from_dict(tp, value, f"{where}.{key}") if _is_dataclass_type(tp) else value
    return cls(**kwargs)


def _set_path(data: dict, dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    for key in keys[:-1]:
        data = data.setdefault(key, {})
    data[keys[-1]] = value


def load_config(cls: type[T], path: str | Path | None = None, overrides: typing.Iterable[str] = ()) -> T:
    """Build `cls` from an optional YAML file and `a.b=value` overrides (values parsed as YAML)."""
    data: dict = {}
    where = "defaults"
    if path is not None:
        where = str(path)
        try:
            loaded = yaml.safe_load(Path(path).read_text())
        except FileNotFoundError:
            raise ConfigError(f"{path}: config file not found") from None
        except yaml.YAMLError as e:
            raise ConfigError(f"{path}: not valid YAML: {e}") from None
        data = loaded or {}
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override '{item}': expected key=value")
        key, raw = item.split("=", 1)
        _set_path(data, key.strip(), yaml.safe_load(raw))
        where = f"{where} + overrides"
    return from_dict(cls, data, where)


def to_dict(obj: Any) -> dict:
    return dataclasses.asdict(obj)
