"""The Python SDK's streaming APIs against the real binary: append sessions, the
producer, and read sessions (bounded and following)."""

import asyncio

from s2_sdk import AppendInput, ReadLimit, Record, SeqNum, TailOffset

from test_python_sdk import client, run


async def fresh_stream(s2, name):
    await s2.create_basin("py-sessions")
    basin = s2.basin("py-sessions")
    await basin.create_stream(name)
    return basin.stream(name)


def test_append_session_pipelines_and_acks_in_order(endpoint):
    async def scenario():
        async with client(endpoint) as s2:
            stream = await fresh_stream(s2, "pipelined")
            async with stream.append_session() as session:
                tickets = [
                    await session.submit(AppendInput(records=[Record(body=f"{i}-{j}".encode()) for j in range(4)]))
                    for i in range(100)
                ]
                acks = [await ticket for ticket in tickets]
            assert [a.start.seq_num for a in acks] == list(range(0, 400, 4))
            assert all(a.end.seq_num - a.start.seq_num == 4 for a in acks)
            assert (await stream.check_tail()).seq_num == 400

            bodies = []
            async for batch in stream.read_session(start=SeqNum(0), limit=ReadLimit(count=400)):
                bodies.extend(r.body for r in batch.records)
            assert len(bodies) == 400
            assert bodies[0] == b"0-0" and bodies[-1] == b"99-3"

    run(scenario())


def test_producer_and_following_read_session(endpoint):
    async def scenario():
        async with client(endpoint) as s2:
            stream = await fresh_stream(s2, "produced")
            async with stream.producer() as producer:
                tickets = [await producer.submit(Record(body=f"p{i}".encode())) for i in range(50)]
                seqs = [(await ticket).seq_num for ticket in tickets]
            assert seqs == list(range(50))

            received = []

            async def follow():
                async for batch in stream.read_session(start=TailOffset(2)):
                    received.extend(r.body for r in batch.records)
                    if len(received) >= 4:
                        return

            follower = asyncio.create_task(follow())
            await asyncio.sleep(0.3)
            await stream.append(AppendInput(records=[Record(body=b"live-1"), Record(body=b"live-2")]))
            await asyncio.wait_for(follower, 20)
            assert received == [b"p48", b"p49", b"live-1", b"live-2"]

    run(scenario())
