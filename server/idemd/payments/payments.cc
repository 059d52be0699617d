// server/idemd/payments/payments.cc — the payments reference API (POST /v1/payments in
// docs/openapi.yaml).
#include "server/idemd/payments/payments.h"

#include <boost/json.hpp>
#include <chrono>
#include <cstdio>

#include "http/log.h"
#include "http/problem.h"
#include "idem/canonical.h"
#include "idem/failpoint.h"
#include "idem/fingerprint.h"
#include "server/idemd/payments/events.h"
#include "server/idemd/routes.h"

namespace idem::idemd {
namespace {

namespace json = boost::json;

bool IsOrderNo(std::string_view s) {
  if (s.empty() || s.size() > 64) return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' ||
           c == '_';
  });
}

// A string amount as docs/openapi.yaml allows it: digits, then optionally a point and digits. No
// sign, exponent, white space or bare point.
bool IsPlainDecimal(std::string_view s) {
  auto digits = [](std::string_view d) {
    return !d.empty() &&
           std::all_of(d.begin(), d.end(), [](char c) { return c >= '0' && c <= '9'; });
  };
  const std::size_t point = s.find('.');
  if (point == std::string_view::npos) return digits(s);
  return digits(s.substr(0, point)) && digits(s.substr(point + 1));
}

}  // namespace

FilterPolicy PaymentsPolicy(const KeyPolicy& keys, Millis lease, Millis retention,
                            int64_t max_processing, int64_t max_retained, Millis wait_max) {
  FilterPolicy p;
  p.route.route = kPaymentsCreateRoute;
  p.route.key_policy = keys;
  p.route.rules.version = 1;
  p.route.rules.money_fields = {"amount"};
  p.route.rules.removed_fields = {"trace_id"};
  p.route.rules.defaults = {{"description", "\"\""}, {"metadata", "{}"}};
  p.route.lease = lease;
  p.route.retention = retention;
  p.route.max_processing = max_processing;
  p.route.max_retained = max_retained;
  p.route.sent_points = PaymentsSentPoints();
  p.failures.final_statuses = {400, 402, 409, 422};
  p.failures.retryable_statuses = {503};
  p.wait_max = wait_max;
  p.route_label = kPaymentsCreateRoute;
  p.operations_prefix = kOperationsPrefix;
  return p;
}

Payments::Payments(Store& store, http::BlockingPool& pool, Provider& provider, Clock& clock,
                   MonotonicClock& monotonic, std::string payment_namespace,
                   std::vector<std::string> currencies, ChargeCover cover,
                   bool provider_deduplicates_by_key, Millis settle, Metrics* metrics)
    : store_(store),
      pool_(pool),
      provider_(provider),
      namespace_(std::move(payment_namespace)),
      currencies_(std::move(currencies)),
      steps_(clock, monotonic, {cover, provider_deduplicates_by_key, settle}, metrics) {}

