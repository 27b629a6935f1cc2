"""Interpreter start-up cost of npu-compat, measured side by side in one run.

Variants, run interleaved (round-robin, shuffled each round) so machine noise hits
them alike; the figure of merit is each variant's ratio of medians against its own floor
measured in the same run -- the same start with an empty stand-in where npu-compat would be
(``noop`` and ``npu-register`` against ``empty-package``, ``boot-*`` against ``boot-empty``,
``pth-*`` against ``pth-empty``).  Floors are printed against plain ``python -c pass``:

* ``noop``          -- ``import npu_compat; npu_compat.activate()`` on a host with no Ascend
                       evidence (explicit activation, the path every CUDA/CPU user takes)
* ``empty-package`` -- ``import empty_package``: a package with an empty ``__init__`` on
                       ``PYTHONPATH``, the floor under any ``import X; X.activate()``
* ``npu-register``  -- the same with ``NPU_COMPAT_DEVICE=npu``: every post-import hook
                       registered, no upstream target imported
* ``boot-noop``     -- a child of the launcher: ``python -c pass`` with the launcher's site
                       directory (``npu_compat/_launcher_site``) first on ``PYTHONPATH``, no
                       Ascend evidence
* ``boot-empty``    -- ``python -c pass`` with a directory holding an empty ``sitecustomize.py``
                       first on ``PYTHONPATH``: the floor under any launcher site directory
* ``boot-npu``      -- the same with ``NPU_COMPAT_DEVICE=npu`` (activation at interpreter start)
* ``launcher``      -- ``python -m npu_compat python -c pass``: the launcher, then its child
* with ``--installed`` (needs ``uv``): ``pth-noop`` / ``pth-npu`` -- ``python -c pass`` in a venv
  with npu-compat installed (``npu_compat.pth`` + ``sitecustomize``), against ``pth-plain``,
  the same interpreter in a venv without it; ``pth-empty``, a venv whose one ``.pth`` imports an
  empty module, is the floor under any ``.pth`` activation

With ``--before REF`` (a commit of this repository), every variant that runs npu-compat runs a
second time as ``NAME@before``, from that commit's tree (``git archive``), interleaved in the same
rounds and against the same floors: a change's cost, measured side by side.

Goals, against the floor: noop, boot-noop, pth-noop <= 1.03x; npu-register, boot-npu,
pth-npu <= 1.06x; launcher <= 2.5x of plain.  Run:
``python bench/startup.py [ROUNDS] [--installed] [--only NAME,NAME...] [--before REF]`` (``--help``); the
interpreter is a bare venv of the one running the script (``BENCH_PYTHON`` names another).  For
the Ray actor start-up, see ``bench/ray_actor.py``.
"""

from __future__ import annotations

import compileall
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ACTIVATE = "import npu_compat; npu_compat.activate()"
#: An empty directory made for the run: ``-c`` puts the working directory first on sys.path, and the
#: first import after start-up lists it -- in a crowded directory (the checkout, /tmp) that listing
#: alone is ~1 % of a start, charged to whichever variant imports something.
CWD = ""
PY = os.environ.get("BENCH_PYTHON", "")  # default: a bare venv made for the run (see _bare_python)

#: Each variant's floor: the same interpreter start with an empty stand-in for npu-compat.
FLOORS = {
    "empty-package": "plain",
    "boot-empty": "plain",
    "pth-empty": "pth-plain",
    "noop": "empty-package",
    "npu-register": "empty-package",
    "boot-noop": "boot-empty",
    "boot-npu": "boot-empty",
    "pth-noop": "pth-empty",
    "pth-npu": "pth-empty",
    "launcher": "plain",
}
#: The goal for each variant, as a ratio of medians against its floor.
GOALS = {
    "noop": 1.03,
    "boot-noop": 1.03,
    "pth-noop": 1.03,
    "npu-register": 1.06,
    "boot-npu": 1.06,
    "pth-npu": 1.06,
    "launcher": 2.5,
}
USAGE = """usage: python bench/startup.py [ROUNDS] [--installed] [--only NAME,NAME...] [--before REF]

  ROUNDS       interleaved rounds (default 200)
  --installed  also the installed variants (pth-*; needs uv)
  --only       run only these variants (their floors are added): {names}
  --before     also run each npu-compat variant from this commit's tree, as NAME@before
"""


