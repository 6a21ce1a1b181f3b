// The TypeScript SDK (@s2-dev/streamstore, on Node.js: S2S sessions over HTTP/2)
// against the real streamgate binary, which STREAMGATE_BIN names.
import { test, after } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { AppendInput, AppendRecord, S2 } from "@s2-dev/streamstore";

async function startServer() {
	const binary = process.env.STREAMGATE_BIN;
	assert.ok(binary, "set STREAMGATE_BIN to a built streamgate binary (scripts/test.sh does)");
	const dataDir = mkdtempSync(join(tmpdir(), "streamgate-node-"));
	const child = spawn(binary, ["--data-dir", dataDir, "--listen", "127.0.0.1:0"], {
		stdio: ["ignore", "pipe", "inherit"],
		env: { ...process.env, STREAMGATE_LOG: "warn" },
	});
	const endpoint = await new Promise((resolve, reject) => {
		let text = "";
		const timer = setTimeout(() => reject(new Error("streamgate did not start")), 60_000);
		child.stdout.on("data", (chunk) => {
			text += chunk;
			const match = text.match(/ listening on (\S+)/);
			if (match) {
				clearTimeout(timer);
				resolve(match[1]);
			}
		});
	});
	after(() => child.kill("SIGKILL"));
	return endpoint;
}

const endpoint = await startServer();
const s2 = new S2({
	accessToken: "unused",
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
	setTimeout(() => {
		stream.append(AppendInput.create([AppendRecord.string({ body: "later" })]));
	}, 300);
	const first = await iterator.next();
	assert.equal(first.value.body, "later");
	assert.equal(first.value.seqNum, 0);
	await iterator.return?.();
});
