// src/client.ts — the retrying idemd client: one Idempotency-Key per operation, the same bytes on
// every attempt, retries with back-off under a deadline and a shared retry budget, 202 polling.

import { backoffMs, parseRetryAfter } from "./backoff.js";
import { RetryBudget, defaultRetryBudget } from "./budget.js";
import {
  AttemptTimeout,
  IdemError,
  ProblemError,
  ReplayInfo,
  ResponseTooLarge,
  StoppedBy,
  TransportError,
  parseProblemBody,
  problemFromResponse,
} from "./errors.js";
import { RandomBytes, systemRandomBytes, uuidv7 } from "./uuid.js";

/** Sleeps `ms` milliseconds; rejects with `signal.reason` if the signal aborts first. */
export type Sleep = (ms: number, signal?: AbortSignal) => Promise<void>;

export interface ClientOptions {
  /** `http://127.0.0.1:8080` or `https://…`, optionally with a base path. */
  baseUrl: string;
  /** Sent as `Authorization: Bearer <apiKey>`. */
  apiKey: string;
  /** Requests per operation, first included. Default 10. */
  maxAttempts?: number;
  /** Back-off base and cap (full jitter over min(max, initial * 2^retry)). Defaults 100 / 5000 ms. */
  initialBackoffMs?: number;
  maxBackoffMs?: number;
  /** No retry starts once the next one would begin this long after the first attempt. Default 60 s. */
  deadlineMs?: number;
  /** Each attempt is aborted after this long (AbortController). Default 10 s. */
  attemptTimeoutMs?: number;
  /** The largest answer body read; a larger one fails with ResponseTooLarge. Default 1 MiB. */
  maxResponseBytes?: number;
  /** The retry budget; default the process-wide `defaultRetryBudget`. */
  budget?: RetryBudget;
  /** Injected for tests: sleeping, the clock (ms since the epoch), jitter in [0, 1), key bytes. */
  sleep?: Sleep;
  now?: () => number;
  random?: () => number;
  randomBytes?: RandomBytes;
  /** Injected for tests or proxies; default the global fetch. */
  fetch?: typeof globalThis.fetch;
}

export interface Prefer {
  /** `Prefer: wait=N`: the server waits up to N seconds (capped by its configuration) for a
   * running duplicate instead of answering 409 at once. */
  wait?: number;
  /** `Prefer: respond-async`: the server answers 202 + Location at once and goes on. */
  respondAsync?: boolean;
}

export interface CallOptions {
  /** The operation's Idempotency-Key; default a new UUIDv7. Ignored for GET and HEAD. */
  key?: string;
  /** Called with the key before the first request is sent, and awaited: persist it here so a
   * restarted process resumes the same operation. If it throws, nothing is sent. */
  onKey?: (key: string) => void | Promise<void>;
  prefer?: Prefer;
  /** After a 202, poll the operation and return the final answer (default true); false returns
   * the 202 itself. */
  follow202?: boolean;
  /** Extra request headers (Authorization, Idempotency-Key and Content-Type are the client's). */
  headers?: Record<string, string>;
  /** Aborts the whole operation (attempts and waits); the promise rejects with its reason. */
  signal?: AbortSignal;
  /** Overrides the client's deadline for this operation. */
  deadlineMs?: number;
}

/** A successful (2xx) answer. */
export interface IdemResponse<T = unknown> extends ReplayInfo {
  status: number;
  headers: Headers;
  /** The body parsed as JSON, or undefined if it is empty or not JSON. */
  body: T;
  /** The body as received. */
  bytes: Uint8Array;
  text: string;
  /** The Location header, if any. */
  location: string | undefined;
  /** The Idempotency-Key sent on every attempt (undefined for GET). */
  key: string | undefined;
  /** Requests sent (polls of an operation not counted). */
  attempts: number;
}

export interface PaymentRequest {
  merchant_order_no: string;
  /** A decimal string ("100.00") or a number. */
  amount: string | number;
  currency: string;
  description?: string;
  metadata?: Record<string, unknown>;
  trace_id?: string;
}

export interface Payment {
  id: string;
  merchant_order_no: string;
  amount: string;
  currency: string;
  status: "pending" | "succeeded" | "declined" | "abandoned";
  provider_charge_id: string | null;
  created_at: string;
  refunded_duplicates?: { charge: string; refund: string; amount: string }[];
}

