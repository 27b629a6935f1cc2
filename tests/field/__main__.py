"""Print ``docs/field-failures.md`` from the field-failure catalogue: ``python -m tests.field > docs/field-failures.md``."""

from tests.field.page import render

print(render(), end="")
