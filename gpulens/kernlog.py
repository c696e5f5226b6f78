"""The NVIDIA driver's kernel-log lines: which of them report an Xid or an NVSwitch SXid, on which PCI address.

A pure, line-at-a-time parser (no I/O). It reads every form a line reaches a reader in: plain ``dmesg``,
``dmesg -T``/``--ctime``/``-H``, ISO and ``--decode`` prefixes, syslog and journal lines (with or without a host
name), a bare ``kernel:`` prefix, the bare message, raw ``/dev/kmsg`` records (``pri,seq,usec,flags;msg``, with
``\\xNN`` escapes), and the continuation lines ``dmesg`` indents under a multi-line record. It does not strip the
prefix: the driver's messages are found by their own wording wherever they start in the line.

What counts:

- ``NVRM: Xid (PCI:<domain>:<bus>:<device>[ GPU-I:<n>]): <code>, ...``: an Xid (the MIG suffix is not part of the
  address);
- ``nvidia-nvswitch<N>: SXid (PCI:<domain>:<bus>:<device>.<fn>): <code>, ...``: an SXid. One SXid event may print
  three lines that share the address and code (``Data {...}``, ``Fatal``/``Non-fatal, Link N ...``, ``Severity
  ...``): each line is a record, the second and third marked ``continuation`` so that the event counts once;
- the driver's number-less "fallen off the bus" messages, as XID 79 (``fallen``): ``NVRM: GPU at <addr> has fallen
  off the bus.`` (old drivers) and the three-line ``NVRM: The NVIDIA GPU <addr> (PCI ID: ...) installed in this
  system has fallen off the bus ...``, whose first line alone does not say it (the same opening also says that a
  GPU is not supported): that record is held until it ends, at most ``MAX_PENDING_LINES`` lines.

``NVRM: GPU <addr>: GPU has fallen off the bus.`` is not counted: the driver prints it right after the ``Xid ...:
79`` line of the same loss. Text that merely names a number (``caused by previous Xid 149``, ``critical error 79``,
``_kgspLogXid119:``) or an address (``nvidia 0000:02:00.0:``) is never a record.

Bounds: a line is cut at ``MAX_LINE_CHARS`` before it is read; the only state kept between lines is one pending
fallen-off record (at most ``MAX_PENDING_LINES`` lines of at most ``MAX_LINE_CHARS``) and the last SXid's address,
code and parts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

MAX_LINE_CHARS: Final = 2048  # /dev/kmsg records are at most ~1 KiB; a longer line is cut, never buffered whole
MAX_PENDING_LINES: Final = 4  # the fallen-off-the-bus record prints 3
XID: Final = "xid"
SXID: Final = "sxid"
FALLEN_OFF_XID: Final = 79

_HEX = r"[0-9a-fA-F]"
_ADDR = rf"(?:PCI:)?({_HEX}{{4,8}}:{_HEX}{{2}}:{_HEX}{{2}})(?:\.[0-7])?"
_XID_RE: Final = re.compile(rf"(?:^|[\s;:\]])NVRM: Xid \({_ADDR}(?: GPU-I:\w+)?\): (\d+)")
_SXID_RE: Final = re.compile(
    rf"(?:^|[\s;:\]])nvidia-nvswitch\d+: SXid \(PCI:({_HEX}{{4,8}}:{_HEX}{{2}}:{_HEX}{{2}}\.[0-7])\): (\d+),?\s*(.*)"
)
_GPU_AT_FALLEN_RE: Final = re.compile(rf"(?:^|[\s;:\]])NVRM: GPU at {_ADDR} has fallen off the bus")
_THE_GPU_RE: Final = re.compile(rf"(?:^|[\s;:\]])NVRM: The NVIDIA GPU {_ADDR}")
_CONTINUATION_RE: Final = re.compile(r"^\s+NVRM: ")
_KMSG_RE: Final = re.compile(r"^\d+,\d+,\d+,[^;]*;")
_KMSG_ESCAPE_RE: Final = re.compile(r"\\x([0-9a-fA-F]{2})")
_FALLEN_TEXT: Final = "fallen off the bus"


def pci_key(address: str) -> str | None:
    """A PCI address as the driver's Xid lines print it, ``dddd:bb:dd`` in lower case (at least 4 domain digits,
    no function), from any common form: NVML's ``00000000:3B:00.0``, ``0000:3b:00``, ``3b:00.0``. None if it is
    not one."""
    head, _, function = address.strip().partition(".")
    parts = head.split(":")
    if len(parts) == 2:
        parts = ["0", *parts]
    if len(parts) != 3 or (function and not function.isdigit()):
        return None
    try:
        domain, bus, device = (int(p, 16) for p in parts)
    except ValueError:
        return None
    return f"{domain:04x}:{bus:02x}:{device:02x}"


def _sxid_address(address: str) -> str:
    head, _, function = address.partition(".")
    return f"{pci_key(head) or head.lower()}.{function}"


@dataclass(frozen=True, slots=True)
class KernelRecord:
    """One Xid or SXid the log reports. ``pci_bus_id``: ``dddd:bb:dd`` for an Xid, ``dddd:bb:dd.f`` for an SXid
    (as the driver prints them). ``fallen``: the number-less fallen-off-the-bus message (``code`` 79).
    ``continuation``: a later line of an SXid event already reported. ``tag``: what the caller passed with the
    record's first line."""

    kind: str
    pci_bus_id: str
    code: int
    tag: object = None
    fallen: bool = False
    continuation: bool = False


