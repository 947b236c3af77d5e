"""NCCL environment: env-file and environ parsing, NCCL name syntax, sysfs reading, decisions, the check."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from conftest import FIXTURES
from dgxdoctor.checks.nccl_env import NcclEnvCheck, NcclEnvSettings
from dgxdoctor.environment import Environment
from dgxdoctor.judge.nccl_env import compare_envs, evaluate_nccl_env
from dgxdoctor.result import Finding, Status
from dgxdoctor.sources.nccl_env import (
    SpecError,
    env_facts,
    parse_env_file,
    parse_environ,
    parse_name_spec,
    read_net_interfaces,
)
from dgxdoctor.sources.procfs import command_matches
from dgxdoctor.sources.sysfs_ib import gid_is_zero, ports_by_device
from dgxdoctor.validation import validate

NCCL = FIXTURES / "nccl_env"
SYSFS = NCCL / "sysfs"
HERE = {"192.168.10.11", "127.0.0.1", "fe80::ba3f:d2ff:feaa:bbcc%bond0"}

TUTORIAL_VALUES = {
    "NCCL_IB_HCA": "mlx5_0,mlx5_2",
    "NCCL_IB_GID_INDEX": "3",
    "NCCL_SOCKET_IFNAME": "bond0",
    "GLOO_SOCKET_IFNAME": "bond0",
    "NCCL_NET_GDR_LEVEL": "SYS",
    "NCCL_DEBUG": "WARN",
    "NCCL_DEBUG_SUBSYS": "INIT,NET",
    "VLLM_HOST_IP": "192.168.10.11",
}


def pairs(findings: list[Finding], *, include_ok: bool = False) -> list[tuple[str, Status, str | None]]:
    return [(f.code, f.status, f.subject) for f in findings if include_ok or f.status is not Status.OK]


# ---- parsing ----


def test_tutorial_file() -> None:
    parsed = parse_env_file((NCCL / "nccl.sh").read_text())
    assert parsed.values == TUTORIAL_VALUES
    assert parsed.problems == ()


def test_env_file_lines_that_are_not_assignments_are_never_run() -> None:
    text = "\n".join(
        [
            "export NCCL_IB_HCA='mlx5_0 mlx5_1'",  # quoted space kept
            "source /etc/other.sh",
            "if [ -e /x ]; then export NCCL_DEBUG=INFO; fi",
            "export NCCL_SOCKET_IFNAME=$(ls /sys/class/net | head -1)",
            "export NCCL_ALGO=Ring # trailing comment",
            "NCCL_P2P_LEVEL=NVL touch /tmp/pwned",
            'export BROKEN="unterminated',
            "export -n NCCL_X",
            "export A=1 B=2",
        ]
    )
    parsed = parse_env_file(text)
    assert parsed.values == {
        "NCCL_IB_HCA": "mlx5_0 mlx5_1",
        "NCCL_ALGO": "Ring",
        "A": "1",
        "B": "2",
    }
    lines = [line for line, _ in parsed.problems]
    assert lines == [2, 3, 4, 6, 7, 8]


def test_an_overlong_line_is_a_problem_and_the_rest_is_read() -> None:
    parsed = parse_env_file("export NCCL_X=" + "x" * 70_000 + "\nexport NCCL_IB_HCA=mlx5_0\n")
    assert parsed.values == {"NCCL_IB_HCA": "mlx5_0"}
    assert [line for line, _ in parsed.problems] == [1]
    assert "70014 characters long" in parsed.problems[0][1]


def test_environ() -> None:
    raw = b"PATH=/usr/bin\0NCCL_IB_HCA=mlx5_0:1\0EMPTY=\0NOEQUALS\0X=a=b\0"
    assert parse_environ(raw) == {"PATH": "/usr/bin", "NCCL_IB_HCA": "mlx5_0:1", "EMPTY": "", "X": "a=b"}


@pytest.mark.parametrize(
    ("value", "exclude", "exact", "entries"),
    [
        ("mlx5_0,mlx5_1", False, False, (("mlx5_0", None), ("mlx5_1", None))),
        ("mlx5_0:1,mlx5_1:1", False, False, (("mlx5_0", 1), ("mlx5_1", 1))),
        ("^=mlx5_3", True, True, (("mlx5_3", None),)),
        ("=mlx5_0:2", False, True, (("mlx5_0", 2),)),
        ("^mlx5_bond", True, False, (("mlx5_bond", None),)),
    ],
)
def test_name_spec(value: str, exclude: bool, exact: bool, entries: tuple[tuple[str, int | None], ...]) -> None:
    spec = parse_name_spec(value, allow_port=True)
    assert (spec.exclude, spec.exact, spec.entries) == (exclude, exact, entries)


def test_name_spec_prefix_and_exact_matching() -> None:
    assert parse_name_spec("mlx5_1", allow_port=True).matches("mlx5_10")  # NCCL: prefix by default
    assert not parse_name_spec("=mlx5_1", allow_port=True).matches("mlx5_10")
    with pytest.raises(SpecError, match="no ':port'"):
        parse_name_spec("bond0:1", allow_port=False)
    with pytest.raises(SpecError, match="port must be a positive number"):
        parse_name_spec("mlx5_0:x", allow_port=True)
    with pytest.raises(SpecError, match="names nothing"):
        parse_name_spec("^=", allow_port=True)


def test_sysfs_net_tree() -> None:
    interfaces = read_net_interfaces(SYSFS)
    assert sorted(interfaces) == ["bond0", "ens1f0np0", "ens1f1np1", "eth0", "ifb0", "lo"]
    assert interfaces["lo"].loopback and not interfaces["eth0"].loopback
    assert interfaces["bond0"].up and not interfaces["ifb0"].up
    assert interfaces["lo"].up  # operstate "unknown": flags say IFF_UP


def test_sysfs_infiniband_tree() -> None:
    ports = ports_by_device(SYSFS, gids=True)
    assert sorted(ports) == ["mlx5_0", "mlx5_1", "mlx5_2"]
    port = ports["mlx5_0"][1]
    assert (port.state, port.link_layer) == ("Active", "Ethernet")
    assert port.gids[3] == "0000:0000:0000:0000:0000:ffff:c0a8:0a0b"
    assert port.gid_types == {0: "IB/RoCE v1", 1: "RoCE v2", 2: "IB/RoCE v1", 3: "RoCE v2"}
    assert gid_is_zero(ports["mlx5_1"][1].gids[3])
    assert ports["mlx5_2"][1].link_layer == "InfiniBand"
    assert ports_by_device(SYSFS / "nowhere") == {}


# ---- decisions ----


def evaluate(values: dict[str, str], addresses: set[str] | None = HERE) -> list[Finding]:
    return evaluate_nccl_env(values, read_net_interfaces(SYSFS), ports_by_device(SYSFS, gids=True), addresses)


def test_tutorial_values_are_clean_here() -> None:
    findings = evaluate(TUTORIAL_VALUES)
    assert pairs(findings) == []
    info = [f.message for f in findings if f.code == "NCCL_IB_GID_TYPE"]
    assert info == [
        "mlx5_0/1 GID 3 = 0000:0000:0000:0000:0000:ffff:c0a8:0a0b (RoCE v2, link layer Ethernet)",
    ]
    # mlx5_2 is InfiniBand with no GID 3: a note only, NCCL addresses IB ports by LID
    assert ("NCCL_IB_GID_INDEX_UNUSED", Status.OK, "mlx5_2/1") in pairs(findings, include_ok=True)


def test_ib_port_without_gid_is_a_note() -> None:
    findings = evaluate({**TUTORIAL_VALUES, "NCCL_IB_HCA": "=mlx5_2:1"})
    assert pairs(findings) == []
    assert findings[0].message.endswith("(InfiniBand: unused within one subnet)")


def test_roce_port_without_ip_has_zero_gid() -> None:
    findings = evaluate({**TUTORIAL_VALUES, "NCCL_IB_HCA": "mlx5_1"})
    assert pairs(findings) == [("NCCL_IB_GID_MISSING", Status.CRITICAL, "mlx5_1/1")]
    assert findings[0].message == "NCCL_IB_GID_INDEX=3: mlx5_1/1 has an all-zero GID at index 3"


def test_roce_v1_gid_is_warning() -> None:
    findings = evaluate({**TUTORIAL_VALUES, "NCCL_IB_HCA": "mlx5_0:1", "NCCL_IB_GID_INDEX": "2"})
    assert pairs(findings) == [("NCCL_IB_GID_NOT_ROCEV2", Status.WARNING, "mlx5_0/1")]


def test_unknown_hca_and_port() -> None:
    findings = evaluate({**TUTORIAL_VALUES, "NCCL_IB_HCA": "mlx5_7,mlx5_0:2"})
    assert pairs(findings) == [
        ("NCCL_IB_HCA_MISSING", Status.CRITICAL, "mlx5_7"),
        ("NCCL_IB_PORT_MISSING", Status.CRITICAL, "mlx5_0/2"),
    ]
    assert "have: mlx5_0, mlx5_1, mlx5_2" in findings[0].message


def test_hca_prefix_matches_every_device() -> None:
    findings = evaluate({**TUTORIAL_VALUES, "NCCL_IB_HCA": "mlx5"})
    # prefix "mlx5" selects all three; mlx5_1 (RoCE, no IP) lacks GID 3
    assert ("NCCL_IB_GID_MISSING", Status.CRITICAL, "mlx5_1/1") in pairs(findings)


def test_hca_exclusion() -> None:
    findings = evaluate({**TUTORIAL_VALUES, "NCCL_IB_HCA": "^mlx5_1,mlx5_2"})
    assert pairs(findings) == []
    assert [f.subject for f in findings if f.code == "NCCL_IB_GID_TYPE"] == ["mlx5_0/1"]


def test_no_rdma_devices_at_all(tmp_path: Path) -> None:
    findings = evaluate_nccl_env(
        TUTORIAL_VALUES, read_net_interfaces(SYSFS), ports_by_device(tmp_path, gids=True), HERE
    )
    assert pairs(findings) == [
        ("NCCL_IB_HCA_MISSING", Status.CRITICAL, "mlx5_0"),
        ("NCCL_IB_HCA_MISSING", Status.CRITICAL, "mlx5_2"),
    ]
    assert "have: none" in findings[0].message
    assert "/dev/infiniband" in (findings[0].remedy or "")


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("bond0", []),
        ("ens1f0", []),  # prefix of ens1f0np0
        ("=ens1f0", [("NCCL_IFNAME_MISSING", Status.CRITICAL, "NCCL_SOCKET_IFNAME")]),
        ("lo", [("NCCL_IFNAME_LOOPBACK", Status.CRITICAL, "NCCL_SOCKET_IFNAME")]),
        ("eth1", [("NCCL_IFNAME_MISSING", Status.CRITICAL, "NCCL_SOCKET_IFNAME")]),
        ("ens1f1np1", [("NCCL_IFNAME_DOWN", Status.WARNING, "ens1f1np1")]),
        ("^docker,lo", []),
        (
            "^e,b,i",
            [
                ("NCCL_IFNAME_LOOPBACK", Status.CRITICAL, "NCCL_SOCKET_IFNAME"),
                ("NCCL_IFNAME_MISSING", Status.CRITICAL, "NCCL_SOCKET_IFNAME"),
            ],
        ),
        ("bond0:1", [("NCCL_ENV_INVALID", Status.CRITICAL, "NCCL_SOCKET_IFNAME")]),
    ],
)
def test_socket_ifname(value: str, expected: list[tuple[str, Status, str]]) -> None:
    assert pairs(evaluate({**TUTORIAL_VALUES, "NCCL_SOCKET_IFNAME": value})) == expected


# ---- a host without /sys/class/net (a container or CI machine kind without sysfs net) ----


def _no_sysfs_net(tmp_path: Path) -> Path:
    root = tmp_path / "sys"
    root.mkdir()
    return root


def test_without_sysfs_net_the_kernels_list_names_the_interfaces(tmp_path: Path) -> None:
    interfaces = read_net_interfaces(_no_sysfs_net(tmp_path), lambda: ["bond0", "lo"])
    assert interfaces is not None and sorted(interfaces) == ["bond0", "lo"]
    findings = evaluate_nccl_env(TUTORIAL_VALUES, interfaces, ports_by_device(SYSFS, gids=True), HERE)
    # bond0 exists (state unknown: not "down"); no false NCCL_IFNAME_MISSING
    assert [f.code for f in findings if f.code.startswith("NCCL_IFNAME")] == []
    loop = evaluate_nccl_env({**TUTORIAL_VALUES, "NCCL_SOCKET_IFNAME": "lo"}, interfaces, {}, HERE)
    assert ("NCCL_IFNAME_LOOPBACK", Status.CRITICAL, "NCCL_SOCKET_IFNAME") in pairs(loop)


def test_the_real_kernel_list_answers_here(tmp_path: Path) -> None:
    """The default source is the kernel's if_nameindex(): every Linux host has at least lo."""
    interfaces = read_net_interfaces(_no_sysfs_net(tmp_path))
    assert interfaces is not None and "lo" in interfaces


