"""Redis consumer groups on streamgate's RESP listener.

A differential test runs one script of group commands (XGROUP, XREADGROUP, XACK, XPENDING,
XCLAIM, XAUTOCLAIM, XINFO, XREVRANGE) against streamgate and a real Redis and compares
every reply with its wire type, in RESP2 and RESP3. Entry IDs differ between the two
(streamgate's carry S2 sequence numbers), so each side's IDs are renamed E0, E1, ... in
the order XADD returned them; times (idle, seen-time, delivery time) are masked.

Work-queue tests then run redis-py workers the way the Redis docs describe: a worker killed
mid-job leaves its entries pending, the others take them over with XAUTOCLAIM, every job
is acknowledged exactly once, and the group's state survives a `kill -9` of the server.
"""

import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import redis
from conftest import ROOT_TOKEN, launch
from resp_wire import Wire
from test_resp_clients import BASIN, connect, make_basin, real_redis, rest  # noqa: F401

ENTRIES = 5

# (command, masks). Arguments may name entries as {E0}..{E4}: each side's own IDs.
SCRIPT = [
    "XGROUP CREATE {s} g1 0",
    "XGROUP CREATE {s} g1 0",
    "XGROUP CREATE {none} g1 0",
    "XGROUP CREATE {t} g1 $ MKSTREAM",
    "XGROUP CREATE {s} g2 $",
    "XGROUP CREATE {s} g3 {E2} ENTRIESREAD 3",
    "XGROUP CREATE {s} g4 0 ENTRIESREAD -5",
    "XGROUP CREATE {s} g4 nope",
    "XGROUP CREATE {s}",
    "XGROUP NOSUCH {s} g1",
    "XGROUP CREATECONSUMER {s} g1 alice",
    "XGROUP CREATECONSUMER {s} g1 alice",
    "XGROUP CREATECONSUMER {s} g9 alice",
    "XREADGROUP GROUP g1 alice COUNT 2 STREAMS {s} >",
    "XREADGROUP GROUP g1 bob STREAMS {s} >",
    "XREADGROUP GROUP g1 alice STREAMS {s} 0",
    "XREADGROUP GROUP g1 alice COUNT 1 STREAMS {s} {E0}",
    "XREADGROUP GROUP g1 alice STREAMS {s} $",
    "XREADGROUP GROUP g1 alice STREAMS {s} {t} > >",
    "XREADGROUP GROUP g9 alice STREAMS {s} >",
    "XREADGROUP GROUP g1 alice STREAMS {s} {none} > >",
    "XREADGROUP GROUP g1 alice STREAMS {s}",
    "XREADGROUP GROUP g1 alice STREAMS {s} {t} >",
    "XREADGROUP GROUP g1 alice",
    "XREADGROUP g1 alice STREAMS {s} >",
    "XREADGROUP GROUP g1 alice COUNT x STREAMS {s} >",
    "XREADGROUP GROUP g1 alice BLOCK 100 STREAMS {s} >",
    "XREADGROUP GROUP g2 alice COUNT 0 STREAMS {s} >",
    "XPENDING {s} g1",
    "XPENDING {s} g1 - + 10",
    "XPENDING {s} g1 - + 10 bob",
    "XPENDING {s} g1 IDLE 0 - + 10",
    "XPENDING {s} g1 ({E0} + 2",
    "XPENDING {s} g1 - ({E2} 10",
    "XPENDING {s} g1 - + 10 nobody",
    "XPENDING {s} g2",
    "XPENDING {s} g9",
    "XPENDING {none} g1",
    "XPENDING {s} g1 - +",
    "XPENDING {s} g1 - + x",
    "XACK {s} g1 {E0} {E0} {E3}",
    "XACK {s} g1 {E0}",
    "XACK {s} g9 {E0}",
    "XACK {none} g1 {E0}",
    "XACK {s} g1 bad",
    "XPENDING {s} g1",
    "XCLAIM {s} g1 carol 0 {E1} {E2}",
    "XCLAIM {s} g1 carol 0 {E1} JUSTID",
    "XCLAIM {s} g1 dave 3600000 {E1}",
    "XCLAIM {s} g1 dave 0 {E4} IDLE 500000 RETRYCOUNT 7 JUSTID",
    "XPENDING {s} g1 IDLE 400000 - + 10",
    "XCLAIM {s} g1 dave 0 {E3}",
    "XCLAIM {s} g1 dave 0 {E3} FORCE JUSTID",
    "XCLAIM {s} g1 dave 0 {E1} bad",
    "XCLAIM {s} g1 dave 0 {E1} RETRYCOUNT x",
    "XCLAIM {s} g9 dave 0 {E1}",
    "XCLAIM {s} g1 dave 0",
    "XPENDING {s} g1 - + 10",
    "XAUTOCLAIM {s} g1 erin 0 0 COUNT 2",
    "XAUTOCLAIM {s} g1 erin 0 {E3} COUNT 1 JUSTID",
    "XAUTOCLAIM {s} g1 erin 0 0",
    "XAUTOCLAIM {s} g1 erin 0 0 COUNT 0",
    "XAUTOCLAIM {s} g1 erin 0 0 FOO",
    "XAUTOCLAIM {s} g9 erin 0 0",
    "XAUTOCLAIM {none} g1 erin 0 0",
    "XPENDING {s} g1",
    "XINFO GROUPS {s}",
    "XINFO CONSUMERS {s} g1",
    "XINFO CONSUMERS {s} g9",
    "XINFO STREAM {s}",
    "XINFO STREAM {s} FULL",
    "XINFO STREAM {s} FULL COUNT 1",
    "XINFO STREAM {t}",
    "XINFO STREAM {none}",
    "XINFO GROUPS {none}",
    "XINFO NOSUCH {s}",
    "XGROUP SETID {s} g2 0",
    "XGROUP SETID {s} g2 {E1} ENTRIESREAD 2",
    "XGROUP SETID {s} g9 0",
    "XGROUP SETID {s} g2 $",
    "XGROUP DELCONSUMER {s} g1 erin",
    "XGROUP DELCONSUMER {s} g1 erin",
    "XGROUP DESTROY {s} g2",
    "XGROUP DESTROY {s} g2",
    "XGROUP DESTROY {none} g2",
    "XINFO GROUPS {s}",
    "XGROUP SETID {s} g3 0",
    "XREADGROUP GROUP g3 zed NOACK COUNT 2 STREAMS {s} >",
    "XPENDING {s} g3",
    "XINFO CONSUMERS {s} g3",
    "XREVRANGE {s} + -",
    "XREVRANGE {s} + - COUNT 2",
    "XREVRANGE {s} {E3} {E1}",
    "XREVRANGE {s} ({E3} - COUNT 1",
    "XREVRANGE {s} + - COUNT 0",
    "XREVRANGE {none} + - COUNT 0",
    "XREVRANGE {s} +",
    "XRANGE {s} - + COUNT 0",
]

