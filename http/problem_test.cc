// http/problem_test.cc — the problem table: every kind has a well-formed, unique row that
// keeps its published type URI, the builder answers what the row says, and every Errc maps.
#include "http/problem.h"

#include <gtest/gtest.h>

#include <boost/json.hpp>
#include <map>
#include <set>
#include <vector>

namespace idem::http {
namespace {

namespace json = boost::json;

constexpr std::string_view kTypePrefix = "urn:idem:problem:";
const Timestamp kExpiry = FromUnixMillis(784111777000);  // Sun, 06 Nov 1994 08:49:37 GMT

// Every ProblemKind: kLast names the last one (KLastIsTheLastKind holds it to that).
std::vector<ProblemKind> AllKinds() {
  std::vector<ProblemKind> kinds;
  for (int i = 0; i <= static_cast<int>(ProblemKind::kLast); ++i) {
    kinds.push_back(static_cast<ProblemKind>(i));
  }
  return kinds;
}

std::string Name(ProblemKind kind) {
  return std::string(Spec(kind).type.substr(kTypePrefix.size()));
}

// The options a kind's row requires: the record's expiry where it carries Idempotency-Key-Expires.
ProblemOptions Required(ProblemKind kind) {
  ProblemOptions options;
  if (Spec(kind).key_expires) options.key_expires = kExpiry;
  return options;
}

TEST(ProblemTable, KLastIsTheLastKind) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  // A kind added after kLast has a row (or does not compile); then this value is no longer
  // refused, and kLast must move so the tests below walk the new kind too.
  EXPECT_DEATH(Spec(static_cast<ProblemKind>(static_cast<int>(ProblemKind::kLast) + 1)),
               "no ProblemKind");
}

TEST(ProblemTable, EveryKindHasAWellFormedUniqueRow) {
  std::set<std::string_view> types;
  for (ProblemKind kind : AllKinds()) {
    const ProblemSpec spec = Spec(kind);
    SCOPED_TRACE(spec.type);
    EXPECT_GE(spec.status, 400);
    EXPECT_LE(spec.status, 599);
    ASSERT_EQ(spec.type.substr(0, kTypePrefix.size()), kTypePrefix);
    const std::string_view slug = spec.type.substr(kTypePrefix.size());
    EXPECT_FALSE(slug.empty());
    for (char c : slug) EXPECT_TRUE((c >= 'a' && c <= 'z') || c == '-') << "slug " << slug;
    EXPECT_TRUE(types.insert(spec.type).second) << "two kinds share " << spec.type;
    EXPECT_FALSE(spec.title.empty());
    EXPECT_GE(spec.retry_after_seconds, 0);
  }
  EXPECT_EQ(types.size(), AllKinds().size());
}

// The published answers (docs/idemd.md, docs/openapi.yaml): clients match on type and status, so
// changing one is a change of the product and must be made here too.
TEST(ProblemTable, KeepsThePublishedStatusTypeAndTitleOfEveryKind) {
  struct Published {
    int status;
    std::string_view slug;
    std::string_view title;
    int retry_after;
    bool key_expires;
  };
  using K = ProblemKind;
  const std::map<ProblemKind, Published> published = {
      {K::kMalformedRequest, {400, "malformed-request", "Bad Request", 0, false}},
      {K::kPayloadTooLarge, {413, "payload-too-large", "Payload Too Large", 0, false}},
      {K::kHeadersTooLarge,
       {431, "headers-too-large", "Request Header Fields Too Large", 0, false}},
      {K::kUriTooLong, {414, "uri-too-long", "URI Too Long", 0, false}},
      {K::kShuttingDown, {503, "shutting-down", "Service Unavailable", 1, false}},
      {K::kOverloaded, {503, "overloaded", "Service Unavailable", 1, false}},
      {K::kInternal, {500, "internal", "Internal Server Error", 0, false}},
      {K::kInvalidRequest, {400, "invalid-request", "Bad Request", 0, false}},
      {K::kMalformedJson, {400, "malformed-json", "Bad Request", 0, false}},
      {K::kValidationFailed, {400, "validation-failed", "Bad Request", 0, false}},
      {K::kUnsupportedMediaType,
       {415, "unsupported-media-type", "Unsupported Media Type", 0, false}},
      {K::kUnauthorized, {401, "unauthorized", "Unauthorized", 0, false}},
      {K::kMethodNotAllowed, {405, "method-not-allowed", "Method Not Allowed", 0, false}},
      {K::kNotFound, {404, "not-found", "Not Found", 0, false}},
      {K::kNotReady, {503, "not-ready", "Service Unavailable", 1, false}},
      {K::kIdempotencyKeyReused, {422, "idempotency-key-reused", "Unprocessable Content", 0, true}},
      {K::kRequestInProgress, {409, "request-in-progress", "Conflict", 1, true}},
      {K::kQuotaExceeded, {429, "quota-exceeded", "Too Many Requests", 1, false}},
      {K::kUnavailable, {503, "unavailable", "Service Unavailable", 1, false}},
      {K::kTimeout, {504, "timeout", "Gateway Timeout", 0, false}},
      {K::kAnswerTooLarge, {502, "answer-too-large", "Bad Gateway", 0, true}},
  };
  EXPECT_EQ(published.size(), AllKinds().size()) << "a new kind needs its published row here";
  for (ProblemKind kind : AllKinds()) {
    auto it = published.find(kind);
    ASSERT_NE(it, published.end()) << "kind " << static_cast<int>(kind) << " is not published";
    const Published& p = it->second;
    const ProblemSpec spec = Spec(kind);
    SCOPED_TRACE(p.slug);
    EXPECT_EQ(spec.status, p.status);
    EXPECT_EQ(spec.type, std::string(kTypePrefix) + std::string(p.slug));
    EXPECT_EQ(spec.title, p.title);
    EXPECT_EQ(spec.retry_after_seconds, p.retry_after);
    EXPECT_EQ(spec.key_expires, p.key_expires);
  }
}

TEST(Problem, EveryKindAnswersWhatItsRowSays) {
  for (ProblemKind kind : AllKinds()) {
    const ProblemSpec spec = Spec(kind);
    SCOPED_TRACE(spec.type);
    const Response r = Problem(kind, "some detail", Required(kind));
    EXPECT_EQ(r.status, spec.status);
    EXPECT_EQ(r.headers.Get("content-type"), "application/problem+json");

    if (spec.retry_after_seconds > 0) {
      EXPECT_EQ(r.headers.Get("retry-after"), std::to_string(spec.retry_after_seconds));
    } else {
      EXPECT_EQ(r.headers.Count("retry-after"), 0);
    }
    if (spec.key_expires) {
      EXPECT_EQ(r.headers.Get("idempotency-key-expires"), "Sun, 06 Nov 1994 08:49:37 GMT");
    } else {
      EXPECT_EQ(r.headers.Count("idempotency-key-expires"), 0);
    }

    // RFC 9457 members, in this order, and nothing else (validation-failed adds its errors).
    boost::system::error_code ec;
    const json::value body = json::parse(r.body, ec);
    ASSERT_FALSE(ec) << r.body;
    ASSERT_TRUE(body.is_object()) << r.body;
    const json::object& o = body.as_object();
    std::vector<std::string> members;
    for (const auto& member : o) members.emplace_back(member.key());
    std::vector<std::string> expected = {"type", "title", "status", "detail"};
    if (kind == ProblemKind::kValidationFailed) expected.push_back("errors");
    EXPECT_EQ(members, expected);
    EXPECT_EQ(o.at("type").as_string(), spec.type);
    EXPECT_EQ(o.at("title").as_string(), spec.title);
    ASSERT_TRUE(o.at("status").is_int64());
    EXPECT_EQ(o.at("status").as_int64(), r.status);
    EXPECT_EQ(o.at("detail").as_string(), "some detail");
  }
}

TEST(Problem, ARetryAfterOverrideReplacesTheDefault) {
  int kinds_with_retry = 0;
  for (ProblemKind kind : AllKinds()) {
    if (Spec(kind).retry_after_seconds == 0) continue;
    ++kinds_with_retry;
    SCOPED_TRACE(Name(kind));
    ProblemOptions options = Required(kind);
    options.retry_after_seconds = 7;
    EXPECT_EQ(Problem(kind, "d", options).headers.Get("retry-after"), "7");
  }
  EXPECT_GT(kinds_with_retry, 0);
}

// Options a row does not allow are a caller's bug, but the request may be anyone's: a logged 500,
// never an abort (a death test here would pass on the old abort, so this one runs in-process).
void ExpectLoggedInternal(ProblemKind kind, const ProblemOptions& options) {
  ::testing::internal::CaptureStderr();
  const Response r = Problem(kind, "d", options);
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(r.status, 500) << r.body;
  EXPECT_NE(r.body.find("urn:idem:problem:internal"), std::string::npos) << r.body;
  EXPECT_EQ(r.body.find("\"detail\":\"d\""), std::string::npos) << "the detail is not the client's";
  EXPECT_EQ(r.headers.Count("idempotency-key-expires"), 0);
  EXPECT_NE(log.find("\"level\":\"error\""), std::string::npos) << log;
  EXPECT_NE(log.find("\"kind\":\"" + std::string(Spec(kind).type) + "\""), std::string::npos)
      << log;
}

TEST(Problem, OptionsARowDoesNotAllowAreALoggedInternalError) {
  for (ProblemKind kind : AllKinds()) {
    const ProblemSpec spec = Spec(kind);
    SCOPED_TRACE(Name(kind));
    if (spec.retry_after_seconds == 0) {
      ProblemOptions options = Required(kind);
      options.retry_after_seconds = 1;
      ExpectLoggedInternal(kind, options);
    }
    // The expiry is required where the row carries it and refused where it does not.
    ProblemOptions flipped;
    if (!spec.key_expires) flipped.key_expires = kExpiry;
    ExpectLoggedInternal(kind, flipped);
    if (kind != ProblemKind::kValidationFailed) {
      ProblemOptions options = Required(kind);
      options.errors = {{"amount", "bad"}};
      ExpectLoggedInternal(kind, options);
    }
  }
  ProblemOptions zero;
  zero.retry_after_seconds = 0;
  ExpectLoggedInternal(ProblemKind::kOverloaded, zero);
}

TEST(Problem, ValidationFailedListsTheFieldErrorsInOrder) {
  const Response r = Problem(ProblemKind::kValidationFailed, "the request body failed validation",
                             {.errors = {{"amount", "must be greater than 0"},
                                         {"", "the body must be a JSON object"},
                                         {"na\"me", "unknown field"}}});
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(r.body,
            R"({"type":"urn:idem:problem:validation-failed","title":"Bad Request","status":400,)"
            R"("detail":"the request body failed validation","errors":[)"
            R"({"field":"amount","message":"must be greater than 0"},)"
            R"({"field":"","message":"the body must be a JSON object"},)"
            R"({"field":"na\"me","message":"unknown field"}]})");
  // Always an array, even when the caller found nothing to name.
  EXPECT_EQ(Problem(ProblemKind::kValidationFailed, "d").body,
            R"({"type":"urn:idem:problem:validation-failed","title":"Bad Request","status":400,)"
            R"("detail":"d","errors":[]})");
}

