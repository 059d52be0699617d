// src/core/record_test.cc — the state machine's names and transitions, and the stored-response
// encoding.
#include "idem/record.h"

#include <gtest/gtest.h>

namespace idem {
namespace {

constexpr RecordState kAll[] = {RecordState::kProcessing, RecordState::kSucceeded,
                                RecordState::kFailedFinal, RecordState::kFailedRetryable};

TEST(RecordState, NamesRoundTrip) {
  for (RecordState s : kAll) EXPECT_EQ(*ParseRecordState(RecordStateName(s)), s);
  EXPECT_EQ(ParseRecordState("DONE").error().code, Errc::kDataLoss);
  EXPECT_EQ(ParseRecordState("processing").error().code, Errc::kDataLoss);
}

TEST(Record, ASendSettlesItsWindowAfterItLeftByTheStoresClock) {
  Record r;
  r.updated_at = FromUnixMillis(5'000);
  r.sent_at = FromUnixMillis(1'000);
  r.observed_at = FromUnixMillis(2'500);
  EXPECT_EQ(LastSent(r), FromUnixMillis(1'000));  // a renewal moved updated_at, not the send
  EXPECT_EQ(UntilSettled(r, Millis(3'000)), Millis(1'500));
  r.observed_at = FromUnixMillis(4'000);
  EXPECT_EQ(UntilSettled(r, Millis(3'000)), std::nullopt);  // settled at exactly the window
  EXPECT_EQ(UntilSettled(r, Millis(0)), std::nullopt);
  // A record advanced before sent_at existed settles from updated_at, which is no earlier.
  r.sent_at = Timestamp{};
  EXPECT_EQ(LastSent(r), FromUnixMillis(5'000));
  EXPECT_EQ(UntilSettled(r, Millis(3'000)), Millis(4'000));
}

// A record in `state` at `point` that expires at `expires` (Unix ms).
Record InState(RecordState state, std::string point = "", int64_t expires = 2000) {
  Record r;
  r.state = state;
  r.recovery_point = std::move(point);
  r.expires_at = FromUnixMillis(expires);
  return r;
}

TEST(RecordState, Transitions) {
  const Timestamp now = FromUnixMillis(1000);
  const Timestamp later = FromUnixMillis(2000);  // the records' expiry
  for (RecordState to : kAll) {
    EXPECT_TRUE(IsLegalTransition(InState(RecordState::kProcessing), to, now));
    EXPECT_TRUE(IsLegalTransition(InState(RecordState::kProcessing), to, later));
  }
  EXPECT_TRUE(
      IsLegalTransition(InState(RecordState::kFailedRetryable), RecordState::kProcessing, now));
  // Finished and unexpired: replayed, never rewritten.
  for (RecordState from : {RecordState::kSucceeded, RecordState::kFailedFinal}) {
    for (RecordState to : kAll) EXPECT_FALSE(IsLegalTransition(InState(from, "done"), to, now));
  }
  for (RecordState to :
       {RecordState::kSucceeded, RecordState::kFailedFinal, RecordState::kFailedRetryable}) {
    EXPECT_FALSE(IsLegalTransition(InState(RecordState::kFailedRetryable), to, now));
  }
  // Any record past its expiry may become a new operation, and nothing else.
  for (RecordState from : kAll) {
    EXPECT_TRUE(IsLegalTransition(InState(from, "done"), RecordState::kProcessing, later));
  }
  EXPECT_FALSE(
      IsLegalTransition(InState(RecordState::kSucceeded), RecordState::kFailedFinal, later));
  // A held outcome is settled once, to any finished state, while it is unexpired.
  const Record held = InState(RecordState::kFailedFinal, std::string(kOutcomeUnknownPoint));
  for (RecordState to :
       {RecordState::kSucceeded, RecordState::kFailedFinal, RecordState::kFailedRetryable}) {
    EXPECT_TRUE(IsLegalTransition(held, to, now));
    EXPECT_FALSE(IsLegalTransition(held, to, later));
  }
  EXPECT_FALSE(IsLegalTransition(held, RecordState::kProcessing, now));
  const Record settled = InState(RecordState::kSucceeded, std::string(kOperatorSettledPoint));
  EXPECT_FALSE(IsLegalTransition(settled, RecordState::kFailedRetryable, now));
  EXPECT_TRUE(IsReplayable(RecordState::kSucceeded));
  EXPECT_TRUE(IsReplayable(RecordState::kFailedFinal));
  EXPECT_FALSE(IsReplayable(RecordState::kFailedRetryable));
  EXPECT_FALSE(IsReplayable(RecordState::kProcessing));
}

TEST(StoredResponse, RoundTripsByteForByte) {
  StoredResponse r{201,
                   {{"Location", "/v1/payments/pay_1"}, {"Content-Type", "application/json"}},
                   std::string("{\"a\":1}\0binary\xff", 15)};
  EXPECT_EQ(*DecodeResponse(EncodeResponse(r)), r);
  StoredResponse empty{204, {}, ""};
  EXPECT_EQ(*DecodeResponse(EncodeResponse(empty)), empty);
}

TEST(StoredResponse, RejectsForeignBytes) {
  const std::string good = EncodeResponse({200, {{"a", "b"}}, "body"});
  for (std::size_t n = 0; n < good.size(); ++n) {
    EXPECT_EQ(DecodeResponse(good.substr(0, n)).error().code, Errc::kDataLoss) << n;
  }
  EXPECT_EQ(DecodeResponse(good + "x").error().code, Errc::kDataLoss);
  std::string wrong_format = good;
  wrong_format[3] = 9;
  EXPECT_EQ(DecodeResponse(wrong_format).error().code, Errc::kDataLoss);
}

}  // namespace
}  // namespace idem
