// The TypeScript SDK in a real browser (Debian's headless Chromium, driven by
// playwright-core) on a page of another origin than streamgate: every call is a
// cross-origin request, so this checks the server's CORS answers end to end — basins,
// streams, appends, an append session, unary reads, an SSE read session following the
// tail, and the `s2-encryption-key` header. With an allow-list that leaves the page's
// origin out, the browser must refuse the same calls.
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { createServer } from "node:http";
import { existsSync, mkdtempSync, readFileSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { build } from "esbuild";
import { chromium } from "playwright-core";
import { ROOT_TOKEN, startServer } from "./server.mjs";

const here = dirname(fileURLToPath(import.meta.url));
const executablePath = process.env.CHROMIUM_PATH ?? "/usr/bin/chromium";

let page;
let browser;
let pageOrigin;
const consoleErrors = [];
const cleanups = [];

before(async () => {
	assert.ok(
		existsSync(executablePath),
		`no Chromium at ${executablePath}: install Debian's chromium (.ci/run does) or set CHROMIUM_PATH`,
	);
	// The SDK bundled for the browser (Node-only transports stay out).
	const out = mkdtempSync(join(tmpdir(), "streamgate-browser-"));
	await build({
		entryPoints: [join(here, "browser", "sdk-page.mjs")],
		bundle: true,
		format: "esm",
		platform: "browser",
		external: ["node:*"],
		outfile: join(out, "page.js"),
		logLevel: "error",
	});
	writeFileSync(
		join(out, "index.html"),
		'<!doctype html><html><head><meta charset="utf-8"><title>streamgate CORS</title>' +
			'<script type="module" src="/page.js"></script></head><body>SDK page</body></html>',
	);
	// The page's own origin: a static server on another port.
	const site = createServer((request, response) => {
		const file = request.url === "/page.js" ? "page.js" : "index.html";
		const type = file.endsWith(".js") ? "text/javascript" : "text/html";
		response.writeHead(200, { "content-type": type });
		response.end(readFileSync(join(out, file)));
	});
	await new Promise((resolve) => site.listen(0, "127.0.0.1", resolve));
	pageOrigin = `http://localhost:${site.address().port}`;
	cleanups.push(() => site.close());

	browser = await chromium.launch({
		executablePath,
		args: [
			"--no-sandbox",
			"--disable-gpu",
			"--disable-quic",
			"--no-first-run",
			"--disable-background-networking",
			"--disable-component-update",
			"--disable-sync",
		],
	});
	cleanups.push(() => browser.close());
});

after(async () => {
	for (const cleanup of cleanups) await cleanup();
});

async function openPage() {
	page = await browser.newPage();
	page.on("console", (message) => {
		if (message.type() === "error") consoleErrors.push(message.text());
	});
	page.on("pageerror", (error) => consoleErrors.push(String(error)));
	await page.goto(`${pageOrigin}/`);
	await page.waitForFunction(() => typeof window.scenario === "function");
	return page;
}

const key = Buffer.alloc(32, 7).toString("base64");

test("the SDK works from a page of another origin", async () => {
	const { endpoint } = await startServer();
	const page = await openPage();
	const result = await page.evaluate(
		(args) => window.scenario(args),
		{ endpoint, token: ROOT_TOKEN, basin: "browser-basin", key },
	);
	assert.deepEqual(result.ack, [0, 2]);
	assert.deepEqual(result.sessionAck, [2, 4]);
	assert.deepEqual(result.read, [
		"from-the-browser-0",
		"from-the-browser-1",
		"session-0",
		"session-1",
	]);
	assert.deepEqual(result.headers, [["origin", "page"]]);
	assert.deepEqual(result.followed, result.read, "the SSE session delivered every record");
	assert.equal(result.tail, 4);
	assert.deepEqual(result.sealed, ["browser secret"]);
	assert.deepEqual(consoleErrors, [], "the browser console has no errors");
	await page.close();
});

test("an origin left out of --cors-allow-origin is refused by the browser", async () => {
	const { endpoint } = await startServer(["--cors-allow-origin", "https://dashboard.example.com"]);
	const page = await openPage();
	const outcome = await page.evaluate(async (args) => {
		try {
			await window.scenario(args);
			return "succeeded";
		} catch (error) {
			return String(error);
		}
	}, { endpoint, token: ROOT_TOKEN, basin: "refused-basin", key });
	assert.notEqual(outcome, "succeeded");
	assert.match(outcome, /NETWORK_ERROR|Failed to fetch/, outcome);
	// The browser reports the blocked request itself; nothing else went wrong.
	assert.ok(consoleErrors.length > 0 && consoleErrors.every((e) => /CORS|Failed to load|fetch/i.test(e)),
		consoleErrors.join("\n"));
	consoleErrors.length = 0;
	await page.close();
});
