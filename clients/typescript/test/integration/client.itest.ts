// test/integration/client.itest.ts — the client against real idemd and provider-sim processes:
// the scenarios of tests/integration/client_itest.cc, and a restart that resumes a persisted key.

import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { describe, test, type TestContext } from "node:test";

import {
  IdemClient, InProgress, KeyReused, NotFound, PayloadTooLarge, PaymentDeclined, ProviderUnavailable,
  RetryBudget, TransportError, Unauthorized, ValidationFailed, UUIDV7,
  type ClientOptions, type IdemError,
} from "../../src/index.js";
import { ALICE, PACKAGE_DIR, Stack, body, requireBinaries } from "./fixture.js";

/** What each request of a client saw: "<METHOD> <path> <status>" or "<METHOD> <path> <error name>". */
interface Recorder {
  sleeps: number[];
  log: string[];
}

function makeClient(stack: Stack, rec: Recorder, options: Partial<ClientOptions> = {}): IdemClient {
  const spy: typeof fetch = async (input, init) => {
    const u = new URL(input instanceof Request ? input.url : String(input));
    const line = `${init?.method ?? "GET"} ${u.pathname}`;
    try {
      const r = await fetch(input, init);
      rec.log.push(`${line} ${r.status}`);
      return r;
    } catch (e) {
      rec.log.push(`${line} ${(e as Error).name}`);
      throw e;
    }
  };
  return new IdemClient({
    baseUrl: stack.url,
    apiKey: ALICE,
    initialBackoffMs: 20,
    maxBackoffMs: 200,
    budget: new RetryBudget({ capacity: 100 }),
    fetch: spy,
    // Waits are recorded as asked for, and slept for at most 200 ms.
    sleep: (ms) => {
      rec.sleeps.push(ms);
      return new Promise((r) => setTimeout(r, Math.min(ms, 200)));
    },
    ...options,
  });
}

async function withStack(t: TestContext, options: Parameters<typeof Stack.start>[0] = {}): Promise<Stack> {
  const stack = await Stack.start(options);
  t.after(() => stack.stop());  // also when the test fails
  return stack;
}

async function rejection(p: Promise<unknown>): Promise<IdemError> {
  try {
    await p;
  } catch (e) {
    return e as IdemError;
  }
  assert.fail("expected the call to fail");
}

