"""The engine's stress harness: many rounds, each in a fresh interpreter under a timeout.

Two universes of targets:

* **synthetic** (``--synthetic``, any environment): six packages whose hooks cross -- each patch's
  wrapper module imports the next package, each condition looks up the package after that with
  ``importlib.util.find_spec`` (which imports it, as the catalogue's ``has_npu_worker`` imports
  vllm_ascend), two packages' ``__init__`` take a moment, and every kind of class attribute is a target, defined on the class or inherited.  What the hooks
  import runs one way, from a package to later ones, as the catalogue's does (Trinity's hooks import
  vllm_ascend, which never imports Trinity): a cycle of imports across threads meets Python's own
  ``_DeadlockError``, with or without npu-compat;
* **catalogue** (the default; a stack session with the simulated Ascend): the real catalogue and
  every module it patches or repoints a copy in, from the installed Trinity, verl, vLLM, Ray and
  torch.  torch, Ray and transformers are imported first (:data:`FIRST`); a module that fails to
  import in one thread too (the other Trinity layout's) is left out after the sequential round.

Each round runs ``stress_round.py`` with a seed and a mode (``plain``, ``cycle``: activate and
deactivate in a loop meanwhile, ``fork``: a fork at a random moment).  A round that does not
finish before the timeout is a hang.  ``python -m tests.engine.stress [--synthetic] [--rounds N]
[--seed S]`` prints one line per round (with the activation cycles and forks it ran) and a summary; the tests run a fixed number of rounds.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from tests.conftest import REPO, clean_env

ROUND = Path(__file__).with_name("stress_round.py")
MODES = ("plain", "cycle", "fork")
#: The real catalogue's modes: its imports from one thread (8 threads importing Trinity, verl, torch's
#: compiler and tensordict at once fail without npu-compat too: circular imports seen half done, and
#: CPython's _DeadlockError), while another activates and deactivates, and forks fall meanwhile.
CATALOGUE_MODES = ("cycle1", "fork")
PACKAGES = 6

#: A package's ``__init__`` takes a moment.  It does not import its own watched submodule: with
#: threads importing that submodule directly at the same time, CPython 3.11's import-lock deadlock
#: detection raises ``_DeadlockError`` in about one round in twelve without npu-compat at all (the
#: hooks crossing inside a package's ``__init__`` are tests/engine/test_concurrency.py's).
PACKAGE_INIT = """
import time
time.sleep({delay})
"""

TARGET_MODULE = """
LIMIT = 4

def f(x):
    return ("f", x)

class Base:
    def method(self, x):
        return ("method", x)

    @staticmethod
    def static(x):
        return ("static", x)

    @classmethod
    def klass(cls, x):
        return ("klass", cls.__name__, x)

    builtin = abs


class Sub(Base):
    pass
"""

USER_MODULE = "from {pkg}.mod import f\n"

WRAPPER_MODULE = """
import {other}  # the wrapper's module needs another watched package

def mark(wrapped, instance, args, kwargs):
    return ["w", wrapped(*args, **kwargs)]

def double(original):
    return original * 2

def condition():
    import importlib.util
    importlib.util.find_spec("{third}.mod")  # imports {third}, as has_npu_worker imports vllm_ascend
    return None
"""

SPECS_MODULE = """
from npu_compat import PatchSpec

SPECS = []
for i in range({n}):
    common = dict(distribution=f"stress{{i}}", versions=">=1", why="stress")
    pkg, wrappers = f"stress{{i}}", f"stresswrap{{i}}"
    SPECS += [
        PatchSpec(f"s{{i}}.f", f"{{pkg}}.mod:f", wrapper=f"{{wrappers}}:mark", copies=[f"{{pkg}}.user"],
                  condition=f"{{wrappers}}:condition", **common),
        PatchSpec(f"s{{i}}.method", f"{{pkg}}.mod:Base.method", wrapper=f"{{wrappers}}:mark", **common),
        PatchSpec(f"s{{i}}.static", f"{{pkg}}.mod:Sub.static", wrapper=f"{{wrappers}}:mark", **common),
        PatchSpec(f"s{{i}}.klass", f"{{pkg}}.mod:Sub.klass", wrapper=f"{{wrappers}}:mark", **common),
        PatchSpec(f"s{{i}}.builtin", f"{{pkg}}.mod:Base.builtin", wrapper=f"{{wrappers}}:mark", **common),
        PatchSpec(f"s{{i}}.limit", f"{{pkg}}.mod:LIMIT", replacement=f"{{wrappers}}:double", **common),
    ]
