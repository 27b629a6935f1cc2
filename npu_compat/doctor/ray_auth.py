"""Ray's token authentication, as ``doctor`` reads it: whether ``ray start --head`` would turn it on here
while what ``trinity run`` does first would not send the token.

The rules, each named by upstream module and function:

* ``ray start --head`` turns token authentication on by itself when a token exists and ``RAY_AUTH_MODE``
  is unset, where the installed Ray defines :data:`RAY_TOKEN_ON_START` (read from its files, not
  imported);
* ``ray status`` and ``ray.init(address=...)`` never do so, and ``trinity run`` runs ``ray status`` first
  (:data:`TRINITY_RAY_CHECK`);
* a Ray process finds a token in ``RAY_AUTH_TOKEN``, else the file ``RAY_AUTH_TOKEN_PATH`` names, else
  ``~/.ray/auth_token`` (:func:`ray_token_source`; the file is looked for, never read).
"""

from __future__ import annotations

import os

from .. import _env
from .._versions import installed_version
from . import source
from .findings import Diagnosis

#: The function of Ray's that turns token authentication on in ``ray start --head`` when a token exists
#: and ``RAY_AUTH_MODE`` is unset; ``ray status`` never calls it.
RAY_TOKEN_ON_START = (
    "ray._private.authentication.authentication_token_setup:maybe_enable_token_auth_if_token_available"
)

#: What ``trinity run`` calls first to see whether Ray is running: ``ray status``, which sends no token.
TRINITY_RAY_CHECK = "trinity.utils.dlc_utils:is_running"


def ray_enables_token_on_start() -> bool:
    """Whether the installed Ray's ``ray start --head`` turns token authentication on by itself: it
    defines :data:`RAY_TOKEN_ON_START` (read from the installed files, not imported)."""
    module, _, function = RAY_TOKEN_ON_START.partition(":")
    reader = source.installed_reader("ray")
    return reader is not None and reader.defines(module, function)


def ray_token_source(environ: dict[str, str]) -> str | None:
    """Where a Ray process with this environment finds a token, or None (the file is not read)."""
    if environ.get(_env.RAY_AUTH_TOKEN):
        return _env.RAY_AUTH_TOKEN
    path = environ.get(_env.RAY_AUTH_TOKEN_PATH)
    if path:
        return path if os.path.isfile(path) else None
    home = environ.get("HOME") or os.path.expanduser("~")
    default = os.path.join(home, ".ray", "auth_token")
    return "~/.ray/auth_token" if os.path.isfile(default) else None


def check_ray_auth(d: Diagnosis, environ: dict[str, str]) -> None:
    mode = environ.get(_env.RAY_AUTH_MODE)
    token = ray_token_source(environ)
    ray = installed_version("ray")
    enables = ray is not None and ray_enables_token_on_start()
    d.sections["ray_auth"] = {"ray": ray, "auth_mode": mode, "token": token, "start_enables_token": enables}
    if mode is None and token is not None and enables:
        d.add(
            "warning",
            f"Ray token authentication: a token exists ({token}) and {_env.RAY_AUTH_MODE} is unset, so "
            "`ray start --head` will turn token authentication on and require the token, while `ray status` "
            f"-- which `trinity run` runs first ({TRINITY_RAY_CHECK}) -- and "
            "`ray.init(address=...)` will not send it: `trinity run` then stops with 'Ray is not running'. "
            f"Fix: set the same mode on both sides, {_env.RAY_AUTH_MODE}=token for `ray start` and for "
            f"`trinity run` (both then read the same token), or {_env.RAY_AUTH_MODE}=disabled for both",
        )
