// bench/loadgen/check_test.cc — the exactly-once check passes a clean run and fails each way
// exactly-once can break: a duplicate or missing charge, a charge for an intent that never
// succeeded, two payment ids for one intent, one id for two intents, a second execution.
#include "bench/loadgen/check.h"

#include <gtest/gtest.h>

namespace idem::bench {
namespace {

IntentRecord Succeeded(const std::string& key, const std::string& payment_id) {
  IntentRecord in;
  in.key = key;
  in.sent = 2;
  in.answered = 2;
  in.successes = 2;
  in.executions = 1;
  in.payment_id = payment_id;
  in.last_status = 201;
  return in;
}

IntentRecord Failed(const std::string& key, int status) {
  IntentRecord in;
  in.key = key;
  in.sent = 1;
  in.answered = status == 0 ? 0 : 1;
  in.last_status = status;
  return in;
}

class CheckTest : public ::testing::Test {
 protected:
  std::vector<IntentRecord> intents_{Succeeded("k-1", "pay_1"), Succeeded("k-2", "pay_2"),
                                     Failed("k-3", 504)};
  // Someone else's charges from before the run, one of them a duplicate: not this run's business.
  ChargeCounts before_{{"pay_old", 2}};
  ChargeCounts after_{{"pay_old", 2}, {"pay_1", 1}, {"pay_2", 1}};
};

TEST_F(CheckTest, ACleanRunPasses) {
  const CheckResult r = CheckExactlyOnce(intents_, before_, after_, 0);
  EXPECT_TRUE(r.pass) << (r.failures.empty() ? "" : r.failures.front());
  EXPECT_EQ(r.intents, 3u);
  EXPECT_EQ(r.succeeded, 2u);
  EXPECT_EQ(r.unresolved, 1u);  // the 504: no verdict, and no charge either
  EXPECT_EQ(r.charges_checked, 2u);
  EXPECT_TRUE(r.failures.empty());
}

TEST_F(CheckTest, ASecondChargeOfAPaymentFails) {
  after_["pay_2"] = 2;
  const CheckResult r = CheckExactlyOnce(intents_, before_, after_, 0);
  EXPECT_FALSE(r.pass);
  EXPECT_EQ(r.duplicate_charges, 1u);
  ASSERT_EQ(r.failures.size(), 1u);
  EXPECT_NE(r.failures[0].find("pay_2"), std::string::npos) << r.failures[0];
}

TEST_F(CheckTest, ASuccessWithoutAChargeFails) {
  after_.erase("pay_1");
  const CheckResult r = CheckExactlyOnce(intents_, before_, after_, 0);
  EXPECT_FALSE(r.pass);
  EXPECT_EQ(r.missing_charges, 1u);
}

TEST_F(CheckTest, AChargeNoSuccessNamesFails) {
  after_["pay_3"] = 1;  // e.g. the 504's payment, charged although its client never heard
  const CheckResult r = CheckExactlyOnce(intents_, before_, after_, 0);
  EXPECT_FALSE(r.pass);
  EXPECT_EQ(r.unexpected_charges, 1u);
  after_.erase("pay_3");
  after_["pay_old"] = 3;  // a new charge under an old reference counts too
  EXPECT_EQ(CheckExactlyOnce(intents_, before_, after_, 0).unexpected_charges, 1u);
}

TEST_F(CheckTest, AnIntentAnsweredWithTwoPaymentIdsFails) {
  intents_[0].other_payment_ids.push_back("pay_9");
  const CheckResult r = CheckExactlyOnce(intents_, before_, after_, 0);
  EXPECT_FALSE(r.pass);
  EXPECT_EQ(r.split_intents, 1u);
}

TEST_F(CheckTest, TwoIntentsAnsweredWithOnePaymentIdFail) {
  intents_[1].payment_id = "pay_1";
  after_.erase("pay_2");
  const CheckResult r = CheckExactlyOnce(intents_, before_, after_, 0);
  EXPECT_FALSE(r.pass);
  EXPECT_EQ(r.shared_payment_ids, 1u);
}

TEST_F(CheckTest, TwoExecutionsOrDifferingBodiesFail) {
  intents_[0].executions = 2;
  EXPECT_EQ(CheckExactlyOnce(intents_, before_, after_, 0).multiple_executions, 1u);
  intents_[0].executions = 1;
  intents_[1].body_mismatches = 1;
  const CheckResult r = CheckExactlyOnce(intents_, before_, after_, 0);
  EXPECT_FALSE(r.pass);
  EXPECT_EQ(r.body_mismatches, 1u);
}

TEST_F(CheckTest, RetriesThatWereNotReplaysFail) {
  const CheckResult r = CheckExactlyOnce(intents_, before_, after_, 3);
  EXPECT_FALSE(r.pass);
  EXPECT_EQ(r.replay_violations, 3u);
}

TEST_F(CheckTest, NothingSucceededIsNoPass) {
  const std::vector<IntentRecord> none{Failed("k-1", 503), Failed("k-2", 0)};
  const CheckResult r = CheckExactlyOnce(none, before_, before_, 0);
  EXPECT_FALSE(r.pass);
  EXPECT_EQ(r.unresolved, 2u);
}

TEST(ParseProviderStats, ReadsChargesByReference) {
  auto counts = ParseProviderStats(
      R"({"total":3,"charges_by_reference":{"pay_a":1,"pay_b":2},"refunds_by_charge":{}})");
  ASSERT_TRUE(counts.has_value()) << counts.error().message;
  EXPECT_EQ(counts->size(), 2u);
  EXPECT_EQ(counts->at("pay_b"), 2);
  EXPECT_FALSE(ParseProviderStats("{\"total\":3}").has_value());
  EXPECT_FALSE(ParseProviderStats("not json").has_value());
}

TEST(PaymentIdInBody, NamesTheIdOnlyForThisOrdersPayment) {
  const std::string body =
      R"({"id":"pay_0a1b","merchant_order_no":"lg-1","amount":"100.00","currency":"CNY"})";
  EXPECT_EQ(PaymentIdInBody(body, "lg-1"), std::optional<std::string>("pay_0a1b"));
  EXPECT_EQ(PaymentIdInBody(body, "lg-2"), std::nullopt);
  EXPECT_EQ(PaymentIdInBody(R"({"merchant_order_no":"lg-1"})", "lg-1"), std::nullopt);
  EXPECT_EQ(PaymentIdInBody("[]", "lg-1"), std::nullopt);
}

TEST(IntentsFile, RoundTrips) {
  IntentsFile file;
  file.provider_before = {{"pay_old", 1}};
  file.replay_violations = 4;
  file.intents = {Succeeded("k-1", "pay_1"), Failed("k-2", 409)};
  file.intents[0].other_payment_ids = {"pay_x"};
  file.intents[0].body_mismatches = 2;
  auto back = IntentsFromJson(IntentsToJson(file));
  ASSERT_TRUE(back.has_value()) << back.error().message;
  EXPECT_EQ(back->provider_before, file.provider_before);
  EXPECT_EQ(back->replay_violations, 4u);
  ASSERT_EQ(back->intents.size(), 2u);
  const IntentRecord& a = back->intents[0];
  EXPECT_EQ(a.key, "k-1");
  EXPECT_EQ(a.payment_id, "pay_1");
  EXPECT_EQ(a.other_payment_ids, std::vector<std::string>{"pay_x"});
  EXPECT_EQ(a.sent, 2u);
  EXPECT_EQ(a.successes, 2u);
  EXPECT_EQ(a.executions, 1u);
  EXPECT_EQ(a.body_mismatches, 2u);
  EXPECT_EQ(back->intents[1].last_status, 409);
  EXPECT_FALSE(back->intents[1].Final());
  EXPECT_FALSE(IntentsFromJson("{\"intents\":[]}").has_value());
}

}  // namespace
}  // namespace idem::bench
