"""Each job's checkpoint saves as NCCL RAS shows them, learned from its own history: how long its writers stay behind.

A job that saves from some ranks alone leaves them behind their communicator for the whole save, busy writing
(``alerts.ncclchecks``). ``SaveLog`` follows each communicator's spells behind round by round and remembers, per
job, the longest spell that ended normally: every rank behind was busy in its last round, and then the communicator
showed no mismatch any more (the writers caught up). A spell in which a rank went dead or unresponsive, or whose
ranks behind were idle in any round judged (a dead lock that later resolved), or that the job did not live to end,
teaches nothing. ``ceiling_s`` turns what
was learned into how long a busy spell is held back: ``factor`` times the longest save, at least ``min_s``, at most
``max_s``; ``max_s`` for a job with no save learned yet.

The log lives as long as the job does (it is dropped once the job has been absent for the history's window), so a
stuck writer is judged against saves however long ago; an engine that restarts learns again from its window.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


def ceiling_s(longest_s: float | None, *, factor: float, min_s: float, max_s: float) -> float:
    """How long a spell behind whose ranks are all busy is held back, given the job's longest save."""
    if longest_s is None:
        return max_s
    return min(max_s, max(min_s, factor * longest_s))


@dataclass(slots=True)
class _Spell:
    age_s: float  # the longest the mismatch had held
    busy: bool | None = None  # every rank behind was busy in every round judged (None: none judged yet)


@dataclass(slots=True)
class SaveLog:
    """The open spells behind of each communicator, and each job's longest save that ended normally."""

    hold_s: float  # a spell teaches only if it lasted this long (the rule would have fired on it otherwise)
    at: float | None = None  # the round last observed
    _open: dict[tuple[str, str], _Spell] = field(default_factory=dict)
    _longest: dict[str, float] = field(default_factory=dict)
    _seen: dict[str, float] = field(default_factory=dict)  # job -> the last round it held a communicator

    def longest(self, job: str) -> float | None:
        return self._longest.get(job)

    def observe(
        self,
        at: float,
        comms: Mapping[tuple[str, str], float | None],
        busy: Mapping[tuple[str, str], bool],
        window_s: float,
    ) -> None:
        """One round: ``comms`` maps each (job, communicator) the round shows to its mismatch age (``None``: no
        mismatch in any node's answer); ``busy`` says, for each mismatched one, whether every rank behind was busy
        (``False`` too where a rank went dead or unresponsive); a spell is judged in the rounds ``busy`` names."""
        if self.at is not None and at <= self.at:
            return  # seen already (two rules share the log)
        self.at = at
        for key, age in comms.items():
            self._seen[key[0]] = at
            spell = self._open.get(key)
            if age is not None:
                if spell is None:
                    spell = self._open[key] = _Spell(age)
                spell.age_s = max(spell.age_s, age)
                verdict = busy.get(key)
                if verdict is not None:
                    spell.busy = verdict if spell.busy is None else spell.busy and verdict
            elif spell is not None:  # the ranks behind caught up
                del self._open[key]
                if spell.busy is True and spell.age_s >= self.hold_s:
                    self._longest[key[0]] = max(self._longest.get(key[0], 0.0), spell.age_s)
        for job in [j for j, seen in self._seen.items() if seen < at - window_s]:
            del self._seen[job]
            self._longest.pop(job, None)
        for key in [k for k in self._open if k[0] not in self._seen]:
            del self._open[key]
