"""The version gate: which version of a distribution is installed, and whether a patch's
PEP 440 range admits it.

Read from installed metadata, never by importing the distribution; ``packaging`` and
``importlib.metadata`` are imported on first use (when a patch is applied, or by ``doctor``).
"""


def installed_version(distribution: str) -> "str | None":
    """The installed version of ``distribution``, or None when it has no metadata."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(distribution)
    except PackageNotFoundError:
        return None


def version_in_range(installed: str, versions: str) -> bool:
    """Whether ``installed`` is in the PEP 440 range ``versions`` (pre-releases included)."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import InvalidVersion, Version

    try:
        return SpecifierSet(versions).contains(Version(installed), prereleases=True)
    except InvalidVersion:
        return False
