"""The one reader of upstream source, never imported nor installed: a distribution's files where they
lie (installed, a wheel, an sdist, an unpacked source tree), its metadata, each module parsed once
(:class:`Reader`), and what a module binds (ast).

Both of doctor's questions about a release's source go through it: ``check`` (:mod:`.check`: is each
target where the catalogue says, in any release) and ``doctor``'s plan (:mod:`.plan`: does the installed
release still hold what an out-of-range patch changes), and ``doctor``'s reading of Ray's token rules
(:mod:`.ray_auth`).  Nothing here imports an upstream module; ``zipfile``/``tarfile`` and the TOML reader
are imported only for the artifact that needs them.
"""

from __future__ import annotations

import ast
import email.parser
import os
import re
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from importlib import metadata
from pathlib import Path

#: Directories of a source tree that hold no module of the distribution.
_SKIP_DIRS = frozenset({".git", ".hg", ".tox", ".nox", ".venv", "venv", "node_modules", "build", "dist"})


def normalize(name: str) -> str:
    """A distribution's name as PEP 503 compares it."""
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass
class Artifact:
    """One release of one distribution, as files: ``files`` maps a path relative to the import root
    (``pkg/mod.py``) to a reader of its bytes.  ``complete`` is False where the file list is unknown
    (an installed distribution without a RECORD): a module not listed may then still be there."""

    name: str
    version: str | None
    origin: str
    requires: tuple[str, ...] = ()
    files: dict[str, Callable[[], bytes]] = field(default_factory=dict)
    complete: bool = True

    @property
    def key(self) -> str:
        return normalize(self.name)

    def module_path(self, module: str) -> str | None:
        stem = module.replace(".", "/")
        for path in (f"{stem}.py", f"{stem}/__init__.py"):
            if path in self.files:
                return path
        return None

    def has_module(self, module: str) -> bool:
        return self.module_path(module) is not None or not self.complete

    def source(self, module: str) -> str | None:
        """``module``'s source, or None (not in this artifact, unreadable)."""
        path = self.module_path(module)
        if path is None:
            return None
        try:
            return self.files[path]().decode("utf-8")
        except (OSError, UnicodeDecodeError, KeyError):
            return None

    def modules(self) -> Iterator[str]:
        """Every module this artifact ships."""
        for path in self.files:
            if path.endswith(".py"):
                stem = path[: -len("/__init__.py")] if path.endswith("/__init__.py") else path[:-3]
                yield stem.replace("/", ".")


class Reader:
    """One artifact's modules, each parsed once."""

    def __init__(self, artifact: Artifact) -> None:
        self.artifact = artifact
        self._trees: dict[str, ast.Module | None] = {}

    def ships(self, module: str) -> bool:
        """Whether the artifact has ``module``'s file (where its file list is unknown: assumed so)."""
        return self.artifact.has_module(module)

    def tree(self, module: str) -> ast.Module | None:
        """``module``'s syntax tree, or None (not in the artifact, unreadable, not Python this parses)."""
        if module not in self._trees:
            source = self.artifact.source(module)
            try:
                self._trees[module] = None if source is None else ast.parse(source)
            except (SyntaxError, ValueError):
                self._trees[module] = None
        return self._trees[module]

    def defines(self, module: str, name: str) -> bool:
        """Whether ``module`` defines ``name`` by ``def`` or ``class`` at its top level."""
        tree = self.tree(module)
        return tree is not None and any(
            isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            for n in bindings(tree.body).get(name, [])
        )

    def defined_elsewhere(self, name: str, besides: str) -> list[str]:
        """The modules of the artifact (other than ``besides``) that define ``name`` by ``def`` or
        ``class`` at their top level (a text search first: most modules are never parsed)."""
        needle = (f"def {name}(", f"class {name}(", f"class {name}:")
        found = []
        for module in self.artifact.modules():
            if module == besides:
                continue
            source = self.artifact.source(module)
            if source is None or not any(n in source for n in needle):
                continue
            if self.defines(module, name):
                found.append(module)
        return sorted(found)


# -- where the files lie ---------------------------------------------------------------------


def _read_located(f: metadata.PackagePath) -> bytes:
    return Path(str(f.locate())).read_bytes()


def installed(distribution: str) -> Artifact | None:
    """The installed ``distribution``, or None when it is not installed."""
    try:
        dist = metadata.distribution(distribution)
    except metadata.PackageNotFoundError:
        return None
    files: dict[str, Callable[[], bytes]] = {}
    for f in dist.files or ():
        files[str(f).replace(os.sep, "/")] = partial(_read_located, f)
    return Artifact(
        dist.metadata["Name"] or distribution,
        dist.version,
        "installed",
        tuple(dist.requires or ()),
        files,
        complete=dist.files is not None,
    )


