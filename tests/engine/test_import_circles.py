"""No import circle among npu-compat's own modules: each layer leans only on the ones below it.

The package's modules are read, not imported (nothing upstream needs to be installed).  Every
``import`` counts: at the top of a module, inside a function, and under ``if TYPE_CHECKING:``
(an annotation that names a module above is a circle too).  ``from . import _x`` is an edge to
``_x``; ``import npu_compat`` or ``from npu_compat import activate`` is an edge to the package's
``__init__``, which imports the engine, so a module below that uses the public API comes back to
a room it left.  The simulated Ascend (``npu_compat.testing``) is walked too.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import REPO


def _modules(root: Path) -> dict[str, Path]:
    out = {}
    for path in sorted(root.rglob("*.py")):
        if "_sim_site" in path.relative_to(root).parts:
            continue  # stand-ins for other distributions (torch_npu, acl), not modules of ours
        parts = list(path.with_suffix("").relative_to(root.parent).parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _is_type_checking(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and "TYPE_CHECKING" in (
        getattr(test, "id", None),
        getattr(test, "attr", None),
    )


def _statements(tree: ast.AST, at_import: bool) -> list[ast.AST]:
    """Every node of ``tree``; with ``at_import``, only those that run when the module is imported
    (not a function's body, not an ``if TYPE_CHECKING:`` block)."""
    if not at_import:
        return list(ast.walk(tree))
    out: list[ast.AST] = []
    todo = [tree]
    while todo:
        node = todo.pop()
        out.append(node)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) or _is_type_checking(node):
            continue
        todo.extend(ast.iter_child_nodes(node))
    return out


def _imports(name: str, path: Path, known: dict[str, Path], at_import: bool = False) -> set[str]:
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in _statements(ast.parse(path.read_text(encoding="utf-8")), at_import):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")
                up = up[: len(up) - (node.level - 1)]
                base = ".".join(up + ([base] if base else []))
            submodules = {f"{base}.{alias.name}" for alias in node.names}
            found.update(submodules & known.keys())
            if at_import or not submodules <= known.keys():
                # a name defined by the module itself (the package's __init__ included); at import time,
                # `from . import x` also needs the package, whose __init__ may still be running
                found.add(base)
    return {module for module in found if module in known and module != name}


def import_circles(root: Path, at_import: bool = False) -> list[list[str]]:
    """Every import circle among the modules of the package at ``root``, each once.  With
    ``at_import``, the circles that importing runs through: only what runs at import time, where
    ``from . import x`` is an edge to the package too (a package's ``__init__`` that imports a part
    whose own imports come back to the package)."""
    known = _modules(root)
    graph = {name: _imports(name, path, known, at_import) for name, path in known.items()}
    circles: list[list[str]] = []
    seen: set[frozenset[str]] = set()
    done: set[str] = set()

    def walk(node: str, stack: list[str]) -> None:
        for dep in sorted(graph[node]):
            if dep in stack:
                circle = stack[stack.index(dep) :]
                if frozenset(circle) not in seen:
                    seen.add(frozenset(circle))
                    circles.append([*circle, dep])
            elif dep not in done:
                walk(dep, [*stack, dep])
        done.add(node)

    for name in sorted(graph):
        if name not in done:
            walk(name, [name])
    return circles


def test_npu_compat_has_no_import_circle() -> None:
    circles = import_circles(REPO / "npu_compat")
    assert circles == [], "import circles among npu_compat's modules: " + "; ".join(
        " -> ".join(circle) for circle in circles
    )


def test_no_package_init_is_run_through_by_its_own_parts_at_import_time() -> None:
    circles = import_circles(REPO / "npu_compat", at_import=True)
    assert circles == [], "import-time circles through a package's __init__: " + "; ".join(
        " -> ".join(circle) for circle in circles
    )


def test_an_init_that_imports_a_part_which_imports_the_package_is_an_import_time_circle(
    tmp_path: Path,
) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from .cli import main\n")
    (pkg / "cli.py").write_text("from .plan import plan\ndef main(): ...\n")
    (pkg / "plan.py").write_text("from . import source\ndef plan(): ...\n")
    (pkg / "source.py").write_text("")
    assert import_circles(pkg, at_import=True) == [["pkg", "pkg.cli", "pkg.plan", "pkg"]]
    assert import_circles(pkg) == []  # part to part, the layers only go down
    (pkg / "__init__.py").write_text("def __getattr__(name):\n    from .cli import main\n    return main\n")
    assert import_circles(pkg, at_import=True) == []  # loaded on first use, after the package


def test_a_circle_is_found_through_a_function_level_import_a_type_only_one_and_the_package(
    tmp_path: Path,
) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from . import a, f\n")
    (pkg / "a.py").write_text("from . import b\n")
    (pkg / "b.py").write_text("def later():\n    from .c import thing\n")
    (pkg / "c.py").write_text("import pkg.a\nthing = 1\n")
    (pkg / "d.py").write_text("TYPE_CHECKING = False\nif TYPE_CHECKING:\n    from . import e\n")
    (pkg / "e.py").write_text("from .d import TYPE_CHECKING\nimport pkg\n")
    (pkg / "f.py").write_text("from . import g\n")
    (pkg / "g.py").write_text("from . import h\n")
    (pkg / "h.py").write_text("def later():\n    from pkg import name_in_init\n")
    assert import_circles(pkg) == [
        ["pkg.a", "pkg.b", "pkg.c", "pkg.a"],  # through a function-level import
        ["pkg", "pkg.f", "pkg.g", "pkg.h", "pkg"],  # the public API, used from below the package's __init__
        ["pkg.d", "pkg.e", "pkg.d"],  # through an annotation only
    ]
