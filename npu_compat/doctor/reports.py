"""A run's per-process reports, as ``doctor --reports DIR`` reads them: each process's report file
(:mod:`npu_compat._reportfile`) read, what would have broken the run found in them (a failed patch,
processes that decided differently), and the processes and a patch x process table rendered as text.

The timeline and the floor of the same reports are tools (:mod:`npu_compat.tools.timeline`,
:mod:`npu_compat.tools.floor`).
"""

from __future__ import annotations

import json
import os

from .. import _env
from .findings import Diagnosis


def read_reports(directory: str) -> list[dict[str, object]]:
    reports = []
    for name in sorted(os.listdir(directory)):
        if not name.endswith(".json") or name.startswith("."):
            continue
        try:
            with open(os.path.join(directory, name), encoding="utf-8") as f:
                data = json.load(f)
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and "pid" in data:
            reports.append(data)
    reports.sort(key=lambda r: (str(r.get("host")), float(r.get("updated") or 0), int(r.get("pid") or 0)))
    return reports


def check_reports(d: Diagnosis, directory: str) -> None:
    if not os.path.isdir(directory):
        d.add("error", f"--reports {directory}: no such directory")
        return
    reports = read_reports(directory)
    d.sections["reports"] = reports
    if not reports:
        d.add("warning", f"no report files in {directory} (was {_env.REPORT_DIR} set for the run?)")
        return
    devices = {str((r.get("decision") or {}).get("device")) for r in reports}  # type: ignore[attr-defined]
    if "npu" in devices and len(devices) > 1:
        others = sorted(devices - {"npu"})
        d.add(
            "warning",
            f"processes of this run decided differently ({', '.join(sorted(devices))}): the ones that "
            f"decided {', '.join(others)} ran unpatched (see each report's decision.evidence)",
        )
    for r in reports:
        for p in r.get("patches") or []:  # type: ignore[attr-defined]
            if p.get("status") == "failed":
                d.add(
                    "error",
                    f"pid {r.get('pid')} ({r.get('role')}): patch {p.get('id')} failed: {p.get('reason')}",
                )


_MARK = {"applied": "A", "failed": "F", "skipped": "s", "pending": "."}


def render_reports(reports: list[dict[str, object]]) -> list[str]:
    """The processes of a run, then a patch x process table (A applied, F failed, s skipped, . pending)."""
    if not reports:
        return ["reports: none"]
    lines = [f"processes ({len(reports)} reports):"]
    lines.append(f"  {'#':>3}  {'host':12s} {'pid':>7}  {'device':6s} {'activated by':15s} role / program")
    for i, r in enumerate(reports, 1):
        ray = r.get("ray") or {}
        actor = ray.get("actor_name") or ray.get("actor_class")  # type: ignore[attr-defined]
        role = str(r.get("role")) + (f" {actor}" if actor else "")
        device = (r.get("decision") or {}).get("device")  # type: ignore[attr-defined]
        lines.append(
            f"  {i:>3}  {str(r.get('host'))[:12]:12s} {r.get('pid')!s:>7}  {device!s:6s} "
            f"{r.get('activated_by')!s:15s} {role} / {r.get('program')}"
        )
    ids: list[str] = []
    for r in reports:
        for p in r.get("patches") or []:  # type: ignore[attr-defined]
            if p["id"] not in ids:
                ids.append(p["id"])
    width = max((len(i) for i in ids), default=5)
    lines += ["", "patches x processes (A applied, F failed, s skipped, . pending, blank unknown):"]
    lines.append(f"  {'':{width}s}  " + " ".join(f"{i % 100:>2}" for i in range(1, len(reports) + 1)))
    for pid in ids:
        cells = []
        for r in reports:
            status = next((p["status"] for p in r.get("patches") or [] if p["id"] == pid), None)  # type: ignore[attr-defined]
            cells.append(f"{_MARK.get(str(status), ' '):>2}")
        lines.append(f"  {pid:{width}s}  " + " ".join(cells))
    return lines
