"""The statements the SQLite and PostgreSQL stores share (`h3core.adapters.store._sql`): one text,
each driver's placeholders."""

from __future__ import annotations

from h3core.adapters.store._sql import POSTGRES, SQLITE


def test_a_listing_query_holds_the_filters_given_in_the_drivers_placeholders():
    sql, params = SQLITE.jobs_page("queued", 40, None, False, 5)
    assert sql == "SELECT queue_order, state FROM jobs WHERE status = ? AND queue_order < ? ORDER BY queue_order DESC LIMIT ?"
    assert params == ("queued", 40, 5)
    sql, params = POSTGRES.jobs_page(None, None, 7, True, 3)
    assert sql == "SELECT queue_order, state FROM jobs WHERE queue_order > %s ORDER BY queue_order ASC LIMIT %s"
    assert params == (7, 3)


def test_postgres_statements_are_sqlites_with_its_placeholders_bytewise_order_and_json():
    for name, sqlite in vars(SQLITE).items():
        postgres = getattr(POSTGRES, name)
        if name in ("placeholder", "artifact_path"):
            continue
        assert "?" not in postgres, name
        postgres = postgres.replace(POSTGRES.artifact_path, "<path>")
        assert postgres.replace(' COLLATE "C"', "") == sqlite.replace(SQLITE.artifact_path, "<path>").replace("?", "%s"), name
    assert POSTGRES.ids_starting.endswith('ORDER BY job_id COLLATE "C" LIMIT %s')
