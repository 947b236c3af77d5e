"""Credentials for tests of the daemon's HTTP face."""

from __future__ import annotations

from dgxdoctor.settings.daemon import Credentials


def one_token(token: str | None) -> Credentials:
    """What the deprecated single ``[daemon] token`` resolves to: the peer token, which also opens what the read
    token does, and the alert token. None: nothing configured."""
    return Credentials(alert=token, peer=token)