# Values of these XINFO fields are times or memory-layout details, not state.
MASKED_FIELDS = {"idle", "seen-time", "active-time", "inactive", "radix-tree-keys", "radix-tree-nodes"}


def open_wire(port, protocol, auth):
    wire = Wire(port)
    hello = ["HELLO", str(protocol)] + (["AUTH", *auth] if auth else [])
    reply = wire.call(*hello)
    assert reply[0] in "*%", reply
    return wire


def normalize(reply, names):
    """Renames entry IDs, masks times, and turns map-shaped arrays' masked values to '?'."""
    kind = reply[0]
    if kind in "+$-" and reply[1] is not None:
        text = reply[1]
        for entry_id, name in names.items():
            text = re.sub(rf"(?<![\d-]){re.escape(entry_id)}(?![\d-])", name, text)
        return (kind, text)
    if kind in "*~>" and reply[1] is not None:
        items = [normalize(item, names) for item in reply[1]]
        # XINFO answers are flat key/value arrays in RESP2.
        for i in range(0, len(items) - 1, 2):
            if items[i][0] in "$+" and items[i][1] in MASKED_FIELDS:
                items[i + 1] = ("?",)
        # Pending entries: [id, consumer, delivery time, count] (XPENDING and XINFO FULL's
        # group) and [id, delivery time, count] (XINFO FULL's consumer).
        if items and items[0][0] == "$" and re.fullmatch(r"E\d+", items[0][1] or ""):
            if len(items) == 4 and items[1][0] == "$" and items[2][0] == ":":
                items[2] = ("?",)
            elif len(items) == 3 and items[1][0] == ":" and items[2][0] == ":":
                items[1] = ("?",)
        return (kind, items)
    if kind in "%|":
        pairs = []
        for key, value in reply[1]:
            key = normalize(key, names)
            value = ("?",) if key[0] in "$+" and key[1] in MASKED_FIELDS else normalize(value, names)
            pairs.append((key, value))
        return (kind, pairs)
    return reply


