"""trinity.utils.distributed on Ascend: the weight-sync process group over HCCL.

``trinity.utils.distributed.init_process_group`` (identical in trinity-rft 0.5.2 and
0.6.0) opens with ``assert backend == "nccl"`` and ``assert is_nccl_available()`` and
then builds a group from torch.distributed's private helpers.  No wrapper can get a call
past those asserts without making ``is_nccl_available()`` lie process-wide, so this patch
replaces the function: for ``nccl`` (what user configs and Trinity's callers pass) and
``hccl`` it runs the same steps with the ``hccl`` backend and an ``npu`` device id, using
the very helpers the upstream module imported; any other backend goes to the original,
which refuses it as before.  The copies bound by ``from trinity.utils.distributed import
init_process_group`` (0.5.2: vllm_worker, fsdp_workers, megatron_workers) are repointed.
"""

from __future__ import annotations

import functools
import sys
from datetime import timedelta
from typing import Any

from .torch_distributed import npu_device

_COLLECTIVE = frozenset({"nccl", "hccl"})


def hccl_init_process_group(original: Any) -> Any:
    """Replacement factory for ``trinity.utils.distributed:init_process_group``."""
    upstream = sys.modules[original.__module__]

    @functools.wraps(original)
    def init_process_group(
        host: str,
        port: int,
        group_name: str,
        backend: Any = "nccl",
        timeout: float | None = None,
        world_size: int = -1,
        rank: int = -1,
        pg_options: Any | None = None,
        device_id: Any | None = None,
    ) -> Any:
        if str(backend).lower() not in _COLLECTIVE:
            return original(host, port, group_name, backend, timeout, world_size, rank, pg_options, device_id)
        helpers = upstream.__dict__
        init_method = (
            f"tcp://[{host}]:{port}" if helpers["is_ipv6_address"](ip_str=host) else f"tcp://{host}:{port}"
        )
        pg_timeout = helpers["default_pg_timeout"] if timeout is None else timedelta(seconds=timeout)
        store, rank, world_size = next(
            helpers["rendezvous"](init_method, rank, world_size, timeout=pg_timeout)
        )
        store.set_timeout(pg_timeout)
        pg, _ = helpers["_new_process_group_helper"](
            group_size=world_size,
            group_rank=rank,
            global_ranks_in_group=[],
            backend=helpers["Backend"]("hccl"),
            store=helpers["PrefixStore"](group_name, store),
            group_name=group_name,
            timeout=pg_timeout,
            device_id=npu_device(device_id),
            backend_options=pg_options,
        )
        helpers["_world"].pg_group_ranks[pg] = {i: i for i in range(world_size)}
        return pg

    return init_process_group