export interface Operation {
  key: string;
  state: "PROCESSING" | "SUCCEEDED" | "FAILED_FINAL" | "FAILED_RETRYABLE";
  recovery_point: string;
  status_code: number | null;
  response?: unknown;
  created_at: string;
  expires_at: string;
}

export interface PaymentEvent {
  id: string;
  payment: string;
  type: "payment.succeeded" | "payment.failed" | "payment.refunded";
  sequence: number;
  created_at: string;
  published_at: string | null;
  publications: number;
  payload: Record<string, unknown>;
}

export interface PaymentEvents {
  payment: string;
  events: PaymentEvent[];
  replayed?: number;
}

const DEFAULTS = {
  maxAttempts: 10,
  initialBackoffMs: 100,
  maxBackoffMs: 5000,
  deadlineMs: 60_000,
  attemptTimeoutMs: 10_000,
  maxResponseBytes: 1 << 20,
} as const;

const KEY_CHARS = /^[\x21-\x7e]{1,1024}$/; // visible ASCII: nothing that could split a header

export const realSleep: Sleep = (ms, signal) =>
  new Promise<void>((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, Math.max(0, ms));
    const onAbort = () => {
      clearTimeout(timer);
      reject(signal?.reason);
    };
    signal?.addEventListener("abort", onAbort, { once: true });
  });

/** One received answer, its body read under the size cap. */
interface Answer {
  status: number;
  headers: Headers;
  bytes: Uint8Array;
  text: string;
}

type Attempt = { answer: Answer } | { error: IdemError };

/**
 * Whether an error answer may be retried with the same key: 409 while the first request runs
 * (Retry-After, or an in-progress type), 429, 503, 504, and 502 `upstream-unavailable`
 * (nothing was sent). Never 400, 401, 402, 404, 405, 413, 415, 422, 500 or other 502s.
 */
export function isRetryableAnswer(status: number, problemType: string | undefined, hasRetryAfter: boolean): boolean {
  if (status === 409) {
    if (problemType === "urn:idem:problem:order-conflict") return false;
    return hasRetryAfter || problemType === "urn:idem:problem:request-in-progress" ||
      problemType === "urn:idem:problem:order-in-progress";
  }
  if (status === 502) return problemType === "urn:idem:problem:upstream-unavailable";
  return status === 429 || status === 503 || status === 504;
}

/**
 * A client of one idemd (or any API behind idem). Safe to share: it holds no per-operation state.
 * Methods that answer 2xx resolve with an IdemResponse; error answers reject with a ProblemError
 * subclass; no answer at all rejects with a TransportError.
 */
