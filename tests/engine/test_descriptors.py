"""Every kind of class attribute as a patch target, defined on the class itself or inherited from a base.

A wrapper keeps the kind of what it wraps: a staticmethod is still called without the instance, a
classmethod still binds to the class it is looked up on, a builtin still does not bind.  A target
that a wrapper cannot stand in for -- a property, a slot, any other data descriptor -- is refused
when the patch is applied, with a reason that names the class defining it, and the class is left
as it was.  Undone, the subclass holds nothing of npu-compat: an inherited target is inherited again.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import last_json, run_py
from tests.engine.test_concurrency import write_dist

NPU = {"NPU_COMPAT_DEVICE": "npu"}

#: Every kind of class attribute; ``Base`` defines them, ``Sub`` inherits them, ``Own`` defines them again.
KINDS = """
    def method(self, x):
        return ("method", type(self).__name__, x)

    @staticmethod
    def static(x):
        return ("static", x)

    @classmethod
    def klass(cls, x):
        return ("klass", cls.__name__, x)

    builtin = abs   # a builtin function as a class attribute does not bind

    @property
    def prop(self):
        return "prop"
"""

KINDS_MODULE = f"""
class Base(dict):
    __slots__ = ("slotted",)
{KINDS}

class Sub(Base):
    __slots__ = ()


class Own(Base):
    __slots__ = ("own_slot",)
{KINDS}
"""

WRAPPERS = """
def mark(wrapped, instance, args, kwargs):
    return ["wrapped", wrapped(*args, **kwargs)]
"""

#: Each callable kind, and how a call through the instance and through the class looks.
CALLABLE = ["method", "static", "klass", "builtin", "get"]
REFUSED = {"prop": "property", "slotted": "member_descriptor"}

CALLS = """
def calls(cls):
    obj = cls(k="v")
    return {
        "method": [obj.method(1), cls.method(obj, 2)],
        "static": [obj.static(1), cls.static(2)],
        "klass": [obj.klass(1), cls.klass(2)],
        "builtin": [obj.builtin(-1), cls.builtin(-2)],
        "get": [obj.get("k"), cls.get(obj, "k")],
    }
"""


@pytest.fixture
def kinds(tmp_path: Path) -> Path:
    root = tmp_path / "site"
    (root / "kinds").mkdir(parents=True)
    (root / "kinds" / "__init__.py").write_text(KINDS_MODULE)
    (root / "kindwrappers.py").write_text(WRAPPERS)
    write_dist(root, "kinds")
    return root


def specs_for(cls: str) -> str:
    names = [*CALLABLE, *REFUSED]
    if cls == "Own":
        names = [n if n != "slotted" else "own_slot" for n in names if n != "get"]
    return (
        "from npu_compat import PatchSpec\n"
        f"SPECS = [PatchSpec('k.' + n, 'kinds:{cls}.' + n, wrapper='kindwrappers:mark', distribution='kinds',"
        f" versions='>=1', why='test') for n in {names!r}]\n"
    )


@pytest.mark.parametrize("cls", ["Sub", "Own"])
def test_each_kind_keeps_its_binding_or_is_refused_naming_the_defining_class(kinds: Path, cls: str) -> None:
    (kinds / "kindspecs.py").write_text(specs_for(cls))
    proc = run_py(
        CALLS
        + f"""
import json, warnings
import npu_compat
from kindspecs import SPECS
import kinds
cls = kinds.{cls}
before_dict = dict(vars(cls))
plain = calls(cls)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    npu_compat.activate(specs=SPECS)
patched = calls(cls)
rep = {{r["id"][2:]: (r["status"], r["reason"]) for r in npu_compat.report()}}
npu_compat.deactivate()
after = calls(cls)
print(json.dumps({{"plain": plain, "patched": patched, "after": after, "report": rep,
                   "restored": {{k: vars(cls).get(k) is v for k, v in before_dict.items()}},
                   "extra": sorted(set(vars(cls)) - set(before_dict)),
                   "warnings": [str(w.message) for w in caught]}}))
""",
        env=NPU,
        pythonpath=[str(kinds)],
    )
    out = last_json(proc)
    assert out["plain"] == out["after"], "deactivate() left a kind changed"
    for name in out["plain"]:
        if name not in out["report"]:
            continue
        assert out["report"][name][0] == "applied", out["report"][name]
        # the same binding as the original's, behind the wrapper
        assert out["patched"][name] == [["wrapped", value] for value in out["plain"][name]], name
    for name, kind in REFUSED.items():
        name = "own_slot" if cls == "Own" and name == "slotted" else name
        status, reason = out["report"][name]
        assert status == "failed", (name, status, reason)
        defining = "Own" if cls == "Own" else "Base"
        assert f"kinds.{defining}" in reason and kind in reason, reason
    assert all(out["restored"].values()), out["restored"]
    assert out["extra"] == [], "the subclass keeps attributes of npu-compat after deactivate()"


LAZY_MODULE = """
def _lazy(x):
    return ("lazy", x)

def __getattr__(name):   # a module attribute provided on demand (PEP 562), as lazy packages do
    if name == "lazy":
        return _lazy
    raise AttributeError(name)
"""


def test_a_module_attribute_given_by_its_getattr_is_patched_and_given_back(kinds: Path) -> None:
    (kinds / "lazymod.py").write_text(LAZY_MODULE)
    (kinds / "lazyspecs.py").write_text(
        "from npu_compat import PatchSpec\n"
        "SPECS = [PatchSpec('k.lazy', 'lazymod:lazy', wrapper='kindwrappers:mark', distribution='kinds',"
        " versions='>=1', why='test')]\n"
    )
    out = last_json(
        run_py(
            """
            import json
            import npu_compat
            from lazyspecs import SPECS
            import lazymod
            npu_compat.activate(specs=SPECS)
            patched = lazymod.lazy(1)
            status = npu_compat.report()[0]["status"]
            npu_compat.deactivate()
            print(json.dumps({"patched": patched, "status": status, "after": lazymod.lazy(2),
                              "own": "lazy" in vars(lazymod), "same": lazymod.lazy is lazymod._lazy}))
            """,
            env=NPU,
            pythonpath=[str(kinds)],
        )
    )
    assert out == {"patched": ["wrapped", ["lazy", 1]], "status": "applied", "after": ["lazy", 2],
                   "own": False, "same": True}  # fmt: skip
