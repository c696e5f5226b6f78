"""``gc_paused``: the collector off inside, on again after the last of nested and concurrent blocks, and left off
when it was off before."""

from __future__ import annotations

import gc
import threading
import time

import pytest

from gpulens import gcpause
from gpulens.gcpause import gc_paused


def test_the_collector_is_off_inside_and_on_after_the_last_block() -> None:
    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the outer block still holds it
    assert gc.isenabled()


def test_concurrent_blocks_end_with_the_collector_on() -> None:
    inside, release = threading.Barrier(5), threading.Event()
    seen = []

    def hold() -> None:
        with gc_paused():
            inside.wait()
            release.wait()
            seen.append(gc.isenabled())

    threads = [threading.Thread(target=hold) for _ in range(4)]
    for t in threads:
        t.start()
    inside.wait()
    assert not gc.isenabled()
    release.set()
    for t in threads:
        t.join()
    assert seen == [False] * 4  # each saw it off while its own block held it
    assert gc.isenabled()


def test_a_collector_off_before_stays_off() -> None:
    gc.disable()
    try:
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_the_collector_comes_back_after_an_exception() -> None:
    try:
        with gc_paused():
            raise RuntimeError("boom")
    except RuntimeError:
        pass
    assert gc.isenabled()


def test_blocks_that_overlap_without_end_still_collect(monkeypatch: pytest.MonkeyPatch) -> None:
    collected = []

    def collect(*_args: int) -> int:
        collected.append(1)
        return 0

    monkeypatch.setattr(gc, "collect", collect)
    now = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    with gc_paused():
        with gc_paused():
            now[0] += gcpause.MAX_PAUSE_S / 2
        assert collected == []  # a short pause: nothing
        with gc_paused():
            now[0] += gcpause.MAX_PAUSE_S
        assert collected == [1]  # held too long by overlapping blocks: one collection
        assert not gc.isenabled()
    assert gc.isenabled()


def test_tuning_freezes_the_start_up_heap_and_collects_young_objects_seldom() -> None:
    old = gc.get_threshold()
    try:
        gc.unfreeze()
        survivor: dict[str, list[int]] = {"built at start-up": [1]}  # alive, tracked by the collector

        def walked() -> bool:  # in a generation that collections walk
            return any(any(o is survivor for o in gc.get_objects(generation)) for generation in range(3))

        assert walked()
        gcpause.tune_garbage_collector()
        assert not walked()
        assert gc.get_freeze_count() > 0
        assert gc.get_threshold() == gcpause.GC_THRESHOLDS
        assert gc.isenabled()
    finally:
        gc.unfreeze()
        gc.set_threshold(*old)
