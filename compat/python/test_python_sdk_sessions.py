"""The Python SDK's streaming APIs against the real binary: append sessions, the
producer, and read sessions (bounded and following), also on an encrypted stream."""

import asyncio
import base64
import os

import pytest
from s2_sdk import AppendInput, BasinConfig, Encryption, ReadLimit, Record, S2ServerError, SeqNum, TailOffset

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


def test_encrypted_stream_with_sessions_and_unary_calls(endpoint):
    async def scenario():
        async with client(endpoint) as s2:
            await s2.create_basin("py-encrypted", config=BasinConfig(stream_cipher=Encryption.AES_256_GCM))
            assert (await s2.get_basin_config("py-encrypted")).stream_cipher == Encryption.AES_256_GCM
            basin = s2.basin("py-encrypted")
            info = await basin.create_stream("secret")
            assert info.cipher == Encryption.AES_256_GCM
            assert [s.cipher async for s in basin.list_all_streams()] == [Encryption.AES_256_GCM]

            key = os.urandom(32)
            stream = basin.stream("secret", encryption_key=key)
            ack = await stream.append(AppendInput(records=[Record(body=b"top secret", headers=[(b"k", b"v")])]))
            assert (ack.start.seq_num, ack.end.seq_num) == (0, 1)
            async with stream.append_session() as session:
                tickets = [
                    await session.submit(AppendInput(records=[Record(body=f"{i}-{j}".encode()) for j in range(4)]))
                    for i in range(25)
                ]
                acks = [await ticket for ticket in tickets]
            assert acks[-1].end.seq_num == 101

            batch = await stream.read(start=SeqNum(0), limit=ReadLimit(count=1))
            assert batch.records[0].body == b"top secret"
            assert batch.records[0].headers == [(b"k", b"v")]
            bodies = []
            async for batch in stream.read_session(start=SeqNum(1), limit=ReadLimit(count=100)):
                bodies.extend(r.body for r in batch.records)
            assert len(bodies) == 100 and bodies[0] == b"0-0" and bodies[-1] == b"24-3"

            # The key as base64 text works the same as the bytes.
            as_text = basin.stream("secret", encryption_key=base64.b64encode(key).decode())
            assert (await as_text.read(start=SeqNum(0), limit=ReadLimit(count=1))).records[0].body == b"top secret"

            wrong = basin.stream("secret", encryption_key=os.urandom(32))
            with pytest.raises(S2ServerError) as err:
                await wrong.read(start=SeqNum(0))
            assert (err.value.code, err.value.status_code) == ("decryption_failed", 400)
            keyless = basin.stream("secret")
            with pytest.raises(S2ServerError) as err:
                await keyless.append(AppendInput(records=[Record(body=b"x")]))
            assert (err.value.code, err.value.status_code) == ("invalid", 422)
            assert (await keyless.check_tail()).seq_num == 101

    run(scenario())
