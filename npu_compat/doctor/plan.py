"""``doctor``'s patch plan: for each target distribution, its installed version against the ranges its
patches support; for each patch, whether it would apply here or is skipped, and why; and the installed
pairs of upstream releases that cannot run together on any device.

The plan is the engine's, not a copy of it: what ``NPU_COMPAT_DISABLE`` disables is read by
:func:`npu_compat._register.disabled_ids`, with the reason a registered record gets, and the version
gate is :mod:`npu_compat._versions`'s, the one :mod:`npu_compat._apply` checks.  Nothing is imported:
versions come from installed metadata, and upstream source is read through :mod:`.source`.

A version outside a patch's range is only reported when the installed files still hold what that
patch changes (:func:`nothing_to_patch`): a module, a name the patch replaces, or the ``torch.cuda`` a
view of torch redirects.  A whole distribution outside every range is not reported when
:data:`.upstream.SERVED_ELSEWHERE` says, and this environment confirms, that the code its patches
change is gone from that version and other patches serve what it did.
"""

from __future__ import annotations

from .. import _env
from .._register import DISABLED, disabled_ids
from .._spec import PatchSpec
from .._versions import installed_version, version_in_range
from . import check, source, upstream
from .findings import Diagnosis


def nothing_to_patch(spec: PatchSpec, version: str, reader: source.Reader | None) -> str | None:
    """Why ``spec.distribution`` ``version`` holds nothing for ``spec`` to change, read from its files
    through ``reader`` (None: no files, it is not installed); None when it does, or when that cannot be
    told.  The same reader answers ``check`` (:func:`.check.match`)."""
    if reader is None or not reader.ships(spec.module):
        return f"{spec.distribution} {version} does not ship {spec.module}"
    tree = reader.tree(spec.module)
    if tree is None:
        return None
    name = spec.attr_path[0]
    names = source.module_names(tree)
    if names is not None and name not in names:
        return f"its {spec.module} has no {name}"
    attribute = upstream.view_attribute(spec.replacement)
    if attribute is not None and not source.uses_attribute(tree, name, attribute):
        return f"its {spec.module} never uses {name}.{attribute}"
    return None


class _Readers(dict[str, "source.Reader | None"]):
    """The installed distributions' readers, each made once, when first asked for."""

    def __missing__(self, distribution: str) -> source.Reader | None:
        reader = self[distribution] = source.installed_reader(distribution)
        return reader


def _served_elsewhere(
    dist: str,
    version: str,
    specs: tuple[PatchSpec, ...],
    served: tuple[upstream.ServedElsewhere, ...],
    reader: source.Reader | None,
) -> tuple[upstream.ServedElsewhere | None, str | None]:
    """The declaration that serves ``dist`` ``version`` here, or None and why a declaration does not hold."""
    by_id = {s.id: s for s in specs}
    why_not = None
    for entry in served:
        if entry.distribution != dist or not version_in_range(version, entry.versions):
            continue
        problems = [
            f"{dist} {version} ships {m}" for m in entry.gone if reader is not None and reader.ships(m)
        ]
        for pid in entry.served_by:
            spec = by_id.get(pid)
            other = None if spec is None else installed_version(spec.distribution)
            if spec is None:
                problems.append(f"npu-compat has no patch {pid}")
            elif other is None or not version_in_range(other, spec.versions):
                problems.append(
                    f"{pid} needs {spec.distribution}{spec.versions} (installed: {other or 'none'})"
                )
        if not problems:
            return entry, None
        why_not = f"{entry.how}; here, though, {'; '.join(problems)}"
    return None, why_not


