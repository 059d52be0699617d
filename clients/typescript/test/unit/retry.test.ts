// test/unit/retry.test.ts — the retry loop against a tiny scripted HTTP server on loopback (not
// idemd: it answers what each test scripts), with an injected clock and sleep: nothing waits.
import assert from "node:assert/strict";
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { after, before, beforeEach, test } from "node:test";

import {
  AttemptTimeout, IdemClient, InProgress, KeyReused, OrderConflict, ProblemError, QuotaExceeded,
  ResponseTooLarge, RetryBudget, TransportError, UUIDV7, type ClientOptions, type IdemError,
} from "../../src/index.js";

interface Seen { method: string; url: string; headers: IncomingMessage["headers"]; body: Buffer }
type Handler = (req: Seen, res: ServerResponse, n: number) => void;

let server: Server;
let base = "";
let seen: Seen[] = [];
let script: Handler[] = [];
let fallback: Handler = (_q, res) => res.writeHead(500).end();

before(async () => {
  server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => {
      const s: Seen = { method: req.method!, url: req.url!, headers: req.headers, body: Buffer.concat(chunks) };
      seen.push(s);
      (script.shift() ?? fallback)(s, res, seen.length);
    });
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
});
after(() => { server.closeAllConnections(); server.close(); });
beforeEach(() => { seen = []; script = []; fallback = (_q, res) => res.writeHead(500).end(); });

const problem = (status: number, kind: string, headers: Record<string, string> = {}): Handler => (_q, res) => {
  res.writeHead(status, { "content-type": "application/problem+json", ...headers })
    .end(JSON.stringify({ type: `urn:idem:problem:${kind}`, title: "t", status, detail: kind }));
};
const created = (extra: Record<string, string> = {}): Handler => (_q, res) => {
  res.writeHead(201, { "content-type": "application/json", location: "/v1/payments/pay_1", ...extra })
    .end('{"id":"pay_1","merchant_order_no":"O","amount":"1.00","currency":"CNY","status":"succeeded","provider_charge_id":"ch_1","created_at":"2026-01-01T00:00:00Z"}');
};

/** A client on a fake clock: sleep() advances it and records the wait. */
function fake(options: Partial<ClientOptions> = {}) {
  const clock = { now: 1_800_000_000_000, sleeps: [] as number[] };
  const client = new IdemClient({
    baseUrl: base, apiKey: "test-key", initialBackoffMs: 100, maxBackoffMs: 1000,
    budget: RetryBudget.unlimited(), random: () => 0.5,
    now: () => clock.now,
    sleep: async (ms) => { clock.sleeps.push(ms); clock.now += ms; },
    ...options,
  });
  return { client, clock };
}

async function rejection(p: Promise<unknown>): Promise<IdemError> {
  try { await p; } catch (e) { return e as IdemError; }
  assert.fail("expected a rejection");
}

const order = { merchant_order_no: "O", amount: "1.00", currency: "CNY" };

test("one key and the same bytes on every attempt, even if the caller changes the object", async () => {
  script = [problem(503, "unavailable", { "retry-after": "1" }), problem(429, "quota-exceeded", { "retry-after": "1" }), created()];
  const body: Record<string, unknown> = { ...order, metadata: { n: 1 } };
  const { client } = fake({ sleep: async () => { (body.metadata as { n: number }).n++; body.amount = "9.99"; } });
  const r = await client.createPayment(body as never);
  assert.equal(r.status, 201);
  assert.equal(r.attempts, 3);
  assert.equal(seen.length, 3);
  const first = seen[0]!;
  assert.equal(first.body.toString(), JSON.stringify({ ...order, metadata: { n: 1 } }));
  for (const s of seen) {
    assert.deepEqual(s.body, first.body);
    assert.equal(s.headers["idempotency-key"], r.key);
    assert.equal(s.headers.authorization, "Bearer test-key");
    assert.equal(s.headers["content-type"], "application/json");
  }
  assert.match(r.key!, UUIDV7);
});

