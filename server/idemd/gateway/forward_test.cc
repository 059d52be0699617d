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
  route_.nothing_done_statuses = {503};
  const ForwardSteps steps = Steps();
  const Ticket ticket = Resumed(kForwarded, Millis(0));
  const Execution answered = steps.AfterForward(ticket, "POST", http::Response{409, {}, "x"});
  EXPECT_FALSE(answered.outcome_unknown);
  EXPECT_EQ(answered.response.status, 409);
  EXPECT_EQ(answered.recovery_point, kSettled);
  const Execution declared = steps.AfterForward(ticket, "POST", http::Response{503, {}, "busy"});
  EXPECT_FALSE(declared.outcome_unknown) << "503 is declared: the upstream did nothing";
  EXPECT_EQ(declared.response.status, 503);
  EXPECT_EQ(declared.recovery_point, kSettled);
  const Execution unsent =
      steps.AfterForward(ticket, "POST", MakeError(Errc::kUnavailable, "refused"));
  EXPECT_EQ(unsent.state, RecordState::kFailedRetryable);
  EXPECT_EQ(unsent.recovery_point, kSettled);
  const Execution lost =
      steps.AfterForward(ticket, "POST", MakeError(Errc::kDeadlineExceeded, "timeout"));
  EXPECT_TRUE(lost.outcome_unknown) << "sent, no answer: the upstream may have acted";
  EXPECT_TRUE(lost.recovery_point.empty()) << "stays at forwarded";
}

// A failure answer is not proof of no work: a 5xx the route neither replays nor declares as
// "nothing done" is an unknown outcome, as a timeout is — the record stays at `forwarded`, and
// the retry asks the status URL, relies on the upstream's deduplication, or is held; never
// forwarded again on its own. Before, a 500 was retryable and the retry forwarded again: an
// upstream that had acted and then failed executed twice.
TEST_F(ForwardStepsTest, AFiveHundredThatMayHaveActedIsAnUnknownOutcome) {
  route_.nothing_done_statuses = {503};
  route_.final_statuses = {501};
  const Ticket ticket = Resumed(kForwarded, Millis(0));
  for (int status : {500, 502, 504, 599}) {
    const Execution failed =
        Steps().AfterForward(ticket, "POST", http::Response{status, {}, "oops"});
    EXPECT_TRUE(failed.outcome_unknown) << status;
    EXPECT_TRUE(failed.recovery_point.empty()) << status << ": stays at forwarded";
    EXPECT_EQ(failed.response.status, 502) << status;
    EXPECT_NE(failed.response.body.find("upstream-failed"), std::string::npos)
        << failed.response.body;
    EXPECT_NE(failed.response.body.find("answered " + std::to_string(status)), std::string::npos)
        << failed.response.body;
  }
  const Execution final = Steps().AfterForward(ticket, "POST", http::Response{501, {}, "no"});
  EXPECT_FALSE(final.outcome_unknown) << "a final status is the answer, replayed";
  EXPECT_EQ(final.response.status, 501);
  // Its status URL says it ran and answered 500: it must not run again, and nobody can tell what
  // it did: held for an operator.
  route_.status_path = "/v1/status/{key}";
  http::Response reported{200, {}, "oops"};
  reported.headers.Set(kOriginalStatusHeader, "500");
  const std::optional<Execution> told = Steps().FromStatus(ticket, reported);
  ASSERT_TRUE(told.has_value());
  EXPECT_TRUE(told->held);
  EXPECT_NE(told->response.body.find("upstream-outcome-unknown"), std::string::npos);
  reported.headers.Set(kOriginalStatusHeader, "503");
  const std::optional<Execution> declared = Steps().FromStatus(ticket, reported);
  ASSERT_TRUE(declared.has_value());
  EXPECT_FALSE(declared->held);
  EXPECT_EQ(declared->response.status, 503) << "declared: classified as the route says";
}

// On a deduplicating route without a status URL, the forward after an unknown outcome is a repeat
// with the same key; an upstream that keeps its answers (500s included) gives it the same 500,
// and every later repeat too. The second such 500 holds the outcome for an operator rather than
// forwarding forever; a first forward's 500 stays an unknown outcome.
TEST_F(ForwardStepsTest, ARepeatThatFailsAgainOnADeduplicatingRouteIsHeld) {
  route_.upstream_deduplicates = true;
  const Execution first =
      Steps().AfterForward(Resumed("", Millis(0)), "POST", http::Response{500, {}, "oops"});
  EXPECT_TRUE(first.outcome_unknown);
  EXPECT_FALSE(first.held);
  const Execution again =
      Steps().AfterForward(Resumed(kForwarded, Millis(0)), "POST", http::Response{500, {}, "oops"});
  EXPECT_TRUE(again.held);
  EXPECT_EQ(again.response.status, 502);
  EXPECT_NE(again.response.body.find("upstream-outcome-unknown"), std::string::npos);
  const Execution answered =
      Steps().AfterForward(Resumed(kForwarded, Millis(0)), "POST", http::Response{201, {}, "{}"});
  EXPECT_FALSE(answered.held) << "a repeat that succeeds is the answer";
  EXPECT_EQ(answered.response.status, 201);
}

}  // namespace
}  // namespace idem::idemd
