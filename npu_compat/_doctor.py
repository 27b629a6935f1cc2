"""``python -m npu_compat doctor [--json] [--reports DIR [--timeline [--svg FILE]] [--floor]]``: will
npu-compat work here, and if not, why.

Checks this environment without importing any patch target: the device decision
and its evidence; each target distribution's installed version against the ranges
its patches support; each patch's plan (would apply, or skipped and why); whether
automatic activation reaches this interpreter and by which path; the Ascend
environment (visible devices, toolkit, torch_npu autoload); and, with ``--reports``,
which patches applied in which process of a run (with ``--timeline``, when each process
started, activated, finished its imports and learned its role: :mod:`npu_compat._timeline`; with
``--floor``, the run's start-up against the same processes importing alone: :mod:`npu_compat._floor`).

Every problem that would break a run is an ``error`` with the fix in its message, and
makes the exit status 1; ``warning`` and ``note`` lines never do.  A bad command line
exits with 2.

A version outside a patch's range is only reported when the installed files still hold
what that patch changes (read from the distribution's files, never imported): a module,
a name the patch replaces, or the ``torch.cuda`` a view of torch redirects.  A whole
distribution outside every range is not reported when :data:`npu_compat._upstream.SERVED_ELSEWHERE` says,
and this environment confirms, that the code its patches change is gone from that
version and other patches serve what it did.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata

from . import _env, _source, _upstream
from ._errors import ConfigError
from ._spec import PatchSpec
from ._version import __version__
from ._versions import installed_version as _installed

TYPE_CHECKING = False
if TYPE_CHECKING:
    from . import _timeline

OUT_OF_SCOPE = (
    "SGLang, Megatron and `trinity perf` (NVML) are out of scope: npu-compat does not patch them, "
    "and a run that uses them on Ascend is not covered"
)


@dataclass
class Finding:
    level: str  # "error" (breaks a run; exit 1), "warning" or "note"
    message: str


@dataclass
class Diagnosis:
    findings: list[Finding] = field(default_factory=list)
    sections: dict[str, object] = field(default_factory=dict)

    def add(self, level: str, message: str) -> None:
        self.findings.append(Finding(level, message))

    @property
    def ok(self) -> bool:
        return not any(f.level == "error" for f in self.findings)


# -- the device decision ------------------------------------------------------------------


def check_decision(d: Diagnosis, environ: dict[str, str]) -> _env.Decision | None:
    try:
        decision = _env.decide(environ=environ)
    except ConfigError as exc:
        d.add("error", f"{exc} (fix the variable, or unset it to detect the device)")
        d.sections["decision"] = {"device": None, "source": "invalid setting", "evidence": []}
        return None
    d.sections["decision"] = decision.as_dict()
    return decision


def check_variables(d: Diagnosis, environ: dict[str, str]) -> None:
    """Our variables' values and names (``_env.value_problems``): each wrong one a warning."""
    for problem in _env.value_problems(environ):
        d.add("warning", problem)


# -- versions and patch plans ---------------------------------------------------------------


def _in_range(installed: str, versions: str) -> bool:
    from ._versions import version_in_range

    return version_in_range(installed, versions)


def _ships_module(distribution: str, module: str) -> bool:
    """Whether the installed ``distribution`` has ``module``'s file (read from its RECORD, not imported)."""
    artifact = _source.installed(distribution)
    return artifact is not None and artifact.has_module(module)


def _module_source(distribution: str, module: str) -> str | None:
    """The installed source of ``module`` from ``distribution``'s files, or None (not there, unreadable)."""
    artifact = _source.installed(distribution)
    return None if artifact is None else artifact.source(module)


def nothing_to_patch(spec: PatchSpec, version: str) -> str | None:
    """Why ``spec.distribution`` ``version`` (installed) holds nothing for ``spec`` to change, read from
    its installed files; None when it does, or when that cannot be told."""
    if not _ships_module(spec.distribution, spec.module):
        return f"{spec.distribution} {version} does not ship {spec.module}"
    source = _module_source(spec.distribution, spec.module)
    if source is None:
        return None
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return None
    name = spec.attr_path[0]
    names = _source.module_names(tree)
    if names is not None and name not in names:
        return f"its {spec.module} has no {name}"
    attribute = _upstream.VIEWS.get(spec.replacement or "")
    if attribute is not None and not _source.uses_attribute(tree, name, attribute):
        return f"its {spec.module} never uses {name}.{attribute}"
    return None


