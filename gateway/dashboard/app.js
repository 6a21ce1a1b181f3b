// streamgate dashboard: a client of the S2 REST API on this server's own origin,
// with the access token the user gives it, and nothing privileged behind it: what it
// can show and do is what that token's scope allows. Everything a server sends is
// shown as text (textContent), never parsed as HTML.

const TOKEN_KEY = "streamgate-dashboard-token";
const state = { token: null, server: null, live: null, carried: null };

// ---------- small helpers ----------

/// An element with attributes (`on*` are listeners) and children (strings are text).
function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs ?? {})) {
    if (value === undefined || value === null || value === false) continue;
    if (name.startsWith("on")) el.addEventListener(name.slice(2), value);
    else if (name === "class") el.className = value;
    // Through the CSSOM: the page's Content-Security-Policy refuses style attributes.
    else if (name === "style") el.style.cssText = value;
    else if (value === true) el.setAttribute(name, "");
    else el.setAttribute(name, String(value));
  }
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

/// A labelled control: the label names the control alone (its `id`), so screen readers
/// and tests find it by that name.
function field(label, control) {
  return h("div", { class: "field" }, h("label", { for: control.id }, label), control);
}

function show(...children) {
  replace(document.getElementById("view"), ...children);
}

/// `el`'s children replaced by those given (absent ones skipped).
function replace(el, ...children) {
  el.replaceChildren(...children.flat().filter((c) => c !== null && c !== undefined && c !== false));
}

function notice(message, kind = "error") {
  const el = document.getElementById("notice");
  el.className = kind === "info" ? "info" : "";
  el.textContent = message ?? "";
}

const enc = new TextEncoder();
const dec = new TextDecoder("utf-8", { fatal: false });

function b64(bytes) {
  let text = "";
  for (let i = 0; i < bytes.length; i += 0x8000) {
    text += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  }
  return btoa(text);
}

function unb64(text) {
  const raw = atob(text ?? "");
  const bytes = new Uint8Array(raw.length);
  for (let i = 0; i < raw.length; i++) bytes[i] = raw.charCodeAt(i);
  return bytes;
}

function hex(bytes) {
  return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join(" ");
}

/// Bytes as the user chose to see them: text (invalid UTF-8 shown as �), base64 or hex.
function render(bytes, view) {
  if (view === "hex") return hex(bytes);
  if (view === "base64") return b64(bytes);
  return dec.decode(bytes);
}

function when(ms) {
  return new Date(ms).toISOString().replace("T", " ").replace(/\.\d+Z$/, "Z");
}

function formatBytes(n) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) {
    n /= 1024;
    i++;
  }
  return `${n.toFixed(i === 0 ? 0 : 1)} ${units[i]}`;
}

// ---------- the API ----------

class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

