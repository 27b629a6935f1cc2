"""The environment: every variable npu-compat reads or writes, named once, and the
device decision read from them and from the host.

The variables npu-compat owns all start with ``NPU_COMPAT_``.  A few variables of
other projects are read as evidence or honoured as overrides; they are listed here
too, so that there is one place to look.  The README documents each one.

The device decision -- is this an Ascend host, and should npu-compat patch
anything? -- is made here without importing torch or any other module, because it
runs at the start of every interpreter (this module and the package's ``__init__``
are all that a CUDA or CPU host ever loads).  Precedence:

1. ``NPU_COMPAT=0``: off, whatever else is set;
2. an explicit ``device=`` argument to :func:`npu_compat.activate`;
3. ``NPU_COMPAT_DEVICE`` (unless ``auto``), then upstream Trinity's ``TRINITY_DEVICE``;
4. auto: any Ascend evidence (``/dev/davinci*``, ``ASCEND_RT_VISIBLE_DEVICES``, the CANN
   toolkit environment, a findable ``torch_npu``) means ``npu``; no evidence means ``cpu``
   (not an Ascend host: do nothing -- CUDA hosts land here too).

Only ``npu`` leads to any patching.
"""

import os
import sys

TYPE_CHECKING = False  # typing is not imported on the start-up path
if TYPE_CHECKING:
    from collections.abc import Mapping
    from types import ModuleType


def _load_startup() -> "ModuleType":
    # The import-free start-up module (``_npu_compat_precheck``, beside this package): loaded at
    # interpreter start by the .pth or a sitecustomize of ours, else from this package's own
    # location (never from the current directory).
    loaded = sys.modules.get("_npu_compat_precheck")
    if loaded is not None:
        return loaded
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path.insert(0, root)
    try:
        import _npu_compat_precheck
    finally:
        if sys.path and sys.path[0] == root:
            del sys.path[0]
    return _npu_compat_precheck


#: The start-up module: the names and the evidence the device decision reads, shared with the pre-check.
startup = _load_startup()

#: ``0`` turns npu-compat off entirely: no auto-activation, and ``activate()``
#: does nothing.  Any other value (or unset) leaves it on.
ENABLE: str = startup.ENABLE

#: ``npu``, ``cuda``, ``cpu`` or ``auto`` (default).  Overrides the device decision.
DEVICE: str = startup.DEVICE

#: Upstream Trinity-RFT's name for the same override; honoured when
#: ``NPU_COMPAT_DEVICE`` is unset or ``auto``.
TRINITY_DEVICE: str = startup.TRINITY_DEVICE

#: ``1`` makes every patch failure raise :class:`npu_compat.PatchError`.
STRICT = "NPU_COMPAT_STRICT"

#: Comma-separated patch ids to leave alone, or ``*`` for all of them.
DISABLE: str = startup.DISABLE

#: A directory; every activated process writes one JSON report file into it.
REPORT_DIR: str = startup.REPORT_DIR

#: ``1`` switches on the simulated Ascend of :mod:`npu_compat.testing` in this
#: process and in every child process that inherits the environment.
SIMULATE: str = startup.SIMULATE

#: Number of simulated NPUs (default 2).
SIMULATE_DEVICES = "NPU_COMPAT_SIMULATE_DEVICES"

#: Memory of each simulated NPU: bytes, or a number with ``KiB``/``MiB``/``GiB`` (default
#: ``64GiB``, as an Ascend 910B3).  Allocating past it raises ``torch.OutOfMemoryError``.
SIMULATE_NPU_MEMORY = "NPU_COMPAT_SIMULATE_NPU_MEMORY"
#: Its default: an Ascend 910B3's 64 GiB of HBM.
SIMULATED_NPU_MEMORY = 64 << 30
#: The simulated SoC, as CANN names it (``rtGetSocVersion``).
SIMULATED_SOC = "Ascend910B3"