Payments::ParseResult Payments::Parse(const std::string& body, bool judge) const {
  // The parsed body lives on the stack (a usual one fits): everything kept from it is copied out.
  unsigned char storage[4096];
  json::monotonic_resource arena(storage, sizeof storage);
  boost::system::error_code ec;
  json::value doc = json::parse(body, ec, &arena);
  if (ec) return MalformedJson{ec.message()};
  // What the fingerprint refuses of any JSON (duplicate member names, numbers or containers past
  // its limits) is malformed JSON here already, so the body is judged before the key is.
  if (judge) {
    if (auto canonical = Canonicalize(body, CanonicalRules{}); !canonical) {
      return MalformedJson{canonical.error().message};
    }
  }
  std::vector<http::FieldError> errors;
  auto fail = [&](std::string field, std::string message) {
    errors.push_back({std::move(field), std::move(message)});
  };
  const json::object* o = doc.if_object();
  if (o == nullptr) {
    fail("", "the body must be a JSON object");
    return errors;
  }
  PaymentRequest p;
  for (const auto& [name, value] : *o) {
    if (name != "merchant_order_no" && name != "amount" && name != "currency" &&
        name != "description" && name != "metadata" && name != "trace_id") {
      // An unknown member is named up to its first NUL character, as answers always have.
      fail(std::string(name.substr(0, name.find('\0'))), "unknown field");
    }
  }
  const json::value* order = o->if_contains("merchant_order_no");
  if (order == nullptr || !order->is_string() || !IsOrderNo(order->as_string())) {
    fail("merchant_order_no", "required: 1..64 characters of A-Z a-z 0-9 - _");
  } else {
    p.merchant_order_no = std::string(order->as_string());
  }
  const json::value* currency = o->if_contains("currency");
  if (currency == nullptr || !currency->is_string() ||
      std::find(currencies_.begin(), currencies_.end(), std::string(currency->as_string())) ==
          currencies_.end()) {
    std::string list;
    for (const auto& c : currencies_) list += (list.empty() ? "" : ", ") + c;
    fail("currency", "required: one of " + list);
  } else {
    p.currency = std::string(currency->as_string());
  }
  // The amount's text, exactly as sent: numbers are re-read from the body, never via double.
  const json::value* amount = o->if_contains("amount");
  std::optional<std::string> amount_text;
  const bool amount_is_string = amount != nullptr && amount->is_string();
  if (amount_is_string) {
    amount_text = std::string(amount->as_string());
  } else if (amount != nullptr && amount->is_number()) {
    CanonicalRules plain;
    auto text = CanonicalScalar(body, "amount", plain);
    if (text && *text) amount_text = std::move(**text);
  }
  if (!amount_text) {
    fail("amount", "required: a decimal number or a string holding one");
  } else if (!p.currency.empty()) {
    // A number may take any JSON spelling (1e2 is 100); a string must be a plain decimal.
    auto canonical = CanonicalDecimal(*amount_text);
    if (amount_is_string && !IsPlainDecimal(*amount_text)) {
      fail("amount",
           "a string amount must be a plain decimal: digits, optionally a point and "
           "digits (\"100.00\"), without sign, exponent or spaces");
    } else if (!canonical) {
      fail("amount", "must be a decimal number or a string holding one");
    } else if (auto why = ToMinor(*canonical, MinorDigits(p.currency), &p.amount_minor)) {
      fail("amount", *why);
    }
  }
  if (const json::value* d = o->if_contains("description");
      d != nullptr && (!d->is_string() || d->as_string().size() > 256)) {
    fail("description", "must be a string of at most 256 characters");
  }
  if (const json::value* m = o->if_contains("metadata");
      m != nullptr && (!m->is_object() || m->as_object().size() > 50)) {
    fail("metadata", "must be an object with at most 50 members");
  }
  if (!errors.empty()) return errors;
  return p;
}

std::optional<http::Response> Payments::Validate(const http::Request& request, const Principal&,
                                                 bool canonical) {
  if (auto refused = RefuseUnlessJson(request)) return refused;
  // A body that canonicalised under the route's rules (PaymentsPolicy: those of any JSON, and
  // stricter) needs no second judging; one that did not is judged here, so that what any JSON
  // refuses answers as malformed and what only the rules refuse (the amount) as a field.
  ParseResult parsed = Parse(request.body, /*judge=*/!canonical);
  if (auto* malformed = std::get_if<MalformedJson>(&parsed)) {
    return http::Problem(http::ProblemKind::kMalformedJson,
                         "malformed JSON: " + malformed->message);
  }
  if (auto* errors = std::get_if<std::vector<http::FieldError>>(&parsed)) {
    return http::Problem(http::ProblemKind::kValidationFailed, "the request body failed validation",
                         {.errors = std::move(*errors)});
  }
  return std::nullopt;
}

