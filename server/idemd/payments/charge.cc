// server/idemd/payments/charge.cc — the steps of a charge.
#include "server/idemd/payments/charge.h"

#include <boost/json.hpp>
#include <chrono>

#include "http/log.h"
#include "idem/canonical.h"
#include "idem/failpoint.h"
#include "server/idemd/payments/events.h"
#include "server/idemd/payments/table.h"
#include "server/idemd/problems.h"
#include "server/idemd/routes.h"

namespace idem::idemd {
namespace {

namespace json = boost::json;

// The takeover loop's answer for a record whose payment was never charged: retryable, so the next
// attempt with the key executes. The takeover loop stores only its status, never sends it.
http::Response NothingCharged(const Ticket& ticket) {
  return Problem(ProductProblem::kProviderUnavailable, "retry",
                 {.key_expires = ticket.record.expires_at});
}

// The answer of a takeover step that leaves the record as it is: nobody gets it.
Execution LookAgainLater() { return Execution::Unknown(http::Response{}); }

}  // namespace

http::Response PaymentCreated(const Payment& p, int status) {
  http::Response r{status, {}, PaymentBody(p)};
  r.headers.Set("Content-Type", "application/json");
  r.headers.Set("Location", PaymentPath(p.id));
  return r;
}

ChargeSteps::ChargeSteps(Clock& clock, MonotonicClock& monotonic, ChargeRules rules,
                         Metrics* metrics)
    : clock_(clock), monotonic_(monotonic), rules_(rules), metrics_(metrics) {}

std::optional<Execution> ChargeSteps::Prepared(const Ticket& ticket,
                                               Result<std::optional<Payment>> loaded,
                                               const std::optional<PaymentRequest>& asked,
                                               Payment* out) const {
  if (!loaded) return Execution::Unknown(loaded.error());
  if (!*loaded) {
    return Execution::Unknown(
        http::Problem(http::ProblemKind::kInternal, "the payment row is missing"));
  }
  Payment payment = std::move(**loaded);
  const Timestamp expires = ticket.record.expires_at;
  if (ticket.record.recovery_point == kExisting) {
    const bool same =
        asked && asked->amount_minor == payment.amount_minor && asked->currency == payment.currency;
    if (same && payment.status == PaymentStatus::kSucceeded) {
      return Execution::Answer(PaymentCreated(payment, 200));
    }
    // Pending under another key, or abandoned by it since this claim: the next retry decides
    // again who holds the order.
    if (same && (payment.status == PaymentStatus::kPending ||
                 payment.status == PaymentStatus::kAbandoned)) {
      return Execution::Retryable(Problem(ProductProblem::kOrderInProgress,
                                          "this merchant_order_no is being paid under "
                                          "another Idempotency-Key; retry later",
                                          {.key_expires = expires}));
    }
    return Execution::Answer(Problem(
        ProductProblem::kOrderConflict,
        same ? "this merchant_order_no already has a " +
                   std::string(PaymentStatusName(payment.status)) + " payment"
             : "this merchant_order_no was already paid with a different amount or currency",
        {.key_expires = expires}));
  }
  if (payment.status == PaymentStatus::kSucceeded) {
    // Completed by the takeover loop or an earlier attempt whose completion was lost.
    return Execution::Answer(PaymentCreated(payment, 201));
  }
  *out = std::move(payment);
  return std::nullopt;
}

bool ChargeSteps::ClaimedAfresh(const Ticket& ticket) {
  return !ticket.resumed && ticket.record.recovery_point == kChargeSent;
}

bool ChargeSteps::LooksUpFirst(const Ticket& ticket) {
  const std::string& point = ticket.record.recovery_point;
  return ticket.resumed && (point == kChargeSent || point == kAbandonedPoint);
}

std::optional<Execution> ChargeSteps::Found(const Ticket& ticket, const Payment& payment,
                                            Result<std::optional<Charge>> found) const {
  if (!found) {
    return Execution::Unknown(Problem(ProductProblem::kProviderUnavailable,
                                      "the payment provider could not be asked about an "
                                      "earlier attempt; retry later",
                                      {.key_expires = ticket.record.expires_at}));
  }
  if (*found) return FromFoundCharge(ticket, payment, **found);
  // After a send whose outcome is unknown (a timeout, an undeclared 5xx, a lost connection, a
  // crash), nothing found proves nothing while the provider may still execute it (one that
  // ignores keys would then charge twice): nothing is sent until the send has settled. So
  // whatever state the record was resumed from: a failure answer is no proof of no work, and a
  // retryable record at charge_sent (one written by an earlier version for a 5xx, or one whose
  // send was stopped for a slow store) waits for the same window.
  if (ticket.record.recovery_point == kChargeSent) {
    if (auto left = Unsettled(ticket.record)) return Execution::Settling(*left);
  }
  return std::nullopt;
}

std::optional<Execution> ChargeSteps::BeforeSend(Ticket& ticket, const Payment& payment,
                                                 Engine& engine, Heartbeat& heartbeat, bool covered,
                                                 SteadyTime* advanced) const {
  if (auto held = heartbeat.Check(); !held) return Execution::Unknown(held.error());
  const ChargeCover& cover = rules_.cover;
  // The charge cannot be called back: it is sent only under a lease that outlasts the call. The
  // claim's cover serves while at most half the margin has gone since; after a longer wait (a
  // deep queue for the store's threads) the advance is made again here, which moves sent_at
  // later (nothing has been sent) and gives the send the whole margin.
  const bool made_again = covered && !CoverIsFresh(*advanced);
  if (made_again) covered = false;
  if (!covered) {
    *advanced = monotonic_.Now();
    if (auto advance =
            engine.AdvanceBeforeCall(ticket, kChargeSent, cover.call_timeout + cover.margin);
        !advance) {
      return Execution::Unknown(advance.error());
    }
  }
  // The advance proved that cover from the moment its statement ran. When the store answered
  // later than the margin (a slow commit, a pause of this process), the lease may end before the
  // call does, and a charge sent now may land after the settle window counted from sent_at, when
  // another executor's lookup finds nothing and charges again. Nothing has been sent: the attempt
  // ends retryable at charge_sent, and the retry looks the charge up first, then sends it. What
  // is left of the margin bounds the send itself (Provider::CreateCharge's send_within).
  if (monotonic_.Now() - *advanced > cover.margin && !IDEM_REVERTED("margin")) {
    CountCover(SendCover::kTooLate);
    // Nothing was sent by this attempt. Unless an earlier send may still land (a resumed one
    // that looked its charge up within the window, the provider deduplicating by key), the
    // attempt is abandoned, so a retry sends at once and the takeover loop has nothing to settle.
    return NothingSent(ticket, payment,
                       http::Problem(http::ProblemKind::kUnavailable,
                                     "the store answered too slowly to send the charge safely; "
                                     "nothing was charged; retry with the same key"));
  }
  if (auto fp = IDEM_FAILPOINT("after_charge_sent"); !fp) return Execution::Unknown(fp.error());
  CountCover(covered ? SendCover::kClaim : made_again ? SendCover::kMadeAgain : SendCover::kOwn);
  return std::nullopt;
}

bool ChargeSteps::SendsUnderTheClaimsCover(bool covered, SteadyTime advanced,
                                           const std::optional<Status>& held) const {
  if (!covered || FailpointsArmed() || !held || !held->has_value()) return false;
  if (!CoverIsFresh(advanced)) return false;
  CountCover(SendCover::kClaim);
  return true;
}

bool ChargeSteps::CoverIsFresh(SteadyTime advanced) const {
  return monotonic_.Now() - advanced <= rules_.cover.margin / 2 || IDEM_REVERTED("margin");
}

void ChargeSteps::CountCover(SendCover cover) const {
  if (metrics_ != nullptr) metrics_->CountChargeCover(cover);
}

Millis ChargeSteps::SendWithin(SteadyTime advanced) const {
  if (IDEM_REVERTED("margin")) return rules_.cover.margin;
  return rules_.cover.margin - std::chrono::duration_cast<Millis>(monotonic_.Now() - advanced);
}

Execution ChargeSteps::AfterSend(const Ticket& ticket, Payment payment, Status failpoint,
                                 Result<ChargeResult> charged) const {
  if (!failpoint) return Execution::Unknown(failpoint.error());
  if (charged && charged->declined) return Declined(ticket, payment);
  // The answer's charge counts as this payment's only after the checks a found charge passes.
  if (charged && charged->unknown.empty()) {
    return FromFoundCharge(ticket, std::move(payment), charged->charge);
  }
  const Timestamp expires = ticket.record.expires_at;
  if (charged && IDEM_REVERTED("unknown_5xx")) {
    return Abandoned(payment, Problem(ProductProblem::kProviderUnavailable,
                                      "the payment provider failed; retry with the same key",
                                      {.key_expires = expires}));
  }
  if (charged) {
    // A 5xx the provider does not declare as "nothing charged", or the connection lost after
    // the send: the provider may have charged, now or later (a front end's 502 while its back
    // end goes on). As unknown as a timeout: the record stays PROCESSING at charge_sent, and a
    // retry or the takeover loop looks the charge up, and sends it again only once the send has
    // settled and the lookup still finds nothing.
    http::Log(http::LogLevel::kWarn, "provider charge outcome unknown",
              {{"payment", payment.id}, {"why", charged->unknown}});
    return Execution::Unknown(Problem(
        ProductProblem::kProviderUnavailable,
        "the payment provider failed after the charge was sent, and may have charged; retry "
        "with the same key: the charge is looked up before anything is charged again",
        {.key_expires = expires}));
  }
  if (charged.error().code == Errc::kUnavailable) {
    // Nothing was charged: the request never left, or the provider answered a 5xx it declares
    // so ([provider] nothing_charged_statuses). The attempt is over, and its order is released
    // at once for any key; a retry of this key takes it back if it is still free.
    return NothingSent(ticket, payment,
                       Problem(ProductProblem::kProviderUnavailable,
                               "the payment provider is unavailable; nothing was charged; retry "
                               "with the same key",
                               {.key_expires = expires}));
  }
  return Execution::Unknown(Problem(ProductProblem::kProviderTimeout,
                                    "the payment provider did not answer in time; retry "
                                    "with the same key to learn the outcome",
                                    {.key_expires = expires}));
}

std::optional<Execution> ChargeSteps::TakeOverLoaded(
    const Ticket& ticket, const Result<std::optional<Payment>>& loaded) const {
  if (ticket.record.resource_id.empty() || (loaded && !*loaded)) {
    // Crashed before the payment existed: nothing was charged.
    return Execution::Retryable(NothingCharged(ticket));
  }
  if (!loaded) return LookAgainLater();
  const std::string& point = ticket.record.recovery_point;
  if (point == kExisting) {
    // The payment is another key's, which settles it.
    return Execution::Retryable(NothingCharged(ticket));
  }
  if (point != kChargeSent) {
    // Nothing was sent since the payment was made or taken back (claimed, abandoned): release
    // the order, so another key can pay it; a retry of this key takes it back.
    return Abandoned(**loaded, NothingCharged(ticket));
  }
  return std::nullopt;
}

Execution ChargeSteps::TakeOverFound(const Ticket& ticket, const Payment& payment,
                                     Result<std::optional<Charge>> found) const {
  if (!found) return LookAgainLater();
  if (*found) return FromFoundCharge(ticket, payment, **found);
  // Within the settle window nothing found proves nothing, whatever state the record was in: it
  // stays PROCESSING at charge_sent, held until the send has settled, when the next pass looks
  // again.
  // The takeover loop never sends: what it may do is release the order, which waits for the
  // window even when the provider deduplicates by key (EarlierSendMayLand).
  if (auto left = UntilSettled(ticket.record, rules_.settle)) return Execution::Settling(*left);
  if (ticket.resumed_from == RecordState::kFailedRetryable) {
    // A retryable failure whose lease, which covered the send, has ended: the send is settled
    // and the provider has no charge. The attempt is abandoned and the order released.
    return Abandoned(payment, NothingCharged(ticket));
  }
  // An expired or released lease (a timeout, a crash): the send may be more recent than a lease
  // ago, and the provider may still be executing it. Retryable, at charge_sent, under this
  // takeover's lease: a retry looks the charge up first, and the next pass after this lease
  // looks again and then releases the order.
  return Execution::Retryable(NothingCharged(ticket));
}

std::optional<Millis> ChargeSteps::Unsettled(const Record& record) const {
  if (rules_.provider_deduplicates_by_key) return std::nullopt;
  // By the store's clock (the one that wrote sent_at) when the record was claimed, which is
  // before the lookup that found nothing: a send counts as settled only if it had settled
  // before that lookup was made.
  return UntilSettled(record, rules_.settle);
}

Execution ChargeSteps::Succeeded(Payment payment, const Charge& charge) const {
  payment.status = PaymentStatus::kSucceeded;
  payment.provider_charge_id = charge.id;
  const int64_t now = ToUnixMillis(clock_.Now());
  return Execution::Answer(
      PaymentCreated(payment, 201),
      [payment, now, metrics = metrics_](StoreTxn& txn, const Record& record) -> Status {
        IDEM_RETURN_IF_ERROR(txn.Exec(
            "UPDATE payments SET status = 'succeeded', provider_charge_id = ?, updated_at = ? "
            "WHERE id = ?",
            {payment.provider_charge_id, now, payment.id}));
        return AddPaymentEvent(txn, kPaymentSucceeded, record.tenant, payment, FromUnixMillis(now),
                               metrics);
      });
}

Execution ChargeSteps::Declined(const Ticket& ticket, Payment payment) const {
  const int64_t now = ToUnixMillis(clock_.Now());
  payment.status = PaymentStatus::kDeclined;
  return Execution::Answer(
      Problem(ProductProblem::kPaymentDeclined, "the payment provider declined the charge",
              {.key_expires = ticket.record.expires_at}),
      [payment, now, metrics = metrics_](StoreTxn& txn, const Record& record) -> Status {
        IDEM_RETURN_IF_ERROR(
            txn.Exec("UPDATE payments SET status = 'declined', updated_at = ? WHERE id = ?",
                     {now, payment.id}));
        return AddPaymentEvent(txn, kPaymentFailed, record.tenant, payment, FromUnixMillis(now),
                               metrics);
      });
}

Execution ChargeSteps::Abandoned(const Payment& payment, http::Response response) const {
  const int64_t now = ToUnixMillis(clock_.Now());
  return Execution::Retryable(
      std::move(response), kAbandonedPoint,
      [id = payment.id, now](StoreTxn& txn, const Record&) -> Status {
        IDEM_RETURN_IF_ERROR(
            txn.Exec("UPDATE payments SET status = 'abandoned', updated_at = ? WHERE id = ? AND "
                     "status = 'pending'",
                     {now, id}));
        return Ok();
      });
}

bool ChargeSteps::EarlierSendMayLand(const Ticket& ticket) const {
  return ticket.resumed && ticket.record.recovery_point == kChargeSent &&
         UntilSettled(ticket.record, rules_.settle).has_value();
}

Execution ChargeSteps::NothingSent(const Ticket& ticket, const Payment& payment,
                                   http::Response response) const {
  if (EarlierSendMayLand(ticket)) {
    // Its caller must not read "nothing was charged": the earlier attempt may have charged.
    http::Response held = Problem(ProductProblem::kProviderUnavailable,
                                  "this attempt charged nothing, but an earlier attempt's charge "
                                  "may still land; retry with the same key to learn its outcome",
                                  {.key_expires = ticket.record.expires_at});
    held.status = response.status;
    return Execution::Retryable(std::move(held), kChargeSent);
  }
  return Abandoned(payment, std::move(response));
}

Execution ChargeSteps::FromFoundCharge(const Ticket& ticket, Payment payment,
                                       const Charge& charge) const {
  const auto charged = CanonicalDecimal(charge.amount);
  const auto owed =
      CanonicalDecimal(FormatAmount(payment.amount_minor, MinorDigits(payment.currency)));
  // A charge refunded, even in part, is no longer proof that the payment was made.
  const bool refunded = !charge.amount_refunded.empty() &&
                        AmountInMinorUnits(charge.amount_refunded, charge.currency) != 0;
  const bool ours = charge.reference == payment.id && charge.currency == payment.currency &&
                    charged && owed && *charged == *owed && !refunded;
  if (!ours) {
    // The provider holds a charge under this payment's reference that is not the charge this
    // payment asked for. It must never count as success, and charging again could take money a
    // second time. Nor is it made final: a final answer would be replayed for the key's whole
    // retention while nobody looks at it again. So the record stays PROCESSING at charge_sent,
    // the payment stays pending (its merchant order blocked), every retry and every takeover
    // pass looks again and answers this 500 without charging, and the log says so, until an
    // operator settles it (docs/idemd.md).
    http::Log(http::LogLevel::kError, "provider charge does not match its payment",
              {{"payment", payment.id}, {"charge", charge.id}});
    return Execution::Unknown(
        http::Problem(http::ProblemKind::kInternal,
                      "the payment provider reports a charge for this payment that does not "
                      "match it; the payment was not completed and is held for review"));
  }
  if (charge.status == "succeeded") return Succeeded(std::move(payment), charge);
  if (charge.status == "declined" || charge.status == "failed") return Declined(ticket, payment);
  // Not settled yet (e.g. pending): as unknown as a timeout; look again later.
  return Execution::Unknown(Problem(ProductProblem::kProviderTimeout,
                                    "the payment provider has not settled an earlier "
                                    "attempt yet; retry with the same key to learn the "
                                    "outcome",
                                    {.key_expires = ticket.record.expires_at}));
}

}  // namespace idem::idemd
