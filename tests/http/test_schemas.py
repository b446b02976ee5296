"""The hot responses' short dump (schemas.Flat) gives exactly what marshmallow's own dump gives."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from marshmallow import Schema, fields

from service.http.schemas import responses as s
from service.quota.takes import Release, Take

# Every response instance whose dump is the short one (the others are marshmallow's own).
FLAT = {name: v for name, v in vars(s).items() if isinstance(v, s.Flat) and v._names is not None}
SAMPLE = {fields.Integer: 7, fields.String: "pro", fields.Boolean: True}


def _samples(schema: s.Flat) -> list[dict[str, Any]]:
    """Every field set; every nullable one null; one field left out."""
    full = {n: SAMPLE[type(f)] for n, f in schema.dump_fields.items()}
    nulls = {n: (None if f.allow_none else full[n]) for n, f in schema.dump_fields.items()}
    partial = dict(list(full.items())[1:])
    return [full, nulls, partial]


def test_the_hot_responses_take_the_short_dump() -> None:
    # Were they to fall back to marshmallow, the comparisons below would compare it with itself.
    for name in ("TAKE", "RELEASED", "NOT_RELEASED", "USAGE", "WEBHOOK_RECEIPT"):
        assert FLAT[name]._names == tuple(FLAT[name].dump_fields), name


@pytest.mark.parametrize("name", sorted(FLAT))
def test_short_dump_matches_marshmallow(name: str) -> None:
    schema = FLAT[name]
    for data in _samples(schema):
        for obj in (data, SimpleNamespace(**data)):
            assert schema.dump(obj) == Schema.dump(schema, obj)


def test_domain_results_dump_the_same() -> None:
    take = Take(
        take_id=9, metric="urls", units=2, used=5, limit=None, counter_period="2026-11", limit_source="plan"
    )
    capped = Take(
        take_id=9, metric="urls", units=2, used=5, limit=3, counter_period="2026-11", limit_source="plan"
    )
    released = Release(
        released=True, take_id=9, metric="urls", units=2, used=3, limit=10, counter_period="2026-11"
    )
    refused = Release(released=False, take_id=9, reason="already_released")
    for schema, obj in ((s.TAKE, take), (s.TAKE, capped), (s.RELEASED, released), (s.NOT_RELEASED, refused)):
        assert schema.dump(obj) == Schema.dump(schema, obj)
    assert s.TAKE.dump(capped)["remaining"] == 0


def test_a_field_that_is_not_plain_falls_back_to_marshmallow() -> None:
    class Nested(s.Flat):
        when = fields.DateTime()
        n = fields.Integer()

    class Renamed(s.Flat):
        n = fields.Integer(data_key="count")

    assert Nested()._names is None
    assert Renamed()._names is None
    assert Renamed().dump({"n": 3}) == {"count": 3}
