"""The node configuration: TOML layout, flags over the file, and every validation rule.

Issue 5: "`--config node.toml` (tomllib, validated at start with clear errors)" and "a bad
config names the field". Every error must name the TOML key and say where the value came
from (the file or the flag).
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest

from raftstream.cluster.config import (
    CALL_TIMEOUT_MS_CEILING,
    INT64_MAX,
    MIB,
    Address,
    Limits,
    NodeConfig,
    RaftSettings,
    load_config,
    parse_peers,
)
from raftstream.cluster.security.auth import (
    LIMIT_KEYS,
    TOKEN_KEYS,
    USER_KEYS,
    AuthConfig,
    hash_secret,
)
from raftstream.cluster.security.tls import TlsSettings
from raftstream.errors import InvalidArgumentError

PEERS = "n1=127.0.0.1:7101,n2=127.0.0.1:7102,n3=127.0.0.1:7103"
FLAGS: dict[str, Any] = {
    "name": "n1",
    "listen": "127.0.0.1:7101",
    "data": "./data/n1",
    "peers": PEERS,
}
GOOD_TOML = """
[cluster]
name = "n2"
listen = "0.0.0.0:7102"
data = "/var/lib/raftstream/n2"
peers = { n1 = "127.0.0.1:7101", n2 = "127.0.0.1:7102", n3 = "[::1]:7103" }
metrics_listen = "127.0.0.1:9102"
cluster_name = "east"
tags = ["ssd", "az1"]
meta_voters_max = 3

[raft]
tick_ms = 50
election_ticks = 10

[limits]
payload_bytes_max = 2097152
publish_batch_bytes_max = 8388608
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "node.toml"
    path.write_text(text)
    return path


def bad(field: str, path: Path | None = None, **overrides: Any) -> InvalidArgumentError:
    """Load a config that must be refused; check the field; return the error."""
    with pytest.raises(InvalidArgumentError) as info:
        load_config(path, **overrides)
    assert info.value.field == field, info.value
    return info.value


# -- what loads -------------------------------------------------------------------------------


def test_flags_alone_make_a_config_with_defaults() -> None:
    """The issue's command line: --name --listen --data --peers, everything else defaults."""
    cfg = load_config(**FLAGS)
    assert cfg.name == "n1"
    assert cfg.listen == Address("127.0.0.1", 7101) == cfg.advertise
    assert cfg.data == Path("data/n1")
    assert list(cfg.peers) == ["n1", "n2", "n3"]
    assert cfg.limits.payload_bytes_max == 1 * MIB
    assert cfg.raft == RaftSettings() and cfg.limits == Limits()
    assert cfg.metrics_listen is None and cfg.tags == () and cfg.meta_voters_max == 5


def test_a_toml_file_fills_every_section(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, GOOD_TOML))
    assert cfg.name == "n2" and cfg.listen == Address("0.0.0.0", 7102)
    assert cfg.peers["n3"] == Address("::1", 7103) and str(cfg.peers["n3"]) == "[::1]:7103"
    assert cfg.metrics_listen == Address("127.0.0.1", 9102)
    assert cfg.cluster_name == "east" and cfg.tags == ("az1", "ssd")
    assert cfg.meta_voters_max == 3
    assert cfg.raft.tick_ms == 50 and cfg.raft.election_ticks == 10
    assert cfg.raft.heartbeat_ticks == 1
    assert cfg.limits.payload_bytes_max == 2 * MIB


def test_flags_override_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD_TOML)
    cfg = load_config(path, data="/elsewhere", tags="gpu,ssd", metrics_listen=None)
    assert cfg.data == Path("/elsewhere") and cfg.tags == ("gpu", "ssd")
    assert cfg.metrics_listen == Address("127.0.0.1", 9102)  # None: the flag was not given


def test_config_is_frozen_and_keyword_only() -> None:
    cfg = load_config(**FLAGS)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.name = "x"  # type: ignore[misc]
    with pytest.raises(TypeError):
        NodeConfig("n1")  # type: ignore[misc]
    with pytest.raises(TypeError):
        cfg.peers["n9"] = Address("h", 1)  # type: ignore[index]


# -- what is refused, naming the key and the origin --------------------------------------------


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",
        "127.0.0.1:0",
        "127.0.0.1:70000",
        ":7101",
        "host:port",
        "a b:1",
        "::1:7101",
        "[nothex]:7101",
        "",
    ],
)
def test_bad_listen_address(address: str) -> None:
    """An address is host:port, port 1..65535, IPv6 in brackets."""
    err = bad("cluster.listen", **{**FLAGS, "listen": address})
    assert err.message.startswith("--listen: cluster.listen:")


