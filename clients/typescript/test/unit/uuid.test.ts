// test/unit/uuid.test.ts — operation keys are RFC 9562 UUIDv7s.
import assert from "node:assert/strict";
import { test } from "node:test";

import { IdemClient, UUIDV7, uuidv7, uuidv7Time } from "../../src/index.js";

test("a UUIDv7: version 7, variant 10, 48 bits of milliseconds first", () => {
  const now = Date.UTC(2026, 0, 2, 3, 4, 5, 678);
  const key = uuidv7(now);
  assert.match(key, UUIDV7);
  assert.equal(key.length, 36);
  assert.equal(key[14], "7");
  assert.ok("89ab".includes(key[19]!));
  assert.equal(uuidv7Time(key), now);
  assert.equal(parseInt(key.slice(0, 8) + key.slice(9, 13), 16), now);
});

test("the 74 other bits come from the random source", () => {
  const ones = (b: Uint8Array) => b.fill(0xff);
  const zeros = (b: Uint8Array) => b.fill(0);
  assert.equal(uuidv7(0, zeros), "00000000-0000-7000-8000-000000000000");
  assert.equal(uuidv7(0, ones), "00000000-0000-7fff-bfff-ffffffffffff");
  assert.equal(uuidv7(0xffffffffffff, zeros).slice(0, 13), "ffffffff-ffff");
  const a = uuidv7(1000);
  const b = uuidv7(1000);
  assert.notEqual(a, b, "crypto.getRandomValues by default");
});

test("keys sort by time", () => {
  const keys = [3, 1, 2].map((t) => uuidv7(t * 1000));
  assert.deepEqual([...keys].sort(), [keys[1], keys[2], keys[0]]);
});

test("the client's keys use its injected clock and random bytes", () => {
  let calls = 0;
  const c = new IdemClient({
    baseUrl: "http://127.0.0.1:1", apiKey: "k", now: () => 1_700_000_000_123,
    randomBytes: (b) => { calls++; b.fill(0x11); },
  });
  const key = c.newKey();
  assert.equal(uuidv7Time(key), 1_700_000_000_123);
  assert.equal(key.slice(14), "7111-9111-111111111111");
  assert.equal(calls, 1);
  assert.equal(uuidv7Time("not-a-uuid"), undefined);
});