Status Payments::OnClaim(StoreTxn& txn, const Record& record, const http::Request& request,
                         const Principal& principal) {
  // A key that holds its order keeps it: ids are fixed once. A key whose attempt was abandoned,
  // or that answers from another key's payment, decides again who holds the order.
  const std::string_view point = record.recovery_point;
  if (!record.resource_id.empty() && point != kAbandonedPoint && point != kExisting) return Ok();
  const ParseResult parsed = Parse(request.body);
  const PaymentRequest* p = std::get_if<PaymentRequest>(&parsed);
  // Validate accepted this body before the claim; Parse gives the same answer every time.
  if (p == nullptr) return MakeError(Errc::kInvalidArgument, "the request body failed validation");
  // Dated by the store's clock: a new operation's payment by its record's creation, which
  // Execute reads from its ticket without reading the row back; any other by this claim.
  const int64_t now =
      ToUnixMillis(record.resource_id.empty() ? record.created_at : record.observed_at);
  // One live payment per order (the unique index payments_live_order). This key takes the order:
  // a retry after its attempt was abandoned takes its own payment back; any other key inserts a
  // new payment. If another payment holds the order, the key answers from that one. Between a
  // refused write and the read of the holder, the holder can itself be abandoned: then the write
  // is tried again.
  std::string id = record.resource_id;
  if (point != kAbandonedPoint) {
    // The order's payments so far (abandoned ones included; business rows are never swept).
    IDEM_ASSIGN_OR_RETURN(auto made, txn.Exec("SELECT count(*) FROM payments WHERE tenant = ? AND "
                                              "merchant_order_no = ?",
                                              {principal.tenant, p->merchant_order_no}));
    id = PaymentIdFor(namespace_, principal.tenant, p->merchant_order_no,
                      made.empty() ? 0 : Integer(made[0][0]));
  }
  constexpr int kAttempts = 3;
  for (int attempt = 1; attempt <= kAttempts; ++attempt) {
    if (point == kAbandonedPoint) {
      auto revived = txn.Exec(
          "UPDATE payments SET status = 'pending', updated_at = ? "
          "WHERE id = ? AND status = 'abandoned'",
          {now, id});
      if (revived) return Ok();  // resumes at `abandoned`: the charge is looked up first
      if (revived.error().code != Errc::kAlreadyExists) return std::move(revived).error();
    } else {
      IDEM_ASSIGN_OR_RETURN(
          auto inserted,
          txn.Exec("INSERT INTO payments (id, tenant, merchant_order_no, amount_minor, currency, "
                   "status, created_at, updated_at) VALUES (?, ?, ?, ?, ?, 'pending', ?, ?) "
                   "ON CONFLICT (tenant, merchant_order_no) WHERE status <> 'abandoned' "
                   "DO NOTHING RETURNING id",
                   {id, principal.tenant, p->merchant_order_no, p->amount_minor, p->currency, now,
                    now}));
      if (!inserted.empty()) {
        IDEM_RETURN_IF_ERROR(txn.Advance(record.scope, record.lease, kClaimed, id));
        if (!record.resource_id.empty()) return Ok();
        // A new record whose first step is the charge: its covered advance is made here, in the
        // claim's transaction, not in one of its own (ChargeOnce sends without another).
        return txn.AdvanceCovered(record.scope, record.lease, kChargeSent,
                                  steps_.Rules().cover.call_timeout + steps_.Rules().cover.margin);
      }
    }
    IDEM_ASSIGN_OR_RETURN(auto holder, txn.Exec("SELECT id FROM payments WHERE tenant = ? AND "
                                                "merchant_order_no = ? AND status <> 'abandoned'",
                                                {principal.tenant, p->merchant_order_no}));
    if (!holder.empty()) {
      return txn.Advance(record.scope, record.lease, kExisting, Text(holder[0][0]));
    }
  }
  return MakeError(Errc::kUnavailable, "the merchant order keeps changing hands; retry");
}

