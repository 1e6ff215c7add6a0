"""Issue 39, finding 9: a deeply nested ``config_json`` answered INTERNAL (RecursionError)
and logged a traceback per request. It is INVALID_ARGUMENT naming ``config_json`` and the
depth rule (docs/limits.md), whether the nesting is too deep for the JSON parser itself or
only for the bound."""

from __future__ import annotations

import json

import pytest

from raftstream.cluster.services.convert import CONFIG_JSON_DEPTH_MAX, parse_json
from raftstream.errors import InvalidArgumentError


def _nested(levels: int) -> dict[str, object]:
    inner: dict[str, object] = {}
    for _ in range(levels - 1):
        inner = {"k": inner}
    return inner


def _refused(text: str) -> None:
    with pytest.raises(InvalidArgumentError) as refused:
        parse_json(text)
    assert refused.value.field == "config_json"
    assert "config_json_depth_max" in refused.value.rule


def test_an_array_nested_past_the_parser_is_refused_naming_config_json() -> None:
    _refused('{"name": "S", "x": ' + "[" * 100_000 + "]" * 100_000 + "}")


def test_metadata_nested_past_the_bound_is_refused_naming_config_json() -> None:
    # The document is one level more than its metadata.
    _refused(json.dumps({"name": "S", "metadata": _nested(CONFIG_JSON_DEPTH_MAX)}))


def test_nesting_within_the_bound_is_parsed() -> None:
    text = json.dumps({"name": "S", "metadata": _nested(CONFIG_JSON_DEPTH_MAX - 1)})
    assert parse_json(text)["name"] == "S"
