"""What NCCL itself says it used: the transport of every channel, the network plugin and its devices.

The one reader of NCCL's INFO lines (``sources.nccl_tests`` hands them here). Read from NCCL's own
``NCCL_DEBUG=INFO`` lines (``NCCL_DEBUG_SUBSYS=INIT,NET,ENV`` is enough), as printed by
nccl-tests, the bundled probe or any NCCL program. The format is NCCL's ``INFO(NCCL_INIT|NCCL_P2P, "Channel %02d/%01d :
%d[%d] -> %d[%d] [%s] via %s")`` in ``src/transport.cc`` and the network plugins' init lines; examples below are real
lines from public logs. Only parsing here: the verdict (a socket fall-back on a node with IB is critical) lives in
``judge.nccl_transport``.

By hand: ``NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET all_reduce_perf -b 8M -e 8M -g 8 | grep -E 'via|Using'``.
"""

from __future__ import annotations

from typing import Any

from msgspec import Struct, field

from dgxdoctor.lazy_re import lazy_compile

# [1,0]<stdout>:host:1:1 [0] NCCL INFO ...  (Open MPI's --tag-output prefix, aws/aws-k8s-tester#503)
MPI_PREFIX = lazy_compile(r"^\[\d+,\d+\]<std(?:out|err)>:")
# kolyoz1:27225:27907 [3] NCCL INFO Channel 03/0 : 7[3] -> 3[3] [receive] via NET/IBext_v8/3/GDRDMA
#   (NVIDIA/nccl-tests#252)
# hostname-test:985:1263 [5] NCCL INFO Channel 00/0 : 37[5] -> 36[4] via P2P/CUMEM   (NVIDIA/nccl#1814)
# swat1-04:2017630:2017697 [7] NCCL INFO Channel 00/0 : 7[7] -> 6[6] via P2P/direct pointer/read  (NVIDIA/nccl#1412)
# sh-01:98911:98923 [3] NCCL INFO Ring 00 : 3[b01000] -> 4[201000] [send] via NET/Socket/0   (NVIDIA/nccl#278, 2.5)
CHANNEL = lazy_compile(
    r"NCCL INFO (?:Channel|Ring) (\d{1,3})(?:/\d{1,3})? : "
    r"(\d{1,7})\[[0-9a-fA-F]{1,16}\] -> (\d{1,7})\[[0-9a-fA-F]{1,16}\]"
    r"(?: \[(send|receive)\])? via (\S+(?: [^/\s]+)?(?:/\S+)?)"
)
# user:5181:5232 [2] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_2:1/IB [RO]; OOB ibs85f0:192.168.1.10<0>
#   (NVIDIA/nccl-tests#228)
# axa:3048391:3048566 [0] NCCL INFO NET/Socket : Using [0]lo:127.0.0.1<0>   (NVIDIA/nccl#1053)
# NET/IB : Using [0]ibp0:1/IB/SHARP [1]ibp1:1/IB/SHARP [RO]; OOB eth0:10.7.147.73<0>   (NVIDIA/nccl#1584)
NET_USING = lazy_compile(r"NCCL INFO NET/(\w{1,32}) ?: ?Using (.{1,4000})$")
# One device in a NET/... Using list: "[0]mlx5_0:1/IB", "[1]eth0:172.27.213.95<0>", "[0]ibp0:1/IB/SHARP".
NET_DEVICE = lazy_compile(r"\[(\d{1,3})\](\S{1,200})")
# "; OOB ibs85f0:192.168.1.10<0>" -- the out-of-band (bootstrap) interface of the IB plugin
OOB = lazy_compile(r"OOB (\S{1,200})")
# axa:3048391:3048566 [0] NCCL INFO Using network Socket   (NVIDIA/nccl#1053)
# Using network IBext_v8   (NVIDIA/nccl#1584)
USING_NETWORK = lazy_compile(r"NCCL INFO Using network (\w{1,32})")
# ip-172-31-0-11:45384:45384 [0] NCCL INFO NET/IB : No device found.   (NVIDIA/nccl#226)
NO_IB_DEVICE = lazy_compile(r"NCCL INFO NET/IB ?: ?No device found")
# job-...-worker-0:5668:5722 [5] NCCL INFO NVLS multicast support is available on dev 5   (NVIDIA/nccl#1538)
# algo-1:18062:18131 [5] NCCL INFO NVLS multicast support is not available on dev 5   (aws/aws-ofi-nccl#715)
NVLS_SUPPORT = lazy_compile(r"NCCL INFO NVLS multicast support is (not )?available")
# comm 0x596c4b4edb80 rank 0 nRanks 8 nNodes 1 localRanks 8 localRank 0 MNNVL 0   (NVIDIA/nccl#1584)
COMM = lazy_compile(r"NCCL INFO comm 0x[0-9a-f]{1,16} rank (\d{1,7}) nRanks (\d{1,7}) nNodes (\d{1,7})")
# user:5183:5236 [4] NCCL INFO NCCL_IB_HCA set to mlx5_2:1,mlx5_0:1   (NVIDIA/nccl-tests#228)
# axa:3048391:3048566 [0] NCCL INFO NCCL_IB_DISABLE set by environment to 1.   (NVIDIA/nccl#1053)
ENV_SET = lazy_compile(r"NCCL INFO (NCCL_[A-Z0-9_]{1,64}) set (?:by environment )?to (\S{0,400}?)\.?$")
# NCCL version 2.24.3+cuda12.2   (NVIDIA/nccl#1584; nccl-tests prints it too, NVIDIA/nccl-tests#293)
VERSION = lazy_compile(r"NCCL version (?P<version>\d+\.\d+\.\d+)(?P<build>\S*)")