def test_an_unknown_key_names_the_file_and_key(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD_TOML.replace("tick_ms = 50", "tick_msec = 50"))
    err = bad("raft.tick_msec", path)
    assert str(path) in err.message and "unknown key" in err.message


def test_an_unknown_section_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD_TOML + "\n[clustr]\nname = 'x'\n")
    err = bad("clustr", path)
    assert str(path) in err.message


def test_an_unknown_flag_is_refused() -> None:
    bad("--colour", **FLAGS, colour="red")


def test_invalid_toml_and_missing_file(tmp_path: Path) -> None:
    """A file that does not parse or cannot be read is refused with its path."""
    err = bad("config", write(tmp_path, "[cluster\nname="))
    assert "node.toml" in err.message
    err = bad("config", tmp_path / "absent.toml")
    assert "absent.toml" in err.message


@pytest.mark.parametrize("key", ["name", "listen", "data", "peers"])
def test_required_keys(key: str) -> None:
    flags = {k: v for k, v in FLAGS.items() if k != key}
    bad(f"cluster.{key}", **flags)


def test_name_must_be_among_the_peers(tmp_path: Path) -> None:
    err = bad("cluster.name", write(tmp_path, GOOD_TOML.replace('name = "n2"', 'name = "n7"')))
    assert "not in cluster.peers" in err.message and str(tmp_path) in err.message


def test_duplicate_peer_address_is_refused() -> None:
    err = bad("cluster.peers", **{**FLAGS, "peers": PEERS + ",n4=127.0.0.1:7102"})
    assert "n2" in err.rule and "n4" in err.rule


def test_a_peer_named_twice_is_refused() -> None:
    bad("cluster.peers", **{**FLAGS, "peers": PEERS + ",n2=127.0.0.1:7109"})


@pytest.mark.parametrize("peers", ["n1", "n1=", "=127.0.0.1:1", "n 1=127.0.0.1:7101", "", 5])
def test_malformed_peers(peers: object) -> None:
    bad("cluster.peers", **{**FLAGS, "peers": peers})


def test_listen_must_match_this_nodes_peer_entry() -> None:
    """The node listens where its peers dial it (or on every interface at that port)."""
    bad("cluster.listen", **{**FLAGS, "listen": "127.0.0.1:7199"})
    bad("cluster.listen", **{**FLAGS, "listen": "0.0.0.0:7199"})
    assert load_config(**{**FLAGS, "listen": "0.0.0.0:7101"}).listen.port == 7101


def test_metrics_must_not_share_the_grpc_address() -> None:
    bad("cluster.metrics_listen", **FLAGS, metrics_listen="127.0.0.1:7101")


@pytest.mark.parametrize(
    ("tags", "field"),
    [
        (["ssd", "ssd"], "cluster.tags"),
        (["a b"], "cluster.tags"),
        ("x", None),
        ([1], "cluster.tags"),
    ],
)
def test_tags_rules(tags: object, field: str | None) -> None:
    if field is None:
        assert load_config(**FLAGS, tags=tags).tags == ("x",)
    else:
        bad(field, **FLAGS, tags=tags)


@pytest.mark.parametrize(
    ("voters", "ok"), [(1, True), (7, True), (0, False), (8, False), (True, False), ("5", False)]
)
def test_meta_voters_max_rule(voters: object, ok: bool) -> None:
    if ok:
        assert load_config(**FLAGS, meta_voters_max=voters).meta_voters_max == voters
    else:
        bad("cluster.meta_voters_max", **FLAGS, meta_voters_max=voters)


@pytest.mark.parametrize(
    ("section", "key", "value"),
    [
        ("limits", "payload_bytes_max", -1),
        ("limits", "payload_bytes_max", 0),
        ("limits", "pull_batch_msgs_max", -5),
        ("limits", "request_timeout_ms", "5s"),
        ("limits", "publish_batch_entries_max", True),
        ("raft", "tick_ms", 0),
        ("raft", "snapshot_entries", -1),
    ],
)
def test_negative_zero_or_mistyped_limits_are_refused(
    tmp_path: Path, section: str, key: str, value: object
) -> None:
    """Every limit is a positive integer (a bool is not an integer here)."""
    text = f"[{section}]\n{key} = {_toml_value(value)}\n"
    err = bad(f"{section}.{key}", write(tmp_path, text), **FLAGS)
    assert str(tmp_path) in err.message


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return f'"{value}"' if isinstance(value, str) else str(value)


