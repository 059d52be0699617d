// server/idemd/gateway/proxy_test.cc — what a gateway route passes on: headers and answers.
#include "server/idemd/gateway/proxy.h"

#include <gtest/gtest.h>

namespace idem::idemd {
namespace {

TEST(ForwardableHeaders, DropHopByHopHeadersThoseConnectionNamesAndTheRouteNeverForwards) {
  http::Headers in;
  in.Add("Content-Type", "application/json");
  in.Add("Connection", "keep-alive, X-Hop-Only");
  in.Add("X-Hop-Only", "1");
  in.Add("Expect", "100-continue");
  in.Add("Host", "idemd.example");
  in.Add("Authorization", "Bearer k");
  in.Add("Traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01");
  const http::Headers route = ForwardableHeaders(in, IsUnforwardableHeader);
  EXPECT_EQ(route.Get("content-type"), "application/json");
  EXPECT_TRUE(route.Get("traceparent").has_value());
  for (const char* gone : {"connection", "x-hop-only", "expect", "host", "authorization"}) {
    EXPECT_FALSE(route.Get(gone).has_value()) << gone;
  }
  // Passed through: credentials go as they came; hop-by-hop headers still do not.
  const http::Headers passed = ForwardableHeaders(in, IsHopByHopHeader);
  EXPECT_EQ(passed.Get("authorization"), "Bearer k");
  EXPECT_FALSE(passed.Get("x-hop-only").has_value());
  EXPECT_FALSE(passed.Get("expect").has_value());
}

TEST(Usable, AnInterimAnswerAloneIsNoAnswer) {
  auto interim = Usable(http::Response{100, {}, ""});
  ASSERT_FALSE(interim.has_value());
  EXPECT_EQ(interim.error().code, Errc::kDataLoss);
  EXPECT_EQ(Usable(http::Response{201, {}, "{}"})->status, 201);
  EXPECT_EQ(Usable(MakeError(Errc::kUnavailable, "x")).error().code, Errc::kUnavailable);
}

}  // namespace
}  // namespace idem::idemd
