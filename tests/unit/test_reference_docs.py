"""The docs' reference tables match the code they are made from (``tests/support/
reference_docs.py``; the chart's RBAC table is checked with the chart's tests, which have helm)."""

from __future__ import annotations

import pytest

from tests.support.reference_docs import TABLES, table_in


@pytest.mark.parametrize("name", sorted(TABLES))
def test_the_table_is_what_the_code_makes(name: str) -> None:
    page, make = TABLES[name]
    assert table_in(page, name) == make(), (
        f"{page.name}'s {name} table is stale: run python -m tests.support.write_reference_docs"
    )