def installed_reader(distribution: str) -> Reader | None:
    """A :class:`Reader` of the installed ``distribution``, or None when it is not installed."""
    artifact = installed(distribution)
    return None if artifact is None else Reader(artifact)


def _from_metadata(text: str) -> tuple[str | None, str | None, tuple[str, ...]]:
    msg = email.parser.Parser().parsestr(text, headersonly=True)
    return msg.get("Name"), msg.get("Version"), tuple(msg.get_all("Requires-Dist") or ())


def _wheel(path: Path) -> Artifact:
    import zipfile

    archive = zipfile.ZipFile(path)
    files: dict[str, Callable[[], bytes]] = {}
    meta = None
    for entry in archive.namelist():
        parts = entry.split("/")
        if len(parts) == 2 and parts[0].endswith(".dist-info") and parts[1] == "METADATA":
            meta = entry
        if len(parts) > 2 and parts[0].endswith(".data") and parts[1] in ("purelib", "platlib"):
            files["/".join(parts[2:])] = partial(archive.read, entry)
        else:
            files[entry] = partial(archive.read, entry)
    if meta is None:
        raise ValueError(f"{path.name} has no .dist-info/METADATA: not a wheel")
    name, version, requires = _from_metadata(archive.read(meta).decode("utf-8"))
    return Artifact(name or path.name.split("-")[0], version, f"wheel {path.name}", requires, files)


def _sdist(path: Path) -> Artifact:
    """An sdist (``.tar.gz`` or ``.zip``): the files under its top directory, or under ``src/`` there."""
    read: dict[str, Callable[[], bytes]] = {}
    if path.name.endswith(".zip"):
        import zipfile

        archive = zipfile.ZipFile(path)
        for entry in archive.namelist():
            read[entry] = partial(archive.read, entry)
    else:
        import tarfile

        tar = tarfile.open(path)

        def member(m: tarfile.TarInfo) -> bytes:
            handle = tar.extractfile(m)
            if handle is None:
                raise OSError(f"{m.name} is not a file")
            return handle.read()

        for m in tar.getmembers():
            if m.isfile():
                read[m.name] = partial(member, m)
    roots = {name.split("/", 1)[0] for name in read}
    if len(roots) != 1:
        raise ValueError(f"{path.name} is not an sdist: it has no single top directory")
    root = roots.pop()
    return _rooted(path, f"sdist {path.name}", root + "/", read)


def _tree(path: Path) -> Artifact:
    read: dict[str, Callable[[], bytes]] = {}
    for dirpath, dirnames, filenames in os.walk(path):
        dirnames[:] = [d for d in dirnames if d not in _SKIP_DIRS and not d.startswith(".")]
        rel = Path(dirpath).relative_to(path).as_posix()
        for filename in filenames:
            full = Path(dirpath, filename)
            read[filename if rel == "." else f"{rel}/{filename}"] = full.read_bytes
    return _rooted(path, f"source tree {path}", "", read)


def _rooted(path: Path, origin: str, root: str, read: dict[str, Callable[[], bytes]]) -> Artifact:
    """An sdist's or a tree's files relative to its import root (``src/`` if it has one), and its
    metadata from ``PKG-INFO`` or else ``pyproject.toml``."""
    src = f"{root}src/"
    base = src if any(name.startswith(src) and name.endswith(".py") for name in read) else root
    files = {name[len(base) :]: reader for name, reader in read.items() if name.startswith(base)}
    name = version = None
    requires: tuple[str, ...] = ()
    if f"{root}PKG-INFO" in read:
        name, version, requires = _from_metadata(read[f"{root}PKG-INFO"]().decode("utf-8"))
    if f"{root}pyproject.toml" in read and (name is None or version is None or not requires):
        p_name, p_version, p_requires = _from_pyproject(read[f"{root}pyproject.toml"](), files)
        name, version, requires = name or p_name, version or p_version, requires or p_requires
    if name is None:
        raise ValueError(f"{path} names no distribution: it has neither PKG-INFO nor a [project] table")
    return Artifact(name, version, origin, requires, files)