def run_script(wire, prefix):
    keys = {"s": prefix + "s", "t": prefix + "t", "none": prefix + "none"}
    names, ids = {}, {}
    for i in range(ENTRIES):
        reply = wire.call("XADD", keys["s"], "*", "n", str(i), "kind", "job")
        assert reply[0] == "$", reply
        names[reply[1]] = f"E{i}"
        ids[f"E{i}"] = reply[1]
    out = []
    for line in SCRIPT:
        args = [arg.format(**keys, **ids) for arg in line.split()]
        out.append((line, normalize(wire.call(*args), names)))
    return out


@pytest.mark.parametrize("protocol", [2, 3])
def test_group_commands_match_a_real_redis(server, real_redis, protocol):  # noqa: F811
    make_basin(server, create_stream_on_append=True)
    prefix = f"cg{protocol}-{time.time_ns()}-"
    real_port = real_redis.connection_pool.connection_kwargs["port"]
    theirs = open_wire(real_port, protocol, None)
    ours = open_wire(server.resp_port, protocol, (BASIN, ROOT_TOKEN))
    try:
        expected = run_script(theirs, prefix)
        actual = run_script(ours, prefix)
    finally:
        for suffix in ("s", "t"):
            theirs.call("DEL", prefix + suffix)
        theirs.close()
        ours.close()
    differences = [
        f"{line}\n  redis:      {want}\n  streamgate: {got}"
        for (line, want), (_, got) in zip(expected, actual)
        if want != got
    ]
    assert not differences, "\n".join(differences)


# A worker as the Redis docs describe one: take new jobs with XREADGROUP, take over jobs
# left pending by a dead worker with XAUTOCLAIM, record the work, then XACK it. It logs
# "done <job>" before acknowledging and "ack <job> <reply>" after, and exits once the
# group has nothing pending and nothing new.
WORKER = textwrap.dedent(
    """
    import sys, time, redis
    port, basin, token, name, log_path, stall = sys.argv[1:7]
    r = redis.Redis(port=int(port), username=basin, password=token, decode_responses=True)
    log = open(log_path, "a", buffering=1)
    if stall == "stall":
        # Take a batch, start on it, and hang: the test kills this worker here.
        batch = r.xreadgroup("workers", name, {"jobs": ">"}, count=10)
        for entry_id, fields in batch[0][1]:
            log.write(f"started {fields['job']}\\n")
        print("stalled", flush=True)
        time.sleep(3600)
    cursor = "0-0"
    while True:
        cursor, claimed, _ = r.xautoclaim("jobs", "workers", name, min_idle_time=1000, start_id=cursor, count=5)
        fresh = r.xreadgroup("workers", name, {"jobs": ">"}, count=5, block=200)
        entries = claimed + (fresh[0][1] if fresh else [])
        for entry_id, fields in entries:
            log.write(f"done {fields['job']}\\n")
            log.write(f"ack {fields['job']} {r.xack('jobs', 'workers', entry_id)}\\n")
        if not entries and cursor == "0-0" and r.xpending("jobs", "workers")["pending"] == 0:
            break
    """
)


