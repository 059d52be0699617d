// src/index.ts — @idem/client: the public API.
export {
  IdemClient, isRetryableAnswer, realSleep,
  type CallOptions, type ClientOptions, type IdemResponse, type Operation, type Payment,
  type PaymentEvent, type PaymentEvents, type PaymentRequest, type Prefer, type Sleep,
} from "./client.js";
export { RetryBudget, defaultRetryBudget, DEFAULT_RETRY_BUDGET, type RetryBudgetOptions } from "./budget.js";
export { backoffMs, parseRetryAfter, MAX_RETRY_AFTER_MS } from "./backoff.js";
export { uuidv7, uuidv7Time, UUIDV7, systemRandomBytes, type RandomBytes } from "./uuid.js";
export * from "./errors.js";