def _served_elsewhere(
    dist: str, version: str, specs: tuple[PatchSpec, ...], served: tuple[_upstream.ServedElsewhere, ...]
) -> tuple[_upstream.ServedElsewhere | None, str | None]:
    """The declaration that serves ``dist`` ``version`` here, or None and why a declaration does not hold."""
    by_id = {s.id: s for s in specs}
    why_not = None
    for entry in served:
        if entry.distribution != dist or not _in_range(version, entry.versions):
            continue
        problems = [f"{dist} {version} ships {m}" for m in entry.gone if _ships_module(dist, m)]
        for pid in entry.served_by:
            spec = by_id.get(pid)
            other = None if spec is None else _installed(spec.distribution)
            if spec is None:
                problems.append(f"npu-compat has no patch {pid}")
            elif other is None or not _in_range(other, spec.versions):
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
    served: tuple[_upstream.ServedElsewhere, ...] = _upstream.SERVED_ELSEWHERE,
) -> dict[str, str | None]:
    by_dist: dict[str, list[str]] = {}
    for spec in specs:
        ranges = by_dist.setdefault(spec.distribution, [])
        if spec.versions not in ranges:
            ranges.append(spec.versions)
    rows: list[dict[str, object]] = []
    installed: dict[str, str | None] = {}
    for dist, ranges in sorted(by_dist.items()):
        version = installed[dist] = _installed(dist)
        covered = version is not None and any(_in_range(version, r) for r in ranges)
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
        entry, why_not = _served_elsewhere(dist, version, specs, served)
        if entry is not None:
            row.update(verdict="no patch needed", served_by=list(entry.served_by), how=entry.how)
            continue
        # Not an error: a patch may be needed only by other versions (a layout this one does not
        # have), and a newer release may carry its own NPU support.
        gone = [nothing_to_patch(s, version) for s in specs if s.distribution == dist]
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
    raw = environ.get(_env.DISABLE, "")
    disabled = {p.strip() for p in raw.split(",") if p.strip()}
    known = {s.id for s in specs}
    unknown = sorted(disabled - known - {"*"})
    if unknown:
        d.add("warning", f"{_env.DISABLE} names unknown patch ids {', '.join(unknown)}")
    plans = []
    unsupported: dict[str, list[str]] = {}
    for spec in specs:
        version = installed.get(spec.distribution)
        if spec.id in disabled or "*" in disabled:
            plan, why = "skip", f"disabled by {_env.DISABLE}"
        elif version is None:
            plan, why = "skip", f"{spec.distribution} is not installed: nothing to patch"
        elif not _in_range(version, spec.versions):
            plan, why = "skip", f"{spec.distribution} {version} is outside {spec.versions!r}"
            absent = nothing_to_patch(spec, version)
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
        if not any(_in_range(version, r) for r in siblings):
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


# -- automatic activation -----------------------------------------------------------------------


def _site_dirs() -> list[str]:
    import site

    dirs = list(site.getsitepackages()) if hasattr(site, "getsitepackages") else []
    if site.ENABLE_USER_SITE:
        dirs.append(site.getusersitepackages())
    return dirs


def _same(a: str, b: str) -> bool:
    return bool(a) and os.path.normcase(os.path.realpath(a)) == os.path.normcase(os.path.realpath(b))


