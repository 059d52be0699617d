// src/errors.ts — what an operation can fail with: transport errors, and problem+json answers
// (RFC 9457) mapped to one class per `type` idemd publishes (docs/idemd.md, "Problem types").

/** Why the client stopped retrying a retryable failure. */
export type StoppedBy = "attempts" | "deadline" | "budget";

/** Replay metadata of an answer (docs: Idempotent-Replayed, Idempotency-Key-Expires). */
export interface ReplayInfo {
  /** `Idempotent-Replayed: true`: the server answered with the first execution's answer. */
  replayed: boolean;
  /** Until when a retry with this key is recognised (`Idempotency-Key-Expires`), if sent. */
  keyExpires: Date | undefined;
}

/** The base of every error the client throws (besides TypeError/RangeError for bad arguments). */
export class IdemError extends Error {
  override name = "IdemError";
  /** The Idempotency-Key of the operation, if it had one. */
  key: string | undefined;
  /** Requests sent for the operation (POSTs or GETs, not operation polls). */
  attempts = 0;
  /** Set when this was a retryable failure and the client gave up: which limit stopped it. */
  stoppedBy: StoppedBy | undefined;
}

/** No HTTP answer: connection refused or reset, DNS, TLS, or the attempt timed out. Retried. */
export class TransportError extends IdemError {
  override name = "TransportError";
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
  }
}

/** The attempt got no answer within `attemptTimeoutMs` and was aborted. Retried. */
export class AttemptTimeout extends TransportError {
  override name = "AttemptTimeout";
}

/** The answer's body was larger than `maxResponseBytes`. Final: a retry would get it again. */
export class ResponseTooLarge extends IdemError {
  override name = "ResponseTooLarge";
  constructor(readonly limitBytes: number, readonly status: number) {
    super(`the answer (HTTP ${status}) is larger than ${limitBytes} bytes`);
  }
}

/** A problem detail object as received; every field may be missing in a malformed answer. */
export interface ProblemBody {
  type?: string;
  title?: string;
  status?: number;
  detail?: string;
  errors?: { field: string; message: string }[];
  [extension: string]: unknown;
}

export interface ProblemInit extends ReplayInfo {
  status: number;
  headers: Headers;
  body: ProblemBody;
  text: string;
  retryAfterMs: number | undefined;
}

/**
 * An HTTP error answer (4xx, 5xx). `type` is the problem type (`urn:idem:problem:<kind>`), or
 * "about:blank" when the body was not a problem object; `status` is the HTTP status.
 * Subclasses name each published type; an unknown type is a plain ProblemError.
 */
export class ProblemError extends IdemError {
  override name = "ProblemError";
  readonly status: number;
  readonly type: string;
  readonly title: string;
  readonly detail: string;
  /** Field errors of `validation-failed`; empty otherwise. */
  readonly errors: { field: string; message: string }[];
  readonly problem: ProblemBody;
  readonly headers: Headers;
  /** The raw body text (already capped by maxResponseBytes). */
  readonly text: string;
  readonly retryAfterMs: number | undefined;
  readonly replayed: boolean;
  readonly keyExpires: Date | undefined;

  constructor(init: ProblemInit) {
    const b = init.body;
    const type = typeof b.type === "string" && b.type !== "" ? b.type : "about:blank";
    const title = typeof b.title === "string" ? b.title : `HTTP ${init.status}`;
    const detail = typeof b.detail === "string" ? b.detail : "";
    super(`${init.status} ${type}: ${detail || title}`);
    this.status = init.status;
    this.type = type;
    this.title = title;
    this.detail = detail;
    this.errors = Array.isArray(b.errors)
      ? b.errors
          .filter((e): e is { field: string; message: string } =>
            typeof e === "object" && e !== null && typeof e.field === "string" && typeof e.message === "string")
          .map((e) => ({ field: e.field, message: e.message }))
      : [];
    this.problem = b;
    this.headers = init.headers;
    this.text = init.text;
    this.retryAfterMs = init.retryAfterMs;
    this.replayed = init.replayed;
    this.keyExpires = init.keyExpires;
  }
}

