// server/idemd/payments/payments.h — POST /v1/payments behind the idempotency filter, GET
// /v1/payments/{id}.
#pragma once

#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "http/problem.h"
#include "idem/store/sqlite.h"
#include "server/idemd/filter/filter.h"
#include "server/idemd/payments/charge.h"
#include "server/idemd/payments/provider.h"
#include "server/idemd/payments/table.h"

namespace idem::idemd {

// The route policy of POST /v1/payments: key policy, canonical rules (amount is money, trace_id
// is not part of the request's meaning), which outcomes are final.
FilterPolicy PaymentsPolicy(const KeyPolicy& keys, Millis lease, Millis retention,
                            int64_t max_processing, int64_t max_retained, Millis wait_max);

// Thread-safe. Borrows everything. `payment_namespace` is PaymentsNamespace's. `cover`,
// `provider_deduplicates_by_key` and `settle` are the charge's rules (ChargeRules). A charge that
// failed with kUnavailable charged nothing (it never left, or the provider declared its 5xx so:
// Provider::CreateCharge): the attempt is abandoned at once and its order released for any key.
// Any other failure after the send (a timeout, an undeclared 5xx, a lost connection) is an
// unknown outcome: the record stays PROCESSING at charge_sent, and the charge is looked up
// before anything is sent again (ChargeSteps). `metrics`, when not null, counts the payment
// events written.
class Payments final : public Operation {
 public:
  // `pool` runs the store calls of an execution; provider calls hold no thread.
  Payments(Store& store, http::BlockingPool& pool, Provider& provider, Clock& clock,
           MonotonicClock& monotonic, std::string payment_namespace,
           std::vector<std::string> currencies, ChargeCover cover,
           bool provider_deduplicates_by_key = false, Millis settle = Millis(0),
           Metrics* metrics = nullptr);

  std::optional<http::Response> Validate(const http::Request& request, const Principal& principal,
                                         bool canonical) override;
  Status OnClaim(StoreTxn& txn, const Record& record, const http::Request& request,
                 const Principal& principal) override;
  http::Async<Execution> Execute(Ticket& ticket, const http::Request& request,
                                 const Principal& principal, Engine& engine,
                                 Heartbeat& heartbeat) override;
  Execution TakeOver(Ticket& ticket, Engine& engine) override;

  // GET /v1/payments/{id}: 200, or 404 (also for another tenant's payment).
  http::Response Get(std::string_view id, const Principal& principal);
  // GET /v1/payments/{id}/events: 200 {"payment", "events": [EventJson, ...]} in sequence order,
  // or 404 as Get. POST /v1/payments/{id}/events/replay: sets the payment's published events
  // back, so the relay publishes them again under their ids (ReplayPaymentEvents); 202 {"payment",
  // "replayed": how many were set back, "events"}, or 404 as Get.
  http::Response Events(std::string_view id, const Principal& principal, bool replay);

 private:
  // A body that is not JSON: the parser's message.
  struct MalformedJson {
    std::string message;
  };
  // What a body holds: a valid request, no JSON at all, or JSON whose fields fail validation
  // (at least one field error, in the order the checks run).
  using ParseResult = std::variant<PaymentRequest, MalformedJson, std::vector<http::FieldError>>;

  // `judge`: also refuse, as malformed, what the fingerprint refuses of any JSON (Validate's
  // check; OnClaim and Execute parse a body Validate has accepted, so they skip it).
  ParseResult Parse(const std::string& body, bool judge = false) const;
  Result<std::optional<Payment>> Load(std::string_view id, std::string_view tenant);
  // The charge's awaits, between ChargeSteps' steps. `traceparent` goes with the provider calls
  // (W3C Trace Context; "" for none).
  http::Async<Execution> ChargeOnce(Ticket& ticket, Payment payment, Engine& engine,
                                    Heartbeat& heartbeat, std::string traceparent);

  Store& store_;
  http::BlockingPool& pool_;
  Provider& provider_;
  const std::string namespace_;
  std::vector<std::string> currencies_;
  const ChargeSteps steps_;
};

}  // namespace idem::idemd
