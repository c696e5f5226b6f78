"""The XID and SXid catalogue: for each code the NVIDIA driver documents, its name, how gpulens pages on it, the
likely cause and the action, in one vocabulary. The one table of these facts (as ``dcgmfields`` is of DCGM fields):
the exporter, the alerts and the docs read it; docs/xid.md prints it and cites its sources.

``severity`` is how an alert on the code pages: ``critical`` (the XidError alert's ``codes``), ``warning`` or
``info``. ``action`` is one of ``ACTIONS``. ``escalate_after``: after that many occurrences on the same GPU, counted
across exporter restarts and reboots (the exporter's state directory), the action becomes ``hardware-inspection``;
None where repeats say nothing about the hardware (an application's own faults).

An SXid's ``severity`` is NVIDIA's own split, ``fatal`` (the switch or its links need a reset, the jobs on it fail)
or ``non-fatal`` (corrected or contained); it labels ``gpulens_nvswitch_sxid_errors_total``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

NONE: Final = "none"
CHECK_APPLICATION: Final = "check-application"
RESET_GPU: Final = "reset-gpu"
REBOOT: Final = "reboot"
HARDWARE_INSPECTION: Final = "hardware-inspection"
ACTIONS: Final = (NONE, CHECK_APPLICATION, RESET_GPU, REBOOT, HARDWARE_INSPECTION)
SEVERITIES: Final = ("critical", "warning", "info")
SXID_SEVERITIES: Final = ("fatal", "non-fatal")
HARDWARE_REPEATS: Final = 3  # the third occurrence on one GPU, across reboots, asks for an inspection


@dataclass(frozen=True, slots=True)
class Xid:
    code: int
    name: str
    severity: str
    cause: str
    action: str
    escalate_after: int | None = HARDWARE_REPEATS


@dataclass(frozen=True, slots=True)
class Sxid:
    code: int
    name: str
    severity: str
    action: str


_APP = None  # no escalation: an application's fault, however often

XIDS: Final[tuple[Xid, ...]] = (
    Xid(
        8,
        "GPU stopped processing",
        "info",
        "a channel sat idle past its timeout; an application or driver hang",
        CHECK_APPLICATION,
        _APP,
    ),
    Xid(
        13,
        "graphics engine exception",
        "info",
        "a kernel faulted (illegal instruction, out-of-range access); usually the application, rarely the GPU",
        CHECK_APPLICATION,
        _APP,
    ),
    Xid(
        31,
        "GPU memory page fault",
        "info",
        "a kernel touched an address it does not own (MMU fault)",
        CHECK_APPLICATION,
        _APP,
    ),
    Xid(
        32,
        "invalid or corrupted push buffer",
        "warning",
        "the command stream arrived damaged: the driver, the application, or the PCIe path",
        CHECK_APPLICATION,
    ),
    Xid(38, "driver firmware error", "warning", "the driver's firmware reported an internal error", REBOOT),
    Xid(
        43,
        "GPU stopped processing (channel reset)",
        "info",
        "the driver stopped an application's channel after a fault; the GPU itself is healthy",
        NONE,
        _APP,
    ),
    Xid(
        45,
        "preemptive cleanup",
        "info",
        "the driver cleaned up a channel because of an earlier error or a killed process",
        NONE,
        _APP,
    ),
    Xid(
        48,
        "double-bit ECC error",
        "critical",
        "an uncorrectable memory error; the page is retired or the row remapped at the next reset",
        RESET_GPU,
    ),
    Xid(56, "display engine error", "info", "the display engine failed; no compute consequence", NONE, _APP),
    Xid(
        57,
        "video memory programming error",
        "warning",
        "the memory interface could not be programmed",
        HARDWARE_INSPECTION,
    ),
    Xid(
        58,
        "unstable video memory interface",
        "warning",
        "the memory interface failed its training",
        HARDWARE_INSPECTION,
    ),
    Xid(
        61,
        "internal micro-controller breakpoint",
        "warning",
        "the GPU's management controller hit a warning",
        RESET_GPU,
    ),
    Xid(62, "internal micro-controller halt", "critical", "the GPU's management controller stopped", RESET_GPU),
    Xid(
        63,
        "ECC page retirement or row remap recorded",
        "warning",
        "a memory row was marked for remapping (or a page for retirement); it takes effect at the next reset",
        RESET_GPU,
    ),
    Xid(
        64,
        "ECC page retirement or row remap failure",
        "critical",
        "a bad memory row could not be remapped: the GPU is out of spare rows",
        HARDWARE_INSPECTION,
        1,
    ),
    Xid(68, "video decoder exception", "info", "the video decoder faulted on its input", CHECK_APPLICATION, _APP),
    Xid(
        69,
        "graphics engine class error",
        "info",
        "an invalid method was sent to the graphics engine",
        CHECK_APPLICATION,
        _APP,
    ),
    Xid(74, "NVLink error", "critical", "an NVLink link failed (cable, connector, switch or GPU)", RESET_GPU),
    Xid(
        79,
        "GPU has fallen off the bus",
        "critical",
        "the GPU stopped answering on PCIe: power, thermal, PCIe link or board failure",
        REBOOT,
    ),
    Xid(92, "high single-bit ECC error rate", "warning", "corrected memory errors arrive unusually often", NONE),
    Xid(
        94,
        "contained ECC error",
        "critical",
        "an uncorrectable memory error the GPU contained to one application; others keep running",
        CHECK_APPLICATION,
    ),
    Xid(
        95,
        "uncontained ECC error",
        "critical",
        "an uncorrectable memory error the GPU could not contain: every application on it is affected",
        RESET_GPU,
    ),
    Xid(
        109,
        "context switch timeout",
        "info",
        "a context did not yield in time; usually the application",
        CHECK_APPLICATION,
        _APP,
    ),
    Xid(110, "security fault", "warning", "the GPU flagged a security violation", RESET_GPU),
    Xid(119, "GSP RPC timeout", "critical", "the GPU System Processor stopped answering the driver", RESET_GPU),
    Xid(120, "GSP error", "critical", "the GPU System Processor reported an error", RESET_GPU),
    Xid(121, "C2C link corrected error", "info", "the chip-to-chip link corrected an error", NONE),
    Xid(122, "SPI PMU RPC read failure", "warning", "a read over the board's management interface failed", RESET_GPU),
    Xid(123, "SPI PMU RPC write failure", "warning", "a write over the board's management interface failed", RESET_GPU),
    Xid(
        124, "SPI PMU RPC erase failure", "warning", "an erase over the board's management interface failed", RESET_GPU
    ),
    Xid(
        137,
        "NVLink FLA privilege error",
        "info",
        "an access over NVLink was refused its permissions",
        CHECK_APPLICATION,
        _APP,
    ),
    Xid(
        140,
        "unrecovered ECC error",
        "warning",
        "an uncorrectable memory error the driver could not recover from",
        RESET_GPU,
    ),
    Xid(143, "GPU initialization failure", "warning", "the GPU failed to initialise", REBOOT),
    Xid(144, "NVLink SAW error", "warning", "NVLink's switch-side logic reported an error", RESET_GPU),
    Xid(145, "NVLink RLW error", "warning", "NVLink's receive logic reported an error", RESET_GPU),
    Xid(146, "NVLink TLW error", "warning", "NVLink's transmit logic reported an error", RESET_GPU),
    Xid(147, "NVLink TREX error", "warning", "NVLink's transaction engine reported an error", RESET_GPU),
    Xid(148, "NVLink NVLPW control error", "warning", "NVLink's control logic reported an error", RESET_GPU),
    Xid(
        149,
        "NVLink NETIR error",
        "warning",
        "a link event on the NVLink network (multi-node NVLink systems)",
        RESET_GPU,
    ),
    Xid(150, "NVLink MSE error", "warning", "NVLink's management engine reported an error", RESET_GPU),
    Xid(151, "key rotation error", "warning", "confidential computing could not rotate its keys", RESET_GPU),
    Xid(
        154,
        "GPU recovery action changed",
        "warning",
        "the driver now asks for a recovery (the line names it: drain and reset, reset, reboot)",
        RESET_GPU,
    ),
)

SXIDS: Final[tuple[Sxid, ...]] = (
    Sxid(11004, "ingress invalid ACL", "fatal", RESET_GPU),
    Sxid(11012, "ingress single-bit ECC", "non-fatal", NONE),
    Sxid(11021, "egress invalid ACL", "fatal", RESET_GPU),
    Sxid(12021, "ingress buffer ECC", "fatal", RESET_GPU),
    Sxid(12023, "egress ECC", "fatal", RESET_GPU),
    Sxid(12028, "egress non-posted PRIV error", "non-fatal", NONE),
    Sxid(15008, "route table ECC", "non-fatal", NONE),
    Sxid(19049, "NVLink data link fatal", "fatal", RESET_GPU),
    Sxid(19084, "NVLink replay threshold", "non-fatal", NONE),
    Sxid(20009, "NVLink receive short error rate", "non-fatal", NONE),
    Sxid(20034, "NVLink link down", "fatal", RESET_GPU),
    Sxid(22013, "NVLink minion link interrupt", "non-fatal", NONE),
    Sxid(24007, "source-track timeout", "fatal", RESET_GPU),
    Sxid(26006, "SOE halt", "fatal", REBOOT),
)

XID_BY_CODE: Final = {x.code: x for x in XIDS}
SXID_BY_CODE: Final = {s.code: s for s in SXIDS}
PAGING_CODES: Final = tuple(x.code for x in XIDS if x.severity == "critical")

assert all(x.action in ACTIONS and x.severity in SEVERITIES for x in XIDS)
assert all(s.action in ACTIONS and s.severity in SXID_SEVERITIES for s in SXIDS)


def xid_name(code: int) -> str:
    entry = XID_BY_CODE.get(code)
    return entry.name if entry is not None else "not in the catalogue"


def xid_action(code: int, occurrences: int = 0) -> str:
    """The action for XID ``code`` after ``occurrences`` on one GPU (counted across reboots): the catalogue's, or
    ``hardware-inspection`` once it reaches the code's ``escalate_after``. An unknown code: ``check-application``
    until it repeats as often as a hardware fault does."""
    entry = XID_BY_CODE.get(code)
    action, limit = (entry.action, entry.escalate_after) if entry is not None else (CHECK_APPLICATION, HARDWARE_REPEATS)
    if limit is not None and occurrences >= limit:
        return HARDWARE_INSPECTION
    return action


def sxid_severity(code: int) -> str:
    """An SXid's severity; an unknown one is ``fatal`` (paged until the catalogue says otherwise)."""
    entry = SXID_BY_CODE.get(code)
    return entry.severity if entry is not None else "fatal"


def sxid_name(code: int) -> str:
    entry = SXID_BY_CODE.get(code)
    return entry.name if entry is not None else "not in the catalogue"


def sxid_action(code: int) -> str:
    """An SXid's action; an unknown one is treated as fatal, so ``reset-gpu`` (the switch and its GPUs reset)."""
    entry = SXID_BY_CODE.get(code)
    return entry.action if entry is not None else RESET_GPU


def markdown_tables() -> str:
    """The catalogue as docs/xid.md prints it (``python -m gpulens.xidcatalogue``; a test compares the two)."""
    lines = [
        "| XID | name | pages as | likely cause | action | escalates after |",
        "|---|---|---|---|---|---|",
    ]
    for x in XIDS:
        after = "-" if x.escalate_after is None else str(x.escalate_after)
        lines.append(f"| {x.code} | {x.name} | {x.severity} | {x.cause} | `{x.action}` | {after} |")
    lines += ["", "| SXid | name | severity | action |", "|---|---|---|---|"]
    lines += [f"| {s.code} | {s.name} | {s.severity} | `{s.action}` |" for s in SXIDS]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    import sys

    sys.stdout.write(markdown_tables())
