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
#include "server/idemd/payments/provider.h"
#include "server/idemd/payments/table.h"

namespace idem::idemd {

// The route policy of POST /v1/payments: key policy, canonical rules (amount is money, trace_id
// is not part of the request's meaning), which outcomes are final.
FilterPolicy PaymentsPolicy(const KeyPolicy& keys, Millis lease, Millis retention,
                            int64_t max_processing, int64_t max_retained, Millis wait_max);

// Thread-safe. Borrows everything. `payment_namespace` is PaymentsNamespace's. `cover` is how long
// the lease must still run when a charge is sent: the provider's timeout plus the lease margin
// (Engine::AdvanceBeforeCall). A charge that failed with kUnavailable charged nothing (it never
// left, or the provider declared its 5xx so: Provider::CreateCharge): the attempt is abandoned at
// once and its order released for any key. Any other failure after the send (a timeout, an
// undeclared 5xx, a lost connection) is an unknown outcome: the record stays PROCESSING at
// charge_sent, and the charge is looked up before anything is sent again.
// `provider_deduplicates_by_key` ([provider] deduplicates_by_key) declares that a repeated charge
// with the same reference charges at most once: a charge whose outcome is unknown may be sent
// again at once. Otherwise an unknown outcome is sent again only once `settle` ([provider]
// settle_ms) has passed since the last send (Record::sent_at) and a lookup by reference still
// finds nothing; until then a retry gets the in-progress answer and the record stays PROCESSING
// for the reconciler. Zero settles at once.
// What a charge's lease must cover when the charge is sent: the provider call's deadline, and a
// margin for the covered advance's store round trip and the time from it to the send. A send
// whose covered advance took longer than the margin to answer is not made (Execute).
struct ChargeCover {
  Millis call_timeout;
  Millis margin;
};

class Payments final : public Operation {
 public:
  // `pool` runs the store calls of an execution; provider calls hold no thread.
  Payments(Store& store, http::BlockingPool& pool, Provider& provider, Clock& clock,
           MonotonicClock& monotonic, std::string payment_namespace,
           std::vector<std::string> currencies, ChargeCover cover,
           bool provider_deduplicates_by_key = false, Millis settle = Millis(0));

  std::optional<http::Response> Validate(const http::Request& request,
                                         const Principal& principal) override;
  Status OnClaim(StoreTxn& txn, const Record& record, const http::Request& request,
                 const Principal& principal) override;
  http::Async<Execution> Execute(Ticket& ticket, const http::Request& request,
                                 const Principal& principal, Engine& engine,
                                 Heartbeat& heartbeat) override;
  Execution Reconcile(Ticket& ticket, Engine& engine) override;

  // GET /v1/payments/{id}: 200, or 404 (also for another tenant's payment).
  http::Response Get(std::string_view id, const Principal& principal);

 private:
  struct Payment {
    std::string id;
    std::string merchant_order_no;
    int64_t amount_minor = 0;
    std::string currency;
    std::string status;
    std::string provider_charge_id;
    int64_t created_at_ms = 0;
  };
  struct Parsed {
    std::string merchant_order_no;
    int64_t amount_minor = 0;
    std::string currency;
  };
  // A body that is not JSON: the parser's message.
  struct MalformedJson {
    std::string message;
  };
  // What a body holds: a valid request, no JSON at all, or JSON whose fields fail validation
  // (at least one field error, in the order the checks run).
  using ParseResult = std::variant<Parsed, MalformedJson, std::vector<http::FieldError>>;

  ParseResult Parse(const std::string& body) const;
  Result<std::optional<Payment>> Load(std::string_view id, std::string_view tenant);
  std::string Body(const Payment& p) const;
  http::Response Created(const Payment& p, int status) const;
  // The store part of Execute (on the pool): an answer, or nullopt with the payment to charge.
  std::optional<Execution> Prepare(const Ticket& ticket, const http::Request& request,
                                   const Principal& principal, Payment* out);
  // `traceparent` goes with the provider calls (W3C Trace Context; "" for none).
  http::Async<Execution> ChargeOnce(Ticket& ticket, Payment payment, Engine& engine,
                                    Heartbeat& heartbeat, std::string traceparent);
  // What must hold before the charge is sent (on the pool): the lease, the covered advance
  // within the margin, the after_charge_sent failpoint. An answer when the charge must not go.
  // `covered`: the claim made the covered advance (OnClaim), no earlier than *advanced; unless
  // half the margin has gone since, it serves; otherwise the advance is made here and *advanced
  // is set to when it was asked for.
  std::optional<Execution> BeforeSend(Ticket& ticket, const Payment& payment, Engine& engine,
                                      Heartbeat& heartbeat, bool covered, SteadyTime* advanced);
  // What the charge's answer (and the after_provider_charge failpoint's status) settles.
  Execution AfterSend(const Ticket& ticket, Payment payment, Status failpoint,
                      Result<ChargeResult> charged);
  // How long until the last send of `record` has settled (Record::sent_at + settle), or nothing
  // when it has, or when the provider deduplicates by key.
  std::optional<Millis> Unsettled(const Record& record) const;
  // The in-progress answer while a send settles: the record stays PROCESSING, nothing is sent.
  static Execution Settling(Millis left);
  Execution Succeeded(Payment payment, const Charge& charge);
  // The final 402, with the payment row marked declined in the completion's transaction.
  Execution Declined(const Ticket& ticket, const Payment& payment);
  // A retryable failure that gives the attempt up: the payment row becomes `abandoned` (it no
  // longer holds its merchant order) and the record resumes at `abandoned`, in the completion's
  // transaction. Only for an attempt that charged nothing: before the send, after a send that
  // provably never left or a declared 5xx, or after a lookup found nothing once the send was
  // settled.
  Execution Abandoned(const Payment& payment, http::Response response);
  // What a charge that the provider found by the payment's reference settles: success only for
  // this payment's succeeded charge, the final 402 for its declined one, an unresolved outcome
  // for anything else.
  Execution FromFoundCharge(const Ticket& ticket, Payment payment, const Charge& charge);

  Store& store_;
  http::BlockingPool& pool_;
  Provider& provider_;
  Clock& clock_;
  MonotonicClock& monotonic_;
  const std::string namespace_;
  std::vector<std::string> currencies_;
  ChargeCover cover_;
  bool provider_deduplicates_by_key_;
  Millis settle_;
};

}  // namespace idem::idemd
