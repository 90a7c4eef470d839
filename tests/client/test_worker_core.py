"""The worker client's bookkeeping (client/core/worker_core.py), driven without sockets or
sleeps."""


import numpy as np
import pytest

from paramserver.client.core.worker_core import Handle, WorkerCore
from paramserver.core.keyspace import KeyRange
from paramserver.policies.base import Release
from ps_helpers import Reply


def three_shards() -> WorkerCore:
    core = WorkerCore()
    core.welcome(5, [KeyRange(0, 4), KeyRange(4, 7), KeyRange(7, 10)], 10)
    return core


def send(core: WorkerCore, kind: str, r: KeyRange, out=None) -> Handle:
    handle = Handle(kind, out=out)
    for i, piece, sl in core.pieces(r):
        handle.parts.append((i, core.request(i, (kind, piece)), sl))
    return handle


def answered(core: WorkerCore, handle: Handle) -> bool:
    return all(rid in core.inbox for _, rid, _ in handle.parts)


def test_a_push_split_across_three_shards_completes_only_with_all_three_acks():
    core = three_shards()
    handle = send(core, "push", KeyRange(0, 10))
    assert [shard for shard, _, _ in handle.parts] == [0, 1, 2]
    assert len({rid for _, rid, _ in handle.parts}) == 3  # one request id per shard
    for n, (shard, rid, _) in enumerate(handle.parts):
        assert not answered(core, handle)
        assert core.reply(rid, Reply(staleness=n))
    assert answered(core, handle)
    replies = core.take(rid for _, rid, _ in handle.parts)
    assert core.push_done(handle, replies) == 2  # the largest staleness
    assert handle.done and not core.sent and not core.inbox


def test_a_push_of_chunks_beside_one_message_parts_takes_the_largest_staleness_of_both():
    """push_step's handle: the dense chunks' stream and the rows' parts; the stream counts how
    many messages each shard gets (its `parts` in round mode) and keeps what its acks said."""
    core = three_shards()
    core.chunking(2, 1)
    r = KeyRange(0, 10)
    stream = core.stream(r, core.pieces(r))
    assert stream.counts == {0: 2, 1: 2, 2: 2}  # 4, 3 and 3 keys in chunks of 2
    handle = send(core, "push", KeyRange(0, 10))
    handle.stream = stream
    stream.seen.update({0: 1, 1: 5})  # the chunks' acks, as KVWorker takes them
    for shard, rid, _ in handle.parts:
        core.reply(rid, Reply(staleness=shard))
    replies = core.take(rid for _, rid, _ in handle.parts)
    assert core.push_done(handle, replies) == 5 and handle.done
    stream.seen.clear()
    assert core.push_done(handle, replies) == 2  # the parts' largest then


def test_a_duplicate_or_stray_reply_is_refused():
    core = three_shards()
    handle = send(core, "push", KeyRange(0, 4))
    (_, rid, _), = handle.parts
    assert core.reply(rid, Reply(staleness=0))
    assert not core.reply(rid, Reply(staleness=0)), "a second answer (to a re-send) was taken"
    assert not core.reply(rid + 100, Reply()), "an answer to no request was taken"
    core.take([rid])
    assert not core.reply(rid, Reply()), "an answer after the request was finished was taken"
    assert not core.inbox and not core.held


def test_an_abandoned_request_refuses_its_late_reply_and_gives_back_lent_frames():
    core = three_shards()
    first, second = send(core, "pull", KeyRange(0, 4)), send(core, "pull", KeyRange(4, 7))
    (_, a, _), (_, b, _) = first.parts[0], second.parts[0]
    assert core.reply(a, Reply(), lent=["frame-a"])
    assert core.forget([a, b]) == [["frame-a"]]
    assert not core.reply(b, Reply(), lent=["frame-b"])  # the caller releases these itself
    assert not core.sent and not core.inbox and not core.held


def test_a_pull_assembles_its_parts_into_the_right_key_ranges_and_notes_versions():
    core = three_shards()
    out = np.full(8, -1.0)
    handle = send(core, "pull", KeyRange(2, 10), out=out)
    assert [(s, sl) for s, _, sl in handle.parts] == [
        (0, slice(0, 2)), (1, slice(2, 5)), (2, slice(5, 8))]
    # Replies come in any order; each carries its piece's values and the shard's version.
    for shard, rid, _ in reversed(handle.parts):
        lo, hi = max(2, core.ranges[shard].lo), core.ranges[shard].hi
        core.reply(rid, Reply([np.arange(lo, hi, dtype=float)], version=10 + shard),
                   lent=[f"frames-{shard}"] if shard == 1 else None)
    replies = core.take(rid for _, rid, _ in handle.parts)
    lent = core.pull_done(handle, replies)
    assert handle.result is out
    np.testing.assert_array_equal(out, np.arange(2, 10, dtype=float))
    assert lent == [["frames-1"]] and not core.held  # copied out: free to give back
    assert core.versions == [10, 11, 12] and core.version == 10


