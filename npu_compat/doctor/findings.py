"""What ``doctor`` found: each check adds its :class:`Finding` lines and its section to one
:class:`Diagnosis`, which :mod:`.render` prints and ``--json`` dumps.

A ``Finding`` of level ``error`` would break a run and makes the exit status 1; ``warning`` and ``note``
never do.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Finding:
    level: str  # "error" (breaks a run; exit 1), "warning" or "note"
    message: str


@dataclass
class Diagnosis:
    findings: list[Finding] = field(default_factory=list)
    sections: dict[str, object] = field(default_factory=dict)

    def add(self, level: str, message: str) -> None:
        self.findings.append(Finding(level, message))

    @property
    def ok(self) -> bool:
        return not any(f.level == "error" for f in self.findings)
