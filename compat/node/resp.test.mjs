// node-redis and ioredis running the Redis Streams page's program against streamgate's
// RESP listener: append three entries, page with XRANGE (last-id, tail with XREAD BLOCK
// on a dedicated connection.
import { test } from "node:test";
import https from "node:https";
import assert from "node:assert/strict";
import { createClient } from "redis";
import Redis from "ioredis";
import { ROOT_TOKEN, selfSignedCertificate, startServer } from "./server.mjs";

const { endpoint, respPort } = await startServer();
const basin = "node-resp-basin";
const created = await fetch(`${endpoint}/v1/basins`, {
	method: "POST",
	headers: { "content-type": "application/json", authorization: `Bearer ${ROOT_TOKEN}` },
	body: JSON.stringify({ basin, config: { create_stream_on_append: true } }),
});
assert.equal(created.status, 201);

// Over TLS the SNI host name names the basin, as on the cloud service.
const { cert, key } = selfSignedCertificate();
const secure = await startServer(["--tls-cert", cert, "--tls-key", key]);
const secureBasinReady = await new Promise((resolve) => {
	// node:https, because the certificate is self-signed.
	const request = https.request(
		`${secure.endpoint}/v1/basins`,
		{
			method: "POST",
			headers: { "content-type": "application/json", authorization: `Bearer ${ROOT_TOKEN}` },
			rejectUnauthorized: false,
		},
		(response) => {
			response.resume();
			resolve(response.statusCode === 201);
		},
	);
	request.on("error", () => resolve(false));
	request.end(JSON.stringify({ basin, config: { create_stream_on_append: true } }));
});
const servername = `${basin}.r.localhost`;

const plainOptions = { socket: { host: "127.0.0.1", port: respPort }, username: basin, password: ROOT_TOKEN };

test("node-redis: append, page, tail", async () => {
	await nodeRedisProgram(plainOptions);
});

test("node-redis over TLS with SNI naming the basin", async () => {
	assert.ok(secureBasinReady, "the TLS server's basin was created");
	await nodeRedisProgram({
		socket: { host: "127.0.0.1", port: secure.respPort, tls: true, servername, rejectUnauthorized: false },
		password: ROOT_TOKEN,
	});
});

async function nodeRedisProgram(options) {
	const client = createClient(options);
	await client.connect();
	const stream = "node-redis-events";
	const ids = [];
	for (let i = 0; i < 3; i++) {
		ids.push(await client.xAdd(stream, "*", { kind: "example", n: String(i) }));
	}
	assert.deepEqual(ids.map((id) => id.split("-")[1]), ["0", "1", "2"]);
	const read = [];
	let start = "-";
	let lastId = null;
	while (true) {
		const page = await client.xRange(stream, start, "+", { COUNT: 2 });
		if (page.length === 0) break;
		read.push(...page);
		lastId = page.at(-1).id;
		start = `(${lastId}`;
	}
	assert.deepEqual(read.map((e) => e.id), ids);
	assert.deepEqual({ ...read[2].message }, { kind: "example", n: "2" });

	const tail = client.duplicate();
	await tail.connect();
	const pending = tail.xRead({ key: stream, id: lastId }, { COUNT: 100, BLOCK: 10_000 });
	setTimeout(() => client.xAdd(stream, "*", { kind: "late" }), 300);
	const reply = await pending;
	assert.equal(reply[0].name, stream);
	assert.deepEqual({ ...reply[0].messages[0].message }, { kind: "late" });
	await tail.quit();
	await client.quit();
}

test("ioredis: append, page, tail", async () => {
	await ioredisProgram({ host: "127.0.0.1", port: respPort, username: basin, password: ROOT_TOKEN });
});

test("ioredis over TLS with SNI naming the basin", async () => {
	assert.ok(secureBasinReady, "the TLS server's basin was created");
	await ioredisProgram({
		host: "127.0.0.1",
		port: secure.respPort,
		password: ROOT_TOKEN,
		tls: { servername, rejectUnauthorized: false },
	});
});

async function ioredisProgram(options) {
	const redis = new Redis(options);
	const stream = "ioredis-events";
	const ids = [];
	for (let i = 0; i < 3; i++) {
		ids.push(await redis.xadd(stream, "*", "kind", "example", "n", String(i)));
	}
	let start = "-";
	let lastId = null;
	const read = [];
	while (true) {
		const page = await redis.xrange(stream, start, "+", "COUNT", 100);
		if (page.length === 0) break;
		read.push(...page);
		lastId = page.at(-1)[0];
		start = `(${lastId}`;
	}
	assert.deepEqual(read.map(([id]) => id), ids);
	assert.deepEqual(read[0][1], ["kind", "example", "n", "0"]);

	const tail = redis.duplicate();
	const pending = tail.xread("COUNT", 100, "BLOCK", 10_000, "STREAMS", stream, lastId);
	setTimeout(() => redis.xadd(stream, "*", "kind", "late"), 300);
	const reply = await pending;
	assert.equal(reply[0][0], stream);
	assert.deepEqual(reply[0][1][0][1], ["kind", "late"]);
	tail.disconnect();
	redis.disconnect();
}

// A work queue shared by node-redis and ioredis workers in one consumer group: a consumer
// that takes a batch and vanishes leaves it pending, the others take it over with
// XAUTOCLAIM, and every job is processed and acknowledged exactly once.
test("node-redis and ioredis workers share a consumer group", async () => {
	const stream = "node-jobs";
	const group = "workers";
	const jobs = 120;
	const producer = createClient(plainOptions);
	await producer.connect();
	await producer.xGroupCreate(stream, group, "0", { MKSTREAM: true });
	for (let i = 0; i < jobs; i++) {
		await producer.xAdd(stream, "*", { job: String(i) });
	}

	// Takes ten jobs and disappears without acknowledging them.
	const vanished = new Redis({ host: "127.0.0.1", port: respPort, username: basin, password: ROOT_TOKEN });
	const taken = await vanished.xreadgroup("GROUP", group, "vanished", "COUNT", 10, "STREAMS", stream, ">");
	assert.equal(taken[0][1].length, 10);
	vanished.disconnect();
	const summary = await producer.xPending(stream, group);
	assert.equal(summary.pending, 10);

	const done = new Map();
	const acks = new Map();
	const record = (job, acked) => {
		done.set(job, (done.get(job) ?? 0) + 1);
		acks.set(job, (acks.get(job) ?? 0) + acked);
	};
	const finished = async () => (await producer.xPending(stream, group)).pending === 0;

	async function nodeRedisWorker(name) {
		const client = createClient(plainOptions);
		await client.connect();
		let cursor = "0-0";
		while (true) {
			const claimed = await client.xAutoClaim(stream, group, name, 300, cursor, { COUNT: 5 });
			cursor = claimed.nextId;
			const fresh = await client.xReadGroup(group, name, { key: stream, id: ">" }, { COUNT: 5, BLOCK: 100 });
			const messages = [...claimed.messages.filter(Boolean), ...(fresh?.[0]?.messages ?? [])];
			for (const { id, message } of messages) {
				record(message.job, await client.xAck(stream, group, id));
			}
			if (messages.length === 0 && cursor === "0-0" && (await finished())) break;
		}
		await client.quit();
	}

	async function ioredisWorker(name) {
		const client = new Redis({ host: "127.0.0.1", port: respPort, username: basin, password: ROOT_TOKEN });
		let cursor = "0-0";
		while (true) {
			const [next, claimed] = await client.xautoclaim(stream, group, name, 300, cursor, "COUNT", 5);
			cursor = next;
			const fresh = await client.xreadgroup("GROUP", group, name, "COUNT", 5, "BLOCK", 100, "STREAMS", stream, ">");
			const entries = [...claimed, ...(fresh?.[0]?.[1] ?? [])];
			for (const [id, fields] of entries) {
				record(fields[fields.indexOf("job") + 1], await client.xack(stream, group, id));
			}
			if (entries.length === 0 && cursor === "0-0" && (await finished())) break;
		}
		client.disconnect();
	}

	await Promise.all([nodeRedisWorker("n1"), nodeRedisWorker("n2"), ioredisWorker("i1"), ioredisWorker("i2")]);
	assert.equal(done.size, jobs, "every job processed");
	for (const [job, count] of acks) {
		assert.equal(count, 1, `job ${job} acknowledged exactly once`);
	}
	const groups = await producer.xInfoGroups(stream);
	assert.equal(groups.length, 1);
	assert.equal(groups[0].pending, 0);
	assert.equal(groups[0].lag, 0);
	assert.equal(groups[0]["entries-read"], jobs);
	const consumers = await producer.xInfoConsumers(stream, group);
	assert.deepEqual(consumers.map((c) => c.name).sort(), ["i1", "i2", "n1", "n2", "vanished"]);
	await producer.quit();
});
