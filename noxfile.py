"""Test sessions: the engine alone, and one session per pinned upstream stack.

``python -m nox`` runs them all (the README's test command and CI's).  Each stack is a
full pin list in ``npu_compat/stacks/`` installed with ``--no-deps`` on the CPU build of torch,
because the published metadata of trinity-rft, verl and vLLM cannot be resolved
together (see ``npu_compat/stacks/README.md``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import nox

ROOT = Path(__file__).parent
STACKS = {
    "a": "a-trinity-0.6.0_verl-0.8.0.txt",
    "b": "b-trinity-0.6.0_verl-0.7.1.txt",
    "c": "c-trinity-0.5.2_verl-0.7.1.txt",
}
#: Stacks whose sessions run on request only (``nox -s stack-d``), outside CI's time: the newest
#: releases Trinity 0.6.0 admits, which cannot run together on any device (docs/drift.md).
STACKS_ON_REQUEST = {"d": "unsupported/d-trinity-0.6.0_verl-0.9.1.txt"}
#: What an unsupported stack's session runs: what shows why it is unsupported, and the catalogue's
#: rows (npu-compat's patches, which still hold there); not the suite that assumes a working pair.
ON_REQUEST_TESTS = [
    "tests/upstream/test_trinity_verl_pair.py",
    "tests/seams/test_check.py",
    "tests/catalogue",
]
PYTHONS = ["3.10", "3.11", "3.12"]

nox.options.default_venv_backend = "uv|virtualenv"
# A Python that is not on this machine is skipped, never downloaded.
nox.options.error_on_missing_interpreters = False
os.environ.setdefault("UV_PYTHON_DOWNLOADS", "never")
nox.options.reuse_existing_virtualenvs = True
nox.options.sessions = ["lint", "engine", *(f"stack-{name}" for name in STACKS)]


def _find_links() -> list[str]:
    """Where this machine keeps local wheels (the CPU build of torch), as pip is configured.

    uv does not read pip's configuration, so the setting is passed on explicitly.
    """
    links = os.environ.get("PIP_FIND_LINKS", "").split()
    if not links and shutil.which("pip"):
        out = subprocess.run(
            ["pip", "config", "get", "global.find-links"], capture_output=True, text=True, check=False
        )
        links = out.stdout.split() if out.returncode == 0 else []
    return [arg for link in links for arg in ("--find-links", link)]


@nox.session(python="3.11")
def lint(session: nox.Session) -> None:
    """ruff and mypy (strict) on the package."""
    session.install("ruff==0.17.6", "mypy==2.4.1", "wrapt>=2.4,<3", "packaging", "pytest>=8")
    paths = ["npu_compat", "tests", "bench", "examples", "tools", "noxfile.py"]
    paths += ["_npu_compat_precheck.py", "sitecustomize.py", "setup.py"]  # the pre-check at the wheel's root
    session.run("ruff", "check", *paths)
    session.run("ruff", "format", "--check", *paths)
    session.run("mypy")
    session.run("mypy", "tools")


def _expose_pyenv_pythons() -> None:
    """Put every pyenv-installed CPython on PATH, so that 3.10 and 3.12 are found beside 3.11."""
    if not shutil.which("pyenv"):
        return
    out = subprocess.run(["pyenv", "versions", "--bare"], capture_output=True, text=True, check=False)
    for version in out.stdout.split():
        if version.rsplit(".", 1)[0] in PYTHONS:
            prefix = subprocess.run(["pyenv", "prefix", version], capture_output=True, text=True, check=False)
            if prefix.returncode == 0 and prefix.stdout.strip():
                os.environ["PATH"] = f"{prefix.stdout.strip()}/bin{os.pathsep}{os.environ['PATH']}"


_expose_pyenv_pythons()


@nox.session(python=PYTHONS)
def engine(session: nox.Session) -> None:
    """The engine's own tests and the stdlib-only seam tests, with no upstream package installed."""
    session.install(".", "pytest>=8")
    session.run(
        "pytest",
        "tests/engine",
        "tests/seams",
        "tests/patches/test_rewrites.py",
        "tests/field",
        "tests/catalogue/test_page.py",
        *session.posargs,
    )