#: Where the simulated NPU's C++ backend is compiled and cached (default
#: ``$XDG_CACHE_HOME/npu_compat``, else ``~/.cache/npu_compat``).
SIMULATE_BUILD_DIR = "NPU_COMPAT_SIMULATE_BUILD_DIR"

#: ``0`` leaves the simulated vllm-ascend's distribution (and so its vLLM platform and general
#: plugins) out of a simulated process: vLLM then runs as on a host without vllm-ascend.
#: Default ``1``: the simulated host has vllm-ascend installed, as a real Ascend host does.
SIMULATE_VLLM_PLATFORM = "NPU_COMPAT_SIMULATE_VLLM_PLATFORM"

#: Variables npu-compat no longer reads, each with what replaced it: ``doctor`` says so where one is set.
RETIRED = {
    "NPU_COMPAT_SIMULATE_VLLM_ASCEND": "the simulated host always runs the released vllm-ascend, laid out by "
    "`python -m npu_compat.testing vllm-ascend`; npu-compat's stand-in copy of it was removed",
}

#: ``0`` stops activation at interpreter start (the ``npu_compat.pth`` line and the
#: shipped ``sitecustomize``); ``activate()``, the launcher, the Ray worker setup hook
#: and the vLLM plugin still activate.  For code that calls ``activate()`` itself
#: with its own arguments.  The launcher drops it from its command's environment.
#: Like the other names the device decision reads, its literal is in the import-free start-up module.
AUTO: str = startup.AUTO

#: Set by npu-compat, not by users: the job's own ``worker_process_setup_hook``
#: (an import path) that npu-compat's Ray hook runs after activating, in each worker.
RAY_SETUP_HOOK = "NPU_COMPAT_RAY_SETUP_HOOK"

#: Every name npu-compat owns starts with this.
PREFIX = "NPU_COMPAT"

# Evidence of an Ascend host, read by the device decision (not ours).
ASCEND_VISIBLE_DEVICES: str = startup.ASCEND_VISIBLE_DEVICES
#: Set by the CANN toolkit's ``set_env.sh``.
ASCEND_TOOLKIT_VARS: "tuple[str, ...]" = startup.ASCEND_TOOLKIT_VARS

#: HCCL's bound on one collective's execution, in seconds (CANN's, not ours; Atlas A2's default 1836):
#: a rank whose peer never takes part fails after it.  The simulated HCCL honours it where a real
#: communicator has no process-group timeout (vllm-ascend's ``PyHcclCommunicator``).
HCCL_EXEC_TIMEOUT = "HCCL_EXEC_TIMEOUT"
HCCL_EXEC_TIMEOUT_DEFAULT_S = 1836

#: torch_npu's caching-allocator settings (``key:value`` pairs separated by commas; torch_npu's, not
#: ours): ``expandable_segments:True`` with ``max_split_size_mb`` or ``garbage_collection_threshold`` is
#: refused when the allocator reads them.  Checked by ``doctor``.
PYTORCH_NPU_ALLOC_CONF = "PYTORCH_NPU_ALLOC_CONF"

#: The HCCL library vllm-ascend's ``PyHcclCommunicator`` loads (vllm-ascend's, not ours): a path, else
#: ``libhccl.so`` found on the library path CANN's ``set_env.sh`` sets.  Checked by ``doctor``.
HCCL_SO_PATH = "HCCL_SO_PATH"
HCCL_LIBRARY_DEFAULT = "libhccl.so"