// One class per published type. The comment gives the status idemd answers it with.
/** 400: the request is not acceptable (e.g. a malformed Idempotency-Key). */
export class InvalidRequest extends ProblemError { override name = "InvalidRequest"; }
/** 400: the body is not JSON. */
export class MalformedJson extends ProblemError { override name = "MalformedJson"; }
/** 400: the body fails validation; `errors` holds the fields. */
export class ValidationFailed extends ProblemError { override name = "ValidationFailed"; }
/** 415 */
export class UnsupportedMediaType extends ProblemError { override name = "UnsupportedMediaType"; }
/** 413: the body is over the server's limit (64 KiB for payments). */
export class PayloadTooLarge extends ProblemError { override name = "PayloadTooLarge"; }
/** 431 */
export class HeadersTooLarge extends ProblemError { override name = "HeadersTooLarge"; }
/** 414 */
export class UriTooLong extends ProblemError { override name = "UriTooLong"; }
/** 400: not valid HTTP/1.1. */
export class MalformedRequest extends ProblemError { override name = "MalformedRequest"; }
/** 401: missing or unknown API key. */
export class Unauthorized extends ProblemError { override name = "Unauthorized"; }
/** 404 */
export class NotFound extends ProblemError { override name = "NotFound"; }
/** 405 */
export class MethodNotAllowed extends ProblemError { override name = "MethodNotAllowed"; }
/** 422: the key was used before with a different request. Never retried. */
export class KeyReused extends ProblemError { override name = "KeyReused"; }
/** 409 + Retry-After: the first request with this key is still running. Retried. */
export class InProgress extends ProblemError { override name = "InProgress"; }
/** 409: the merchant order was paid with another amount or currency. Final. */
export class OrderConflict extends ProblemError { override name = "OrderConflict"; }
/** 409 + Retry-After: the merchant order is being paid under another key. Retried. */
export class OrderInProgress extends ProblemError { override name = "OrderInProgress"; }
/** 429 + Retry-After: too many running or retained keys. Retried. */
export class QuotaExceeded extends ProblemError { override name = "QuotaExceeded"; }
/** 402: the provider declined; final for this key. */
export class PaymentDeclined extends ProblemError { override name = "PaymentDeclined"; }
/** 503 + Retry-After: the provider could not be reached or failed. Retried with the same key. */
export class ProviderUnavailable extends ProblemError { override name = "ProviderUnavailable"; }
/** 504: the provider timed out; retried with the same key (the server looks the charge up). */
export class ProviderTimeout extends ProblemError { override name = "ProviderTimeout"; }
/** 503 + Retry-After. Retried. */
export class Unavailable extends ProblemError { override name = "Unavailable"; }
/** 504. Retried with the same key. */
export class ServerTimeout extends ProblemError { override name = "ServerTimeout"; }
/** 503 + Retry-After. Retried. */
export class Overloaded extends ProblemError { override name = "Overloaded"; }
/** 503 + Retry-After: the instance drains. Retried. */
export class ShuttingDown extends ProblemError { override name = "ShuttingDown"; }
/** 503 + Retry-After: the store is not reachable. Retried. */
export class NotReady extends ProblemError { override name = "NotReady"; }
/** 500. Not retried. */
export class InternalError extends ProblemError { override name = "InternalError"; }
/** 502: executed, but the answer is larger than the server keeps. Final; not charged again. */
export class AnswerTooLarge extends ProblemError { override name = "AnswerTooLarge"; }
/** 502 + Retry-After (gateway): nothing was sent upstream. Retried. */
export class UpstreamUnavailable extends ProblemError { override name = "UpstreamUnavailable"; }
/** 504 (gateway): the upstream's outcome is unknown. Retried with the same key. */
export class UpstreamTimeout extends ProblemError { override name = "UpstreamTimeout"; }
/** 502 (gateway): the upstream answered a 5xx; the outcome is unknown. Final. */
export class UpstreamFailed extends ProblemError { override name = "UpstreamFailed"; }
/** 502 (gateway): final; the outcome stays unknown and nothing is forwarded again. */
export class UpstreamOutcomeUnknown extends ProblemError { override name = "UpstreamOutcomeUnknown"; }

type ProblemClass = new (init: ProblemInit) => ProblemError;

export const PROBLEM_PREFIX = "urn:idem:problem:";

/** Every published kind and its class: `urn:idem:problem:<kind>`. */
export const PROBLEM_TYPES: Readonly<Record<string, ProblemClass>> = Object.freeze({
  "invalid-request": InvalidRequest,
  "malformed-json": MalformedJson,
  "validation-failed": ValidationFailed,
  "unsupported-media-type": UnsupportedMediaType,
  "payload-too-large": PayloadTooLarge,
  "headers-too-large": HeadersTooLarge,
  "uri-too-long": UriTooLong,
  "malformed-request": MalformedRequest,
  "unauthorized": Unauthorized,
  "not-found": NotFound,
  "method-not-allowed": MethodNotAllowed,
  "idempotency-key-reused": KeyReused,
  "request-in-progress": InProgress,
  "order-conflict": OrderConflict,
  "order-in-progress": OrderInProgress,
  "quota-exceeded": QuotaExceeded,
  "payment-declined": PaymentDeclined,
  "provider-unavailable": ProviderUnavailable,
  "provider-timeout": ProviderTimeout,
  "unavailable": Unavailable,
  "timeout": ServerTimeout,
  "overloaded": Overloaded,
  "shutting-down": ShuttingDown,
  "not-ready": NotReady,
  "internal": InternalError,
  "answer-too-large": AnswerTooLarge,
  "upstream-unavailable": UpstreamUnavailable,
  "upstream-timeout": UpstreamTimeout,
  "upstream-failed": UpstreamFailed,
  "upstream-outcome-unknown": UpstreamOutcomeUnknown,
});

/** Parses `text` as a problem object; anything else (not JSON, not an object) gives {}. */
export function parseProblemBody(text: string): ProblemBody {
  if (text === "") return {};
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch {
    return {};
  }
  if (typeof value !== "object" || value === null || Array.isArray(value)) return {};
  return value as ProblemBody;
}

/** The error for an error answer: the class of its problem type, else a plain ProblemError. */
export function problemFromResponse(init: ProblemInit): ProblemError {
  const type = init.body.type;
  if (typeof type === "string" && type.startsWith(PROBLEM_PREFIX)) {
    const cls = Object.hasOwn(PROBLEM_TYPES, type.slice(PROBLEM_PREFIX.length))
      ? PROBLEM_TYPES[type.slice(PROBLEM_PREFIX.length)]
      : undefined;
    if (cls !== undefined) return new cls(init);
  }
  return new ProblemError(init);
}