TEST(Problem, BodiesAreByteForByteThePublishedShape) {
  EXPECT_EQ(Problem(ProblemKind::kNotFound, "no such payment").body,
            R"({"type":"urn:idem:problem:not-found","title":"Not Found","status":404,)"
            R"("detail":"no such payment"})");
  const Response in_progress = Problem(ProblemKind::kRequestInProgress, "still running",
                                       {.retry_after_seconds = 3, .key_expires = kExpiry});
  EXPECT_EQ(in_progress.headers.fields,
            (std::vector<std::pair<std::string, std::string>>{
                {"content-type", "application/problem+json"},
                {"retry-after", "3"},
                {"idempotency-key-expires", "Sun, 06 Nov 1994 08:49:37 GMT"}}));
}

TEST(ProblemFor, EveryErrcHasItsKind) {
  using K = ProblemKind;
  const std::vector<std::pair<Errc, ProblemKind>> expected = {
      {Errc::kInvalidArgument, K::kInvalidRequest},
      {Errc::kTooLarge, K::kPayloadTooLarge},
      {Errc::kNotFound, K::kNotFound},
      {Errc::kAlreadyExists, K::kInternal},
      {Errc::kFingerprintMismatch, K::kIdempotencyKeyReused},
      {Errc::kFenced, K::kUnavailable},
      {Errc::kConflict, K::kUnavailable},
      {Errc::kResourceExhausted, K::kQuotaExceeded},
      {Errc::kUnavailable, K::kUnavailable},
      {Errc::kDeadlineExceeded, K::kTimeout},
      {Errc::kDataLoss, K::kInternal},
      {Errc::kInternal, K::kInternal},
  };
  // Errc is closed with kInternal last; a new code must be listed above.
  ASSERT_EQ(expected.size(), static_cast<std::size_t>(Errc::kInternal) + 1);
  for (int i = 0; i <= static_cast<int>(Errc::kInternal); ++i) {
    EXPECT_EQ(expected[static_cast<std::size_t>(i)].first, static_cast<Errc>(i));
  }
  for (const auto& [code, kind] : expected) {
    SCOPED_TRACE(std::string(ErrcName(code)));
    EXPECT_EQ(ProblemKindFor(code), kind);
    const Response r = ProblemFor(Error{code, "the message"}, kExpiry);
    EXPECT_EQ(r.status, Spec(kind).status);
    EXPECT_NE(r.body.find("\"type\":\"" + std::string(Spec(kind).type) + "\""), std::string::npos)
        << r.body;
    // The record's expiry goes only where the kind's row carries it.
    EXPECT_EQ(r.headers.Count("idempotency-key-expires"), Spec(kind).key_expires ? 1 : 0);
  }
}

