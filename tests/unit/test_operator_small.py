"""Small things a new operator hit: option lists that name nothing, two role keys, one remedy for many findings."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import run_cli
from dgxdoctor.commands.report import report_table
from dgxdoctor.config import ConfigError, parse_config
from dgxdoctor.result import CheckResult, Finding, ResultBuilder, Status


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("--only", "gpu", "--skip", "gpu"), "--only and --skip both name gpu"),
        (("--only", ",,"), "--only ',,' names no check"),
        (("--skip", " , "), "--skip ' , ' names no check"),
    ],
)
def test_check_options_that_contradict_or_name_nothing_are_usage_errors(args: tuple[str, ...], said: str) -> None:
    done = run_cli("check", *args)
    assert done.returncode == 64
    assert said in done.stderr


def test_remediation_role_follows_the_node_role() -> None:
    config = parse_config({"node": {"role": "worker"}, "remediation": {"mode": "observe"}})
    assert config.model.remediation.role == "worker"  # type: ignore[attr-defined]
    acting = parse_config({"node": {"role": "head"}, "remediation": {"mode": "act"}, "daemon": {"token": "t" * 32}})
    assert acting.model.remediation.role == "head"  # type: ignore[attr-defined]
    untabled = parse_config({"node": {"role": "worker"}})  # no [remediation] table: the default observe mode
    assert untabled.model.remediation.role == "worker"  # type: ignore[attr-defined]


def test_two_roles_that_disagree_name_the_key() -> None:
    with pytest.raises(ConfigError) as raised:
        parse_config({"node": {"role": "head"}, "remediation": {"role": "worker"}})
    ((key, problem),) = raised.value.problems
    assert key == "remediation.role"
    assert "contradicts node.role 'head'" in problem


def test_every_findings_remedy_is_printed_once() -> None:
    b = ResultBuilder("infiniband")
    b.add(Finding("IB_PORT_DOWN", Status.CRITICAL, "port down", "mlx5_0/1", remedy="reseat the cable of mlx5_0"))
    b.add(Finding("IB_SYMBOL_ERRORS_RATE", Status.WARNING, "errors", "mlx5_1/1", remedy="check the mlx5_1 optic"))
    b.add(Finding("IB_PORT_DOWN", Status.CRITICAL, "port down", "mlx5_2/1", remedy="reseat the cable of mlx5_0"))
    result: CheckResult = b.build("2 of 3 ports bad")
    table = report_table("dgx-a", [result])
    assert table.count("remedy: reseat the cable of mlx5_0") == 1
    assert table.count("remedy: check the mlx5_1 optic") == 1


def test_config_file_with_two_roles_exits_78(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text('[node]\nrole = "head"\n[remediation]\nrole = "worker"\n')
    done = run_cli("check", "--config", str(config), "--only", "host")
    assert done.returncode == 78
    assert "remediation.role" in done.stderr
