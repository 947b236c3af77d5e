"""The peer's side of the cross-node probe: what a join request may ask for, and when the peer refuses."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from dgxdoctor.checks.nccl import NcclSettings
from dgxdoctor.daemon.nccl_join import NcclJoinService, Refused
from dgxdoctor.environment import Environment
from proctree import write_process

GOOD: dict[str, Any] = {
    "run_id": "0123456789abcdef0123456789abcdef",
    "master_addr": "10.0.0.1",
    "master_port": 29555,
    "nnodes": 2,
    "node_rank": 1,
    "join_timeout_s": 30,
}


def service(tmp_path: Path, **settings: Any) -> NcclJoinService:
    (tmp_path / "proc").mkdir(exist_ok=True)
    env = Environment(proc_root=tmp_path / "proc", sysfs_root=tmp_path / "sys", state_dir=tmp_path / "state")
    cfg = NcclSettings(vllm_url="", env_file=None, **settings)
    return NcclJoinService(lambda: cfg, lambda: env)


@pytest.mark.parametrize(
    ("change", "where"),
    [
        ({"run_id": "../../etc"}, "run_id"),
        ({"master_addr": "10.0.0.1; reboot"}, "master_addr"),
        ({"master_addr": "-oProxyCommand"}, "master_addr"),
        ({"master_port": 0}, "master_port"),
        ({"algo": "Ring --evil"}, "algo"),
        ({"rail": "mlx5_0 mlx5_1"}, "rail"),
        ({"min_bytes": "8M;"}, "min_bytes"),
        ({"join_timeout_s": 10_000}, "join_timeout_s"),
        ({"command": ["/bin/sh"]}, "command"),
        ({"node_rank": 2}, "node_rank"),
    ],
)
def test_bad_requests_name_the_field(tmp_path: Path, change: dict[str, Any], where: str) -> None:
    with pytest.raises(Refused) as caught:
        service(tmp_path).parse({**GOOD, **change})
    assert caught.value.status == 400 and where in str(caught.value)


def test_not_an_object_is_refused(tmp_path: Path) -> None:
    for doc in ([], "x", None, 3):
        with pytest.raises(Refused):
            service(tmp_path).parse(doc)


def test_refuses_while_vllm_serves_here_unless_forced(tmp_path: Path) -> None:
    svc = service(tmp_path, serving_python=sys.executable)
    write_process(tmp_path / "proc", 31, "python3", ["python3", "-m", "vllm.entrypoints.openai.api_server"])
    with pytest.raises(Refused) as caught:
        svc.start(svc.parse(GOOD))
    assert caught.value.status == 409 and "pid 31" in str(caught.value)


def test_no_serving_python_is_503(tmp_path: Path) -> None:
    svc = service(tmp_path)
    with pytest.raises(Refused) as caught:
        svc.start(svc.parse(GOOD))
    assert caught.value.status == 503


def test_runs_one_probe_at_a_time_and_reports_its_output(tmp_path: Path) -> None:
    # The "probe" is a real program that prints its argv: what this node's config and the request made of it.
    fake = tmp_path / "probe.py"
    fake.write_text("import sys, time, os\ntime.sleep(1)\nprint(' '.join(sys.argv[1:]), os.environ['NCCL_ALGO'])\n")
    svc = service(tmp_path, command=[sys.executable, str(fake)])
    job = svc.start(svc.parse({**GOOD, "algo": "Tree"}))
    with pytest.raises(Refused) as busy:
        svc.start(svc.parse({**GOOD, "run_id": "f" * 32}))
    assert busy.value.status == 409
    assert svc.status(GOOD["run_id"])["state"] == "running"  # type: ignore[index]
    assert job.done.wait(30)
    doc = svc.status(GOOD["run_id"])
    assert doc is not None and doc["state"] == "done" and doc["returncode"] == 0 and doc["has_ib"] is False
    assert doc["stdout"].strip().endswith("Tree")
    assert svc.status("e" * 32) is None
    with pytest.raises(Refused):
        svc.start(svc.parse(GOOD))  # a run id is used once