# Every integer key of the node config, and the value above int64 a user tried.
_INTEGER_KEYS = [
    *(("raft", f.name) for f in dataclasses.fields(RaftSettings)),
    *(("limits", f.name) for f in dataclasses.fields(Limits)),
]
_HUGE = 99999999999999999999


@pytest.mark.parametrize(("section", "key"), _INTEGER_KEYS)
@pytest.mark.parametrize("value", [INT64_MAX + 1, _HUGE])
def test_integers_beyond_int64_are_refused(
    tmp_path: Path, section: str, key: str, value: int
) -> None:
    """A user review: ``streams_max = 99999999999999999999`` was accepted (tomllib reads any
    size) and the node started. Every integer key is at most int64, the error naming the key,
    the rule and the file."""
    err = bad(f"{section}.{key}", write(tmp_path, f"[{section}]\n{key} = {value}\n"), **FLAGS)
    assert str(tmp_path) in err.message
    assert err.rule == f"must be at most {INT64_MAX} (int64)"


def test_int64_itself_is_accepted_where_no_tighter_rule_applies(tmp_path: Path) -> None:
    text = f"[limits]\nstreams_max = {INT64_MAX}\nstorage_bytes_max = {INT64_MAX}\n"
    cfg = load_config(write(tmp_path, text), **FLAGS)
    assert cfg.limits.streams_max == cfg.limits.storage_bytes_max == INT64_MAX
    path = write(tmp_path, f"[limits]\nstreams_max = {_HUGE}\n")
    err = bad("limits.streams_max", path, **FLAGS)
    assert err.message == f"{path}: limits.streams_max: must be at most {INT64_MAX} (int64)"


def test_meta_voters_max_beyond_int64_keeps_its_own_rule() -> None:
    err = bad("cluster.meta_voters_max", **FLAGS, meta_voters_max=_HUGE)
    assert err.rule == "must be 1 to 7"


def test_call_timeout_is_at_most_a_year() -> None:
    """A call's time becomes a gRPC deadline (int64 ns since 1970): a few hundred years'
    deadline fails every forwarded call at once, so the cap is a year."""
    assert Limits(call_timeout_max_ms=CALL_TIMEOUT_MS_CEILING).call_timeout_max_ms > 0
    with pytest.raises(InvalidArgumentError) as info:
        Limits(call_timeout_max_ms=CALL_TIMEOUT_MS_CEILING + 1)
    assert info.value.field == "limits.call_timeout_max_ms"


@pytest.mark.parametrize(
    ("auth", "field"),
    [
        ("verified_cache_entries_max = {n}\n", "auth.verified_cache_entries_max"),
        ("[auth.accounts.A]\nmax_streams = {n}\n", "auth.accounts.A.max_streams"),
        ("[auth.accounts.A]\nmax_file_bytes = {n}\n", "auth.accounts.A.max_file_bytes"),
    ],
)
@pytest.mark.parametrize("value", [INT64_MAX + 1, _HUGE])
def test_auth_integers_beyond_int64_are_refused(
    tmp_path: Path, auth: str, field: str, value: int
) -> None:
    user = f'[[auth.users]]\nuser = "u"\npassword = "{hash_secret("pw", rounds=4)}"\n'
    text = f'[auth]\n{auth.format(n=value)}[auth.accounts.B]\n{user}account = "B"\n'
    err = bad(field, write(tmp_path, text), **FLAGS)
    assert err.rule == f"must be at most {INT64_MAX} (int64)"
    assert str(tmp_path) in err.message


def test_payload_limit_never_above_64_mib() -> None:
    """Issue 10: the maximum payload is configurable, never above 64 MiB."""
    with pytest.raises(InvalidArgumentError) as info:
        Limits(payload_bytes_max=64 * MIB + 1, publish_batch_bytes_max=128 * MIB)
    assert info.value.field == "limits.payload_bytes_max"
    top = Limits(payload_bytes_max=64 * MIB, publish_batch_bytes_max=128 * MIB)
    assert top.grpc_message_bytes_max > 64 * MIB  # derived: a message and its envelope


def test_storage_limit_is_at_least_one_mib() -> None:
    """storage_bytes_max (each LMDB map, a user review: 64 GiB was fixed) is configurable,
    never below 1 MiB."""
    with pytest.raises(InvalidArgumentError) as info:
        Limits(storage_bytes_max=MIB - 1)
    assert info.value.field == "limits.storage_bytes_max"
    assert Limits(storage_bytes_max=MIB).storage_bytes_max == MIB
    assert Limits().storage_bytes_max == 64 * 1024 * MIB


