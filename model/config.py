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


def _coerce(tp: Any, value: Any, where: str) -> Any:
    """Check and convert a YAML value to the field's declared type (YAML reads `2e-5` as a string)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _coerce(inner[0], value, where) if len(inner) == 1 else value
    if _is_dataclass_type(tp):
        return from_dict(tp, value, where)
    try:
        if tp is float and isinstance(value, (int, float, str)) and not isinstance(value, bool):
            return float(value)
        if tp is int and isinstance(value, (int, str)) and not isinstance(value, bool):
            return int(value)
    except ValueError:
        raise ConfigError(f"{where}: expected {tp.__name__}, got {value!r}") from None
    if tp is bool and not isinstance(value, bool):
        raise ConfigError(f"{where}: expected true/false, got {value!r}")
    if tp is str and not isinstance(value, str):
        raise ConfigError(f"{where}: expected a string, got {value!r}")
    return value


def from_dict(cls: type[T], data: dict, where: str = "config") -> T:
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping for {cls.__name__}, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {f.name for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in data.items():
        if key not in fields:
            raise ConfigError(f"{where}: unknown key '{key}' for {cls.__name__}; known: {sorted(fields)}")
        kwargs[key] = _coerce(hints[key], value, f"{where}: {key}")
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
