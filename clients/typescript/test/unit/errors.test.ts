// test/unit/errors.test.ts — problem+json to typed errors, and hostile bodies.
import assert from "node:assert/strict";
import { test } from "node:test";

import * as idem from "../../src/index.js";
import { PROBLEM_TYPES, ProblemError, parseProblemBody, problemFromResponse, type ProblemBody } from "../../src/index.js";

const init = (status: number, body: ProblemBody, text = JSON.stringify(body)) => ({
  status, headers: new Headers(), body, text, retryAfterMs: undefined, replayed: false, keyExpires: undefined,
});

// Every kind docs/idemd.md publishes, with the class a caller catches.
const PUBLISHED: [string, string][] = [
  ["invalid-request", "InvalidRequest"], ["malformed-json", "MalformedJson"],
  ["validation-failed", "ValidationFailed"], ["unsupported-media-type", "UnsupportedMediaType"],
  ["payload-too-large", "PayloadTooLarge"], ["headers-too-large", "HeadersTooLarge"],
  ["uri-too-long", "UriTooLong"], ["malformed-request", "MalformedRequest"],
  ["unauthorized", "Unauthorized"], ["not-found", "NotFound"], ["method-not-allowed", "MethodNotAllowed"],
  ["idempotency-key-reused", "KeyReused"], ["request-in-progress", "InProgress"],
  ["order-conflict", "OrderConflict"], ["order-in-progress", "OrderInProgress"],
  ["quota-exceeded", "QuotaExceeded"], ["payment-declined", "PaymentDeclined"],
  ["provider-unavailable", "ProviderUnavailable"], ["provider-timeout", "ProviderTimeout"],
  ["unavailable", "Unavailable"], ["timeout", "ServerTimeout"], ["overloaded", "Overloaded"],
  ["shutting-down", "ShuttingDown"], ["not-ready", "NotReady"], ["internal", "InternalError"],
  ["answer-too-large", "AnswerTooLarge"], ["upstream-unavailable", "UpstreamUnavailable"],
  ["upstream-timeout", "UpstreamTimeout"], ["upstream-failed", "UpstreamFailed"],
  ["upstream-outcome-unknown", "UpstreamOutcomeUnknown"],
];

test("every published problem type maps to its own class", () => {
  assert.equal(Object.keys(PROBLEM_TYPES).length, PUBLISHED.length);
  const classes = new Set<unknown>();
  for (const [kind, name] of PUBLISHED) {
    const cls = (idem as unknown as Record<string, unknown>)[name];
    assert.equal(typeof cls, "function", name);
    const e = problemFromResponse(init(400, { type: `urn:idem:problem:${kind}`, title: "T", detail: "D" }));
    assert.ok(e instanceof (cls as typeof ProblemError), `${kind} -> ${e.name}`);
    assert.ok(e instanceof ProblemError && e instanceof idem.IdemError && e instanceof Error);
    assert.equal(e.name, name);
    assert.equal(e.type, `urn:idem:problem:${kind}`);
    assert.equal(e.detail, "D");
    classes.add(cls);
  }
  assert.equal(classes.size, PUBLISHED.length, "no two kinds share a class");
});

test("an unknown type is a plain ProblemError with status, type, title and detail", () => {
  const e = problemFromResponse(init(418, { type: "urn:other:teapot", title: "Teapot", detail: "short and stout" }));
  assert.equal(e.constructor, ProblemError);
  assert.equal(e.status, 418);
  assert.equal(e.type, "urn:other:teapot");
  assert.equal(e.title, "Teapot");
  assert.equal(e.detail, "short and stout");
  const proto = problemFromResponse(init(400, { type: "urn:idem:problem:__proto__" }));
  assert.equal(proto.constructor, ProblemError);
  const ctor = problemFromResponse(init(400, { type: "urn:idem:problem:constructor" }));
  assert.equal(ctor.constructor, ProblemError);
});

test("the HTTP status wins over the body's; validation errors are kept, bad ones dropped", () => {
  const e = problemFromResponse(init(400, {
    type: "urn:idem:problem:validation-failed", status: 200,
    errors: [{ field: "amount", message: "must be > 0" }, { field: 3, message: null } as never, "x" as never],
  }));
  assert.equal(e.status, 400);
  assert.deepEqual(e.errors, [{ field: "amount", message: "must be > 0" }]);
});

test("malformed bodies never throw: not JSON, arrays, null, wrong field types, huge", () => {
  for (const text of ["", "not json", "[1,2]", "null", "42", "\"str\"", "{", "{\"type\":", "\u0000\uffff"]) {
    const body = parseProblemBody(text);
    const e = problemFromResponse(init(502, body, text));
    assert.equal(e.type, "about:blank", text);
    assert.equal(e.status, 502);
    assert.equal(e.title, "HTTP 502");
  }
  const odd = problemFromResponse(init(500, parseProblemBody('{"type":7,"title":{},"detail":[],"errors":"x"}')));
  assert.equal(odd.type, "about:blank");
  assert.equal(odd.title, "HTTP 500");
  assert.equal(odd.detail, "");
  assert.deepEqual(odd.errors, []);
  const deep = "[".repeat(100_000) + "]".repeat(100_000);
  assert.equal(problemFromResponse(init(500, parseProblemBody(deep), deep)).type, "about:blank");
});
