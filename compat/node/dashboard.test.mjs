// The dashboard at /dashboard in a real browser (Debian's headless Chromium, driven by
// playwright-core) against the real binary: signing in from the banner's link and with
// a wrong token, creating a basin and a stream, Studio (append, read once, stream live
// while another client appends, trim, fence), access tokens (issue with the scope
// builder, revoke), usage charts, the connection snippets and the cluster view, and a
// token scoped to one basin. Each test saves a screenshot under
// target/dashboard-screenshots/ and checks the browser console for errors.
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { existsSync, mkdirSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { chromium } from "playwright-core";
import { ROOT_TOKEN, startServer } from "./server.mjs";

const here = dirname(fileURLToPath(import.meta.url));
const shots = join(here, "..", "..", "target", "dashboard-screenshots");
const executablePath = process.env.CHROMIUM_PATH ?? "/usr/bin/chromium";

// Started at the top level: `startServer` stops the server when this file's tests end.
const server = await startServer(["--storage-metrics-interval-secs", "1"]);
let browser;

before(async () => {
	assert.ok(existsSync(executablePath), `no Chromium at ${executablePath}: install Debian's chromium (.ci/run does) or set CHROMIUM_PATH`);
	mkdirSync(shots, { recursive: true });
	browser = await chromium.launch({
		executablePath,
		args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
			"--disable-background-networking", "--disable-component-update", "--disable-sync"],
	});
});

after(async () => {
	await browser?.close();
});

