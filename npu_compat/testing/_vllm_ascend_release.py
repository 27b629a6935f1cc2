"""The real vllm-ascend's Python for the simulated host: which release, from where, laid out where.

A simulated Ascend host runs the released vllm-ascend package itself.  Its Python is taken from the
package registry, never committed: the release paired with the installed vLLM (see ``_sites``), pinned here
by file name and SHA-256, so that every machine lays out the same bytes.

* 0.18.0 ships x86_64 and aarch64 wheels; any one of them holds the same Python (the compiled parts differ).
* 0.23.0.post1 ships only its source distribution; built with ``COMPILE_CUSTOM_KERNELS=0`` it is pure Python,
  and that is what :func:`lay_out` takes from it, with the ``_build_info.py`` its ``build_py`` would write.

:func:`lay_out` writes ``<sys.prefix>/share/npu-compat/vllm-ascend-<release>/``: the ``vllm_ascend``
package without its compiled files (``vllm_ascend_C``, the kernel library, the CANN custom-op package: what
cannot load without an NPU, and what the simulation stands in for) and a
``vllm_ascend-<release>.dist-info`` with the release's own metadata and entry points.  The location is the
environment's, not the user's home: every process of one environment finds the same copy.

``python -m npu_compat.testing vllm-ascend`` runs it from a shell; the registry is the one pip is configured
with (``PIP_INDEX_URL``, else ``pip config``'s ``global.index-url``, else PyPI), read through its simple API.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.parse
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from .. import _env
from .._versions import version_in_range

PYPI_SIMPLE = "https://pypi.org/simple"
#: What ``vllm_ascend/_build_info.py`` says on the simulated host: an Ascend 910B3 is an A2 device
#: (vllm-ascend's ``setup.py`` maps every ``ascend910b*`` SoC to ``A2``).
DEVICE_TYPE = "A2"


@dataclass(frozen=True)
class Release:
    version: str
    filename: str
    sha256: str
    #: The torch release it pins (its metadata's ``Requires-Dist``, its ``requirements.txt``).
    torch: str


RELEASES = {
    release.version: release
    for release in (
        Release(
            "0.18.0",
            "vllm_ascend-0.18.0-cp311-cp311-manylinux_2_24_x86_64.whl",
            "4d5f4cc392a6c4f4ccf209008823d6ae615473d665596cf3d042cb5a755271bd",
            torch="2.9.0",
        ),
        Release(
            "0.23.0.post1",
            "vllm_ascend-0.23.0.post1.tar.gz",
            "a3b9f4a5dd7aa50c37e03d1f35937c4ae5aeacc49b734cac74d59ce5757738e1",
            torch="2.10.0",
        ),
    )
}


def torch_defaults(version: str) -> dict[str, str]:
    """The settings whose default vLLM or torch derives from torch's version, as they are on a host with the
    torch that release ``version`` pins (the simulation runs a newer CPU torch).

    * vLLM 0.18 compiles its model ahead of time (``VLLM_USE_AOT_COMPILE``, which forces AOTAutograd's
      cache) from torch 2.10 on; vllm-ascend 0.18.0 pins torch 2.9.0, and its compiler (``AscendCompiler``,
      whose inner compile returns an FX graph, not Inductor's output code) is not made for that cache.
    * torch 2.13's AOTAutograd checks that a custom operator's output does not alias its input, and makes a
      violation an error where ``CI`` is set (``TORCHINDUCTOR_ERROR_ON_CUSTOM_OP_ALIASING``'s default);
      torch 2.9.0 and 2.10.0 have no such check (2.10.0's ``runtime_wrappers.py`` has no
      ``_check_custom_op_aliasing``).  vllm-ascend's ``vllm::maybe_pad_and_reduce`` (0.18.0 and 0.23.0.post1)
      returns its input unchanged at one rank (``tensor_model_parallel_all_reduce``), so a user's CI would
      fail where the pinned torch runs.  The check still warns.
    * torch 2.13's ``aot_compile`` (vLLM's AOT compile, on from torch 2.10) forces AOTAutograd's cache
      (``force_autograd_cache``) for every compiler, whose entry then asserts Inductor's ``OutputCode``.
      torch 2.10.0, which vllm-ascend 0.23.0.post1 pins, has no such setting: it caches only for a
      serializable compiler (Inductor's), not for vllm-ascend's ``AscendCompiler``, whose pieces are FX
      graphs.  Without the local cache torch 2.13 goes the 2.10 way for them.
    """
    pinned = RELEASES[version].torch
    if not version_in_range(pinned, "<2.11"):
        return {}
    defaults = {_env.TORCHINDUCTOR_ERROR_ON_CUSTOM_OP_ALIASING: "0"}
    if version_in_range(pinned, "<2.10"):
        defaults[_env.VLLM_USE_AOT_COMPILE] = "0"
    else:
        defaults[_env.TORCHINDUCTOR_AUTOGRAD_CACHE] = "0"
    return defaults


def layout_dir(version: str, prefix: str | None = None) -> Path:
    """Where release ``version`` is laid out for the environment at ``prefix`` (default: this one's)."""
    return Path(prefix or sys.prefix) / "share" / "npu-compat" / f"vllm-ascend-{version}"


def is_laid_out(version: str) -> bool:
    return (layout_dir(version) / "vllm_ascend" / "__init__.py").is_file()


def index_url() -> str:
    """The package index pip uses here."""
    url = os.environ.get("PIP_INDEX_URL", "").strip()
    if not url and shutil.which("pip"):
        out = subprocess.run(
            ["pip", "config", "get", "global.index-url"], capture_output=True, text=True, check=False
        )
        url = out.stdout.strip() if out.returncode == 0 else ""
    return str(url or PYPI_SIMPLE).rstrip("/")


def _file_url(index: str, release: Release) -> str:
    """The download address of ``release``'s file, from the index's project page (PEP 691 JSON, else
    the PEP 503 HTML page)."""
    page = f"{index}/vllm-ascend/"
    request = urllib.request.Request(
        page, headers={"Accept": "application/vnd.pypi.simple.v1+json, text/html;q=0.1"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        body = response.read().decode("utf-8")
        kind = response.headers.get("Content-Type", "")
    if "json" in kind:
        for entry in json.loads(body).get("files", []):
            if entry.get("filename") == release.filename:
                return urllib.parse.urljoin(page, str(entry["url"]))
    else:
        for href in re.findall(r'href="([^"]+)"', body):
            if PurePosixPath(urllib.parse.urlparse(href).path).name == release.filename:
                return str(urllib.parse.urljoin(page, href))
    raise LookupError(f"{release.filename} is not on {page}")


def download(release: Release, index: str | None = None) -> bytes:
    """``release``'s file from the index, checked against its pinned SHA-256."""
    url = _file_url(index or index_url(), release)
    with urllib.request.urlopen(url, timeout=300) as response:
        data: bytes = response.read()
    digest = hashlib.sha256(data).hexdigest()
    if digest != release.sha256:
        raise ValueError(
            f"{release.filename} from {url} has SHA-256 {digest}, not the pinned {release.sha256}"
        )
    return data


def _kept(path: PurePosixPath) -> bool:
    """Whether a file of the release's ``vllm_ascend`` package is laid out: its Python and data, not what
    was compiled for the device."""
    parts = path.parts
    return (
        bool(parts)
        and parts[0] == "vllm_ascend"
        and "_cann_ops_custom" not in parts
        and "__pycache__" not in parts
        and not path.name.endswith((".so", ".pyc"))
    )


def _members(release: Release, data: bytes) -> tuple[dict[PurePosixPath, bytes], dict[str, bytes]]:
    """The package's files by path below the archive's root, and the release's metadata files."""
    files: dict[PurePosixPath, bytes] = {}
    meta: dict[str, bytes] = {}
    if release.filename.endswith(".whl"):
        with zipfile.ZipFile(io.BytesIO(data)) as wheel:
            for name in wheel.namelist():
                if name.endswith("/"):
                    continue
                path = PurePosixPath(name)
                if _kept(path):
                    files[path] = wheel.read(name)
                elif path.parent.name.endswith(".dist-info") and path.name in (
                    "METADATA",
                    "entry_points.txt",
                ):
                    meta[path.name] = wheel.read(name)
        return files, meta
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as sdist:
        for member in sdist.getmembers():
            if not member.isfile():
                continue
            path = PurePosixPath(*PurePosixPath(member.name).parts[1:])  # below "<name>-<version>/"
            handle = sdist.extractfile(member)
            if handle is None:
                continue
            if _kept(path):
                files[path] = handle.read()
            elif path == PurePosixPath("PKG-INFO"):
                meta["METADATA"] = handle.read()
            elif path == PurePosixPath("vllm_ascend.egg-info/entry_points.txt"):
                meta["entry_points.txt"] = handle.read()
    return files, meta


def lay_out(version: str, *, index: str | None = None, data: bytes | None = None) -> Path:
    """Lay release ``version`` out for this environment (see the module); returns its directory.

    Replaces an earlier copy as a whole.  ``data``: the release's file, already downloaded."""
    release = RELEASES.get(version)
    if release is None:
        raise ValueError(f"vllm-ascend {version}: not a release the simulation knows ({', '.join(RELEASES)})")
    if data is None:
        data = download(release, index)  # checked there, naming where it came from
    elif hashlib.sha256(data).hexdigest() != release.sha256:
        raise ValueError(f"{release.filename}: not the pinned file (SHA-256 differs)")
    files, meta = _members(release, data)
    if "entry_points.txt" not in meta or "METADATA" not in meta:
        raise ValueError(f"{release.filename}: no metadata or entry points in it")
    files.setdefault(
        PurePosixPath("vllm_ascend/_build_info.py"),
        f"# Written by npu-compat's simulated host, as vllm-ascend's build_py does\n"
        f"__device_type__ = '{DEVICE_TYPE}'\n".encode(),
    )
    target = layout_dir(version)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        for path, content in files.items():
            out = staging.joinpath(*path.parts)
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(content)
        dist_info = staging / f"vllm_ascend-{version}.dist-info"
        dist_info.mkdir()
        for name, content in meta.items():
            (dist_info / name).write_bytes(content)
        (dist_info / "INSTALLER").write_text("npu-compat (simulated Ascend host)\n")
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
    finally:
        if staging.exists():
            shutil.rmtree(staging)
    return target
