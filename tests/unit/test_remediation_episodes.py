"""A hardware fault fixed and back on the same port is a new episode: audited and paged again (issue 39).

The deployed replay (benchmarks/replay_deployed.py) saw an IB port go down on the head twice, minutes apart: the
first time the policy's "suggest" was audited and the gate paged for the stalled engine it refused to restart; the
second time neither. The engine kept the last decision of each problem (audit lines are written when a decision
changes) and the gate the pages it sent, and forgot them only in an evaluation that had a problem but no cause,
which a quiet healthy stretch never is (the loop returns before the gate). Both are forgotten now when the problem
or the cause is gone.
"""

from __future__ import annotations

from pathlib import Path

from test_remediation_engine import events, remediator, settle, vllm_app

from dgxdoctor.checks.vllm import VllmSettings
from dgxdoctor.judge import infiniband as ib
from dgxdoctor.judge.consequence import judged_result
from dgxdoctor.judge.vllm import Limits, Server, not_up
from dgxdoctor.result import CheckResult, ResultBuilder
from dgxdoctor.sources.sysfs_ib import IbPort
from dgxdoctor.sources.vllm_api import Health

URL = "http://127.0.0.1:8000"


def infiniband(down: bool) -> CheckResult:
    """The infiniband check's verdict on one NDR port, Down (Polling) or Active."""
    b = ResultBuilder("infiniband")
    port = IbPort("mlx5_3", 1, "Down" if down else "Active", "Polling" if down else "LinkUp", 400.0,
                  "400 Gb/sec (4X NDR)", "InfiniBand")  # fmt: skip
    verdict = ib.port_state_verdict(port)
    if verdict is not None:
        b.add(verdict.finding(port.name))
    return judged_result(b.build("infiniband"))


def vllm(dead: bool) -> CheckResult:
    """The vllm check's down verdict (connection refused, no process) or a healthy result."""
    b = ResultBuilder("vllm")
    if dead:
        server = Server(URL, None, "no vLLM process", None, True, None, None, head=True)
        vs = VllmSettings()
        limits = Limits(vs.request_timeout_s, vs.startup_grace_s, vs.busy_cpu_ratio, vs.kv_cache_warn,
                        vs.stall_s, vs.latency_min_requests, vs.ttft_p99_jump_factor, vs.ttft_p99_max_s,
                        vs.itl_p99_max_s)  # fmt: skip
        b.add(*not_up(Health("refused", "[Errno 111] Connection refused"), server, limits).findings)
    return judged_result(b.build("vllm"))


async def test_a_port_down_again_is_suggested_and_paged_again(tmp_path: Path) -> None:
    seen: list[str] = []
    results: dict[str, CheckResult] = {}
    r = remediator(tmp_path, vllm_app(seen), results)

    def suggested() -> list[str]:
        return [e["problem"] for e in events(tmp_path) if e["event"] == "decision" and e["verdict"] == "suggest"]

    def paged() -> list[str]:
        return [e["reason"] for e in events(tmp_path) if e["event"] == "page"]

    for episode in (1, 2):
        results.update(infiniband=infiniband(down=True), vllm=vllm(dead=True))  # the port down, vLLM down with it
        await settle(r)
        await settle(r)
        assert suggested() == ["check:infiniband:page"] * episode, events(tmp_path)
        assert len(paged()) == episode and "IB_PORT_DOWN on dgx-a" in paged()[-1], events(tmp_path)
        assert not [e for e in events(tmp_path) if e["event"] == "action_started"]  # no restart under the cause
        results.update(infiniband=infiniband(down=False), vllm=vllm(dead=False))  # fixed: healthy again
        await settle(r)
        await settle(r)
