"""Every third-party package a module of ours imports is declared in pyproject.toml (an undeclared one works
here only because something else happened to install it)."""

import ast
import re
import sys
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")

ROOT = Path(__file__).resolve().parents[1]
OURS = {"model", "shards", "train", "diagnostics", "pretrain", "finetune", "launch", "bench", "tests", "docs"}
FOLDERS = ["model", "shards", "train", "diagnostics", "pretrain", "finetune", "launch", "bench", "tests", "docs"]


def imported_top_level_names() -> dict[str, str]:
    """{top-level module: first file importing it} over our Python files (and launch/pretrain.sh's Python)."""
    found: dict[str, str] = {}
    files = [p for folder in FOLDERS for p in (ROOT / folder).rglob("*.py")] + [ROOT / "launch/pretrain.sh"]
    for path in files:
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                found.setdefault(name.split(".")[0], str(path.relative_to(ROOT)))
    # Python embedded in the bash helpers (launch/_signals.sh)
    for path in (ROOT / "launch").glob("*.sh"):
        for block in re.findall(r"<<'PY'.*?\n(.*?)\nPY", path.read_text(), re.S):
            for node in ast.walk(ast.parse(block)):
                if isinstance(node, ast.Import):
                    for a in node.names:
                        found.setdefault(a.name.split(".")[0], str(path.relative_to(ROOT)))
    return found


def declared() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    specs = list(project["dependencies"]) + [d for extra in project.get("optional-dependencies", {}).values()
                                            for d in extra]
    return {re.split(r"[<>=!~\[; ]", s, maxsplit=1)[0].lower().replace("_", "-") for s in specs}


def test_every_imported_package_is_declared():
    dists = packages_distributions()
    wanted = declared()
    missing = {}
    for name, where in imported_top_level_names().items():
        if name in OURS or name in sys.stdlib_module_names or name == "__future__":
            continue
        owners = {d.lower().replace("_", "-") for d in dists.get(name, [])}
        if not owners:
            missing[name] = f"{where}: imports '{name}', which no installed distribution provides"
        elif not owners & wanted:
            missing[name] = f"{where}: imports '{name}' (from {', '.join(sorted(owners))}), not in pyproject.toml"
    assert not missing, "\n".join(missing.values())


# model <- shards <- the runtime and pretraining (pretrain/) <- finetune <- bench, launch: each package may import
# only from the packages below it, and no private name (`_x`) from another package
BELOW = {"model": set(), "shards": {"model"}, "pretrain": {"model", "shards"},
         "finetune": {"model", "shards", "pretrain"}, "bench": {"model", "shards", "pretrain", "finetune"},
         "launch": {"model", "shards", "pretrain", "finetune"}}


def cross_package_imports(package: str):
    """(file, line, imported package, names) for every absolute import of another of our packages."""
    for path in sorted((ROOT / package).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found = [(node.module.split(".")[0], [a.name for a in node.names])]
            elif isinstance(node, ast.Import):
                found = [(a.name.split(".")[0], []) for a in node.names]
            else:
                continue
            for top, names in found:
                if top in BELOW and top != package:
                    yield f"{path.relative_to(ROOT)}:{node.lineno}", top, names


@pytest.mark.parametrize("package", sorted(BELOW))
def test_packages_import_only_downwards_and_no_private_names(package):
    upward = [f"{where} imports {top}" for where, top, _ in cross_package_imports(package) if top not in BELOW[package]]
    private = [f"{where} imports {top}.{n}" for where, top, names in cross_package_imports(package)
               for n in names if n.startswith("_")]
    assert not upward, upward
    assert not private, private


def test_the_layer_check_sees_an_upward_import(tmp_path, monkeypatch):
    """The scan above must be able to fail: a shards module importing pretrain is reported."""
    (tmp_path / "shards").mkdir()
    bad = "def f():\n    from pretrain.run import main\n    from model import _x\n"
    (tmp_path / "shards" / "bad.py").write_text(bad)
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    found = list(cross_package_imports("shards"))
    assert ("shards/bad.py:2", "pretrain", ["main"]) in found and ("shards/bad.py:3", "model", ["_x"]) in found
