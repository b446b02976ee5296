"""Request schemas: strict integers, text Postgres can store, whole-string patterns."""

from __future__ import annotations

import pytest
from marshmallow import ValidationError

from service.http.schemas import requests as schemas


def _errors(schema, data):
    with pytest.raises(ValidationError) as e:
        schema.load(data)
    return e.value.messages


def test_take_request_defaults_and_bounds():
    assert schemas.TakeRequest().load({"metric": "urls"}) == {"metric": "urls", "units": 1}
    assert schemas.TakeRequest().load(
        {"metric": "urls", "units": 2**31 - 1, "idempotency_key": "k" * 255}
    ) == {
        "metric": "urls",
        "units": 2**31 - 1,
        "idempotency_key": "k" * 255,
    }


@pytest.mark.parametrize("units", ["1", 1.0, 1.5, True, False, None, 0, -1, 2**31, [1], {"n": 1}])
def test_units_must_be_a_json_integer_in_range(units):
    assert set(_errors(schemas.TakeRequest(), {"metric": "urls", "units": units})) == {"units"}


@pytest.mark.parametrize("key", ["", "k" * 256, "a\x00", "\ud800", 5])
def test_idempotency_key_refusals(key):
    assert set(_errors(schemas.TakeRequest(), {"metric": "urls", "idempotency_key": key})) == {
        "idempotency_key"
    }


def test_unknown_fields_are_refused():
    assert set(_errors(schemas.TakeRequest(), {"metric": "urls", "extra": 1})) == {"extra"}
    assert set(_errors(schemas.OverridePut(), {"limit": 1, "metric": "urls"})) == {"metric"}


def test_override_limit_is_null_or_a_non_negative_bigint():
    assert schemas.OverridePut().load({"limit": None}) == {"limit": None}
    assert schemas.OverridePut().load({"limit": 0}) == {"limit": 0}
    assert schemas.OverridePut().load({"limit": 2**63 - 1}) == {"limit": 2**63 - 1}
    for bad in (-1, 2**63, "1", 1.0, True):
        assert set(_errors(schemas.OverridePut(), {"limit": bad})) == {"limit"}
    assert set(_errors(schemas.OverridePut(), {})) == {"limit"}


def test_period_and_account_id_patterns_match_the_whole_string():
    assert set(_errors(schemas.UsageQuery(), {"metric": "urls", "period": "2024-01\n"})) == {"period"}
    assert set(_errors(schemas.LedgerQuery(), {"account_id": "acc\n"})) == {"account_id"}
    assert schemas.UsageQuery().load({"metric": "urls", "period": "2024-01"})["period"] == "2024-01"
