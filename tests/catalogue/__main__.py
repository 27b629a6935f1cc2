"""Print ``docs/break-map.md`` from the break catalogue: ``python -m tests.catalogue > docs/break-map.md``."""

from tests.catalogue.page import render

print(render(), end="")