test("the caller's key, exposed and persisted before the first send", async () => {
  script = [created()];
  const { client } = fake();
  const events: string[] = [];
  const r = await client.createPayment(order, {
    key: "order-1001-attempt",
    onKey: async (k) => { await new Promise((res) => setTimeout(res, 20)); events.push(`persist ${k} after ${seen.length} sends`); },
  });
  assert.deepEqual(events, ["persist order-1001-attempt after 0 sends"]);
  assert.equal(seen[0]!.headers["idempotency-key"], "order-1001-attempt");
  assert.equal(r.key, "order-1001-attempt");
  const failing = await rejection(client.createPayment(order, { onKey: () => { throw new Error("disk full"); } }));
  assert.equal(failing.message, "disk full");
  assert.equal(seen.length, 1, "nothing sent when the key could not be persisted");
  await assert.rejects(client.createPayment(order, { key: "bad\r\nkey: x" }), TypeError);
  let persisted = 0;
  await assert.rejects(client.createPayment(order, { prefer: { wait: -1 }, onKey: () => { persisted++; } }), RangeError);
  assert.equal(persisted, 0, "a bad option is refused before the key is handed out");
  assert.equal(seen.length, 1);
});

for (const [status, kind] of [[400, "validation-failed"], [401, "unauthorized"], [402, "payment-declined"],
  [404, "not-found"], [413, "payload-too-large"], [415, "unsupported-media-type"],
  [422, "idempotency-key-reused"], [500, "internal"], [502, "upstream-failed"]] as const) {
  test(`never retries ${status} ${kind}`, async () => {
    script = [problem(status, kind, { "retry-after": "1" }), created()];
    const { client, clock } = fake();
    const e = await rejection(client.createPayment(order));
    assert.ok(e instanceof ProblemError);
    assert.equal(e.status, status);
    assert.equal(e.type, `urn:idem:problem:${kind}`);
    assert.equal(e.attempts, 1);
    assert.equal(e.stoppedBy, undefined);
    assert.equal(seen.length, 1);
    assert.deepEqual(clock.sleeps, []);
  });
}

for (const [status, kind] of [[409, "request-in-progress"], [409, "order-in-progress"], [429, "quota-exceeded"],
  [503, "provider-unavailable"], [503, "overloaded"], [504, "provider-timeout"], [504, "timeout"],
  [502, "upstream-unavailable"]] as const) {
  test(`retries ${status} ${kind} with the same key`, async () => {
    script = [problem(status, kind, kind === "request-in-progress" ? { "retry-after": "1" } : {}), created()];
    const { client } = fake();
    const r = await client.createPayment(order);
    assert.equal(r.status, 201);
    assert.equal(r.attempts, 2);
    assert.equal(seen[0]!.headers["idempotency-key"], seen[1]!.headers["idempotency-key"]);
  });
}

test("409 order-conflict is final, and a bare 409 without Retry-After too", async () => {
  script = [problem(409, "order-conflict", { "retry-after": "1" })];
  const { client } = fake();
  assert.ok((await rejection(client.createPayment(order))) instanceof OrderConflict);
  script = [(_q, res) => res.writeHead(409).end()];
  const e = await rejection(client.createPayment(order));
  assert.equal(e.attempts, 1);
  assert.equal(seen.length, 2);
});

test("waits follow full jitter and never undercut Retry-After", async () => {
  script = [problem(503, "unavailable"), problem(503, "unavailable"), problem(503, "unavailable"),
    problem(409, "request-in-progress", { "retry-after": "3" }), problem(503, "unavailable"), created()];
  const { client, clock } = fake({ random: () => 0.999999 });
  const r = await client.createPayment(order);
  assert.equal(r.attempts, 6);
  assert.deepEqual(clock.sleeps, [100, 200, 400, 3000, 1000]);
});

test("maxAttempts stops the retries and surfaces the last error", async () => {
  fallback = problem(503, "unavailable", { "retry-after": "1" });
  const { client, clock } = fake({ maxAttempts: 4 });
  const e = await rejection(client.createPayment(order));
  assert.ok(e instanceof ProblemError);
  assert.equal(e.status, 503);
  assert.equal(e.stoppedBy, "attempts");
  assert.equal(e.attempts, 4);
  assert.equal(clock.sleeps.length, 3);
  assert.equal(e.retryAfterMs, 1000);
});