def test_work_queue_survives_a_killed_worker_and_a_killed_server(tmp_path):
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    jobs = 150
    with launch(data_dir=str(data_dir)) as server:
        make_basin(server, create_stream_on_append=True)
        r = connect(server)
        pipe = r.pipeline(transaction=False)
        for i in range(jobs):
            pipe.xadd("jobs", {"job": str(i)})
        pipe.execute()
        assert r.xgroup_create("jobs", "workers", id="0")

        def worker(name, stall=""):
            log = tmp_path / f"{name}.log"
            args = [sys.executable, "-c", WORKER, str(server.resp_port), BASIN, ROOT_TOKEN, name, str(log), stall]
            return subprocess.Popen(args, stdout=subprocess.PIPE, text=True), log

        victim, victim_log = worker("victim", "stall")
        assert victim.stdout.readline().strip() == "stalled"
        os.kill(victim.pid, signal.SIGKILL)
        victim.wait()
        stolen = {line.split()[1] for line in victim_log.read_text().splitlines()}
        assert len(stolen) == 10
        assert r.xpending("jobs", "workers")["consumers"] == [{"name": "victim", "pending": 10}]

        workers = [worker(f"w{n}") for n in range(3)]
        for proc, _ in workers:
            assert proc.wait(timeout=120) == 0
        done, acked = {}, {}
        for _, log in workers:
            for line in log.read_text().splitlines():
                word, job, *reply = line.split()
                if word == "done":
                    done[job] = done.get(job, 0) + 1
                else:
                    acked.setdefault(job, []).append(int(reply[0]))
        assert set(done) == {str(i) for i in range(jobs)}, "every job processed"
        assert all(sum(replies) == 1 for replies in acked.values()), "each job acknowledged exactly once"
        assert set(acked) == set(done)
        assert r.xpending("jobs", "workers")["pending"] == 0
        # The victim's jobs were taken over from it: it holds none now.
        assert stolen <= set(done)
        assert {c["name"]: c["pending"] for c in r.xinfo_consumers("jobs", "workers")}["victim"] == 0

        # Leave state behind for the crash: bob holds seven entries, three acknowledged.
        more = [r.xadd("jobs", {"job": f"late-{i}"}) for i in range(10)]
        held = r.xreadgroup("workers", "bob", {"jobs": ">"}, count=7)[0][1]
        assert [entry_id for entry_id, _ in held] == more[:7]
        assert r.xack("jobs", "workers", *more[:3]) == 3
        r.xclaim("jobs", "workers", "carol", 0, [more[3]], retrycount=4)
        before = {
            "pending": [(e["message_id"], e["consumer"], e["times_delivered"]) for e in r.xpending_range("jobs", "workers", "-", "+", 100)],
            "groups": r.xinfo_groups("jobs"),
            "consumers": [(c["name"], c["pending"]) for c in r.xinfo_consumers("jobs", "workers")],
        }
        assert before["pending"] == [(more[3], "carol", 4)] + [(i, "bob", 1) for i in more[4:7]]
    # Killed with SIGKILL when the block ended; start again on the same data.
    with launch(data_dir=str(data_dir)) as server:
        r = connect(server)
        after = {
            "pending": [(e["message_id"], e["consumer"], e["times_delivered"]) for e in r.xpending_range("jobs", "workers", "-", "+", 100)],
            "groups": r.xinfo_groups("jobs"),
            "consumers": [(c["name"], c["pending"]) for c in r.xinfo_consumers("jobs", "workers")],
        }
        assert after == before
        # New deliveries go on after the last one acknowledged before the crash.
        rest_of_them = r.xreadgroup("workers", "bob", {"jobs": ">"})[0][1]
        assert [entry_id for entry_id, _ in rest_of_them] == more[7:]
        assert r.xack("jobs", "workers", *more[:3]) == 0, "acknowledged before the crash"
        assert r.xack("jobs", "workers", *more[3:]) == 7


def test_groups_go_with_their_stream_and_blocked_readers_wake(server):
    make_basin(server, create_stream_on_append=True)
    r = connect(server)
    r.xadd("feed", {"n": "0"})
    r.xgroup_create("feed", "readers", id="$")

    # A blocked XREADGROUP wakes when an entry lands.
    def late_append():
        time.sleep(0.3)
        connect(server).xadd("feed", {"n": "1"})

    threading.Thread(target=late_append).start()
    woke = r.xreadgroup("readers", "ann", {"feed": ">"}, block=10_000)
    assert woke[0][1][0][1] == {"n": "1"}

    # Deleting the stream deletes its groups: a stream made again under the name has none.
    rest(server, "DELETE", "/streams/feed", basin=BASIN)
    deadline = time.monotonic() + 20
    while True:
        try:
            r.xadd("feed", {"n": "again"})
            break
        except redis.ResponseError:
            assert time.monotonic() < deadline, "the stream could not be made again"
            time.sleep(0.2)
    assert r.xinfo_groups("feed") == []
    with pytest.raises(redis.ResponseError, match="NOGROUP"):
        r.xreadgroup("readers", "ann", {"feed": ">"})


def test_autoclaim_reports_trimmed_entries_as_deleted(server):
    """Redis drops pending entries that were deleted when XAUTOCLAIM meets them and lists
    their IDs last; here trimming is what removes entries."""
    make_basin(server, create_stream_on_append=True)
    r = connect(server)
    ids = [r.xadd("trimmed", {"n": str(i)}) for i in range(5)]
    r.xgroup_create("trimmed", "g", id="0")
    assert [entry_id for entry_id, _ in r.xreadgroup("g", "alice", {"trimmed": ">"})[0][1]] == ids
    # The trim record goes after the five entries; keeping two keeps the last entry and it.
    assert r.xtrim("trimmed", maxlen=2, approximate=True) == 4
    cursor, claimed, deleted = r.xautoclaim("trimmed", "g", "bob", 0, "0-0")
    assert cursor == "0-0"
    assert [entry_id for entry_id, _ in claimed] == ids[4:]
    assert deleted == ids[:4]
    assert r.xpending("trimmed", "g")["pending"] == 1
    assert r.xack("trimmed", "g", *ids[:4]) == 0
