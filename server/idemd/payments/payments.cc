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

// The reconciler's answer for a record whose payment was never charged: retryable, so the next
// attempt with the key executes. The reconciler stores only its status, never sends it.
http::Response NothingCharged(const Ticket& ticket) {
  return http::Problem(http::ProblemKind::kProviderUnavailable, "retry",
                       {.key_expires = ticket.record.expires_at});
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
                   bool provider_deduplicates_by_key, Millis settle)
    : store_(store),
      pool_(pool),
      provider_(provider),
      clock_(clock),
      monotonic_(monotonic),
      namespace_(std::move(payment_namespace)),
      currencies_(std::move(currencies)),
      cover_(cover),
      provider_deduplicates_by_key_(provider_deduplicates_by_key),
      settle_(settle) {}

Payments::ParseResult Payments::Parse(const std::string& body) const {
  boost::system::error_code ec;
  json::value doc = json::parse(body, ec);
  if (ec) return MalformedJson{ec.message()};
  // What the fingerprint refuses of any JSON (duplicate member names, numbers or containers past
  // its limits) is malformed JSON here already, so the body is judged before the key is.
  if (auto canonical = Canonicalize(body, CanonicalRules{}); !canonical) {
    return MalformedJson{canonical.error().message};
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
  Parsed p;
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

std::optional<http::Response> Payments::Validate(const http::Request& request, const Principal&) {
  if (auto refused = RefuseUnlessJson(request)) return refused;
  ParseResult parsed = Parse(request.body);
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
  if (!record.resource_id.empty() && point != kAbandoned && point != kExisting) return Ok();
  const ParseResult parsed = Parse(request.body);
  const Parsed* p = std::get_if<Parsed>(&parsed);
  // Validate accepted this body before the claim; Parse gives the same answer every time.
  if (p == nullptr) return MakeError(Errc::kInvalidArgument, "the request body failed validation");
  const int64_t now = ToUnixMillis(clock_.Now());
  // One live payment per order (the unique index payments_live_order). This key takes the order:
  // a retry after its attempt was abandoned takes its own payment back; any other key inserts a
  // new payment. If another payment holds the order, the key answers from that one. Between a
  // refused write and the read of the holder, the holder can itself be abandoned: then the write
  // is tried again.
  std::string id = record.resource_id;
  if (point != kAbandoned) {
    // The order's payments so far (abandoned ones included; business rows are never swept).
    IDEM_ASSIGN_OR_RETURN(auto made, txn.Exec("SELECT count(*) FROM payments WHERE tenant = ? AND "
                                              "merchant_order_no = ?",
                                              {principal.tenant, p->merchant_order_no}));
    id = PaymentIdFor(namespace_, principal.tenant, p->merchant_order_no,
                      made.empty() ? 0 : Integer(made[0][0]));
  }
  constexpr int kAttempts = 3;
  for (int attempt = 1; attempt <= kAttempts; ++attempt) {
    if (point == kAbandoned) {
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
                                  cover_.call_timeout + cover_.margin);
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

Result<std::optional<Payments::Payment>> Payments::Load(std::string_view id,
                                                        std::string_view tenant) {
  IDEM_ASSIGN_OR_RETURN(
      auto rows, store_.Query("SELECT id, merchant_order_no, amount_minor, currency, status, "
                              "provider_charge_id, created_at FROM payments "
                              "WHERE id = ? AND tenant = ?",
                              {std::string(id), std::string(tenant)}));
  if (rows.empty()) return std::optional<Payment>();
  const SqlRow& r = rows[0];
  return std::optional<Payment>(Payment{Text(r[0]), Text(r[1]), Integer(r[2]), Text(r[3]),
                                        Text(r[4]), Text(r[5]), Integer(r[6])});
}

std::string Payments::Body(const Payment& p) const {
  json::object o;
  o["id"] = p.id;
  o["merchant_order_no"] = p.merchant_order_no;
  o["amount"] = FormatAmount(p.amount_minor, MinorDigits(p.currency));
  o["currency"] = p.currency;
  o["status"] = p.status;
  o["provider_charge_id"] =
      p.provider_charge_id.empty() ? json::value(nullptr) : json::value(p.provider_charge_id);
  o["created_at"] = http::Rfc3339(p.created_at_ms);
  return json::serialize(o);
}

http::Response Payments::Created(const Payment& p, int status) const {
  http::Response r{status, {}, Body(p)};
  r.headers.Set("Content-Type", "application/json");
  r.headers.Set("Location", PaymentPath(p.id));
  return r;
}

Execution Payments::Succeeded(Payment payment, const Charge& charge) {
  Execution e;
  payment.status = "succeeded";
  payment.provider_charge_id = charge.id;
  e.response = Created(payment, 201);
  const int64_t now = ToUnixMillis(clock_.Now());
  e.business = [id = payment.id, charge_id = charge.id, now](StoreTxn& txn,
                                                             const Record&) -> Status {
    IDEM_RETURN_IF_ERROR(
        txn.Exec("UPDATE payments SET status = 'succeeded', provider_charge_id = ?, updated_at = ? "
                 "WHERE id = ?",
                 {charge_id, now, id}));
    return Ok();
  };
  return e;
}

Execution Payments::Declined(const Ticket& ticket, const Payment& payment) {
  Execution e;
  e.response =
      http::Problem(http::ProblemKind::kPaymentDeclined, "the payment provider declined the charge",
                    {.key_expires = ticket.record.expires_at});
  const int64_t now = ToUnixMillis(clock_.Now());
  e.business = [id = payment.id, now](StoreTxn& txn, const Record&) -> Status {
    IDEM_RETURN_IF_ERROR(txn.Exec(
        "UPDATE payments SET status = 'declined', updated_at = ? WHERE id = ?", {now, id}));
    return Ok();
  };
  return e;
}

Execution Payments::Abandoned(const Payment& payment, http::Response response) {
  Execution e;
  e.response = std::move(response);
  e.state = RecordState::kFailedRetryable;
  e.recovery_point = std::string(kAbandoned);
  const int64_t now = ToUnixMillis(clock_.Now());
  e.business = [id = payment.id, now](StoreTxn& txn, const Record&) -> Status {
    IDEM_RETURN_IF_ERROR(
        txn.Exec("UPDATE payments SET status = 'abandoned', updated_at = ? WHERE id = ? AND "
                 "status = 'pending'",
                 {now, id}));
    return Ok();
  };
  return e;
}

Execution Payments::FromFoundCharge(const Ticket& ticket, Payment payment, const Charge& charge) {
  const auto charged = CanonicalDecimal(charge.amount);
  const auto owed =
      CanonicalDecimal(FormatAmount(payment.amount_minor, MinorDigits(payment.currency)));
  // A charge refunded, even in part, is no longer proof that the payment was made.
  const bool refunded = !charge.amount_refunded.empty() &&
                        AmountInMinorUnits(charge.amount_refunded, charge.currency) != 0;
  const bool ours = charge.reference == payment.id && charge.currency == payment.currency &&
                    charged && owed && *charged == *owed && !refunded;
  Execution e;
  if (!ours) {
    // The provider holds a charge under this payment's reference that is not the charge this
    // payment asked for. It must never count as success, and charging again could take money a
    // second time. Nor is it made final: a final answer would be replayed for the key's whole
    // retention while nobody looks at it again. So the record stays PROCESSING at charge_sent,
    // the payment stays pending (its merchant order blocked), every retry and every reconciler
    // pass looks again and answers this 500 without charging, and the log says so, until an
    // operator settles it (docs/idemd.md).
    http::Log(http::LogLevel::kError, "provider charge does not match its payment",
              {{"payment", payment.id}, {"charge", charge.id}});
    e.response =
        http::Problem(http::ProblemKind::kInternal,
                      "the payment provider reports a charge for this payment that does "
                      "not match it; the payment was not completed and is held for review");
    e.outcome_unknown = true;
    return e;
  }
  if (charge.status == "succeeded") return Succeeded(std::move(payment), charge);
  if (charge.status == "declined" || charge.status == "failed") return Declined(ticket, payment);
  // Not settled yet (e.g. pending): as unknown as a timeout; look again later.
  e.response = http::Problem(http::ProblemKind::kProviderTimeout,
                             "the payment provider has not settled an earlier attempt yet; retry "
                             "with the same key to learn the outcome",
                             {.key_expires = ticket.record.expires_at});
  e.outcome_unknown = true;
  return e;
}

std::optional<Millis> Payments::Unsettled(const Record& record) const {
  if (provider_deduplicates_by_key_) return std::nullopt;
  // A record advanced before sent_at existed has only updated_at, which is no earlier.
  const Timestamp sent = record.sent_at != Timestamp{} ? record.sent_at : record.updated_at;
  const Timestamp settled = sent + settle_;
  // By the store's clock (the one that wrote sent_at) when the record was claimed, which is
  // before the lookup that found nothing: a send counts as settled only if it had settled
  // before that lookup was made.
  const Timestamp now = record.observed_at;
  if (now >= settled) return std::nullopt;
  return std::chrono::duration_cast<Millis>(settled - now);
}

Execution Payments::Settling(Millis left) {
  Execution e;
  e.settling_for = left;
  e.outcome_unknown = true;
  return e;
}

http::Async<Execution> Payments::ChargeOnce(Ticket& ticket, Payment payment, Engine& engine,
                                            Heartbeat& heartbeat, std::string traceparent) {
  const std::string amount = FormatAmount(payment.amount_minor, MinorDigits(payment.currency));
  // Before each call to the provider the lease must still be held: after a failed renewal it
  // may have run out, or belong to another executor already. Stop; the next attempt resolves it.
  auto lease_lost = [](const Error& error) {
    Execution stopped;
    stopped.response = http::ProblemFor(error);
    stopped.outcome_unknown = true;
    return stopped;
  };
  // A resumed execution whose charge may have left asks the provider first (step 6); so does one
  // whose attempt was abandoned, in case that charge landed after all.
  if (ticket.resumed &&
      (ticket.record.recovery_point == kChargeSent || ticket.record.recovery_point == kAbandoned)) {
    if (Status held = co_await pool_.Call([&] { return heartbeat.Check(); }); !held) {
      co_return lease_lost(held.error());
    }
    auto found = co_await provider_.FindCharge(payment.id, traceparent);
    if (!found) {
      Execution e;
      e.response = http::Problem(http::ProblemKind::kProviderUnavailable,
                                 "the payment provider could not be asked about an earlier "
                                 "attempt; retry later",
                                 {.key_expires = ticket.record.expires_at});
      e.outcome_unknown = true;
      co_return e;
    }
    if (*found) co_return FromFoundCharge(ticket, std::move(payment), **found);
    // After a send whose outcome is unknown (a timeout, an undeclared 5xx, a lost connection,
    // a crash), nothing found proves nothing while the provider may still execute it (one that
    // ignores keys would then charge twice): nothing is sent until the send has settled. So
    // whatever state the record was resumed from: a failure answer is no proof of no work, and
    // a retryable record at charge_sent (one written by an earlier version for a 5xx, or one
    // whose send was stopped for a slow store) waits for the same window.
    if (ticket.record.recovery_point == kChargeSent) {
      if (auto left = Unsettled(ticket.record)) co_return Settling(*left);
    }
  }
  std::optional<Execution> stopped;
  // A fresh claim was advanced past the send in its own transaction (OnClaim), no earlier than
  // claim_began: the margin is counted from there.
  const bool covered = !ticket.resumed && ticket.record.recovery_point == kChargeSent;
  SteadyTime advanced = ticket.claim_began;
  co_await pool_.Run(
      [&] { stopped = BeforeSend(ticket, payment, engine, heartbeat, covered, &advanced); });
  if (stopped) co_return std::move(*stopped);
  // The charge leaves within the margin after the covered advance or not at all (then it is
  // kUnavailable, nothing sent): the lease covers the call's timeout from then.
  const SteadyTime sent = monotonic_.Now();
  const Millis send_within = cover_.margin - std::chrono::duration_cast<Millis>(sent - advanced);
  auto charged = co_await provider_.CreateCharge(payment.id, amount, payment.currency, send_within,
                                                 traceparent);
  Status after = Ok();
  if (FailpointsArmed()) {  // a stall must not block this I/O thread
    after = co_await pool_.Call([] { return IDEM_FAILPOINT("after_provider_charge"); });
  }
  co_return AfterSend(ticket, std::move(payment), std::move(after), std::move(charged));
}

std::optional<Execution> Payments::BeforeSend(Ticket& ticket, const Payment& payment,
                                              Engine& engine, Heartbeat& heartbeat, bool covered,
                                              SteadyTime* advanced) {
  Execution e;
  if (auto held = heartbeat.Check(); !held) {
    e.response = http::ProblemFor(held.error());
    e.outcome_unknown = true;
    return e;
  }
  // The charge cannot be called back: it is sent only under a lease that outlasts the call. The
  // claim's cover serves while at most half the margin has gone since; after a longer wait (a
  // deep queue for the store's threads) the advance is made again here, which moves sent_at
  // later (nothing has been sent) and gives the send the whole margin.
  if (covered && monotonic_.Now() - *advanced > cover_.margin / 2) covered = false;
  if (!covered) {
    *advanced = monotonic_.Now();
    if (auto advance =
            engine.AdvanceBeforeCall(ticket, kChargeSent, cover_.call_timeout + cover_.margin);
        !advance) {
      e.response = http::ProblemFor(advance.error());
      e.outcome_unknown = true;
      return e;
    }
  }
  const SteadyTime advancing = *advanced;
  // The advance proved that cover from the moment its statement ran. When the store answered
  // later than the margin (a slow commit, a pause of this process), the lease may end before the
  // call does, and a charge sent now may land after the settle window counted from sent_at, when
  // another executor's lookup finds nothing and charges again. Nothing has been sent: the attempt
  // ends retryable at charge_sent, and the retry looks the charge up first, then sends it. What
  // is left of the margin bounds the send itself (Provider::CreateCharge's send_within).
  if (monotonic_.Now() - advancing > cover_.margin) {
    // Nothing was sent by this attempt, and no earlier send is unsettled (a fresh claim has
    // none; a resumed one looked its charge up after the window): the attempt is abandoned, so
    // a retry sends at once and the reconciler has nothing to settle.
    return Abandoned(payment, http::Problem(http::ProblemKind::kUnavailable,
                                            "the store answered too slowly to send the charge "
                                            "safely; nothing was charged; retry with the same "
                                            "key"));
  }
  if (auto fp = IDEM_FAILPOINT("after_charge_sent"); !fp) {
    e.response = http::ProblemFor(fp.error());
    e.outcome_unknown = true;
    return e;
  }
  return std::nullopt;
}

Execution Payments::AfterSend(const Ticket& ticket, Payment payment, Status failpoint,
                              Result<ChargeResult> charged) {
  Execution e;
  if (!failpoint) {
    e.response = http::ProblemFor(failpoint.error());
    e.outcome_unknown = true;
    return e;
  }
  if (charged && charged->declined) return Declined(ticket, payment);
  // The answer's charge counts as this payment's only after the checks a found charge passes.
  if (charged && charged->unknown.empty()) {
    return FromFoundCharge(ticket, std::move(payment), charged->charge);
  }
  if (charged) {
    // A 5xx the provider does not declare as "nothing charged", or the connection lost after
    // the send: the provider may have charged, now or later (a front end's 502 while its back
    // end goes on). As unknown as a timeout: the record stays PROCESSING at charge_sent, and a
    // retry or the reconciler looks the charge up, and sends it again only once the send has
    // settled and the lookup still finds nothing.
    http::Log(http::LogLevel::kWarn, "provider charge outcome unknown",
              {{"payment", payment.id}, {"why", charged->unknown}});
    e.response = http::Problem(http::ProblemKind::kProviderUnavailable,
                               "the payment provider failed after the charge was sent, and may "
                               "have charged; retry with the same key: the charge is looked up "
                               "before anything is charged again",
                               {.key_expires = ticket.record.expires_at});
    e.outcome_unknown = true;
    return e;
  }
  if (charged.error().code == Errc::kUnavailable) {
    // Nothing was charged: the request never left, or the provider answered a 5xx it declares
    // so ([provider] nothing_charged_statuses). The attempt is over, and its order is released
    // at once for any key; a retry of this key takes it back if it is still free.
    return Abandoned(payment, http::Problem(http::ProblemKind::kProviderUnavailable,
                                            "the payment provider is unavailable; nothing was "
                                            "charged; retry with the same key",
                                            {.key_expires = ticket.record.expires_at}));
  }
  e.response = http::Problem(http::ProblemKind::kProviderTimeout,
                             "the payment provider did not answer in time; retry with the same "
                             "key to learn the outcome",
                             {.key_expires = ticket.record.expires_at});
  e.outcome_unknown = true;
  return e;
}

http::Async<Execution> Payments::Execute(Ticket& ticket, const http::Request& request,
                                         const Principal& principal, Engine& engine,
                                         Heartbeat& heartbeat) {
  std::optional<Execution> answered;
  Payment payment;
  co_await pool_.Run([&] { answered = Prepare(ticket, request, principal, &payment); });
  if (answered) co_return std::move(*answered);
  // The server put idemd's own span in the request's traceparent (http::ContinueTrace).
  const std::string traceparent(request.headers.Get("traceparent").value_or(""));
  co_return co_await ChargeOnce(ticket, std::move(payment), engine, heartbeat, traceparent);
}

std::optional<Execution> Payments::Prepare(const Ticket& ticket, const http::Request& request,
                                           const Principal& principal, Payment* out) {
  Execution e;
  auto loaded = Load(ticket.record.resource_id, principal.tenant);
  if (!loaded || !*loaded) {
    e.response = loaded ? http::Problem(http::ProblemKind::kInternal, "the payment row is missing")
                        : http::ProblemFor(loaded.error());
    e.outcome_unknown = true;
    return e;
  }
  Payment payment = std::move(**loaded);
  if (ticket.record.recovery_point == kExisting) {
    const ParseResult result = Parse(request.body);
    const Parsed* parsed = std::get_if<Parsed>(&result);
    const bool same = parsed != nullptr && parsed->amount_minor == payment.amount_minor &&
                      parsed->currency == payment.currency;
    if (same && payment.status == "succeeded") {
      e.response = Created(payment, 200);
      return e;
    }
    // Pending under another key, or abandoned by it since this claim: the next retry decides
    // again who holds the order.
    if (same && (payment.status == "pending" || payment.status == "abandoned")) {
      e.response = http::Problem(http::ProblemKind::kOrderInProgress,
                                 "this merchant_order_no is being paid under another "
                                 "Idempotency-Key; retry later",
                                 {.key_expires = ticket.record.expires_at});
      e.state = RecordState::kFailedRetryable;
      return e;
    }
    e.response = http::Problem(
        http::ProblemKind::kOrderConflict,
        same ? "this merchant_order_no already has a " + payment.status + " payment"
             : "this merchant_order_no was already paid with a different amount or currency",
        {.key_expires = ticket.record.expires_at});
    return e;
  }
  if (payment.status == "succeeded") {
    // Completed by the reconciler or an earlier attempt whose completion was lost.
    e.response = Created(payment, 201);
    return e;
  }
  *out = std::move(payment);
  return std::nullopt;
}

Execution Payments::Reconcile(Ticket& ticket, Engine&) {
  Execution e;
  auto loaded = Load(ticket.record.resource_id, ticket.record.tenant);
  if (ticket.record.resource_id.empty() || (loaded && !*loaded)) {
    // Crashed before the payment existed: nothing was charged.
    e.response = NothingCharged(ticket);
    e.state = RecordState::kFailedRetryable;
    return e;
  }
  if (!loaded) {
    e.outcome_unknown = true;
    return e;
  }
  Payment payment = std::move(**loaded);
  const std::string& point = ticket.record.recovery_point;
  if (point == kExisting) {
    // The payment is another key's, which settles it.
    e.response = NothingCharged(ticket);
    e.state = RecordState::kFailedRetryable;
    return e;
  }
  if (point != kChargeSent) {
    // Nothing was sent since the payment was made or taken back (claimed, abandoned): release
    // the order, so another key can pay it; a retry of this key takes it back.
    return Abandoned(payment, NothingCharged(ticket));
  }
  // On the reconciler's thread: a private event loop for the one call.
  auto found = http::RunSync(provider_.FindCharge(payment.id, ""));
  if (!found) {
    e.outcome_unknown = true;
    return e;
  }
  if (*found) return FromFoundCharge(ticket, std::move(payment), **found);
  // Within the settle window nothing found proves nothing, whatever state the record was in: it
  // stays PROCESSING at charge_sent, held until the send has settled, when the next pass looks
  // again.
  if (auto left = Unsettled(ticket.record)) return Settling(*left);
  if (ticket.resumed_from == RecordState::kFailedRetryable) {
    // A retryable failure whose lease, which covered the send, has ended: the send is settled
    // and the provider has no charge. The attempt is abandoned and the order released.
    return Abandoned(payment, NothingCharged(ticket));
  }
  // An expired or released lease (a timeout, a crash): the send may be more recent than a lease
  // ago, and the provider may still be executing it. Retryable, at charge_sent, under this
  // takeover's lease: a retry looks the charge up first, and the next pass after this lease
  // looks again and then releases the order.
  e.response = NothingCharged(ticket);
  e.state = RecordState::kFailedRetryable;
  return e;
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
  std::string body = Body(**loaded);
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

}  // namespace idem::idemd
