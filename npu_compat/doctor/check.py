"""``python -m npu_compat check [ARTIFACT ...] [--json]``: before an upgrade, which of npu-compat's
patches a release keeps, moves or breaks.

An ARTIFACT is a wheel, an sdist or an unpacked source tree; without one, the installed
distributions are checked.  Nothing is imported or installed: for every patch of the catalogue whose
distribution the artifact is, the target module's source is read (ast) and the patch gets one verdict:

``ok``
    the version is in the patch's range, and the target is where the catalogue says, with the
    parameters the patch ``expects``.
``out of range, still matches``
    the range does not cover the version, but the target is there as declared: the range could be
    widened, once a test on that version proves it.
``out of range``
    the range does not cover the version, and the target is not there as declared (what changed is
    said); where :data:`npu_compat.doctor.upstream.SERVED_ELSEWHERE` declares the version served by other
    patches, that is said too.
``moved``
    in range, and the target is no longer where the catalogue names it but is defined elsewhere in
    the release (named), or a ``from``-copy the catalogue names now binds it under another name.
``broken``
    in range, and the target module, the attribute, or an expected parameter is gone.

The exit status is 1 when anything in range is ``moved`` or ``broken`` (the catalogue no longer
describes a release it claims to support; at run time the patch would fail or miss callers), 2 for a
bad command line or an unreadable artifact, and 0 otherwise.  The check also names what the release
requires (``Requires-Dist``, its base requirements) that none of the stacks npu-compat is tested on
pins (``npu_compat/stacks/*.txt``, shipped with the package).  Where a release breaks an entry of
:data:`npu_compat.doctor.upstream.CONTRACTS` -- a pair of upstream releases that cannot run together on any
device, with or without npu-compat -- it says ``broken``, naming the pair and the fix (exit status 1).
"""

from __future__ import annotations

import argparse
import ast
import difflib
import json
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .._spec import PatchSpec
from .._versions import installed_version, version_in_range
from . import source
from .upstream import CONTRACTS, SERVED_ELSEWHERE, view_attribute

#: The stacks npu-compat is tested on, one pin list each (package data: ``npu_compat/stacks``).
STACKS_DIR = Path(__file__).resolve().parents[1] / "stacks"

FAILING = ("moved", "broken")


@dataclass
class Row:
    patch: str
    target: str
    verdict: str
    detail: str = ""


@dataclass
class Checked:
    """One artifact's verdicts."""

    distribution: str
    version: str | None
    origin: str
    rows: list[Row] = field(default_factory=list)
    unpinned: list[str] = field(default_factory=list)

    @property
    def failing(self) -> bool:
        return any(r.verdict in FAILING for r in self.rows)


def broken_contracts(artifact: source.Artifact, partners: dict[str, str | None]) -> list[Row]:
    """The contracts ``artifact`` breaks for the partner versions known here (``partners``: normalized
    name to version; a partner not known here is assumed to be in range)."""
    reader = source.Reader(artifact)
    rows = []
    for contract in CONTRACTS:
        if source.normalize(contract.distribution) != artifact.key:
            continue
        partner = partners.get(source.normalize(contract.needed_by))
        if partner is not None and not version_in_range(partner, contract.needed_by_versions):
            continue
        found = _resolve(reader, *_split(contract.target))
        if found.status == "matches":
            continue
        who = (
            f"{contract.needed_by} {partner}"
            if partner
            else f"{contract.needed_by}{contract.needed_by_versions}"
        )
        rows.append(
            Row(
                contract.id,
                contract.target,
                "broken",
                f"{who} cannot run on {artifact.name} {artifact.version} on any device: {found.detail}; "
                f"{contract.why}. Fix: {contract.fix}",
            )
        )
    return rows


def _split(target: str) -> tuple[str, tuple[str, ...]]:
    module, _, path = target.partition(":")
    return module, tuple(path.split("."))


# -- one target in one artifact ----------------------------------------------------------------


@dataclass
class _Found:
    """What a target resolves to: ``status`` is "matches", "missing" or "changed"; ``node`` is the
    defining statement where one was read."""

    status: str
    detail: str = ""
    node: ast.AST | None = None
    #: for "missing": the module or its top-level name is gone (not only a member of a class)
    top: bool = False


