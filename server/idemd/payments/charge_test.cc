// server/idemd/payments/charge_test.cc — the steps of a charge, driven without a store, a
// provider or an event loop: what each answer decides.
#include "server/idemd/payments/charge.h"

#include <gtest/gtest.h>

#include "idem/failpoint.h"
#include "server/idemd/payments/table.h"
#include "testing/fakes.h"

namespace idem::idemd {
namespace {

constexpr Millis kSettle{3000};

class ChargeStepsTest : public ::testing::Test {
 protected:
  ChargeSteps Steps(bool deduplicates = false) {
    return ChargeSteps(clock_, monotonic_,
                       {.cover = {Millis(5000), Millis(500)},
                        .provider_deduplicates_by_key = deduplicates,
                        .settle = kSettle});
  }
  // A ticket resumed at `point` whose last send was `sent_ago` before the store read it.
  static Ticket Resumed(std::string_view point, Millis sent_ago,
                        RecordState from = RecordState::kProcessing) {
    Ticket t;
    t.resumed = true;
    t.resumed_from = from;
    t.record.recovery_point = std::string(point);
    t.record.resource_id = "pay_1";
    t.record.observed_at = FromUnixMillis(1'800'000'010'000);
    t.record.sent_at = t.record.observed_at - sent_ago;
    t.record.updated_at = t.record.observed_at;
    t.record.expires_at = t.record.observed_at + Millis(86'400'000);
    return t;
  }
  static Payment Pending() {
    return {"pay_1", "order-1", 1050, "USD", PaymentStatus::kPending, "", 0};
  }
  // What a lookup by the payment's reference finds.
  static std::optional<Charge> ChargeOf(std::string status, std::string amount = "10.50") {
    return Charge{"ch_1", "pay_1", std::move(amount), "USD", std::move(status), 0, ""};
  }

