"""The recording rules for many nodes: generated from the same table as the peer_compare check, valid for
``promtool check rules``, and computing each node's deviation from the cluster median (``promtool test rules``)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import REPO
from dgxdoctor.alerts.peer_rules import render

pytestmark = pytest.mark.integration

RULES_FILE = REPO / "src" / "dgxdoctor" / "alerts" / "peer_compare.rules.yml"


def promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    tool = shutil.which("promtool")
    if tool is None:
        pytest.skip("promtool not installed (Debian package prometheus)")
    return subprocess.run([tool, *args], capture_output=True, text=True, timeout=120, cwd=cwd)


def test_shipped_rules_are_generated() -> None:
    assert RULES_FILE.read_text() == render(), "regenerate: python -m dgxdoctor.alerts.peer_rules > " + str(
        RULES_FILE.relative_to(REPO)
    )


def test_rules_are_valid() -> None:
    done = promtool("check", "rules", str(RULES_FILE))
    assert done.returncode == 0, done.stdout + done.stderr


def test_deviation_from_the_cluster_median(tmp_path: Path) -> None:
    def series(metric: str, node: str, value: float, **labels: str) -> dict[str, str]:
        lab = ",".join(f'{k}="{v}"' for k, v in {"node": node, **labels}.items())
        return {"series": f"{metric}{{{lab}}}", "values": f"{value}x3"}

    util = "dgxdoctor_gpu_utilization_ratio"
    rcv = "dgxdoctor_ib_port_rcv_bytes_per_second"
    inputs = []
    for node, u, r in (("dgx-a", 0.5, 10e9), ("dgx-b", 0.5, 10e9), ("dgx-c", 0.25, 5e9)):
        for gpu in ("0", "1"):
            inputs.append(series(util, node, u, gpu=gpu, pci_bus_id=f"p{gpu}"))
        inputs.append(series(rcv, node, r, device="mlx5_0", port="1"))
    test = {
        "rule_files": [str(RULES_FILE)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": inputs,
                "promql_expr_test": [
                    {
                        "expr": f"node:{util}:deviation_ratio",
                        "eval_time": "2m",
                        "exp_samples": [
                            {"labels": f'node:{util}:deviation_ratio{{node="dgx-a"}}', "value": 0},
                            {"labels": f'node:{util}:deviation_ratio{{node="dgx-b"}}', "value": 0},
                            {"labels": f'node:{util}:deviation_ratio{{node="dgx-c"}}', "value": -0.5},
                        ],
                    },
                    {
                        "expr": f'node_rail:{rcv}:deviation_ratio{{node="dgx-c"}}',
                        "eval_time": "2m",
                        "exp_samples": [
                            {
                                "labels": f'node_rail:{rcv}:deviation_ratio{{node="dgx-c",device="mlx5_0",port="1"}}',
                                "value": -0.5,
                            }
                        ],
                    },
                ],
            }
        ],
    }
    path = tmp_path / "test.yml"
    path.write_text(json.dumps(test))  # JSON is YAML
    done = promtool("test", "rules", str(path))
    assert done.returncode == 0, done.stdout + done.stderr
