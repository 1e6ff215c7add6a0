"""Unit tests of authentication and accounts (issue 10, docs/security.md): the ``[auth]``
config section and its refusals, resolving credentials (with the verified cache), permission
patterns, account limits as the meta leader checks them, and secrets kept out of repr()
and errors."""

from __future__ import annotations

import asyncio
import base64
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import bcrypt
import grpc
import pytest

from raftstream import errors
from raftstream._auth import authorization_value, credential_interceptors
from raftstream.cli.common import Conn
from raftstream.cluster.config import load_config
from raftstream.cluster.meta.entries import AddConsumer, AddStream
from raftstream.cluster.meta.state import MetaState, check_account_limits
from raftstream.cluster.security.auth import (
    ANONYMOUS,
    SYSTEM_ACCOUNT,
    AccountLimits,
    Authenticator,
    Caller,
    Permissions,
    hash_secret,
    node_caller,
)
from raftstream.cluster.services.context import from_leaders
from raftstream.cluster.services.streams import check_origins
from raftstream.engine.consumer_config import ConsumerConfig
from raftstream.engine.stream_config import RetentionPolicy, StorageType, StreamConfig
from raftstream.engine.stream_source import ExternalStream, StreamSource

# Few rounds: the tests check behaviour, not bcrypt's cost.
ALICE_PW = "alice-secret"
ALICE_HASH = hash_secret(ALICE_PW, rounds=4)
CI_TOKEN = "tok-0123456789"
CI_HASH = hash_secret(CI_TOKEN, rounds=4)

AUTH_TOML = f"""
[auth.accounts.A]
max_streams = 2
max_consumers = 3
max_file_bytes = 1000
[auth.accounts.B]
[auth.accounts."$SYS"]

[[auth.users]]
user = "alice"
password = "{ALICE_HASH}"
account = "A"
publish = ["orders.>"]
read = ["ORD*"]
manage = ["ORDERS"]

[[auth.tokens]]
name = "ci"
token = "{CI_HASH}"
account = "B"
"""


def _node_toml(tmp_path: Path, auth: str) -> Path:
    path = tmp_path / "node.toml"
    path.write_text(
        '[cluster]\nname = "n1"\nlisten = "127.0.0.1:7101"\n'
        f'data = "{tmp_path / "d"}"\npeers = {{ n1 = "127.0.0.1:7101" }}\n' + auth
    )
    return path


def _basic(user: str, password: str) -> tuple[tuple[str, str], ...]:
    raw = base64.b64encode(f"{user}:{password}".encode()).decode()
    return (("authorization", f"Basic {raw}"),)


# -- config ----------------------------------------------------------------------------------


def test_no_auth_section_keeps_the_default_account() -> None:
    """Without [auth] the node runs as before: no auth config, calls act in $G with every
    permission (issue 10: "Without auth configured, everything runs in one default
    account")."""
    cfg = load_config(None, name="n1", listen="127.0.0.1:7101", data="d", peers="n1=127.0.0.1:7101")
    assert cfg.auth is None
    assert ANONYMOUS.account == "$G" and ANONYMOUS.system
    assert ANONYMOUS.permissions.may_publish("any.thing")
    assert ANONYMOUS.permissions.may_manage("ANY")


def test_auth_section_is_parsed(tmp_path: Path) -> None:
    cfg = load_config(_node_toml(tmp_path, AUTH_TOML))
    auth = cfg.auth
    assert auth is not None
    assert set(auth.accounts) == {"A", "B", SYSTEM_ACCOUNT}
    assert auth.limits("A") == AccountLimits(max_streams=2, max_consumers=3, max_file_bytes=1000)
    assert auth.limits("B") == AccountLimits()
    alice = auth.users["alice"]
    assert alice.account == "A"
    assert alice.permissions == Permissions(
        publish=("orders.>",), read=("ORD*",), manage=("ORDERS",)
    )
    assert [t.name for t in auth.tokens] == ["ci"]
    assert auth.tokens[0].permissions == Permissions()  # default: everything in its account