def check_targets(
    d: Diagnosis,
    specs: tuple[PatchSpec, ...],
    decision: _env.Decision | None,
    served: tuple[upstream.ServedElsewhere, ...] = upstream.SERVED_ELSEWHERE,
) -> dict[str, str | None]:
    by_dist: dict[str, list[str]] = {}
    for spec in specs:
        ranges = by_dist.setdefault(spec.distribution, [])
        if spec.versions not in ranges:
            ranges.append(spec.versions)
    rows: list[dict[str, object]] = []
    installed: dict[str, str | None] = {}
    readers = _Readers()
    for dist, ranges in sorted(by_dist.items()):
        version = installed[dist] = installed_version(dist)
        covered = version is not None and any(version_in_range(version, r) for r in ranges)
        verdict = "not installed" if version is None else ("supported" if covered else "not covered")
        row: dict[str, object] = {
            "distribution": dist,
            "installed": version,
            "ranges": ranges,
            "verdict": verdict,
        }
        rows.append(row)
        if version is None or covered:
            continue
        entry, why_not = _served_elsewhere(dist, version, specs, served, readers[dist])
        if entry is not None:
            row.update(verdict="no patch needed", served_by=list(entry.served_by), how=entry.how)
            continue
        # Not an error: a patch may be needed only by other versions (a layout this one does not
        # have), and a newer release may carry its own NPU support.
        gone = [nothing_to_patch(s, version, readers[dist]) for s in specs if s.distribution == dist]
        found = (
            f"; nothing any of them changes is in it ({'; '.join(sorted({g for g in gone if g}))})"
            if gone and all(gone)
            else ""
        )
        d.add(
            "warning" if decision is not None and decision.is_npu else "note",
            f"{dist} {version} is outside every range npu-compat patches ({', '.join(ranges)}): none of "
            f"its patches apply{found}"
            + (f" ({why_not})" if why_not else "")
            + f". If this {dist} needs them or other changes on Ascend, install a supported one or "
            "upgrade npu-compat",
        )
    d.sections["targets"] = rows
    return installed


def check_plans(
    d: Diagnosis,
    specs: tuple[PatchSpec, ...],
    installed: dict[str, str | None],
    decision: _env.Decision | None,
    environ: dict[str, str],
) -> None:
    disabled, unknown = disabled_ids(specs, environ.get(_env.DISABLE, ""))
    if unknown:
        d.add("warning", f"{_env.DISABLE} names unknown patch ids {', '.join(unknown)}")
    plans = []
    unsupported: dict[str, list[str]] = {}
    readers = _Readers()
    for spec in specs:
        version = installed.get(spec.distribution)
        if spec.id in disabled:
            plan, why = "skip", DISABLED
        elif version is None:
            plan, why = "skip", f"{spec.distribution} is not installed: nothing to patch"
        elif not version_in_range(version, spec.versions):
            plan, why = "skip", f"{spec.distribution} {version} is outside {spec.versions!r}"
            absent = nothing_to_patch(spec, version, readers[spec.distribution])
            if absent is None:
                unsupported.setdefault(spec.target, []).append(spec.versions)
            else:
                why += f" ({absent}: nothing to patch)"
        elif spec.condition is not None:
            plan = "would apply"
            why = f"when {spec.module} is imported, unless {spec.condition} says otherwise"
        else:
            plan, why = "would apply", f"when {spec.module} is imported"
        plans.append({"id": spec.id, "target": spec.target, "plan": plan, "why": why})
    targets = d.sections.get("targets")
    rows = targets if isinstance(targets, list) else []
    supported_dists = {t["distribution"] for t in rows if t["verdict"] == "supported"}
    for spec in specs:
        version = installed.get(spec.distribution)
        if spec.target not in unsupported or version is None or spec.distribution not in supported_dists:
            continue  # a wholly unsupported distribution is reported once, by check_targets
        siblings = [s.versions for s in specs if s.target == spec.target]
        if not any(version_in_range(version, r) for r in siblings):
            # the installed module holds what this patch changes (nothing_to_patch found it there),
            # and no patch for it supports this version
            ranges = ", ".join(repr(r) for r in siblings)
            d.add(
                "warning",
                f"{spec.distribution} {version} ships {spec.module}, but no npu-compat patch for "
                f"{spec.target} supports this version ({ranges}); if that code runs on Ascend, "
                "it runs unpatched",
            )
        unsupported.pop(spec.target)
    d.sections["plans"] = plans
    if decision is not None and not decision.is_npu:
        d.add(
            "note",
            f"the device decision is {decision.device!r}: nothing is patched on this host; "
            "the plan above is what an Ascend host with these packages would get",
        )


def check_contracts(d: Diagnosis, installed: dict[str, str | None]) -> None:
    """An installed pair of upstream releases that cannot run together on any device
    (:data:`.upstream.CONTRACTS`): an error, naming the pair and the fix."""
    partners = {source.normalize(k): v for k, v in installed.items()}
    for contract in upstream.CONTRACTS:
        artifact = source.installed(contract.distribution)
        if artifact is None or partners.get(source.normalize(contract.needed_by)) is None:
            continue
        for row in check.broken_contracts(artifact, partners):
            d.add("error", row.detail)