def _install_stack(session: nox.Session, pins: str) -> None:
    """The pinned stack ``npu_compat/stacks/<pins>`` and npu-compat itself, both with ``--no-deps``.

    Plus ninja: the simulated NPU's C++ backend is compiled with it (and the host's C++
    compiler) on first use; without either the simulation stops at its compute boundary.
    """
    # unsafe-best-match lets the local +cpu torch wheel win over the index's CUDA build (uv only)
    strategy = ["--index-strategy", "unsafe-best-match"] if session.venv_backend == "uv" else []
    session.install("--no-deps", "-r", f"npu_compat/stacks/{pins}", *_find_links(), *strategy)
    session.install("ninja==1.13.2")
    session.install("--no-deps", ".")
    # The real vllm-ascend's Python, which the simulated host runs: what it imports beyond the
    # stack, and the release paired with the stack's vLLM, laid out from the registry (pinned by SHA-256).
    session.install("--no-deps", "-r", "npu_compat/stacks/ascend-host/vllm-ascend.txt")
    session.run_install("python", "-c", TORCHVISION_WITHOUT_ITS_OPERATORS)
    session.run_install("python", "-m", "npu_compat.testing", "vllm-ascend")


#: torchvision's x86_64 wheels on the registry are CUDA builds: on the CPU build of torch its operator
#: library does not load, and torchvision 0.28 then fails at import, registering fake kernels for two
#: operators the library would have defined.  This defines their schemas (no kernel: calling them raises)
#: in the environment's copy, once, so that its Python imports -- transformers' image processors import it,
#: and vllm-ascend imports those.  A host with a CPU build of torchvision does not need it.
TORCHVISION_WITHOUT_ITS_OPERATORS = """
import importlib.util, pathlib
path = pathlib.Path(importlib.util.find_spec("torchvision").origin).with_name("extension.py")
marker = "# npu-compat's test stacks: torchvision's operator library did not load"
lines = [
    marker,
    "if not _has_ops():",
    "    for _name in ('nms', 'qnms'):",
    "        schema = '(Tensor dets, Tensor scores, float iou_threshold) -> Tensor'",
    "        torch.library.define(f'torchvision::{_name}', schema)",
]
text = path.read_text()
if marker not in text:
    path.write_text(text + chr(10) * 2 + chr(10).join(lines) + chr(10))
import torchvision.transforms.v2.functional
"""


#: What each stack runs, to keep CI within its time.  ``beyond_ci`` cells (long end-to-end runs whose
#: checks the CI cells cover too) run on request only.  Stack-a runs every other test; the others skip
#: the tests whose outcome cannot differ from stack-a's, judged from their pins and the test's markers:
#: * ``same_on_every_stack``: torch and Ray alone (the simulated npu backend, hccl, the Ray cluster's
#:   authentication) -- run where a stack pins either differently from stack-a;
#: * ``uses_verl``: verl (Trinity's trainer side) -- a stack that differs from stack-a in verl alone
#:   (stack-b) runs only these.  Everything else imports no verl, so it is stack-a's test again there.
SHARED_PINS = frozenset({"torch", "ray"})
VERL = "verl"


def _pin_versions(pins: str) -> dict[str, str]:
    out = {}
    for line in (ROOT / "npu_compat" / "stacks" / pins).read_text().splitlines():
        if "==" in line and not line.lstrip().startswith("#"):
            name, version = line.split("==", 1)
            out[name.strip().lower()] = version.strip()
    return out


def _differs_from_a(name: str) -> frozenset[str]:
    """The distributions stack ``name`` pins differently from stack-a (or only one of them pins)."""
    mine, a = _pin_versions({**STACKS, **STACKS_ON_REQUEST}[name]), _pin_versions(STACKS["a"])
    return frozenset(d for d in mine.keys() | a.keys() if mine.get(d) != a.get(d))


def _marks(name: str) -> list[str]:
    """``-m`` for stack ``name``'s pytest run; a ``-m`` among the session's arguments wins (pytest
    keeps the last), e.g. ``nox -s stack-a -- -m beyond_ci`` for the cells CI leaves out."""
    terms = ["not beyond_ci"]
    if name != "a":
        differs = _differs_from_a(name)
        if not differs & SHARED_PINS:
            terms.append("not same_on_every_stack")
        if differs <= {VERL}:
            terms.append("uses_verl")
    return ["-m", " and ".join(terms)]


#: CI's machine has two cores.  A test that runs a cluster of many processes (``many_processes``: the
#: e2e runs, the catalogue's probe runs, the simulation's vLLM engines) keeps both busy and runs alone;
#: every other test is one or two processes, and two at a time of those (pytest-xdist, a file per
#: worker so that a module's fixtures are built once) use the second core.
WORKERS = min(2, os.cpu_count() or 1)

#: pytest's exit status when a selection holds no test.
NO_TESTS_COLLECTED = 5


