"""The session's check for leftover processes (``tests.leftovers``) finds a watched process of the run, and only
one that names the run's folders."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

from tests.leftovers import leftover_processes


def test_a_watched_process_naming_the_runs_folder_is_a_leftover_until_it_stops(tmp_path: Path) -> None:
    program = tmp_path / "prometheus"  # a stand-in: a script's process takes the script's name
    program.write_text("#!/bin/sh\nsleep 600\n:\n")
    program.chmod(0o755)
    process = subprocess.Popen([str(program)], start_new_session=True)
    try:
        # until the shell has started (its name is the script's once it runs it) and its child has become ``sleep``
        # (between its fork and its exec the child still bears the script's name)
        want = [f"{process.pid} prometheus"]
        for _ in range(200):
            if leftover_processes([tmp_path]) == want:
                break
            subprocess.run(["sleep", "0.05"], check=True)
        assert leftover_processes([tmp_path]) == want
        assert leftover_processes([tmp_path / "elsewhere"]) == []
    finally:
        os.killpg(process.pid, signal.SIGKILL)  # the shell and its sleep
        process.wait()
    assert leftover_processes([tmp_path]) == []
