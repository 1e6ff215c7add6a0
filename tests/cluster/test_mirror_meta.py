"""The meta group refuses mirror/source cycles (issue 7; ``MetaState`` apply, so every
replica refuses the same entry): an add or an update that would make streams of one
account copy each other in a loop is ``InvalidArgumentError`` naming ``mirror`` or
``sources``, and changes nothing. Another account's streams are not part of the graph."""

from __future__ import annotations

from raftstream.cluster.meta.state import StreamAdded, StreamUpdated
from raftstream.engine.stream_source import StreamSource
from raftstream.errors import InvalidArgumentError
from tests.support.meta import add_stream, field_of, refused, state_with, update_stream


def _src(*names: str) -> tuple[StreamSource, ...]:
    return tuple(StreamSource(name=n) for n in names)


def test_adding_the_stream_that_closes_a_cycle_is_refused() -> None:
    state = state_with(
        add_stream("A", "a.>", sources=_src("B")),
        add_stream("B", "b.>", sources=_src("C")),
    )
    err = refused(state, add_stream("C", mirror=StreamSource(name="A")), InvalidArgumentError)
    assert field_of(err) == "mirror"
    assert "C -> A -> B -> C" in str(err)
    ok = state.apply(add_stream("C", mirror=StreamSource(name="D")))
    assert isinstance(ok, StreamAdded)


def test_an_update_that_closes_a_cycle_is_refused() -> None:
    state = state_with(
        add_stream("A", "a.>", sources=_src("B")),
        add_stream("B", "b.>"),
    )
    err = refused(state, update_stream("B", "b.>", prior=("n1",), sources=_src("A")),
                  InvalidArgumentError)  # fmt: skip
    assert field_of(err) == "sources"
    ok = state.apply(update_stream("B", "b.>", prior=("n1",), sources=_src("C")))
    assert isinstance(ok, StreamUpdated)


def test_streams_of_another_account_do_not_form_a_cycle() -> None:
    state = state_with(add_stream("A", "a.>", sources=_src("B"), account="other"))
    ok = state.apply(add_stream("B", "b.>", sources=_src("A")))
    assert isinstance(ok, StreamAdded)
