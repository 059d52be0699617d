// server/idemd/gateway/forward_test.cc — the steps of a gateway forward, driven without an
// upstream or an event loop: what each answer decides.
#include "server/idemd/gateway/forward.h"

#include <gtest/gtest.h>

namespace idem::idemd {
namespace {

constexpr Millis kTimeout{2000};
constexpr Millis kMargin{500};

class ForwardStepsTest : public ::testing::Test {
 protected:
  ForwardStepsTest() {
    route_.name = "orders";
    route_.timeout = kTimeout;
    route_.forward_key_header = "idempotency-key";
    route_.status_unknown_max = Millis(60'000);
    route_.late_execution = Millis(0);
  }
  ForwardSteps Steps() { return ForwardSteps(route_, metrics_, kMargin); }
  // A ticket resumed at `point` whose last forward left `sent_ago` before the store read it.
  static Ticket Resumed(std::string_view point, Millis sent_ago) {
    Ticket t;
    t.resumed = true;
    t.record.recovery_point = std::string(point);
    t.record.resource_id = std::string(64, 'a');
    t.record.observed_at = FromUnixMillis(1'800'000'100'000);
    t.record.sent_at = t.record.observed_at - sent_ago;
    t.record.updated_at = t.record.observed_at;
    t.record.expires_at = t.record.observed_at + Millis(86'400'000);
    return t;
  }

  GatewayRoute route_;
  Metrics metrics_;
};

TEST_F(ForwardStepsTest, AnUnknownForwardIsAskedAboutHeldOrSentAgainAsTheRouteDeclares) {
  const Millis settled = kTimeout + kMargin;
  EXPECT_EQ(Steps().Resuming(Resumed("", Millis(0))), Resume::kForward);
  EXPECT_EQ(Steps().Resuming(Resumed(kSettled, Millis(0))), Resume::kForward);
  EXPECT_EQ(Steps().Resuming(Resumed(kForwarded, settled)), Resume::kHold)
      << "no status URL, and the upstream does not deduplicate";
  route_.upstream_deduplicates = true;
  EXPECT_EQ(Steps().Resuming(Resumed(kForwarded, Millis(0))), Resume::kForward);
  route_.status_path = "/v1/status/{key}";
  EXPECT_EQ(Steps().Resuming(Resumed(kForwarded, Millis(100))), Resume::kWait)
      << "the earlier forward may still be executing";
  EXPECT_EQ(Steps().Unsettled(Resumed(kForwarded, Millis(100)).record), settled - Millis(100));
  EXPECT_EQ(Steps().Resuming(Resumed(kForwarded, settled)), Resume::kAsk);
}

// An upstream that may execute a forward after it timed out (late_execution) is asked only after
// that too: before, its "404, never ran" proves nothing.
TEST_F(ForwardStepsTest, TheStatusURLIsAskedOnlyOnceALateExecutionCanNoLongerLand) {
  route_.status_path = "/v1/status/{key}";
  route_.late_execution = Millis(30'000);
  const Millis settled = kTimeout + kMargin + Millis(30'000);
  EXPECT_EQ(Steps().Resuming(Resumed(kForwarded, kTimeout + kMargin)), Resume::kWait);
  EXPECT_EQ(Steps().Unsettled(Resumed(kForwarded, kTimeout + kMargin).record), Millis(30'000));
  EXPECT_EQ(Steps().Resuming(Resumed(kForwarded, settled)), Resume::kAsk);
}

TEST_F(ForwardStepsTest, TheStatusURLsVocabularyDecides) {
  route_.status_path = "/v1/status/{key}";
  const ForwardSteps steps = Steps();
  const Ticket ticket = Resumed(kForwarded, kTimeout + kMargin);
  const http::Request ask = steps.StatusQuestion(ticket.record);
  EXPECT_EQ(ask.target, "/v1/status/" + std::string(64, 'a'));
  EXPECT_FALSE(steps.FromStatus(ticket, http::Response{404, {}, ""})) << "never ran: forward it";
  http::Response ran{200, {}, "{\"id\":1}"};
  ran.headers.Set(std::string(kOriginalStatusHeader), "201");
  const std::optional<Execution> outcome = steps.FromStatus(ticket, ran);
  ASSERT_TRUE(outcome.has_value());
  EXPECT_EQ(outcome->response.status, 201) << "the status it reports, not the status URL's own";
  EXPECT_EQ(outcome->response.body, "{\"id\":1}");
  EXPECT_EQ(outcome->recovery_point, kSettled);
  const std::optional<Execution> cannot_tell =
      steps.FromStatus(ticket, http::Response{500, {}, ""});
  ASSERT_TRUE(cannot_tell.has_value());
  EXPECT_TRUE(cannot_tell->outcome_unknown) << "a 500 of the status URL is not the request's";
  EXPECT_FALSE(cannot_tell->held);
  const Ticket long_ago = Resumed(kForwarded, kTimeout + kMargin + route_.status_unknown_max);
  const std::optional<Execution> held =
      steps.FromStatus(long_ago, MakeError(Errc::kDeadlineExceeded, "no answer"));
  ASSERT_TRUE(held.has_value());
  EXPECT_TRUE(held->held) << "asked for status_unknown_max: held for an operator";
  EXPECT_EQ(held->response.status, 502);
}

TEST_F(ForwardStepsTest, AForwardsAnswerIsKnownOnlyWhenItCameOrNeverLeft) {
  const ForwardSteps steps = Steps();
  const Ticket ticket = Resumed(kForwarded, Millis(0));
  const Execution answered = steps.AfterForward(ticket, "POST", http::Response{500, {}, "x"});
  EXPECT_FALSE(answered.outcome_unknown);
  EXPECT_EQ(answered.response.status, 500);
  EXPECT_EQ(answered.recovery_point, kSettled);
  const Execution unsent =
      steps.AfterForward(ticket, "POST", MakeError(Errc::kUnavailable, "refused"));
  EXPECT_EQ(unsent.state, RecordState::kFailedRetryable);
  EXPECT_EQ(unsent.recovery_point, kSettled);
  const Execution lost =
      steps.AfterForward(ticket, "POST", MakeError(Errc::kDeadlineExceeded, "timeout"));
  EXPECT_TRUE(lost.outcome_unknown) << "sent, no answer: the upstream may have acted";
  EXPECT_TRUE(lost.recovery_point.empty()) << "stays at forwarded";
}

}  // namespace
}  // namespace idem::idemd
