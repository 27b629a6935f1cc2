"""The patch sets: one module per upstream target, declared in :mod:`._catalog`.

A patch module never imports its target at top level; the engine imports the patch
module only once the target itself has been imported on an NPU host.
"""