Result<std::optional<Payment>> Payments::Load(std::string_view id, std::string_view tenant) {
  IDEM_ASSIGN_OR_RETURN(
      auto rows, store_.Query("SELECT id, merchant_order_no, amount_minor, currency, status, "
                              "provider_charge_id, created_at FROM payments "
                              "WHERE id = ? AND tenant = ?",
                              {std::string(id), std::string(tenant)}));
  if (rows.empty()) return std::optional<Payment>();
  const SqlRow& r = rows[0];
  IDEM_ASSIGN_OR_RETURN(PaymentStatus status, ParsePaymentStatus(Text(r[4])));
  return std::optional<Payment>(Payment{Text(r[0]), Text(r[1]), Integer(r[2]), Text(r[3]), status,
                                        Text(r[5]), Integer(r[6])});
}

http::Async<Execution> Payments::Execute(Ticket& ticket, const http::Request& request,
                                         const Principal& principal, Engine& engine,
                                         Heartbeat& heartbeat) {
  // The server put idemd's own span in the request's traceparent (http::ContinueTrace).
  std::string traceparent(request.headers.Get("traceparent").value_or(""));
  Payment payment;
  if (ChargeSteps::ClaimedAfresh(ticket)) {
    // The claim has just inserted this payment from this very body (OnClaim), pending and
    // dated by the record's creation: it is known here, and the charge needs no read of it
    // (a wait in the pool's queue, behind the claims and completions).
    ParseResult parsed = Parse(request.body);
    if (auto* p = std::get_if<PaymentRequest>(&parsed)) {
      payment = Payment{.id = ticket.record.resource_id,
                        .merchant_order_no = std::move(p->merchant_order_no),
                        .amount_minor = p->amount_minor,
                        .currency = std::move(p->currency),
                        .status = PaymentStatus::kPending,
                        .provider_charge_id = {},
                        .created_at_ms = ToUnixMillis(ticket.record.created_at)};
      co_return co_await ChargeOnce(ticket, std::move(payment), engine, heartbeat,
                                    std::move(traceparent));
    }
  }
  std::optional<Execution> answered;
  co_await pool_.Run([&] {
    // Only a key that answers from another key's payment compares its request with that one.
    std::optional<PaymentRequest> asked;
    if (ticket.record.recovery_point == kExisting) {
      ParseResult parsed = Parse(request.body);
      if (auto* p = std::get_if<PaymentRequest>(&parsed)) asked = std::move(*p);
    }
    answered =
        steps_.Prepared(ticket, Load(ticket.record.resource_id, principal.tenant), asked, &payment);
  });
  if (answered) co_return std::move(*answered);
  co_return co_await ChargeOnce(ticket, std::move(payment), engine, heartbeat,
                                std::move(traceparent));
}

http::Async<Execution> Payments::ChargeOnce(Ticket& ticket, Payment payment, Engine& engine,
                                            Heartbeat& heartbeat, std::string traceparent) {
  if (ChargeSteps::LooksUpFirst(ticket)) {
    // Before each call to the provider the lease must still be held: after a failed renewal it
    // may have run out, or belong to another executor already. Stop; the next attempt resolves
    // it.
    if (Status held = co_await pool_.Call([&] { return heartbeat.Check(); }); !held) {
      co_return Execution::Unknown(held.error());
    }
    auto found = co_await provider_.FindCharge(payment.id, traceparent);
    if (auto answered = steps_.Found(ticket, payment, std::move(found))) {
      co_return std::move(*answered);
    }
  }
  std::optional<Execution> stopped;
  // A fresh claim was advanced past the send in its own transaction (OnClaim), no earlier than
  // claim_began: the margin is counted from there. While that cover is fresh and nothing else
  // must be done first, the send goes from this thread, without waiting in the pool's queue
  // behind the claims and completions (whose wait would eat the margin and make the advance
  // again: a third write, just when the store is behind).
  const bool covered = ChargeSteps::ClaimedAfresh(ticket);
  SteadyTime advanced = ticket.claim_began;
  if (!steps_.SendsUnderTheClaimsCover(covered, advanced, heartbeat.CheckIfNothingDue())) {
    co_await pool_.Run([&] {
      stopped = steps_.BeforeSend(ticket, payment, engine, heartbeat, covered, &advanced);
    });
    if (stopped) co_return std::move(*stopped);
  }
  // The charge leaves within the margin after the covered advance or not at all (then it is
  // kUnavailable, nothing sent): the lease covers the call's timeout from then.
  const std::string amount = FormatAmount(payment.amount_minor, MinorDigits(payment.currency));
  auto charged = co_await provider_.CreateCharge(payment.id, amount, payment.currency,
                                                 steps_.SendWithin(advanced), traceparent);
  Status after = Ok();
  if (FailpointsArmed()) {  // a stall must not block this I/O thread
    after = co_await pool_.Call([] { return IDEM_FAILPOINT("after_provider_charge"); });
  }
  co_return steps_.AfterSend(ticket, std::move(payment), std::move(after), std::move(charged));
}

