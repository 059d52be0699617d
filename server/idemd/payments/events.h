// server/idemd/payments/events.h — the payment events (docs/outbox.md): payment.succeeded,
// payment.failed and payment.refunded, each added to the outbox (include/idem/outbox.h) in the
// transaction that changes the payment, so an event exists exactly when its change committed.
#pragma once

#include <boost/json/value.hpp>
#include <cstdint>
#include <string>
#include <string_view>

#include "idem/clock.h"
#include "idem/outbox.h"
#include "idem/result.h"
#include "idem/store.h"
#include "server/idemd/metrics.h"
#include "server/idemd/payments/table.h"

namespace idem::idemd {

inline constexpr std::string_view kPaymentSucceeded = "payment.succeeded";
inline constexpr std::string_view kPaymentFailed = "payment.failed";
inline constexpr std::string_view kPaymentRefunded = "payment.refunded";

// A refund of one of a payment's charges (the books refund the extra ones).
struct RefundFacts {
  std::string charge_id;
  std::string refund_id;
  std::string amount;  // exact decimal text, in the charge's currency
  std::string currency;
};

// Adds the event `type` of `payment` (as it stands after the change) of `tenant` to `txn`. Its
// payload: {"type", "tenant", "payment": the payment as GET /v1/payments/{id} answers it,
// "occurred_at"}, and for a refund "refund": {charge_id, refund_id, amount, currency}. The event
// id is the payment's, the type's and (for a refund) the refunded charge's, so the same change
// written again is the same event. `metrics`, when not null, counts the event once `txn` has
// committed, if this call wrote it (idem_outbox_written_total). Errors: AddOutboxEvent's.
Status AddPaymentEvent(StoreTxn& txn, std::string_view type, const std::string& tenant,
                       const Payment& payment, Timestamp now, Metrics* metrics,
                       const RefundFacts* refund = nullptr);

// payment.refunded for `refund` of payment `payment_id`, read in `txn`; nothing when the
// payments table has no such payment (an orphan charge has none). `metrics` as for
// AddPaymentEvent. Errors: the store's, AddOutboxEvent's.
Status AddRefundEvent(StoreTxn& txn, const std::string& payment_id, const RefundFacts& refund,
                      Timestamp now, Metrics* metrics);

// Sets payment `payment_id`'s published events back to unpublished, in a transaction of its own,
// so that the relay publishes them again under their ids, in order (ReplayOutboxEvents): for a
// consumer that lost them. Returns how many were set back. Errors: the store's.
Result<int64_t> ReplayPaymentEvents(Store& store, const std::string& payment_id);

// An event as idemctl and GET /v1/payments/{id}/events show it: {"id", "payment", "type",
// "sequence", "created_at", "published_at" (null until published), "publications", "payload"
// (parsed when it is JSON, else its text)}.
boost::json::value EventJson(const OutboxEvent& event);

}  // namespace idem::idemd
