"""The peer's side of the cross-node probe: what a join request may ask for, and when the peer refuses."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from dgxdoctor.checks.nccl import NcclSettings
from dgxdoctor.daemon.nccl_join import NcclJoinService, Refused
from dgxdoctor.environment import Environment
from dgxdoctor.validation import validate
from proctree import write_process
from tokens import one_token

GOOD: dict[str, Any] = {
    "run_id": "0123456789abcdef0123456789abcdef",
    "master_addr": "10.0.0.1",
    "master_port": 29555,
    "nnodes": 2,
    "node_rank": 1,
    "join_timeout_s": 30,
}


ALWAYS = ["00:00-24:00"]


def service(tmp_path: Path, **settings: Any) -> NcclJoinService:
    """A node that allows joins (the probe enabled, inside its maintenance window) unless ``settings`` say not."""
    (tmp_path / "proc").mkdir(exist_ok=True)
    env = Environment(proc_root=tmp_path / "proc", sysfs_root=tmp_path / "sys", state_dir=tmp_path / "state")
    settings = {"enabled": True, "maintenance_windows": ALWAYS, **settings}
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
        ({"min_bytes": "0"}, "min_bytes"),
        ({"max_bytes": "0K"}, "max_bytes"),
        ({"max_bytes": "999999999999G"}, "max_bytes"),
        ({"min_bytes": "1G", "max_bytes": "8M"}, "min_bytes"),
        ({"force": True}, "force"),
        # a line break after a valid value ($ matches before one): never into NCCL's environment or argv
        ({"run_id": "0123456789abcdef0123456789abcdef\n"}, "run_id"),
        ({"algo": "Ring\n"}, "algo"),
        ({"rail": "mlx5_0\n"}, "rail"),
        ({"master_addr": "dgx-a\n"}, "master_addr"),
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


def test_a_node_with_the_probe_disabled_refuses_to_join(tmp_path: Path) -> None:
    svc = service(tmp_path, enabled=False, serving_python=sys.executable)
    with pytest.raises(Refused) as caught:
        svc.start(svc.parse(GOOD))
    assert caught.value.status == 409 and "enabled = false" in str(caught.value)


@pytest.mark.parametrize("windows", [[], ["Sat 02:00-02:01"]])
def test_a_join_outside_this_nodes_maintenance_window_is_refused(tmp_path: Path, windows: list[str]) -> None:
    svc = service(tmp_path, maintenance_windows=windows, serving_python=sys.executable)
    with pytest.raises(Refused) as caught:
        svc.start(svc.parse(GOOD))
    assert caught.value.status == 409 and "maintenance window" in str(caught.value)


def test_the_serving_guard_is_this_nodes_own_never_the_requests(tmp_path: Path) -> None:
    """Only this node's own ``force`` overrides its serving guard; a request cannot carry one."""
    write_process(tmp_path / "proc", 31, "python3", ["python3", "-m", "vllm.entrypoints.openai.api_server"])
    svc = service(tmp_path, serving_python=sys.executable)
    with pytest.raises(Refused) as caught:
        svc.parse({**GOOD, "force": True})
    assert caught.value.status == 400
    forced_here = service(tmp_path, serving_python=sys.executable, force=True, command=["true"])
    assert forced_here.start(forced_here.parse(GOOD)).done.wait(30)


@pytest.mark.parametrize(("key", "value"), [("min_bytes", "0"), ("max_bytes", "32G"), ("min_bytes", "2G")])
def test_the_local_probe_sizes_are_bounded_too(key: str, value: str) -> None:
    with pytest.raises(ValueError, match=key):
        validate(NcclSettings, {key: value})


async def test_a_node_without_a_token_refuses_every_join_even_from_loopback(tmp_path: Path) -> None:
    from dgxdoctor.daemon.app import AppState, make_app
    from dgxdoctor.daemon.nccl_join import add_routes
    from dgxdoctor.exporters.collector import make_registry
    from dgxdoctor.fleet.store import ResultStore
    from webtest import TestClient, TestServer

    svc = service(tmp_path, command=["true"])
    store = ResultStore("dgx-b")
    for token, status in ((None, 403), ("join-token-0123456789", 401)):
        state = AppState(store, make_registry(store), lambda: {"healthy": True}, one_token(token), None)
        state.extra_routes = lambda app: add_routes(app, svc)
        client: TestClient[Any, Any] = TestClient(TestServer(make_app(state), host="127.0.0.1"))
        await client.start_server()
        try:
            assert (await client.post("/nccl/join", json=GOOD)).status == status
            assert (await client.get(f"/nccl/join/{GOOD['run_id']}")).status == status
        finally:
            await client.close()
    assert svc.status(GOOD["run_id"]) is None  # nothing started
