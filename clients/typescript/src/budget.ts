// src/budget.ts — a retry budget: a token bucket shared by every operation that uses it, so an
// outage does not turn into a retry storm.

export interface RetryBudgetOptions {
  /** The most tokens the bucket holds, and what it starts with. Default 50. */
  capacity?: number;
  /** Tokens each success gives back (capped at `capacity`). Default 0.1: at most one retry per
   * ten successes is sustained once the bucket is empty. */
  refillPerSuccess?: number;
  /** Tokens at the start. Default `capacity`. */
  initial?: number;
}

export const DEFAULT_RETRY_BUDGET: Readonly<Required<Omit<RetryBudgetOptions, "initial">>> = {
  capacity: 50,
  refillPerSuccess: 0.1,
};

/**
 * A token bucket of retries. Each retry takes one whole token; each success (any final answer
 * from the server: it is up) gives back `refillPerSuccess`. When fewer than one token is left a
 * retry is refused and the caller surfaces its last error. First attempts never need a token.
 *
 * One budget may be shared by many clients and operations (JavaScript runs them on one thread,
 * so no locking is needed). Clients that are given none share `defaultRetryBudget`.
 */
export class RetryBudget {
  readonly capacity: number;
  readonly refillPerSuccess: number;
  #tokens: number;

  constructor(options: RetryBudgetOptions = {}) {
    const capacity = options.capacity ?? DEFAULT_RETRY_BUDGET.capacity;
    const refill = options.refillPerSuccess ?? DEFAULT_RETRY_BUDGET.refillPerSuccess;
    if (!Number.isFinite(capacity) || capacity < 0) throw new RangeError("capacity must be >= 0");
    if (!Number.isFinite(refill) || refill < 0) throw new RangeError("refillPerSuccess must be >= 0");
    this.capacity = capacity;
    this.refillPerSuccess = refill;
    this.#tokens = Math.min(capacity, Math.max(0, options.initial ?? capacity));
  }

  /** Tokens left (fractional). */
  get tokens(): number {
    return this.#tokens;
  }

  /** Takes a token for one retry: true if there was one, false (and nothing taken) if not. */
  tryAcquire(): boolean {
    if (this.#tokens < 1) return false;
    this.#tokens -= 1;
    return true;
  }

  /** Records a success: gives back `refillPerSuccess` tokens, up to `capacity`. */
  recordSuccess(): void {
    this.#tokens = Math.min(this.capacity, this.#tokens + this.refillPerSuccess);
  }

  /** A budget that never runs out (for tests or callers that bound retries otherwise). */
  static unlimited(): RetryBudget {
    return new RetryBudget({ capacity: Number.MAX_SAFE_INTEGER, refillPerSuccess: 0 });
  }
}

/** The budget every client shares unless it is given its own. */
export const defaultRetryBudget = new RetryBudget();
