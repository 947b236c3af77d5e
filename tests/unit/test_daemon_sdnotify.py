from __future__ import annotations

import os
import socket
import threading
from pathlib import Path

from dgxdoctor.daemon.sdnotify import Notifier


def test_path_socket(tmp_path: Path) -> None:
    path = str(tmp_path / "notify")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(path)
        n = Notifier({"NOTIFY_SOCKET": path})
        assert n.notify("READY=1\nSTATUS=serving")
        assert sock.recv(4096) == b"READY=1\nSTATUS=serving"
        n.close()


def test_abstract_socket() -> None:
    name = f"dgxdoctor-test-{os.getpid()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        n = Notifier({"NOTIFY_SOCKET": "@" + name})
        assert n.notify("WATCHDOG=1")
        assert sock.recv(4096) == b"WATCHDOG=1"
        n.close()


def test_disabled_and_failures_are_quiet(tmp_path: Path) -> None:
    assert not Notifier({}).notify("READY=1")
    assert not Notifier({"NOTIFY_SOCKET": "relative"}).notify("READY=1")
    assert not Notifier({"NOTIFY_SOCKET": str(tmp_path / "absent")}).notify("READY=1")


def test_watchdog_interval() -> None:
    assert Notifier({"WATCHDOG_USEC": "30000000"}).watchdog_s == 15.0
    assert Notifier({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": str(os.getpid())}).watchdog_s == 15.0
    assert Notifier({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "1"}).watchdog_s is None
    assert Notifier({"WATCHDOG_USEC": "junk"}).watchdog_s is None
    assert Notifier({}).watchdog_s is None


def test_a_receiver_that_never_reads_does_not_block_the_sender(tmp_path: Path) -> None:
    """The watchdog pings are sent from the event loop: a full queue (nobody reading) drops a ping, never blocks."""
    path = str(tmp_path / "notify")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(path)
        n = Notifier({"NOTIFY_SOCKET": path})
        sent: list[bool] = []
        sender = threading.Thread(target=lambda: sent.extend(n.notify("WATCHDOG=1") for _ in range(500)), daemon=True)
        sender.start()
        sender.join(5)
        assert not sender.is_alive(), "notify blocked on a queue nobody reads"
        assert sent[0] and not all(sent)  # the first ones queued, the rest dropped
        assert sock.recv(4096) == b"WATCHDOG=1"
        n.close()
