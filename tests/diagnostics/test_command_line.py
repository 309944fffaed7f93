"""The diagnostics' shared command line refuses a bad --model before any model loads, naming it."""

import pytest

from diagnostics import ablation, grounding


@pytest.mark.parametrize("command", [ablation.main, grounding.main])
def test_bad_model_specs_are_named(command, tmp_path, capsys):
    (tmp_path / "m").mkdir()
    for specs, message in ((["m"], "'m': expected NAME=DIR"),
                           ([f"a={tmp_path}/missing"], f"{tmp_path}/missing is not a directory"),
                           ([f"a={tmp_path}/m", f"a={tmp_path}/m"], "the name 'a' is given twice")):
        argv = [a for s in specs for a in ("--model", s)] + ["--out", str(tmp_path / "out")]
        with pytest.raises(SystemExit) as e:
            command(argv)
        assert e.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()  # nothing written for a refused command line