@pytest.mark.parametrize(
    ("auth", "field"),
    [
        ("[auth]\nusers = []\n[auth.accounts.A]\n", "auth"),
        ("[auth]\nbogus = 1\n", "auth.bogus"),
        ('[auth.accounts."a.b"]\n', "auth.accounts"),
        ("[auth.accounts.A]\nmax_streams = -1\n", "auth.accounts.A.max_streams"),
        ('[auth.accounts.A]\nmax_streams = "many"\n', "auth.accounts.A.max_streams"),
        ("[auth.accounts.A]\nmax_bytes = 5\n", "auth.accounts.A.max_bytes"),
        (
            '[auth.accounts.A]\n[[auth.users]]\nuser = "u"\npassword = "plain-secret"\n'
            'account = "A"\n',
            "auth.users[0].password",
        ),
        (
            f'[auth.accounts.A]\n[[auth.users]]\nuser = "u"\npassword = "{ALICE_HASH}"\n'
            'account = "Z"\n',
            "auth.users[0].account",
        ),
        (
            f'[auth.accounts.A]\n[[auth.users]]\nuser = "u"\npassword = "{ALICE_HASH}"\n',
            "auth.users[0].account",
        ),
        (
            f'[auth.accounts.A]\n[[auth.users]]\nuser = "u"\npassword = "{ALICE_HASH}"\n'
            'account = "A"\npublish = ["a..b"]\n',
            "auth.users[0].publish",
        ),
        (
            f'[auth.accounts.A]\n[[auth.users]]\nuser = "u"\npassword = "{ALICE_HASH}"\n'
            'account = "A"\n[[auth.users]]\nuser = "u"\n'
            f'password = "{ALICE_HASH}"\naccount = "A"\n',
            "auth.users[1].user",
        ),
        (
            f'[auth.accounts.A]\n[[auth.tokens]]\nname = "t"\ntoken = "{CI_HASH}"\n'
            'account = "A"\nread = "ORDERS"\n',
            "auth.tokens[0].read",
        ),
    ],
)
def test_bad_auth_config_is_refused_naming_the_field(tmp_path: Path, auth: str, field: str) -> None:
    with pytest.raises(errors.InvalidArgumentError) as info:
        load_config(_node_toml(tmp_path, auth))
    assert info.value.field == field
    assert "plain-secret" not in str(info.value)  # a pasted plaintext is never echoed


def _mode_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and "readable by group or others" in r.getMessage()
    ]


