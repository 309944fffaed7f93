import re
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


def test_a_later_override_of_a_key_wins(tmp_path):
    """What a launcher's own default relies on when it puts its override before the user's (launch/finetune_vcr.sh's
    QA->R epochs)."""
    cfg = load_config(Outer, None, ["rate=1.5", "inner.size=2", "rate=4", "inner.size=5"])
    assert (cfg.rate, cfg.inner.size) == (4.0, 5)


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


@dataclass
class Typed:
    steps: int = 1
    betas: tuple[float, float] = (0.9, 0.999)
    names: list = field(default_factory=list)
    table: dict = field(default_factory=dict)
    flag: bool = False
    maybe: int | None = None


@pytest.mark.parametrize("override, message", [
    ("steps=2.5", "steps: expected an integer, got 2.5"),
    ("steps=[1, 2]", r"steps: expected an integer, got \[1, 2\]"),
    ("steps=true", "steps: expected an integer, got True"),
    ("steps=null", "steps: expected int, got null"),
    ("betas=0.9", "betas: expected a list of 2 values, got 0.9"),
    ("betas=[0.9]", r"betas: expected 2 values, got 1: \[0.9\]"),
    ("betas=[0.9, fast]", r"betas\[1\]: expected float, got 'fast'"),
    ("names=abc", "names: expected a list, got 'abc'"),
    ("table=[1]", r"table: expected a mapping, got \[1\]"),
    ("flag=1", "flag: expected true/false, got 1"),
    ("maybe=x", "maybe: expected an integer, got 'x'"),
])
def test_wrong_types_are_refused_naming_the_field(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(Typed, None, [override])


def test_right_types_are_converted():
    cfg = load_config(Typed, None, ["steps=3.0", "betas=[0.8, 1e-3]", "maybe=null", "names=[a, b]", "table={x: 1}"])
    assert cfg == Typed(steps=3, betas=(0.8, 0.001), names=["a", "b"], table={"x": 1}, maybe=None)
    assert isinstance(cfg.betas, tuple) and isinstance(load_config(Typed, None, ["steps='7'"]).steps, int)


def test_dataset_paths_have_no_default_and_are_named_when_unset(tmp_path):
    from dataclasses import dataclass, field

    from model.config import required

    @dataclass
    class Data:
        root: str = required()
        captions: list = required(list)
        size: int = 3

    @dataclass
    class Job:
        data: Data = field(default_factory=Data)
        held_out: Data | None = None  # an optional section left out is not checked

    path = tmp_path / "job.yaml"
    path.write_text("data:\n  size: 4\n")
    with pytest.raises(ConfigError, match=re.escape(f"{path} + overrides: data.root, data.captions not set")):
        load_config(Job, path, ["data.size=5"])
    with pytest.raises(ConfigError, match=r"^defaults \+ overrides: data.captions not set"):  # said once
        load_config(Job, None, iter(["data.root=/x", "data.size=2"]))
    cfg = load_config(Job, path, ["data.root=/d", "data.captions=[a.json]"])
    assert (cfg.data.root, cfg.data.captions, cfg.data.size) == ("/d", ["a.json"], 4)
    with pytest.raises(ConfigError, match=r"held_out.captions not set"):
        load_config(Job, path, iter(["data.root=/d", "data.captions=[a]", "held_out.root=/h"]))
