"""Command line: the launcher, ``report``, ``doctor`` and ``check``.

    python -m npu_compat [--device D] [--strict] [--report-dir DIR] [--] COMMAND [ARGS...]
    python -m npu_compat report [--json] [--device D]
    python -m npu_compat doctor [--json] [--reports DIR]
    python -m npu_compat check [ARTIFACT ...] [--json]

(``npu-compat`` is the same as a console script.)  ``report`` activates npu-compat in
this interpreter and prints the device decision, its evidence and every patch with
its status and reason.  ``doctor`` checks this environment without importing any
patch target.  ``check`` reads a release (a wheel, an sdist, a source tree, or the
installed distributions) without installing it, and says which patches it keeps, moves
or breaks (:mod:`.doctor.check`).  Anything else is a command for the launcher (:mod:`._launcher`); a
command named ``report``, ``doctor`` or ``check`` goes after ``--``.
"""

import sys


def _print_report(as_json: bool) -> None:
    from . import report

    rep = report()
    if as_json:
        import json

        print(json.dumps(rep.to_dict(), indent=2))
        return
    decision = rep.decision
    print(f"device: {decision['device']}  ({decision['source']})")
    for item in decision["evidence"]:  # type: ignore[attr-defined]
        print(f"  evidence: {item}")
    if not rep:
        print("patches: none declared")
        return
    width = max(len(str(r["id"])) for r in rep)
    for rec in rep:
        line = f"  {rec['id']!s:{width}}  {rec['status']:8s}  {rec['target']}"
        print(line + (f"\n  {'':{width}}  {'':8s}  -> {rec['reason']}" if rec["reason"] else ""))


def report_main(argv: "list[str]") -> int:
    import argparse

    from . import activate
    from ._errors import ConfigError

    parser = argparse.ArgumentParser(
        prog="python -m npu_compat report",
        description="activate npu-compat here and print the device decision and every patch",
    )
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument("--device", choices=["npu", "cuda", "cpu", "auto"], default=None)
    args = parser.parse_args(argv)
    try:
        activate(args.device)
    except ConfigError as exc:
        print(f"npu_compat: {exc}", file=sys.stderr)
        return 2
    _print_report(args.json)
    return 0


def main(argv: "list[str] | None" = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    if args and args[0] == "report":
        return report_main(args[1:])
    if args and args[0] == "doctor":
        from .doctor import cli

        return cli.main(args[1:])
    if args and args[0] == "check":
        from .doctor import check

        return check.main(args[1:])
    from . import _launcher

    return _launcher.main(args)


if __name__ == "__main__":
    sys.exit(main())