#: ``1`` runs Triton kernels in Triton's interpreter (Triton's, not ours).  The simulated host sets it, as it
#: has no NPU compiler: triton-ascend's kernels then run on the host (see ``npu_compat.testing``).
TRITON_INTERPRET = "TRITON_INTERPRET"
#: Ray's pattern of log lines its drivers print without deduplicating them: the simulated host adds its own
#: lines' (Ray folds lines of two workers that differ only in numbers into one, ``[repeated Nx]``, and a
#: driver that exits before the fold is printed drops them: each TP rank's ``served`` line on vLLM's Ray
#: executor)
RAY_DEDUP_ALLOW = "RAY_DEDUP_LOGS_ALLOW_REGEX"
#: ... and the simulated host's lines, which every worker prints with its own numbers
SIMULATION_LINES = r"simulated (?:Ascend|weight sync|HCCL)"

# HCCL's sockets (CANN's, not ours), checked by ``doctor``.
#: How long an HCCL communicator waits for its peers' sockets while it is built, in seconds (CANN's default
#: 120, valid 120-7200): a peer that joins later fails with EI0006.
HCCL_CONNECT_TIMEOUT = "HCCL_CONNECT_TIMEOUT"
HCCL_CONNECT_TIMEOUT_DEFAULT_S = 120
HCCL_CONNECT_TIMEOUT_RANGE_S = (120, 7200)
#: The host and device NIC ports HCCL's sockets bind (``auto``: the OS picks free ones), and the base port
#: of the older scheme; unset, two processes that build HCCL communicators on one NPU or host bind the same
#: default ports and the second fails to bind (EJ0003).
HCCL_HOST_SOCKET_PORT_RANGE = "HCCL_HOST_SOCKET_PORT_RANGE"
HCCL_NPU_SOCKET_PORT_RANGE = "HCCL_NPU_SOCKET_PORT_RANGE"
HCCL_IF_BASE_PORT = "HCCL_IF_BASE_PORT"
#: The host address HCCL's root rank listens on (CANN's); the simulated HCCL's root uses it, else loopback.
HCCL_IF_IP = "HCCL_IF_IP"

# Ray's (not ours), checked by ``doctor``.
#: Set, Ray leaves ``ASCEND_RT_VISIBLE_DEVICES`` as it found it instead of narrowing it to each actor's NPUs.
RAY_NOSET_ASCEND_VISIBLE = "RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES"

# Read by ``doctor`` (not ours).
#: ``0`` stops ``import torch`` from loading torch_npu through its ``torch.backends`` entry point.
TORCH_AUTOLOAD = "TORCH_DEVICE_BACKEND_AUTOLOAD"
#: vLLM's allow-list of plugins; when set, it must name ``npu_compat`` for the vLLM seam to load.
VLLM_PLUGINS = "VLLM_PLUGINS"

# vllm-ascend's (not ours): set for Trinity's vLLM rollout by the patch ``trinity.vllm_model.weights_not_nz``.
#: Weight FRACTAL_NZ format: vllm-ascend's default ``1`` makes its ``NPUWorker`` refuse RL weight updates
#: (``start_weight_update``; ``wake_up``) until it is ``0``.  A value the user set is left alone.
VLLM_ASCEND_ENABLE_NZ = "VLLM_ASCEND_ENABLE_NZ"

# vLLM's (not ours): set to ``0`` by default by the simulated Ascend in a process that runs the real
# vllm-ascend 0.18.0 (``npu_compat.testing._vllm_ascend_release.torch_defaults``).
#: vLLM's ahead-of-time compilation, on by default from torch 2.10.
VLLM_USE_AOT_COMPILE = "VLLM_USE_AOT_COMPILE"

# torch's (not ours): set to ``0`` by default by the simulated Ascend in a process that runs the real
# vllm-ascend, whose pinned torch (2.9.0, 2.10.0) has no custom-operator aliasing check in AOTAutograd.
#: Whether AOTAutograd's custom-operator aliasing check raises (default: whether ``CI`` is set) or warns.
TORCHINDUCTOR_ERROR_ON_CUSTOM_OP_ALIASING = "TORCHINDUCTOR_ERROR_ON_CUSTOM_OP_ALIASING"

