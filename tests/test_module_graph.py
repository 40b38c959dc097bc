"""The import graph, read from the source with ``ast`` (lazy imports inside functions included):
no cycle among the modules of a package, nor among its subpackages; ``inspector/`` and
``viewer/`` never import TensorFlow or ``hooks/``, ``inspector/`` never ``viewer/``; and
``hooks.schedule`` and ``hooks.options`` importable where TensorFlow is not."""
from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(package: Path) -> dict[str, set[str]]:
    """``{module: modules of the same package it imports}``; ``from . import x`` names
    submodule x, ``from .m import y`` names m (or m.y where that is a submodule)."""
    root = package.parent
    files = {_module_name(p, root): p for p in package.rglob("*.py")}
    graph: dict[str, set[str]] = {m: set() for m in files}
    for mod, path in files.items():
        pkg = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = pkg.split(".")[: len(pkg.split(".")) - (node.level - 1)]
                    base = ".".join(up + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in files else base for a in node.names]
            else:
                continue
            graph[mod] |= {t for t in targets if t in files and t != mod}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as ``[a, b, ..., a]``, or None."""
    state: dict[str, int] = {}   # 1 on the current path, 2 done
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        path.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                return path[path.index(n):] + [n]
            if n not in state and (cycle := visit(n)):
                return cycle
        state[m] = 2
        path.pop()
        return None

    for m in sorted(graph):
        if m not in state and (cycle := visit(m)):
            return cycle
    return None


def test_find_cycle_finds_a_lazy_mutual_import(tmp_path):
    """The checker itself: two modules importing each other, one lazily in a function."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from .b import g\n")
    (pkg / "b.py").write_text("def g():\n    from . import a\n")
    (pkg / "c.py").write_text("from pkg.a import g\n")
    assert import_graph(pkg) == {"pkg": set(), "pkg.a": {"pkg.b"}, "pkg.b": {"pkg.a"}, "pkg.c": {"pkg.a"}}
    assert find_cycle(import_graph(pkg)) == ["pkg.a", "pkg.b", "pkg.a"]
    (pkg / "b.py").write_text("def g():\n    pass\n")
    assert find_cycle(import_graph(pkg)) is None


@pytest.mark.parametrize("package", ["hooks", "inspector"])
def test_no_import_cycle(package):
    graph = import_graph(ROOT / package)
    assert f"{package}.stats.fast" in graph or package != "hooks"   # the walk saw the modules
    assert find_cycle(graph) is None


def subpackage_graph(package: Path) -> dict[str, set[str]]:
    """:func:`import_graph` with each module standing for its subpackage (``inspector.stats``) or,
    at the package's top, for itself (``inspector.run``): the layering of docs/ARCHITECTURE.md."""
    def node(module: str) -> str:
        return ".".join(module.split(".")[:2])
    out: dict[str, set[str]] = {}
    for mod, targets in import_graph(package).items():
        out.setdefault(node(mod), set()).update(node(t) for t in targets if node(t) != node(mod))
    return {m: {t for t in ts if "." in t} for m, ts in out.items()}   # the package's __init__: its front


@pytest.mark.parametrize("package", ["hooks", "inspector", "viewer"])
def test_no_import_cycle_between_subpackages(package):
    graph = subpackage_graph(ROOT / package)
    assert f"{package}.{'capture' if package == 'hooks' else 'charts' if package == 'viewer' else 'stats'}" in graph
    assert find_cycle(graph) is None


def imported(path: Path) -> set[str]:
    """Every absolute module name ``path`` imports, anywhere in it."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.add(node.module)
    return out


def test_the_reader_and_viewer_import_neither_tensorflow_nor_hooks():
    """TensorFlow only in ``inspector/icnn/layer.py`` (imported explicitly inside a model_fn)."""
    bad = []
    for package, never in (("inspector", {"hooks", "viewer"}), ("viewer", {"hooks"})):
        for path in (ROOT / package).rglob("*.py"):
            tops = {name.split(".")[0] for name in imported(path)}
            tf = {"tensorflow", "keras", "tf_keras"} if path != ROOT / "inspector/icnn/layer.py" else set()
            bad += [f"{path.relative_to(ROOT)} imports {t}" for t in sorted(tops & (never | tf))]
    assert not bad


#: A fresh interpreter in which importing TensorFlow fails, as where it is not installed.
WITHOUT_TENSORFLOW = textwrap.dedent("""
    import sys
    sys.path.insert(0, sys.argv[1])

    class Block:
        def find_spec(self, name, path=None, target=None):
            if name.partition(".")[0] == "tensorflow":
                raise ModuleNotFoundError(f"No module named {name!r} (blocked)", name=name)
            return None

    sys.meta_path.insert(0, Block())
    import hooks.schedule
    s = hooks.schedule.Schedule(stats_every_n_steps=10, dump_every_n_steps=100, dump_steps=["500:510"])
    print("schedule", s.wants_stats(20), s.wants_dump(505), s.wants_dump(511))
    from hooks import CaptureOptions
    o = CaptureOptions(stats_every_n_steps=10, exclude="/dropout/")
    print("options", o.schedule.stats_every, o.writer_options.max_bytes)
    try:
        from hooks import DumpHook
    except ImportError as e:
        print("DumpHook:", e)
    assert "tensorflow" not in sys.modules
""")


def test_hooks_schedule_imports_without_tensorflow():
    out = subprocess.run([sys.executable, "-c", WITHOUT_TENSORFLOW, str(ROOT)], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "schedule True True False" in out.stdout
    assert "options 10 2147483648" in out.stdout
    assert ("DumpHook: hooks.DumpHook needs TensorFlow, which is not installed: pip install 'tf-inspector[tf]'"
            in out.stdout)