def _from_pyproject(
    raw: bytes, files: dict[str, Callable[[], bytes]]
) -> tuple[str | None, str | None, tuple[str, ...]]:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # Python 3.10: tomli where it is installed (pip's build tools bring it)
        try:
            import tomli as tomllib  # type: ignore[import-not-found,unused-ignore]
        except ImportError:
            return None, None, ()
    data = tomllib.loads(raw.decode("utf-8"))
    project = data.get("project", {})
    version = project.get("version")
    if version is None and "version" in project.get("dynamic", ()):
        attr = data.get("tool", {}).get("setuptools", {}).get("dynamic", {}).get("version", {}).get("attr")
        if isinstance(attr, str):
            version = _string_constant(files, attr)
    return project.get("name"), version, tuple(project.get("dependencies", ()))


def _string_constant(files: dict[str, Callable[[], bytes]], ref: str) -> str | None:
    """The string a ``module.NAME`` assigns at its top level (a dynamic version), read with ast."""
    module, _, name = ref.rpartition(".")
    stem = module.replace(".", "/")
    for path in (f"{stem}.py", f"{stem}/__init__.py"):
        if path in files:
            for node in ast.parse(files[path]()).body:
                if (
                    isinstance(node, ast.Assign)
                    and any(isinstance(t, ast.Name) and t.id == name for t in node.targets)
                    and isinstance(node.value, ast.Constant)
                    and isinstance(node.value.value, str)
                ):
                    return node.value.value
    return None


def open_artifact(path: str | os.PathLike[str]) -> Artifact:
    """A wheel, an sdist or an unpacked source tree; ValueError when ``path`` is none of them."""
    p = Path(path)
    if p.is_dir():
        return _tree(p)
    if not p.is_file():
        raise ValueError(f"{p} does not exist")
    if p.suffix == ".whl":
        return _wheel(p)
    if p.name.endswith((".tar.gz", ".tgz", ".zip")):
        return _sdist(p)
    raise ValueError(f"{p.name} is not a wheel (.whl), an sdist (.tar.gz, .zip) or a directory")


# -- what a module binds -----------------------------------------------------------------------

_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)

#: Calls that can bind module globals no statement names.
_DYNAMIC = frozenset({"globals", "exec"})


def module_names(tree: ast.Module) -> set[str] | None:
    """The names a module binds at its top level (in top-level ``if``/``try`` blocks too), or None
    when they cannot be read off (a star import, a module ``__getattr__``, ``globals()`` or ``exec``)."""
    if any(
        isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in _DYNAMIC
        for n in ast.walk(tree)
    ):
        return None
    names: set[str] = set()
    todo: list[ast.AST] = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                if alias.name == "*":
                    return None
                bound = alias.asname or alias.name
                names.add(bound.split(".")[0] if isinstance(node, ast.Import) else bound)
            continue
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        if not isinstance(node, _SCOPES):
            todo.extend(ast.iter_child_nodes(node))
    return None if "__getattr__" in names else names


def uses_attribute(tree: ast.AST, name: str, attribute: str) -> bool:
    """Whether ``tree`` names ``<name>.<attribute>`` anywhere (``torch.cuda`` in a module)."""
    return any(
        isinstance(n, ast.Attribute)
        and n.attr == attribute
        and isinstance(n.value, ast.Name)
        and n.value.id == name
        for n in ast.walk(tree)
    )


def bindings(body: list[ast.stmt]) -> dict[str, list[ast.AST]]:
    """The statements of ``body`` (a module's or a class's) that bind each name, in order, looking
    into ``if``/``try``/``with`` blocks but not into functions: a ``def``/``class`` node, an
    ``ast.alias`` of an import, or the assignment."""
    found: dict[str, list[ast.AST]] = {}
    todo: list[ast.stmt] = list(body)
    while todo:
        node = todo.pop(0)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found.setdefault(node.name, []).append(node)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                bound = alias.asname or alias.name
                if isinstance(node, ast.Import):
                    bound = bound.split(".")[0]
                found.setdefault(bound, []).append(alias)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for sub in ast.walk(target):
                    if isinstance(sub, ast.Name):
                        found.setdefault(sub.id, []).append(node)
        elif isinstance(node, (ast.If, ast.Try, ast.With)):
            for block in ("body", "orelse", "finalbody"):
                todo.extend(getattr(node, block, []))
            for handler in getattr(node, "handlers", []):
                todo.extend(handler.body)
    return found


def imported_from(tree: ast.Module) -> dict[int, ast.ImportFrom]:
    """Each ``ast.alias`` of a ``from`` import (by id) and its statement: where a name came from."""
    return {
        id(alias): node for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) for alias in node.names
    }