// A key reused for another request is an answer about the record that holds the key.
TEST(ProblemFor, AMismatchCarriesTheRecordsExpiry) {
  const Response r = ProblemFor(Error{Errc::kFingerprintMismatch, "used before"}, kExpiry);
  EXPECT_EQ(r.status, 422);
  EXPECT_EQ(r.headers.Get("idempotency-key-expires"), "Sun, 06 Nov 1994 08:49:37 GMT");
  EXPECT_EQ(
      ProblemFor(Error{Errc::kInvalidArgument, "bad key"}).headers.Count("idempotency-key-expires"),
      0);
  // Without the expiry its row requires: a caller's bug, answered 500 (and logged), no abort.
  ::testing::internal::CaptureStderr();
  const Response missing = ProblemFor(Error{Errc::kFingerprintMismatch, "used before"});
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(missing.status, 500) << missing.body;
  EXPECT_NE(log.find("idempotency-key-reused"), std::string::npos) << log;
}

// A dependency's failure (unavailable, a timeout) and internal causes name nothing of theirs to the
// client: the store's host or SQL would be in the detail otherwise. The message goes to the log.
TEST(ProblemFor, DetailIsTheMessageExceptForDependenciesAndInternal) {
  auto detail = [](Errc code) {
    return std::string(json::parse(ProblemFor(Error{code, "disk on fire"}, kExpiry).body)
                           .as_object()
                           .at("detail")
                           .as_string());
  };
  EXPECT_EQ(detail(Errc::kInvalidArgument), "disk on fire");
  EXPECT_EQ(detail(Errc::kFingerprintMismatch), "disk on fire");
  EXPECT_EQ(detail(Errc::kResourceExhausted), "disk on fire");
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(
      detail(Errc::kDeadlineExceeded),
      "a deadline passed and the outcome may be unknown; retry with the same key to learn it");
  EXPECT_EQ(detail(Errc::kFenced), "a dependency is busy or unreachable; try again shortly");
  EXPECT_EQ(detail(Errc::kUnavailable), "a dependency is busy or unreachable; try again shortly");
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("disk on fire"), std::string::npos) << "the cause is logged: " << log;
  // Internal causes are not for clients.
  EXPECT_EQ(detail(Errc::kDataLoss), "unexpected failure");
  EXPECT_EQ(detail(Errc::kInternal), "unexpected failure");
  EXPECT_EQ(detail(Errc::kAlreadyExists), "unexpected failure");
}

}  // namespace
}  // namespace idem::http
