"""Issue 39, finding 2: subject-list overlap checks were quadratic, on the event loop, and
ran before the permission check.

What closes the class (docs/limits.md, "Streams and consumers in the cluster";
docs/security.md):

- a create or update authorizes on the names first (``manage`` on the stream a config
  names, ``read`` on a consumer's stream) and only then parses the config;
- a request holds at most ``STREAM_SUBJECTS_MAX`` subjects and ``CONSUMER_FILTER_SUBJECTS_MAX``
  filter subjects, refused naming the field and the rule (stored definitions with more
  still load: the bound is the request's, never apply's or restore's);
- the overlap check (``first_overlap``, ``OverlapIndex``) costs O(the list's tokens), and
  answers what the pairwise check answered: the property tests below compare them.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raftstream.cluster.security.auth import Caller, Permissions, acting_as
from raftstream.cluster.security.limits import (
    CONSUMER_FILTER_SUBJECTS_MAX,
    STREAM_SUBJECTS_MAX,
    check_consumer_filter_count,
    check_stream_subject_count,
)
from raftstream.cluster.services.consumers import ConsumerServicer
from raftstream.cluster.services.streams import _authorized_config
from raftstream.engine.consumer_config import ConsumerConfig
from raftstream.engine.stream_config import StreamConfig, check_no_overlap
from raftstream.engine.subjects import OverlapIndex, first_overlap, subjects_collide
from raftstream.errors import InvalidArgumentError, PermissionDeniedError

_TOKENS = st.sampled_from(["a", "b", "c", "*"])


@st.composite
def _filters(draw: Any) -> str:
    tokens = draw(st.lists(_TOKENS, min_size=1, max_size=4))
    if draw(st.booleans()) and draw(st.booleans()):
        tokens[-1] = ">"
    return ".".join(tokens)


def _pairwise(subjects: list[str]) -> tuple[str, str] | None:
    """The check this replaces: every pair, in order."""
    for i, a in enumerate(subjects):
        for b in subjects[i + 1 :]:
            if subjects_collide(a, b):
                return a, b
    return None


@settings(max_examples=500, deadline=None)
@given(st.lists(_filters(), max_size=8))
def test_first_overlap_answers_what_the_pairwise_check_answered(subjects: list[str]) -> None:
    assert first_overlap(subjects) == _pairwise(subjects)


@settings(max_examples=300, deadline=None)
@given(st.lists(_filters(), max_size=6), _filters())
def test_an_index_query_finds_exactly_the_colliding_filters(
    subjects: list[str], query: str
) -> None:
    mask = OverlapIndex(subjects).colliding(query)
    assert [bool(mask >> j & 1) for j in range(len(subjects))] == [
        subjects_collide(query, s) for s in subjects
    ]


@settings(max_examples=200, deadline=None)
@given(st.lists(_filters(), min_size=1, max_size=4, unique=True), st.lists(_filters(), max_size=4))
def test_check_no_overlap_refuses_exactly_when_a_pair_collides(
    mine: list[str], theirs: list[str]
) -> None:
    if _pairwise(mine) is not None:
        return  # not a valid stream of its own
    others = [StreamConfig(name="O", subjects=tuple(theirs))] if theirs else []
    expected = any(subjects_collide(a, b) for a in mine for b in theirs)
    try:
        check_no_overlap(StreamConfig(name="M", subjects=tuple(mine)), others)
    except InvalidArgumentError as refused:
        assert expected and refused.field == "subjects"
    else:
        assert not expected


def test_a_pathological_list_at_the_bound_is_one_check() -> None:
    """The shape that costs a trie or a pairwise check the most (every wildcard pair
    agrees but on one token) is answered, and its first pair is the pairwise one's."""
    half = STREAM_SUBJECTS_MAX // 2
    subjects = [f"{j}.*.{j}.b" for j in range(half)] + [f"*.{k}.*.a" for k in range(half)]
    assert first_overlap(subjects) is None
    subjects.append("0.x.0.b")
    assert first_overlap(subjects) == ("0.*.0.b", "0.x.0.b")


def test_too_many_subjects_or_filters_are_refused_naming_the_field_and_rule() -> None:
    check_stream_subject_count({"subjects": [f"s.{i}" for i in range(STREAM_SUBJECTS_MAX)]})
    with pytest.raises(InvalidArgumentError) as refused:
        check_stream_subject_count({"subjects": ["s"] * (STREAM_SUBJECTS_MAX + 1)})
    assert refused.value.field == "subjects"
    assert "stream_subjects_max" in refused.value.rule
    filters = [f"f.{i}" for i in range(CONSUMER_FILTER_SUBJECTS_MAX)]
    check_consumer_filter_count({"filter_subjects": filters})
    with pytest.raises(InvalidArgumentError) as refused:
        check_consumer_filter_count({"filter_subjects": [*filters, "f.x"]})
    assert refused.value.field == "filter_subjects"
    assert "consumer_filter_subjects_max" in refused.value.rule


def test_a_stream_config_over_the_bound_is_refused_before_it_is_parsed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(StreamConfig, "from_dict", _never)
    raw = {"name": "S", "subjects": [f"s.{i}" for i in range(STREAM_SUBJECTS_MAX + 1)]}
    with pytest.raises(InvalidArgumentError) as refused:
        _authorized_config(json.dumps(raw), None)
    assert refused.value.field == "subjects"


def _never(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("the config was parsed (and its subjects checked) before authorizing")


_READS_X_ONLY = Caller(
    account="A",
    user="u",
    permissions=Permissions(publish=(), read=("X",), manage=("X",)),
    system=False,
)


def test_a_stream_create_without_manage_is_denied_before_its_config_is_parsed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(StreamConfig, "from_dict", _never)
    raw = {"name": "S", "subjects": [f"s.{i}.*" for i in range(5_000)]}
    with acting_as(_READS_X_ONLY), pytest.raises(PermissionDeniedError):
        _authorized_config(json.dumps(raw), None)


def test_a_consumer_create_without_read_is_denied_before_its_filters_are_checked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 39's request: 5,000 filter_subjects on a stream the user may not read (and
    that does not exist). PERMISSION_DENIED, and the config is never parsed."""
    import raftstream.engine.consumer_config as consumer_config

    monkeypatch.setattr(ConsumerConfig, "from_dict", _never)
    monkeypatch.setattr(consumer_config, "first_overlap", _never)
    raw = {"durable_name": "C", "filter_subjects": [f"f.{i}.*" for i in range(5_000)]}
    svc = ConsumerServicer(None)  # type: ignore[arg-type]
    with acting_as(_READS_X_ONLY), pytest.raises(PermissionDeniedError):
        svc._authorized_config(None, "A", "NOPE", json.dumps(raw))
