"""The link error of stream info is a plain sentence (docs/mirrors.md, "Stream info":
Error): a session end is its own message, a public SDK error keeps its class name, and a
private class name (a leading underscore) never shows; a refused copy names the setting."""

from __future__ import annotations

from raftstream import errors
from raftstream.cluster.mirrors.link import _refusal, _SessionEnd, describe_error


class _Private(Exception):
    pass


def test_a_session_end_is_its_message_without_a_class_name() -> None:
    assert describe_error(_SessionEnd("copy refused: x")) == "copy refused: x"


def test_a_private_class_name_never_shows() -> None:
    assert describe_error(_Private("went wrong")) == "went wrong"
    assert describe_error(_Private()) == "the link's session ended"


def test_a_public_error_keeps_its_class_name() -> None:
    exc = errors.UnavailableError("cannot connect to 127.0.0.1:1")
    assert describe_error(exc) == "UnavailableError: cannot connect to 127.0.0.1:1"
    assert describe_error(TimeoutError()) == "TimeoutError"


def test_a_refused_copy_names_the_stream_setting() -> None:
    full = errors.LimitError("maximum messages exceeded", limit="max_msgs")
    assert _refusal(full) == (
        "copy refused: maximum messages exceeded (the stream's max_msgs with discard new)"
    )
    big = errors.LimitError("message size exceeds maximum allowed", limit="max_msg_size")
    assert _refusal(big).endswith("(the stream's max_msg_size)")
    stale = errors.PreconditionError("copy of O 5 expects 3 stored last; 4 is")
    assert _refusal(stale) == "copy refused: copy of O 5 expects 3 stored last; 4 is"