Execution Payments::TakeOver(Ticket& ticket, Engine&) {
  const auto loaded = Load(ticket.record.resource_id, ticket.record.tenant);
  if (auto answered = steps_.TakeOverLoaded(ticket, loaded)) return std::move(*answered);
  // On the takeover loop's thread: a private event loop for the one call.
  auto found = http::RunSync(provider_.FindCharge((*loaded)->id, ""));
  return steps_.TakeOverFound(ticket, **loaded, std::move(found));
}

http::Response Payments::Get(std::string_view id, const Principal& principal) {
  auto loaded = Load(id, principal.tenant);
  if (!loaded) return http::ProblemFor(loaded.error());
  if (!*loaded) return http::Problem(http::ProblemKind::kNotFound, "no such payment");
  // Extra charges the reconciliation of the books refunded: shown only when there are some, so
  // the body of a payment without any is the body its POST answered.
  auto refunds = store_.Query(
      "SELECT charge_id, refund_id, refunded_amount FROM reconcile_findings WHERE payment_id = ? "
      "AND class = 'duplicate' AND action = 'refunded' ORDER BY found_at, charge_id",
      {std::string(id)});
  if (!refunds) return http::ProblemFor(refunds.error());
  std::string body = PaymentBody(**loaded);
  if (!refunds->empty()) {
    json::value doc = json::parse(body);
    json::array list;
    for (const SqlRow& row : *refunds) {
      list.push_back(json::object{
          {"charge", Text(row[0])}, {"refund", Text(row[1])}, {"amount", Text(row[2])}});
    }
    doc.as_object()["refunded_duplicates"] = std::move(list);
    body = json::serialize(doc);
  }
  http::Response r{200, {}, std::move(body)};
  r.headers.Set("Content-Type", "application/json");
  return r;
}

http::Response Payments::Events(std::string_view id, const Principal& principal, bool replay) {
  auto loaded = Load(id, principal.tenant);
  if (!loaded) return http::ProblemFor(loaded.error());
  if (!*loaded) return http::Problem(http::ProblemKind::kNotFound, "no such payment");
  json::object body{{"payment", (*loaded)->id}};
  if (replay) {
    auto set_back = ReplayPaymentEvents(store_, (*loaded)->id);
    if (!set_back) return http::ProblemFor(set_back.error());
    body["replayed"] = *set_back;
  }
  auto events = OutboxEventsOf(store_, (*loaded)->id);
  if (!events) return http::ProblemFor(events.error());
  json::array list;
  for (const OutboxEvent& e : *events) list.push_back(EventJson(e));
  body["events"] = std::move(list);
  http::Response r{replay ? 202 : 200, {}, json::serialize(body)};
  r.headers.Set("Content-Type", "application/json");
  return r;
}

}  // namespace idem::idemd