def check_activation(d: Diagnosis, decision: _env.Decision | None, environ: dict[str, str]) -> None:
    boot = sys.modules.get("_npu_compat_precheck")
    triggers: list[str] = list(getattr(boot, "TRIGGERS", []))
    started = getattr(boot, "STARTED", None)
    pth = [os.path.join(s, "npu_compat.pth") for s in _site_dirs()]
    pth_found = [p for p in pth if os.path.isfile(p)]
    from ._launcher import SITE_DIR as BOOTSTRAP

    ours_on_path = [p for p in environ.get("PYTHONPATH", "").split(os.pathsep) if _same(p, BOOTSTRAP)]
    sc = sys.modules.get("sitecustomize")
    sc_file = getattr(sc, "__file__", None)
    path = triggers[0] if triggers else "none"
    info = {
        "effective": bool(triggers),
        "path": path,
        "triggers": triggers,
        "started_by": started,
        "pth_files": pth_found,
        "launcher_bootstrap_on_pythonpath": ours_on_path,
        "sitecustomize": sc_file,
        "disabled_by": next(
            (f"{n}={environ[n]}" for n in (_env.ENABLE, _env.AUTO) if _env.is_false(environ.get(n))), None
        ),
    }
    d.sections["activation"] = info
    if info["disabled_by"]:
        d.add("warning", f"activation at interpreter start is off ({info['disabled_by']})")
        return
    if triggers:
        return
    level = "error" if decision is not None and decision.is_npu else "note"
    d.add(
        level,
        "automatic activation does not reach this interpreter (no npu_compat.pth in "
        f"{' or '.join(_site_dirs()) or 'a site directory'}, no npu-compat sitecustomize, not started "
        "by the launcher): Ray workers and vLLM processes would run unpatched. Fix: reinstall "
        "npu-compat into this environment (`pip install --force-reinstall npu-compat`), or start every "
        "command through `npu-compat ...` (e.g. `npu-compat ray start --head`, `npu-compat trinity run ...`)",
    )


def check_seams(d: Diagnosis, decision: _env.Decision | None, environ: dict[str, str]) -> None:
    try:
        plugins = [
            ep for ep in metadata.entry_points(group="vllm.general_plugins") if ep.name == "npu_compat"
        ]
    except Exception:  # noqa: BLE001 - broken metadata elsewhere must not stop the doctor
        plugins = []
    allowed = environ.get(_env.VLLM_PLUGINS)
    d.sections["vllm_plugin"] = {
        "registered": bool(plugins),
        "vllm_plugins": allowed,
    }
    if _installed("vllm") is None:
        return
    if not plugins:
        d.add(
            "warning",
            "vLLM is installed but npu-compat's vllm.general_plugins entry point is not registered "
            "(npu-compat runs from a checkout?): vLLM worker processes rely on the .pth alone. Fix: "
            "`pip install` npu-compat",
        )
    elif allowed is not None and "npu_compat" not in [p.strip() for p in allowed.split(",")]:
        d.add(
            "error" if decision is not None and decision.is_npu else "warning",
            f"{_env.VLLM_PLUGINS}={allowed!r} leaves out npu-compat's vLLM plugin. "
            f"Fix: add it: {_env.VLLM_PLUGINS}={allowed},npu_compat",
        )


# -- Ray's token authentication --------------------------------------------------------------------

#: The function of Ray's that turns token authentication on in ``ray start --head`` when a token
#: exists and ``RAY_AUTH_MODE`` is unset (``ray/_private/authentication/authentication_token_setup.py``);
#: ``ray status`` never calls it.
_RAY_AUTO_TOKEN = "def maybe_enable_token_auth_if_token_available"
_RAY_AUTH_SETUP = "ray/_private/authentication/authentication_token_setup.py"


def _ray_enables_token_on_start() -> bool:
    """Whether the installed Ray's ``ray start --head`` turns token authentication on by itself
    (read from the installed file, not imported)."""
    try:
        files = metadata.files("ray")
    except metadata.PackageNotFoundError:
        return False
    for f in files or ():
        if str(f) == _RAY_AUTH_SETUP:
            try:
                return _RAY_AUTO_TOKEN in f.read_text(encoding="utf-8")
            except OSError:
                return False
    return False


def ray_token_source(environ: dict[str, str]) -> str | None:
    """Where a Ray process with this environment finds a token, or None (the file is not read)."""
    if environ.get(_env.RAY_AUTH_TOKEN):
        return _env.RAY_AUTH_TOKEN
    path = environ.get(_env.RAY_AUTH_TOKEN_PATH)
    if path:
        return path if os.path.isfile(path) else None
    home = environ.get("HOME") or os.path.expanduser("~")
    default = os.path.join(home, ".ray", "auth_token")
    return "~/.ray/auth_token" if os.path.isfile(default) else None


