"""XID and SXID verdicts: severity, action and remedy from NVIDIA's Xid catalog, repeats, overrides.

Shared by ``checks/xid.py`` (the followed kernel log and NVML events) and ``diagnose`` (a pasted kernel log).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Literal

from msgspec import Struct, field

from dgxdoctor.judge import consequence
from dgxdoctor.result import Action, Finding, Status
from dgxdoctor.sources.xid import CatalogEntry, SxidEvent, XidEvent

ActionKind = Literal["reset_gpu", "reboot_node", "restart_app", "contact_support", "none"]


DEFAULT_APP_LEVEL_XIDS = (13, 31, 43, 45)


ACTION_RANK = {"none": 0, "restart_app": 1, "contact_support": 2, "reset_gpu": 3, "reboot_node": 4}
# What no restart cures (judge.consequence): a person resets the GPU, reboots the node or opens a case.
PERSON_ACTIONS = consequence.PERSON_ACTIONS


class XidClass(Struct, frozen=True):
    """What one resolution class means here: the check's verdict, the alert rule, and (derived) the page.

    ``remedy`` may name ``{bus}`` and ``{xid}``; ``alert`` is the rule that carries the class ("" none).
    """

    key: str
    status: Status
    action: ActionKind
    alert: str
    remedy: str

    @property
    def pages(self) -> bool:
        """A critical verdict no restart cures: remediation suggests it to a person, never acts on it."""
        return self.status is Status.CRITICAL and self.action in PERSON_ACTIONS


REBOOT = XidClass(
    "reboot",
    Status.CRITICAL,
    "reboot_node",
    "DgxdoctorXidRebootRequired",
    "drain the node and reboot it; GPU {bus} cannot be recovered in place. If it recurs, check the GPU's "
    "seating, power and PCIe link, and contact NVIDIA support",
)
RESET = XidClass(
    "reset",
    Status.CRITICAL,
    "reset_gpu",
    "DgxdoctorXidGpuResetRequired",
    "drain GPU {bus} and reset it (nvidia-smi -r -i {bus}, or reboot the node); a restart of vLLM does not clear "
    "it. If it recurs, run dcgmi diag -r 3 and contact NVIDIA support",
)
NVLINK = XidClass(
    "nvlink",
    Status.CRITICAL,
    "reset_gpu",
    "DgxdoctorXidNvlinkError",
    "drain GPU {bus} and reset it (nvidia-smi -r -i {bus}, or reboot the node); check nvidia-smi nvlink -s and "
    "-e on both ends of the link; if it recurs, a field check of the NVLink/NVSwitch path",
)
SUPPORT = XidClass(
    "support",
    Status.CRITICAL,
    "contact_support",
    "DgxdoctorXidContactSupport",
    "drain GPU {bus}, collect nvidia-bug-report.sh and contact NVIDIA support",
)
UPDATE = XidClass(
    "update",
    Status.CRITICAL,
    "contact_support",
    "DgxdoctorXidContactSupport",
    "drain GPU {bus} and update the GPU driver and firmware (no restart clears it); contact NVIDIA support if "
    "it recurs on the current release",
)
RECOVERY = XidClass(
    "recovery",
    Status.CRITICAL,
    "contact_support",
    "DgxdoctorXidRecoveryAction",
    "the driver printed a recovery action for GPU {bus}: follow it (the check's finding names it; reset or "
    "reboot as it says) and follow the Xid catalog",
)
APPLICATION = XidClass(
    "application",
    Status.WARNING,
    "restart_app",
    "DgxdoctorXidApplicationError",
    "restart the application that used GPU {bus} (vLLM worker, Ray actor); the serving process usually dies "
    "with it (VLLM_DEAD then restarts it)",
)
APP_LEVEL = XidClass(
    "app_level",
    Status.WARNING,
    "restart_app",
    "DgxdoctorXidApplicationError",
    "application-level error: check the process on {bus} (its logs, cuda-memcheck); restart it if it hung",
)
INFORMATIONAL = XidClass("informational", Status.OK, "none", "", "no action needed (informational XID)")
UNCLASSIFIED = XidClass(
    "unclassified",
    Status.WARNING,
    "contact_support",
    "",
    "XID {xid} is in a resolution class this dgxdoctor does not know: look it up and contact support",
)

# The one table: NVIDIA's resolution bucket (data/xid_catalog.json) -> the class. The check's verdict
# (assess_xid) and the alert rules (alerts/alert_rules.py) read it; the verdict's finding carries what follows
# (judge.consequence.of_xid), which remediation reads; tests/unit/test_xid_classes.py walks the whole catalog
# through the three.
RESOLUTION_CLASSES: Mapping[str, XidClass] = {
    "RESTART_BM": REBOOT,
    "RESTART_VM": REBOOT,
    "RESET_GPU": RESET,
    "WORKFLOW_XID_48": RESET,  # a double-bit ECC error: the page is retired at the reset
    "WORKFLOW_NVLINK_ERR": NVLINK,
    "WORKFLOW_NVLINK5_ERR": NVLINK,  # the line's Fatal/Nonfatal word refines it (assess_xid)
    "CONTACT_SUPPORT": SUPPORT,
    "CHECK_MECHANICALS": SUPPORT,
    "UPDATE_SWFW": UPDATE,
    "XID_154_EVAL": RECOVERY,  # the recovery action printed in the line refines it (assess_xid)
    "RESTART_APP": APPLICATION,
    "CHECK_UVM": APPLICATION,
    "WORKFLOW_XID_45": APPLICATION,  # preemptive cleanup after the application's own fault
    "IGNORE": INFORMATIONAL,
}


def xid_class(code: int, resolution: str, app_level: Iterable[int] = DEFAULT_APP_LEVEL_XIDS) -> XidClass:
    """The class of one XID: application-level XIDs are the application's whatever their bucket."""
    if code in set(app_level):
        return APP_LEVEL
    return RESOLUTION_CLASSES.get(resolution, UNCLASSIFIED)


