"""dcgm-exporter's own series of one GPU (``DCGM_EXP_*``): series with no DCGM field id, read by ``gpulens.dcgmpage``.

Names and label values come from the field table (``gpulens.dcgmfields``). Each is opt-in in dcgm-exporter's counters
file; a page that does not serve one leaves its value unknown (``None``), never 0.

* ``DCGM_EXP_XID_ERRORS_COUNT{xid="43"} 2``: two XID 43 within dcgm-exporter's window (``err_code`` accepted for
  ``xid``; a series without a code says the window holds none). ``gpulens.dcgmnode`` turns windows into counters.
* ``DCGM_EXP_CLOCK_EVENTS_COUNT{clock_event="power_cap"} 12``: samples of DCGM field 112 within the window that had
  that reason (label values as dcgm-exporter names them: ``power_cap``, ``sw_thermal``, ...), kept as reason bit ->
  count; ``gpulens.dcgmnode`` decides from successive windows which reasons are active.
* ``DCGM_EXP_GPU_HEALTH_STATUS{health_watch="PCIE"} 0``: one series per DCGM health watch, valued DCGM's result (0
  pass, 10 warn, 20 fail); the GPU's ``health_status`` is the worst, as 0 / 1 / 2.
* ``DCGM_EXP_P2P_STATUS{peer_gpu="1"} 0``: one series per peer GPU, 0 when peer-to-peer works; ``p2p_peers_ok``
  counts those.

A value that is not one of these shapes (a negative count, an unknown health result, a code that is not a number) is
a problem, counted by ``gpulens.dcgmpage`` as ``dcgm_absurd_value``; an unknown clock-event name is ignored (a newer
dcgm-exporter may name more reasons).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Final

from gpulens.dcgmfields import (
    CLOCK_EVENT_BITS,
    CLOCK_EVENTS_COUNT_NAME,
    HEALTH_RESULTS,
    HEALTH_STATUS_NAME,
    P2P_STATUS_NAME,
    XID_COUNT_NAME,
)
from gpulens.promtext import Sample

EXP_NAMES: Final = frozenset({XID_COUNT_NAME, CLOCK_EVENTS_COUNT_NAME, HEALTH_STATUS_NAME, P2P_STATUS_NAME})
_XID_CODE_LABELS: Final = ("xid", "err_code")
_NUMBER_RE: Final = re.compile(r"[0-9]{1,9}")
ABSURD: Final = "dcgm_absurd_value"


def _count(value: float) -> int | None:
    """A window count: a whole non-negative number, else None."""
    if not math.isfinite(value) or value < 0 or not value.is_integer() or value > 2**31:
        return None
    return int(value)


@dataclass(slots=True)
class ExpSeries:
    """What one GPU's ``DCGM_EXP_*`` series said on one page (``None``: the page does not serve that series)."""

    xid_window: dict[int, int] | None = None
    clock_events: dict[int, int] | None = None
    health_status: int | None = None
    p2p_peers: set[str] = field(default_factory=set)
    p2p_peers_ok: int | None = None

    def add(self, sample: Sample) -> str | None:
        """Take one sample of an ``EXP_NAMES`` series; returns the problem reason when its value cannot be used."""
        if sample.name == XID_COUNT_NAME:
            return self._xid(sample)
        if sample.name == CLOCK_EVENTS_COUNT_NAME:
            return self._clock_event(sample)
        if sample.name == HEALTH_STATUS_NAME:
            result = HEALTH_RESULTS.get(sample.value)
            if result is None:
                return ABSURD
            self.health_status = max(result, self.health_status or 0)
            return None
        return self._p2p(sample)

    def _xid(self, sample: Sample) -> str | None:
        counts = self.xid_window = self.xid_window if self.xid_window is not None else {}
        code_text = next((sample.labels[k] for k in _XID_CODE_LABELS if sample.labels.get(k)), "")
        if not code_text:
            return None
        count = _count(sample.value)
        if not _NUMBER_RE.fullmatch(code_text) or count is None:
            return ABSURD
        if int(code_text) and count:
            counts[int(code_text)] = counts.get(int(code_text), 0) + count
        return None

    def _clock_event(self, sample: Sample) -> str | None:
        counts = self.clock_events = self.clock_events if self.clock_events is not None else {}
        bit = CLOCK_EVENT_BITS.get(sample.labels.get("clock_event", ""))
        if bit is None:
            return None
        count = _count(sample.value)
        if count is None:
            return ABSURD
        counts[bit] = counts.get(bit, 0) + count
        return None

    def _p2p(self, sample: Sample) -> str | None:
        peer = sample.labels.get("peer_gpu", "")
        if not _NUMBER_RE.fullmatch(peer) or _count(sample.value) is None:
            return ABSURD
        if peer not in self.p2p_peers:  # a GPU shared by several pods repeats each series
            self.p2p_peers.add(peer)
            self.p2p_peers_ok = (self.p2p_peers_ok or 0) + (sample.value == 0)
        return None