# torch's (not ours): set to ``0`` by default by the simulated Ascend in a process that runs the real
# vllm-ascend 0.23.0.post1, whose pinned torch 2.10.0 uses AOTAutograd's cache for Inductor's compiler only.
#: AOTAutograd's local cache (default on).
TORCHINDUCTOR_AUTOGRAD_CACHE = "TORCHINDUCTOR_AUTOGRAD_CACHE"

# Ray's token authentication (not ours): read by ``doctor``, and set by the simulated Ascend's
# NPU-only Ray cluster for itself and every client it serves.
#: ``token``, ``disabled`` (or ``k8s``).  Unset, ``ray start --head`` turns token authentication
#: on as soon as a token is found, while ``ray status`` and ``ray.init(address=...)`` stay disabled.
RAY_AUTH_MODE = "RAY_AUTH_MODE"
#: The token itself; wins over the two token files below.
RAY_AUTH_TOKEN = "RAY_AUTH_TOKEN"
#: A file holding the token; wins over Ray's default file ``~/.ray/auth_token``.
RAY_AUTH_TOKEN_PATH = "RAY_AUTH_TOKEN_PATH"
#: The cluster a ``ray.init()`` without an address connects to; the simulated Ascend's cluster sets it
#: for its own processes (its temp dir is private, so Ray's ``ray_current_cluster`` file is not found).
RAY_ADDRESS = "RAY_ADDRESS"

#: The device variables a per-process report may contain, besides ``NPU_COMPAT*``
#: (no other environment value is ever written to a report).
DEVICE_VARS = (
    TRINITY_DEVICE,
    ASCEND_VISIBLE_DEVICES,
    *ASCEND_TOOLKIT_VARS,
    TORCH_AUTOLOAD,
    "CUDA_VISIBLE_DEVICES",
)

TRUE_VALUES: "frozenset[str]" = startup.TRUE_VALUES
FALSE_VALUES: "frozenset[str]" = startup.FALSE_VALUES


def is_true(value: "str | None") -> bool:
    return value is not None and value.strip().lower() in TRUE_VALUES


def is_false(value: "str | None") -> bool:
    answer: bool = startup.is_false(value)  # the pre-check's own reading of an off switch
    return answer


_SIZE_UNITS = {
    **dict.fromkeys(("", "b"), 1),
    **dict.fromkeys(("k", "kib"), 1 << 10),
    **dict.fromkeys(("m", "mib"), 1 << 20),
    **dict.fromkeys(("g", "gib"), 1 << 30),
}
#: What ``NPU_COMPAT_SIMULATE_NPU_MEMORY`` and ``NPU_COMPAT_SIMULATE_DEVICES`` take, for their errors.
SIZE_HINT = "give bytes, or a number with KiB, MiB or GiB"
COUNT_HINT = "give the number of simulated NPUs, a whole number of at least 1"


def parse_size(raw: str) -> "int | None":
    """Bytes from ``raw``: a number, optionally with ``KiB``/``MiB``/``GiB`` (or ``K``/``M``/``G``,
    ``B``); ``None`` when it is not one."""
    import re

    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([a-zA-Z]*)", raw.strip())
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _SIZE_UNITS:
        return None
    return int(float(match.group(1)) * _SIZE_UNITS[unit])


def parse_count(raw: str) -> "int | None":
    """A whole number of at least 1 from ``raw``; ``None`` when it is not one."""
    text = raw.strip()
    return int(text) if text.isdigit() and int(text) >= 1 else None


#: Our variables whose value is on or off, and what a value that is neither is taken as.
_FLAGS = {ENABLE: "on", STRICT: "off", SIMULATE: "off", SIMULATE_VLLM_PLATFORM: "on", AUTO: "on"}
#: Our variables whose value is free text (paths, patch ids: checked where they are used).
_FREE = frozenset({DISABLE, REPORT_DIR, SIMULATE_BUILD_DIR, RAY_SETUP_HOOK})


