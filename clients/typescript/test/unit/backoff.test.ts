// test/unit/backoff.test.ts — full jitter over a capped exponential, never below Retry-After.
import assert from "node:assert/strict";
import { test } from "node:test";

import { MAX_RETRY_AFTER_MS, backoffMs, parseRetryAfter } from "../../src/index.js";

test("full jitter: uniform in [0, min(max, initial * 2^retry)]", () => {
  assert.equal(backoffMs(0, 100, 5000, () => 0), 0);
  assert.equal(backoffMs(0, 100, 5000, () => 0.999999), 100);
  assert.equal(backoffMs(1, 100, 5000, () => 0.999999), 200);
  assert.equal(backoffMs(3, 100, 5000, () => 0.999999), 800);
  assert.equal(backoffMs(3, 100, 5000, () => 0.5), 400);
  assert.equal(backoffMs(10, 100, 5000, () => 0.999999), 5000, "capped");
  assert.equal(backoffMs(1000, 100, 5000, () => 0.999999), 5000, "no overflow");
});

test("the jitter spreads over the whole range", () => {
  let seed = 7;
  const rnd = () => ((seed = (seed * 1103515245 + 12345) % 2 ** 31) / 2 ** 31);
  const waits = Array.from({ length: 2000 }, () => backoffMs(4, 100, 5000, rnd));
  assert.ok(waits.every((w) => w >= 0 && w <= 1600));
  assert.ok(Math.min(...waits) < 100 && Math.max(...waits) > 1500);
});

test("never sooner than Retry-After", () => {
  assert.equal(backoffMs(0, 100, 5000, () => 0.999, 3000), 3000);
  assert.equal(backoffMs(5, 100, 5000, () => 0.999999, 1000), 3200, "the larger of the two");
});

test("a bad random source cannot make a negative or NaN wait", () => {
  assert.equal(backoffMs(2, 100, 5000, () => NaN), 0);
  assert.equal(backoffMs(2, 100, 5000, () => -5), 0);
  assert.equal(backoffMs(2, 100, 5000, () => 7), 0);
});

test("Retry-After: delta-seconds, HTTP-date, garbage", () => {
  const now = Date.UTC(2026, 5, 1, 12, 0, 0);
  assert.equal(parseRetryAfter("1", now), 1000);
  assert.equal(parseRetryAfter(" 30 ", now), 30000);
  assert.equal(parseRetryAfter("0", now), 0);
  assert.equal(parseRetryAfter("Mon, 01 Jun 2026 12:00:05 GMT", now), 5000);
  assert.equal(parseRetryAfter("Mon, 01 Jun 2026 11:00:00 GMT", now), 0, "a past date: at once");
  assert.equal(parseRetryAfter(null, now), undefined);
  assert.equal(parseRetryAfter("", now), undefined);
  assert.equal(parseRetryAfter("soon", now), undefined);
  assert.equal(parseRetryAfter("-1", now), undefined);
  assert.equal(parseRetryAfter("1.5", now), undefined);
  assert.equal(parseRetryAfter("99999999999999999999", now), MAX_RETRY_AFTER_MS);
  assert.equal(parseRetryAfter("x".repeat(100_000), now), undefined);
});