def test_publish_batches_must_hold_the_largest_message(tmp_path: Path) -> None:
    """A payload limit a publish batch cannot carry is refused at start, not on first use;
    the message says the batch limit is a default when the file did not set it."""
    err = bad(
        "limits.publish_batch_bytes_max",
        write(tmp_path, "[limits]\npayload_bytes_max = 8388608\n"),
        **FLAGS,
    )
    assert err.message.startswith("defaults:")
    with pytest.raises(InvalidArgumentError) as info:
        Limits(payload_bytes_max=4 * MIB)
    assert info.value.field == "limits.publish_batch_bytes_max"


def test_election_must_outlast_heartbeats() -> None:
    with pytest.raises(InvalidArgumentError) as info:
        RaftSettings(election_ticks=2, heartbeat_ticks=2)
    assert info.value.field == "raft.election_ticks"


def test_ack_linger_is_0_to_a_tick(tmp_path: Path) -> None:
    assert RaftSettings(ack_linger_ms=0).ack_linger_ms == 0
    assert RaftSettings(tick_ms=50, ack_linger_ms=50).ack_linger_ms == 50
    for text in ("-1", "51", "true", '"5"'):
        path = write(tmp_path, f"[raft]\ntick_ms = 50\nack_linger_ms = {text}\n")
        bad("raft.ack_linger_ms", path, **FLAGS)


def test_parse_peers_accepts_both_forms() -> None:
    table = parse_peers({"b": "h:2", "a": "h:1"})
    text = parse_peers(" a=h:1 , b=h:2 ")
    assert table == text == {"a": Address("h", 1), "b": Address("h", 2)}


# -- documentation ----------------------------------------------------------------------------


def test_every_key_is_documented_and_every_documented_key_exists() -> None:
    """docs/configuration.md has one table row per key of each section, and no others."""
    doc = (Path(__file__).parents[2] / "docs" / "configuration.md").read_text()
    documented: dict[str, set[str]] = {}
    section = None
    for line in doc.splitlines():
        if m := re.match(r"^## `\[(\w+)\]`", line):
            section = m.group(1)
            documented[section] = set()
        elif section and (m := re.match(r"^\| `(\w+)` \|", line)):
            documented[section].add(m.group(1))
    in_code = {
        "cluster": {f.name for f in dataclasses.fields(NodeConfig)} - {"raft", "limits"},
        "raft": {f.name for f in dataclasses.fields(RaftSettings)},
        "limits": {f.name for f in dataclasses.fields(Limits)},
        "tls": {f.name for f in dataclasses.fields(TlsSettings)},
        # [auth] and the keys of its accounts, users and tokens (one namespace in the doc).
        # (``node_secret`` holds what the key ``node_secret_file`` names.)
        "auth": ({f.name for f in dataclasses.fields(AuthConfig)} - {"node_secret"})
        | {"node_secret_file"}
        | set(LIMIT_KEYS)
        | USER_KEYS
        | TOKEN_KEYS,
    }
    in_code["cluster"] -= {"tls", "auth"}
    assert documented == in_code


def test_a_missing_key_is_blamed_on_the_file_or_the_flag_not_the_defaults(tmp_path: Path) -> None:
    path = write(
        tmp_path, '[cluster]\nname = "n1"\nlisten = "127.0.0.1:7101"\ndata = "./data/n1"\n'
    )
    err = bad("cluster.peers", path)
    assert err.message == f"{path}: cluster.peers: is required"
    err = bad("cluster.listen", None, name="n1")
    assert err.message == "--listen: cluster.listen: is required"


def test_a_key_before_any_section_header_says_so(tmp_path: Path) -> None:
    path = write(tmp_path, 'name = "n1"\n[cluster]\nlisten = "127.0.0.1:7101"\n')
    err = bad("name", path)
    assert "top-level key 'name': keys go under a [section] header (cluster)" in err.message


def test_a_tls_section_missing_a_file_names_the_config_file(tmp_path: Path) -> None:
    """A required key of a section the file has is the file's to give (a bad-input review:
    `[tls]` with only ca_file was reported as coming from "defaults")."""
    path = write(tmp_path, GOOD_TOML + '\n[tls]\nca_file = "/etc/raftstream/ca.pem"\n')
    err = bad("tls.cert_file", path)
    assert str(err).startswith(f"{path}: tls.cert_file: is required"), err
