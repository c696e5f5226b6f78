"""The alert engine's reads over Prometheus: every GPU's few *round fields*, the GPUs a PromQL filter names, and
each GPU's hardware constants (``GpuFacts``).

A rule round over Prometheus (``gpulens.alerts.promround``) reads, for every GPU, only the fields that the rules name
(their round fields), ``up``, and the clock reasons they weigh that are *set* (``gpulens_gpu_throttle_active != 0``:
one series per reason that is set, none on most GPUs); every other field it reads only for the GPUs a rule could
fire on, named by PromQL filters (``uuids_where``) or by the round fields weighed against the GPU's constants. Which
fields, reasons and filters: the rules' catalogue says (the alerts layer); this module only reads them. The round
fields come back with ``uuid`` and the label telling a family's fields apart, and nothing else: the labels are most
of what Prometheus spends encoding an answer. Everything reads gpulens families; over dcgm-exporter families the
round reads every GPU whole (``PromReader.latest_readings``).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Final

from gpulens.metriccatalogue import GPU_FIELDS
from gpulens.model import GpuReading
from gpulens.storage.prometheus import families as fam
from gpulens.storage.prometheus.client import PromSeries, regex_of

if TYPE_CHECKING:
    from gpulens.storage.prometheus.reader import PromReader

# How often every GPU's constants are read again, and a GPU Prometheus held none of
FACTS_REFRESH_S: Final = 600.0
FACTS_RETRY_S: Final = 60.0
# More GPUs than this new to the facts are read with every other GPU (a selector naming each costs more)
FACTS_BY_UUID_MAX: Final = 64


def set_reasons(reasons: Collection[str]) -> str:
    """The series of ``reasons`` (slowdown clock reasons) that are set."""
    return f"{fam.THROTTLE}{{reason=~{regex_of(sorted(reasons))}}} != 0"


def _family_keys() -> dict[str, set[str]]:
    """Each gpulens family's labels that tell its fields apart (``direction``, ``type``, ``state``...)."""
    keys: dict[str, set[str]] = {}
    for spec in GPU_FIELDS:
        keys.setdefault(spec.family, set()).update(k for k, _ in spec.labels)
    return keys


_FAMILY_KEYS: Final = _family_keys()


def round_selectors(fields: Iterable[str]) -> list[str]:
    """One selector per family for ``fields``: the family's constant labels that tell the fields apart matched as
    a set (``gpulens_gpu_clock_hertz{clock=~"sm"}``), or none where every series of the family is wanted."""
    wanted = set(fields)
    by_family: dict[str, list[tuple[tuple[str, str], ...]]] = {}
    every: dict[str, int] = {}
    for spec in GPU_FIELDS:
        every[spec.family] = every.get(spec.family, 0) + 1
        if spec.field in wanted:
            by_family.setdefault(spec.family, []).append(spec.labels)
    out = []
    for family, labels in sorted(by_family.items()):
        keys = {k for held in labels for k, _ in held}
        if len(labels) == every[family] or len(keys) != 1:
            out.append(family)
            continue
        (key,) = keys
        out.append(f"{family}{{{key}=~{regex_of(v for held in labels for k, v in held)}}}")
    return out


def _bare(selector: str) -> tuple[str, str]:
    """(family, PromQL) of ``selector``'s series with only ``uuid`` and the labels that tell the family's fields
    apart (its name is put back on each answer: an aggregation drops it)."""
    family = selector.partition("{")[0]
    keys = ", ".join(["uuid", *sorted(_FAMILY_KEYS.get(family, ()))])
    return family, f"max by ({keys}) ({selector})"


def _named(family: str, series: list[PromSeries]) -> list[PromSeries]:
    return [PromSeries({**s.labels, "__name__": family}, s.samples) for s in series]


def round_readings(
    reader: PromReader, *, max_age_s: float, fields: Sequence[str], reasons: Collection[str] = (), xids: bool = False
) -> list[GpuReading]:
    """Every GPU's ``fields``, ``up``, its set clock ``reasons`` and (``xids``) its XID counts (gpulens families),
    newer than ``max_age_s``: one query per family, at once. ``up`` comes first with every label of the GPU (its
    node, index and model); the fields come with ``uuid`` and their family's keys only (``_bare``)."""
    now = reader.clock.now()
    bare = [_bare(s) for s in round_selectors(fields)]
    whole = [fam.UP, *([fam.XIDS] if xids else []), *([set_reasons(reasons)] if reasons else [])]
    answers: list[list[PromSeries]] = reader.parallel(
        *[lambda q=q: reader.client.query(q, now) for q in whole],
        *[lambda f=f, q=q: _named(f, reader.client.query(q, now)) for f, q in bare],
        lambda: reader.sample_times(f"max by (uuid) (timestamp({fam.UP}))", "uuid", now),
    )
    times: dict[str, float] = answers.pop()  # type: ignore[assignment]
    readings = fam.gpulens_readings([s for answer in answers for s in answer], times, now)
    return sorted((r for r in readings if r.timestamp >= now - max_age_s), key=lambda r: (r.node, r.gpu))


class GpuFacts:
    """Each GPU's ``fields``, hardware constants (its memory total, its PCIe link's maximum generation and width,
    its slowdown temperature: what the rules weigh the round fields against), read for the GPUs not seen before and
    for every GPU each ``refresh_s`` (or when the clock goes back). A GPU whose facts Prometheus did not hold (its
    exporter down at the time) is asked again ``retry_s`` later."""

    def __init__(
        self,
        reader: PromReader,
        fields: Sequence[str],
        *,
        refresh_s: float = FACTS_REFRESH_S,
        retry_s: float = FACTS_RETRY_S,
    ) -> None:
        self._reader = reader
        self._fields = tuple(fields)
        self._refresh_s = refresh_s
        self._retry_s = retry_s
        self._facts: dict[str, GpuReading] = {}
        self._absent: dict[str, float] = {}  # uuid -> when Prometheus last held no facts of it
        self._read_at = -math.inf

    def of(self, uuids: Collection[str]) -> Mapping[str, GpuReading]:
        """The facts of ``uuids`` that Prometheus holds (a GPU missing from the mapping has none)."""
        now = self._reader.clock.now()
        facts, absent = self._facts, self._absent
        missing = [u for u in uuids if u not in facts and not 0 <= now - absent.get(u, -math.inf) < self._retry_s]
        if not 0 <= now - self._read_at < self._refresh_s or len(missing) > FACTS_BY_UUID_MAX:
            facts = self._facts = {r.uuid: r for r in self._reader.latest_readings(fields=self._fields)}
            self._read_at = now
            absent.clear()
        elif missing:
            facts.update({r.uuid: r for r in self._reader.latest_readings(uuids=missing, fields=self._fields)})
        absent.update({u: now for u in missing if u not in facts})
        return facts


def uuids_where(reader: PromReader, filters: Sequence[str]) -> set[str]:
    """The GPUs (``uuid``) that any of the PromQL ``filters`` returns a series for: a query each, at once (one
    query of them all, or'd, costs Prometheus more than the parts)."""
    now = reader.clock.now()
    answers: list[list[PromSeries]] = reader.parallel(
        *[lambda f=f: reader.client.query(f"group by (uuid) ({f})", now) for f in filters]
    )
    return {s.labels["uuid"] for answer in answers for s in answer if s.labels.get("uuid")}
