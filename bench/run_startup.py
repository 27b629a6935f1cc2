"""The bundled whole run's start-up against its floor, measured side by side in one run of the bench.

Each round is one whole ``python -m npu_compat trinity run`` of the bundled config
(``examples/e2e/trinity_tiny.yaml``, through ``tests/e2e/scenario.py``, as the demo runs it), then
its floor, replayed right after it on the same machine (:mod:`npu_compat.tools.floor`): every process
the run started, each only importing what it had imported by the end of the start-up, in the
run's order and overlap.

* start-up: from the Ray driver's start (``trinity run``'s process) to the first log line of the
  weight sync's set-up (``Coordinating weight sync setup``), found by the scenario's log watch
  (read every ``POLL_S``, 2 s).
* floor: the replay's critical path.  The figure of merit is their ratio (goal: <= 1.5x); the
  median of the rounds is printed, and each round's.

Before the first round, one child imports Trinity's launcher, vLLM and verl once, so that the first
round does not pay a cold page cache that the later ones and the floors do not.  The simulated
cluster's start (``ray start``) is before the driver's start and not part of the start-up; its
length is printed too.  Run: ``python bench/run_startup.py [ROUNDS] [--svg DIR]`` in an environment
with stack (a) (``nox -s stack-a`` installs it; ``.nox/stack-a/bin/python bench/run_startup.py``).
With ``--svg DIR``, each round's timeline chart is written there (``round<i>.svg``); ``--keep DIR``
keeps each round's logs and reports, with its start-up's bounds (``round<i>/startup.json``), and
``--floors-of DIR`` measures the floors of such kept rounds again, without running them.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from npu_compat.doctor.reports import read_reports  # noqa: E402
from npu_compat.tools import floor as _floor  # noqa: E402
from npu_compat.tools import timeline as _timeline  # noqa: E402
from tests.e2e import scenario  # noqa: E402

#: Where the start-up ends: the stage whose first log line closes it.
END_STAGE = "weight_sync_setup_started"
GOAL = 1.5


def warm() -> None:
    """Import what the run's processes import once, unmeasured (the page cache)."""
    subprocess.run(
        [sys.executable, "-c", "import trinity.cli.launcher, vllm, verl, transformers"],
        env=_floor.child_env(),
        capture_output=True,
        check=False,
    )


def one_round(index: int, scratch: Path, model: Path | None, svg: Path | None) -> dict[str, object]:
    """Run round ``index`` (with ``model``) or, without, read the kept one; then measure its floor."""
    out = scratch / f"round{index}"
    t0 = time.time()
    bounds = out / "startup.json"
    if model is not None:
        summary = scenario.run("compat", out, timeout=900, model=model)
        stage_s = summary.get("stage_s") or {}
        assert isinstance(stage_s, dict)
        if summary.get("rc") != 0 or END_STAGE not in stage_s:
            rc = summary.get("rc")
            raise SystemExit(f"round {index}: the run did not reach {END_STAGE} (rc {rc}); see {out}")
        until = float(summary["started_at"]) + float(stage_s[END_STAGE])  # type: ignore[arg-type]
        bounds.write_text(json.dumps({"until": until}), encoding="utf-8")
    else:
        until = float(json.loads(bounds.read_text(encoding="utf-8"))["until"])
    reports_dir = str(out / "work" / "reports")
    reports = read_reports(reports_dir)
    table = _timeline.rows(reports, reports_dir)
    begin = _floor.run_begin(table)
    assert begin is not None, "no Ray driver in the reports"
    steps = _floor.plan(table, reports_dir, begin, until)
    floor = _floor.replay(steps)
    if svg is not None:
        svg.mkdir(parents=True, exist_ok=True)
        (svg / f"round{index}.svg").write_text(
            _timeline.render_svg(table, f"bundled run, round {index}"), encoding="utf-8"
        )
    first = min(row.start for row in table if row.start is not None)
    return {
        "startup": until - begin,
        "floor": floor,
        "cluster": begin - first,
        "wall": time.time() - t0,
        "lines": _floor.render(steps, begin, until, floor),
        "failed": sum(step.failed or 0 for step in steps),
        "modules": sum(len(step.modules) for step in steps),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("rounds", nargs="?", type=int, default=3)
    parser.add_argument("--svg", type=Path, help="write each round's timeline chart here")
    parser.add_argument("--keep", type=Path, help="keep each round's logs and reports here")
    parser.add_argument(
        "--floors-of", type=Path, help="measure the floors of the rounds kept in this directory"
    )
    args = parser.parse_args(argv)
    if args.floors_of is not None:
        args.keep = args.floors_of
    scratch = Path(tempfile.mkdtemp(prefix="npu-compat-bench-")) if args.keep is None else args.keep
    scratch.mkdir(parents=True, exist_ok=True)
    try:
        warm()
        model = None if args.floors_of is not None else scenario.make_model(scratch / "tiny-model")
        results = []
        for i in range(1, args.rounds + 1):
            r = one_round(i, scratch, model, args.svg)
            results.append(r)
            print(
                f"round {i}: start-up {r['startup']:.1f} s, floor {r['floor']:.1f} s, ratio "
                f"{r['startup'] / r['floor']:.2f}x (cluster start before it {r['cluster']:.1f} s; round "
                f"{r['wall']:.0f} s; floor imports {r['modules']}, {r['failed']} failed)",
                flush=True,
            )
            for line in r["lines"]:  # type: ignore[attr-defined]
                print(f"  {line}", flush=True)
        startup = statistics.median(float(r["startup"]) for r in results)  # type: ignore[arg-type]
        floor = statistics.median(float(r["floor"]) for r in results)  # type: ignore[arg-type]
        ratios = [float(r["startup"]) / float(r["floor"]) for r in results]  # type: ignore[arg-type]
        ratio = statistics.median(ratios)
        print(
            f"\nmedian of {len(results)}: start-up {startup:.1f} s, floor {floor:.1f} s, ratio {ratio:.2f}x "
            f"(rounds: {', '.join(f'{x:.2f}' for x in ratios)}); goal <= {GOAL}x: "
            f"{'met' if ratio <= GOAL else 'not met'}"
        )
    finally:
        if args.keep is None:
            shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