test("the deadline stops the retries before a wait would pass it", async () => {
  fallback = problem(429, "quota-exceeded", { "retry-after": "4" });
  const { client, clock } = fake({ deadlineMs: 10_000 });
  const e = await rejection(client.createPayment(order));
  assert.ok(e instanceof QuotaExceeded);
  assert.equal(e.stoppedBy, "deadline");
  assert.deepEqual(clock.sleeps, [4000, 4000], "a third wait would end at 12 s");
  assert.equal(e.attempts, 3);
});

test("the budget is shared by operations: when empty, no retries; successes refill it", async () => {
  const budget = new RetryBudget({ capacity: 2, refillPerSuccess: 0.5 });
  fallback = problem(503, "unavailable");
  const { client } = fake({ budget });
  const e = await rejection(client.createPayment(order));
  assert.equal(e.stoppedBy, "budget");
  assert.equal(e.attempts, 3);
  const other = fake({ budget }).client;
  const e2 = await rejection(other.createPayment(order));
  assert.equal(e2.attempts, 1, "another client sharing the budget gets no retry");
  fallback = created();
  await other.createPayment(order);
  await other.createPayment(order);
  assert.equal(budget.tokens, 1);
  script = [problem(503, "unavailable"), problem(503, "unavailable")];
  fallback = created();
  const e3 = await rejection(client.createPayment(order));
  assert.equal(e3.attempts, 2, "one token: one retry");
});

test("transport errors are retried; the last one is surfaced", async () => {
  const { client } = fake({ baseUrl: "http://127.0.0.1:1", maxAttempts: 3 });
  const e = await rejection(client.createPayment(order));
  assert.ok(e instanceof TransportError);
  assert.equal(e.stoppedBy, "attempts");
  assert.equal(e.attempts, 3);
});

test("an attempt that gets no answer is aborted after attemptTimeoutMs and retried", async () => {
  script = [() => { /* never answers */ }, created()];
  const { client } = fake({ attemptTimeoutMs: 100 });
  const started = Date.now();
  const r = await client.createPayment(order);
  assert.equal(r.attempts, 2);
  assert.ok(Date.now() - started < 2000);
  script = [() => {}];
  fallback = () => {};
  const e = await rejection(fake({ attemptTimeoutMs: 50, maxAttempts: 2 }).client.createPayment(order));
  assert.ok(e instanceof AttemptTimeout, String(e));
});

test("a huge body is not read past maxResponseBytes (declared or streamed) and not retried", async () => {
  const { client } = fake({ maxResponseBytes: 1024 });
  script = [(_q, res) => res.writeHead(201, { "content-length": String(4 * 1024 * 1024) }).end(Buffer.alloc(4 * 1024 * 1024, 0x61))];
  const e = await rejection(client.createPayment(order));
  assert.ok(e instanceof ResponseTooLarge);
  assert.equal(e.attempts, 1);
  script = [(_q, res) => {
    res.writeHead(503, { "content-type": "application/problem+json" });
    for (let i = 0; i < 64; i++) res.write(Buffer.alloc(1024, 0x62));
    res.end();
  }];
  const e2 = await rejection(client.createPayment(order));
  assert.ok(e2 instanceof ResponseTooLarge);
  assert.equal(seen.length, 2);
});

test("malformed answers do not crash the client", async () => {
  script = [
    (_q, res) => res.writeHead(503, { "content-type": "application/problem+json", "retry-after": "garbage" }).end("{not json"),
    (_q, res) => res.writeHead(503, { "retry-after": "Mon, 99 Foo 2026" }).end("[]"),
    (_q, res) => res.writeHead(201, { "idempotency-key-expires": "yesterday-ish", "idempotent-replayed": "maybe" }).end("\u0000not json"),
  ];
  const { client } = fake();
  const r = await client.createPayment(order);
  assert.equal(r.status, 201);
  assert.equal(r.body, undefined);
  assert.equal(r.replayed, false);
  assert.equal(r.keyExpires, undefined);
  script = [(_q, res) => res.writeHead(418).end("<html>")];
  const e = await rejection(client.createPayment(order));
  assert.ok(e instanceof ProblemError);
  assert.equal(e.type, "about:blank");
  assert.equal(e.status, 418);
});

