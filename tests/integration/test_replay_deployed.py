"""The deployed replay's short version (benchmarks/replay_deployed.py, issue 39): the real daemons in act mode on two
namespaced nodes of tests/harness, a real Prometheus and Alertmanager, the actions run through each node's
``systemctl`` stand-in and answered by the world as systemd would, fed benign life (healthy serving and kernel logs,
the worker's agent restarted, an agent frozen past Prometheus's scrape timeout, the operator's own restart of vLLM,
a step of the agents' injected clock) and one fault of every class at seeded random times.

Every fault is answered (its restart, or its page with no restart) within its promised time, nothing is
restarted without a fault behind it or under a fault a restart cannot cure, and no page goes out with no fault open.
The figures at scale are benchmarks/replay.py's; this holds the real path to them. About 3-4 minutes on two busy
cores (the guard's times scaled down: replay_deployed.SETTINGS).
"""

from __future__ import annotations

import pytest

from conftest import load_benchmark
from harness import skip_unless_runnable
from journalwriter import journal_remote

pytestmark = pytest.mark.integration


def test_deployed_agents_answer_every_fault_and_restart_nothing_healthy() -> None:
    skip_unless_runnable(with_monitoring=True)
    journal_remote()  # skips naming the package when it is missing
    r = load_benchmark("replay_deployed")
    fig = r.replay(1, seed=39, say=print, extra_benign=False)
    report = r.report(fig)
    print(report)
    per = fig.per_class()
    assert set(per) == {c.name for c in r.CATALOGUE}, report
    assert fig.false_actions == [], report
    assert {name: c["recall"] for name, c in per.items()} == dict.fromkeys(per, 1.0), report
    assert all(c["restarts"] == 0 for c in per.values()), report
    assert fig.stray_pages() == [], report
    assert all(fig.verdicts().values()), report
    # The benign life happened: the worker's agent restarted, an agent frozen, a clock step, ...
    assert {event for _, event in fig.record.benign} >= {"agent_restart", "scrape_timeout", "clock_step"}, report