class Assessment(Struct, frozen=True):
    status: Status
    action: ActionKind
    remedy: str


def assess_xid(event: XidEvent, entry: CatalogEntry, app_level: Iterable[int] = DEFAULT_APP_LEVEL_XIDS) -> Assessment:
    """Severity and action of one XID: its class in RESOLUTION_CLASSES, refined by what the line itself says."""
    bus = event.pci_bus_id
    cls = xid_class(event.xid, entry.resolution, app_level)
    if cls is RECOVERY and event.recovery_action is not None:
        return _assess_recovery_action(bus, event.recovery_action)
    if cls is NVLINK and event.nvlink_fatal is False:
        return Assessment(
            Status.WARNING,
            "none",
            f"non-fatal NVLink error on {bus}: watch for repeats; check NVLink counters (nvidia-smi nvlink -e)",
        )
    return Assessment(cls.status, cls.action, cls.remedy.format(bus=bus, xid=event.xid))


def _assess_recovery_action(bus: str, action: str | None) -> Assessment:
    text = (action or "").lower()
    if "reboot" in text:
        return Assessment(Status.CRITICAL, "reboot_node", f"the driver requires a node reboot for GPU {bus}")
    if "reset" in text or "drain" in text or "flr" in text:
        return Assessment(Status.CRITICAL, "reset_gpu", f"the driver requires GPU {bus} to be drained and reset")
    if text.startswith("none"):
        return Assessment(Status.OK, "none", "the driver cleared the recovery action")
    return Assessment(
        Status.CRITICAL, "contact_support", f"recovery action '{action}' for GPU {bus}: follow the Xid catalog"
    )


def escalate(assessment: Assessment, repeats: int, threshold: int) -> Assessment:
    """One step up when the same XID repeated on the same GPU ``threshold`` times in the window."""
    # IGNORE-class XIDs (63: a row marked for remapping) stay OK however often they come: NVIDIA says to
    # ignore them, and their failure modes have XIDs of their own (64). ``overrides`` can make them alarm.
    if repeats < threshold or assessment.status != Status.WARNING:
        return assessment
    return Assessment(
        Status.CRITICAL,
        "contact_support",
        f"repeated {repeats} times on the same GPU, which points at the GPU rather than the application: "
        "drain it, run dcgmi diag -r 3, and contact NVIDIA support if it fails",
    )


# Resolutions of the SXid catalog that mean a fatal error when the line lacks the Fatal/Non-fatal word.
FATAL_SXID_RESOLUTIONS = frozenset({"RESET_FABRIC"})


def sxid_fatal(event: SxidEvent, entry: CatalogEntry | None) -> bool:
    """What NVSwitch printed; for a Severity/Data line alone, the catalog's word (unknown codes: non-fatal)."""
    if event.fatal is not None:
        return event.fatal
    return entry is not None and entry.resolution in FATAL_SXID_RESOLUTIONS


def assess_sxid(event: SxidEvent, entry: CatalogEntry | None) -> Assessment:
    """NVSwitch prints Fatal or Non-fatal; the catalog (when it knows the code) refines it."""
    if sxid_fatal(event, entry):
        return Assessment(
            Status.CRITICAL,
            "reboot_node",
            f"fatal NVSwitch error on {event.device} ({event.pci_bus_id}): stop the NVLink workload and "
            "reset the fabric (reboot the node); contact NVIDIA support if it recurs",
        )
    if entry is not None and entry.resolution == "IGNORE":
        return Assessment(Status.OK, "none", "no action needed (informational SXID)")
    return Assessment(
        Status.WARNING,
        "none",
        f"non-fatal NVSwitch error on {event.device}: watch for repeats on link {event.link}",
    )


