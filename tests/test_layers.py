"""The layers of docs/DESIGN: `model` imports nothing of ours; `shards` only `model`; the training runtime
(`train/`) those two; the diagnostics (`diagnostics/`) those three; pretraining and finetuning those four (not
each other: pretraining's periodic evaluation reads the diagnostics, which never import back); `bench` anything.
Read from the source with `ast`, every import counted (at module top or inside a function), so a new upward
import, a private name (`_x`) taken from another package, or an import circle between modules fails here, naming
the file and line. Imports sit at the module top: one inside a function (a heavy optional dependency) says why
on the line before, `# lazy: <reason>`."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ALLOWED = {
    "model": set(),
    "shards": {"model"},
    "train": {"model", "shards"},
    "diagnostics": {"model", "shards", "train"},
    "pretrain": {"model", "shards", "train", "diagnostics"},
    "finetune": {"model", "shards", "train", "diagnostics"},
    "bench": {"model", "shards", "train", "diagnostics", "pretrain", "finetune"},
}


def imports(path: Path, root: Path = ROOT):
    """(line, imported module, names) of every import in the file, relative imports resolved."""
    module = ".".join(path.relative_to(root).with_suffix("").parts)
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, []
        elif isinstance(node, ast.ImportFrom):
            target = node.module or ""
            if node.level:
                base = module.split(".")[: -node.level]  # a package's own module is `pkg.__init__`
                target = ".".join(base + ([target] if target else []))
            names = [a.name for a in node.names]  # `from pkg import submodule` names the submodule
            yield node.lineno, target, names


def sources():
    for package in ALLOWED:
        for path in sorted((ROOT / package).rglob("*.py")):
            yield package, path


def test_no_upward_import_and_no_private_name():
    bad = []
    for package, path in sources():
        for line, target, names in imports(path):
            top = target.split(".")[0]
            if top not in ALLOWED or top == package:
                continue
            where = f"{path.relative_to(ROOT)}:{line}"
            if top not in ALLOWED[package]:
                bad.append(f"{where}: {package} imports {target} (a layer above or beside it)")
            bad += [f"{where}: private name {target}.{n} imported from another package" for n in names
                    if n.startswith("_") and not n.startswith("__")]
    assert not bad, "\n".join(bad)


def test_no_import_circle_between_modules():
    known = {".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): p for _, p in sources()}
    graph: dict[str, set[str]] = {m: set() for m in known}
    for module, path in known.items():
        for _, target, names in imports(path):
            for candidate in [target] + [f"{target}.{n}" for n in names]:
                if candidate in known and candidate != module:
                    graph[module].add(candidate)
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str):  # depth-first search; a grey node met again closes a circle
        state[m] = 1
        stack.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                raise AssertionError("import circle: " + " -> ".join(stack[stack.index(n):] + [n]))
            if n not in state:
                visit(n)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)


def lazy_imports_without_reason(path: Path) -> list[int]:
    """Lines of imports inside a function with no `# lazy:` comment between the function's first line and them."""
    lines = path.read_text().splitlines()
    bad = []
    for node in ast.walk(ast.parse("\n".join(lines), str(path))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for sub in ast.walk(node):
                if isinstance(sub, (ast.Import, ast.ImportFrom)) and \
                        not any("# lazy:" in line for line in lines[node.lineno - 1: sub.lineno]):
                    bad.append(sub.lineno)
    return sorted(set(bad))


def test_imports_are_at_the_top_unless_a_reason_is_given():
    bad = [f"{path.relative_to(ROOT)}:{line}" for _, path in sources() for line in lazy_imports_without_reason(path)]
    assert not bad, "imports inside functions without a '# lazy: <reason>' line: " + ", ".join(bad)


def test_the_checks_can_fail(tmp_path):
    """The parser sees what the checks need: a relative import resolved to its package, names kept."""
    pkg = tmp_path / "shards"
    pkg.mkdir()
    f = pkg / "x.py"
    f.write_text("from ..train.engine import _private\nfrom .reader import thing\nimport model.config\n")
    got = list(imports(f, tmp_path))
    assert got == [(1, "train.engine", ["_private"]), (2, "shards.reader", ["thing"]), (3, "model.config", [])]
    g = pkg / "y.py"
    g.write_text("def f():\n    import os\n\n\ndef g():\n    # lazy: heavy\n    import scipy\n")
    assert lazy_imports_without_reason(g) == [2]
