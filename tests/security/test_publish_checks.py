"""The per-message publish checks keep their answers while memoising them.

docs/security.md (publish permissions) and docs/limits.md (subject rules): every publish is
checked for the caller's publish permission and for a valid subject. Both checks remember
answers per subject (they run per message on a PublishStream call); these tests pin that a
remembered answer is the computed one, that a refusal is never remembered as a pass, and that
a changed permission set does not inherit another's answers.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from raftstream.cluster.config import Limits
from raftstream.cluster.security import auth_values
from raftstream.cluster.security.auth import Permissions
from raftstream.cluster.security.limits import check_publish
from raftstream.engine.subjects import subject_matches
from raftstream.errors import InvalidArgumentError
from raftstream.proto import raftstream_pb2 as pb

SUBJECTS = ["orders.new", "orders.eu.paid", "billing.x", "orders", "a.b.c"]
FILTERS = [(">",), ("orders.>",), ("orders.*", "billing.>"), ()]


@pytest.mark.parametrize("filters", FILTERS)
def test_may_publish_answers_as_matching_does_asked_once_or_again(
    filters: tuple[str, ...],
) -> None:
    perms = Permissions(publish=filters)
    for _ in range(2):  # the second round is answered from the memo
        for subject in SUBJECTS:
            expected = any(subject_matches(f, subject) for f in filters)
            assert perms.may_publish(subject) is expected


def test_may_publish_memo_is_bounded_and_answers_stay_right(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(auth_values, "PUBLISH_PERMISSION_MEMO_ENTRIES_MAX", 3)
    perms = Permissions(publish=("orders.>",))
    for i in range(10):
        assert perms.may_publish(f"orders.{i}")
        assert not perms.may_publish(f"other.{i}")
        assert len(perms._publish_memo) <= 3


def test_a_changed_permission_set_does_not_inherit_answers() -> None:
    wide = Permissions(publish=("orders.>",))
    assert wide.may_publish("orders.new")
    narrow = replace(wide, publish=("billing.>",))
    assert not narrow.may_publish("orders.new")
    assert narrow == Permissions(publish=("billing.>",))  # the memo is not part of the value


def test_an_invalid_subject_is_refused_every_time() -> None:
    limits = Limits()
    check_publish(pb.PublishRequest(subject="orders.new"), limits)
    check_publish(pb.PublishRequest(subject="orders.new"), limits)  # memoised pass
    for _ in range(2):  # a refusal raises each time: never remembered
        with pytest.raises(InvalidArgumentError) as refused:
            check_publish(pb.PublishRequest(subject="orders..new"), limits)
        assert refused.value.details["field"] == "subject"