def test_a_pull_without_out_takes_one_shards_own_reply_uncopied_but_copies_a_lent_one():
    core = three_shards()
    for lent in (None, ["shared"]):
        handle = Handle("pull", out=np.empty(3), out_ours=True)
        handle.parts.append((2, core.request(2, ("pull", KeyRange(7, 10))), slice(0, 3)))
        values = np.arange(3.0)
        core.reply(handle.parts[0][1], Reply([values], version=6), lent=lent)
        given_back = core.pull_done(handle, core.take([handle.parts[0][1]]))
        np.testing.assert_array_equal(handle.result, [0.0, 1.0, 2.0])
        assert core.versions[2] == 6 and not core.held
        if lent is None:  # this process's own frame: nobody else writes it
            assert handle.result is values and given_back == []
        else:  # lent from a server's arena: copied, then given back
            assert handle.result is not values and given_back == [["shared"]]
    # A caller's `out` is always written, and so is a pull assembled from several shards.
    out = np.empty(3)
    handle = send(core, "pull", KeyRange(7, 10), out=out)
    core.reply(handle.parts[0][1], Reply([np.ones(3)], version=7))
    assert core.pull_done(handle, core.take([handle.parts[0][1]])) == [] and handle.result is out


def test_versions_are_tracked_per_shard():
    core = three_shards()
    assert core.versions == [0, 0, 0] and core.version == 0
    for version in (1, 2):
        handle = send(core, "pull", KeyRange(4, 7), out=np.empty(3))
        (_, rid, _), = handle.parts
        core.reply(rid, Reply([np.zeros(3)], version=version))
        core.pull_done(handle, core.take([rid]))
    assert core.versions == [0, 2, 0] and core.version == 0


def test_a_borrowed_pull_stays_lent_until_let_go():
    core = three_shards()
    handle = send(core, "pull", KeyRange(7, 10))
    (_, rid, _), = handle.parts
    values = np.ones(3)
    core.reply(rid, Reply([values], version=4), lent=["shared"])
    assert core.borrowed(handle, core.take([rid])[rid]) is values
    assert core.versions[2] == 4 and list(core.held) == [rid]
    assert core.let_go(rid) == ["shared"] and core.let_go(rid) is None


def test_unanswered_requests_are_the_ones_to_send_again():
    core = three_shards()
    handle = send(core, "push", KeyRange(0, 10))
    rids = [rid for _, rid, _ in handle.parts]
    core.reply(rids[1], Reply())
    assert [shard for shard, _ in core.unanswered(rids)] == [0, 2]


def test_key_ranges_are_checked_and_sparse_keys_cut_per_shard():
    core = three_shards()
    assert core.key_range(None) == KeyRange(0, 10) and core.key_range((3, 5)) == KeyRange(3, 5)
    with pytest.raises(ValueError, match="exceeds the 10 keys"):
        core.key_range((5, 11))
    keys = np.array([1, 2, 8, 9])
    assert core.sparse_cuts(keys) == [(0, 2), (2, 2), (2, 4)]  # shard 1 hears, with no keys
    assert core.owners(np.array([0, 4, 6, 7, 9])).tolist() == [0, 1, 1, 2, 2]


def test_a_release_is_recorded_and_consumed_once():
    core = three_shards()
    releases = core.releases
    with pytest.raises(LookupError):
        releases.take()
    releases.released(core.rank, Reply(step=3, batch=32, min_version=2, round_size=4))
    assert releases.take() == Release(5, 3, 32, min_version=2, round_size=4)
    with pytest.raises(LookupError, match="no release is pending"):
        releases.take()
    releases.released(core.rank, Reply(step=4, batch=32, min_version=3, stop=True, scale=0.5))
    assert releases.take() == Release(5, 4, 32, scale=0.5, min_version=3, stop=True)


def test_a_push_of_a_lockstep_steps_release_takes_its_round_unless_it_names_one():
    """auto's lockstep releases name their round; a plain KV client's push names none, and
    without it each push was applied whole on arrival instead of summed with its round."""
    releases = three_shards().releases
    assert releases.push_fields(0, 32, 1.0) == {"step": 0, "batch": 32, "scale": 1.0}
    releases.released(5, Reply(step=7, batch=32, min_version=0, round_size=4, round_id=12))
    assert releases.push_fields(7, 32, 1.0) == {"step": 7, "batch": 32, "scale": 1.0,
                                                "round_size": 4, "round_id": 12}
    assert releases.push_fields(7, 32, 1.0, round_size=3, round_id=9)["round_id"] == 9
    assert "round_id" not in releases.push_fields(6, 32, 1.0)  # another step's push
    releases.released(5, Reply(step=8, batch=32, min_version=0, scale=0.25))  # asp: no round
    assert releases.push_fields(8, 32, 0.25) == {"step": 8, "batch": 32, "scale": 0.25}
