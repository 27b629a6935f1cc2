"""Command line: ``python -m npu_compat report [--json] [--device D]``.

``report`` activates npu-compat in this interpreter and prints the device decision,
its evidence and every patch with its status and reason.
"""

from __future__ import annotations

import argparse
import json
import sys

from . import activate, report
from ._errors import ConfigError


def _print_report(as_json: bool) -> None:
    rep = report()
    if as_json:
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m npu_compat", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    rep = sub.add_parser("report", help="activate here and print the device decision and every patch")
    rep.add_argument("--json", action="store_true", help="machine-readable output")
    rep.add_argument("--device", choices=["npu", "cuda", "cpu", "auto"], default=None)
    args = parser.parse_args(argv)
    try:
        activate(args.device)
    except ConfigError as exc:
        print(f"npu_compat: {exc}", file=sys.stderr)
        return 2
    _print_report(args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