def _sxid_part(detail: str) -> str:
    if detail.startswith("Data {"):
        return "data"
    if detail.startswith(("Fatal", "Non-fatal")):
        return "fatality"
    if detail.startswith("Severity"):
        return "severity"
    return "other"


class KernelLogParser:
    """Feed lines in order; each call returns the records that lines completes. ``flush`` ends a pending record
    (call it when the log has been quiet a while)."""

    def __init__(self) -> None:
        self._pending: tuple[str, object, list[str]] | None = None  # a "The NVIDIA GPU <addr>" record
        self._sxid: tuple[str, int, set[str]] | None = None  # the last SXid event: address, code, parts seen

    def feed(self, line: str, tag: object = None) -> list[KernelRecord]:
        line = line[:MAX_LINE_CHARS].rstrip("\r\n")
        kmsg = _KMSG_RE.match(line)
        if kmsg is not None:  # one /dev/kmsg record: a multi-line message comes with its newlines escaped
            message = _KMSG_ESCAPE_RE.sub(lambda m: chr(int(m.group(1), 16)), line[kmsg.end() :])
            first, *more = message.split("\n")
            out = self._line(first, tag)
            for extra in more:
                out += self._continuation(extra)
            return out
        if _CONTINUATION_RE.match(line):
            return self._continuation(line)
        return self._line(line, tag)

    def flush(self) -> list[KernelRecord]:
        pending, self._pending = self._pending, None
        if pending is None:
            return []
        address, tag, lines = pending
        if _FALLEN_TEXT in " ".join(lines):
            return [KernelRecord(XID, address, FALLEN_OFF_XID, tag, fallen=True)]
        return []

    def _continuation(self, line: str) -> list[KernelRecord]:
        if self._pending is not None:
            lines = self._pending[2]
            lines.append(line.strip()[:MAX_LINE_CHARS])
            if len(lines) >= MAX_PENDING_LINES:
                return self.flush()
        return []

    def _line(self, line: str, tag: object) -> list[KernelRecord]:
        out = self.flush()  # a line that is not a continuation ends the pending record
        if "NVRM" in line:
            out += self._nvrm(line, tag)
        elif "SXid" in line:
            out += self._sxid_line(line, tag)
        return out

    def _nvrm(self, line: str, tag: object) -> list[KernelRecord]:
        if (m := _XID_RE.search(line)) is not None:
            address = pci_key(m.group(1))
            return [] if address is None else [KernelRecord(XID, address, int(m.group(2)), tag)]
        if (m := _GPU_AT_FALLEN_RE.search(line)) is not None:
            address = pci_key(m.group(1))
            return [] if address is None else [KernelRecord(XID, address, FALLEN_OFF_XID, tag, fallen=True)]
        if (m := _THE_GPU_RE.search(line)) is not None and (address := pci_key(m.group(1))) is not None:
            self._pending = (address, tag, [line[m.end() :]])
            if _FALLEN_TEXT in line:  # the whole message on one line (a journal that joined it)
                return self.flush()
        return []

    def _sxid_line(self, line: str, tag: object) -> list[KernelRecord]:
        m = _SXID_RE.search(line)
        if m is None:
            return []
        address, code, part = _sxid_address(m.group(1)), int(m.group(2)), _sxid_part(m.group(3))
        last = self._sxid
        continues = (
            last is not None
            and last[0] == address
            and last[1] == code
            and "data" in last[2]
            and part in ("fatality", "severity")
            and part not in last[2]
        )
        if continues and last is not None:
            last[2].add(part)
        else:
            self._sxid = (address, code, {part})
        return [KernelRecord(SXID, address, code, tag, continuation=continues)]
