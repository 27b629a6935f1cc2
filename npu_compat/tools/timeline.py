"""A run's timeline, read from its per-process reports: ``doctor --reports DIR --timeline [--svg FILE]``.

Each report (:mod:`npu_compat._reportfile`) carries the times of its process: when the process
started (the kernel's start time, from ``/proc``), when npu-compat activated in it, when it learned
its role (Ray driver, actor, vLLM process) and when its report last changed (the last patch
applied).  Its import log (``<host>-<pid>.imports.jsonl``) adds when its imports were done: the
last look of the report's watcher that found new modules, up to its role (a process that learns
no role: up to its last).  Here they become one row per process, ordered by start, as text and
as an SVG Gantt chart, in seconds from the first process's start.  A process's parent is shown
where it is in the run too, and the process it *follows*: the one that became ready (its role,
else its imports done) last before it started.  In a run where one process is started after
waiting for another (a Ray actor created once another is ready), that is the one it waited on.
It is read from the times alone; the logs say why.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from xml.sax.saxutils import escape

from .. import _reportfile


@dataclass(frozen=True)
class Row:
    """One process of the run."""

    host: str
    pid: int
    ppid: int
    role: str
    program: str
    #: seconds since the epoch, or None where the report does not say
    started: float | None
    activated: float | None
    role_known: float | None
    updated: float | None
    #: when its imports were done (see the module docstring); None without an import log
    imported: float | None = None
    #: how many modules it had imported by then
    modules: int = 0
    #: its Ray actor's class, where it is one
    actor: str | None = None
    #: its interpreter (the report's ``sys.executable``)
    executable: str | None = None

    @property
    def ready(self) -> float | None:
        """When it was ready: its role, else its imports done, else its activation."""
        for t in (self.role_known, self.imported, self.activated):
            if t is not None:
                return t
        return None

    @property
    def _known(self) -> list[float]:
        return [t for t in (self.started, self.activated, self.role_known, self.updated) if t is not None]

    @property
    def first(self) -> float | None:
        return min(self._known, default=None)

    @property
    def last(self) -> float | None:
        return max(self._known, default=None)

    @property
    def start(self) -> float | None:
        """Where its bar begins: its start, else the first mark its report has."""
        return self.started if self.started is not None else self.first


def as_seconds(value: object) -> float | None:
    """A report's time (seconds since the epoch), or None where it holds none."""
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def read_imports(directory: str, host: str, pid: int) -> list[dict[str, object]]:
    """A process's import log: its lines in order (``t``, ``new``; the first also ``sys_path``).
    A line cut short by a kill ends the log."""
    lines: list[dict[str, object]] = []
    try:
        with open(str(_reportfile.imports_path(directory, pid, host)), encoding="utf-8") as f:
            for text in f:
                try:
                    line = json.loads(text)
                except ValueError:
                    break
                if isinstance(line, dict) and isinstance(line.get("new"), list):
                    lines.append(line)
    except OSError:
        pass
    return lines


def imports_done(lines: list[dict[str, object]], until: float | None) -> tuple[float | None, int]:
    """The time of the log's last line at or before ``until`` (all, with None), and how many modules
    the lines up to it name."""
    done, count = None, 0
    for line in lines:
        t = as_seconds(line.get("t"))
        if t is None or (until is not None and t > until):
            break
        done, count = t, count + len(line["new"])  # type: ignore[arg-type]
    return done, count


def rows(reports: list[dict[str, object]], directory: str | None = None) -> list[Row]:
    """The reports' processes, in the order they started (with ``directory``, where the reports
    are, their import logs give each its imports' end)."""
    out = []
    for r in reports:
        times = r.get("times") if isinstance(r.get("times"), dict) else {}
        assert isinstance(times, dict)
        host, pid = str(r.get("host") or "?"), int(r.get("pid") or 0)  # type: ignore[call-overload]
        role_known = as_seconds(times.get("role"))
        imported, modules = (
            imports_done(read_imports(directory, host, pid), role_known) if directory else (None, 0)
        )
        out.append(
            Row(
                host=host,
                pid=pid,
                ppid=int(r.get("ppid") or 0),  # type: ignore[call-overload]
                role=str(r.get("role") or "?"),
                program=str(r.get("program") or "?"),
                started=as_seconds(times.get("started")),
                activated=as_seconds(times.get("activated")),
                role_known=role_known,
                updated=as_seconds(r.get("updated")),
                imported=imported,
                modules=modules,
                actor=_actor(r),
                executable=str(r["executable"]) if r.get("executable") else None,
            )
        )
    return sorted(out, key=lambda row: (row.first if row.first is not None else float("inf"), row.pid))


def _actor(report: dict[str, object]) -> str | None:
    ray = report.get("ray")
    name = ray.get("actor_class") if isinstance(ray, dict) else None
    return str(name) if name else None


def _origin(table: list[Row]) -> float:
    firsts = [row.first for row in table if row.first is not None]
    return min(firsts) if firsts else 0.0


def _parents(table: list[Row]) -> dict[int, int]:
    """Row index -> its parent's row index, where the parent is a process of the run too."""
    where = {(row.host, row.pid): i for i, row in enumerate(table)}
    return {i: where[(row.host, row.ppid)] for i, row in enumerate(table) if (row.host, row.ppid) in where}


