// server/idemd/problems_test.cc — the product problems' table: every kind keeps its published row,
// no type URI is also one of http::ProblemKind's, and each answers what its row says.
#include "server/idemd/problems.h"

#include <gtest/gtest.h>

#include <map>
#include <set>
#include <vector>

namespace idem::idemd {
namespace {

const Timestamp kExpiry = FromUnixMillis(784111777000);  // Sun, 06 Nov 1994 08:49:37 GMT

std::vector<ProductProblem> AllKinds() {
  std::vector<ProductProblem> kinds;
  for (int i = 0; i <= static_cast<int>(ProductProblem::kLast); ++i) {
    kinds.push_back(static_cast<ProductProblem>(i));
  }
  return kinds;
}

TEST(ProductProblems, KLastIsTheLastKind) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(Spec(static_cast<ProductProblem>(static_cast<int>(ProductProblem::kLast) + 1)),
               "no ProductProblem");
}

// The published answers (docs/idemd.md, docs/gateway.md, docs/openapi.yaml): clients match on
// type and status, so changing one is a change of the product and must be made here too.
TEST(ProductProblems, KeepThePublishedStatusTypeAndTitleOfEveryKind) {
  struct Published {
    int status;
    std::string_view type;
    std::string_view title;
    int retry_after;
  };
  using K = ProductProblem;
  const std::map<ProductProblem, Published> published = {
      {K::kPaymentDeclined, {402, "urn:idem:problem:payment-declined", "Payment Required", 0}},
      {K::kProviderUnavailable,
       {503, "urn:idem:problem:provider-unavailable", "Service Unavailable", 1}},
      {K::kProviderTimeout, {504, "urn:idem:problem:provider-timeout", "Gateway Timeout", 0}},
      {K::kOrderInProgress, {409, "urn:idem:problem:order-in-progress", "Conflict", 1}},
      {K::kOrderConflict, {409, "urn:idem:problem:order-conflict", "Conflict", 0}},
      {K::kUpstreamUnavailable, {502, "urn:idem:problem:upstream-unavailable", "Bad Gateway", 1}},
      {K::kUpstreamTimeout, {504, "urn:idem:problem:upstream-timeout", "Gateway Timeout", 0}},
      {K::kUpstreamFailed, {502, "urn:idem:problem:upstream-failed", "Bad Gateway", 0}},
      {K::kUpstreamOutcomeUnknown,
       {502, "urn:idem:problem:upstream-outcome-unknown", "Bad Gateway", 0}},
  };
  EXPECT_EQ(published.size(), AllKinds().size()) << "a new kind needs its published row here";
  for (ProductProblem kind : AllKinds()) {
    auto it = published.find(kind);
    ASSERT_NE(it, published.end()) << "kind " << static_cast<int>(kind) << " is not published";
    const http::ProblemSpec spec = Spec(kind);
    SCOPED_TRACE(it->second.type);
    EXPECT_EQ(spec.status, it->second.status);
    EXPECT_EQ(spec.type, it->second.type);
    EXPECT_EQ(spec.title, it->second.title);
    EXPECT_EQ(spec.retry_after_seconds, it->second.retry_after);
    EXPECT_TRUE(spec.key_expires) << "every product problem is about a record";
  }
}

TEST(ProductProblems, NoTypeIsAlsoTheHttpTables) {
  std::set<std::string_view> types;
  for (int i = 0; i <= static_cast<int>(http::ProblemKind::kLast); ++i) {
    types.insert(http::Spec(static_cast<http::ProblemKind>(i)).type);
  }
  for (ProductProblem kind : AllKinds()) {
    EXPECT_TRUE(types.insert(Spec(kind).type).second) << Spec(kind).type << " is in both tables";
  }
}

TEST(ProductProblems, EachAnswersWhatItsRowSays) {
  for (ProductProblem kind : AllKinds()) {
    const http::ProblemSpec spec = Spec(kind);
    SCOPED_TRACE(spec.type);
    const http::Response r = Problem(kind, "some detail", {.key_expires = kExpiry});
    EXPECT_EQ(r.status, spec.status);
    EXPECT_EQ(r.headers.Get("content-type"), "application/problem+json");
    EXPECT_EQ(r.headers.Get("idempotency-key-expires"), "Sun, 06 Nov 1994 08:49:37 GMT");
    if (spec.retry_after_seconds > 0) {
      EXPECT_EQ(r.headers.Get("retry-after"), std::to_string(spec.retry_after_seconds));
    } else {
      EXPECT_EQ(r.headers.Count("retry-after"), 0);
    }
    EXPECT_EQ(r.body, "{\"type\":\"" + std::string(spec.type) + "\",\"title\":\"" +
                          std::string(spec.title) + "\",\"status\":" + std::to_string(spec.status) +
                          ",\"detail\":\"some detail\"}");
    // Options its row does not allow are a logged 500, as for http::ProblemKind.
    EXPECT_EQ(Problem(kind, "x").status, 500) << "no Idempotency-Key-Expires";
    EXPECT_EQ(Problem(kind, "x", {.key_expires = kExpiry, .errors = {{"f", "m"}}}).status, 500)
        << "field errors";
  }
}

}  // namespace
}  // namespace idem::idemd
