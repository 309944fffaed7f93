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
OURS = {"model", "pretrain", "finetune", "shards", "launch", "bench", "tests", "docs"}
FOLDERS = ["model", "pretrain", "finetune", "shards", "launch", "bench", "tests", "docs"]


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