test("replay metadata: Idempotent-Replayed and Idempotency-Key-Expires", async () => {
  script = [created({ "idempotent-replayed": "true", "idempotency-key-expires": "Wed, 01 Jul 2026 00:00:00 GMT" })];
  const { client } = fake();
  const r = await client.createPayment(order);
  assert.equal(r.replayed, true);
  assert.equal(r.keyExpires?.toISOString(), "2026-07-01T00:00:00.000Z");
  assert.equal(r.location, "/v1/payments/pay_1");
  assert.equal(r.body.id, "pay_1");
  script = [problem(422, "idempotency-key-reused", { "idempotency-key-expires": "Wed, 01 Jul 2026 00:00:00 GMT" })];
  const e = await rejection(client.createPayment(order));
  assert.ok(e instanceof KeyReused);
  assert.equal(e.keyExpires?.getTime(), Date.UTC(2026, 6, 1));
});

test("Prefer: respond-async and wait; a 202 is polled at its Location, then collected without respond-async", async () => {
  const op = (state: string): Handler => (_q, res) => res.writeHead(200, { "content-type": "application/json" })
    .end(JSON.stringify({ key: "k", state }));
  script = [
    (q, res) => res.writeHead(202, { location: `/v1/operations/${q.headers["idempotency-key"] as string}`, "retry-after": "1" }).end('{"key":"k","state":"PROCESSING"}'),
    op("PROCESSING"), op("SUCCEEDED"), created({ "idempotent-replayed": "true" }),
  ];
  const { client, clock } = fake();
  const r = await client.createPayment(order, { prefer: { respondAsync: true, wait: 5 } });
  assert.equal(r.status, 201);
  assert.equal(r.attempts, 2);
  assert.deepEqual(seen.map((s) => `${s.method} ${s.url}`), [
    "POST /v1/payments", `GET /v1/operations/${r.key}`, `GET /v1/operations/${r.key}`, "POST /v1/payments"]);
  assert.equal(seen[0]!.headers.prefer, "respond-async, wait=5");
  assert.equal(seen[3]!.headers.prefer, "wait=5");
  assert.equal(seen[1]!.headers["idempotency-key"], undefined);
  assert.equal(seen[1]!.headers.authorization, "Bearer test-key");
  assert.deepEqual(seen[3]!.body, seen[0]!.body);
  assert.equal(clock.sleeps[0], 1000, "the 202's Retry-After");
});

test("a 202 whose Location leaves the client's origin is not followed", async () => {
  script = [(_q, res) => res.writeHead(202, { location: "http://evil.example/steal" }).end(), created()];
  const { client } = fake();
  const r = await client.createPayment(order, { prefer: { respondAsync: true } });
  assert.equal(r.status, 201);
  assert.deepEqual(seen.map((s) => s.method), ["POST", "POST"]);
  await assert.rejects(client.call("GET", "http://evil.example/x"), TypeError);
});

test("the caller's AbortSignal ends the operation, also during a wait", async () => {
  fallback = problem(503, "unavailable", { "retry-after": "30" });
  const ac = new AbortController();
  const client = new IdemClient({ baseUrl: base, apiKey: "k", budget: RetryBudget.unlimited() });
  setTimeout(() => ac.abort(new Error("caller gave up")), 100);
  const started = Date.now();
  await assert.rejects(client.createPayment(order, { signal: ac.signal }), /caller gave up/);
  assert.ok(Date.now() - started < 5000);
});

test("call(): any route, GETs carry no key, a string body is sent as it is", async () => {
  script = [(_q, res) => res.writeHead(200).end('{"ok":true}'), (_q, res) => res.writeHead(201).end("{}")];
  const { client } = fake({ baseUrl: `${base}/prefix` });
  const g = await client.call<{ ok: boolean }>("get", "/v1/things");
  assert.equal(g.body.ok, true);
  assert.equal(seen[0]!.url, "/prefix/v1/things");
  assert.equal(seen[0]!.headers["idempotency-key"], undefined);
  await client.call("PUT", "/gw/orders/7", '{"a":1}', { key: "gw-key-0001" });
  assert.equal(seen[1]!.body.toString(), '{"a":1}');
  assert.equal(seen[1]!.headers["idempotency-key"], "gw-key-0001");
});

test("InProgress is the class of request-in-progress", async () => {
  script = [problem(409, "request-in-progress", { "retry-after": "1" })];
  const { client } = fake({ maxAttempts: 1 });
  const e = await rejection(client.createPayment(order));
  assert.ok(e instanceof InProgress);
  assert.equal(e.stoppedBy, "attempts");
});