def _env(pythonpath: list[str], **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NPU_COMPAT", "ASCEND_", "TRINITY_"))}
    env.pop("PYTHONPATH", None)
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join(pythonpath)
    env.update(extra)
    return env


def _bare_python(tmp: Path) -> str:
    """An interpreter whose start-up nothing else touches: a fresh venv without pip.

    The interpreter running this script may have npu-compat installed (its ``.pth`` would then
    run in "plain" too) or a base site-packages full of ``.pth`` files that inflate every start.
    """
    root = tmp / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    python = str(root / "bin" / "python")
    probe = subprocess.run(
        [python, "-c", "import npu_compat"], env=_env([]), cwd=str(tmp), capture_output=True
    )
    assert probe.returncode != 0, "the bare interpreter can import npu_compat; plain would not be plain"
    return python


def _package_only(tmp: Path, root: Path) -> str:
    """A directory holding only the package and the start-up module beside it (the checkout's root
    also holds the top-level sitecustomize)."""
    path = tmp / "pkg"
    path.mkdir()
    (path / "npu_compat").symlink_to(root / "npu_compat")
    (path / "_npu_compat_precheck.py").symlink_to(root / "_npu_compat_precheck.py")
    compileall.compile_file(str(path / "_npu_compat_precheck.py"), quiet=1)  # its bytecode, as installed
    return str(path)


def _tree_of(ref: str, tmp: Path) -> Path:
    """This repository's files at commit ``ref``, unpacked under ``tmp``, compiled as the checkout is."""
    root = tmp / "before-tree"
    root.mkdir()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", ref], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(root)], input=archive, check=True)
    _compile(root)
    return root


def _compile(root: Path) -> None:
    # Installed packages carry compiled bytecode; a checkout may not (PYTHONDONTWRITEBYTECODE).
    compileall.compile_dir(str(root / "npu_compat"), quiet=1)
    compileall.compile_file(str(root / "_npu_compat_precheck.py"), quiet=1)
    compileall.compile_file(str(root / "npu_compat" / "_launcher_site" / "sitecustomize.py"), quiet=1)


def _installed_venvs(tmp: Path, root: Path = REPO) -> tuple[str, str, str] | None:
    """Three venvs of PY: bare; with a ``.pth`` that imports an empty module (the floor of any
    ``.pth`` activation); with npu-compat installed."""
    uv = shutil.which("uv")
    if uv is None:
        print("--installed: uv is not on PATH; skipped")
        return None
    pythons = []
    for name in ("plain", "pth-empty", "installed"):
        venv = tmp / name
        subprocess.run([uv, "venv", "-q", "-p", PY, str(venv)], check=True)
        python = venv / "bin" / "python"
        if name == "installed":
            subprocess.run(
                [uv, "pip", "install", "-q", "--offline", "--python", str(python), str(root)], check=True
            )
        if name == "pth-empty":
            (site,) = (venv / "lib").glob("python*/site-packages")
            (site / "empty_module.py").write_text("")
            (site / "empty_module.pth").write_text("import empty_module\n")
        subprocess.run([str(python), "-m", "compileall", "-q", str(venv / "lib")], check=True)
        pythons.append(str(python))
    return pythons[0], pythons[1], pythons[2]


def _empty_sitecustomize(tmp: Path) -> str:
    path = tmp / "empty-sc"
    path.mkdir()
    (path / "sitecustomize.py").write_text("")
    compileall.compile_dir(str(path), quiet=1)
    return str(path)


def _empty_package(tmp: Path) -> str:
    path = tmp / "empty"
    (path / "empty_package").mkdir(parents=True)
    (path / "empty_package" / "__init__.py").write_text("")
    compileall.compile_dir(str(path), quiet=1)
    return str(path)


def variants(tmp: Path, installed: bool) -> dict[str, tuple[list[str], dict[str, str]]]:
    out = {
        "plain": ([PY, "-c", "pass"], _env([])),
        "empty-package": ([PY, "-c", "import empty_package"], _env([_empty_package(tmp)])),
        "boot-empty": ([PY, "-c", "pass"], _env([_empty_sitecustomize(tmp)])),
    }
    out.update(_ours(tmp, REPO))
    if installed:
        venvs = _installed_venvs(tmp)
        if venvs is not None:
            plain, empty_pth, with_pth = venvs
            out["pth-plain"] = ([plain, "-c", "pass"], _env([]))
            out["pth-empty"] = ([empty_pth, "-c", "pass"], _env([]))
            out["pth-noop"] = ([with_pth, "-c", "pass"], _env([]))
            out["pth-npu"] = ([with_pth, "-c", "pass"], _env([], NPU_COMPAT_DEVICE="npu"))
    return out


def _ours(tmp: Path, root: Path, installed: bool = False) -> dict[str, tuple[list[str], dict[str, str]]]:
    """The variants that run npu-compat from the tree at ``root``."""
    tmp.mkdir(exist_ok=True)
    pkg = _package_only(tmp, root)
    site = str(root / "npu_compat" / "_launcher_site")
    out = {
        "noop": ([PY, "-c", ACTIVATE], _env([pkg])),
        "npu-register": ([PY, "-c", ACTIVATE], _env([pkg], NPU_COMPAT_DEVICE="npu")),
        "boot-noop": ([PY, "-c", "pass"], _env([site])),
        "boot-npu": ([PY, "-c", "pass"], _env([site], NPU_COMPAT_DEVICE="npu")),
        "launcher": ([PY, "-m", "npu_compat", PY, "-c", "pass"], _env([pkg])),
    }
    if installed:
        venvs = _installed_venvs(tmp, root)
        if venvs is not None:
            with_pth = venvs[2]
            out["pth-noop"] = ([with_pth, "-c", "pass"], _env([]))
            out["pth-npu"] = ([with_pth, "-c", "pass"], _env([], NPU_COMPAT_DEVICE="npu"))
    return out


def _time_once(argv: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, env=env, check=True, cwd=CWD)  # main() makes CWD; unset, this fails loudly
    return time.perf_counter() - start


def measure(rounds: int, runs: dict[str, tuple[list[str], dict[str, str]]]) -> dict[str, list[float]]:
    _compile(REPO)
    samples: dict[str, list[float]] = {name: [] for name in runs}
    for argv, env in runs.values():  # warm the page cache
        _time_once(argv, env)
    for _ in range(rounds):
        order = list(runs)
        random.shuffle(order)
        for name in order:
            argv, env = runs[name]
            samples[name].append(_time_once(argv, env))
    return samples


def _selected(only: str | None) -> set[str] | None:
    """The variants ``--only`` names, with the floors they are measured against (None: all)."""
    if only is None:
        return None
    wanted = {name.strip() for name in only.split(",") if name.strip()}
    unknown = wanted - set(FLOORS) - {"plain", "pth-plain"}
    if unknown:
        sys.exit(f"unknown variant(s) {', '.join(sorted(unknown))}; known: {', '.join(FLOORS)}")
    chosen = set(wanted)
    while True:
        more = {FLOORS[name] for name in chosen if name in FLOORS} - chosen
        if not more:
            return chosen
        chosen |= more


def _take(argv: list[str], option: str, what: str) -> str | None:
    """The value after ``option`` in ``argv`` (both removed from it), or None where it is absent."""
    if option not in argv:
        return None
    at = argv.index(option)
    if at + 1 >= len(argv):
        sys.exit(f"{option} needs {what}")
    value = argv[at + 1]
    del argv[at : at + 2]
    return value


def main() -> None:
    argv = sys.argv[1:]
    if "-h" in argv or "--help" in argv:
        print(USAGE.format(names=", ".join(FLOORS)), end="")
        return
    before = _take(argv, "--before", "a commit of this repository")
    only = _take(argv, "--only", "a list of variant names")
    args = [a for a in argv if not a.startswith("--")]
    rounds = int(args[0]) if args else 200
    chosen = _selected(only)
    installed = "--installed" in argv or any(name.startswith("pth-") for name in chosen or ())
    global PY, CWD
    with tempfile.TemporaryDirectory(prefix="nc-bench-") as tmp:
        CWD = str(Path(tmp) / "cwd")
        os.mkdir(CWD)
        PY = PY or _bare_python(Path(tmp))
        runs = variants(Path(tmp), installed)
        if before is not None:
            old = _ours(Path(tmp) / "before", _tree_of(before, Path(tmp)), installed)
            runs.update({f"{name}@before": run for name, run in old.items()})
        if chosen is not None:
            runs = {name: run for name, run in runs.items() if name.partition("@")[0] in chosen}
        samples = measure(rounds, runs)
    print(f"interpreter start-up, {rounds} interleaved rounds, median wall time per start ({PY})")
    for name, values in samples.items():
        floor = FLOORS.get(name.partition("@")[0])
        med = statistics.median(values)
        if floor is None or floor not in samples:
            print(f"  {name:13s} {med * 1e3:7.2f} ms")
            continue
        base = statistics.median(samples[floor])
        goal = GOALS.get(name.partition("@")[0])
        verdict = "" if goal is None else f"  goal <= {goal:.2f}x {'met' if med / base <= goal else 'MISSED'}"
        print(
            f"  {name:13s} {med * 1e3:7.2f} ms   ratio {med / base:5.3f} vs {floor:13s}"
            f" (+{(med - base) * 1e3:5.2f} ms){verdict}"
        )


if __name__ == "__main__":
    main()
