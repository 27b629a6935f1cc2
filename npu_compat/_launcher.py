"""The launcher: ``npu-compat [--device D] [--strict] [--report-dir DIR] [--] COMMAND [ARGS...]``.

Runs COMMAND with npu-compat active in every Python process it starts -- the
command itself, its subprocesses and ``multiprocessing`` children, and for
``ray start`` every raylet worker -- whether or not npu-compat's ``.pth`` is in
the command's site-packages:

* the settings are exported as ``NPU_COMPAT_*`` variables (``NPU_COMPAT_AUTO`` is dropped);
* the launcher's site directory, ``npu_compat/_launcher_site`` (holding only a
  ``sitecustomize``: the pre-check, ``_npu_compat_precheck``), goes first on
  ``PYTHONPATH``, followed by the directory npu-compat is imported from when that is
  not a site directory (a checkout);
* the launcher then replaces itself with COMMAND (``os.execvpe``: same PID, no shell), so
  signals, stdin/stdout/stderr and the exit code are the command's own.

A usage error (an unknown option, no command, a command that cannot be run) exits
with status 2 and says what to do.  Kept free of argparse: it runs before every command.
"""

import os
import sys

from . import _env

USAGE = """\
usage: npu-compat [--device {npu,cuda,cpu,auto}] [--strict] [--report-dir DIR] [--] COMMAND [ARGS...]
       npu-compat report [--json] [--device D]
       npu-compat doctor [--json] [--reports DIR]

Run COMMAND (e.g. `trinity run --config x.yaml`, `ray start --head`, `python train.py`,
`torchrun ...`) with npu-compat active in it and in every Python process it starts.

options:
  --device D        decide this device instead of detecting it (exported as NPU_COMPAT_DEVICE)
  --strict          any patch failure raises (NPU_COMPAT_STRICT=1)
  --report-dir DIR  every activated process writes a JSON report into DIR (NPU_COMPAT_REPORT_DIR)
  --                end of options: everything after it is the command
  -h, --help        show this message
"""

#: The launcher's site directory: first on the command's ``PYTHONPATH``.
SITE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_launcher_site")


class UsageError(Exception):
    """A command line the launcher cannot run; the message says what to do."""

    def __init__(self, message: str, *, usage: bool = True) -> None:
        super().__init__(message)
        self.usage = usage


class Options:
    __slots__ = ("device", "help", "report_dir", "strict")

    def __init__(self) -> None:
        self.device: str | None = None
        self.strict = False
        self.report_dir: str | None = None
        self.help = False


def parse(argv: "list[str]") -> "tuple[Options, list[str]]":
    """Split ``argv`` into the launcher's options and the command.  Raises :class:`UsageError`."""
    options = Options()
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            i += 1
            break
        if not arg.startswith("-") or arg == "-":
            break
        name, eq, value = arg.partition("=")
        if name in ("--device", "--report-dir"):
            if not eq:
                i += 1
                if i >= len(argv):
                    raise UsageError(f"{name} needs a value")
                value = argv[i]
            if name == "--device":
                if value.strip().lower() not in _env.VALID_DEVICES:
                    raise UsageError(
                        f"--device {value!r} is not a device npu-compat knows; "
                        f"use one of {', '.join(_env.VALID_DEVICES)}"
                    )
                options.device = value.strip().lower()
            else:
                if not value:
                    raise UsageError("--report-dir needs a directory")
                options.report_dir = os.path.abspath(value)
        elif arg == "--strict":
            options.strict = True
        elif arg in ("-h", "--help"):
            options.help = True
            return options, []
        else:
            raise UsageError(
                f"unknown option {arg!r}; the options are --device, --strict and --report-dir "
                f"(put '--' before a command that starts with '-')"
            )
        i += 1
    command = argv[i:]
    if not command:
        raise UsageError("no command given: npu-compat [options] [--] COMMAND [ARGS...]")
    return options, command


def command_env(options: "Options", environ: "dict[str, str] | None" = None) -> "dict[str, str]":
    """The environment COMMAND runs in."""
    env = dict(os.environ if environ is None else environ)
    if options.device is not None:
        env[_env.DEVICE] = options.device
    if options.strict:
        env[_env.STRICT] = "1"
    if options.report_dir is not None:
        env[_env.REPORT_DIR] = options.report_dir
    env.pop(_env.AUTO, None)
    first = [SITE_DIR]
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if not _is_site_dir(root):
        first.append(root)  # a checkout: the command's interpreters must find npu_compat here too
    rest = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p not in first]
    env["PYTHONPATH"] = os.pathsep.join(first + (rest if rest != [""] else []))
    return env


def _is_site_dir(path: str) -> bool:
    site = sys.modules.get("site")
    dirs = list(getattr(site, "getsitepackages", list)())
    user = getattr(site, "getusersitepackages", None)
    if user is not None:
        dirs.append(user())
    norm = os.path.normcase(os.path.realpath(path))
    return any(os.path.normcase(os.path.realpath(d)) == norm for d in dirs)


def main(argv: "list[str]") -> int:
    """Replace this process with the command; return only on a usage error (2) or after ``--help`` (0)."""
    try:
        options, command = parse(argv)
        if options.help:
            sys.stdout.write(USAGE)
            return 0
        if options.report_dir is not None:
            try:
                os.makedirs(options.report_dir, exist_ok=True)
            except OSError as exc:
                raise UsageError(
                    f"--report-dir {options.report_dir!r}: {exc.strerror}", usage=False
                ) from None
        env = command_env(options)
        report = sys.modules.get("npu_compat._reportfile")
        if report is not None:
            report.forget()  # this pid is about to be the command; its report is the command's
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            os.execvpe(command[0], command, env)
        except OSError as exc:
            what = "not found" if isinstance(exc, FileNotFoundError) else exc.strerror
            raise UsageError(f"cannot run {command[0]!r}: {what}", usage=False) from None
    except UsageError as exc:
        sys.stderr.write(f"npu-compat: {exc}\n" + (f"\n{USAGE}" if exc.usage else ""))
        return 2
    return 0  # not reached: execvpe does not return