"""


def synthetic_universe(root: Path) -> dict[str, Any]:
    """Write the synthetic packages under ``root``; the round config's universe part."""
    root.mkdir(parents=True, exist_ok=True)
    modules = []
    for i in range(PACKAGES):
        pkg = root / f"stress{i}"
        pkg.mkdir(exist_ok=True)
        (pkg / "__init__.py").write_text(PACKAGE_INIT.format(delay=0.1 if i in (1, 4) else 0.01))
        (pkg / "mod.py").write_text(TARGET_MODULE)
        (pkg / "user.py").write_text(USER_MODULE.format(pkg=f"stress{i}"))
        (root / f"stresswrap{i}.py").write_text(
            WRAPPER_MODULE.format(
                other=f"stress{min(i + 1, PACKAGES - 1)}", third=f"stress{min(i + 2, PACKAGES - 1)}"
            )
        )
        info = root / f"stress{i}-1.0.0.dist-info"
        info.mkdir(exist_ok=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: stress{i}\nVersion: 1.0.0\n")
        modules += [f"stress{i}.mod", f"stress{i}.user"]
    (root / "stressspecs.py").write_text(SPECS_MODULE.format(n=PACKAGES))
    kinds = ("f", "method", "static", "klass", "builtin", "limit")
    expect = {f"s{i}.{kind}": "applied" for i in range(PACKAGES) for kind in kinds}
    return {"path": [str(root)], "modules": modules, "specs": "stressspecs:SPECS", "expect": expect}


#: Imported first, in the main thread, as by every program that uses them: their own imports are not
#: ones that can run from several threads at once, with or without npu-compat (ray: "partially
#: initialized module 'ray' has no attribute '_private'"; transformers' lazy module: "cannot import
#: name 'AutoConfig'").  npu-compat's hooks for ray's own modules fire here, in one thread.
FIRST = ["torch", "ray", "transformers"]


def catalogue_universe() -> dict[str, Any]:
    """The real catalogue's modules, those this stack has (found without importing anything)."""
    from importlib.machinery import PathFinder

    from npu_compat._catalog import SPECS

    def findable(name: str) -> bool:
        parts = name.split(".")
        spec = PathFinder.find_spec(parts[0])
        for i in range(1, len(parts)):
            if spec is None or not spec.submodule_search_locations:
                return False
            spec = PathFinder.find_spec(".".join(parts[: i + 1]), list(spec.submodule_search_locations))
        return spec is not None

    names = sorted({s.module for s in SPECS} | {m for s in SPECS for m, _ in s.copy_places()})
    return {"modules": [n for n in names if findable(n)], "first": FIRST, "ours_only": True}


def settled(universe: dict[str, Any], timeout: float) -> tuple[dict[str, Any], dict[str, str]]:
    """The sequential round: ``universe`` less the modules that fail to import even there, and the
    statuses that the other rounds must reach.  Raises AssertionError if it did not end cleanly."""
    baseline = run_round(universe, 0, "sequential", timeout=timeout, simulate=True)
    failing = {error.partition(":")[0] for error in baseline["errors"]}
    problems = failures({**baseline, "errors": []})
    assert not problems, f"the sequential round: {problems}"
    kept = {**universe, "modules": [m for m in universe["modules"] if m not in failing]}
    return kept, baseline["statuses"]


def round_env(universe: dict[str, Any], simulate: bool) -> dict[str, str]:
    env = clean_env({"NPU_COMPAT_DEVICE": "npu"})
    if simulate:
        from npu_compat.testing import simulation_env

        env = simulation_env(devices=2, environ=env)
    return env


def run_round(
    universe: dict[str, Any], seed: int, mode: str, *, timeout: float, simulate: bool,
    expect: dict[str, str] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """One round; a hang (the child outlived ``timeout``) is a result, not an exception."""
    config = {"expect": expect, **universe, "seed": seed, "mode": mode, "deadline": timeout * 0.6}
    try:
        proc = subprocess.run(
            [sys.executable, str(ROUND), json.dumps(config)], env=round_env(universe, simulate),
            capture_output=True, text=True, timeout=timeout, cwd=str(REPO),
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return {"seed": seed, "mode": mode, "hung": ["the whole interpreter"], "errors": []}
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {
            "seed": seed,
            "mode": mode,
            "hung": [],
            "errors": [f"exit {proc.returncode}: {proc.stderr[-2000:]}"],
        }
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def failures(result: dict[str, Any]) -> list[str]:
    """What went wrong in one round (empty: nothing)."""
    out = [f"hung: {name}" for name in result["hung"]]
    out += [f"import failed: {e}" for e in result["errors"]]
    out += result.get("problems", [])
    out += [f"warned: {w}" for w in result.get("warnings", [])]
    out += [f"not restored: {w}" for w in result.get("not_restored", [])]
    out += result.get("left_behind", [])
    for fork in result.get("forks", []):
        out += ["forked child hung"] if fork["hung"] else []
        out += [f"forked child: {p}" for p in fork["problems"]]
    return out


def seeds(base: int, rounds: int, modes: tuple[str, ...] = MODES) -> list[tuple[int, str]]:
    """``(seed, mode)`` for each round: the modes in turn, the seeds counting up from ``base``."""
    return [(base + i, modes[i % len(modes)]) for i in range(rounds)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--synthetic", action="store_true", help="the synthetic packages, not the catalogue")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=120.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        universe = synthetic_universe(Path(tmp)) if args.synthetic else catalogue_universe()
        simulate = not args.synthetic
        expect = None
        if not args.synthetic:
            universe, expect = settled(universe, args.timeout)
        bad = 0
        for seed, mode in seeds(args.seed, args.rounds, MODES if args.synthetic else CATALOGUE_MODES):
            result = run_round(universe, seed, mode, timeout=args.timeout, simulate=simulate, expect=expect)
            problems = failures(result)
            bad += bool(problems)
            print(json.dumps({"seed": seed, "mode": mode, "ok": not problems, "cycles": result.get("cycles"),
                              "forks": len(result.get("forks", [])), "problems": problems[:5]}), flush=True)  # fmt: skip
        print(f"{args.rounds - bad} passed, {bad} failed")


if __name__ == "__main__":
    main()
