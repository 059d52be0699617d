// src/backoff.ts — capped exponential back-off with full jitter, and Retry-After.

/** The largest Retry-After honoured, in milliseconds (a day); a larger value is clamped. */
export const MAX_RETRY_AFTER_MS = 86_400_000;

/**
 * The wait before retry number `retry` (0 for the first retry): uniform in
 * [0, min(maxMs, initialMs * 2^retry)] ("full jitter"), but never less than `retryAfterMs`.
 * `random` returns a number in [0, 1).
 */
export function backoffMs(
  retry: number,
  initialMs: number,
  maxMs: number,
  random: () => number,
  retryAfterMs?: number,
): number {
  const exp = initialMs * 2 ** Math.min(Math.max(0, retry), 30);
  const cap = Math.max(0, Math.min(maxMs, exp));
  let r = random();
  if (!(r >= 0 && r < 1)) r = 0;
  const jittered = Math.floor(r * (cap + 1));
  return Math.max(jittered, retryAfterMs ?? 0);
}

/**
 * The Retry-After header (RFC 9110 §10.2.3) in milliseconds from `nowMs`: delta-seconds or an
 * HTTP-date. Undefined when absent or malformed; clamped to [0, MAX_RETRY_AFTER_MS].
 */
export function parseRetryAfter(value: string | null | undefined, nowMs: number): number | undefined {
  if (value == null) return undefined;
  const v = value.trim();
  if (v === "") return undefined;
  if (/^[0-9]+$/.test(v)) {
    if (v.length > 9) return MAX_RETRY_AFTER_MS;
    return Math.min(MAX_RETRY_AFTER_MS, Number(v) * 1000);
  }
  // HTTP-date (IMF-fixdate, or the obsolete RFC 850 and asctime forms): all begin with a day name.
  if (v.length > 64 || !/^[A-Za-z]{3,9},? [0-9A-Za-z :-]+$/.test(v)) return undefined;
  const at = Date.parse(v);
  if (Number.isNaN(at)) return undefined;
  return Math.min(MAX_RETRY_AFTER_MS, Math.max(0, at - nowMs));
}
