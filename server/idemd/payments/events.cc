// server/idemd/payments/events.cc — the payment events (events.h).
#include "server/idemd/payments/events.h"

#include <boost/json.hpp>

#include "http/message.h"
#include "idem/outbox.h"

namespace idem::idemd {

namespace json = boost::json;

Status AddPaymentEvent(StoreTxn& txn, std::string_view type, const std::string& tenant,
                       const Payment& payment, Timestamp now, Metrics* metrics,
                       const RefundFacts* refund) {
  json::object o;
  o["type"] = type;
  o["tenant"] = tenant;
  o["payment"] = json::parse(PaymentBody(payment));
  o["occurred_at"] = http::Rfc3339(ToUnixMillis(now));
  if (refund != nullptr) {
    o["refund"] = json::object{{"charge_id", refund->charge_id},
                               {"refund_id", refund->refund_id},
                               {"amount", refund->amount},
                               {"currency", refund->currency}};
  }
  OutboxEventSpec spec;
  spec.aggregate = payment.id;
  spec.type = std::string(type);
  spec.discriminator = refund != nullptr ? refund->charge_id : std::string();
  spec.payload = json::serialize(o);
  if (metrics != nullptr) spec.on_written = [metrics] { metrics->CountOutboxWritten(); };
  IDEM_RETURN_IF_ERROR(AddOutboxEvent(txn, spec, now));
  return Ok();
}

Status AddRefundEvent(StoreTxn& txn, const std::string& payment_id, const RefundFacts& refund,
                      Timestamp now, Metrics* metrics) {
  IDEM_ASSIGN_OR_RETURN(
      auto rows, txn.Exec("SELECT tenant, id, merchant_order_no, amount_minor, currency, status, "
                          "provider_charge_id, created_at FROM payments WHERE id = ?",
                          {payment_id}));
  if (rows.empty()) return Ok();
  const SqlRow& r = rows[0];
  IDEM_ASSIGN_OR_RETURN(PaymentStatus status, ParsePaymentStatus(Text(r[5])));
  const Payment payment{Text(r[1]), Text(r[2]), Integer(r[3]), Text(r[4]),
                        status,     Text(r[6]), Integer(r[7])};
  return AddPaymentEvent(txn, kPaymentRefunded, Text(r[0]), payment, now, metrics, &refund);
}

Result<int64_t> ReplayPaymentEvents(Store& store, const std::string& payment_id) {
  IDEM_ASSIGN_OR_RETURN(std::unique_ptr<StoreTxn> txn, store.Begin());
  IDEM_ASSIGN_OR_RETURN(int64_t set_back, ReplayOutboxEvents(*txn, payment_id));
  IDEM_RETURN_IF_ERROR(txn->Commit());
  return set_back;
}

json::value EventJson(const OutboxEvent& e) {
  json::object o{{"id", e.id},
                 {"payment", e.aggregate},
                 {"type", e.type},
                 {"sequence", e.sequence},
                 {"created_at", http::Rfc3339(e.created_at_ms)},
                 {"published_at", e.published_at_ms ? json::value(http::Rfc3339(*e.published_at_ms))
                                                    : json::value(nullptr)},
                 {"publications", e.publications}};
  boost::system::error_code ec;
  json::value payload = json::parse(e.payload, ec);
  o["payload"] = ec ? json::value(e.payload) : std::move(payload);
  return o;
}

}  // namespace idem::idemd