def follows(table: list[Row]) -> dict[int, int]:
    """Row index -> the row it follows: of the processes of its host that started before it, the one
    that became ready last before it started (see the module docstring)."""
    out: dict[int, int] = {}
    for i, row in enumerate(table):
        if row.start is None:
            continue
        before = [
            (other.ready, j)
            for j, other in enumerate(table)
            if j != i
            and other.host == row.host
            and other.start is not None
            and other.start < row.start
            and other.ready is not None
            and other.ready <= row.start
        ]
        if before:
            out[i] = max(before)[1]
    return out


def render_text(table: list[Row]) -> list[str]:
    """The timeline as lines: start, then each later mark relative to the process's own start."""
    if not table:
        return ["timeline: no reports"]
    origin = _origin(table)
    parents = _parents(table)
    after_row = follows(table)

    def at(t: float | None) -> str:
        return f"{t - origin:8.2f}" if t is not None else f"{'?':>8s}"

    def after(t: float | None, start: float | None) -> str:
        if t is None or start is None:
            return f"{'-':>8s}"
        return f"{'+' + format(t - start, '.2f'):>8s}"

    lines = [
        f"timeline ({len(table)} processes; seconds from the first start; activated, imports done, role "
        "and last change after the process's own start; follows: the process ready last before it started):",
        f"  {'#':>3s} {'start':>8s} {'activ.':>8s} {'imports':>8s} {'role':>8s} {'last':>8s} {'pid':>8s} "
        f"{'parent':>6s} {'follows':>7s}  role, program",
    ]
    for i, row in enumerate(table):
        start = row.start
        parent = f"#{parents[i] + 1}" if i in parents else "-"
        follow = f"#{after_row[i] + 1}" if i in after_row else "-"
        lines.append(
            f"  {i + 1:>3d} {at(start)} {after(row.activated, start)} {after(row.imported, start)} "
            f"{after(row.role_known, start)} {after(row.updated, start)} {row.pid:>8d} {parent:>6s} "
            f"{follow:>7s}  {row.actor or row.role}, {row.program}"
        )
    ends = [row.last for row in table if row.last is not None]
    if ends:
        lines.append(f"  last change at {max(ends) - origin:.2f} s")
    return lines


#: The chart's geometry, in SVG user units.
_LABEL, _BAR_AREA, _ROW, _TOP = 360, 840, 20, 40


def render_svg(table: list[Row], title: str = "npu-compat run timeline") -> str:
    """The timeline as an SVG Gantt chart: one bar per process from its start to its report's last
    change, the part before npu-compat activated lighter, a tick where it learned its role."""
    origin = _origin(table)
    ends = [row.last - origin for row in table if row.last is not None]
    span = max([*ends, 1.0])
    scale = _BAR_AREA / span
    height = _TOP + _ROW * (len(table) + 1) + 20
    width = _LABEL + _BAR_AREA + 20
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'font-family="monospace" font-size="11">',
        f'<text x="8" y="16" font-size="13">{escape(title)} ({len(table)} processes, {span:.1f} s)</text>',
    ]
    step = _tick_step(span)
    tick = 0.0
    while tick <= span + 1e-9:
        x = _LABEL + tick * scale
        out.append(f'<line x1="{x:.1f}" y1="{_TOP - 8}" x2="{x:.1f}" y2="{height - 20}" stroke="#ddd"/>')
        out.append(f'<text x="{x:.1f}" y="{_TOP - 12}" text-anchor="middle">{tick:g} s</text>')
        tick += step
    for i, row in enumerate(table):
        y = _TOP + _ROW * i
        label = f"{row.pid} {row.actor or row.role} ({row.program})"
        out.append(f'<text x="8" y="{y + 13}">{escape(label[:56])}</text>')
        start = row.start
        if start is None or row.last is None:
            continue
        x0, x1 = _LABEL + (start - origin) * scale, _LABEL + (row.last - origin) * scale
        box = f'x="{x0:.1f}" y="{y + 3}" height="{_ROW - 6}"'
        out.append(
            f'<rect {box} width="{max(x1 - x0, 1.0):.1f}" fill="#4a7ebb">'
            f"<title>{escape(label)}: {start - origin:.2f} to {row.last - origin:.2f} s</title></rect>"
        )
        if row.imported is not None and row.imported > start:
            xi = _LABEL + (row.imported - origin) * scale
            out.append(
                f'<rect {box} width="{max(xi - x0, 1.0):.1f}" fill="#8fb0d9">'
                f"<title>imports done: {row.imported - start:.2f} s after its start, {row.modules} modules"
                "</title></rect>"
            )
        if row.activated is not None and row.activated > start:
            xa = _LABEL + (row.activated - origin) * scale
            out.append(
                f'<rect {box} width="{max(xa - x0, 1.0):.1f}" fill="#b8cce4">'
                f"<title>before npu-compat activated: {row.activated - start:.2f} s</title></rect>"
            )
        if row.role_known is not None:
            xr = _LABEL + (row.role_known - origin) * scale
            out.append(f'<line x1="{xr:.1f}" y1="{y + 1}" x2="{xr:.1f}" y2="{y + _ROW - 1}" stroke="#c0504d" '
                       'stroke-width="2"/>')  # fmt: skip
    legend_y = height - 6
    out.append(
        f'<text x="8" y="{legend_y}">lightest: started, npu-compat not yet active; light: importing; dark: '
        "imports done, until its report last changed; red tick: role known (Ray driver/actor, vLLM)</text>"
    )
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _tick_step(span: float) -> float:
    for step in (1, 2, 5, 10, 20, 30, 60, 120, 300, 600):
        if span / step <= 12:
            return float(step)
    return 1200.0
