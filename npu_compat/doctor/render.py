"""``doctor``'s text: a :class:`.findings.Diagnosis` as a human reads it (``--json`` dumps its sections
and findings as they are).

The decision and its evidence, how automatic activation reaches this interpreter, the Ascend
environment, the target distributions, the patch plan, a run's reports where read (:mod:`.reports`),
then every finding and the verdict.
"""

from __future__ import annotations

from .. import _env
from .findings import Diagnosis
from .reports import render_reports


def render(d: Diagnosis) -> str:
    s = d.sections
    lines = [f"npu-compat {s['npu_compat']} doctor -- python {s['python']}", ""]
    decision = s["decision"]
    assert isinstance(decision, dict)
    lines.append(f"device decision: {decision['device']}  ({decision['source']})")
    lines += [f"  evidence: {e}" for e in decision["evidence"]]
    act = s["activation"]
    assert isinstance(act, dict)
    if act["effective"]:
        also = f" (then {', '.join(act['triggers'][1:])})" if len(act["triggers"]) > 1 else ""
        started = "it started npu-compat" if act["started_by"] else "nothing to start here (no Ascend hint)"
        reach = f"reaches this interpreter by {act['path']}{also}; {started}"
    else:
        reach = "does not reach this interpreter"
    lines += ["", f"automatic activation: {reach}"]
    lines.append(f"  npu_compat.pth: {', '.join(act['pth_files']) or 'not in any site directory'}")
    lines.append(f"  sitecustomize: {act['sitecustomize'] or 'none'}")
    lines.append(
        f"  launcher bootstrap on PYTHONPATH: {'yes' if act['launcher_bootstrap_on_pythonpath'] else 'no'}"
    )
    vllm = s["vllm_plugin"]
    assert isinstance(vllm, dict)
    lines.append(f"  vLLM plugin entry point: {'registered' if vllm['registered'] else 'not registered'}")
    auth = s["ray_auth"]
    assert isinstance(auth, dict)
    if auth["ray"] is None:
        lines.append("  Ray token authentication: Ray is not installed")
    else:
        starts = (
            "turns it on when a token exists"
            if auth["start_enables_token"]
            else "never turns it on by itself"
        )
        lines.append(
            f"  Ray token authentication: {_env.RAY_AUTH_MODE} {auth['auth_mode'] or 'unset'}; "
            f"token: {auth['token'] or 'none found'}; `ray start --head` {starts}"
        )
    lines += ["", "Ascend environment:"]
    for c in s["ascend"]:  # type: ignore[attr-defined]
        lines.append(f"  {c['status']:7s} {c['check']}: {c['detail']}")
    if "simulation" in s:
        sim = s["simulation"]
        assert isinstance(sim, dict)
        gib = 1 << 30
        host = ""
        if "host_total" in sim:
            total, available = sim["host_total"] / gib, sim["host_available"] / gib
            host = f"; the host has {total:.1f} GiB, {available:.1f} GiB available"
        lines.append(f"  simulated: {sim['npus']} NPUs of {sim['npu_memory'] / gib:g} GiB each{host}")
    lines += ["", "target distributions:"]
    for t in s["targets"]:  # type: ignore[attr-defined]
        ranges = ", ".join(t["ranges"])
        lines.append(f"  {t['distribution']:14s} {t['installed'] or '-':14s} {t['verdict']:15s} {ranges}")
        if "how" in t:
            lines.append(f"      {t['how']}")
    lines += ["", "patch plan (nothing imported):"]
    plans = s["plans"]
    assert isinstance(plans, list)
    width = max((len(p["id"]) for p in plans), default=10)
    for p in plans:
        lines.append(f"  {p['id']:{width}s}  {p['plan']:11s}  {p['why']}")
    if "reports" in s:
        lines += ["", *render_reports(s["reports"])]  # type: ignore[arg-type]
    lines.append("")
    for f in d.findings:
        lines.append(f"{f.level}: {f.message}")
    errors = sum(f.level == "error" for f in d.findings)
    lines.append("")
    lines.append(
        "OK: nothing found that would break a run" if not errors else f"{errors} problem(s) would break a run"
    )
    return "\n".join(lines)
