"""The simulated Ascend from a shell: ``python -m npu_compat.testing {cluster,env,vllm-ascend} ...``.

``cluster`` starts an NPU-only Ray cluster on this machine (:func:`npu_ray_cluster`) in the
foreground, prints what a client needs once every node is alive (``export`` lines, then
``ready``), appends the same as ``NAME=VALUE`` lines to ``--env-file`` (the dotenv form CI systems
read, e.g. ``$GITHUB_ENV``), and runs until Ctrl-C or SIGTERM, when it stops every process it
started.  ``env`` prints the variables that make a process a simulated Ascend host.  ``vllm-ascend``
lays out the released vllm-ascend paired with the installed vLLM (or ``--release``) in this environment,
from the package registry: what a simulated process with vLLM runs.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from types import FrameType

from .. import _env
from ._host import simulation_env


def _exports(env: Mapping[str, str]) -> str:
    return "".join(f"export {name}={shlex.quote(value)}\n" for name, value in env.items())


def _dotenv(env: Mapping[str, str]) -> str:
    for name, value in env.items():
        if "\n" in value:
            raise ValueError(f"{name}'s value has a line break: it cannot be one dotenv line")
    return "".join(f"{name}={value}\n" for name, value in env.items())


class _Stop(BaseException):
    """SIGTERM or SIGINT: leave the cluster's ``with`` block, which stops it."""


def _stop_on_signal(signum: int, frame: FrameType | None) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second signal must not cut the stopping short
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise _Stop(signum)


def _cluster(args: argparse.Namespace) -> int:
    from ._ray import npu_ray_cluster

    signal.signal(signal.SIGTERM, _stop_on_signal)
    signal.signal(signal.SIGINT, _stop_on_signal)
    shape = f"{args.nodes} node(s) x {{NPU: {args.npus}, CPU: {args.cpus}}}"
    print(
        f"npu_compat.testing: starting a simulated Ascend Ray cluster, {shape}", file=sys.stderr, flush=True
    )
    try:
        with npu_ray_cluster(args.nodes, args.npus, args.cpus, start_timeout=args.timeout) as cluster:
            client = cluster.client_env()
            if args.env_file:
                with open(args.env_file, "a", encoding="utf-8") as out:
                    out.write(_dotenv(client))
            sys.stdout.write(_exports(client))
            print(f"ready: {cluster.address}, {shape}; Ctrl-C or SIGTERM stops it", flush=True)
            while (why := cluster.exited()) is None:
                time.sleep(1)
            print(f"npu_compat.testing: {why}; stopping the cluster", file=sys.stderr)
            return 1
    except _Stop as stop:
        print(f"npu_compat.testing: signal {stop.args[0]}: the cluster is stopped", file=sys.stderr)
        return 0
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)


#: The simulation's own choices: printed whether or not this shell has them already, so that the lines alone
#: make the same simulation where they are sourced (a later CI step, through ``$GITHUB_ENV``).
_CHOICES = (_env.SIMULATE, _env.SIMULATE_DEVICES, _env.SIMULATE_VLLM_PLATFORM)


def _env_command(args: argparse.Namespace) -> int:
    env = simulation_env(args.devices, vllm_platform=False if args.no_vllm_platform else None)
    changed = {
        name: value for name, value in env.items() if os.environ.get(name) != value or name in _CHOICES
    }
    sys.stdout.write(_dotenv(changed) if args.dotenv else _exports(changed))
    return 0


def _vllm_ascend_command(args: argparse.Namespace) -> int:
    from . import _sites, _vllm_ascend_release

    release = args.release
    if release is None:
        vllm = _sites.installed_vllm()
        if vllm is None:
            print("npu_compat.testing: vLLM is not installed here: name a --release", file=sys.stderr)
            return 2
        release = _sites.vllm_ascend_release(vllm)
    if _vllm_ascend_release.is_laid_out(release) and not args.force:
        print(f"vllm-ascend {release}: laid out in {_vllm_ascend_release.layout_dir(release)}")
        return 0
    where = _vllm_ascend_release.lay_out(release)
    print(f"vllm-ascend {release}: laid out in {where}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m npu_compat.testing", description=__doc__.split("\n\n")[0]
    )
    commands = parser.add_subparsers(dest="command", required=True)
    cluster = commands.add_parser("cluster", help="run an NPU-only Ray cluster in the foreground")
    cluster.add_argument("--nodes", type=int, default=1, help="raylets on this machine (default 1)")
    cluster.add_argument("--npus", type=int, default=2, help="NPUs per node (default 2)")
    cluster.add_argument("--cpus", type=int, default=4, help="CPUs per node (default 4)")
    cluster.add_argument("--env-file", help="append NAME=VALUE lines for clients here once ready")
    cluster.add_argument("--timeout", type=float, default=180, help="seconds to wait for the nodes")
    env = commands.add_parser("env", help="print the environment of a simulated Ascend host")
    env.add_argument("--devices", type=int, default=2, help="simulated NPUs (default 2)")
    env.add_argument("--dotenv", action="store_true", help="NAME=VALUE lines instead of `export` lines")
    env.add_argument("--no-vllm-platform", action="store_true", help="leave vllm-ascend's distribution out")
    release = commands.add_parser(
        "vllm-ascend", help="lay out the released vllm-ascend's Python here, from the package registry"
    )
    release.add_argument("--release", help="the release (default: the one the installed vLLM pairs with)")
    release.add_argument("--force", action="store_true", help="lay it out again even if it is there")
    args = parser.parse_args(argv)
    run = {"cluster": _cluster, "env": _env_command, "vllm-ascend": _vllm_ascend_command}[args.command]
    try:
        return run(args)
    except FileNotFoundError as exc:  # no `ray` executable: Ray is not installed here
        print(
            f"npu_compat.testing: {exc.filename or exc}: not found; the cluster needs Ray installed",
            file=sys.stderr,
        )
        return 2
    except (ValueError, RuntimeError, TimeoutError, LookupError, OSError) as exc:
        print(f"npu_compat.testing: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
