// test/unit/budget.test.ts — the retry budget's token bucket.
import assert from "node:assert/strict";
import { test } from "node:test";

import { DEFAULT_RETRY_BUDGET, RetryBudget, defaultRetryBudget } from "../../src/index.js";

test("each retry takes a token; when empty, retries are refused", () => {
  const b = new RetryBudget({ capacity: 3 });
  assert.equal(b.tokens, 3);
  assert.equal(b.tryAcquire(), true);
  assert.equal(b.tryAcquire(), true);
  assert.equal(b.tryAcquire(), true);
  assert.equal(b.tryAcquire(), false);
  assert.equal(b.tokens, 0, "a refusal takes nothing");
});

test("each success refills a fraction, up to the capacity", () => {
  const b = new RetryBudget({ capacity: 2, refillPerSuccess: 0.25, initial: 0 });
  assert.equal(b.tryAcquire(), false);
  for (let i = 0; i < 3; i++) b.recordSuccess();
  assert.equal(b.tryAcquire(), false, "0.75 is less than one retry");
  b.recordSuccess();
  assert.equal(b.tryAcquire(), true);
  for (let i = 0; i < 100; i++) b.recordSuccess();
  assert.equal(b.tokens, 2);
});

test("the documented defaults", () => {
  assert.deepEqual({ ...DEFAULT_RETRY_BUDGET }, { capacity: 50, refillPerSuccess: 0.1 });
  const b = new RetryBudget();
  assert.equal(b.capacity, 50);
  assert.equal(b.refillPerSuccess, 0.1);
  assert.equal(b.tokens, 50);
  assert.ok(defaultRetryBudget instanceof RetryBudget);
});

test("bad options are refused", () => {
  assert.throws(() => new RetryBudget({ capacity: -1 }), RangeError);
  assert.throws(() => new RetryBudget({ refillPerSuccess: NaN }), RangeError);
  assert.equal(new RetryBudget({ capacity: 0 }).tryAcquire(), false);
  assert.equal(RetryBudget.unlimited().tryAcquire(), true);
});
