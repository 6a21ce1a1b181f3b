// The TypeScript SDK (@s2-dev/streamstore, on Node.js: S2S sessions over HTTP/2)
// against the real streamgate binary, which STREAMGATE_BIN names.
import { test } from "node:test";
import { ROOT_TOKEN, startServer } from "./server.mjs";
import assert from "node:assert/strict";
import { AppendInput, AppendRecord, S2 } from "@s2-dev/streamstore";

const { endpoint } = await startServer();
const s2 = new S2({
	accessToken: ROOT_TOKEN,
	endpoints: { account: endpoint, basin: endpoint },
});

test("append session acknowledges pipelined batches in order", async () => {
	await s2.basins.create({ basin: "node-sessions" });
	const basin = s2.basin("node-sessions");
	await basin.streams.create({ stream: "pipelined" });
	const stream = basin.stream("pipelined");

	const session = await stream.appendSession();
	const tickets = [];
	for (let i = 0; i < 50; i++) {
		tickets.push(
			await session.submit(
				AppendInput.create([
					AppendRecord.string({ body: `batch-${i}-a` }),
					AppendRecord.string({ body: `batch-${i}-b` }),
				]),
			),
		);
	}
	const acks = await Promise.all(tickets.map((t) => t.ack()));
	acks.forEach((ack, i) => {
		assert.equal(ack.start.seqNum, i * 2);
		assert.equal(ack.end.seqNum, i * 2 + 2);
	});
	await session.close();

	const reads = await stream.readSession({
		start: { from: { seqNum: 0 } },
		stop: { limits: { count: 100 } },
	});
	const bodies = [];
	for await (const record of reads) {
		bodies.push(record.body);
	}
	assert.equal(bodies.length, 100);
	assert.equal(bodies[0], "batch-0-a");
	assert.equal(bodies[99], "batch-49-b");
});

test("a following read session delivers records appended later", async () => {
	const basin = s2.basin("node-sessions");
	await basin.streams.create({ stream: "followed" });
	const stream = basin.stream("followed");
	const reads = await stream.readSession({ start: { from: { seqNum: 0 } } });
	const iterator = reads[Symbol.asyncIterator]();
	// The read may deliver the record before the append's own acknowledgement arrives, so the
	// test waits for both: an append still in flight when the server stops would fail later.
	const appended = new Promise((resolve) => setTimeout(resolve, 300)).then(() =>
		stream.append(AppendInput.create([AppendRecord.string({ body: "later" })])),
	);
	const first = await iterator.next();
	assert.equal(first.value.body, "later");
	assert.equal(first.value.seqNum, 0);
	await iterator.return?.();
	const ack = await appended;
	assert.equal(ack.start.seqNum, 0);
	assert.equal(ack.end.seqNum, 1);
});
