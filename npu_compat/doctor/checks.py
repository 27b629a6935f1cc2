"""``doctor``'s checks of this environment, none of which imports a patch target: the device decision
and our variables; whether automatic activation reaches this interpreter, and by which path; the vLLM
plugin's entry point; and the Ascend environment (visible devices, the CANN toolkit, torch_npu's
autoload, HCCL's timeout, the simulated host's memory).

The patch plan is :mod:`.plan`'s, Ray's token rules :mod:`.ray_auth`'s, a run's reports :mod:`.reports`'s.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from importlib import metadata

from .. import _env, _hccl_library
from .._errors import ConfigError
from .._versions import installed_version
from .findings import Diagnosis

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
    from .._launcher import SITE_DIR as BOOTSTRAP

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
    if installed_version("vllm") is None:
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
    check_ray_visibility(d, on_npu, environ, record)
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
    check_allocator_conf(d, on_npu, environ, record)
    check_hccl_library(d, on_npu, environ, record)
    check_exec_timeout(d, on_npu, environ, record)
    check_connect_timeout(d, on_npu, environ, record)
    check_socket_ports(d, on_npu, environ, record)
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
    "trinity.trainer.verl.workers:TrinityActorRolloutRefWorker.setup_weight_sync_group takes "
    "synchronizer.sync_timeout and does not pass it on"
)


def _allocator_options(value: str) -> list[tuple[str, str]]:
    """``key:value`` pairs of an allocator setting, spaces dropped, a bracketed list kept whole."""
    pairs, depth, item = [], 0, ""
    for char in value.replace(" ", "") + ",":
        depth += {"[": 1, "]": -1}.get(char, 0)
        if char == "," and depth == 0:
            if item:
                key, _, val = item.partition(":")
                pairs.append((key, val))
            item = ""
        else:
            item += char
    return pairs


#: torch_npu's words where it refuses the combination (``CachingAllocatorConfig::parseArgs``, 6.0.0 on)
EXPANDABLE_WITH_SPLIT = (
    "`max_split_size_mb` or `garbage_collection_threshold`, cannot be enabled with `expandable_segments`, "
    "please set `expandable_segments` to `False`."
)


def allocator_conf_problem(value: str) -> str | None:
    """What torch_npu's allocator refuses in a ``PYTORCH_NPU_ALLOC_CONF`` value, in its words; ``None`` if
    nothing.  Its parser reads every pair, then checks the combination, so the order does not matter."""
    options = dict(_allocator_options(value))
    expandable = options.get("expandable_segments")
    if expandable is not None and expandable not in ("True", "False"):
        return (
            f"expandable_segments:{expandable}: Expected a single True/False argument for expandable_segments"
        )
    threshold = options.get("garbage_collection_threshold", "0")
    try:
        collects = float(threshold) != 0
    except ValueError:
        collects = True
    if expandable == "True" and ("max_split_size_mb" in options or collects):
        return EXPANDABLE_WITH_SPLIT
    return None


def check_allocator_conf(
    d: Diagnosis, on_npu: bool, environ: dict[str, str], record: Callable[[str, str, str], None]
) -> None:
    """``PYTORCH_NPU_ALLOC_CONF``: a combination torch_npu's allocator refuses fails the first NPU allocation
    of every process that inherits it (field failure F8)."""
    name = _env.PYTORCH_NPU_ALLOC_CONF
    value = environ.get(name)
    if value is None:
        record(name, "ok", "unset (torch_npu's defaults)")
        return
    problem = allocator_conf_problem(value)
    if problem is None:
        record(name, "ok", value)
        return
    record(name, "bad", problem)
    d.add(
        "error" if on_npu else "warning",
        f"{name}={value!r}: torch_npu refuses it at the first NPU allocation of each process that inherits "
        f"it (RuntimeError: {problem}). Fix: drop max_split_size_mb and garbage_collection_threshold, or set "
        "expandable_segments:False (vllm-ascend itself adds expandable_segments:True for an engine "
        "without sleep mode, unless one of the others is set)",
    )


def check_hccl_library(
    d: Diagnosis, on_npu: bool, environ: dict[str, str], record: Callable[[str, str, str], None]
) -> None:
    """The HCCL library vllm-ascend's ``PyHcclCommunicator`` loads: without it that communicator disables
    itself, and a weight sync over it moves nothing (npu-compat's patch makes that an error in the run)."""
    name = "HCCL library"
    if not on_npu:
        record(name, "n/a", "not an NPU decision")
        return
    path = _hccl_library.library(environ)
    problem = _hccl_library.load_problem(path)
    if problem is None:
        record(name, "ok", f"{path} loads")
        return
    record(name, "bad", problem if path in problem else f"{path}: {problem}")
    d.add(
        "error",
        f"the HCCL library {path!r} does not load here ({problem}). vllm-ascend's PyHcclCommunicator, which "
        "carries Trinity's weight sync over HCCL, would disable itself and move no weight. "
        f"Fix: {_hccl_library.how_to_fix(environ)}",
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


def check_connect_timeout(
    d: Diagnosis, on_npu: bool, environ: dict[str, str], record: Callable[[str, str, str], None]
) -> None:
    """``HCCL_CONNECT_TIMEOUT``: how far apart the peers of one HCCL group may join it."""
    name, default = _env.HCCL_CONNECT_TIMEOUT, _env.HCCL_CONNECT_TIMEOUT_DEFAULT_S
    low, high = _env.HCCL_CONNECT_TIMEOUT_RANGE_S
    value = environ.get(name)
    if value is None:
        record(name, "ok", f"unset (HCCL's default, {default} s)")
        if on_npu:
            d.add(
                "note",
                f"{name} is unset: the peers of an HCCL group that join more than {default} s apart "
                "fail with EI0006 (getting socket times out). Trinity's weight-sync group is joined by the "
                "trainer and by every rollout engine, each once its model has loaded, and a run's first "
                f"collectives wait for the slowest rank. To allow more, export "
                f"{name}=<seconds, {low}-{high}> before `ray start`",
            )
    elif value.strip().isdigit() and low <= int(value) <= high:
        record(name, "ok", f"{value} s")
    else:
        record(name, "bad", f"{value!r} is not a whole number of seconds from {low} to {high}")
        d.add(
            "error" if on_npu else "warning",
            f"{name}={value!r} is not a whole number of seconds from {low} to {high}, so HCCL does not wait "
            f"as long as you meant for a group's peers. Fix: give whole seconds in that range, e.g. 1200",
        )


def _port_range_problem(value: str) -> str | None:
    """What is wrong with a value of an HCCL socket port range, or None: CANN takes ``auto``, or
    ports (1-65535) and ``first-last`` ranges separated by commas that do not overlap."""
    if value.strip() == "auto":
        return None
    taken: list[tuple[int, int, str]] = []
    for part in (p.strip() for p in value.split(",")):
        first, _, last = part.partition("-")
        ports = [first, last] if last else [first]
        if not all(p.strip().isdigit() and 0 < int(p) <= 65535 for p in ports):
            return f"{part!r} is neither a port nor a first-last range of ports"
        low, high = int(first), int(last or first)
        if low > high:
            return f"{part!r} ends before it starts"
        clash = [name for a, b, name in taken if low <= b and a <= high]
        if clash:
            return f"{part!r} overlaps {clash[0]!r}"
        taken.append((low, high, part))
    return None


def check_socket_ports(
    d: Diagnosis, on_npu: bool, environ: dict[str, str], record: Callable[[str, str, str], None]
) -> None:
    """HCCL's socket ports: processes building HCCL communicators on one NPU or host need distinct ones."""
    ranges = (_env.HCCL_HOST_SOCKET_PORT_RANGE, _env.HCCL_NPU_SOCKET_PORT_RANGE)
    for name in ranges:
        value = environ.get(name)
        if value is None:
            record(name, "ok", "unset (HCCL's default ports)")
            continue
        problem = _port_range_problem(value)
        if problem is None:
            record(name, "ok", value)
        else:
            record(name, "bad", problem)
            d.add(
                "error" if on_npu else "warning",
                f"{name}={value!r}: {problem}. Fix: auto (the OS picks free ports), or ports and first-last "
                "ranges separated by commas",
            )
    if on_npu and not any(environ.get(n) for n in (*ranges, _env.HCCL_IF_BASE_PORT)):
        d.add(
            "note",
            f"{' and '.join(ranges)} are unset (and so is {_env.HCCL_IF_BASE_PORT}): every process that "
            "builds HCCL communicators binds HCCL's default ports, so a second one on the same NPU or host "
            "fails to bind (EJ0003, 'The IP address and port have been bound already'). That is Trinity's "
            "colocate mode (the trainer and the rollout engine on one NPU) and two runs on one host. Fix: "
            f"export {ranges[0]}=auto {ranges[1]}=auto before `ray start`",
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


#: Where verl's workers (Trinity's trainer) choose their NPU when Ray leaves the visible devices alone.
VERL_SET_DEVICE = "verl.single_controller.base.worker:Worker._setup_env_cuda_visible_devices"


def check_ray_visibility(
    d: Diagnosis, on_npu: bool, environ: dict[str, str], record: Callable[[str, str, str], None]
) -> None:
    """``RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES``: with it, a worker's NPU is Ray's id for it."""
    name, visible_name = _env.RAY_NOSET_ASCEND_VISIBLE, _env.ASCEND_VISIBLE_DEVICES
    value = environ.get(name)
    if not value:  # verl reads it as set when it is not empty
        record(name, "ok", f"unset (Ray narrows {visible_name} to each actor's NPUs)")
        return
    visible = environ.get(visible_name)
    items = [p.strip() for p in (visible or "").split(",")]
    if (
        visible is None
        or not all(p.isdigit() for p in items)
        or [int(p) for p in items] == list(range(len(items)))
    ):
        # unset, or numbered from 0: Ray's NPU ids are the runtime's device indices (a malformed value
        # is named by the visible-devices check)
        record(name, "ok", f"{value} (Ray's NPU ids are the device indices here)")
        return
    record(name, "bad", f"{value}, with {visible_name}={visible}")
    d.add(
        "error" if on_npu else "warning",
        f"{name}={value} with {visible_name}={visible}: Ray then leaves {visible_name}={visible} to every "
        f"actor, and verl's workers (Trinity's trainer; {VERL_SET_DEVICE}) pass Ray's id of their NPU, a "
        f"physical number such as {items[-1]}, to torch.npu.set_device, which counts the visible NPUs from "
        f"0: 'Invalid device ID'. Fix: unset {name} before `ray start`, or start Ray with {visible_name} "
        "unset or numbered from 0",
    )


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
