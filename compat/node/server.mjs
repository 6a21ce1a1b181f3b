// Starts the real streamgate binary (STREAMGATE_BIN) on free ports with its own data
// directory, for the Node.js suites; stops it when the test file ends.
import { after } from "node:test";
import assert from "node:assert/strict";
import { execFileSync, spawn } from "node:child_process";
import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

// The root access token every test server is started with (`--root-token`).
export const ROOT_TOKEN = "streamgate-test-root-token-0123456789";

export async function startServer(extraArgs = []) {
	const binary = process.env.STREAMGATE_BIN;
	assert.ok(binary, "set STREAMGATE_BIN to a built streamgate binary (scripts/test.sh does)");
	const dataDir = mkdtempSync(join(tmpdir(), "streamgate-node-"));
	const args = [
		"--data-dir", dataDir, "--listen", "127.0.0.1:0", "--resp-listen", "127.0.0.1:0",
		"--compaction-interval-ms", "300", "--root-token", ROOT_TOKEN, ...extraArgs,
	];
	const child = spawn(binary, args, {
		stdio: ["ignore", "pipe", "inherit"],
		env: { ...process.env, STREAMGATE_LOG: "warn" },
	});
	const server = await new Promise((resolve, reject) => {
		let text = "";
		const timer = setTimeout(() => reject(new Error("streamgate did not start")), 60_000);
		child.stdout.on("data", (chunk) => {
			text += chunk;
			// The banner ends with the lines for the s2 CLI.
			if (!text.includes("Point the s2 CLI")) return;
			clearTimeout(timer);
			resolve({
				endpoint: text.match(/ listening on (\S+)/)[1],
				token: ROOT_TOKEN,
				respPort: Number(text.match(/RESP:\s+\S+:(\d+)/)[1]),
			});
		});
	});
	after(() => child.kill("SIGKILL"));
	return server;
}

/// A self-signed certificate and key (PEM files) for TLS tests, made with openssl.
export function selfSignedCertificate() {
	const dir = mkdtempSync(join(tmpdir(), "streamgate-tls-"));
	const cert = join(dir, "cert.pem");
	const key = join(dir, "key.pem");
	execFileSync("openssl", [
		"req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
		"-keyout", key, "-out", cert,
	], { stdio: "ignore" });
	return { cert, key };
}
