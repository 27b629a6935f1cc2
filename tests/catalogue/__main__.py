"""Print the break catalogue: map row -> test ids -> status.  ``python -m tests.catalogue``."""

from tests.catalogue.rows import NOT_YET_DRIVEN, ROWS

TEST = "tests/catalogue/test_catalogue.py"


def main() -> None:
    print("| row | trinity | trainer | sev | upstream | red test | green twin | status |")
    print("|---|---|---|---|---|---|---|---|")
    for row in ROWS:
        status = (
            "green: patch applied" if row.fixed else f"twin expected to fail until issue {row.green_issue}"
        )
        print(
            f"| {row.id} | {row.trinity} | {row.trainer} | {row.severity} | `{row.where}` | "
            f"`{TEST}::test_red[{row.id}]` | `{TEST}::test_green[{row.id}]` | {status} |"
        )
    for row_id, why in NOT_YET_DRIVEN.items():
        print(f"| {row_id} | | | | | — | — | no catalogue probe: {why} |")


main()