def check_ray_auth(d: Diagnosis, environ: dict[str, str]) -> None:
    mode = environ.get(_env.RAY_AUTH_MODE)
    source = ray_token_source(environ)
    ray = _installed("ray")
    enables = ray is not None and _ray_enables_token_on_start()
    d.sections["ray_auth"] = {"ray": ray, "auth_mode": mode, "token": source, "start_enables_token": enables}
    if mode is None and source is not None and enables:
        d.add(
            "warning",
            f"Ray token authentication: a token exists ({source}) and {_env.RAY_AUTH_MODE} is unset, so "
            "`ray start --head` will turn token authentication on and require the token, while `ray status` "
            "-- which `trinity run` runs first (trinity.utils.dlc_utils.is_running) -- and "
            "`ray.init(address=...)` will not send it: `trinity run` then stops with 'Ray is not running'. "
            f"Fix: set the same mode on both sides, {_env.RAY_AUTH_MODE}=token for `ray start` and for "
            f"`trinity run` (both then read the same token), or {_env.RAY_AUTH_MODE}=disabled for both",
        )


# -- the Ascend environment -----------------------------------------------------------------------


def check_ascend(d: Diagnosis, decision: _env.Decision | None, environ: dict[str, str]) -> None:
    checks: list[dict[str, str]] = []
    on_npu = decision is not None and decision.is_npu

    def record(name: str, status: str, detail: str) -> None:
        checks.append({"check": name, "status": status, "detail": detail})

    visible = environ.get(_env.ASCEND_VISIBLE_DEVICES)
    if visible is None:
        record(_env.ASCEND_VISIBLE_DEVICES, "ok", "unset (all devices visible)")
    else:
        problem = visible_devices_problem(visible, host_npus(environ))
        if problem is None:
            record(_env.ASCEND_VISIBLE_DEVICES, "ok", visible)
        else:
            record(_env.ASCEND_VISIBLE_DEVICES, "bad", problem)
            d.add("error" if on_npu else "warning", f"{_env.ASCEND_VISIBLE_DEVICES}={visible!r}: {problem}")
    toolkit = [(n, environ[n]) for n in _env.ASCEND_TOOLKIT_VARS if environ.get(n)]
    if toolkit:
        name, value = toolkit[0]
        if os.path.isdir(value):
            record("CANN toolkit", "ok", f"{name}={value}")
        else:
            record("CANN toolkit", "bad", f"{name}={value} is not a directory")
            d.add(
                "error" if on_npu else "warning",
                f"{name}={value} is not a directory: torch_npu cannot load the CANN libraries. "
                "Fix: source the toolkit's set_env.sh (e.g. /usr/local/Ascend/ascend-toolkit/set_env.sh)",
            )
    else:
        record("CANN toolkit", "missing" if on_npu else "n/a", "no ASCEND_TOOLKIT_HOME / ASCEND_HOME_PATH")
        if on_npu:
            d.add(
                "error",
                "the CANN toolkit environment is not sourced (neither ASCEND_TOOLKIT_HOME nor "
                "ASCEND_HOME_PATH is set): torch_npu will not load. Fix: "
                "`source /usr/local/Ascend/ascend-toolkit/set_env.sh` (or your toolkit's set_env.sh) "
                "before starting Ray and the job",
            )
    autoload = environ.get(_env.TORCH_AUTOLOAD)
    if _env.is_false(autoload):
        record(_env.TORCH_AUTOLOAD, "bad", f"{autoload} (torch_npu is not loaded by `import torch`)")
        d.add(
            "error" if on_npu else "warning",
            f"{_env.TORCH_AUTOLOAD}={autoload} stops `import torch` from loading torch_npu, so torch.npu "
            f"and the hccl backend are missing in upstream code. Fix: unset {_env.TORCH_AUTOLOAD}",
        )
    else:
        record(_env.TORCH_AUTOLOAD, "ok", "not 0 (torch_npu loads with torch)")
    check_exec_timeout(d, on_npu, environ, record)
    d.sections["ascend"] = checks


#: Below this share of the host's memory still available, a simulated run is near the host's memory.
LOW_HOST_MEMORY = 0.10


def host_memory(meminfo: str = "/proc/meminfo") -> tuple[int, int] | None:
    """The host's total and available memory in bytes (Linux's ``/proc/meminfo``), or None."""
    fields: dict[str, int] = {}
    try:
        with open(meminfo) as lines:
            for line in lines:
                name, _, rest = line.partition(":")
                if name in ("MemTotal", "MemAvailable"):
                    fields[name] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    if len(fields) < 2:
        return None
    return fields["MemTotal"], fields["MemAvailable"]