export class IdemClient {
  readonly #base: URL;
  readonly #apiKey: string;
  readonly #o: {
    maxAttempts: number;
    initialBackoffMs: number;
    maxBackoffMs: number;
    deadlineMs: number;
    attemptTimeoutMs: number;
    maxResponseBytes: number;
  };
  readonly budget: RetryBudget;
  readonly #sleep: Sleep;
  readonly #now: () => number;
  readonly #random: () => number;
  readonly #randomBytes: RandomBytes;
  readonly #fetch: typeof globalThis.fetch;

  constructor(options: ClientOptions) {
    let base: URL;
    try {
      base = new URL(options.baseUrl);
    } catch {
      throw new TypeError(`baseUrl is not a URL: ${options.baseUrl}`);
    }
    if (base.protocol !== "http:" && base.protocol !== "https:") {
      throw new TypeError("baseUrl must be http: or https:");
    }
    if (!base.pathname.endsWith("/")) base.pathname += "/";
    this.#base = base;
    if (typeof options.apiKey !== "string" || !/^[\x21-\x7e]+$/.test(options.apiKey)) {
      throw new TypeError("apiKey must be a non-empty token");
    }
    this.#apiKey = options.apiKey;
    const num = (name: keyof typeof DEFAULTS, min: number): number => {
      const v = options[name] ?? DEFAULTS[name];
      if (typeof v !== "number" || !Number.isFinite(v) || v < min) {
        throw new RangeError(`${name} must be a number >= ${min}`);
      }
      return v;
    };
    this.#o = {
      maxAttempts: num("maxAttempts", 1),
      initialBackoffMs: num("initialBackoffMs", 0),
      maxBackoffMs: num("maxBackoffMs", 0),
      deadlineMs: num("deadlineMs", 0),
      attemptTimeoutMs: num("attemptTimeoutMs", 1),
      maxResponseBytes: num("maxResponseBytes", 0),
    };
    this.budget = options.budget ?? defaultRetryBudget;
    this.#sleep = options.sleep ?? realSleep;
    this.#now = options.now ?? Date.now;
    this.#random = options.random ?? Math.random;
    this.#randomBytes = options.randomBytes ?? systemRandomBytes;
    this.#fetch = options.fetch ?? globalThis.fetch.bind(globalThis);
  }

  /** A new operation key (UUIDv7). Generate it, persist it, then pass it as `key`. */
  newKey(): string {
    return uuidv7(this.#now(), this.#randomBytes);
  }

  /** POST /v1/payments as one operation. */
  createPayment(request: PaymentRequest | Uint8Array | string, options: CallOptions = {}): Promise<IdemResponse<Payment>> {
    return this.call<Payment>("POST", "/v1/payments", request, options);
  }

  /** GET /v1/payments/{id}. NotFound for an unknown payment or another tenant's. */
  getPayment(id: string, options: Omit<CallOptions, "key" | "onKey" | "prefer"> = {}): Promise<IdemResponse<Payment>> {
    return this.call<Payment>("GET", `/v1/payments/${encodeURIComponent(id)}`, undefined, options);
  }

  /** GET /v1/operations/{key}: the caller's own record for `key` on the payments route. */
  getOperation(key: string, options: Omit<CallOptions, "key" | "onKey" | "prefer"> = {}): Promise<IdemResponse<Operation>> {
    return this.call<Operation>("GET", `/v1/operations/${encodeURIComponent(key)}`, undefined, options);
  }

  /** GET /v1/payments/{id}/events. */
  getPaymentEvents(id: string, options: Omit<CallOptions, "key" | "onKey" | "prefer"> = {}): Promise<IdemResponse<PaymentEvents>> {
    return this.call<PaymentEvents>("GET", `/v1/payments/${encodeURIComponent(id)}/events`, undefined, options);
  }

  /** POST /v1/payments/{id}/events/replay (no body, no key: a replay is a copy). */
  replayPaymentEvents(id: string, options: Omit<CallOptions, "key" | "onKey" | "prefer"> = {}): Promise<IdemResponse<PaymentEvents>> {
    return this.#run<PaymentEvents>("POST", `/v1/payments/${encodeURIComponent(id)}/events/replay`, undefined, options, false);
  }

  /**
   * Any route, e.g. a gateway route: `body` (an object is serialised to JSON once; a string or
   * bytes are sent as they are) goes out byte for byte the same on every attempt. Methods other
   * than GET and HEAD carry an Idempotency-Key.
   */
  call<T = unknown>(method: string, path: string, body?: unknown, options: CallOptions = {}): Promise<IdemResponse<T>> {
    const m = method.toUpperCase();
    return this.#run<T>(m, path, body, options, m !== "GET" && m !== "HEAD");
  }

  async #run<T>(method: string, path: string, body: unknown, options: CallOptions, keyed: boolean): Promise<IdemResponse<T>> {
    if (!/^[A-Z]+$/.test(method)) throw new TypeError(`bad method ${method}`);
    const url = this.#resolve(path);
    if (url === undefined) throw new TypeError(`path must be on the client's origin: ${path}`);
    const wait = options.prefer?.wait;
    if (wait !== undefined && (!Number.isInteger(wait) || wait < 0)) {
      throw new RangeError("prefer.wait must be a whole number of seconds >= 0");
    }
    const bytes = serialise(body);  // once: every attempt sends these bytes
    let key: string | undefined;
    if (keyed) {
      key = options.key ?? this.newKey();
      if (!KEY_CHARS.test(key)) throw new TypeError("key must be 1..1024 visible ASCII characters");
      if (options.onKey) await options.onKey(key);
    }
    const signal = options.signal;
    const deadlineMs = options.deadlineMs ?? this.#o.deadlineMs;
    const started = this.#now();
    const follow = options.follow202 ?? true;
    let respondAsync = options.prefer?.respondAsync === true;
    let attempts = 0;
    let retries = 0;
    let last: IdemError | undefined;
    const finish = (e: IdemError, stoppedBy?: StoppedBy): IdemError => {
      e.key = key;
      e.attempts = attempts;
      e.stoppedBy = stoppedBy;
      return e;
    };

    while (true) {
      signal?.throwIfAborted();
      const headers = this.#headers(options, key, bytes !== undefined, respondAsync);
      attempts++;
      const got = await this.#send(method, url, headers, bytes, signal);
      let retryAfterMs: number | undefined;
      if ("error" in got) {
        if (got.error instanceof ResponseTooLarge) throw finish(got.error);
        last = got.error;
      } else {
        const a = got.answer;
        retryAfterMs = parseRetryAfter(a.headers.get("retry-after"), this.#now());
        if (a.status === 202 && keyed && follow) {
          // Accepted: watch the operation until it has finished, then ask again with the same key
          // (without respond-async) to collect the answer, replayed byte for byte.
          respondAsync = false;
          this.budget.recordSuccess();
          await this.#awaitOperation(a, started, deadlineMs, retryAfterMs, signal);
          if (attempts >= this.#o.maxAttempts) {
            throw finish(new TransportError("the operation did not finish within maxAttempts"), "attempts");
          }
          continue;
        }
        if (a.status >= 200 && a.status < 300) {
          this.budget.recordSuccess();
          return { ...toResponse<T>(a), key, attempts };
        }
        const problem = problemFromResponse({
          status: a.status, headers: a.headers, body: parseProblemBody(a.text), text: a.text,
          retryAfterMs, ...replayInfo(a.headers),
        });
        if (!isRetryableAnswer(a.status, problem.type, retryAfterMs !== undefined)) {
          this.budget.recordSuccess();  // a final answer: the server is up
          throw finish(problem);
        }
        last = problem;
      }
      // A retryable failure: retry if attempts, time and the budget allow.
      if (attempts >= this.#o.maxAttempts) throw finish(last, "attempts");
      const wait = backoffMs(retries, this.#o.initialBackoffMs, this.#o.maxBackoffMs, this.#random, retryAfterMs);
      if (this.#now() + wait - started >= deadlineMs) throw finish(last, "deadline");
      if (!this.budget.tryAcquire()) throw finish(last, "budget");
      retries++;
      await this.#sleep(wait, signal);
    }
  }

  /** Polls the 202's Location (on our origin) while the operation is PROCESSING, within the deadline. */
  async #awaitOperation(accepted: Answer, started: number, deadlineMs: number,
                        retryAfterMs: number | undefined, signal: AbortSignal | undefined): Promise<void> {
    const location = accepted.headers.get("location");
    const opUrl = location ? this.#resolve(location) : undefined;
    for (let poll = 0; ; poll++) {
      const wait = Math.max(retryAfterMs ?? 0,
        Math.min(this.#o.maxBackoffMs, this.#o.initialBackoffMs * (poll + 1)));
      if (this.#now() + wait - started >= deadlineMs) return;
      await this.#sleep(wait, signal);
      if (opUrl === undefined) return;  // nothing to watch: ask again after one wait
      const got = await this.#send("GET", opUrl, this.#headers({}, undefined, false, false), undefined, signal);
      if ("error" in got) {
        if (got.error instanceof ResponseTooLarge) return;
        continue;  // a transport error while polling: poll again (bounded by the deadline)
      }
      const a = got.answer;
      retryAfterMs = undefined;
      if (a.status === 200) {
        const op = parseProblemBody(a.text) as { state?: unknown };
        if (op.state === "PROCESSING") continue;
        return;
      }
      if (a.status === 429 || a.status === 503) {
        retryAfterMs = parseRetryAfter(a.headers.get("retry-after"), this.#now());
        continue;
      }
      return;  // 404 or anything else: ask the route itself
    }
  }

  #headers(options: CallOptions, key: string | undefined, hasBody: boolean, respondAsync: boolean): Headers {
    const h = new Headers();
    for (const [n, v] of Object.entries(options.headers ?? {})) h.set(n, v);
    h.set("authorization", `Bearer ${this.#apiKey}`);
    h.set("accept", "application/json, application/problem+json");
    if (hasBody) h.set("content-type", "application/json");
    if (key !== undefined) h.set("idempotency-key", key);
    const prefer: string[] = [];
    if (respondAsync) prefer.push("respond-async");
    const wait = options.prefer?.wait;
    if (wait !== undefined) prefer.push(`wait=${wait}`);
    if (prefer.length > 0) h.set("prefer", prefer.join(", "));
    return h;
  }

  /**
   * `path` against the base URL: an absolute path ("/v1/…", as idemd's Location headers are) goes
   * under the base URL's path; an absolute URL must be on the base's origin. Else undefined, so
   * the API key is never sent elsewhere.
   */
  #resolve(path: string): URL | undefined {
    let u: URL;
    try {
      u = path.startsWith("/") && !path.startsWith("//") ? new URL(path.slice(1), this.#base) : new URL(path);
    } catch {
      return undefined;
    }
    return u.origin === this.#base.origin ? u : undefined;
  }

  /** One request under the attempt timeout; its answer with the body read under the cap. */
  async #send(method: string, url: URL, headers: Headers, body: Uint8Array<ArrayBuffer> | undefined,
              signal: AbortSignal | undefined): Promise<Attempt> {
    const controller = new AbortController();
    let timedOut = false;
    const timer = setTimeout(() => {
      timedOut = true;
      controller.abort(new DOMException(`no answer within ${this.#o.attemptTimeoutMs} ms`, "TimeoutError"));
    }, this.#o.attemptTimeoutMs);
    const onAbort = () => controller.abort(signal?.reason);
    signal?.addEventListener("abort", onAbort, { once: true });
    try {
      const init: RequestInit = { method, headers, signal: controller.signal, redirect: "manual" };
      if (body !== undefined) init.body = body;
      const r = await this.#fetch(url, init);
      const bytes = await readCapped(r, this.#o.maxResponseBytes);
      if (bytes === undefined) return { error: new ResponseTooLarge(this.#o.maxResponseBytes, r.status) };
      const text = new TextDecoder("utf-8", { fatal: false }).decode(bytes);
      return { answer: { status: r.status, headers: r.headers, bytes, text } };
    } catch (e) {
      if (signal?.aborted) throw signal.reason;
      if (timedOut) return { error: new AttemptTimeout(`no answer within ${this.#o.attemptTimeoutMs} ms`, { cause: e }) };
      const detail = e instanceof Error ? (e.cause instanceof Error ? e.cause.message : e.message) : String(e);
      return { error: new TransportError(`${method} ${url.pathname}: ${detail}`, { cause: e }) };
    } finally {
      clearTimeout(timer);
      signal?.removeEventListener("abort", onAbort);
    }
  }
}

function serialise(body: unknown): Uint8Array<ArrayBuffer> | undefined {
  if (body === undefined) return undefined;
  if (body instanceof Uint8Array) return new Uint8Array(body);  // our own copy
  if (typeof body === "string") return new TextEncoder().encode(body);
  const json = JSON.stringify(body);
  if (json === undefined) throw new TypeError("body cannot be serialised as JSON");
  return new TextEncoder().encode(json);
}

/** The body, or undefined if it is larger than `limit` bytes (the rest is not read). */
async function readCapped(r: Response, limit: number): Promise<Uint8Array | undefined> {
  const declared = Number(r.headers.get("content-length") ?? "NaN");
  if (Number.isFinite(declared) && declared > limit) {
    await r.body?.cancel().catch(() => {});
    return undefined;
  }
  if (r.body === null) return new Uint8Array(0);
  const reader = r.body.getReader();
  const chunks: Uint8Array[] = [];
  let size = 0;
  while (true) {
    const { done, value } = await reader.read();
    if (done) break;
    size += value.byteLength;
    if (size > limit) {
      await reader.cancel().catch(() => {});
      return undefined;
    }
    chunks.push(value);
  }
  const out = new Uint8Array(size);
  let at = 0;
  for (const c of chunks) {
    out.set(c, at);
    at += c.byteLength;
  }
  return out;
}

function replayInfo(h: Headers): ReplayInfo {
  const expires = h.get("idempotency-key-expires");
  const at = expires ? Date.parse(expires) : NaN;
  return {
    replayed: (h.get("idempotent-replayed") ?? "").trim().toLowerCase() === "true",
    keyExpires: Number.isNaN(at) ? undefined : new Date(at),
  };
}

function toResponse<T>(a: Answer): Omit<IdemResponse<T>, "key" | "attempts"> {
  let body: unknown = undefined;
  if (a.text !== "") {
    try {
      body = JSON.parse(a.text);
    } catch {
      body = undefined;
    }
  }
  return {
    status: a.status, headers: a.headers, body: body as T, bytes: a.bytes, text: a.text,
    location: a.headers.get("location") ?? undefined, ...replayInfo(a.headers),
  };
}

export { ProblemError };