/// A page with its console errors collected; `expected` matches errors a test causes on
/// purpose (the browser logs every request answered with an error status).
async function open(token, expected = []) {
	const context = await browser.newContext({ viewport: { width: 1280, height: 900 } });
	const page = await context.newPage();
	const errors = [];
	page.on("console", (m) => {
		if (m.type() === "error" && !expected.some((e) => e.test(m.text()))) errors.push(m.text());
	});
	page.on("pageerror", (e) => errors.push(String(e)));
	page.on("dialog", (d) => d.accept());
	await page.goto(`${server.endpoint}/dashboard${token === undefined ? "" : `#token=${encodeURIComponent(token)}`}`);
	return { page, errors, close: () => context.close() };
}

async function api(method, path, { basin, body, token = ROOT_TOKEN, headers = {} } = {}) {
	const response = await fetch(`${server.endpoint}${path}`, {
		method,
		headers: {
			authorization: `Bearer ${token}`,
			...(basin ? { "s2-basin": basin } : {}),
			...(body ? { "content-type": "application/json" } : {}),
			...headers,
		},
		body: body ? JSON.stringify(body) : undefined,
	});
	const text = await response.text();
	return { status: response.status, json: text ? JSON.parse(text) : null };
}

async function shot(page, name) {
	await page.screenshot({ path: join(shots, `${name}.png`), fullPage: true });
}

/// Runs `steps`; if one fails, saves a screenshot named `name` and adds what the page
/// said (its notice and the read counter) and the console errors to the failure, so a
/// failure in CI explains itself.
async function explained(name, { page, errors }, steps) {
	try {
		await steps();
	} catch (error) {
		await shot(page, `${name}-failed`).catch(() => {});
		const said = async (selector) => (await page.locator(selector).first().textContent({ timeout: 1000 }).catch(() => null)) ?? "(none)";
		error.message += `\n  notice: ${await said("#notice")}\n  read counter: ${await said(".rate")}` +
			`\n  console errors: ${JSON.stringify(errors)}\n  screenshot: target/dashboard-screenshots/${name}-failed.png`;
		throw error;
	}
}

test("signs in from the banner's link, and refuses a wrong token with a clear message", async () => {
	const { page, errors, close } = await open(ROOT_TOKEN);
	await page.getByRole("heading", { name: "Basins", level: 1 }).waitFor();
	assert.ok(!page.url().includes(ROOT_TOKEN), `the token left the address bar: ${page.url()}`);
	await shot(page, "01-basins");
	assert.deepEqual(errors, []);
	await close();

	const wrong = await open("not-a-valid-token", [/401/]);
	await wrong.page.getByRole("heading", { name: "Sign in" }).waitFor();
	await wrong.page.getByText("This access token was not accepted").waitFor();
	await shot(wrong.page, "02-wrong-token");
	await wrong.page.getByLabel("Access token").fill(ROOT_TOKEN);
	await wrong.page.getByRole("button", { name: "Sign in" }).click();
	await wrong.page.getByRole("heading", { name: "Basins", level: 1 }).waitFor();
	assert.deepEqual(wrong.errors, []);
	await wrong.close();
});

test("creates a basin and a stream, appends in Studio and reads it back", async () => {
	const { page, errors, close } = await open(ROOT_TOKEN);
	await page.getByLabel(/^Name/).fill("dashboard-basin");
	await page.getByRole("button", { name: "Create basin" }).click();
	await page.getByRole("link", { name: "dashboard-basin" }).click();
	await page.getByRole("heading", { name: "dashboard-basin", level: 1 }).waitFor();
	await page.getByLabel("Name").fill("events");
	await page.getByRole("button", { name: "Create stream" }).click();
	await page.getByRole("link", { name: "events" }).click();
	await page.getByRole("heading", { name: "Studio: events" }).waitFor();

	await page.getByLabel("Records", { exact: true }).selectOption("lines");
	await page.getByLabel("Records to append").fill("alpha\nbeta\n<b>not html</b>");
	await page.getByRole("button", { name: "Append", exact: true }).click();
	await page.getByText("Appended 0..3").waitFor();
	const read = await api("GET", "/v1/streams/events/records?seq_num=0", { basin: "dashboard-basin" });
	assert.deepEqual(read.json.records.map((r) => r.body), ["alpha", "beta", "<b>not html</b>"]);

	// A JSON array with headers, then read once from sequence number 0.
	await page.getByLabel("Records", { exact: true }).selectOption("json");
	await page.getByLabel("Records to append").fill('[{"body": "gamma", "headers": [["kind", "greek"]]}]');
	await page.getByRole("button", { name: "Append", exact: true }).click();
	await page.getByText("Appended 3..4").waitFor();
	await page.getByLabel("From", { exact: true }).selectOption("seq_num");
	await page.getByLabel("Value", { exact: true }).fill("0");
	await page.getByRole("button", { name: "Read once" }).click();
	const records = page.getByRole("table", { name: "Records read" });
	await records.getByText("gamma").waitFor();
	assert.equal(await records.locator("tbody tr").count(), 4);
	// Bodies are text, never markup.
	assert.equal(await records.locator("b").count(), 0);
	await records.getByText("<b>not html</b>").waitFor();
	await records.getByText("kind: greek").waitFor();
	await page.getByLabel("Show bodies as").selectOption("hex");
	await records.getByText("61 6c 70 68 61").waitFor();
	await shot(page, "03-studio-read");
	assert.deepEqual(errors, []);
	await close();
});

test("streams live while another client appends, then trims and fences", async () => {
	await api("POST", "/v1/basins", { body: { basin: "live-basin-1" } });
	await api("POST", "/v1/streams", { basin: "live-basin-1", body: { stream: "feed" } });
	const opened = await open(ROOT_TOKEN);
	const { page, errors, close } = opened;
	await explained("04-studio-live", opened, async () => {
		await page.goto(`${server.endpoint}/dashboard#/basins/live-basin-1/streams/feed`);
		await page.getByRole("heading", { name: "Studio: feed" }).waitFor();
		await page.getByLabel("From", { exact: true }).selectOption("seq_num");
		await page.getByLabel("Value", { exact: true }).fill("0");
		await page.getByRole("button", { name: "Stream", exact: true }).click();
		await page.getByRole("button", { name: "Stop" }).waitFor();
		for (let i = 0; i < 3; i++) {
			const appended = await api("POST", "/v1/streams/feed/records", {
				basin: "live-basin-1",
				body: { records: [{ body: `live-${i}` }] },
			});
			assert.equal(appended.status, 200);
		}
		const records = page.getByRole("table", { name: "Records read" });
		await records.getByText("live-2").waitFor({ timeout: 15_000 });
		await page.getByText(/live: 3 records/).waitFor();
		await shot(page, "04-studio-live");
		await page.getByRole("button", { name: "Stop" }).click();

		await page.getByLabel("New fencing token").fill("writer-1");
		await page.getByRole("button", { name: "Fence", exact: true }).click();
		await page.getByText("Fence appended.").waitFor();
		const unfenced = await api("POST", "/v1/streams/feed/records", {
			basin: "live-basin-1",
			body: { records: [{ body: "late" }], fencing_token: "someone-else" },
		});
		assert.equal(unfenced.status, 412, "the fence holds");
		await page.getByLabel("Fencing token", { exact: true }).fill("writer-1");
		await page.getByLabel("Trim records before sequence number").fill("2");
		await page.getByRole("button", { name: "Trim", exact: true }).click();
		await page.getByText("Trim appended.").waitFor();
		const read = await api("GET", "/v1/streams/feed/records?seq_num=0", { basin: "live-basin-1" });
		const commands = read.json.records.filter((r) => r.headers?.length === 1 && r.headers[0][0] === "");
		assert.deepEqual(commands.map((r) => r.headers[0][1]), ["fence", "trim"]);
		await page.getByLabel("Ignore command records").check();
		await page.getByRole("button", { name: "Read once" }).click();
		// The trim took records 0 and 1; the command records are hidden. The live session's
		// rows stay on the page until the read's answer replaces them, so wait for its count.
		await page.getByText("3 records (2 command records hidden)").waitFor();
		await records.getByText("live-2").waitFor();
		assert.equal(await records.getByText("live-0").count(), 0);
		assert.equal(await records.getByText("command").count(), 0);
		await shot(page, "05-studio-fenced");
		assert.deepEqual(errors, []);
	});
	await close();
});

test("issues an access token with the scope builder, and revokes it", async () => {
	const { page, errors, close } = await open(ROOT_TOKEN);
	await page.getByRole("link", { name: "Access tokens" }).click();
	await page.getByRole("heading", { name: "Access tokens", level: 1 }).waitFor();
	await page.getByLabel("ID", { exact: true }).fill("reader-1");
	await page.locator("#basins-kind").selectOption("exact");
	await page.locator("#basins-value").fill("dashboard-basin");
	await page.getByLabel("stream read", { exact: true }).check();
	await page.getByLabel("list-streams").check();
	await page.getByRole("button", { name: "Issue token" }).click();
	const secret = (await page.locator("#issued-secret").textContent()).trim();
	assert.ok(secret.length > 20);
	const allowed = await api("GET", "/v1/streams/events/records?seq_num=0", { basin: "dashboard-basin", token: secret });
	assert.equal(allowed.status, 200);
	const denied = await api("POST", "/v1/streams/events/records", {
		basin: "dashboard-basin",
		token: secret,
		body: { records: [{ body: "x" }] },
	});
	assert.equal(denied.status, 403);
	await shot(page, "06-token-issued");
	await page.getByRole("button", { name: "Revoke reader-1" }).click();
	await page.getByText("Access token reader-1 revoked.").waitFor();
	const revoked = await api("GET", "/v1/streams/events/records?seq_num=0", { basin: "dashboard-basin", token: secret });
	assert.equal(revoked.status, 401);
	assert.deepEqual(errors, []);
	await close();
});

test("shows usage charts, connection snippets and the cluster", async () => {
	const { page, errors, close } = await open(ROOT_TOKEN);
	await page.goto(`${server.endpoint}/dashboard#/basins/dashboard-basin`);
	await page.getByRole("heading", { name: "Usage" }).waitFor();
	// Counts reach the metadata store within 5 s; the charts are drawn from it.
	const throughput = page.locator("figure", { hasText: "Append throughput" });
	for (let i = 0; i < 30; i++) {
		await page.getByLabel("Period").selectOption("0");
		await throughput.locator(".legend span").first().waitFor();
		if ((await throughput.textContent()).includes("express")) break;
		await page.waitForTimeout(1000);
	}
	assert.match(await throughput.textContent(), /express/);
	assert.equal(await page.locator("figure.chart").count(), 6);
	await page.locator("figure", { hasText: "Stored bytes" }).waitFor();
	await shot(page, "07-usage");
	await page.getByRole("link", { name: "Usage" }).click();
	await page.getByRole("heading", { name: "Active basins" }).waitFor();
	await page.getByRole("link", { name: "dashboard-basin" }).waitFor();
	await page.locator("figure", { hasText: "Account operations" }).waitFor();
	await shot(page, "07b-account-usage");

	await page.getByRole("link", { name: "Connect" }).click();
	await page.getByRole("heading", { name: "Connect", level: 1 }).waitFor();
	await page.getByLabel("Basin", { exact: true }).selectOption("dashboard-basin");
	await page.getByText(`export S2_ACCOUNT_ENDPOINT=${server.endpoint}`).waitFor();
	await page.getByText(/redis-cli -h 127\.0\.0\.1 -p \d+ --user dashboard-basin/).waitFor();
	await page.getByText("s2-basin: dashboard-basin").waitFor();
	await shot(page, "08-connect");

	await page.getByRole("link", { name: "Cluster" }).click();
	await page.getByRole("heading", { name: "Cluster", level: 1 }).waitFor();
	const nodes = page.getByRole("table", { name: "Nodes" });
	await nodes.locator("tbody tr").first().waitFor();
	await shot(page, "09-cluster");
	assert.deepEqual(errors, []);
	await close();
});

test("a token scoped to one basin sees only that basin and cannot issue a broader token", async () => {
	await api("POST", "/v1/basins", { body: { basin: "tenant-basin-1" } });
	const issued = await api("POST", "/v1/access-tokens", {
		body: {
			id: "tenant-1",
			scope: {
				basins: { exact: "tenant-basin-1" },
				streams: { prefix: "" },
				access_tokens: { prefix: "tenant-1/" },
				op_groups: { basin: { read: true, write: true }, stream: { read: true, write: true } },
				ops: ["list-basins", "issue-access-token", "list-access-tokens"],
			},
		},
	});
	assert.equal(issued.status, 201);
	const { page, errors, close } = await open(issued.json.access_token, [/403/]);
	await page.getByRole("heading", { name: "Basins", level: 1 }).waitFor();
	const table = page.locator("table");
	await table.getByRole("link", { name: "tenant-basin-1" }).waitFor();
	assert.equal(await table.locator("tbody tr").count(), 1, "only its own basin");

	await page.getByRole("link", { name: "Access tokens" }).click();
	await page.getByLabel("ID", { exact: true }).fill("tenant-1/wider");
	await page.locator("#basins-kind").selectOption("prefix");
	await page.locator("#basins-value").fill("");
	await page.getByLabel("stream read", { exact: true }).check();
	await page.getByRole("button", { name: "Issue token" }).click();
	await page.getByRole("alert").getByText(/scope/).waitFor();
	assert.equal(await page.locator("#issued-secret").count(), 0);
	await shot(page, "10-scoped-token");
	assert.deepEqual(errors, []);
	await close();
});