def check_simulated_memory(
    d: Diagnosis, environ: dict[str, str], memory: tuple[int, int] | None = None
) -> None:
    """On the simulated Ascend: each NPU's memory against the host's, and the cause when little is left.

    A simulated NPU's memory is host memory.  The device counts every allocation in full; the host
    backs what is written (weights, activations, what the model writes of vLLM's KV cache) and keeps
    vLLM's host-side state for every KV-cache block, whose number vLLM sizes from the device's free
    memory.  ``memory`` is the host's ``(total, available)`` bytes (default: read now).
    """
    if not _env.is_true(environ.get(_env.SIMULATE)):
        return
    devices = _env.parse_count(environ.get(_env.SIMULATE_DEVICES, "2")) or 2
    capacity = _env.parse_size(environ.get(_env.SIMULATE_NPU_MEMORY, "")) or _env.SIMULATED_NPU_MEMORY
    memory = host_memory() if memory is None else memory
    gib = 1 << 30
    section: dict[str, object] = {"npus": devices, "npu_memory": capacity}
    if memory is not None:
        total, available = memory
        section.update(host_total=total, host_available=available)
        if available < LOW_HOST_MEMORY * total:
            d.add(
                "warning",
                f"the simulated Ascend is near this host's memory: {available / gib:.1f} GiB of "
                f"{total / gib:.1f} GiB left. A simulated NPU's memory is host memory: the host backs what "
                "is written to the NPUs (weights, activations, the KV cache the model fills) and vLLM's "
                "host-side state for each KV-cache block, which vLLM sizes from each NPU's free memory "
                f"({devices} NPUs of {capacity / gib:g} GiB here). The kernel's or Ray's OOM killer ends "
                "such a run. Fix: fewer engines or processes at once, or a smaller "
                f"{_env.SIMULATE_NPU_MEMORY} (vLLM's KV cache shrinks with it)",
            )
    d.sections["simulation"] = section


#: Where Trinity's weight sync over HCCL drops the bound its config gives (trinity-rft 0.6.0).
TRINITY_SYNC_TIMEOUT_DROPPED = (
    "trinity/trainer/verl/workers.py:302 (setup_weight_sync_group takes synchronizer.sync_timeout "
    "and does not pass it on)"
)


def check_exec_timeout(
    d: Diagnosis, on_npu: bool, environ: dict[str, str], record: Callable[[str, str, str], None]
) -> None:
    """``HCCL_EXEC_TIMEOUT``: the only bound on a collective whose peer died, where the caller sets none."""
    value = environ.get(_env.HCCL_EXEC_TIMEOUT)
    default = _env.HCCL_EXEC_TIMEOUT_DEFAULT_S
    if value is None:
        record(_env.HCCL_EXEC_TIMEOUT, "ok", f"unset (HCCL's default, {default} s)")
        if on_npu:
            d.add(
                "note",
                f"{_env.HCCL_EXEC_TIMEOUT} is unset: a collective whose peer process died waits HCCL's "
                f"default {default} s before it fails. Trinity's weight sync over HCCL (sync_method: nccl) "
                f"has no bound of its own: {TRINITY_SYNC_TIMEOUT_DROPPED}. To bound it, export "
                f"{_env.HCCL_EXEC_TIMEOUT}=<seconds> (e.g. your synchronizer.sync_timeout) "
                "before `ray start`",
            )
    elif value.strip().isdigit():
        record(_env.HCCL_EXEC_TIMEOUT, "ok", f"{value} s")
    else:
        record(_env.HCCL_EXEC_TIMEOUT, "bad", f"{value!r} is not a whole number of seconds")
        d.add(
            "error" if on_npu else "warning",
            f"{_env.HCCL_EXEC_TIMEOUT}={value!r} is not a whole number of seconds, so it is not the bound "
            "you meant for HCCL's collectives. Fix: give whole seconds, e.g. 1800",
        )


def host_npus(environ: dict[str, str]) -> tuple[list[int], str] | None:
    """The NPU numbers this host has, and where that was read: the simulated host's count, else the
    ``/dev/davinci<N>`` nodes of the driver; None where neither tells."""
    if _env.is_true(environ.get(_env.SIMULATE)):
        raw = environ.get(_env.SIMULATE_DEVICES, "2")
        count = _env.parse_count(raw)
        return (list(range(count)), f"{_env.SIMULATE_DEVICES}={raw}") if count else None
    try:
        names = os.listdir(_env.startup.DEV_DIR)
    except OSError:
        return None
    numbers = sorted(int(n[7:]) for n in names if n.startswith("davinci") and n[7:].isdigit())
    return (numbers, f"{_env.startup.DEV_DIR}/davinci*") if numbers else None