  testing::FakeClock clock_;
  testing::FakeMonotonicClock monotonic_;
};

TEST(PaymentStatus, NamesRoundTripAndAForeignSpellingIsDataLoss) {
  for (PaymentStatus s : {PaymentStatus::kPending, PaymentStatus::kSucceeded,
                          PaymentStatus::kDeclined, PaymentStatus::kAbandoned}) {
    EXPECT_EQ(*ParsePaymentStatus(PaymentStatusName(s)), s);
  }
  EXPECT_EQ(PaymentStatusName(PaymentStatus::kSucceeded), "succeeded");
  EXPECT_EQ(ParsePaymentStatus("refunded").error().code, Errc::kDataLoss);
  EXPECT_EQ(ParsePaymentStatus("Pending").error().code, Errc::kDataLoss);
}

// A new payment's charge goes at once, without the pool, exactly while its claim's cover is at
// most half the margin old, the heartbeat holds the lease with nothing due, and no failpoint is
// armed; anything else is for BeforeSend on the pool. Counted as the claim's cover when it goes.
TEST_F(ChargeStepsTest, AChargeGoesAtOnceOnlyUnderAFreshClaimCoverWithNothingDue) {
  Metrics metrics;
  const ChargeSteps steps(clock_, monotonic_, {.cover = {Millis(5000), Millis(500)}}, &metrics);
  const std::optional<Status> held = Ok();
  const SteadyTime advanced = monotonic_.Now();
  EXPECT_FALSE(steps.SendsUnderTheClaimsCover(false, advanced, held)) << "a resumed attempt";
  EXPECT_FALSE(steps.SendsUnderTheClaimsCover(true, advanced, std::nullopt)) << "renewal due";
  EXPECT_FALSE(steps.SendsUnderTheClaimsCover(true, advanced,
                                              Status(MakeError(Errc::kFenced, "taken over"))))
      << "a lost lease";
  monotonic_.Advance(Millis(250));
  EXPECT_TRUE(steps.SendsUnderTheClaimsCover(true, advanced, held)) << "half the margin";
#if !defined(IDEM_NO_FAILPOINTS)
  ASSERT_TRUE(ArmFailpoints("after_charge_sent=error").has_value());
  const bool armed = steps.SendsUnderTheClaimsCover(true, advanced, held);
  ClearFailpoints();
  EXPECT_FALSE(armed) << "an armed failpoint must be passed on the pool";
#endif
  monotonic_.Advance(Millis(1));
  EXPECT_FALSE(steps.SendsUnderTheClaimsCover(true, advanced, held)) << "past half the margin";
  EXPECT_NE(metrics.Render().find("idem_charge_covers_total{cover=\"claim\"} 1\n"),
            std::string::npos)
      << metrics.Render();
}

TEST_F(ChargeStepsTest, AnUndeclared5xxAfterTheSendIsAnUnknownOutcomeNotAFailure) {
  const Execution e = Steps().AfterSend(Resumed(kChargeSent, Millis(0)), Pending(), Ok(),
                                        ChargeResult::Unknown("502 from the provider"));
  EXPECT_TRUE(e.outcome_unknown) << "the provider may have charged: the record stays PROCESSING";
  EXPECT_FALSE(e.state.has_value());
  EXPECT_FALSE(e.business) << "nothing is written to the payment";
  EXPECT_EQ(e.response.status, 503);
}

TEST_F(ChargeStepsTest, OnlyAChargeThatNeverLeftAbandonsTheAttempt) {
  const ChargeSteps steps = Steps();
  Ticket fresh = Resumed(kChargeSent, Millis(0));  // a new key's claim, advanced past the send
  fresh.resumed = false;
  const Execution unsent =
      steps.AfterSend(fresh, Pending(), Ok(), MakeError(Errc::kUnavailable, "refused"));
  EXPECT_FALSE(unsent.outcome_unknown);
  EXPECT_EQ(unsent.state, RecordState::kFailedRetryable);
  EXPECT_EQ(unsent.recovery_point, kAbandonedPoint);
  EXPECT_TRUE(unsent.business) << "the payment row releases its order";
  const Execution timed_out = steps.AfterSend(Resumed(kChargeSent, Millis(0)), Pending(), Ok(),
                                              MakeError(Errc::kDeadlineExceeded, "timeout"));
  EXPECT_TRUE(timed_out.outcome_unknown);
  EXPECT_EQ(timed_out.response.status, 504);
}

// Found by the simulator (seed 9778): with a provider that deduplicates by key, a retry after an
// unknown outcome sends again at once; that send never left, and the attempt was abandoned,
// releasing the order, while the first send was still to land; another key's payment of the order
// was charged too. The provider's deduplication covers this payment's reference only: the order
// stays held until the earlier send has settled.
TEST_F(ChargeStepsTest, AnOrderStaysHeldWhileAnEarlierSendMayLandWhateverTheProviderDeduplicates) {
  for (const bool deduplicates : {false, true}) {
    const ChargeSteps steps = Steps(deduplicates);
    const Execution unsent = steps.AfterSend(Resumed(kChargeSent, Millis(1000)), Pending(), Ok(),
                                             MakeError(Errc::kUnavailable, "refused"));
    EXPECT_EQ(unsent.state, RecordState::kFailedRetryable) << deduplicates;
    EXPECT_EQ(unsent.recovery_point, kChargeSent) << "looked up again by the next attempt";
    EXPECT_FALSE(unsent.business) << "the payment keeps its order";
    EXPECT_EQ(unsent.response.status, 503);
    EXPECT_EQ(unsent.response.body.find("nothing was charged"), std::string::npos)
        << "the earlier attempt may have charged: " << unsent.response.body;
    const Execution released = steps.AfterSend(Resumed(kChargeSent, kSettle), Pending(), Ok(),
                                               MakeError(Errc::kUnavailable, "refused"));
    EXPECT_EQ(released.recovery_point, kAbandonedPoint) << "settled: nothing can land any more";
    const Execution held =
        steps.TakeOverFound(Resumed(kChargeSent, Millis(1000), RecordState::kFailedRetryable),
                            Pending(), std::optional<Charge>());
    EXPECT_EQ(held.settling_for, Millis(2000)) << "the takeover loop never releases it earlier";
  }
}

TEST_F(ChargeStepsTest, NothingFoundHoldsTheSendUntilItHasSettled) {
  const ChargeSteps steps = Steps();
  const std::optional<Execution> early =
      steps.Found(Resumed(kChargeSent, Millis(1000)), Pending(), std::optional<Charge>());
  ASSERT_TRUE(early.has_value());
  EXPECT_EQ(early->settling_for, Millis(2000)) << "the window counts from sent_at";
  EXPECT_FALSE(steps.Found(Resumed(kChargeSent, kSettle), Pending(), std::optional<Charge>()))
      << "settled and nothing found: the charge is sent";
  EXPECT_FALSE(Steps(/*deduplicates=*/true)
                   .Found(Resumed(kChargeSent, Millis(1000)), Pending(), std::optional<Charge>()))
      << "a provider that deduplicates by reference gets the charge again at once";
  EXPECT_FALSE(
      steps.Found(Resumed(kAbandonedPoint, Millis(1000)), Pending(), std::optional<Charge>()))
      << "an abandoned attempt sent nothing to wait for";
}

TEST_F(ChargeStepsTest, AFoundChargeCountsOnlyWhenItIsThisPaymentsOwn) {
  const ChargeSteps steps = Steps();
  const Ticket ticket = Resumed(kChargeSent, Millis(0));
  const std::optional<Execution> ours = steps.Found(ticket, Pending(), ChargeOf("succeeded"));
  ASSERT_TRUE(ours.has_value());
  EXPECT_EQ(ours->response.status, 201);
  EXPECT_TRUE(ours->business);
  const std::optional<Execution> other =
      steps.Found(ticket, Pending(), ChargeOf("succeeded", "99.00"));
  ASSERT_TRUE(other.has_value());
  EXPECT_TRUE(other->outcome_unknown) << "another amount is never success, nor final";
  EXPECT_EQ(other->response.status, 500);
  const std::optional<Execution> declined = steps.Found(ticket, Pending(), ChargeOf("declined"));
  ASSERT_TRUE(declined.has_value());
  EXPECT_EQ(declined->response.status, 402);
  const std::optional<Execution> unasked =
      steps.Found(ticket, Pending(), MakeError(Errc::kUnavailable, "down"));
  ASSERT_TRUE(unasked.has_value());
  EXPECT_TRUE(unasked->outcome_unknown) << "a lookup that failed proves nothing";
}

TEST_F(ChargeStepsTest, AKeyAnsweringFromAnotherKeysPaymentComparesTheRequest) {
  const ChargeSteps steps = Steps();
  const Ticket ticket = Resumed(kExisting, Millis(0));
  Payment paid = Pending();
  paid.status = PaymentStatus::kSucceeded;
  Payment out;
  const PaymentRequest same{"order-1", 1050, "USD"};
  const std::optional<Execution> replayed = steps.Prepared(ticket, std::optional(paid), same, &out);
  ASSERT_TRUE(replayed.has_value());
  EXPECT_EQ(replayed->response.status, 200);
  const PaymentRequest more{"order-1", 2000, "USD"};
  const std::optional<Execution> conflict = steps.Prepared(ticket, std::optional(paid), more, &out);
  ASSERT_TRUE(conflict.has_value());
  EXPECT_EQ(conflict->response.status, 409);
  EXPECT_FALSE(conflict->state.has_value()) << "final, as the policy classifies 409";
  const std::optional<Execution> pending =
      steps.Prepared(ticket, std::optional(Pending()), same, &out);
  ASSERT_TRUE(pending.has_value());
  EXPECT_EQ(pending->state, RecordState::kFailedRetryable);
  EXPECT_FALSE(
      steps.Prepared(Resumed(kClaimed, Millis(0)), std::optional(Pending()), std::nullopt, &out))
      << "its own pending payment is charged";
  EXPECT_EQ(out.id, "pay_1");
}

TEST_F(ChargeStepsTest, TheReconcilerReleasesAnOrderOnlyOnceTheSendHasSettledUnderAnEndedLease) {
  const ChargeSteps steps = Steps();
  const Execution held =
      steps.TakeOverFound(Resumed(kChargeSent, Millis(1000)), Pending(), std::optional<Charge>());
  EXPECT_EQ(held.settling_for, Millis(2000));
  const Execution crashed =
      steps.TakeOverFound(Resumed(kChargeSent, kSettle), Pending(), std::optional<Charge>());
  EXPECT_EQ(crashed.state, RecordState::kFailedRetryable);
  EXPECT_TRUE(crashed.recovery_point.empty()) << "stays at charge_sent: looked up again";
  const Execution retryable =
      steps.TakeOverFound(Resumed(kChargeSent, kSettle, RecordState::kFailedRetryable), Pending(),
                          std::optional<Charge>());
  EXPECT_EQ(retryable.recovery_point, kAbandonedPoint);
  EXPECT_FALSE(steps.TakeOverLoaded(Resumed(kChargeSent, Millis(0)), std::optional(Pending())))
      << "at charge_sent the charge is looked up";
}

}  // namespace
}  // namespace idem::idemd
