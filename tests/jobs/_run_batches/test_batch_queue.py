"""BatchQueue leases on a local folder and on an S3-compatible server: one winner per race, an
expired lease is taken over by the next generation, its old holder learns it lost it, a finished
batch's leftover request is tidied."""

from __future__ import annotations

import threading

import pytest

from jobs._run_batches.batch_queue import BatchQueue, LeaseLost
from jobs.lib.storage import Storage, join


@pytest.fixture(params=["local", "s3"])
def queue_uri(request, tmp_path):
    if request.param == "local":
        return str(tmp_path / "q")
    return request.getfixturevalue("s3_bucket") + "/q"


def test_create_exclusive_has_one_winner(queue_uri):
    store = Storage()
    wins = []
    barrier = threading.Barrier(4)

    def race(i):
        barrier.wait()
        wins.append(store.create_exclusive(join(queue_uri, "x.json"), f"{i}".encode()))

    threads = [threading.Thread(target=race, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(wins) == [False, False, False, True]


def test_claim_renew_takeover_finish(queue_uri):
    store = Storage()
    store.write_text(join(queue_uri, "pending", "b1.yaml"), "job: generate\n")
    now = [1000.0]  # an injected clock: a slow storage call cannot expire a lease under load
    a = BatchQueue(store, queue_uri, "a", lease_seconds=10, clock=lambda: now[0])
    b = BatchQueue(store, queue_uri, "b", lease_seconds=10, clock=lambda: now[0])
    assert a.pending() == ["b1"]
    la = a.claim("b1")
    assert la is not None and la.generation == 0
    now[0] += 9
    assert b.claim("b1") is None          # held
    a.renew(la)
    now[0] += 9
    assert b.claim("b1") is None          # renewed
    now[0] += 2                           # a stops renewing (it died)
    lb = b.claim("b1")
    assert lb is not None and lb.generation == 1
    with pytest.raises(LeaseLost):
        a.renew(la)
    b.finish(lb, "done", {"batch": "b1"})
    assert b.pending() == [] and a.status("b1") == {"batch": "b1"}
    store.write_text(join(queue_uri, "pending", "b1.yaml"), "job: generate\n")  # as if removal had crashed
    assert a.claim("b1") is None and a.pending() == []