OVERRIDE_STATUS = {"ok": Status.OK, "warning": Status.WARNING, "critical": Status.CRITICAL}


def override(base: Assessment, status: Literal["ok", "warning", "critical"]) -> Assessment:
    """The operator's ``overrides`` entry for this XID sets the status outright; the remedy says so."""
    new = OVERRIDE_STATUS[status]
    return Assessment(new, base.action if new != Status.OK else "none", base.remedy + " (status set by overrides)")


def worst_action(assessments: Iterable[Assessment]) -> Action | None:
    """The action of the worst warning or critical assessment that has one (the most drastic on a tie)."""
    relevant = [a for a in assessments if a.status in (Status.WARNING, Status.CRITICAL) and a.action != "none"]
    if not relevant:
        return None
    worst = max(relevant, key=lambda a: (a.status.rank, ACTION_RANK[a.action]))
    return Action(worst.action, worst.remedy)


# ---- the live check's verdicts over tallies since the agent started ----


class XidPolicy(Struct, frozen=True):
    """The ``[checks.xid]`` keys the verdict reads (see XidSettings for each one's meaning)."""

    app_level_xids: tuple[int, ...] = DEFAULT_APP_LEVEL_XIDS
    repeat_threshold: int = 3
    repeat_window_s: float = 3600.0
    clear_after_s: float | None = None
    overrides: Mapping[str, Literal["ok", "warning", "critical"]] = field(default_factory=dict)

    def cleared(self, last_seen: float, now: float) -> bool:
        """Events older than ``clear_after_s`` no longer set the status (they stay counted)."""
        return self.clear_after_s is not None and now - last_seen > self.clear_after_s


def assess_tally(
    event: XidEvent, entry: CatalogEntry, times: Iterable[float], now: float, policy: XidPolicy
) -> Assessment:
    """One (GPU, XID)'s verdict: the operator's override, else the catalog's, escalated by repeats in the window."""
    base = assess_xid(event, entry, policy.app_level_xids)
    wanted = policy.overrides.get(str(event.xid))
    if wanted is not None:
        return override(base, wanted)
    repeats = sum(1 for t in times if now - t <= policy.repeat_window_s)
    return escalate(base, repeats, policy.repeat_threshold)


def ago(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.0f} s ago"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min ago"
    return f"{seconds / 3600:.1f} h ago"


def xid_finding(event: XidEvent, name: str, count: int, latest_s: float, assessment: Assessment) -> Finding:
    bus, code = event.pci_bus_id, event.xid
    message = f"XID {code} ({name}) on {bus}: {count} time(s), latest {ago(latest_s)}"
    follows = consequence.of_xid(assessment.status, assessment.action)
    return Finding(f"XID_{code}", assessment.status, message, bus, evidence=event.line, remedy=assessment.remedy,
                   action=follows.action, cure=follows.cure)  # fmt: skip


def sxid_finding(
    event: SxidEvent, entry: CatalogEntry | None, count: int, latest_s: float, assessment: Assessment
) -> Finding:
    bus, code = event.pci_bus_id, event.sxid
    label = entry.name if entry else ("fatal" if sxid_fatal(event, entry) else "non-fatal")
    message = f"SXID {code} ({label}) on {event.device} {bus}: {count} time(s), latest {ago(latest_s)}"
    follows = consequence.of_sxid(assessment.status, assessment.action)
    return Finding(f"SXID_{code}", assessment.status, message, bus, evidence=event.line, remedy=assessment.remedy,
                   action=follows.action, cure=follows.cure)  # fmt: skip


def summary(xids: Sequence[tuple[str, int, int]], sxids: Sequence[tuple[str, int, int]], since: str, notes: str) -> str:
    """``xids``/``sxids``: (bus, code, count); ``since``: "since boot" or the lookback; ``notes``: "; ..." or ""."""
    if not xids and not sxids:
        return f"no XID or SXID errors in the kernel log {since}{notes}"
    parts = [f"XID {code} on {bus} x{count}" for bus, code, count in xids]
    parts += [f"SXID {code} on {bus} x{count}" for bus, code, count in sxids]
    shown = ", ".join(parts[:6]) + (f", and {len(parts) - 6} more" if len(parts) > 6 else "")
    return f"{shown} ({since}){notes}"