def visible_devices_problem(value: str, present: tuple[list[int], str] | None = None) -> str | None:
    """What is wrong with an ``ASCEND_RT_VISIBLE_DEVICES`` value, or None; with ``present``
    (:func:`host_npus`), also a device the host does not have."""
    items = [p.strip() for p in value.split(",")]
    if not value.strip() or any(not p for p in items):
        return "an empty entry; Fix: a comma-separated list of device numbers such as 0,1,2,3"
    if not all(p.isdigit() for p in items):
        bad = [p for p in items if not p.isdigit()]
        return f"{', '.join(repr(b) for b in bad)} is not a device number. Fix: use numbers such as 0,1,2,3"
    numbers = [int(p) for p in items]
    if len(set(numbers)) != len(numbers):
        return "a device is listed twice. Fix: list each device once"
    if numbers != sorted(numbers):
        fixed = ",".join(str(n) for n in sorted(numbers))
        return f"not in ascending order, which reorders device indices. Fix: {fixed}"
    if present is not None:
        (have, source) = present
        missing = [n for n in numbers if n not in have]
        if missing:
            names = ", ".join(str(n) for n in missing)
            has = f"{_number_ranges(have)}: {source}"
            return f"names NPU {names}, which this host does not have (it has {has}). Fix: name only those"
    return None


