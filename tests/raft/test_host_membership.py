"""RaftHost membership changes and leadership transfer, on the in-memory twins.

Properties checked: membership changes one server at a time (Raft thesis §4.1); a node added
as a non-voting learner catches up (here by the leader's snapshot, as a node joining an
existing group always does, §7) before it is promoted to voter; a removed voter stops
counting (the group keeps committing with the new majority); leadership transfer hands the
group to the chosen voter (thesis §3.10); a node started empty never campaigns; a group's
bootstrap snapshot is durable across a restart.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

import pytest

from raftstream.raft.core.errors import ConfChangePendingError
from raftstream.raft.host import RaftHost
from raftstream.raft.storage import GroupWrite, LmdbLogStorage, MemoryLogStorage
from raftstream.raft.transport import MemoryNetwork, MemoryTransport
from raftstream.raft.types import ConfChange, ConfChangeType, Role
from tests.support.polling import until
from tests.support.raft_hosts import (
    CFG,
    STALL_CFG,
    ListMachine,
    PermitStorage,
    acks_waiting,
    elected,
    run,
)

GROUP = "g"
# STALL_CFG (tests/support/raft_hosts.py): elections slow enough that a leader whose disk a
# test stalls keeps its term (on a loaded machine, CFG's 200 ms timeout passed while the
# stalled leader sent nothing: CI flake), and every write on the writer thread, which the
# test stalls.


async def start_hosts(names: tuple[str, ...]) -> tuple[dict[str, RaftHost], dict[str, ListMachine]]:
    net = MemoryNetwork()
    hosts: dict[str, RaftHost] = {}
    machines: dict[str, ListMachine] = {}
    for n in names:
        hosts[n] = RaftHost(
            n, storage=MemoryLogStorage(), transport=MemoryTransport(n, net), config=CFG
        )
        machines[n] = ListMachine()
        hosts[n].start()
    return hosts, machines


async def stop_all(hosts: dict[str, RaftHost]) -> None:
    for h in hosts.values():
        await h.stop()


async def propose_all(host: RaftHost, prefix: str, count: int) -> None:
    await asyncio.gather(*(host.propose(GROUP, f"{prefix}-{i}".encode()) for i in range(count)))


def test_learner_catches_up_is_promoted_and_a_voter_is_removed() -> None:
    async def scenario() -> None:
        hosts, machines = await start_hosts(("n1", "n2", "n3", "n4"))
        try:
            for n in ("n1", "n2", "n3"):
                await hosts[n].create_group(
                    GROUP, voters=("n1", "n2", "n3"), state_machine=machines[n]
                )
            lead = await elected({n: hosts[n] for n in ("n1", "n2", "n3")}, GROUP)
            await propose_all(hosts[lead], "a", 30)
            # The joiner starts empty: it knows no members, so it cannot campaign.
            hosts["n4"].join_group(GROUP, state_machine=machines["n4"])
            assert hosts["n4"].voters(GROUP) == ()
            await hosts[lead].propose_conf_change(
                GROUP, ConfChange(ConfChangeType.ADD_LEARNER, "n4")
            )
            assert hosts[lead].learners(GROUP) == ("n4",)
            assert "n4" not in hosts[lead].voters(GROUP)
            commit, _ = hosts[lead].followers(GROUP)
            await until(
                lambda: any(
                    f.name == "n4" and f.match >= commit for f in hosts[lead].followers(GROUP)[1]
                )
            )
            # Caught up by a snapshot (the log starts after the bootstrap snapshot).
            assert machines["n4"].restores >= 1
            await until(lambda: len(machines["n4"].applied.get(GROUP, [])) == 30)
            await hosts[lead].propose_conf_change(GROUP, ConfChange(ConfChangeType.ADD_VOTER, "n4"))
            assert hosts[lead].voters(GROUP) == ("n1", "n2", "n3", "n4")
            gone = next(n for n in ("n1", "n2", "n3") if n != lead)
            await hosts[lead].propose_conf_change(GROUP, ConfChange(ConfChangeType.REMOVE, gone))
            assert gone not in hosts[lead].voters(GROUP)
            await until(lambda: hosts["n4"].voters(GROUP) == hosts[lead].voters(GROUP))
            # The removed node is stopped: the remaining three still commit.
            await hosts[gone].remove_group(GROUP)
            await propose_all(hosts[lead], "b", 10)
            await until(lambda: len(machines["n4"].applied.get(GROUP, [])) == 40)
            assert machines["n4"].applied[GROUP] == machines[lead].applied[GROUP]
        finally:
            await stop_all(hosts)

    run(scenario)


class CountedPermits(PermitStorage):
    """``PermitStorage`` that counts the writes that waited for a permit."""

    def __init__(self) -> None:
        super().__init__()
        self.waits = 0

    def write_batch(self, writes: Sequence[GroupWrite]) -> None:
        if self.metered:
            self.waits += 1
        super().write_batch(writes)


def test_a_change_committed_during_a_write_is_in_effect_when_it_resolves() -> None:
    """``propose_conf_change`` resolves when the new membership is in effect, also when the
    round that commits it applies it while writing newer entries (host.py, "Applying during
    the write"): a change takes effect at ``advance``, after that write, so it is never
    answered before then."""

    async def scenario() -> None:
        names = ("n1", "n2", "n3")
        net = MemoryNetwork()
        stores = {n: CountedPermits() for n in names}
        hosts = {
            n: RaftHost(n, storage=stores[n], transport=MemoryTransport(n, net), config=STALL_CFG)
            for n in names
        }
        machines = {n: ListMachine() for n in names}
        lead = ""
        try:
            for n in names:
                hosts[n].start()
                await hosts[n].create_group(GROUP, voters=names, state_machine=machines[n])
            lead = await elected(hosts, GROUP)
            await propose_all(hosts[lead], "a", 1)  # the leader committed in its term
            store = stores[lead]
            await store.meter_when_settled(hosts[lead], GROUP)
            change = asyncio.ensure_future(
                hosts[lead].propose_conf_change(GROUP, ConfChange(ConfChangeType.ADD_LEARNER, "n4"))
            )
            index = store.log(GROUP).last_index() + 1
            followers = {n for n in names if n != lead}

            # Both acknowledgements of the change wait in the leader's inbox.
            await until(lambda: acks_waiting(hosts[lead], index) == followers)
            # What the membership is when the change is answered (callbacks run in order).
            seen: list[tuple[str, ...]] = []
            change.add_done_callback(lambda _: seen.append(hosts[lead].learners(GROUP)))
            later = asyncio.ensure_future(hosts[lead].propose(GROUP, b"later"))
            await asyncio.sleep(0)  # queued for the round that commits the change
            store.permits.release()  # the change's write completes; the next one waits
            await until(lambda: store.waits >= 2)  # the round writing "later" is writing
            store.unmeter()
            await change
            await later
            assert seen == [("n4",)]
        finally:
            if lead:
                stores[lead].unmeter()
            await stop_all(hosts)

    run(scenario)


def test_one_change_at_a_time() -> None:
    async def scenario() -> None:
        hosts, machines = await start_hosts(("n1", "n2", "n3"))
        try:
            for n in ("n1", "n2"):
                await hosts[n].create_group(GROUP, voters=("n1", "n2"), state_machine=machines[n])
            lead = await elected({n: hosts[n] for n in ("n1", "n2")}, GROUP)
            await propose_all(hosts[lead], "a", 1)  # the leader committed in its term
            first = hosts[lead].propose_conf_change(
                GROUP, ConfChange(ConfChangeType.ADD_LEARNER, "n3")
            )
            second = hosts[lead].propose_conf_change(
                GROUP, ConfChange(ConfChangeType.ADD_VOTER, "n3")
            )
            await first
            with pytest.raises(ConfChangePendingError):
                await second
        finally:
            await stop_all(hosts)

    run(scenario)


def test_transfer_leadership_moves_the_leader_to_the_chosen_voter() -> None:
    async def scenario() -> None:
        names = ("n1", "n2", "n3")
        hosts, machines = await start_hosts(names)
        try:
            for n in names:
                await hosts[n].create_group(GROUP, voters=names, state_machine=machines[n])
            lead = await elected(hosts, GROUP)
            await propose_all(hosts[lead], "a", 5)
            target = next(n for n in names if n != lead)
            hosts[lead].transfer_leadership(GROUP, target)
            await until(lambda: hosts[target].status(GROUP).role == Role.LEADER)
            await propose_all(hosts[target], "b", 5)
            await until(lambda: all(len(m.applied.get(GROUP, [])) == 10 for m in machines.values()))
        finally:
            await stop_all(hosts)

    run(scenario)


def test_a_joiner_that_nobody_added_never_campaigns() -> None:
    """A node started empty knows no members: it is nobody's voter, so it never starts an
    election however long it hears nothing (Election Safety cannot be put at risk by it)."""

    async def scenario() -> None:
        hosts, machines = await start_hosts(("n1",))
        try:
            hosts["n1"].join_group(GROUP, state_machine=machines["n1"])
            start = hosts["n1"].ticks
            await until(lambda: hosts["n1"].ticks >= start + 4 * CFG.election_tick)
            st = hosts["n1"].status(GROUP)
            assert st.role == Role.FOLLOWER and st.term == 0 and st.leader == ""
        finally:
            await stop_all(hosts)

    run(scenario)


def test_a_created_group_restarts_from_its_durable_bootstrap(tmp_path: Path) -> None:
    """The first snapshot written by ``create_group`` is durable: after a restart on the
    same LMDB data the group elects again and its state is restored (§5.2, §7)."""
    names = ("n1", "n2", "n3")

    async def one_life(life: int) -> list[bytes]:
        net = MemoryNetwork()
        hosts: dict[str, RaftHost] = {}
        machines: dict[str, ListMachine] = {}
        storages: list[LmdbLogStorage] = []
        for n in names:
            storages.append(LmdbLogStorage(tmp_path / n))
            hosts[n] = RaftHost(
                n, storage=storages[-1], transport=MemoryTransport(n, net), config=CFG
            )
            machines[n] = ListMachine()
            hosts[n].start()
            await hosts[n].create_group(GROUP, voters=names, state_machine=machines[n])
        try:
            lead = await elected(hosts, GROUP)
            await propose_all(hosts[lead], f"life{life}", 3)
            return list(machines[lead].applied[GROUP])
        finally:
            await stop_all(hosts)
            for st in storages:
                st.close()

    async def scenario() -> None:
        first = await one_life(1)
        assert first == [f"life1-{i}".encode() for i in range(3)]
        second = await one_life(2)
        assert second == [*first, *(f"life2-{i}".encode() for i in range(3))]

    run(scenario)
