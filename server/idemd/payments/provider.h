// server/idemd/payments/provider.h — the downstream payment provider, behind an interface so tests,
// the simulator and other providers slot in.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "http/async.h"
#include "http/client.h"
#include "idem/result.h"
#include "server/idemd/config/config.h"

namespace idem::idemd {

struct Charge {
  std::string id;  // "ch_…"
  std::string reference;
  std::string amount;
  std::string currency;
  std::string status;
  int64_t created_at_ms = 0;    // by the provider's clock; 0 when it did not say
  std::string amount_refunded;  // "" when it did not say
};

// One page of GET /v1/charges by creation time.
struct ChargePage {
  std::vector<Charge> data;  // oldest first
  bool has_more = false;
};

struct Refund {
  std::string id;  // "re_…"
  std::string charge;
  std::string amount;
  std::string status;
};

struct ChargeResult {
  bool declined = false;  // the provider refused (402): final
  // Not empty when the request left and what came back proves nothing: a 5xx the provider does
  // not declare as "nothing charged" ([provider] nothing_charged_statuses), or the connection
  // lost before the call's deadline. Says which. The provider may have charged, now or later:
  // the outcome is unknown, as after a timeout.
  std::string unknown;
  Charge charge;  // when neither declined nor unknown

  static ChargeResult Charged(Charge charge) { return {false, {}, std::move(charge)}; }
  static ChargeResult Declined() { return {true, {}, {}}; }
  static ChargeResult Unknown(std::string why) { return {false, std::move(why), {}}; }
};

// Thread-safe. Every call is a coroutine that holds no thread while the provider answers; code
// on a plain thread (the takeover loop) runs it with http::RunSync. Arguments are borrowed:
// co_await the call at once.
class Provider {
 public:
  virtual ~Provider() = default;
  // POST /v1/charges with Idempotency-Key = reference. The request leaves within `send_within`
  // of the call or not at all (waiting for a connection and connecting count): a charge must not
  // leave later than its lease allows (Payments). A 5xx or a connection lost after the send is
  // an answer whose outcome is unknown (ChargeResult::unknown). Errors: kUnavailable only when
  // nothing was charged: the request provably never left, or the provider answered a 5xx it
  // declares as "nothing charged"; kDeadlineExceeded when the request left and no answer came by
  // the call's deadline (the outcome is unknown); kDataLoss for an answer that is not the
  // documented shape (the provider answered: the outcome is unknown too).
  // `traceparent` (W3C Trace Context; "" for none) goes with the request: the trace of the
  // payment request that made the call, with idemd's span as the parent.
  virtual http::Async<Result<ChargeResult>> CreateCharge(const std::string& reference,
                                                         const std::string& amount,
                                                         const std::string& currency,
                                                         Millis send_within,
                                                         const std::string& traceparent) = 0;
  // GET /v1/charges?reference=…: the charge, or nullopt if the provider has none.
  // Errors: kUnavailable / kDeadlineExceeded as above.
  virtual http::Async<Result<std::optional<Charge>>> FindCharge(const std::string& reference,
                                                                const std::string& traceparent) = 0;
  // GET /v1/charges?created_gte=…&created_lt=…&limit=…[&starting_after=…]: charges created in
  // [gte_ms, lt_ms), oldest first, up to `limit` (1..100) after the charge `starting_after`.
  // Errors: kUnavailable / kDeadlineExceeded; kDataLoss for an answer of another shape.
  virtual http::Async<Result<ChargePage>> ListCharges(int64_t gte_ms, int64_t lt_ms, int limit,
                                                      const std::string& starting_after) = 0;
  // POST /v1/refunds with Idempotency-Key = key: refunds `amount` of `charge`.
  // Errors: kNotFound (no such charge); kInvalidArgument (more than is left to refund);
  // kUnavailable (nothing refunded: not sent, or a 5xx); kDeadlineExceeded (outcome unknown);
  // kDataLoss.
  virtual http::Async<Result<Refund>> RefundCharge(const std::string& key,
                                                   const std::string& charge,
                                                   const std::string& amount,
                                                   const std::string& reason) = 0;
};

// How idemd talks to the provider over HTTP.
// The provider at `config.url` (http:// or https://, verified), over a pool of keep-alive
// connections, with [provider]'s timeouts and bounds. Errors: kInvalidArgument for a bad URL or
// options, or a CA file that cannot be loaded.
Result<std::unique_ptr<Provider>> MakeHttpProvider(const ProviderConfig& config);

}  // namespace idem::idemd
