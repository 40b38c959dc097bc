"""The package layout holds: docs/ARCHITECTURE.md's map lists every module of the three packages,
and the modules the layout moved still import under their old names (the import graph's rules:
tests/test_module_graph.py)."""
from __future__ import annotations

import ast
import importlib
import re
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("inspector", "hooks", "viewer")
#: a continuation line of the map starts at or past this column; an entry before it
CONTINUATION = 20


def map_entries() -> set[str]:
    """The paths ARCHITECTURE.md's "Where things live" block names (folders end with '/')."""
    block = (ROOT / "docs" / "ARCHITECTURE.md").read_text().split("## Where things live", 1)[1].split("```")[1]
    out: set[str] = set()
    stack: list[tuple[int, str]] = []
    for line in block.splitlines():
        m = re.match(r"^( *)(\S+)", line)
        if not m or len(m[1]) >= CONTINUATION or not m[2].endswith((".py", "/")) or m[2].startswith("."):
            continue
        indent = len(m[1])
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = (stack[-1][1] if stack else "") + m[2]
        out.add(path)
        if path.endswith("/"):
            stack.append((indent, path))
    return out


def tree_entries(package: str) -> set[str]:
    """Every module and subpackage of ``package`` in the checkout, as map paths."""
    base = ROOT / package
    out = {f"{package}/"}
    for p in base.rglob("*"):
        if "__pycache__" in p.parts:
            continue
        rel = p.relative_to(ROOT).as_posix()
        if p.is_dir() and (p / "__init__.py").exists():
            out.add(rel + "/")
        elif p.suffix == ".py" and p.name != "__init__.py":   # a package's folder entry stands for it
            out.add(rel)
    return out


def test_the_architecture_map_lists_every_module():
    listed = map_entries()
    for package in PACKAGES:
        tree = tree_entries(package)
        # a folder listed without children stands for all of it (hooks/native/)
        opaque = {f for f in listed if f.endswith("/") and not any(e != f and e.startswith(f) for e in listed)}
        tree = {t for t in tree if not any(t != o and t.startswith(o) for o in opaque)}
        ours = {e for e in listed if e.startswith(f"{package}/") and not e.endswith("/__init__.py")}
        assert not tree - ours, f"modules missing from docs/ARCHITECTURE.md's map: {sorted(tree - ours)}"
        assert not ours - tree, f"the map lists what is not in the tree: {sorted(ours - tree)}"


def _moved_tables() -> dict[str, str]:
    from inspector._moved import INSPECTOR
    tree = ast.parse((ROOT / "hooks" / "__init__.py").read_text())
    hooks = next(ast.literal_eval(n.value) for n in tree.body
                 if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "MOVED")
    return {**INSPECTOR, **hooks}


def test_every_moved_module_exists_at_its_new_place_and_not_at_its_old():
    for old, new in _moved_tables().items():
        assert (ROOT / (new.replace(".", "/") + ".py")).exists(), new
        assert not (ROOT / (old.replace(".", "/") + ".py")).exists(), f"{old} is both moved and present"


def test_old_module_names_import_the_moved_module_with_a_warning():
    import inspector
    for old, new in _moved_tables().items():
        if old.startswith("hooks."):
            continue   # importing hooks needs TensorFlow: test_hook_layout below
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            mod = importlib.import_module(old)
        assert mod is importlib.import_module(new), old
        assert mod.__spec__.name == new and mod.__name__ == new
        assert any(issubclass(w.category, DeprecationWarning) and new in str(w.message) for w in caught), old
    from inspector.steps import parse_step_range   # a documented import of the old layout
    assert parse_step_range is inspector.format.steps.parse_step_range


def test_old_hooks_names_import_the_moved_module():
    pytest.importorskip("tensorflow")
    from hooks.keras_icnn import ICNNMask   # the old documented path of the Keras ICNN layer

    import hooks.keras.icnn
    assert ICNNMask is hooks.keras.icnn.ICNNMask
    for old, new in _moved_tables().items():
        if old.startswith("hooks."):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                assert importlib.import_module(old) is importlib.import_module(new), old
