"""PendingPulls: waiting pulls cost nothing until their version or deadline comes, each client
has a bounded number waiting, and answers keep arrival order (against a plain reference)."""

import random

import pytest

from paramserver.server.events import Pull
from paramserver.server.pulls import PendingPulls, TooManyPulls


class Reference:
    """The same rules written plainly with a list."""

    def __init__(self, per_client):
        self.per_client, self.waiting = per_client, []

    def add(self, pull, deadline):
        if any(p.to == pull.to for _, p in self.waiting):
            return False
        if sum(p.client == pull.client for _, p in self.waiting) >= self.per_client:
            return None
        self.waiting.append((deadline, pull))
        return True

    def reached(self, version):
        ready = [p for _, p in self.waiting if p.min_version <= version]
        self.waiting = [w for w in self.waiting if w[1].min_version > version]
        return ready

    def expire(self, now):
        gone = [p for d, p in self.waiting if d <= now]
        self.waiting = [w for w in self.waiting if w[0] > now]
        return gone


def test_pending_pulls_answer_like_the_reference():
    rng = random.Random(11)
    pulls, ref = PendingPulls(per_client=5), Reference(5)
    now, version, rid = 0.0, 0, 0
    for _ in range(20000):
        r = rng.random()
        if r < 0.6:
            rid += 1
            to = ("c", rng.randrange(rid)) if rng.random() < 0.1 else ("c", rid)  # retries
            pull = Pull(to, now, version + rng.randint(0, 6), client=rng.randrange(4))
            deadline = now + rng.uniform(0.5, 5.0)
            want = ref.add(pull, deadline)
            if want is None:
                with pytest.raises(TooManyPulls, match="at most 5"):
                    pulls.add(pull, deadline)
            else:
                assert pulls.add(pull, deadline) is want
        elif r < 0.8:
            version += rng.randint(0, 2)
            assert pulls.reached(version) == ref.reached(version)
        else:
            now += rng.uniform(0, 1.0)
            assert pulls.expire(now) == ref.expire(now)
        assert len(pulls) == len(ref.waiting)
        assert pulls.next_deadline == min((d for d, _ in ref.waiting), default=float("inf"))
        # Entries of answered pulls are dropped now and then: the heaps stay bounded.
        assert len(pulls._by_version) <= 2 * len(pulls) + 65


def test_twenty_thousand_waiting_pulls_are_not_looked_at_by_a_version_they_wait_beyond():
    pulls = PendingPulls(per_client=10 ** 6)
    for rid in range(20000):
        pulls.add(Pull(("c", rid), 0.0, 10 ** 6 + rid, client="c"), 60.0)

    class Untouchable(list):
        def __getitem__(self, i):  # reading the heap's top is all a new version may do
            if i != 0:
                raise AssertionError("a waiting pull was looked at")
            return super().__getitem__(i)

    pulls._by_version = Untouchable(pulls._by_version)
    for version in range(100):
        assert pulls.reached(version) == []
    assert pulls.expire(59.0) == [] and len(pulls) == 20000