def transport_kind(via: str) -> str:
    """The transport's family from a ``via`` field: ``NET/IBext_v8/3/GDRDMA`` -> ``NET/IB``, ``P2P/CUMEM`` ->
    ``P2P/CUMEM``, ``P2P/direct pointer/read`` -> ``P2P/direct``, ``NET/Socket/0`` -> ``NET/Socket``."""
    parts = via.split("/")
    head = parts[0]
    second = parts[1].split(" ")[0] if len(parts) > 1 else ""
    if head == "NET":
        # IBext_v8, IBext: the IB plugin shipped with HPC-X; both are RDMA
        return "NET/IB" if second.startswith("IB") else f"NET/{second}" if second else "NET"
    return f"{head}/{second}" if second else head


def _net_kind(name: str) -> str:
    return "IB" if name.startswith("IB") else name


class NcclTransport(Struct):
    """What NCCL reported about how it connected its ranks. Empty when there were no INFO lines."""

    # Channel connections per transport family ("NET/IB": 16, "P2P/CUMEM": 24, ...), in first-seen order.
    channels: dict[str, int] = field(default_factory=dict)
    # The first full ``via`` field seen for each family, e.g. "NET/IBext_v8/3/GDRDMA".
    via_examples: dict[str, str] = field(default_factory=dict)
    # "IB" or "Socket" (or a plugin's name), from "Using network ..."; both IB spellings read as "IB".
    network: str | None = None
    # Devices of the network transport, by kind ("IB": ["mlx5_0:1/IB", ...], "Socket": ["eth0:10.0.0.1<0>"]).
    net_devices: dict[str, list[str]] = field(default_factory=dict)
    oob: str | None = None
    ib_absent: bool = False
    nvls_available: bool | None = None
    ranks: int | None = None
    nodes: int | None = None
    # NCCL_* variables NCCL reported as set (NCCL_ALGO, NCCL_PROTO, NCCL_IB_HCA, ...), last value wins.
    env: dict[str, str] = field(default_factory=dict)
    version: str | None = None
    # One line per fact, for evidence.
    lines: dict[str, str] = field(default_factory=dict)

    @property
    def seen(self) -> bool:
        return bool(self.channels or self.network or self.net_devices)

    @property
    def net_channels(self) -> dict[str, int]:
        return {k: v for k, v in self.channels.items() if k.startswith("NET")}

    def to_data(self) -> dict[str, Any]:
        return {
            "channels": dict(self.channels),
            "network": self.network,
            "net_devices": {k: list(v) for k, v in self.net_devices.items()},
            "oob": self.oob,
            "nvls_available": self.nvls_available,
            "ranks": self.ranks,
            "nodes": self.nodes,
            "env": dict(self.env),
            "version": self.version,
        }


def strip_prefix(line: str) -> str:
    """The line without its end of line and Open MPI's ``[1,0]<stdout>:`` tag."""
    return MPI_PREFIX.sub("", line.rstrip("\r\n"))


def _read_channel(t: NcclTransport, line: str) -> bool:
    m = CHANNEL.search(line)
    if m is None:
        return False
    via = m.group(5)
    kind = transport_kind(via)
    t.channels[kind] = t.channels.get(kind, 0) + 1
    t.via_examples.setdefault(kind, via)
    t.lines.setdefault(kind, line.strip())
    return True


def _read_net(t: NcclTransport, line: str) -> bool:
    if (m := NET_USING.search(line)) is not None:
        kind = _net_kind(m.group(1))
        rest = m.group(2)
        devices, _, oob = rest.partition(";")
        names = [d for _, d in NET_DEVICE.findall(devices)]
        if not names:
            return False
        known = t.net_devices.setdefault(kind, [])
        known.extend(n for n in names if n not in known)
        if (o := OOB.search(oob)) is not None:
            t.oob = o.group(1)
        t.lines.setdefault(f"NET/{kind}", line.strip())
        return True
    if (m := USING_NETWORK.search(line)) is not None:
        t.network = _net_kind(m.group(1))
        t.lines.setdefault("network", line.strip())
        return True
    if NO_IB_DEVICE.search(line):
        t.ib_absent = True
        t.lines.setdefault("ib_absent", line.strip())
        return True
    return False


def _read_other(t: NcclTransport, line: str) -> None:
    if (m := NVLS_SUPPORT.search(line)) is not None:
        # Any device with multicast makes it available; "not" only if none had it.
        t.nvls_available = bool(t.nvls_available) or m.group(1) is None
    elif (m := COMM.search(line)) is not None:
        t.ranks, t.nodes = int(m.group(2)), int(m.group(3))
    elif (m := ENV_SET.search(line)) is not None:
        t.env[m.group(1)] = m.group(2)
    elif (m := VERSION.search(line)) is not None and t.version is None:
        t.version = m["version"]


def parse_nccl_info(text: str) -> NcclTransport:
    """Every transport fact in ``text`` (NCCL INFO lines among any other output); never raises."""
    t = NcclTransport()
    for raw in text.splitlines():
        line = strip_prefix(raw)
        if "NCCL" not in line:
            continue
        if "NCCL INFO" in line and (_read_channel(t, line) or _read_net(t, line)):
            continue
        _read_other(t, line)
    return t
