"""Ray on Ascend: GPU requests become NPU requests; a GPU request that still gets through is named.

An Ascend cluster advertises its chips as the custom resource ``"NPU"``.  A ``num_gpus=n``
actor or task, or a ``{"GPU": n}`` placement-group bundle, can never be scheduled there
and waits forever without a word.  The requests are rewritten -- ``num_gpus=n`` becomes
``resources={"NPU": n}`` merged with any resources already asked for, a bundle's ``GPU``
becomes ``NPU``, fractions kept -- at the two choke points every actor and task creation
passes through (``ActorClass._remote``, ``RemoteFunction._remote``, where ``@ray.remote``
defaults and ``.options()`` are already merged) and in ``placement_group``.  No fake GPU
resource is ever advertised: that would double-book the chips.

The guard (a separate patch, so it still speaks when the rewrite is disabled) logs an
error naming the caller and the fix when a GPU request reaches Ray on a cluster without
a single GPU, and when a placement group asks for more NPUs than the cluster's alive nodes
have (in all, on one node, or packed strictly): its ``ready()`` would wait forever.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from .. import _effects

logger = logging.getLogger(__name__)

_GPU, _NPU = "GPU", "NPU"


def npu_bundle(bundle: Any) -> Any:
    """``{"GPU": n, ...}`` -> ``{"NPU": n, ...}`` (added to any NPU already there); others unchanged."""
    if not isinstance(bundle, dict) or _GPU not in bundle:
        return bundle
    out = dict(bundle)
    gpus = out.pop(_GPU)
    if gpus:
        out[_NPU] = out.get(_NPU, 0) + gpus
    return out


def npu_options(options: dict[str, Any]) -> None:
    """Rewrite actor/task options in place: ``num_gpus``, ``resources["GPU"]`` -> ``resources["NPU"]``."""
    gpus = options.pop("num_gpus", None) or 0
    resources = options.get("resources")
    if isinstance(resources, dict) and _GPU in resources:
        resources = npu_bundle(resources)
        options["resources"] = resources
    if gpus:
        resources = dict(resources or {})
        resources[_NPU] = resources.get(_NPU, 0) + gpus
        options["resources"] = resources


def remote_options(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    # ActorClass._remote(self, args=None, kwargs=None, **actor_options) and
    # RemoteFunction._remote(self, args=None, kwargs=None, **task_options): the options
    # arrive as keyword arguments here, defaults and .options() already merged.
    npu_options(kwargs)
    return wrapped(*args, **kwargs)


def placement_group_bundles(
    wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    # placement_group(bundles, strategy="PACK", name="", lifetime=None, ...)
    if "bundles" in kwargs:
        kwargs["bundles"] = list(map(npu_bundle, kwargs["bundles"]))
    elif args:
        args = (list(map(npu_bundle, args[0])), *args[1:])
    return wrapped(*args, **kwargs)


def bundles_in_place(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    # validate_placement_group(bundles=..., strategy=..., ...) runs inside placement_group on the
    # very list it then hands to the core worker.  A caller holding a copy of placement_group
    # bound before npu-compat activated (``from ray.util.placement_group import placement_group``
    # in a module nobody declared) reaches here with its GPU bundles still in: they are
    # rewritten in place, the only way left to reach that request.
    bundles = kwargs.get("bundles", args[0] if args else None)
    if isinstance(bundles, list):
        for bundle in bundles:
            if isinstance(bundle, dict) and _GPU in bundle:
                rewritten = npu_bundle(bundle)
                bundle.clear()
                bundle.update(rewritten)
    return wrapped(*args, **kwargs)


# -- the guard --------------------------------------------------------------------------------

#: The answer to "does the cluster have GPUs", asked once per activation (``deactivate()`` forgets it).
_HAS_GPU = "ray_resources.cluster_has_gpu"


def _no_gpu_in_cluster() -> bool:
    has_gpu = _effects.recall(_HAS_GPU)
    if has_gpu is None:
        import ray

        if not ray.is_initialized():
            return False
        has_gpu = _effects.remember(_HAS_GPU, bool(ray.cluster_resources().get(_GPU, 0)))
    return not has_gpu


def _caller() -> str:
    frame = sys._getframe(2)
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if not name.startswith(("ray", "npu_compat", "wrapt")):
            return f"{name}:{frame.f_code.co_name} (line {frame.f_lineno})"
        frame = frame.f_back  # type: ignore[assignment]
    return "unknown caller"


def _warn_gpu_request(what: str) -> None:
    if _no_gpu_in_cluster():
        logger.error(
            "npu_compat: %s asks Ray for %s on a cluster with no GPU resource; it will wait forever. "
            "Ask for resources={'NPU': n} instead, or remove ray.options / ray.placement_group from "
            "NPU_COMPAT_DISABLE so that npu-compat rewrites the request.",
            _caller(),
            what,
        )


def guard_remote(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    resources = kwargs.get("resources") or {}
    if kwargs.get("num_gpus") or (isinstance(resources, dict) and resources.get(_GPU)):
        _warn_gpu_request(f"num_gpus={kwargs.get('num_gpus')} resources={resources}")
    return wrapped(*args, **kwargs)


def guard_placement_group(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    bundles = kwargs.get("bundles", args[0] if args else [])
    if any(isinstance(b, dict) and b.get(_GPU) for b in bundles):
        _warn_gpu_request(f"placement-group bundles {bundles}")
    strategy = kwargs.get("strategy", args[1] if len(args) > 1 else "PACK")
    try:
        short = _npus_short(bundles, strategy)
    except Exception:  # noqa: BLE001 - the guard only speaks: it never stands in the request's way
        short = None
    if short:
        logger.error(
            "npu_compat: %s asks Ray for a placement group that can never be ready, so its ready() waits "
            "forever: %s. Ask for no more NPUs than the cluster has (in Trinity: cluster.node_num x "
            "cluster.gpu_per_node, which explorer and trainer share).",
            _caller(),
            short,
        )
    return wrapped(*args, **kwargs)


def _npus_short(bundles: Any, strategy: Any) -> str | None:
    """Why ``bundles`` can never be placed on this cluster's alive nodes, in NPUs; ``None`` when they
    can, or when it cannot be told (Ray not initialised, no NPU asked for).  An autoscaling cluster
    may still grow to fit: this is logged, never raised."""
    wanted = [float(b.get(_NPU, 0)) for b in bundles if isinstance(b, dict)]
    need = sum(wanted)
    if not need:
        return None
    import ray

    if not ray.is_initialized():
        return None
    per_node = [float(n["Resources"].get(_NPU, 0)) for n in ray.nodes() if n.get("Alive")]
    total, biggest = sum(per_node), max(per_node, default=0.0)
    asked = f"{len(wanted)} bundles, {need:g} NPU in all"
    if need > total:
        return f"{asked}, on a cluster of {total:g} NPU"
    if max(wanted) > biggest:
        return f"a bundle of {max(wanted):g} NPU ({asked}), and no node has more than {biggest:g}"
    if strategy == "STRICT_PACK" and need > biggest:
        return f"{asked} on one node (STRICT_PACK), and no node has more than {biggest:g}"
    return None


# -- reading the cluster ------------------------------------------------------------------------


def _npu_nodes(nodes: Any) -> Any:
    """``ray.nodes()`` as a module that sizes its work by GPUs should read it on an NPU cluster."""
    out = []
    for node in nodes():
        resources = node.get("Resources") or {}
        if _GPU not in resources and resources.get(_NPU):
            node = {**node, "Resources": {**resources, _GPU: resources[_NPU]}}
        out.append(node)
    return out


def ray_counting_npus(original: Any) -> Any:
    """Replacement factory for one upstream module's ``ray`` global: ``ray.nodes()`` reports each
    node's NPUs where that module looks for ``"GPU"``.  Only that module's reading changes: nothing
    is advertised to Ray, and every other attribute is the real one (a plain module copy, so
    attribute lookups cost what they did)."""
    import functools
    import types

    view = types.ModuleType(original.__name__, original.__doc__)
    view.__dict__.update(original.__dict__)
    view.__dict__["nodes"] = functools.wraps(original.nodes)(lambda: _npu_nodes(original.nodes))

    def __getattr__(name: str) -> Any:
        return getattr(original, name)

    view.__dict__["__getattr__"] = __getattr__
    return view