def _phases(marks: list[str]) -> tuple[list[str], list[str]]:
    """The pytest runs of a stack session: its ``many_processes`` tests one at a time, then the rest
    ``WORKERS`` at a time."""
    (flag, expr) = marks
    alone = [flag, f"{expr} and many_processes"]
    rest = [flag, f"{expr} and not many_processes"]
    if WORKERS > 1:
        rest += ["-n", str(WORKERS), "--dist", "loadfile"]
    return (alone, rest)


def _stack_session(name: str, pins: str) -> None:
    @nox.session(name=f"stack-{name}", python="3.11")
    def stack(session: nox.Session) -> None:
        _install_stack(session, pins)
        session.install("pytest-xdist==3.8.0")  # the second phase's workers (the demo needs none)
        if session.posargs:  # a selection of one's own: one plain run, in order
            session.run("pytest", "tests", *_marks(name), *session.posargs)
            return
        if name in STACKS_ON_REQUEST:
            session.run("pytest", *ON_REQUEST_TESTS, *_marks(name))
            return
        (alone, rest) = _phases(_marks(name))
        # A stack may have no many-process test (pytest's exit 5: none selected); it has other tests.
        session.run("pytest", "tests", *alone, success_codes=[0, NO_TESTS_COLLECTED])
        session.run("pytest", "tests", *rest)

    stack.__doc__ = f"Every test against the real upstream stack {Path(pins).stem}."


for _name, _pins in {**STACKS, **STACKS_ON_REQUEST}.items():
    _stack_session(_name, _pins)


@nox.session(python="3.11")
def demo(session: nox.Session) -> None:
    """The main job: the real `trinity run` of stack (a) on a simulated Ascend, stock and with npu-compat.

    ``examples/e2e/demo.py`` (arguments after ``--`` go to it): progress with elapsed seconds, the two
    runs side by side, the npu-compat run's per-process patch table.  A few minutes after the install.
    """
    started = time.time()
    session.log(f"[    0 s] installing stack (a) ({STACKS['a']}) and npu-compat, as the stack-a session")
    _install_stack(session, STACKS["a"])
    # On Ctrl-C the demo stops its `trinity run` and Ray cluster: give it time (nox's default: 0.3 s)
    session.run(
        "python", "examples/e2e/demo.py", "--since", f"{started:.3f}", *session.posargs,
        interrupt_timeout=120, terminate_timeout=30,
    )  # fmt: skip


#: The release whose declared requirements bound the ``drift`` session's downloads, and the extras of
#: it that a Trinity run installs (its vLLM rollout).
TRINITY = ("trinity-rft", "0.6.0", ("vllm",))


@nox.session(python="3.11")
def drift(session: nox.Session) -> None:
    """The newest release of every distribution npu-compat patches that Trinity 0.6.0 admits, downloaded
    by name (``pip download --no-deps``, nothing installed) and read by ``python -m npu_compat check``.

    A distribution that Trinity's metadata does not constrain (torch: vLLM pins it) is taken at its
    newest.  ``-- --json`` passes on to ``check``; the exit status is ``check``'s (1: a patch in range
    is moved or broken)."""
    import email.parser
    import zipfile

    from packaging.requirements import Requirement

    session.install(".", "pip")
    where = Path(session.create_tmp()) / "drift"
    shutil.rmtree(where, ignore_errors=True)

    def download(requirement: str) -> Path:
        into = where / Requirement(requirement).name
        session.run("python", "-m", "pip", "download", "--no-deps", "-q", "-d", str(into), requirement)
        return next(into.iterdir())

    name, version, extras = TRINITY
    trinity = download(f"{name}=={version}")
    with zipfile.ZipFile(trinity) as wheel:
        meta = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
        requires = email.parser.Parser().parsestr(wheel.read(meta).decode()).get_all("Requires-Dist") or []
    declared: dict[str, str] = {}
    for text in requires:
        req = Requirement(text)
        if req.marker is None or any(req.marker.evaluate({"extra": e}) for e in ("", *extras)):
            declared[req.name.lower()] = str(req.specifier)
    listed = "from npu_compat._catalog import SPECS; print(*sorted({s.distribution for s in SPECS}))"
    targets = [d for d in str(session.run("python", "-c", listed, silent=True)).split() if d != name]
    artifacts = [trinity]
    for dist in targets:
        spec = declared.get(dist, "")
        session.log(f"{dist}{spec or ' (not constrained by ' + name + ' ' + version + ')'}: the newest")
        artifacts.append(download(f"{dist}{spec}"))
    session.run("python", "-m", "npu_compat", "check", *map(str, artifacts), *session.posargs)