/// One call of the REST API with the user's token. `basin` goes in `s2-basin`.
async function api(method, path, { basin, body, headers = {}, signal } = {}) {
  const init = {
    method,
    headers: { authorization: `Bearer ${state.token}`, ...headers },
    signal,
  };
  if (basin) init.headers["s2-basin"] = basin;
  if (body !== undefined) {
    init.headers["content-type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  let response;
  try {
    response = await fetch(path, init);
  } catch (error) {
    if (error.name === "AbortError") throw error;
    throw new ApiError(0, "unreachable", `The server did not answer (${error.message}).`);
  }
  const text = await response.text();
  let json = null;
  try {
    json = text ? JSON.parse(text) : null;
  } catch {
    json = null;
  }
  if (!response.ok) {
    const code = json?.code ?? (json?.tail ? "range_not_satisfiable" : String(response.status));
    const message =
      json?.message ??
      (json?.seq_num_mismatch !== undefined
        ? `Append condition failed: the next sequence number is ${json.seq_num_mismatch}.`
        : json?.fencing_token_mismatch !== undefined
          ? `Append condition failed: the fencing token is "${json.fencing_token_mismatch}".`
          : json?.tail
            ? `Nothing to read there: the tail is at ${json.tail.seq_num}.`
            : `${response.status} ${response.statusText}`);
    const error = new ApiError(response.status, code, message);
    error.body = json;
    throw error;
  }
  return json;
}

/// Shows what went wrong; a token the server does not take sends the user to sign in.
function failed(error) {
  if (error?.name === "AbortError") return;
  if (error instanceof ApiError && error.status === 401) {
    signOut(`This access token was not accepted (${error.message}). Enter another one.`);
    return;
  }
  if (error instanceof ApiError && error.status === 403) {
    notice(`This token's scope does not allow that: ${error.message}`);
    return;
  }
  notice(error?.message ?? String(error));
}

function path(...segments) {
  return segments.map((s) => encodeURIComponent(s)).join("/");
}

// ---------- the token ----------

function takeToken() {
  // A link `…/dashboard#token=…` hands the token over; the fragment never reaches the
  // server. It is kept for this tab only, and taken out of the address bar at once.
  const match = location.hash.match(/^#token=(.+)$/);
  if (match) {
    sessionStorage.setItem(TOKEN_KEY, decodeURIComponent(match[1]));
    history.replaceState(null, "", `${location.pathname}#/basins`);
  }
  state.token = sessionStorage.getItem(TOKEN_KEY);
}

function signOut(message) {
  sessionStorage.removeItem(TOKEN_KEY);
  state.token = null;
  stopLive();
  // Shown by the next `route`, which the change of page runs.
  state.carried = message ?? null;
  if (location.hash === "#/login") route();
  else location.hash = "#/login";
}

function loginView() {
  document.getElementById("nav").hidden = true;
  const input = h("input", {
    id: "token",
    type: "password",
    autocomplete: "off",
    required: true,
    size: 48,
  });
  const form = h(
    "form",
    {
      class: "row",
      onsubmit: async (event) => {
        event.preventDefault();
        state.token = input.value.trim();
        try {
          await api("GET", "/v1/basins?limit=1");
          sessionStorage.setItem(TOKEN_KEY, state.token);
          notice("");
          location.hash = "#/basins";
        } catch (error) {
          state.token = null;
          if (error instanceof ApiError && (error.status === 401 || error.status === 429)) {
            notice(`That token was not accepted: ${error.message}`);
          } else if (error instanceof ApiError && error.status === 403) {
            // A token that may not list basins is still a valid token.
            sessionStorage.setItem(TOKEN_KEY, input.value.trim());
            state.token = input.value.trim();
            location.hash = "#/basins";
          } else failed(error);
        }
      },
    },
    field("Access token", input),
    h("button", { type: "submit" }, "Sign in"),
  );
  show(
    h("h1", {}, "Sign in"),
    h(
      "p",
      {},
      "Enter an access token. The server prints a ready link with the root token when it starts; ",
      "tokens issued for people or services work too, and the dashboard shows what their scope allows.",
    ),
    form,
  );
  input.focus();
}

// ---------- basins ----------

async function basinsView() {
  const filter = h("input", { id: "filter", placeholder: "prefix", size: 24 });
  const list = h("div", {}, h("p", { class: "muted" }, "Loading…"));
  const load = async () => {
    try {
      const page = await api("GET", `/v1/basins?prefix=${encodeURIComponent(filter.value)}&limit=1000`);
      replace(list, 
        page.basins.length === 0
          ? h("p", { class: "muted" }, "No basins here yet.")
          : h(
              "table",
              {},
              h("thead", {}, h("tr", {}, h("th", {}, "Name"), h("th", {}, "Created"), h("th", {}, "State"))),
              h(
                "tbody",
                {},
                page.basins.map((b) =>
                  h(
                    "tr",
                    {},
                    h("td", {}, h("a", { href: `#/basins/${path(b.name)}` }, b.name)),
                    h("td", {}, b.created_at),
                    h("td", {}, b.state ?? (b.deleted_at ? "deleting" : "active")),
                  ),
                ),
              ),
            ),
        page.has_more ? h("p", { class: "muted" }, "More basins match: narrow the filter.") : null,
      );
    } catch (error) {
      replace(list, );
      failed(error);
    }
  };
  const name = h("input", { id: "basin-name", required: true, minlength: 8, maxlength: 48, size: 28 });
  const onAppend = h("input", { type: "checkbox", id: "create-on-append" });
  const cipher = h(
    "select",
    { id: "stream-cipher" },
    h("option", { value: "" }, "none"),
    h("option", { value: "aegis-256" }, "aegis-256"),
    h("option", { value: "aes-256-gcm" }, "aes-256-gcm"),
  );
  const create = h(
    "form",
    {
      class: "row",
      onsubmit: async (event) => {
        event.preventDefault();
        const config = { create_stream_on_append: onAppend.checked };
        if (cipher.value) config.stream_cipher = cipher.value;
        try {
          await api("POST", "/v1/basins", { body: { basin: name.value.trim(), config } });
          notice(`Basin ${name.value.trim()} created.`, "info");
          name.value = "";
          await load();
        } catch (error) {
          failed(error);
        }
      },
    },
    field("Name (8-48 lowercase letters, digits, hyphens)", name),
    field("Stream encryption", cipher),
    h("label", { class: "check" }, onAppend, "Create streams on append"),
    h("button", { type: "submit" }, "Create basin"),
  );
  filter.addEventListener("input", () => load());
  show(
    h("h1", {}, "Basins"),
    h("section", { class: "panel", "aria-label": "Create basin" }, h("h2", {}, "Create basin"), create),
    h("div", { class: "row" }, field("Filter", filter)),
    list,
  );
  await load();
}

async function basinView(basin) {
  const list = h("div", {}, h("p", { class: "muted" }, "Loading…"));
  const config = h("div", { class: "muted" });
  const load = async () => {
    try {
      const page = await api("GET", "/v1/streams?limit=1000", { basin });
      replace(list, 
        page.streams.length === 0
          ? h("p", { class: "muted" }, "No streams in this basin yet.")
          : h(
              "table",
              { "aria-label": "Streams" },
              h("thead", {}, h("tr", {}, h("th", {}, "Stream"), h("th", {}, "Created"), h("th", {}, "Encryption"))),
              h(
                "tbody",
                {},
                page.streams.map((s) =>
                  h(
                    "tr",
                    {},
                    h("td", {}, h("a", { href: `#/basins/${path(basin)}/streams/${path(s.name)}` }, s.name)),
                    h("td", {}, s.created_at),
                    h("td", {}, s.cipher ?? "none"),
                  ),
                ),
              ),
            ),
      );
    } catch (error) {
      replace(list, );
      failed(error);
    }
    try {
      const c = await api("GET", `/v1/basins/${path(basin)}`);
      replace(config, 
        `Creates streams on append: ${c.create_stream_on_append ? "yes" : "no"} · on read: ${
          c.create_stream_on_read ? "yes" : "no"
        } · encryption of new streams: ${c.stream_cipher ?? "none"}`,
      );
    } catch {
      replace(config, );
    }
  };
  const name = h("input", { id: "stream-name", required: true, size: 32 });
  const create = h(
    "form",
    {
      class: "row",
      onsubmit: async (event) => {
        event.preventDefault();
        try {
          await api("POST", "/v1/streams", { basin, body: { stream: name.value.trim() } });
          notice(`Stream ${name.value.trim()} created.`, "info");
          name.value = "";
          await load();
        } catch (error) {
          failed(error);
        }
      },
    },
    field("Name", name),
    h("button", { type: "submit" }, "Create stream"),
  );
  const usage = h("div");
  show(
    h("div", { class: "crumbs" }, h("a", { href: "#/basins" }, "Basins"), " / ", basin),
    h("h1", {}, basin),
    config,
    h("section", { class: "panel", "aria-label": "Create stream" }, h("h2", {}, "Create stream"), create),
    h("h2", {}, "Streams"),
    list,
    h("h2", {}, "Usage"),
    usage,
  );
  await load();
  usageCharts(usage, { basin });
}

// ---------- Studio: one stream ----------

/// Whether a record (as the API returns it, base64) is a command record.
function isCommand(record) {
  return record.headers?.length === 1 && record.headers[0][0] === "";
}

function commandText(record) {
  const op = dec.decode(unb64(record.headers[0][1]));
  const body = unb64(record.body);
  if (op === "trim" && body.length === 8) {
    return `trim to ${new DataView(body.buffer).getBigUint64(0)}`;
  }
  if (op === "fence") return `fence "${dec.decode(body)}"`;
  return op;
}

function studioView(basin, stream) {
  stopLive();
  const encode = (name) => encodeURIComponent(name);
  const recordsUrl = `/v1/streams/${encode(stream)}/records`;
  const key = h("input", { id: "encryption-key", type: "password", autocomplete: "off", size: 46 });
  const keyHeaders = () => (key.value.trim() ? { "s2-encryption-key": key.value.trim() } : {});
  const tail = h("span", { class: "muted" }, "…");
  const refreshTail = async () => {
    try {
      const t = await api("GET", `${recordsUrl}/tail`, { basin });
      tail.textContent = `tail: ${t.tail.seq_num} (last record at ${t.tail.timestamp ? when(t.tail.timestamp) : "—"})`;
      return t.tail;
    } catch (error) {
      failed(error);
      return null;
    }
  };

  // Reading.
  const from = h(
    "select",
    { id: "read-from" },
    h("option", { value: "tail_offset" }, "tail offset"),
    h("option", { value: "seq_num" }, "sequence number"),
    h("option", { value: "timestamp" }, "timestamp (ms)"),
  );
  const at = h("input", { id: "read-at", type: "number", min: 0, value: 10, size: 12 });
  const limit = h("input", { id: "read-limit", type: "number", min: 1, max: 1000, value: 100, size: 6 });
  const wait = h("input", { id: "read-wait", type: "number", min: 0, max: 60, value: 0, size: 4 });
  const clamp = h("input", { type: "checkbox", id: "read-clamp", checked: true });
  const ignoreCommands = h("input", { type: "checkbox", id: "ignore-commands" });
  const view = h(
    "select",
    { id: "body-view" },
    h("option", { value: "text" }, "text"),
    h("option", { value: "base64" }, "base64"),
    h("option", { value: "hex" }, "hex"),
  );
  const rate = h("span", { class: "rate", "aria-live": "polite" });
  const rows = h("tbody");
  const records = [];
  const draw = () => {
    const shown = ignoreCommands.checked ? records.filter((r) => !isCommand(r)) : records;
    replace(rows, 
      ...shown.slice(-1000).map((r) =>
        h(
          "tr",
          {},
          h("td", { class: "num" }, r.seq_num),
          h("td", { class: "num" }, when(r.timestamp)),
          h(
            "td",
            {},
            isCommand(r)
              ? h("span", { class: "tag command" }, "command")
              : (r.headers ?? []).map(([n, v]) =>
                  h("span", { class: "tag" }, `${render(unb64(n), "text")}: ${render(unb64(v), view.value)}`),
                ),
          ),
          h("td", { class: "body" }, isCommand(r) ? commandText(r) : render(unb64(r.body), view.value)),
        ),
      ),
    );
  };
  ignoreCommands.addEventListener("change", draw);
  view.addEventListener("change", draw);
  const query = () => {
    const q = new URLSearchParams();
    q.set(from.value, String(Math.max(0, Number(at.value) || 0)));
    q.set("count", String(Math.min(1000, Math.max(1, Number(limit.value) || 100))));
    if (clamp.checked) q.set("clamp", "true");
    return q;
  };
  const readOnce = async () => {
    stopLive();
    const q = query();
    q.set("wait", String(Math.min(60, Math.max(0, Number(wait.value) || 0))));
    try {
      const batch = await api("GET", `${recordsUrl}?${q}`, {
        basin,
        headers: { "s2-format": "base64", ...keyHeaders() },
      });
      records.length = 0;
      records.push(...batch.records);
      draw();
      const hidden = ignoreCommands.checked ? batch.records.filter(isCommand).length : 0;
      rate.textContent = `${batch.records.length} records${hidden ? ` (${hidden} command records hidden)` : ""}`;
      notice("");
    } catch (error) {
      if (error instanceof ApiError && error.code === "range_not_satisfiable") {
        records.length = 0;
        draw();
        rate.textContent = "0 records";
        notice(error.message, "info");
      } else failed(error);
    }
    refreshTail();
  };
  const streamButton = h("button", { type: "button", class: "secondary", id: "stream-live" }, "Stream");
  const startLive = async () => {
    stopLive();
    const controller = new AbortController();
    const q = query();
    q.delete("count");
    records.length = 0;
    draw();
    const live = { controller, count: 0, started: performance.now() };
    state.live = live;
    streamButton.textContent = "Stop";
    const tick = setInterval(() => {
      const secs = (performance.now() - live.started) / 1000;
      rate.textContent = `live: ${live.count} records, ${(live.count / Math.max(secs, 1)).toFixed(1)} records/s`;
    }, 500);
    live.tick = tick;
    try {
      // SSE over fetch (EventSource cannot send the token): one request that follows.
      const response = await fetch(`${recordsUrl}?${q}`, {
        headers: {
          authorization: `Bearer ${state.token}`,
          "s2-basin": basin,
          "s2-format": "base64",
          accept: "text/event-stream",
          ...keyHeaders(),
        },
        signal: controller.signal,
      });
      if (!response.ok) {
        const body = await response.json().catch(() => ({}));
        throw new ApiError(response.status, body.code, body.message ?? response.statusText);
      }
      const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
      let buffer = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += value;
        let end;
        while ((end = buffer.indexOf("\n\n")) >= 0) {
          const event = buffer.slice(0, end);
          buffer = buffer.slice(end + 2);
          const kind = event.match(/^event: ?(.*)$/m)?.[1];
          const data = event
            .split("\n")
            .filter((l) => l.startsWith("data:"))
            .map((l) => l.slice(5).trimStart())
            .join("\n");
          if (kind === "batch") {
            const batch = JSON.parse(data);
            if (batch.tail) tail.textContent = `tail: ${batch.tail.seq_num} (last record at ${when(batch.tail.timestamp)})`;
            records.push(...batch.records);
            if (records.length > 5000) records.splice(0, records.length - 5000);
            live.count += batch.records.length;
            draw();
          } else if (kind === "error") {
            const body = JSON.parse(data || "{}");
            throw new ApiError(400, body.code, body.message ?? "the read session ended with an error");
          }
        }
      }
    } catch (error) {
      failed(error);
    } finally {
      if (state.live === live) stopLive();
    }
  };
  streamButton.addEventListener("click", () => (state.live ? stopLive() : startLive()));

  // Appending.
  const mode = h(
    "select",
    { id: "append-mode" },
    h("option", { value: "single" }, "one record (the whole text)"),
    h("option", { value: "lines" }, "one record per line"),
    h("option", { value: "json" }, "JSON array"),
    h("option", { value: "file" }, "load a file (one record)"),
  );
  const text = h("textarea", { id: "append-text", "aria-label": "Records to append" });
  const file = h("input", { type: "file", id: "append-file", hidden: true });
  mode.addEventListener("change", () => {
    file.hidden = mode.value !== "file";
    text.hidden = mode.value === "file";
  });
  const matchSeq = h("input", { id: "match-seq-num", type: "number", min: 0, size: 8 });
  const fencing = h("input", { id: "fencing-token", maxlength: 36, size: 16 });
  const result = h("p", { class: "muted", "aria-live": "polite" });
  const toRecord = (item) => {
    if (typeof item === "string") return { body: b64(enc.encode(item)) };
    if (item && typeof item === "object") {
      const body = typeof item.body === "string" ? item.body : JSON.stringify(item.body ?? "");
      const headers = (item.headers ?? []).map(([n, v]) => [b64(enc.encode(String(n))), b64(enc.encode(String(v)))]);
      return { body: b64(enc.encode(body)), headers };
    }
    return { body: b64(enc.encode(JSON.stringify(item))) };
  };
  const appendRecords = async (recordsToSend) => {
    const body = { records: recordsToSend };
    if (matchSeq.value !== "") body.match_seq_num = Number(matchSeq.value);
    if (fencing.value !== "") body.fencing_token = fencing.value;
    const ack = await api("POST", recordsUrl, {
      basin,
      body,
      headers: { "s2-format": "base64", ...keyHeaders() },
    });
    result.textContent = `Appended ${ack.start.seq_num}..${ack.end.seq_num}; tail ${ack.tail.seq_num}.`;
    refreshTail();
    return ack;
  };
  const append = h(
    "form",
    {
      onsubmit: async (event) => {
        event.preventDefault();
        try {
          let items;
          if (mode.value === "file") {
            const chosen = file.files?.[0];
            if (!chosen) throw new Error("Choose a file to append.");
            items = [{ body: b64(new Uint8Array(await chosen.arrayBuffer())) }];
          } else if (mode.value === "lines") {
            items = text.value.split("\n").filter((l) => l.length > 0).map(toRecord);
          } else if (mode.value === "json") {
            let parsed;
            try {
              parsed = JSON.parse(text.value);
            } catch (error) {
              throw new Error(`That is not JSON: ${error.message}`);
            }
            if (!Array.isArray(parsed)) throw new Error("Give a JSON array: one element per record.");
            items = parsed.map(toRecord);
          } else {
            items = [toRecord(text.value)];
          }
          if (items.length === 0) throw new Error("Nothing to append.");
          await appendRecords(items);
          notice("");
        } catch (error) {
          failed(error);
        }
      },
    },
    h("div", { class: "row" }, field("Records", mode)),
    text,
    file,
    h(
      "div",
      { class: "row" },
      field("Match sequence number", matchSeq),
      field("Fencing token", fencing),
      h("button", { type: "submit" }, "Append"),
    ),
    result,
  );

  // Trim and fence: command records.
  const trimTo = h("input", { id: "trim-to", type: "number", min: 0, size: 10 });
  const fenceWith = h("input", { id: "fence-token", maxlength: 36, size: 16 });
  const command = async (op, body) => {
    try {
      await appendRecords([{ headers: [["", b64(enc.encode(op))]], body: b64(body) }]);
      notice(`${op === "trim" ? "Trim" : "Fence"} appended.`, "info");
    } catch (error) {
      failed(error);
    }
  };
  const trim = h(
    "form",
    {
      class: "row",
      onsubmit: (event) => {
        event.preventDefault();
        const bytes = new Uint8Array(8);
        new DataView(bytes.buffer).setBigUint64(0, BigInt(Math.max(0, Number(trimTo.value) || 0)));
        command("trim", bytes);
      },
    },
    field("Trim records before sequence number", trimTo),
    h("button", { type: "submit", class: "danger" }, "Trim"),
  );
  const fence = h(
    "form",
    {
      class: "row",
      onsubmit: (event) => {
        event.preventDefault();
        command("fence", enc.encode(fenceWith.value));
      },
    },
    field("New fencing token (empty clears it)", fenceWith),
    h("button", { type: "submit", class: "danger" }, "Fence"),
  );

  const usage = h("div");
  show(
    h(
      "div",
      { class: "crumbs" },
      h("a", { href: "#/basins" }, "Basins"),
      " / ",
      h("a", { href: `#/basins/${path(basin)}` }, basin),
      " / ",
      stream,
    ),
    h("h1", {}, `Studio: ${stream}`),
    h("p", {}, tail),
    h(
      "div",
      { class: "row" },
      field("Encryption key (base64, for encrypted streams only; kept in this page only)", key),
    ),
    h(
      "section",
      { class: "panel", "aria-label": "Read" },
      h("h2", {}, "Read"),
      h(
        "div",
        { class: "row" },
        field("From", from),
        field("Value", at),
        field("Limit (records)", limit),
        field("Wait (s)", wait),
        h("label", { class: "check" }, clamp, "Clamp to the tail"),
        h("label", { class: "check" }, ignoreCommands, "Ignore command records"),
        field("Show bodies as", view),
      ),
      h(
        "div",
        { class: "row" },
        h("button", { type: "button", id: "read-once", onclick: readOnce }, "Read once"),
        streamButton,
        rate,
      ),
      h(
        "table",
        { "aria-label": "Records read" },
        h("thead", {}, h("tr", {}, h("th", {}, "Seq"), h("th", {}, "Timestamp"), h("th", {}, "Headers"), h("th", {}, "Body"))),
        rows,
      ),
    ),
    h("section", { class: "panel", "aria-label": "Append" }, h("h2", {}, "Append"), append),
    h("section", { class: "panel", "aria-label": "Trim and fence" }, h("h2", {}, "Trim and fence"), trim, fence),
    h("h2", {}, "Usage"),
    usage,
  );
  refreshTail();
  usageCharts(usage, { basin, stream });
}

function stopLive() {
  const live = state.live;
  if (!live) return;
  state.live = null;
  clearInterval(live.tick);
  live.controller.abort();
  const button = document.getElementById("stream-live");
  if (button) button.textContent = "Stream";
}

// ---------- usage charts ----------

const PERIODS = [
  { label: "Last hour", secs: 3600, interval: "minute" },
  { label: "Last day", secs: 86400, interval: "hour" },
  { label: "Last 7 days", secs: 7 * 86400, interval: "hour" },
  { label: "Last 30 days", secs: 30 * 86400, interval: "day" },
];
const COLOURS = ["#0b5cad", "#b3541e", "#1e6b34", "#7a3e9d", "#8a6d00", "#a4161a"];

const INTERVAL_SECS = { minute: 60, hour: 3600, day: 86400 };

function svgEl(tag, attrs) {
  const el = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, v);
  return el;
}

/// A chart of a metric set's series as SVG: accumulations as stacked bars (one per
/// bucket with data), gauges as a step line (a reading holds until the next).
function chart(title, unit, metrics, range) {
  const width = 360;
  const height = 160;
  const pad = { left: 8, right: 8, top: 16, bottom: 22 };
  const series = metrics.filter((m) => m.values);
  const gauge = series.length > 0 && !series[0].interval;
  const span = Math.max(1, range.end - range.start);
  const x = (t) => pad.left + ((Math.min(Math.max(t, range.start), range.end) - range.start) / span) * (width - pad.left - pad.right);
  const stacks = new Map();
  if (!gauge) {
    for (const s of series) for (const [t, v] of s.values) stacks.set(t, (stacks.get(t) ?? 0) + v);
  }
  const peak = gauge ? Math.max(0, ...series.flatMap((s) => s.values.map((p) => p[1]))) : Math.max(0, ...stacks.values());
  const scale = Math.max(1, peak);
  const y = (v) => height - pad.bottom - (v / scale) * (height - pad.top - pad.bottom);
  const fmt = (v) => (unit === "bytes" ? formatBytes(v) : `${v}`);
  const svg = svgEl("svg", { viewBox: `0 0 ${width} ${height}`, role: "img" });
  svg.setAttribute("aria-label", `${title}: peak ${fmt(peak)}`);
  svg.append(svgEl("line", { x1: pad.left, x2: width - pad.right, y1: y(0), y2: y(0), stroke: "#8a94a0" }));
  if (gauge) {
    series.forEach((s, i) => {
      const points = [];
      s.values.forEach(([t, v], k) => {
        if (k > 0) points.push(`${x(t).toFixed(1)},${y(s.values[k - 1][1]).toFixed(1)}`);
        points.push(`${x(t).toFixed(1)},${y(v).toFixed(1)}`);
      });
      // The last reading holds until now.
      const last = s.values.at(-1);
      if (last) points.push(`${x(range.end).toFixed(1)},${y(last[1]).toFixed(1)}`);
      svg.append(svgEl("polyline", { points: points.join(" "), fill: "none", stroke: COLOURS[i % COLOURS.length], "stroke-width": 2 }));
    });
  } else {
    const secs = INTERVAL_SECS[series[0]?.interval] ?? 60;
    const barWidth = Math.max(2, (secs / span) * (width - pad.left - pad.right) - 1);
    const base = new Map();
    series.forEach((s, i) => {
      for (const [t, v] of s.values) {
        const below = base.get(t) ?? 0;
        base.set(t, below + v);
        svg.append(
          svgEl("rect", {
            x: x(t).toFixed(1),
            y: y(below + v).toFixed(1),
            width: barWidth.toFixed(1),
            height: Math.max(1, y(below) - y(below + v)).toFixed(1),
            fill: COLOURS[i % COLOURS.length],
          }),
        );
      }
    });
  }
  const text = (content, attrs) => {
    const t = svgEl("text", { "font-size": 10, fill: "#4a5360", ...attrs });
    t.textContent = content;
    svg.append(t);
  };
  text(when(range.start * 1000).slice(5, 16), { x: pad.left, y: height - 6, "text-anchor": "start" });
  text(when(range.end * 1000).slice(5, 16), { x: width - pad.right, y: height - 6, "text-anchor": "end" });
  text(`peak ${fmt(peak)}`, { x: pad.left + 2, y: 11 });
  const total = series.reduce((sum, s) => sum + s.values.reduce((a, p) => a + p[1], 0), 0);
  const last = series[0]?.values.at(-1)?.[1] ?? 0;
  return h(
    "figure",
    { class: "chart" },
    h("figcaption", {}, title),
    svg,
    h(
      "div",
      { class: "legend" },
      peak === 0 ? h("span", { style: "color:#8a94a0" }, "no data in this period") : series.map((s, i) => h("span", { style: `color:${COLOURS[i % COLOURS.length]}` }, s.name)),
      peak === 0 ? null : h("span", { class: "muted", style: "color:inherit" }, gauge ? `now ${fmt(last)}` : `total ${fmt(total)}`),
    ),
  );
}

/// Usage charts of a basin, or of one stream, over a period the user picks.
function usageCharts(container, { basin, stream }) {
  const period = h(
    "select",
    { id: "usage-period", "aria-label": "Period" },
    PERIODS.map((p, i) => h("option", { value: i }, p.label)),
  );
  const grid = h("div", { class: "charts" });
  const draw = async () => {
    const p = PERIODS[Number(period.value)];
    const end = Math.floor(Date.now() / 1000);
    const range = { start: end - p.secs, end };
    const sets = stream
      ? [["storage", "Stored bytes", null]]
      : [
          ["append-throughput", "Append throughput", p.interval],
          ["read-throughput", "Read throughput", p.interval],
          ["storage", "Stored bytes", null],
          ["append-ops", "Append operations", p.interval],
          ["read-ops", "Read operations", p.interval],
          ["basin-ops", "Basin operations", p.interval],
        ];
    const base = stream ? `/v1/metrics/${path(basin)}/${path(stream)}` : `/v1/metrics/${path(basin)}`;
    const figures = await Promise.all(
      sets.map(async ([set, title, interval]) => {
        const q = new URLSearchParams({ set, start: range.start, end: range.end });
        if (interval) q.set("interval", interval);
        try {
          const answer = await api("GET", `${base}?${q}`);
          const metrics = answer.values.map((m) => Object.values(m)[0]);
          const unit = metrics[0]?.unit ?? (set.includes("ops") ? "operations" : "bytes");
          return chart(title, unit, metrics, range);
        } catch (error) {
          return h("figure", { class: "chart" }, h("figcaption", {}, title), h("p", { class: "muted" }, error.message));
        }
      }),
    );
    replace(grid, ...figures);
  };
  period.addEventListener("change", draw);
  replace(container, h("div", { class: "row" }, field("Period", period)), grid);
  draw();
}

async function usageView() {
  const basins = h("div");
  const grid = h("div", { class: "charts" });
  const end = Math.floor(Date.now() / 1000);
  const range = { start: end - 86400, end };
  try {
    const q = new URLSearchParams({ set: "account-ops", start: range.start, end: range.end, interval: "hour" });
    const ops = await api("GET", `/v1/metrics?${q}`);
    replace(grid, chart("Account operations, last day", "operations", ops.values.map((m) => Object.values(m)[0]), range));
    const active = await api("GET", `/v1/metrics?${new URLSearchParams({ set: "active-basins", start: range.start, end: range.end })}`);
    const names = active.values[0]?.label?.values ?? [];
    replace(basins, 
      h("p", {}, `Basins with streams in the last day: ${names.length}`),
      h("ul", {}, names.map((n) => h("li", {}, h("a", { href: `#/basins/${path(n)}` }, n)))),
    );
  } catch (error) {
    failed(error);
  }
  show(h("h1", {}, "Usage"), grid, h("h2", {}, "Active basins"), basins, h("p", { class: "muted" }, "Open a basin or a stream for its own charts."));
}

// ---------- access tokens ----------

const OPS = [
  "list-basins", "create-basin", "delete-basin", "reconfigure-basin", "get-basin-config",
  "issue-access-token", "revoke-access-token", "list-access-tokens", "list-streams",
  "create-stream", "delete-stream", "get-stream-config", "reconfigure-stream", "check-tail",
  "append", "read", "trim", "fence", "account-metrics", "basin-metrics", "stream-metrics",
];

function matcherField(id, label) {
  const kind = h(
    "select",
    { id: `${id}-kind` },
    h("option", { value: "prefix" }, "prefix"),
    h("option", { value: "exact" }, "exact"),
    h("option", { value: "none" }, "none"),
  );
  const value = h("input", { id: `${id}-value`, size: 18, placeholder: "empty prefix: all" });
  const fieldset = h("fieldset", {}, h("legend", {}, label), h("div", { class: "row" }, kind, value));
  return {
    fieldset,
    read: () => (kind.value === "none" ? { exact: "" } : { [kind.value]: value.value }),
  };
}

/// A token's scope in words: what it matches and what it may do.
function describeScope(token) {
  const set = (matcher) => {
    if (!matcher) return "none";
    if ("exact" in matcher) return matcher.exact === "" ? "none" : `"${matcher.exact}"`;
    return matcher.prefix === "" ? "all" : `"${matcher.prefix}…"`;
  };
  const scope = token.scope ?? {};
  const groups = Object.entries(scope.op_groups ?? {}).flatMap(([level, rw]) =>
    ["read", "write"].filter((p) => rw?.[p]).map((p) => `${level} ${p}`),
  );
  const can = [...groups, ...(scope.ops ?? [])];
  return [
    `basins ${set(scope.basins)} · streams ${set(scope.streams)} · tokens ${set(scope.access_tokens)}`,
    `may: ${can.length ? can.join(", ") : "nothing"}${token.auto_prefix_streams ? " · auto-prefixed streams" : ""}`,
  ].join("\n");
}

async function tokensView() {
  const list = h("div", {}, h("p", { class: "muted" }, "Loading…"));
  const load = async () => {
    try {
      const page = await api("GET", "/v1/access-tokens?limit=1000");
      if (page.access_tokens.length === 0) {
        replace(list, h("p", { class: "muted" }, "No access tokens this token may see."));
        return;
      }
      replace(list, 
        h(
          "table",
          { "aria-label": "Access tokens" },
          h("thead", {}, h("tr", {}, h("th", {}, "ID"), h("th", {}, "Expires"), h("th", {}, "Scope"), h("th", {}, ""))),
          h(
            "tbody",
            {},
            page.access_tokens.map((t) =>
              h(
                "tr",
                {},
                h("td", {}, t.id),
                h("td", {}, t.expires_at ?? "—"),
                h("td", { class: "scope" }, describeScope(t)),
                h(
                  "td",
                  {},
                  h(
                    "button",
                    {
                      type: "button",
                      class: "danger",
                      "aria-label": `Revoke ${t.id}`,
                      onclick: async () => {
                        if (!confirm(`Revoke access token ${t.id}? Clients using it lose access within seconds.`)) return;
                        try {
                          await api("DELETE", `/v1/access-tokens/${encodeURIComponent(t.id)}`);
                          notice(`Access token ${t.id} revoked.`, "info");
                          await load();
                        } catch (error) {
                          failed(error);
                        }
                      },
                    },
                    "Revoke",
                  ),
                ),
              ),
            ),
          ),
        ),
      );
    } catch (error) {
      replace(list, );
      failed(error);
    }
  };
  const id = h("input", { id: "token-id", required: true, maxlength: 96, size: 24 });
  const basins = matcherField("basins", "Basins");
  const streams = matcherField("streams", "Streams");
  const tokens = matcherField("access-tokens", "Access tokens");
  const groups = ["account", "basin", "stream"].flatMap((level) =>
    ["read", "write"].map((rw) => ({
      level,
      rw,
      box: h("input", { type: "checkbox", id: `group-${level}-${rw}` }),
    })),
  );
  const ops = OPS.map((op) => ({ op, box: h("input", { type: "checkbox", id: `op-${op}` }) }));
  const expires = h("input", { id: "token-expires", type: "number", min: 1, size: 6, placeholder: "days" });
  const autoPrefix = h("input", { type: "checkbox", id: "auto-prefix" });
  const secret = h("div", { "aria-live": "polite" });
  const issue = h(
    "form",
    {
      onsubmit: async (event) => {
        event.preventDefault();
        const op_groups = {};
        for (const { level, rw, box } of groups) {
          if (!box.checked) continue;
          op_groups[level] = { ...(op_groups[level] ?? {}), [rw]: true };
        }
        const scope = {
          basins: basins.read(),
          streams: streams.read(),
          access_tokens: tokens.read(),
          op_groups,
          ops: ops.filter((o) => o.box.checked).map((o) => o.op),
        };
        const body = { id: id.value.trim(), scope, auto_prefix_streams: autoPrefix.checked };
        if (expires.value) body.expires_at = new Date(Date.now() + Number(expires.value) * 86400000).toISOString();
        try {
          const issued = await api("POST", "/v1/access-tokens", { body });
          replace(secret, 
            h("p", {}, `Access token ${body.id} issued. Its secret is shown this once:`),
            h("div", { class: "secret", id: "issued-secret" }, issued.access_token),
            h(
              "button",
              { type: "button", class: "secondary", onclick: () => navigator.clipboard?.writeText(issued.access_token) },
              "Copy",
            ),
          );
          notice("");
          await load();
        } catch (error) {
          failed(error);
        }
      },
    },
    h("div", { class: "row" }, field("ID", id), field("Expires in (days; default: with your token)", expires)),
    h("div", { class: "row" }, basins.fieldset, streams.fieldset, tokens.fieldset),
    h(
      "fieldset",
      {},
      h("legend", {}, "Operation groups"),
      h("div", { class: "grid-ops" }, groups.map(({ level, rw, box }) => h("label", { class: "check" }, box, `${level} ${rw}`))),
    ),
    h(
      "fieldset",
      {},
      h("legend", {}, "Operations"),
      h("div", { class: "grid-ops" }, ops.map(({ op, box }) => h("label", { class: "check" }, box, op))),
    ),
    h("label", { class: "check" }, autoPrefix, "Auto-prefix stream names with the streams prefix"),
    h("div", { class: "row" }, h("button", { type: "submit" }, "Issue token")),
    secret,
  );
  show(
    h("h1", {}, "Access tokens"),
    h(
      "section",
      { class: "panel", "aria-label": "Issue token" },
      h("h2", {}, "Issue token"),
      h("p", { class: "muted" }, "A token can only issue tokens as narrow as itself or narrower; the server refuses anything broader."),
      issue,
    ),
    list,
  );
  await load();
}

// ---------- connecting ----------

async function connectView() {
  const origin = location.origin;
  const select = h("select", { id: "connect-basin" }, h("option", { value: "" }, "(choose a basin)"));
  const out = h("div");
  try {
    const page = await api("GET", "/v1/basins?limit=1000");
    for (const b of page.basins) select.append(h("option", { value: b.name }, b.name));
  } catch (error) {
    failed(error);
  }
  const draw = () => {
    const basin = select.value || "<basin>";
    const resp = state.server?.resp;
    const respHost = resp ? new URL(resp.replace(/^rediss?:/, "http:")) : null;
    replace(out, 
      h("h2", {}, "s2 CLI and SDKs"),
      h(
        "pre",
        { class: "snippet" },
        `export S2_ACCOUNT_ENDPOINT=${origin}\nexport S2_BASIN_ENDPOINT=${origin}\nexport S2_ACCESS_TOKEN=<your token>\ns2 list-streams s2://${basin}`,
      ),
      h("h2", {}, "Redis clients"),
      resp
        ? h(
            "pre",
            { class: "snippet" },
            `redis-cli -h ${respHost.hostname} -p ${respHost.port}${resp.startsWith("rediss") ? " --tls" : ""} --user ${basin} --pass <your token> XRANGE <stream> - +`,
          )
        : h("p", { class: "muted" }, "The RESP listener is off on this server."),
      h("h2", {}, "OpenTelemetry Collector"),
      h(
        "pre",
        { class: "snippet" },
        `exporters:\n  otlphttp:\n    endpoint: ${origin}/otlp\n    encoding: proto\n    headers:\n      s2-basin: ${basin}\n      Authorization: Bearer <your token>\n    sending_queue:\n      num_consumers: 1`,
      ),
      h("p", { class: "muted" }, "Each resource goes to the stream its s2.stream attribute names."),
    );
  };
  select.addEventListener("change", draw);
  show(h("h1", {}, "Connect"), h("div", { class: "row" }, field("Basin", select)), out);
  draw();
}

// ---------- the cluster ----------

async function clusterView() {
  try {
    const response = await fetch("/cluster");
    const view = await response.json();
    show(
      h("h1", {}, "Cluster"),
      h("p", {}, `This node: ${view.node.advertise_url} (epoch ${view.node.epoch}), serving ${view.node.streams_served} streams.`),
      h(
        "table",
        { "aria-label": "Nodes" },
        h(
          "thead",
          {},
          h("tr", {}, ["Epoch", "Address", "Heartbeat age", "Live", "Leaving", "Streams owned"].map((t) => h("th", {}, t))),
        ),
        h(
          "tbody",
          {},
          view.nodes.map((n) =>
            h(
              "tr",
              {},
              h("td", { class: "num" }, n.epoch),
              h("td", {}, n.advertise_url),
              h("td", { class: "num" }, `${(n.heartbeat_age_ms / 1000).toFixed(1)} s`),
              h("td", {}, n.live ? (n.ready ? "yes" : "starting") : "no"),
              h("td", {}, n.leaving ? "yes" : "no"),
              h("td", { class: "num" }, n.streams_owned),
            ),
          ),
        ),
      ),
    );
  } catch (error) {
    failed(error);
  }
}

// ---------- routing ----------

async function route() {
  takeToken();
  notice(state.carried ?? "");
  state.carried = null;
  if (!state.token) {
    if (location.hash !== "#/login") history.replaceState(null, "", "#/login");
    loginView();
    return;
  }
  document.getElementById("nav").hidden = false;
  const parts = location.hash.replace(/^#\/?/, "").split("/").map(decodeURIComponent);
  for (const link of document.querySelectorAll("nav a")) {
    link.toggleAttribute("aria-current", link.getAttribute("href") === `#/${parts[0]}`);
    if (link.hasAttribute("aria-current")) link.setAttribute("aria-current", "page");
  }
  if (parts[0] !== "basins" || parts[2] !== "streams") stopLive();
  try {
    switch (parts[0]) {
      case "basins":
        if (parts[1] && parts[2] === "streams" && parts[3]) studioView(parts[1], parts.slice(3).join("/"));
        else if (parts[1]) await basinView(parts[1]);
        else await basinsView();
        break;
      case "tokens":
        await tokensView();
        break;
      case "usage":
        await usageView();
        break;
      case "connect":
        await connectView();
        break;
      case "cluster":
        await clusterView();
        break;
      default:
        location.hash = "#/basins";
        return;
    }
  } catch (error) {
    failed(error);
  }
  document.getElementById("view").focus();
}

async function start() {
  takeToken();
  document.getElementById("sign-out").addEventListener("click", () => signOut("Signed out."));
  try {
    state.server = await (await fetch("/dashboard/server.json")).json();
  } catch {
    state.server = null;
  }
  window.addEventListener("hashchange", route);
  await route();
}

start();
