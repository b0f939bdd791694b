"""Killing a job as an operator's SIGKILL would: the whole session, Ray's actors included."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path


def kill_session(sid: int) -> None:
    """SIGKILL every process of a session (the job was started with start_new_session): Ray's
    actors run in process groups of their own, and a surviving one could still checkpoint."""
    def pids() -> list[int]:
        out = []
        for entry in Path("/proc").iterdir():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if entry.name.isdigit() and int(fields[3]) == sid and fields[0] != "Z":  # state, ppid, pgrp, session
                out.append(int(entry.name))
        return out

    deadline = time.time() + 30
    while (alive := pids()) and time.time() < deadline:
        for pid in alive:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.2)
    assert not pids()