describe("idemd scenarios", { concurrency: false }, () => {
  test("the binaries are there (IDEM_BIN)", () => {
    requireBinaries();
  });

  test("a timed-out attempt is retried with the same key and gets the one payment", async (t) => {
    const stack = await withStack(t, { providerTimeoutMs: 3000 });
    const rec: Recorder = { sleeps: [], log: [] };
    const c = makeClient(stack, rec, { attemptTimeoutMs: 400 });
    await stack.fault({ fault: "slow", delay_ms: 1200, times: 1 });
    const r = await c.createPayment(body("ORD-T1"));
    assert.equal(r.status, 201, r.text);
    assert.equal(rec.log[0], "POST /v1/payments TimeoutError", rec.log.join("\n"));
    assert.ok(r.attempts >= 2);
    assert.equal(r.replayed, true, "the retry got the first execution's answer");
    assert.equal(r.body.merchant_order_no, "ORD-T1");
    assert.equal(await stack.totalCharges(), 1);
    assert.equal(await stack.chargesFor(r.body.id), 1);
    assert.ok(r.keyExpires instanceof Date && r.keyExpires.getTime() > Date.now());
  });

  test("a 504 from idemd is retried with the same key: the charge is looked up, not repeated", async (t) => {
    const stack = await withStack(t, { providerTimeoutMs: 1000 });
    const rec: Recorder = { sleeps: [], log: [] };
    const c = makeClient(stack, rec);
    await stack.fault({ fault: "slow", delay_ms: 1500, times: 1 });
    const r = await c.createPayment(body("ORD-T2"));
    assert.equal(r.status, 201, r.text);
    assert.equal(rec.log[0], "POST /v1/payments 504", rec.log.join("\n"));
    assert.equal(await stack.totalCharges(), 1);
    assert.equal(await stack.chargesFor(r.body.id), 1);
  });

  test("a 503 that charged nothing is retried with one key, honouring Retry-After", async (t) => {
    const stack = await withStack(t, { extraProvider: "nothing_charged_statuses = [503]" });
    const rec: Recorder = { sleeps: [], log: [] };
    const c = makeClient(stack, rec);
    await stack.fault({ fault: "error", times: 2 });
    const r = await c.createPayment(body("ORD-C1"));
    assert.equal(r.status, 201);
    assert.equal(r.attempts, 3);
    assert.equal(await stack.totalCharges(), 1);
    assert.equal(rec.sleeps.length, 2);
    for (const s of rec.sleeps) assert.ok(s >= 1000, `slept ${s} ms before Retry-After: 1`);
    const op = await c.getOperation(r.key!);
    assert.equal(op.body.state, "SUCCEEDED");
  });

  test("a concurrent duplicate: two sends with one key make one payment and one charge", async (t) => {
    const stack = await withStack(t);
    const rec: Recorder = { sleeps: [], log: [] };
    const c = makeClient(stack, rec);
    await stack.fault({ fault: "slow", delay_ms: 600, times: 1 });
    const key = c.newKey();
    const first = c.createPayment(body("ORD-C3"), { key });
    await new Promise((r) => setTimeout(r, 150));
    const second = c.createPayment(body("ORD-C3"), { key });
    const [a, b] = await Promise.all([first, second]);
    assert.equal(a.status, 201);
    assert.equal(b.status, 201);
    assert.equal(a.body.id, b.body.id);
    assert.equal(a.replayed, false);
    assert.equal(b.replayed, true);
    assert.ok(b.attempts >= 2, "the second met the running first (409) and retried");
    assert.ok(rec.log.includes("POST /v1/payments 409"), rec.log.join("\n"));
    assert.equal(a.text, b.text, "byte-identical bodies");
    assert.equal(await stack.totalCharges(), 1);
  });

  test("Prefer: wait=N lets the server wait for the running duplicate", async (t) => {
    const stack = await withStack(t);
    const rec: Recorder = { sleeps: [], log: [] };
    const c = makeClient(stack, rec);
    await stack.fault({ fault: "slow", delay_ms: 600, times: 1 });
    const key = c.newKey();
    const first = c.createPayment(body("ORD-W1"), { key });
    await new Promise((r) => setTimeout(r, 150));
    const second = await c.createPayment(body("ORD-W1"), { key, prefer: { wait: 5 } });
    assert.equal(second.status, 201);
    assert.equal(second.attempts, 1);
    assert.equal(second.replayed, true);
    assert.equal((await first).body.id, second.body.id);
    assert.equal(await stack.totalCharges(), 1);
  });

  test("a mismatch (same key, another body) is KeyReused and not retried", async (t) => {
    const stack = await withStack(t);
    const rec: Recorder = { sleeps: [], log: [] };
    const c = makeClient(stack, rec);
    const key = c.newKey();
    await c.createPayment(body("ORD-M1"), { key });
    const e = await rejection(c.createPayment(body("ORD-M2"), { key }));
    assert.ok(e instanceof KeyReused, String(e));
    assert.equal(e.status, 422);
    assert.equal(e.type, "urn:idem:problem:idempotency-key-reused");
    assert.equal(e.attempts, 1);
    assert.equal(e.key, key);
    assert.equal(e.stoppedBy, undefined);
    assert.deepEqual(rec.sleeps, []);
    assert.equal(await stack.totalCharges(), 1);
  });

  test("final answers are never retried: 400, 401, 402, 404, 413", async (t) => {
    const stack = await withStack(t);
    const rec: Recorder = { sleeps: [], log: [] };
    const c = makeClient(stack, rec);
    const invalid = await rejection(c.createPayment(body("bad order!")));
    assert.ok(invalid instanceof ValidationFailed, String(invalid));
    assert.equal(invalid.status, 400);
    assert.ok(invalid.errors.some((f) => f.field === "merchant_order_no"), JSON.stringify(invalid.errors));
    assert.equal(invalid.attempts, 1);

    await stack.fault({ fault: "decline", times: 1 });
    const declined = await rejection(c.createPayment(body("ORD-C2")));
    assert.ok(declined instanceof PaymentDeclined, String(declined));
    assert.equal(declined.attempts, 1);

    const big = await rejection(c.createPayment({ ...body("ORD-BIG"), description: "x".repeat(70 * 1024) }));
    assert.ok(big instanceof PayloadTooLarge, String(big));
    assert.equal(big.attempts, 1);

    const missing = await rejection(c.getPayment("pay_0000"));
    assert.ok(missing instanceof NotFound, String(missing));
    assert.equal(missing.attempts, 1);

    const stranger = new IdemClient({ baseUrl: stack.url, apiKey: "not-a-key-of-anyone", sleep: async (ms) => { rec.sleeps.push(ms); } });
    const unauthorized = await rejection(stranger.createPayment(body("ORD-C2b")));
    assert.ok(unauthorized instanceof Unauthorized, String(unauthorized));
    assert.equal(unauthorized.attempts, 1);

    assert.deepEqual(rec.sleeps, []);
    assert.equal(rec.log.filter((l) => l.startsWith("POST")).length, 3, rec.log.join("\n"));
    assert.equal(await stack.totalCharges(), 0);
  });

  test("a 202 is followed to the operation and to the final answer", async (t) => {
    const stack = await withStack(t);
    const rec: Recorder = { sleeps: [], log: [] };
    const c = makeClient(stack, rec);
    await stack.fault({ fault: "slow", delay_ms: 300, times: 1 });
    const r = await c.createPayment(body("ORD-C4"), { prefer: { respondAsync: true } });
    assert.equal(r.status, 201, r.text);
    assert.equal(r.body.merchant_order_no, "ORD-C4");
    assert.equal(rec.log[0], "POST /v1/payments 202");
    assert.ok(rec.log.includes(`GET /v1/operations/${r.key} 200`), rec.log.join("\n"));
    assert.equal(rec.log.at(-1), "POST /v1/payments 201");
    assert.equal(await stack.totalCharges(), 1);
    const got = await c.getPayment(r.body.id);
    assert.deepEqual(got.body, r.body);

    const accepted = await c.createPayment(body("ORD-C4b"), { prefer: { respondAsync: true }, follow202: false });
    assert.equal(accepted.status, 202);
    assert.equal(accepted.location, `/v1/operations/${accepted.key}`);
  });

  test("an outage (idemd stopped): the retry budget stops the retries", async (t) => {
    const stack = await withStack(t);
    const rec: Recorder = { sleeps: [], log: [] };
    const budget = new RetryBudget({ capacity: 3, refillPerSuccess: 0.1 });
    const c = makeClient(stack, rec, { budget, maxAttempts: 10 });
    await stack.killIdemd();
    const e = await rejection(c.createPayment(body("ORD-C5")));
    assert.ok(e instanceof TransportError, String(e));
    assert.equal(e.stoppedBy, "budget");
    assert.equal(e.attempts, 4, "one attempt and the budget's three retries");
    assert.equal(rec.sleeps.length, 3);
    // The budget is shared: the next operation gets no retry at all.
    const again = await rejection(c.createPayment(body("ORD-C6")));
    assert.equal(again.attempts, 1);
    assert.equal(again.stoppedBy, "budget");
  });

  test("an outage (provider 503): the retry budget stops the retries", async (t) => {
    const stack = await withStack(t, { extraProvider: "nothing_charged_statuses = [503]" });
    const rec: Recorder = { sleeps: [], log: [] };
    const c = makeClient(stack, rec, { budget: new RetryBudget({ capacity: 2 }), maxAttempts: 10 });
    await stack.fault({ fault: "error" });  // until cleared
    const e = await rejection(c.createPayment(body("ORD-C7")));
    assert.ok(e instanceof ProviderUnavailable, String(e));
    assert.equal(e.status, 503);
    assert.equal(e.stoppedBy, "budget");
    assert.equal(e.attempts, 3);
    assert.equal(rec.log.filter((l) => l === "POST /v1/payments 503").length, 3, rec.log.join("\n"));
    assert.equal(await stack.totalCharges(), 0);
  });

  test("a restarted process resumes the persisted key and gets the same payment", async (t) => {
    const stack = await withStack(t, { providerTimeoutMs: 4000 });
    const keyFile = join(stack.dir, "operation.key");
    const example = join(PACKAGE_DIR, "build/examples/resume.js");
    const run = () => {
      const child = spawn(process.execPath, [example, keyFile, "ORD-R1", "100.00", "CNY"], {
        env: { ...process.env, IDEM_URL: stack.url, IDEM_API_KEY: ALICE }, stdio: ["ignore", "pipe", "pipe"],
      });
      let out = "";
      child.stdout.on("data", (d: Buffer) => { out += d.toString(); });
      child.stderr.on("data", (d: Buffer) => { out += d.toString(); });
      const done = new Promise<{ code: number | null; out: string }>((res) =>
        child.once("exit", (code) => res({ code, out })));
      t.after(() => { if (child.exitCode === null && child.signalCode === null) process.kill(child.pid!, "SIGKILL"); });
      return { child, done };
    };
    await stack.fault({ fault: "slow", delay_ms: 2500, times: 1 });
    const first = run();
    // Wait until the charge has left for the provider, then kill the process mid-operation.
    for (let i = 0; (await stack.totalCharges()) === 0; i++) {
      assert.ok(i < 100, "the first process never reached the provider");
      await new Promise((r) => setTimeout(r, 50));
    }
    assert.ok(existsSync(keyFile), "the key was persisted before the first send");
    const key = readFileSync(keyFile, "utf8").trim();
    assert.match(key, UUIDV7);
    process.kill(first.child.pid!, "SIGKILL");
    const killed = await first.done;
    assert.equal(killed.code, null, `the first process was killed mid-operation: ${killed.out}`);

    const second = await run().done;
    assert.equal(second.code, 0, second.out);
    const result = JSON.parse(second.out.trim().split("\n").at(-1)!) as { key: string; payment: { id: string }; resumed: boolean };
    assert.equal(result.key, key);
    assert.equal(result.resumed, true);
    assert.equal(await stack.totalCharges(), 1);
    assert.equal(await stack.chargesFor(result.payment.id), 1);
  });

  test("typed reads: getPayment, getOperation, getPaymentEvents", async (t) => {
    const stack = await withStack(t);
    const rec: Recorder = { sleeps: [], log: [] };
    const c = makeClient(stack, rec);
    const r = await c.createPayment(body("ORD-E1", "12.5", "EUR"));
    assert.equal(r.body.amount, "12.50");
    assert.equal(r.location, `/v1/payments/${r.body.id}`);
    const p = await c.getPayment(r.body.id);
    assert.equal(p.body.status, "succeeded");
    assert.equal(p.key, undefined);
    const op = await c.getOperation(r.key!);
    assert.equal(op.body.key, r.key);
    assert.equal(op.body.status_code, 201);
    const ev = await c.getPaymentEvents(r.body.id);
    assert.equal(ev.body.payment, r.body.id);
    assert.equal(ev.body.events[0]?.type, "payment.succeeded");
    const generic = await c.call<{ id: string }>("GET", `/v1/payments/${r.body.id}`);
    assert.equal(generic.body.id, r.body.id);
    // InProgress is exported for callers that handle it themselves (the client retries it).
    assert.equal(new InProgress({ status: 409, headers: new Headers(), body: {}, text: "", retryAfterMs: 1000, replayed: false, keyExpires: undefined }).status, 409);
  });
});
