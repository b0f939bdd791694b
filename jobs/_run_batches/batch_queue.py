"""A queue of batch requests on any storage, claimed with leases that survive crashes.

    <queue>/pending/<id>.yaml               a request: {job: generate, config: {...} | config_file + set}
    <queue>/leases/<id>/<generation>.json   {owner, expires_unix}: who runs the batch, until when
    <queue>/done/<id>.json | failed/<id>.json   the status record, written before pending/ is removed

Claiming a batch is creating the next lease generation with an exclusive create (a hard link
locally, `If-None-Match: *` on S3), so of two schedulers that race for it exactly one wins. A
lease is taken over only once it has expired: its holder renews it while the batch runs, and a
holder that died stops renewing. The next holder reruns the job in the same run directory, where
the job's own commit markers skip the work already done: nothing completed is redone. A batch
whose status record exists is finished; its leftover pending request is removed.

Every queue operation rides out storage outages (jobs.lib.storage retries each call for
`storage.retry_seconds`); each is safe to repeat: a lease body names its owner and expiry, so a
claim whose answer was lost and whose retry finds the lease already there recognises its own
bytes; renewals and status records are whole-object overwrites; deletes ignore what is gone.
Storage down past the budget raises StorageUnavailable: never taken for 'held by another'.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from collections.abc import Callable

from jobs.lib.storage import Storage, StorageUnavailable, join

STATES = ("done", "failed")


@dataclass
class Lease:
    batch: str
    generation: int
    owner: str
    expires_unix: float


class LeaseLost(RuntimeError):
    """Another scheduler took the batch over (this holder failed to renew in time)."""


class BatchQueue:
    def __init__(self, store: Storage, uri: str, owner: str, lease_seconds: float,
                 clock: Callable[[], float] = time.time):
        self.store, self.uri, self.owner, self.lease_seconds = store, uri, owner, lease_seconds
        self.clock = clock  # seconds since the epoch; injectable, so tests need no sleeps

    def _lease_uri(self, batch: str, generation: int) -> str:
        return join(self.uri, "leases", batch, f"{generation:06d}.json")

    def pending(self) -> list[str]:
        return [n[: -len(".yaml")] for n in self.store.list(join(self.uri, "pending")) if n.endswith(".yaml")]

    def request(self, batch: str) -> str:
        return self.store.read_text(join(self.uri, "pending", f"{batch}.yaml"))

    def status(self, batch: str) -> dict | None:
        for state in STATES:
            uri = join(self.uri, state, f"{batch}.json")
            if self.store.exists(uri):
                return json.loads(self.store.read_text(uri))
        return None

    def _generations(self, batch: str) -> list[int]:
        return sorted(int(n[:6]) for n in self.store.list(join(self.uri, "leases", batch)) if n.endswith(".json"))

    def claim(self, batch: str) -> Lease | None:
        """The batch's next lease if it is free (never leased, or its lease expired); None if it
        is finished, held by a live lease, or another scheduler won the race."""
        if self.status(batch) is not None:  # finished; its holder died before removing the request
            self.store.delete(join(self.uri, "pending", f"{batch}.yaml"))
            return None
        gens = self._generations(batch)
        if gens:
            try:
                held = json.loads(self.store.read_text(self._lease_uri(batch, gens[-1])))
            except StorageUnavailable:
                raise  # an outage, not a lease being written
            except (ValueError, OSError):
                return None  # being written: held
            if held["expires_unix"] > self.clock():
                return None
        lease = Lease(batch, gens[-1] + 1 if gens else 0, self.owner, self.clock() + self.lease_seconds)
        body = json.dumps({"owner": lease.owner, "expires_unix": lease.expires_unix}).encode()
        return lease if self.store.create_exclusive(self._lease_uri(batch, lease.generation), body) else None

    def renew(self, lease: Lease) -> None:
        if self._generations(lease.batch)[-1] != lease.generation:
            raise LeaseLost(f"batch {lease.batch}: lease {lease.generation} was taken over")
        lease.expires_unix = self.clock() + self.lease_seconds
        self.store.write_text(self._lease_uri(lease.batch, lease.generation),
                              json.dumps({"owner": lease.owner, "expires_unix": lease.expires_unix}))

    def finish(self, lease: Lease, state: str, record: dict) -> None:
        """The status record first, then the request goes: a crash in between is tidied by claim."""
        assert state in STATES
        self.store.write_text(join(self.uri, state, f"{lease.batch}.json"), json.dumps(record, indent=2, default=str))
        self.store.delete(join(self.uri, "pending", f"{lease.batch}.yaml"))


class Renewer:
    """Renews a lease every third of its duration in a background thread while a batch runs."""

    def __init__(self, queue: BatchQueue, lease: Lease):
        self.queue, self.lease = queue, lease
        self.stop = threading.Event()
        self.error: Exception | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.wait(self.queue.lease_seconds / 3):
            try:
                self.queue.renew(self.lease)
            except Exception as err:  # noqa: BLE001 - reported after the batch
                self.error = err
                return

    def __enter__(self) -> Renewer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join()
