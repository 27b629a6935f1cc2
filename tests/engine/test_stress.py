"""The engine's stress harness in CI (``tests/engine/stress.py``; more rounds: ``python -m
tests.engine.stress``): imports from 8 threads in random orders, activation cycles meanwhile, forks
at random points of activation -- each round a fresh interpreter under a timeout.

The synthetic universe runs in the engine sessions, on every Python: 8 importing threads.  The real
catalogue's runs on the simulated Ascend in stack a's session (Trinity 0.6.0's targets): its imports from one
thread while activation cycles and forks run beside them (see ``stress.CATALOGUE_MODES`` for why not 8).
Every round's seed and mode is in the failure message.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from pathlib import Path

import pytest

from tests.conftest import beyond_ci_where
from tests.engine import stress

#: A stack is installed here (a stack session, not the engine's)
IN_A_STACK = importlib.util.find_spec("trinity") is not None

#: Rounds per run: the modes in turn (plain, cycle, fork), seeds counting up from 0.
SYNTHETIC_ROUNDS = 60
CATALOGUE_ROUNDS = 2  # each of stress.CATALOGUE_MODES once; more: python -m tests.engine.stress


def run(
    universe: dict[str, object], rounds: int, *, simulate: bool, timeout: float, expect: object,
    modes: tuple[str, ...] = stress.MODES,
) -> None:  # fmt: skip
    failed = {}
    for seed, mode in stress.seeds(0, rounds, modes):
        result = stress.run_round(universe, seed, mode, timeout=timeout, simulate=simulate, expect=expect)  # type: ignore[arg-type]
        problems = stress.failures(result)
        if problems:
            failed[f"seed {seed} ({mode})"] = problems[:5]
    assert not failed, failed


# the engine sessions run it on every Python; a stack session's run would be engine-3.11's again
@beyond_ci_where(IN_A_STACK)
def test_synthetic_rounds_never_hang_and_leave_nothing(tmp_path: Path) -> None:
    universe = stress.synthetic_universe(tmp_path / "site")
    run(universe, SYNTHETIC_ROUNDS, simulate=False, timeout=60, expect=universe["expect"])


@pytest.mark.skipif(
    not IN_A_STACK, reason="the real catalogue's targets: needs a stack (trinity-rft, verl, vLLM, Ray, torch)"
)
# CI runs it on Trinity 0.6.0's catalogue (stack a): the engine's threads, forks and cycles are the same
# for 0.5.2's targets, whose patches stack c's catalogue and whole runs apply
@beyond_ci_where(IN_A_STACK and importlib.metadata.version("trinity-rft").startswith("0.5."))
def test_the_real_catalogue_from_eight_threads_on_the_simulated_ascend() -> None:
    # what the same imports, one after another in one thread, leave: the rounds must leave the same
    universe, expect = stress.settled(stress.catalogue_universe(), timeout=300)
    run(universe, CATALOGUE_ROUNDS, simulate=True, timeout=300, expect=expect, modes=stress.CATALOGUE_MODES)
