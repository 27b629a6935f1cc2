"""What a patch is: plain data that can be listed without importing any target.

A :class:`PatchSpec` names its target by a dotted string (``"pkg.mod:Class.attr"``) and
its implementation by another (``"npu_compat.patches.x:wrapper"``); neither is imported
until the target module itself is imported.  The built-in specs live in
:mod:`npu_compat._catalog`.
"""

TYPE_CHECKING = False  # typing is not imported on the start-up path
if TYPE_CHECKING:
    from collections.abc import Iterable


class PatchSpec:
    """One declared change to one upstream attribute.

    Exactly one of ``wrapper`` and ``replacement`` is given:

    ``wrapper``
        ``"module:function"`` with wrapt's signature ``(wrapped, instance, args, kwargs)``;
        the target callable is replaced by a ``wrapt.FunctionWrapper`` around it.
    ``replacement``
        ``"module:function"`` taking the original object and returning the new one
        (for values that are not callables, or where a wrapper cannot be used).

    ``copies`` lists ``"module:name"`` places that bind the same object by
    ``from target import name``; they are repointed while patched and restored on undo.
    ``condition`` is ``"module:function"`` returning ``None`` when the patch should apply
    or a sentence saying why not.  ``expects`` names parameters the target must accept;
    a target without them has changed shape and the patch fails instead of guessing.
    """

    __slots__ = (
        "id",
        "target",
        "distribution",
        "versions",
        "why",
        "upstream_fix",
        "remove_when",
        "wrapper",
        "replacement",
        "condition",
        "copies",
        "expects",
    )

    def __init__(
        self,
        id: str,
        target: str,
        *,
        distribution: str,
        versions: str,
        why: str,
        upstream_fix: str = "",
        remove_when: str = "",
        wrapper: "str | None" = None,
        replacement: "str | None" = None,
        condition: "str | None" = None,
        copies: "Iterable[str]" = (),
        expects: "Iterable[str]" = (),
    ) -> None:
        if (wrapper is None) == (replacement is None):
            raise ValueError(f"patch {id}: give exactly one of wrapper= and replacement=")
        if ":" not in target:
            raise ValueError(f"patch {id}: target {target!r} must be 'module:attribute.path'")
        self.id = id
        self.target = target
        self.distribution = distribution
        self.versions = versions
        self.why = why
        self.upstream_fix = upstream_fix
        self.remove_when = remove_when
        self.wrapper = wrapper
        self.replacement = replacement
        self.condition = condition
        self.copies = tuple(copies)
        self.expects = tuple(expects)

    @property
    def module(self) -> str:
        return self.target.partition(":")[0]

    @property
    def attr_path(self) -> "tuple[str, ...]":
        return tuple(self.target.partition(":")[2].split("."))

    def copy_places(self) -> "tuple[tuple[str, str], ...]":
        """``(module, name)`` for every declared copy; a copy without ``:name`` keeps the target's name."""
        places = []
        for copy in self.copies:
            module, _, name = copy.partition(":")
            places.append((module, name or self.attr_path[-1]))
        return tuple(places)

    def describe(self) -> "dict[str, object]":
        return {
            "id": self.id,
            "target": self.target,
            "distribution": self.distribution,
            "versions": self.versions,
            "why": self.why,
            "upstream_fix": self.upstream_fix,
            "remove_when": self.remove_when,
            "copies": list(self.copies),
        }

    def __repr__(self) -> str:
        return f"PatchSpec({self.id!r}, {self.target!r}, {self.distribution}{self.versions})"


def load(ref: str) -> object:
    """Import ``"module:attr.path"`` and return the attribute."""
    import importlib

    module_name, _, path = ref.partition(":")
    obj: object = importlib.import_module(module_name)
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj
