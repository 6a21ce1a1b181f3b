// What a web page does with the TypeScript SDK, bundled for the browser by
// browser.test.mjs: in a browser the SDK speaks JSON over fetch and reads with SSE, so
// every call here is a cross-origin request that needs streamgate's CORS answers.
import { AppendInput, AppendRecord, S2 } from "@s2-dev/streamstore";

async function firstRecords(session, count) {
	const bodies = [];
	for await (const record of session) {
		bodies.push(record.body);
		if (bodies.length === count) break;
	}
	return bodies;
}

window.scenario = async ({ endpoint, token, basin: basinName, key }) => {
	const s2 = new S2({ accessToken: token, endpoints: { account: endpoint, basin: endpoint } });
	await s2.basins.create({ basin: basinName });
	const basin = s2.basin(basinName);
	await basin.streams.create({ stream: "page" });
	const stream = basin.stream("page");

	// A read session (SSE) following the tail, opened before the appends.
	const following = await stream.readSession({ start: { from: { seqNum: 0 } } });
	const followed = firstRecords(following, 4);

	const ack = await stream.append(
		AppendInput.create([
			AppendRecord.string({ body: "from-the-browser-0", headers: [["origin", "page"]] }),
			AppendRecord.string({ body: "from-the-browser-1" }),
		]),
	);
	const session = await stream.appendSession();
	const ticket = await session.submit(
		AppendInput.create([
			AppendRecord.string({ body: "session-0" }),
			AppendRecord.string({ body: "session-1" }),
		]),
	);
	const sessionAck = await ticket.ack();
	await session.close();

	const batch = await stream.read({
		start: { from: { seqNum: 0 } },
		stop: { limits: { count: 10 } },
	});
	const tail = await stream.checkTail();

	// An encrypted stream: the key travels in `s2-encryption-key`, a header the
	// preflight must allow.
	await s2.basins.reconfigure({ basin: basinName, streamCipher: "aegis-256" });
	await basin.streams.create({ stream: "sealed" });
	const sealed = basin.stream("sealed", { encryptionKey: key });
	await sealed.append(AppendInput.create([AppendRecord.string({ body: "browser secret" })]));
	const sealedBatch = await sealed.read({
		start: { from: { seqNum: 0 } },
		stop: { limits: { count: 1 } },
	});

	return {
		ack: [ack.start.seqNum, ack.end.seqNum],
		sessionAck: [sessionAck.start.seqNum, sessionAck.end.seqNum],
		read: batch.records.map((r) => r.body),
		headers: batch.records[0].headers,
		followed: await followed,
		tail: tail.tail.seqNum,
		sealed: sealedBatch.records.map((r) => r.body),
	};
};