def _number_ranges(numbers: list[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2, 5"``."""
    parts: list[str] = []
    for n in sorted(numbers):
        if parts and parts[-1].split("-")[-1] == str(n - 1):
            parts[-1] = f"{parts[-1].split('-')[0]}-{n}"
        else:
            parts.append(str(n))
    return ", ".join(parts)


# -- per-process reports ------------------------------------------------------------------------


def read_reports(directory: str) -> list[dict[str, object]]:
    reports = []
    for name in sorted(os.listdir(directory)):
        if not name.endswith(".json") or name.startswith("."):
            continue
        try:
            with open(os.path.join(directory, name), encoding="utf-8") as f:
                data = json.load(f)
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and "pid" in data:
            reports.append(data)
    reports.sort(key=lambda r: (str(r.get("host")), float(r.get("updated") or 0), int(r.get("pid") or 0)))
    return reports


def check_reports(d: Diagnosis, directory: str) -> None:
    if not os.path.isdir(directory):
        d.add("error", f"--reports {directory}: no such directory")
        return
    reports = read_reports(directory)
    d.sections["reports"] = reports
    if not reports:
        d.add("warning", f"no report files in {directory} (was {_env.REPORT_DIR} set for the run?)")
        return
    devices = {str((r.get("decision") or {}).get("device")) for r in reports}  # type: ignore[attr-defined]
    if "npu" in devices and len(devices) > 1:
        others = sorted(devices - {"npu"})
        d.add(
            "warning",
            f"processes of this run decided differently ({', '.join(sorted(devices))}): the ones that "
            f"decided {', '.join(others)} ran unpatched (see each report's decision.evidence)",
        )
    for r in reports:
        for p in r.get("patches") or []:  # type: ignore[attr-defined]
            if p.get("status") == "failed":
                d.add(
                    "error",
                    f"pid {r.get('pid')} ({r.get('role')}): patch {p.get('id')} failed: {p.get('reason')}",
                )


# -- output ---------------------------------------------------------------------------------------


def check_contracts(d: Diagnosis, installed: dict[str, str | None]) -> None:
    """An installed pair of upstream releases that cannot run together on any device
    (:data:`npu_compat._upstream.CONTRACTS`): an error, naming the pair and the fix."""
    from . import _check

    partners = {_source.normalize(k): v for k, v in installed.items()}
    for contract in _upstream.CONTRACTS:
        artifact = _source.installed(contract.distribution)
        if artifact is None or partners.get(_source.normalize(contract.needed_by)) is None:
            continue
        for row in _check.broken_contracts(artifact, partners):
            d.add("error", row.detail)


def diagnose(reports: str | None = None, environ: dict[str, str] | None = None) -> Diagnosis:
    from ._catalog import SPECS

    env = dict(os.environ if environ is None else environ)
    d = Diagnosis()
    d.sections["npu_compat"] = __version__
    d.sections["python"] = f"{sys.version.split()[0]} ({sys.executable})"
    decision = check_decision(d, env)
    check_variables(d, env)
    installed = check_targets(d, SPECS, decision)
    check_contracts(d, installed)
    check_plans(d, SPECS, installed, decision, env)
    check_activation(d, decision, env)
    check_seams(d, decision, env)
    check_ascend(d, decision, env)
    check_simulated_memory(d, env)
    check_ray_auth(d, env)
    if reports is not None:
        check_reports(d, reports)
    d.add("note", OUT_OF_SCOPE)
    return d


def render(d: Diagnosis) -> str:
    s = d.sections
    lines = [f"npu-compat {s['npu_compat']} doctor -- python {s['python']}", ""]
    decision = s["decision"]
    assert isinstance(decision, dict)
    lines.append(f"device decision: {decision['device']}  ({decision['source']})")
    lines += [f"  evidence: {e}" for e in decision["evidence"]]
    act = s["activation"]
    assert isinstance(act, dict)
    if act["effective"]:
        also = f" (then {', '.join(act['triggers'][1:])})" if len(act["triggers"]) > 1 else ""
        started = "it started npu-compat" if act["started_by"] else "nothing to start here (no Ascend hint)"
        reach = f"reaches this interpreter by {act['path']}{also}; {started}"
    else:
        reach = "does not reach this interpreter"
    lines += ["", f"automatic activation: {reach}"]
    lines.append(f"  npu_compat.pth: {', '.join(act['pth_files']) or 'not in any site directory'}")
    lines.append(f"  sitecustomize: {act['sitecustomize'] or 'none'}")
    lines.append(
        f"  launcher bootstrap on PYTHONPATH: {'yes' if act['launcher_bootstrap_on_pythonpath'] else 'no'}"
    )
    vllm = s["vllm_plugin"]
    assert isinstance(vllm, dict)
    lines.append(f"  vLLM plugin entry point: {'registered' if vllm['registered'] else 'not registered'}")
    auth = s["ray_auth"]
    assert isinstance(auth, dict)
    if auth["ray"] is None:
        lines.append("  Ray token authentication: Ray is not installed")
    else:
        starts = (
            "turns it on when a token exists"
            if auth["start_enables_token"]
            else "never turns it on by itself"
        )
        lines.append(
            f"  Ray token authentication: {_env.RAY_AUTH_MODE} {auth['auth_mode'] or 'unset'}; "
            f"token: {auth['token'] or 'none found'}; `ray start --head` {starts}"
        )
    lines += ["", "Ascend environment:"]
    for c in s["ascend"]:  # type: ignore[attr-defined]
        lines.append(f"  {c['status']:7s} {c['check']}: {c['detail']}")
    if "simulation" in s:
        sim = s["simulation"]
        assert isinstance(sim, dict)
        gib = 1 << 30
        host = ""
        if "host_total" in sim:
            total, available = sim["host_total"] / gib, sim["host_available"] / gib
            host = f"; the host has {total:.1f} GiB, {available:.1f} GiB available"
        lines.append(f"  simulated: {sim['npus']} NPUs of {sim['npu_memory'] / gib:g} GiB each{host}")
    lines += ["", "target distributions:"]
    for t in s["targets"]:  # type: ignore[attr-defined]
        ranges = ", ".join(t["ranges"])
        lines.append(f"  {t['distribution']:14s} {t['installed'] or '-':14s} {t['verdict']:15s} {ranges}")
        if "how" in t:
            lines.append(f"      {t['how']}")
    lines += ["", "patch plan (nothing imported):"]
    plans = s["plans"]
    assert isinstance(plans, list)
    width = max((len(p["id"]) for p in plans), default=10)
    for p in plans:
        lines.append(f"  {p['id']:{width}s}  {p['plan']:11s}  {p['why']}")
    if "reports" in s:
        lines += ["", *render_reports(s["reports"])]  # type: ignore[arg-type]
    lines.append("")
    for f in d.findings:
        lines.append(f"{f.level}: {f.message}")
    errors = sum(f.level == "error" for f in d.findings)
    lines.append("")
    lines.append(
        "OK: nothing found that would break a run" if not errors else f"{errors} problem(s) would break a run"
    )
    return "\n".join(lines)


_MARK = {"applied": "A", "failed": "F", "skipped": "s", "pending": "."}


def render_reports(reports: list[dict[str, object]]) -> list[str]:
    """The processes of a run, then a patch x process table (A applied, F failed, s skipped, . pending)."""
    if not reports:
        return ["reports: none"]
    lines = [f"processes ({len(reports)} reports):"]
    lines.append(f"  {'#':>3}  {'host':12s} {'pid':>7}  {'device':6s} {'activated by':15s} role / program")
    for i, r in enumerate(reports, 1):
        ray = r.get("ray") or {}
        actor = ray.get("actor_name") or ray.get("actor_class")  # type: ignore[attr-defined]
        role = str(r.get("role")) + (f" {actor}" if actor else "")
        device = (r.get("decision") or {}).get("device")  # type: ignore[attr-defined]
        lines.append(
            f"  {i:>3}  {str(r.get('host'))[:12]:12s} {r.get('pid')!s:>7}  {device!s:6s} "
            f"{r.get('activated_by')!s:15s} {role} / {r.get('program')}"
        )
    ids: list[str] = []
    for r in reports:
        for p in r.get("patches") or []:  # type: ignore[attr-defined]
            if p["id"] not in ids:
                ids.append(p["id"])
    width = max((len(i) for i in ids), default=5)
    lines += ["", "patches x processes (A applied, F failed, s skipped, . pending, blank unknown):"]
    lines.append(f"  {'':{width}s}  " + " ".join(f"{i % 100:>2}" for i in range(1, len(reports) + 1)))
    for pid in ids:
        cells = []
        for r in reports:
            status = next((p["status"] for p in r.get("patches") or [] if p["id"] == pid), None)  # type: ignore[attr-defined]
            cells.append(f"{_MARK.get(str(status), ' '):>2}")
        lines.append(f"  {pid:{width}s}  " + " ".join(cells))
    return lines


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m npu_compat doctor",
        description="check whether npu-compat will work in this environment (imports no patch target)",
    )
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument(
        "--reports", metavar="DIR", help=f"read the per-process reports of a run ({_env.REPORT_DIR})"
    )
    parser.add_argument(
        "--timeline", action="store_true", help="with --reports: when each process started and activated"
    )
    parser.add_argument("--svg", metavar="FILE", help="with --timeline: write it as an SVG chart too")
    parser.add_argument(
        "--floor",
        action="store_true",
        help="with --reports: replay the run's start-up as imports alone on this machine, against the run",
    )
    parser.add_argument(
        "--until", type=float, metavar="EPOCH", help="with --floor: where the start-up ended (default: the "
        "last process became ready)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if (args.timeline or args.svg or args.floor) and not args.reports:
        parser.error("--timeline, --svg and --floor read a run's reports: give --reports DIR")
    if args.svg and not args.timeline:
        parser.error("--svg writes the timeline: give --timeline too")
    d = diagnose(args.reports)
    if args.json:
        out = {**d.sections, "findings": [f.__dict__ for f in d.findings], "ok": d.ok}
        print(json.dumps(out, indent=2, default=str))
    else:
        print(render(d))
    if args.timeline or args.floor:
        from . import _timeline

        table = _timeline.rows(d.sections.get("reports", []), args.reports)  # type: ignore[arg-type]
    if args.timeline:
        if not args.json:
            print("\n" + "\n".join(_timeline.render_text(table)))
        if args.svg:
            with open(args.svg, "w", encoding="utf-8") as out_file:
                out_file.write(_timeline.render_svg(table))
    if args.floor:
        floor_lines(table, args.reports, args.until)
    return 0 if d.ok else 1


def floor_lines(table: list[_timeline.Row], directory: str, until: float | None) -> None:
    """Print the run's start-up against its floor (:mod:`._floor`), replayed here now, from the run's
    rows (:func:`._timeline.rows` of the reports in ``directory``)."""
    from . import _floor

    begin = _floor.run_begin(table)
    if until is None:
        readies = [row.ready for row in table if row.ready is not None]
        until = max(readies) if readies else None
    if begin is None or until is None:
        print("\nfloor: no Ray driver in the reports, or nothing became ready")
        return
    steps = _floor.plan(table, directory, begin, until)
    length = _floor.replay(steps)
    print("\n" + "\n".join(_floor.render(steps, begin, until, length)))