def value_problems(environ: "Mapping[str, str]") -> "list[str]":
    """What is wrong with the ``NPU_COMPAT*`` variables of ``environ``, one sentence each: a value
    the variable does not take (and what it is taken as instead), or a name npu-compat does not
    read (with the nearest one it does).  Empty when all is well; cheap, imports nothing.
    (``NPU_COMPAT_DEVICE`` is not among them: a wrong one stops the device decision itself.)"""
    problems: list[str] = []
    known = {*_FLAGS, *_FREE, DEVICE, SIMULATE_DEVICES, SIMULATE_NPU_MEMORY}
    for name, value in environ.items():
        if not name.startswith(PREFIX):
            continue
        if name in _FLAGS:
            if value.strip() and not (is_true(value) or is_false(value)):
                problems.append(
                    f"{name}={value!r} is neither on (1, true, yes, on) nor off (0, false, no, off): "
                    f"taken as {_FLAGS[name]}"
                )
        elif name == SIMULATE_DEVICES:
            if parse_count(value) is None:
                problems.append(f"{name}={value!r}: {COUNT_HINT}")
        elif name == SIMULATE_NPU_MEMORY:
            if value.strip() and parse_size(value) is None:
                problems.append(f"{name}={value!r}: {SIZE_HINT}")
        elif name in RETIRED:
            problems.append(f"{name} is no longer read: it has no effect ({RETIRED[name]})")
        elif name not in known:
            import difflib

            near = difflib.get_close_matches(name, sorted(known), n=1)
            hint = f"; did you mean {near[0]}?" if near else ""
            problems.append(f"{name} is not a variable npu-compat reads: it has no effect{hint}")
    return problems


VALID_DEVICES = ("npu", "cuda", "cpu", "auto")


class Decision:
    """The outcome of :func:`decide`: a device, where it came from, and the evidence seen."""

    __slots__ = ("device", "source", "evidence")

    def __init__(self, device: str, source: str, evidence: "tuple[str, ...]" = ()) -> None:
        self.device = device
        self.source = source
        self.evidence = evidence

    @property
    def is_npu(self) -> bool:
        return self.device == "npu"

    def as_dict(self) -> "dict[str, object]":
        return {"device": self.device, "source": self.source, "evidence": list(self.evidence)}

    def __repr__(self) -> str:
        return f"Decision(device={self.device!r}, source={self.source!r}, evidence={self.evidence!r})"


def _normalise(value: str, source: str) -> str:
    device = value.strip().lower()
    if device not in VALID_DEVICES:
        from ._errors import ConfigError

        raise ConfigError(
            f"{source}={value!r} is not a device npu-compat knows; use one of {', '.join(VALID_DEVICES)}"
        )
    return device


def ascend_evidence(environ: "Mapping[str, str] | None" = None) -> "tuple[str, ...]":
    """Every sign of an Ascend host, in words; empty on CUDA and plain CPU hosts."""
    evidence: tuple[str, ...] = startup.evidence(os.environ if environ is None else environ)
    return evidence


#: The decision of the last ``activate()`` in this process (``None`` before any).
LAST: "Decision | None" = None


def decide(device: str | None = None, environ: "Mapping[str, str] | None" = None) -> "Decision":
    """Decide which device this process is for.  Raises :class:`ConfigError` on a bad value."""
    env = os.environ if environ is None else environ
    if is_false(env.get(ENABLE)):
        return Decision("off", f"{ENABLE}={env[ENABLE]}")
    if device is not None:
        chosen = _normalise(device, "device")
        if chosen != "auto":
            return Decision(chosen, "activate(device=...)")
    found = startup.override(env)
    if found is not None:
        name, raw = found
        return Decision(_normalise(raw, name), f"{name}={raw}")
    evidence = ascend_evidence(env)
    if evidence:
        return Decision("npu", "auto", evidence)
    return Decision("cpu", "auto (no Ascend evidence)")
