from dataclasses import dataclass, field

import pytest

from model.config import ConfigError, load_config


@dataclass
class Inner:
    size: int = 3


@dataclass
class Outer:
    name: str = "x"
    rate: float = 0.1
    inner: Inner = field(default_factory=Inner)


def test_yaml_and_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("name: demo\ninner:\n  size: 7\n")
    cfg = load_config(Outer, path, ["rate=2e-5", "inner.size=9"])
    assert cfg == Outer(name="demo", rate=2e-5, inner=Inner(size=9))


def test_unknown_keys_name_the_file_and_key(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("inner:\n  sise: 7\n")
    with pytest.raises(ConfigError, match=r"c\.yaml.*inner.*unknown key 'sise'"):
        load_config(Outer, path)
    with pytest.raises(ConfigError, match="key=value"):
        load_config(Outer, None, ["rate"])
    with pytest.raises(ConfigError, match="rate: expected float"):
        load_config(Outer, None, ["rate=fast"])
    with pytest.raises(ConfigError, match="not found"):
        load_config(Outer, tmp_path / "nope.yaml")