def _absolute(module: str, node: ast.ImportFrom, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    parts = module.split(".")
    base = parts if is_package else parts[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def _definition(nodes: list[ast.AST]) -> ast.AST:
    """Of the statements that bind one name, the one a reader means: the last ``def``/``class``
    (``if``-branches define stubs first), else the last binding."""
    defs = [n for n in nodes if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
    return (defs or nodes)[-1]


def _is_dataclass(node: ast.ClassDef) -> bool:
    for deco in node.decorator_list:
        target = deco.func if isinstance(deco, ast.Call) else deco
        name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
        if name == "dataclass":
            return True
    return False


def _resolve(reader: source.Reader, module: str, path: tuple[str, ...], depth: int = 0) -> _Found:
    """Where ``module:path`` is defined in the artifact, following ``from`` imports and base classes
    that the artifact itself holds."""
    tree = reader.tree(module)
    if tree is None:
        if reader.artifact.module_path(module) is None:
            return _Found("missing", f"{module} is not in it", top=True)
        return _Found("matches", f"{module} could not be parsed: not verified")
    binds = source.bindings(tree.body)
    name, rest = path[0], path[1:]
    if name not in binds:
        if source.module_names(tree) is None:
            return _Found("matches", f"{module} binds names dynamically: {name} not verified")
        close = difflib.get_close_matches(name, list(binds), n=3)
        hint = f" (close: {', '.join(close)})" if close else ""
        return _Found("missing", f"{module} has no {name}{hint}", top=True)
    node = _definition(binds[name])
    if isinstance(node, ast.alias) and depth < 8:
        origin = source.imported_from(tree).get(id(node))
        if origin is not None:
            package = (reader.artifact.module_path(module) or "").endswith("__init__.py")
            source_module = _absolute(module, origin, package)
            if reader.artifact.module_path(source_module) is not None:
                return _resolve(reader, source_module, (node.name, *rest), depth + 1)
            submodule = f"{source_module}.{node.name}"
            if not rest and reader.artifact.module_path(submodule) is not None:
                return _Found("matches", node=None, detail=f"the module {submodule}")
        # bound by an import from another distribution (a module global such as ``torch``): there
        return _Found(
            "matches", "" if not rest else f"{module}:{name} is imported: {'.'.join(rest)} not verified", node
        )
    if not rest:
        return _Found("matches", node=node)
    if not isinstance(node, ast.ClassDef):
        return _Found("matches", f"{module}:{name} is not a class here: {'.'.join(rest)} not verified", node)
    members = source.bindings(node.body)
    if rest[0] in members:
        member = _definition(members[rest[0]])
        if len(rest) > 1:
            return _Found("matches", f"{'.'.join(path)} is nested deeper than read: not verified", member)
        return _Found("matches", node=member)
    if rest[0] == "__init__" and _is_dataclass(node):
        return _Found("matches", f"{name}.__init__ is generated by @dataclass")
    outside = False
    for base in node.bases:  # inherited: from a base class this release holds
        if _from_stdlib(base, binds, source.imported_from(tree)):
            continue
        base_name = base.id if isinstance(base, ast.Name) else None
        if base_name is None or base_name not in binds or depth >= 8:
            outside = True
            continue
        found = _resolve(reader, module, (base_name, *rest), depth + 1)
        if found.status == "matches":
            return found
    if outside:
        return _Found("matches", f"{name}.{rest[0]} may be inherited from a base outside this release")
    close = difflib.get_close_matches(rest[0], list(members), n=3)
    hint = f" (close: {', '.join(close)})" if close else ""
    return _Found("missing", f"{module}:{name} has no {rest[0]}{hint}")


def _from_stdlib(base: ast.expr, binds: dict[str, list[ast.AST]], origins: dict[int, ast.ImportFrom]) -> bool:
    """Whether a base class is a builtin or comes from the standard library (``collections.abc.Mapping``,
    ``typing.Generic[T]``, ``ABC`` imported from ``abc``): none of those defines what a patch targets."""
    import builtins

    while isinstance(base, (ast.Subscript, ast.Attribute)):
        base = base.value
    if not isinstance(base, ast.Name):
        return False
    bound = binds.get(base.id)
    if not bound:
        return hasattr(builtins, base.id)
    last = bound[-1]
    if not isinstance(last, ast.alias):
        return False
    origin = origins.get(id(last))
    if origin is None:  # ``import collections``
        module = last.name
    else:
        module = "" if origin.level else (origin.module or "")
    return module.split(".")[0] in sys.stdlib_module_names


def _parameters(node: ast.AST | None) -> list[str] | None:
    """The parameter names of a ``def`` (a class: of its ``__init__``), or None when unreadable."""
    if isinstance(node, ast.ClassDef):
        members = source.bindings(node.body)
        init = members.get("__init__")
        return None if not init else _parameters(_definition(init))
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return None
    a = node.args
    return [p.arg for p in (*a.posonlyargs, *a.args, *a.kwonlyargs)]


def _signature(node: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
    return f"{node.name}({ast.unparse(node.args)})"


def match(spec: PatchSpec, reader: source.Reader) -> _Found:
    """Whether the artifact holds ``spec``'s target as declared; for "changed" and "missing", what
    differs."""
    found = _resolve(reader, spec.module, spec.attr_path)
    if found.status == "missing":
        elsewhere = reader.defined_elsewhere(spec.attr_path[0], spec.module) if found.top else []
        if elsewhere:
            found.status = "moved"
            found.detail += f"; {spec.attr_path[0]} is defined in {', '.join(elsewhere)}"
        return found
    if spec.expects:
        params = _parameters(found.node)
        if params is not None:
            missing = [p for p in spec.expects if p not in params]
            if missing:
                node = found.node
                shown = _signature(node) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else ""
                return _Found(
                    "changed",
                    f"{spec.target} no longer accepts {', '.join(missing)}" + (f": {shown}" if shown else ""),
                )
        elif not found.detail:
            found.detail = f"the parameters of {spec.target} could not be read: not verified"
    view = view_attribute(spec.replacement)
    if view is not None:
        tree = reader.tree(spec.module)
        name = spec.attr_path[0]
        if tree is not None and not source.uses_attribute(tree, name, view):
            return _Found("changed", f"{spec.module} never uses {name}.{view}: nothing to redirect")
    return found


def copies_moved(spec: PatchSpec, reader: source.Reader) -> list[str]:
    """The ``from``-copies of ``spec`` in this artifact that now bind the target under another name."""
    problems = []
    target_name = spec.attr_path[-1]
    for copy_module, copy_name in spec.copy_places():
        tree = reader.tree(copy_module)
        if tree is None:
            continue  # not in this release: nothing to repoint there
        binds = source.bindings(tree.body)
        if copy_name in binds:
            continue
        renamed = sorted(
            alias.asname
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom)
            for alias in node.names
            if alias.name == target_name and alias.asname and alias.asname != copy_name
        )
        if renamed:
            problems.append(
                f"the copy {copy_module}:{copy_name} is now bound as {', '.join(renamed)}, "
                "which the patch does not repoint"
            )
    return problems


# -- one artifact --------------------------------------------------------------------------------


def stack_pins(directory: Path = STACKS_DIR) -> dict[str, dict[str, str]]:
    """``{distribution: {stack file: version}}`` over the tested stacks' pin lists."""
    pins: dict[str, dict[str, str]] = {}
    for path in sorted(directory.glob("*.txt")):
        for line in path.read_text().splitlines():
            line = line.split("#", 1)[0].strip()
            if "==" in line:
                name, version = (s.strip() for s in line.split("==", 1))
                pins.setdefault(source.normalize(name), {})[path.stem] = version
    return pins


def unpinned(requires: tuple[str, ...], pins: dict[str, dict[str, str]]) -> list[str]:
    """The base requirements no tested stack satisfies (extras' requirements are left out)."""
    from packaging.requirements import InvalidRequirement, Requirement

    out = []
    for text in requires:
        try:
            req = Requirement(text)
        except InvalidRequirement:
            continue
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        pinned = pins.get(source.normalize(req.name), {})
        if not pinned:
            out.append(f"{text} (no stack pins {req.name})")
        elif not any(req.specifier.contains(v, prereleases=True) for v in pinned.values()):
            by_version: dict[str, list[str]] = {}
            for stack, v in sorted(pinned.items()):
                by_version.setdefault(v, []).append(stack.split("-")[0])
            shown = ", ".join(f"{v} ({', '.join(stacks)})" for v, stacks in by_version.items())
            out.append(f"{text} (the stacks pin {shown})")
    return out


def check_artifact(
    artifact: source.Artifact,
    specs: tuple[PatchSpec, ...],
    pins: dict[str, dict[str, str]] | None = None,
    partners: dict[str, str | None] | None = None,
) -> Checked:
    reader = source.Reader(artifact)
    out = Checked(artifact.name, artifact.version, artifact.origin)
    for spec in specs:
        if source.normalize(spec.distribution) != artifact.key:
            # another distribution's patch may name a from-copy in this one
            copies = copies_moved(spec, reader) if _copies_here(spec, artifact) else []
            if copies:
                out.rows.append(Row(spec.id, spec.target, "moved", "; ".join(copies)))
            continue
        in_range = artifact.version is not None and version_in_range(artifact.version, spec.versions)
        found = match(spec, reader)
        problems = [] if found.status != "matches" else copies_moved(spec, reader)
        detail = "; ".join(filter(None, [found.detail, *problems]))
        matches = found.status == "matches" and not problems
        if in_range:
            verdict = "ok" if matches else ("moved" if found.status == "moved" or problems else "broken")
        else:
            verdict = "out of range, still matches" if matches else "out of range"
            where = (
                f"{artifact.version} is outside {spec.versions}" if artifact.version else "version unknown"
            )
            detail = f"{where}; {detail}" if detail else where
            if not matches:
                for entry in SERVED_ELSEWHERE:
                    if (
                        artifact.version
                        and source.normalize(entry.distribution) == artifact.key
                        and version_in_range(artifact.version, entry.versions)
                        and spec.module in entry.gone
                    ):
                        detail += f"; no patch needed: {entry.how}"
        out.rows.append(Row(spec.id, spec.target, verdict, detail))
    out.rows.extend(broken_contracts(artifact, partners or {}))
    out.unpinned = unpinned(artifact.requires, stack_pins() if pins is None else pins)
    return out


def _copies_here(spec: PatchSpec, artifact: source.Artifact) -> bool:
    return any(artifact.module_path(module) is not None for module, _ in spec.copy_places())


# -- the command -----------------------------------------------------------------------------------


def _print(results: list[Checked], skipped: list[str]) -> None:
    for result in results:
        print(f"{result.distribution} {result.version or '(version unknown)'}  [{result.origin}]")
        if not result.rows:
            print("  no patch of npu-compat targets it")
        width = max((len(r.patch) for r in result.rows), default=0)
        for row in result.rows:
            print(f"  {row.verdict:27s}  {row.patch:{width}s}  {row.target}")
            if row.detail:
                print(f"  {'':27s}  {'':{width}s}  -> {row.detail}")
        for req in result.unpinned:
            print(f"  requires {req}")
    for line in skipped:
        print(line)


def main(argv: list[str]) -> int:
    from .._catalog import SPECS

    parser = argparse.ArgumentParser(
        prog="python -m npu_compat check",
        description="which patches a release keeps, moves or breaks (read from its files, not installed)",
    )
    parser.add_argument("artifacts", nargs="*", metavar="ARTIFACT", help="a wheel, an sdist or a source tree")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    args = parser.parse_args(argv)
    artifacts: list[source.Artifact] = []
    skipped: list[str] = []
    try:
        for path in args.artifacts:
            artifacts.append(source.open_artifact(path))
    except (ValueError, OSError) as exc:
        print(f"npu_compat check: {exc}", file=sys.stderr)
        return 2
    if not args.artifacts:
        for dist in sorted({s.distribution for s in SPECS}):
            found = source.installed(dist)
            if found is None:
                skipped.append(f"{dist}: not installed")
            else:
                artifacts.append(found)
    pins = stack_pins()
    # the releases a contract's partner may be: those checked together, else the installed ones
    partners: dict[str, str | None] = {}
    for contract in CONTRACTS:
        partners[source.normalize(contract.needed_by)] = installed_version(contract.needed_by)
    partners.update({a.key: a.version for a in artifacts})
    results = [check_artifact(a, SPECS, pins, partners) for a in artifacts]
    if args.json:
        print(
            json.dumps(
                {
                    "artifacts": [{**asdict(r), "failing": r.failing} for r in results],
                    "not_installed": skipped,
                    "ok": not any(r.failing for r in results),
                },
                indent=2,
            )
        )
    else:
        _print(results, skipped)
    return 1 if any(r.failing for r in results) else 0
