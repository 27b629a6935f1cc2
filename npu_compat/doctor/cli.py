"""The ``doctor`` command: :func:`diagnose` runs every check in order, :func:`main` is the command line,

    python -m npu_compat doctor [--json] [--reports DIR [--timeline [--svg FILE]] [--floor [--until EPOCH]]]

and :func:`floor_lines` replays a run's start-up floor for ``--floor``.

The exit status is 1 where a finding is an ``error`` (it would break a run), 0 otherwise, and 2 for a bad
command line.  ``--timeline`` and ``--floor`` read the reports with the tools
:mod:`npu_compat.tools.timeline` and :mod:`npu_compat.tools.floor`, imported only then.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from .. import _env
from .._version import __version__
from .checks import (
    check_activation,
    check_ascend,
    check_decision,
    check_seams,
    check_simulated_memory,
    check_variables,
)
from .findings import Diagnosis
from .plan import check_contracts, check_plans, check_targets
from .ray_auth import check_ray_auth
from .render import render
from .reports import check_reports

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ..tools import timeline

OUT_OF_SCOPE = (
    "SGLang, Megatron and `trinity perf` (NVML) are out of scope: npu-compat does not patch them, "
    "and a run that uses them on Ascend is not covered"
)


def diagnose(reports: str | None = None, environ: dict[str, str] | None = None) -> Diagnosis:
    """Every check of this environment (``environ``; default: ``os.environ``), and of a run's reports
    in the directory ``reports`` where given."""
    from .._catalog import SPECS

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
        from ..tools import timeline

        table = timeline.rows(d.sections.get("reports", []), args.reports)  # type: ignore[arg-type]
    if args.timeline:
        if not args.json:
            print("\n" + "\n".join(timeline.render_text(table)))
        if args.svg:
            with open(args.svg, "w", encoding="utf-8") as out_file:
                out_file.write(timeline.render_svg(table))
    if args.floor:
        floor_lines(table, args.reports, args.until)
    return 0 if d.ok else 1


def floor_lines(table: list[timeline.Row], directory: str, until: float | None) -> None:
    """Print the run's start-up against its floor (:mod:`npu_compat.tools.floor`), replayed here now,
    from the run's rows (:func:`npu_compat.tools.timeline.rows` of the reports in ``directory``)."""
    from ..tools import floor

    begin = floor.run_begin(table)
    if until is None:
        readies = [row.ready for row in table if row.ready is not None]
        until = max(readies) if readies else None
    if begin is None or until is None:
        print("\nfloor: no Ray driver in the reports, or nothing became ready")
        return
    steps = floor.plan(table, directory, begin, until)
    length = floor.replay(steps)
    print("\n" + "\n".join(floor.render(steps, begin, until, length)))
