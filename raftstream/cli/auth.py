"""``raftstream auth ...``: helpers for the node's ``[auth]`` section (docs/security.md).

``hash-password`` prints the bcrypt hash of a password or token, for a user's ``password``
or a token's ``token`` key. The secret is read from a hidden prompt (asked twice) on a
terminal, or as one line from stdin in a pipe; it is never taken as an argument, where it
would land in the shell history and the process list. Nothing here talks to a node.
"""

from __future__ import annotations

import sys

import bcrypt
import click

__all__ = ["auth"]

SECRET_BYTES_MAX = 72  # bcrypt reads no more: a longer secret would be silently cut
COST_DEFAULT = 12  # 2^12 rounds: tens of milliseconds per check on a current core


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def auth() -> None:
    """Helpers for the node's [auth] section (docs/security.md).

    \b
    Example:
      raftstream auth hash-password
    """


@auth.command("hash-password")
@click.option(
    "--cost",
    type=click.IntRange(4, 16),
    default=COST_DEFAULT,
    show_default=True,
    help="bcrypt cost: 2^COST rounds per check (each +1 doubles the work).",
)
def hash_password(cost: int) -> None:
    """Print the bcrypt hash of a password or token for [auth].

    The secret is asked twice on a terminal (hidden), or read as one line from stdin.

    \b
    Example:
      raftstream auth hash-password
      printf '%s\\n' "$TOKEN" | raftstream auth hash-password
    """
    if sys.stdin.isatty():
        secret = click.prompt("Password", hide_input=True, confirmation_prompt=True)
    else:
        secret = sys.stdin.readline().rstrip("\r\n")
    raw = secret.encode("utf-8")
    if not raw or len(raw) > SECRET_BYTES_MAX:
        click.echo(
            f"raftstream auth: error: the secret must be 1 to {SECRET_BYTES_MAX} bytes", err=True
        )
        sys.exit(1)
    click.echo(bcrypt.hashpw(raw, bcrypt.gensalt(cost)).decode("ascii"))
