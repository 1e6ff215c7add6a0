"""``check_update`` reports a refused change before the new config's own rules.

A user adding a mirror to a stream with subjects was told ``subjects: a mirror has no
subjects of its own``; the rule they broke is ``mirror: cannot be added to an existing
stream`` (JetStream: "stream mirror configuration can not be updated"). The pinned
behaviour: when an update breaks an immutable or one-way rule, that rule is the error, even
when the change also leaves the new config breaking a rule of its shape.
"""

from __future__ import annotations

from typing import Any

import pytest

from raftstream.engine.stream_config import StreamConfig, check_update
from raftstream.errors import InvalidArgumentError


def _cfg(raw: dict[str, Any]) -> StreamConfig:
    return StreamConfig.from_dict(raw).validate()


def _updated(old: StreamConfig, **change: Any) -> StreamConfig:
    """``old`` with ``change`` over its JSON (as ``stream edit`` builds an update)."""
    return StreamConfig.from_dict({**old.to_dict(), **change})


PLAIN = _cfg({"name": "EU", "subjects": ["eu.>"]})
SOURCING = _cfg({"name": "AGG", "sources": [{"name": "EU"}]})
MIRROR = _cfg({"name": "M", "mirror": {"name": "ORDERS"}})
SEALED = _cfg({"name": "S", "subjects": ["s.>"], "sealed": True})

CASES = [
    # (old, change, field, rule): the change breaks `rule`; it also breaks a shape rule.
    (PLAIN, {"mirror": {"name": "ORDERS"}}, "mirror", "cannot be added to an existing stream"),
    (SOURCING, {"mirror": {"name": "ORDERS"}}, "mirror", "cannot be added to an existing stream"),
    (
        MIRROR,
        {"mirror": {"name": "P", "subject_transforms": [{"src": "a.>", "dest": "b.>"}]}},
        "mirror",
        "cannot be changed (remove it to promote the mirror)",
    ),
    (MIRROR, {"mirror": {"name": ""}}, "mirror", "cannot be changed"),
    (MIRROR, {"first_seq": 5}, "first_seq", "cannot be changed by an update"),
    (PLAIN, {"max_consumers": -5}, "max_consumers", "cannot be changed by an update"),
    (PLAIN, {"name": "E.U"}, "name", "cannot be changed by an update"),
    (
        SEALED,
        {"sealed": False, "allow_rollup_hdrs": True},
        "sealed",
        "a sealed stream cannot be unsealed",
    ),
]


@pytest.mark.parametrize(("old", "change", "field", "rule"), CASES)
def test_a_refused_change_is_reported_before_the_shape_it_causes(
    old: StreamConfig, change: dict[str, Any], field: str, rule: str
) -> None:
    new = _updated(old, **change)
    with pytest.raises(InvalidArgumentError):
        new.validate()  # the premise: the new config breaks a rule of its own too
    with pytest.raises(InvalidArgumentError) as info:
        check_update(old, new)
    assert info.value.field == field
    assert info.value.rule.startswith(rule)


def test_adding_a_mirror_names_mirror_whatever_else_the_config_holds() -> None:
    """The CLI's ``stream edit EU --mirror ORDERS``: current config (subjects, limits) plus
    a mirror."""
    new = _updated(PLAIN, mirror={"name": "ORDERS"}, max_msgs=10, sources=[{"name": "X"}])
    with pytest.raises(InvalidArgumentError) as info:
        check_update(PLAIN, new)
    assert (info.value.field, info.value.rule) == (
        "mirror",
        "cannot be added to an existing stream",
    )
    assert str(info.value) == "mirror: cannot be added to an existing stream"


def test_an_allowed_change_still_meets_the_new_configs_rules() -> None:
    """Change rules first does not skip validation: a promotion given a bad subject fails
    on ``subjects``."""
    with pytest.raises(InvalidArgumentError) as info:
        check_update(MIRROR, StreamConfig(name="M", subjects=("a..b",)))
    assert info.value.field == "subjects"


def test_promoting_a_mirror_keeps_its_name_as_subject_or_takes_the_given_ones() -> None:
    """Removing the mirror (JetStream: promotion) is allowed; with no subjects the stream
    captures its own name, as any stream without subjects, mirror or sources."""
    assert check_update(MIRROR, _updated(MIRROR, mirror=None)).subjects == ("M",)
    given = check_update(MIRROR, _updated(MIRROR, mirror=None, subjects=["m.>"]))
    assert (given.mirror, given.subjects) == (None, ("m.>",))
