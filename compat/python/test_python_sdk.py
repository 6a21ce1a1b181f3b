"""The official Python SDK (PyPI `s2-sdk`) against the real binary: the unary operations.

It speaks HTTP/2 with prior knowledge and protobuf for records, so this also checks
those paths of the server.
"""

import asyncio

import pytest
from conftest import ROOT_TOKEN
from s2_sdk import (
    S2,
    AppendInput,
    BasinConfig,
    CommandRecord,
    Endpoints,
    FencingTokenMismatchError,
    ReadLimit,
    ReadUnwrittenError,
    Record,
    Retry,
    S2ServerError,
    SeqNum,
    SeqNumMismatchError,
    StreamConfig,
    TailOffset,
    Timestamp,
)


def client(endpoint):
    return S2(ROOT_TOKEN, endpoints=Endpoints(account=endpoint, basin=endpoint), retry=Retry(max_attempts=1))


def run(coro):
    return asyncio.run(coro)


def test_basin_and_stream_lifecycle(endpoint):
    async def scenario():
        async with client(endpoint) as s2:
            for name in ["py-basin-a", "py-basin-b", "py-basin-c"]:
                info = await s2.create_basin(name)
                assert info.name == name
            with pytest.raises(S2ServerError) as err:
                await s2.create_basin("py-basin-a")
            assert err.value.code == "resource_already_exists"
            assert err.value.status_code == 409

            page = await s2.list_basins(prefix="py-basin", limit=2)
            assert [b.name for b in page.items] == ["py-basin-a", "py-basin-b"]
            assert page.has_more
            names = [b.name async for b in s2.list_all_basins(prefix="py-basin")]
            assert names == ["py-basin-a", "py-basin-b", "py-basin-c"]

            config = await s2.reconfigure_basin(
                "py-basin-a", config=BasinConfig(create_stream_on_append=True)
            )
            assert config.create_stream_on_append
            assert (await s2.get_basin_config("py-basin-a")).create_stream_on_append

            basin = s2.basin("py-basin-a")
            await basin.create_stream("s1", config=StreamConfig(retention_policy=3600))
            await basin.create_stream("s2")
            assert (await basin.get_stream_config("s1")).retention_policy == 3600
            await basin.reconfigure_stream("s1", config=StreamConfig(retention_policy=60))
            assert (await basin.get_stream_config("s1")).retention_policy == 60
            streams = [s.name async for s in basin.list_all_streams()]
            assert streams == ["s1", "s2"]

            await basin.delete_stream("s2")
            with pytest.raises(S2ServerError) as err:
                await basin.delete_stream("missing")
            assert err.value.code == "stream_not_found"
            await basin.delete_stream("missing", ignore_not_found=True)
            await s2.delete_basin("py-basin-c")
            await s2.delete_basin("py-basin-zz", ignore_not_found=True)

    run(scenario())


def test_append_read_and_tail(endpoint):
    async def scenario():
        async with client(endpoint) as s2:
            await s2.create_basin("py-records")
            basin = s2.basin("py-records")
            await basin.create_stream("events")
            stream = basin.stream("events")

            assert (await stream.check_tail()).seq_num == 0
            ack = await stream.append(
                AppendInput(records=[Record(body=b"hello", headers=[(b"k", b"v")]), Record(body=b"\x00\xff")])
            )
            assert (ack.start.seq_num, ack.end.seq_num) == (0, 2)
            for i in range(2, 10):
                await stream.append(AppendInput(records=[Record(body=f"r{i}".encode())]))
            assert (await stream.check_tail()).seq_num == 10

            batch = await stream.read(start=SeqNum(0))
            assert len(batch.records) == 10
            assert batch.records[0].body == b"hello"
            assert batch.records[0].headers == [(b"k", b"v")]
            assert batch.records[1].body == b"\x00\xff"

            batch = await stream.read(start=TailOffset(3))
            assert [r.body for r in batch.records] == [b"r7", b"r8", b"r9"]
            ts = batch.records[0].timestamp
            batch = await stream.read(start=Timestamp(ts))
            assert batch.records[0].timestamp >= ts

            batch = await stream.read(start=SeqNum(2), limit=ReadLimit(count=3))
            assert [r.body for r in batch.records] == [b"r2", b"r3", b"r4"]
            batch = await stream.read(start=SeqNum(2), limit=ReadLimit(bytes=21))
            assert len(batch.records) == 2

            with pytest.raises(ReadUnwrittenError) as err:
                await stream.read(start=SeqNum(10))
            assert err.value.tail.seq_num == 10
            batch = await stream.read(start=SeqNum(99), clamp_to_tail=True, wait=1)
            assert batch.records == []

    run(scenario())


def test_conditions_fence_and_trim(endpoint):
    async def scenario():
        async with client(endpoint) as s2:
            await s2.create_basin("py-conditions")
            stream = s2.basin("py-conditions").stream("cas")
            await s2.basin("py-conditions").create_stream("cas")

            await stream.append(AppendInput(records=[Record(body=b"a"), Record(body=b"b")]))
            with pytest.raises(SeqNumMismatchError) as err:
                await stream.append(AppendInput(records=[Record(body=b"c")], match_seq_num=0))
            assert err.value.expected_seq_num == 2

            await stream.append(AppendInput(records=[CommandRecord.fence("writer-1")], fencing_token=""))
            with pytest.raises(FencingTokenMismatchError) as err:
                await stream.append(AppendInput(records=[Record(body=b"x")], fencing_token="writer-2"))
            assert err.value.expected_fencing_token == "writer-1"
            ack = await stream.append(AppendInput(records=[Record(body=b"d")], fencing_token="writer-1"))
            assert ack.start.seq_num == 3

            await stream.append(AppendInput(records=[CommandRecord.trim(2)]))
            batch = await stream.read(start=SeqNum(0))
            assert batch.records[0].seq_num == 2
            batch = await stream.read(start=SeqNum(0), ignore_command_records=True)
            assert [r.body for r in batch.records] == [b"d"]

    run(scenario())


def test_auto_creation(endpoint):
    async def scenario():
        async with client(endpoint) as s2:
            await s2.create_basin("py-auto-create", config=BasinConfig(create_stream_on_append=True))
            stream = s2.basin("py-auto-create").stream("made/on-append")
            ack = await stream.append(AppendInput(records=[Record(body=b"first")]))
            assert ack.start.seq_num == 0
            with pytest.raises(S2ServerError) as err:
                await s2.basin("py-auto-create").stream("not-made").check_tail()
            assert err.value.code == "stream_not_found"

    run(scenario())
