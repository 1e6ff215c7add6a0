"""Mirror and source configuration (``engine/stream_source.py``, ``stream_config.py``).

Pins the rules of issue 7 and JetStream's: a mirror has no subjects, sources or first_seq
beside it; filter_subject and subject_transforms are exclusive; names are valid stream
names; a stream cannot copy itself; the mirror setting can be removed (promotion) but not
added or changed; a cycle of mirrors/sources in an account is refused naming the field.
Every refusal is ``InvalidArgumentError(field, rule)``.
"""

from __future__ import annotations

from typing import Any

import pytest

from raftstream.engine.stream_config import (
    StreamConfig,
    check_no_cycle,
    check_update,
)
from raftstream.engine.stream_source import ExternalStream, StreamSource, find_cycle
from raftstream.errors import InvalidArgumentError


def _cfg(raw: dict[str, Any]) -> StreamConfig:
    return StreamConfig.from_dict(raw).validate()


def test_a_mirror_captures_no_subject_and_round_trips_as_jetstream_json() -> None:
    cfg = _cfg({"name": "M", "mirror": {"name": "O", "opt_start_seq": 5}})
    assert cfg.subjects == ()
    raw = cfg.to_dict()
    assert raw["mirror"] == {"name": "O", "opt_start_seq": 5}
    assert "sources" not in raw
    assert StreamConfig.from_dict(raw).validate() == cfg


def test_sources_round_trip_with_external_transforms_and_start_time() -> None:
    raw = {
        "name": "S",
        "sources": [
            {"name": "A", "filter_subject": "a.>"},
            {"name": "B", "subject_transforms": [{"src": "b.*", "dest": "x.$1"}]},
            {"name": "A", "external": {"api": ["127.0.0.1:4222"]}},
            {"name": "C", "opt_start_time": "2024-01-01T00:00:00Z"},
        ],
    }
    cfg = _cfg(raw)
    assert cfg.subjects == ()  # JetStream: a sourcing stream captures nothing by default
    assert cfg.sources[2].external == ExternalStream(api=("127.0.0.1:4222",))
    assert cfg.sources[1].stored_subject("b.q") == "x.q"
    assert cfg.sources[1].stored_subject("c.q") == "c.q"
    assert StreamConfig.from_dict(cfg.to_dict()).validate() == cfg


@pytest.mark.parametrize(
    "raw,field",
    [
        ({"name": "M", "mirror": {"name": "O"}, "subjects": ["a"]}, "subjects"),
        ({"name": "M", "mirror": {"name": "O"}, "sources": [{"name": "P"}]}, "sources"),
        ({"name": "M", "mirror": {"name": "O"}, "first_seq": 10}, "first_seq"),
        ({"name": "M", "mirror": {"name": "M"}}, "mirror.name"),
        ({"name": "M", "mirror": {"name": "a.b"}}, "mirror.name"),
        ({"name": "M", "mirror": {"name": ""}}, "mirror.name"),
        ({"name": "M", "mirror": {"nme": "O"}}, "mirror.nme"),
        ({"name": "S", "sources": [{"name": "S"}]}, "sources[0].name"),
        ({"name": "S", "sources": [{"name": "O"}, {"name": "O"}]}, "sources[1]"),
        (
            {
                "name": "S",
                "sources": [
                    {"name": "O", "filter_subject": "a", "subject_transforms": [{"src": "a"}]}
                ],
            },
            "sources[0].filter_subject",
        ),
        ({"name": "S", "sources": [{"name": "O", "filter_subject": "a..b"}]}, "filter_subject"),
        ({"name": "S", "sources": [{"name": "O", "opt_start_seq": -1}]}, "opt_start_seq"),
        (
            {"name": "S", "sources": [{"name": "O", "opt_start_seq": 2, "opt_start_time": 5}]},
            "sources[0].opt_start_seq",
        ),
        ({"name": "S", "sources": [{"name": "O", "external": {"api": []}}]}, "external.api"),
        (
            {"name": "S", "sources": [{"name": "O", "external": {"api": ["nohost"]}}]},
            "external.api",
        ),
        ({"name": "S", "sources": {"name": "O"}}, "sources"),
    ],
)
def test_bad_mirror_and_source_configs_are_refused_naming_the_field(
    raw: dict[str, Any], field: str
) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        _cfg(raw)
    assert field in info.value.field


def test_the_same_name_in_another_cluster_is_another_origin() -> None:
    """A stream may source a namesake of another cluster, and itself's namesake there."""
    ext = {"api": ["10.0.0.1:4222"]}
    cfg = _cfg({"name": "S", "sources": [{"name": "S", "external": ext}, {"name": "O"}]})
    assert len(cfg.sources) == 2


def test_removing_the_mirror_promotes_it_adding_or_changing_one_is_refused() -> None:
    mirror = _cfg({"name": "M", "mirror": {"name": "O"}})
    promoted = check_update(mirror, StreamConfig(name="M"))
    assert promoted.mirror is None and promoted.subjects == ("M",)
    plain = _cfg({"name": "M"})
    with pytest.raises(InvalidArgumentError) as added:
        check_update(plain, StreamConfig(name="M", mirror=StreamSource(name="O")))
    assert added.value.field == "mirror"
    with pytest.raises(InvalidArgumentError) as changed:
        check_update(mirror, StreamConfig(name="M", mirror=StreamSource(name="P")))
    assert changed.value.field == "mirror"


def test_sources_may_change_on_update() -> None:
    before = _cfg({"name": "S", "sources": [{"name": "A"}]})
    after = check_update(before, StreamConfig(name="S", sources=(StreamSource(name="B"),)))
    assert [s.name for s in after.sources] == ["B"]


def test_a_cycle_in_the_account_is_refused_naming_the_field() -> None:
    """A -> B -> C -> A would copy forever: the stream closing the cycle is refused."""
    a = _cfg({"name": "A", "sources": [{"name": "B"}]})
    b = _cfg({"name": "B", "sources": [{"name": "C"}]})
    c_sources = _cfg({"name": "C", "sources": [{"name": "A"}]})
    with pytest.raises(InvalidArgumentError) as info:
        check_no_cycle(c_sources, [a, b])
    assert info.value.field == "sources"
    assert "C -> A -> B -> C" in info.value.rule
    c_mirror = _cfg({"name": "C", "mirror": {"name": "A"}})
    with pytest.raises(InvalidArgumentError) as mirror_info:
        check_no_cycle(c_mirror, [a, b])
    assert mirror_info.value.field == "mirror"


def test_no_cycle_for_chains_diamonds_and_external_links() -> None:
    a = _cfg({"name": "A", "sources": [{"name": "B"}, {"name": "C"}]})
    b = _cfg({"name": "B", "sources": [{"name": "D"}]})
    c = _cfg({"name": "C", "mirror": {"name": "D"}})
    check_no_cycle(_cfg({"name": "D"}), [a, b, c])  # a diamond, no cycle
    # D sourcing an A of another cluster is not this cluster's A.
    d_ext = _cfg({"name": "D", "sources": [{"name": "A", "external": {"api": ["h:1"]}}]})
    check_no_cycle(d_ext, [a, b, c])


def test_find_cycle_returns_the_path() -> None:
    links = {"A": ("B",), "B": ("C", "D"), "D": ("A",), "C": ()}
    assert find_cycle("A", links) == ("A", "B", "D", "A")
    assert find_cycle("C", links) is None