def test_when_no_source_answers_the_interfaces_are_unknown_not_missing(tmp_path: Path) -> None:
    def refused() -> list[str]:
        raise OSError("if_nameindex: permission denied")

    interfaces = read_net_interfaces(_no_sysfs_net(tmp_path), refused)
    assert interfaces is None
    findings = evaluate_nccl_env(TUTORIAL_VALUES, interfaces, {}, HERE)
    ifname = [(f.code, f.status) for f in findings if f.subject in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")]
    assert ifname == [("NCCL_IFNAME_UNKNOWN", Status.UNKNOWN), ("NCCL_IFNAME_UNKNOWN", Status.UNKNOWN)]


def test_the_check_takes_the_kernels_list_without_sysfs_net(tmp_path: Path) -> None:
    env = Environment(node="n1", sysfs_root=_no_sysfs_net(tmp_path), proc_root=tmp_path / "proc", state_dir=tmp_path)
    (tmp_path / "proc").mkdir()
    check = NcclEnvCheck(
        NcclEnvSettings(env_file=NCCL / "nccl.sh"), env, addresses=lambda: HERE, interface_names=lambda: ["bond0"]
    )
    assert "NCCL_IFNAME_MISSING" not in {f.code for f in check.run().findings}


def test_gloo_ifname_checked_too() -> None:
    findings = evaluate({**TUTORIAL_VALUES, "GLOO_SOCKET_IFNAME": "lo"})
    assert pairs(findings) == [("NCCL_IFNAME_LOOPBACK", Status.CRITICAL, "GLOO_SOCKET_IFNAME")]


def test_unset_variables() -> None:
    values = {k: v for k, v in TUTORIAL_VALUES.items() if k not in ("NCCL_DEBUG", "NCCL_SOCKET_IFNAME")}
    assert pairs(evaluate(values)) == [
        ("NCCL_ENV_UNSET", Status.WARNING, "NCCL_SOCKET_IFNAME"),
        ("NCCL_DEBUG_UNSET", Status.WARNING, "NCCL_DEBUG"),
    ]


@pytest.mark.parametrize(
    ("ip", "code"),
    [
        ("192.168.10.11", None),
        ("192.168.10.12", "NCCL_HOST_IP_NOT_LOCAL"),
        ("<本机业务IP>", "NCCL_HOST_IP_INVALID"),
        ("fe80::ba3f:d2ff:feaa:bbcc", None),
    ],
)
def test_host_ip(ip: str, code: str | None) -> None:
    found = [f.code for f in evaluate({**TUTORIAL_VALUES, "VLLM_HOST_IP": ip}) if f.status is Status.CRITICAL]
    assert found == ([code] if code else [])


def test_bad_gid_index() -> None:
    assert pairs(evaluate({**TUTORIAL_VALUES, "NCCL_IB_GID_INDEX": "three"})) == [
        ("NCCL_ENV_INVALID", Status.CRITICAL, "NCCL_IB_GID_INDEX")
    ]


def test_drift_between_file_and_process() -> None:
    proc = {**TUTORIAL_VALUES, "NCCL_IB_HCA": "mlx5_0", "PATH": "/usr/bin", "NCCL_ALGO": "Ring"}
    del proc["NCCL_DEBUG"]
    findings = compare_envs(TUTORIAL_VALUES, "nccl.sh", proc, "raylet (pid 7)")
    assert [f.subject for f in findings] == ["NCCL_ALGO", "NCCL_DEBUG", "NCCL_IB_HCA"]
    assert findings[2].message == "NCCL_IB_HCA is 'mlx5_0,mlx5_2' in nccl.sh but 'mlx5_0' in raylet (pid 7)"
    assert findings[1].message == "NCCL_DEBUG is 'WARN' in nccl.sh but unset in raylet (pid 7)"
    assert compare_envs(TUTORIAL_VALUES, "a", {**TUTORIAL_VALUES, "PATH": "/x"}, "b") == []


def test_facts_keep_host_ip_apart() -> None:
    facts = env_facts({**TUTORIAL_VALUES, "HOME": "/root"})
    assert facts["nccl_env.NCCL_IB_HCA"] == "mlx5_0,mlx5_2"
    assert facts["host_ip"] == "192.168.10.11"
    assert "nccl_env.VLLM_HOST_IP" not in facts and "nccl_env.HOME" not in facts


# ---- the check, with a fake /proc tree ----


def fake_proc(root: Path, pid: int, comm: str, cmdline: list[str], environ: dict[str, str]) -> None:
    d = root / str(pid)
    d.mkdir(parents=True)
    (d / "comm").write_text(comm + "\n")
    (d / "cmdline").write_bytes(b"\0".join(a.encode() for a in cmdline) + b"\0")
    (d / "environ").write_bytes(b"".join(f"{k}={v}".encode() + b"\0" for k, v in environ.items()))
    uid = os.geteuid()  # the test's own: a trusted process (procfs.trusted_uids)
    (d / "status").write_text(f"Name:\t{comm}\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n")


def make(tmp_path: Path, **settings: object) -> NcclEnvCheck:
    env = Environment(node="n1", sysfs_root=SYSFS, proc_root=tmp_path / "proc", state_dir=tmp_path)
    (tmp_path / "proc").mkdir(exist_ok=True)
    return NcclEnvCheck(validate(NcclEnvSettings, settings), env, addresses=lambda: HERE)  # type: ignore[arg-type]


def test_check_file_only(tmp_path: Path) -> None:
    result = make(tmp_path, env_file=NCCL / "nccl.sh").run()
    assert result.status is Status.OK, result.summary
    assert result.summary == f"{NCCL / 'nccl.sh'}: 8 NCCL/GLOO/VLLM variables consistent with this host"
    assert result.facts["nccl_env.NCCL_SOCKET_IFNAME"] == "bond0" and result.facts["host_ip"] == "192.168.10.11"


def test_check_process_and_drift(tmp_path: Path) -> None:
    proc_env = {**TUTORIAL_VALUES, "NCCL_SOCKET_IFNAME": "lo", "PATH": "/usr/bin"}
    fake_proc(tmp_path / "proc", 4242, "raylet", ["/venv/ray/core/src/ray/raylet/raylet", "--x"], proc_env)
    fake_proc(tmp_path / "proc", 4300, "raylet", ["/venv/ray/core/src/ray/raylet/raylet"], {})
    fake_proc(tmp_path / "proc", 17, "bash", ["bash"], {"NCCL_SOCKET_IFNAME": "x"})
    (tmp_path / "proc" / "self").mkdir()
    result = make(tmp_path, env_file=NCCL / "nccl.sh", process_name="raylet").run()
    assert result.status is Status.CRITICAL
    assert pairs(list(result.findings)) == [
        ("NCCL_IFNAME_LOOPBACK", Status.CRITICAL, "NCCL_SOCKET_IFNAME"),
        ("NCCL_ENV_DRIFT", Status.WARNING, "NCCL_SOCKET_IFNAME"),
    ]
    assert result.summary.startswith("raylet (pid 4242): NCCL_SOCKET_IFNAME=lo selects loopback lo")
    assert result.facts["nccl_env.NCCL_SOCKET_IFNAME"] == "lo"  # what the running process uses


def test_check_process_not_running_falls_back_to_file(tmp_path: Path) -> None:
    result = make(tmp_path, env_file=NCCL / "nccl.sh", process_name="vllm").run()
    assert result.status is Status.OK
    assert result.summary.endswith("(no vllm process)")


def test_check_skipped_when_nothing_to_read(tmp_path: Path) -> None:
    result = make(tmp_path, env_file=tmp_path / "absent.sh", process_name="vllm").run()
    assert result.status is Status.SKIPPED
    assert result.summary == f"no NCCL environment to check: {tmp_path / 'absent.sh'} absent; no vllm process"


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file; the permission error cannot happen")
def test_check_unreadable_environ(tmp_path: Path) -> None:
    fake_proc(tmp_path / "proc", 99, "vllm", ["vllm", "serve"], {"NCCL_DEBUG": "WARN"})
    (tmp_path / "proc" / "99" / "environ").chmod(0)
    result = make(tmp_path, env_file=None, process_name="vllm").run()
    assert result.status is Status.UNKNOWN


def test_check_file_with_commands_is_read_not_run(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    env_file = tmp_path / "nccl.sh"
    shutil.copy(NCCL / "nccl.sh", env_file)
    with env_file.open("a") as fh:
        fh.write(f"touch {marker}\nexport NCCL_ALGO=$(touch {marker})\n")
    result = make(tmp_path, env_file=env_file).run()
    assert not marker.exists()
    assert [f.code for f in result.findings if f.code == "NCCL_ENV_FILE_LINE"] == ["NCCL_ENV_FILE_LINE"] * 2


def test_command_matching_reads_comm_and_module() -> None:
    assert command_matches("vllm", "python3", ("/usr/bin/python3", "-m", "vllm.entrypoints.openai.api_server"))
    assert command_matches("raylet", "raylet", ())
    assert not command_matches("raylet", "tail", ("tail", "-f", "/tmp/ray/session_latest/logs/raylet.out"))