def test_secret_files_readable_by_others_are_warned_about(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """docs/security.md: the config holding [auth]'s hashes and the node_secret_file are
    readable by the node only. One readable by group or others is a WARNING at start naming
    the file and its mode (the node still starts: load_config answers); mode 0600 is quiet.
    Before, modes were never checked."""
    secret = tmp_path / "node-secret"
    secret.write_text("s" * 40)
    auth = AUTH_TOML.replace(
        "[auth.accounts.A]", f'[auth]\nnode_secret_file = "{secret}"\n[auth.accounts.A]', 1
    )
    path = _node_toml(tmp_path, auth)
    caplog.set_level(logging.WARNING, logger="raftstream.cluster.config")
    path.chmod(0o644)
    secret.chmod(0o640)
    cfg = load_config(path)
    assert cfg.auth is not None and cfg.auth.node_secret is not None
    said = _mode_warnings(caplog)
    assert len(said) == 2, said
    assert any(str(path) in w and "0644" in w for w in said)
    assert any(str(secret) in w and "0640" in w for w in said)
    assert not any(ALICE_HASH in w or "s" * 40 in w for w in said)
    caplog.clear()
    path.chmod(0o600)
    secret.chmod(0o400)
    load_config(path)
    assert _mode_warnings(caplog) == []
    # A config without [auth] holds no secret: its mode is its owner's business.
    plain = _node_toml(tmp_path, "")
    plain.chmod(0o644)
    load_config(plain)
    assert _mode_warnings(caplog) == []


def test_secrets_are_not_in_repr(tmp_path: Path) -> None:
    cfg = load_config(_node_toml(tmp_path, AUTH_TOML))
    text = repr(cfg)
    assert "alice" in text  # the user is named ...
    assert ALICE_HASH not in text and CI_HASH not in text  # ... its hash is not


# -- resolving credentials -------------------------------------------------------------------


def _authenticator(tmp_path: Path) -> Authenticator:
    auth = load_config(_node_toml(tmp_path, AUTH_TOML)).auth
    assert auth is not None
    return Authenticator(auth)


def test_user_and_token_resolve_to_their_accounts(tmp_path: Path) -> None:
    a = _authenticator(tmp_path)

    async def body() -> None:
        alice = await a.resolve(_basic("alice", ALICE_PW))
        assert (alice.account, alice.user, alice.system) == ("A", "alice", False)
        assert alice.permissions.may_publish("orders.eu")
        assert not alice.permissions.may_publish("billing.eu")
        ci = await a.resolve((("authorization", f"Bearer {CI_TOKEN}"),))
        assert (ci.account, ci.user) == ("B", "ci")
        assert ALICE_PW not in repr(alice) and CI_TOKEN not in repr(ci)

    asyncio.run(body())


@pytest.mark.parametrize(
    "metadata",
    [
        (),
        (("x-other", "1"),),
        _basic("alice", "wrong"),
        _basic("nobody", ALICE_PW),
        (("authorization", "Bearer wrong-token"),),
        (("authorization", "Basic !!!not-base64"),),
        (("authorization", "Digest abc"),),
        (("authorization", "Bearer " + "x" * 10_000),),
    ],
)
def test_missing_or_bad_credentials_are_unauthenticated(
    tmp_path: Path, metadata: tuple[tuple[str, str], ...]
) -> None:
    a = _authenticator(tmp_path)
    with pytest.raises(errors.UnauthenticatedError) as info:
        asyncio.run(a.resolve(metadata))
    assert ALICE_PW not in str(info.value) and "wrong" not in str(info.value)


def test_verified_credentials_are_cached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """bcrypt runs once per distinct accepted credentials; a repeat is a cache hit. The
    cache is keyed by a digest: the plaintext is not kept in it."""
    a = _authenticator(tmp_path)
    calls: list[int] = []
    real = bcrypt.checkpw

    def counting(pw: bytes, hashed: bytes) -> bool:
        calls.append(1)
        return real(pw, hashed)

    monkeypatch.setattr(bcrypt, "checkpw", counting)

    async def body() -> None:
        for _ in range(5):
            await a.resolve(_basic("alice", ALICE_PW))
        assert len(calls) == 1
        with pytest.raises(errors.UnauthenticatedError):
            await a.resolve(_basic("alice", "wrong"))
        assert len(calls) == 2  # a refusal is checked, never cached as accepted

    asyncio.run(body())
    assert all(ALICE_PW.encode() not in k for k in a._verified)


# -- permissions -----------------------------------------------------------------------------


def test_permission_patterns() -> None:
    p = Permissions(publish=("orders.*", "audit.>"), read=("ORD*",), manage=("ORDERS",))
    assert p.may_publish("orders.eu") and p.may_publish("audit.a.b")
    assert not p.may_publish("orders.eu.x") and not p.may_publish("billing")
    assert p.may_read("ORDERS") and p.may_read("ORD2") and not p.may_read("BILLING")
    assert p.may_manage("ORDERS") and not p.may_manage("ORD2")
    manager = Permissions(read=(), manage=("ADMIN*",))
    assert manager.may_read("ADMIN1") and not manager.may_read("ORDERS")  # manage implies read
    alice = Caller(account="A", user="alice", permissions=p, system=False)
    with pytest.raises(errors.PermissionDeniedError):
        alice.check_publish("billing")
    with pytest.raises(errors.PermissionDeniedError):
        alice.check_manage("ORD2")
    with pytest.raises(errors.PermissionDeniedError):
        alice.check_system("meta leader step-down")


def test_mirror_and_source_origins_need_read_and_sometimes_manage() -> None:
    """docs/security.md "Permissions" (``check_origins``, as the meta leader runs it on a
    create or update): read on every origin of this cluster; manage too on a work queue or
    interest origin, and on one that does not exist yet (its retention is unknown); an
    external origin is its own cluster's to check. The refusal names the field."""
    origins = {
        "OPEN": StreamConfig(name="OPEN", subjects=("open",)),
        "WQ": StreamConfig(name="WQ", subjects=("wq",), retention=RetentionPolicy.WORKQUEUE),
        "INT": StreamConfig(name="INT", subjects=("int",), retention=RetentionPolicy.INTEREST),
        "HIDDEN": StreamConfig(name="HIDDEN", subjects=("hidden",)),
        "MINE_WQ": StreamConfig(
            name="MINE_WQ", subjects=("mwq",), retention=RetentionPolicy.WORKQUEUE
        ),
    }
    perms = Permissions(read=("OPEN", "WQ", "INT", "LATER"), manage=("MINE*",))
    user = Caller(account="A", user="u", permissions=perms, system=False)

    def check(*names: str, external: bool = False, mirror: bool = False) -> None:
        ext = ExternalStream(api=("10.0.0.1:7101",)) if external else None
        links = tuple(StreamSource(name=n, external=ext) for n in names)
        cfg = (
            StreamConfig(name="MINE", mirror=links[0])
            if mirror
            else StreamConfig(name="MINE", subjects=("mine",), sources=links)
        )
        check_origins(user, cfg, origins.get)

    check("OPEN")
    check("OPEN", mirror=True)
    check("MINE_WQ", "OPEN")  # manage on the work queue
    check("HIDDEN", external=True)  # another cluster's stream: not this cluster's to check
    cases = [
        ((("HIDDEN",), True), "mirror.name", "read"),
        ((("OPEN", "HIDDEN"), False), "sources[1].name", "read"),
        ((("WQ",), False), "sources[0].name", "workqueue"),
        ((("INT",), True), "mirror.name", "interest"),
        ((("LATER",), False), "sources[0].name", "does not exist yet"),
    ]
    for (names, mirror), field, said in cases:
        with pytest.raises(errors.PermissionDeniedError) as info:
            check(*names, mirror=mirror)
        assert info.value.details["field"] == field, names
        assert said in info.value.details["rule"], names


def test_a_list_never_answers_for_a_leader_that_refused_the_caller() -> None:
    """``from_leaders`` (stream and consumer lists): a leader that does not answer gets
    this node's copy, but one that refuses the caller (PERMISSION_DENIED, UNAUTHENTICATED)
    fails the list: before, this node's copy showed what the leader had refused (review
    finding 3)."""

    async def listing(refusal: errors.RaftStreamError) -> list[str]:
        async def ask(item: str, timeout_s: float) -> str:
            if item == "refused":
                raise refusal
            raise errors.UnavailableError("no answer in time")

        return await from_leaders(
            ["late", "refused"],
            leads=lambda item: False,
            local=lambda item: f"local {item}",
            ask=ask,
            timeout_s=5.0,
        )

    late = asyncio.run(listing(errors.NotLeaderError("moved")))
    assert late == ["local late", "local refused"]
    for refusal in (
        errors.PermissionDeniedError("user 'carol' may not read stream 'refused'"),
        errors.UnauthenticatedError("credentials not accepted"),
    ):
        with pytest.raises(type(refusal)):
            asyncio.run(listing(refusal))


# -- account limits --------------------------------------------------------------------------


def _state_with(account: str, *streams: StreamConfig) -> MetaState:
    state = MetaState()
    for cfg in streams:
        state.apply(AddStream(account=account, config=cfg, peers=("n1",), ts_ns=1))
    return state


def test_max_streams_counts_the_account_only() -> None:
    state = _state_with("A", StreamConfig(name="S1", subjects=("a.1",)))
    for name in ("S2", "S4"):
        cfg = StreamConfig(name=name, subjects=(f"b.{name}",))
        state.apply(AddStream(account="B", config=cfg, peers=("n1",), ts_ns=1))
    limits = AccountLimits(max_streams=2)
    # A has one stream: B's two do not count against it.
    check_account_limits(state, "A", limits, stream=StreamConfig(name="S3", subjects=("x",)))
    with pytest.raises(errors.LimitError) as info:
        check_account_limits(state, "B", limits, stream=StreamConfig(name="S5", subjects=("y",)))
    assert info.value.details["limit"] == "max_streams"
    # Re-creating (or updating) an existing stream takes no new place.
    check_account_limits(state, "B", limits, stream=StreamConfig(name="S2", subjects=("b.S2",)))


def test_max_consumers_counts_every_stream_of_the_account() -> None:
    state = _state_with(
        "A", StreamConfig(name="S1", subjects=("a.1",)), StreamConfig(name="S2", subjects=("a.2",))
    )
    for stream, name in (("S1", "C1"), ("S2", "C2")):
        cfg = ConsumerConfig(durable_name=name)
        state.apply(AddConsumer(account="A", stream=stream, config=cfg, ts_ns=1))
    check_account_limits(state, "A", AccountLimits(max_consumers=3), new_consumer=True)
    with pytest.raises(errors.LimitError) as info:
        check_account_limits(state, "A", AccountLimits(max_consumers=2), new_consumer=True)
    assert info.value.details["limit"] == "max_consumers"


def test_storage_limit_counts_max_bytes_reservations_per_storage_type() -> None:
    state = _state_with("A", StreamConfig(name="S1", subjects=("a.1",), max_bytes=400))
    limits = AccountLimits(max_file_bytes=1000, max_memory_bytes=100)
    ok = StreamConfig(name="S2", subjects=("a.2",), max_bytes=600)
    check_account_limits(state, "A", limits, stream=ok)
    over = StreamConfig(name="S2", subjects=("a.2",), max_bytes=601)
    with pytest.raises(errors.LimitError) as info:
        check_account_limits(state, "A", limits, stream=over)
    assert info.value.details["limit"] == "max_file_bytes"
    # Replicas multiply the reservation: 2 x 400 > 1000 - 400.
    r2 = StreamConfig(name="S2", subjects=("a.2",), max_bytes=400, num_replicas=2)
    with pytest.raises(errors.LimitError):
        check_account_limits(state, "A", limits, stream=r2)
    mem = StreamConfig(
        name="M", subjects=("m",), max_bytes=100, storage=StorageType.MEMORY
    )  # memory is counted apart from file storage
    check_account_limits(state, "A", limits, stream=mem)
    unbounded = StreamConfig(name="S3", subjects=("a.3",))
    with pytest.raises(errors.InvalidArgumentError) as bad:
        check_account_limits(state, "A", limits, stream=unbounded)
    assert bad.value.field == "max_bytes"


# -- the SDK's side --------------------------------------------------------------------------


def test_sdk_authorization_values() -> None:
    assert authorization_value() is None
    assert authorization_value(token="t") == "Bearer t"
    value = authorization_value(user="alice", password="p:w")
    assert value is not None
    assert base64.b64decode(value.removeprefix("Basic ")) == b"alice:p:w"
    for kwargs, field in (
        ({"token": "t", "user": "u"}, "token"),
        ({"user": "u"}, "password"),
        ({"password": "p"}, "user"),
        ({"user": "a:b", "password": "p"}, "user"),
    ):
        with pytest.raises(errors.InvalidArgumentError) as info:
            authorization_value(**kwargs)
        assert info.value.field == field
    assert credential_interceptors() == ()
    interceptors = credential_interceptors(token="secret-token")
    assert len(interceptors) == 4  # one per call kind: grpc.aio files each under one kind
    assert all("secret-token" not in repr(icp) for icp in interceptors)


def test_sdk_sends_credentials_on_every_call_kind() -> None:
    """Unary and streamed calls alike carry ``authorization`` (a grpc.aio interceptor
    object serves one call kind only: a single one would leave streamed calls bare)."""

    async def body() -> list[bytes]:
        def seen(context: grpc.aio.ServicerContext) -> bytes:
            md = dict(context.invocation_metadata() or ())
            return str(md.get("authorization", "")).encode()

        async def uu(req: bytes, ctx: grpc.aio.ServicerContext) -> bytes:
            return seen(ctx)

        async def us(req: bytes, ctx: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
            yield seen(ctx)

        async def su(reqs: AsyncIterator[bytes], ctx: grpc.aio.ServicerContext) -> bytes:
            return seen(ctx)

        async def ss(
            reqs: AsyncIterator[bytes], ctx: grpc.aio.ServicerContext
        ) -> AsyncIterator[bytes]:
            yield seen(ctx)

        handlers = grpc.method_handlers_generic_handler(
            "t.S",
            {
                "UU": grpc.unary_unary_rpc_method_handler(uu),
                "US": grpc.unary_stream_rpc_method_handler(us),
                "SU": grpc.stream_unary_rpc_method_handler(su),
                "SS": grpc.stream_stream_rpc_method_handler(ss),
            },
        )
        server = grpc.aio.server()
        server.add_generic_rpc_handlers((handlers,))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        icp = list(credential_interceptors(token="T"))
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}", interceptors=icp) as ch:
                out = [await ch.unary_unary("/t.S/UU")(b"x", timeout=5)]
                out += [r async for r in ch.unary_stream("/t.S/US")(b"x", timeout=5)]
                out.append(await ch.stream_unary("/t.S/SU")(iter([b"x"]), timeout=5))
                out += [r async for r in ch.stream_stream("/t.S/SS")(iter([b"x"]), timeout=5)]
                return out
        finally:
            await server.stop(0)

    assert asyncio.run(body()) == [b"Bearer T"] * 4


def test_node_token_acts_for_one_account_and_cannot_be_forged(tmp_path: Path) -> None:
    """A node acting for an account (cluster/security/auth.py ``node_caller``) sends a token every
    node with the same [auth] accepts for that account only; a changed MAC or account, or a
    node of a cluster with another [auth], is refused."""
    a = _authenticator(tmp_path)
    auth = load_config(_node_toml(tmp_path, AUTH_TOML)).auth
    assert auth is not None
    node = node_caller(auth, "B")
    ((key, value),) = node.credentials
    assert key == "authorization" and value.startswith("Bearer rs-node.B.")

    async def body() -> None:
        who = await a.resolve(node.credentials)
        assert (who.account, who.user, who.system) == ("B", "$node", False)
        sys_node = node_caller(auth, SYSTEM_ACCOUNT)
        assert not (await a.resolve(sys_node.credentials)).system
        for forged in (
            value[:-1] + ("0" if value[-1] != "0" else "1"),
            value.replace("rs-node.B.", "rs-node.A."),
            value.replace("rs-node.B.", "rs-node.Z."),
        ):
            with pytest.raises(errors.UnauthenticatedError):
                await a.resolve((("authorization", forged),))

    asyncio.run(body())
    other = load_config(_node_toml(tmp_path, AUTH_TOML.replace('"B"', '"A"'))).auth
    assert other is not None
    with pytest.raises(errors.UnauthenticatedError):
        asyncio.run(a.resolve(node_caller(other, "A").credentials))


def test_cli_connection_settings_hide_secrets() -> None:
    """The CLI's ``Conn`` (what a command connects with) never shows password or token."""
    conn = Conn(servers=("h:1",), timeout_s=1.0, user="alice", password="pw-123", token="tk-456")
    text = repr(conn)
    assert "alice" in text and "pw-123" not in text and "tk-456" not in text
