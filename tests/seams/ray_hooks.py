"""A job's own ``worker_process_setup_hook``, importable by Ray workers of the test clusters."""

import os
import sys


def mark() -> None:
    engine = sys.modules.get("npu_compat._activation")
    os.environ["USER_HOOK_RAN"] = (
        "after-activation" if engine and engine._state.active else "before-activation"
    )
