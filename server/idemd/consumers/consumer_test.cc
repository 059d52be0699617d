// server/idemd/consumers/consumer_test.cc — [[consumers]] entries and the errors an operator
// sees; the request a message becomes; what the broker is told of each answer.
#include "server/idemd/consumers/consumer.h"

#include <gtest/gtest.h>

#include <fstream>

#include "http/problem.h"
#include "server/idemd/config/config.h"
#include "testing/fakes.h"

namespace idem::idemd {
namespace {

class ConsumerConfigTest : public ::testing::Test {
 protected:
  void SetUp() override { unsetenv("IDEM_SECRETS"); }

  // A config with one consumer: `own` lines added to (or replacing) its table's, `target` lines
  // to its [consumers.target].
  Result<Config> Load(const std::string& own, const std::string& target = "") {
    const std::string path = dir_.File("c.toml");
    std::ofstream(path) << "[secrets]\nfile = \"" << dir_.File("secrets.toml")
                        << "\"\ngenerate_if_missing = true\n[[consumers]]\nname = \"orders\"\n"
                        << own << "\n[consumers.target]\nrequest = \"POST /v1/orders\"\n"
                        << "upstream = \"http://127.0.0.1:1\"\n"
                        << target << "\n";
    return LoadConfig(path, {});
  }
  static std::string Base() { return "url = \"redis://127.0.0.1:6379\"\nstream = \"orders\"\n"; }

  void ExpectError(const std::string& own, const std::string& target, const std::string& what) {
    auto c = Load(own, target);
    ASSERT_FALSE(c.has_value()) << own << target;
    EXPECT_NE(c.error().message.find(what), std::string::npos)
        << "expected: " << what << "\ngot: " << c.error().message;
  }

  testing::TempDir dir_;
};

TEST_F(ConsumerConfigTest, AConsumerLoadsWithItsDefaults) {
  auto c = Load(Base() + "key = \"json:/order/id\"\nheader_fields = [\"X-Trace\"]\n");
  ASSERT_TRUE(c.has_value()) << c.error().message;
  ASSERT_EQ(c->consumers.size(), 1u);
  const ConsumerRoute& r = c->consumers[0];
  EXPECT_EQ(r.RouteId(), "mq.orders");
  EXPECT_EQ(r.group, "idem");
  EXPECT_EQ(r.dead_letter, "orders.dead");
  EXPECT_EQ(r.key_source, KeySource::kJson);
  EXPECT_EQ(r.key_name, "/order/id");
  EXPECT_EQ(r.header_fields, std::vector<std::string>{"x-trace"});
  EXPECT_EQ(r.target.method, "POST");
  EXPECT_EQ(r.target.pattern, "/v1/orders");
  EXPECT_TRUE(r.target.key_required);
  EXPECT_EQ(r.RedeliveryHorizon(), 5 * (Millis(60000) + Millis(30000)));
}

TEST_F(ConsumerConfigTest, MistakesNameTheConsumerAndTheLine) {
  ExpectError("stream = \"orders\"\n", "", "c.toml:4: [[consumers]] orders: needs url");
  ExpectError(Base() + "key = \"header\"\n", "", "key: must be \"field:NAME\"");
  ExpectError(Base() + "max_attempts = 0\n", "", "max_attempts: must be an integer 1..1000");
  ExpectError(Base() + "colour = 1\n", "", "[[consumers]] orders: colour: unknown key");
  ExpectError(Base() + "source = \"kafka\"\n", "", "source: must be \"redis\"");
  ExpectError(Base() + "dead_letter = \"orders\"\n", "", "dead_letter must be another stream");
  ExpectError(Base() + "header_fields = [\"authorization\"]\n", "",
              "'authorization' is never forwarded");
  ExpectError(Base() + "key = \"field:body\"\n", "", "key names the body_field");
  // The target: a route's keys, named as the consumer's target.
  ExpectError(Base(), "match = \"POST /v1/x\"\n",
              "[[consumers]] orders target: match: unknown key");
  ExpectError(Base(), "timeout_ms = 0\n", "[[consumers]] orders target: timeout_ms: must be");
  auto c = Load(Base(), "");
  ASSERT_TRUE(c.has_value());
  const std::string path = dir_.File("p.toml");
  std::ofstream(path) << "[secrets]\nfile = \"" << dir_.File("secrets.toml")
                      << "\"\n[[consumers]]\nname = \"o\"\n"
                      << Base() << "[consumers.target]\nrequest = \"POST /v1/orders/{id}\"\n"
                      << "upstream = \"http://127.0.0.1:1\"\n";
  auto open = LoadConfig(path, {});
  ASSERT_FALSE(open.has_value());
  EXPECT_NE(open.error().message.find("request: must name one path"), std::string::npos)
      << open.error().message;
}

// A record must outlive every redelivery the broker can still make of its message, and a
// message must not be taken from a consumer whose lease still runs.
TEST_F(ConsumerConfigTest, RetentionMustCoverTheRedeliveryHorizon) {
  ExpectError(Base() + "max_attempts = 10\nredeliver_after_ms = 60000\n", "retention_ms = 600000\n",
              "target.retention_ms (600000) is shorter than the redelivery horizon, max_attempts x "
              "(redeliver_after_ms + target.lease_ms) = 900000 ms");
  auto fits =
      Load(Base() + "max_attempts = 10\nredeliver_after_ms = 60000\n", "retention_ms = 900000\n");
  EXPECT_TRUE(fits.has_value()) << fits.error().message;
  ExpectError(Base() + "redeliver_after_ms = 30000\n", "",
              "redeliver_after_ms (30000) must be longer than target.lease_ms (30000)");
  ExpectError(Base() + "concurrency = 16\n", "[idempotency]\nmax_processing = 8\n",
              "concurrency (16) is more than idempotency.max_processing (8)");
  ExpectError(Base(), "lease_ms = 11000\n", "target.lease_ms (11000) must be longer than");
}

// payments_tenant makes each message a payment of that tenant: POST /v1/payments under the
// payments' lease and retention, which must cover the redelivery horizon in their turn.
TEST_F(ConsumerConfigTest, APaymentsConsumerRunsUnderThePaymentsSettings) {
  const std::string path = dir_.File("pay.toml");
  auto write = [&](const std::string& own, const std::string& rest) {
    std::ofstream(path) << "[secrets]\nfile = \"" << dir_.File("secrets.toml")
                        << "\"\ngenerate_if_missing = true\n"
                        << rest << "[[consumers]]\nname = \"charges\"\n"
                        << Base() << "key = \"json:/merchant_order_no\"\n"
                        << own;
    return LoadConfig(path, {});
  };
  auto c = write("payments_tenant = \"acme\"\n",
                 "[idempotency]\nlease_ms = 20000\nretention_hours = 48\n");
  ASSERT_TRUE(c.has_value()) << c.error().message;
  const ConsumerRoute& r = c->consumers.at(0);
  EXPECT_TRUE(r.IsPayments());
  EXPECT_EQ(r.target.method, "POST");
  EXPECT_EQ(r.target.pattern, "/v1/payments");
  EXPECT_TRUE(r.target.json_body);
  EXPECT_EQ(r.target.lease, Millis(20000));
  EXPECT_EQ(r.target.retention, std::chrono::hours(48));
  EXPECT_EQ(r.target.timeout, c->provider.timeout);
  EXPECT_EQ(ConsumerPrincipal(r).tenant, "acme");
  EXPECT_EQ(ConsumerPrincipal(r).user, "idem");
  // What --check-config prints loads back to the same consumer.
  std::ofstream(dir_.File("printed.toml")) << EffectiveConfigToml(*c);
  auto again = LoadConfig(dir_.File("printed.toml"), {});
  ASSERT_TRUE(again.has_value()) << again.error().message;
  EXPECT_EQ(again->consumers.at(0).payments_tenant, "acme");
  EXPECT_EQ(EffectiveConfigToml(*again), EffectiveConfigToml(*c));

  auto both = write(
      "payments_tenant = \"acme\"\n[consumers.target]\nrequest = \"POST /v1/o\"\n"
      "upstream = \"http://h:1\"\n",
      "");
  ASSERT_FALSE(both.has_value());
  EXPECT_NE(both.error().message.find("it takes no [consumers.target]"), std::string::npos)
      << both.error().message;
  auto neither = write("", "");
  ASSERT_FALSE(neither.has_value());
  EXPECT_NE(neither.error().message.find("or payments_tenant"), std::string::npos)
      << neither.error().message;
  auto bad = write("payments_tenant = \"a b\"\n", "");
  ASSERT_FALSE(bad.has_value());
  EXPECT_NE(bad.error().message.find("payments_tenant: must be"), std::string::npos)
      << bad.error().message;
  // 5 x (60 s + 30 s) = 450 s of redeliveries against 300 s of payments retention.
  auto short_lived =
      write("payments_tenant = \"acme\"\n", "[idempotency]\nretention_ms = 300000\n");
  ASSERT_FALSE(short_lived.has_value());
  EXPECT_NE(short_lived.error().message.find(
                "idempotency.retention_ms (300000) is shorter than the redelivery horizon, "
                "max_attempts x (redeliver_after_ms + idempotency.lease_ms) = 450000 ms"),
            std::string::npos)
      << short_lived.error().message;
  auto leased = write("payments_tenant = \"acme\"\nredeliver_after_ms = 20000\n",
                      "[idempotency]\nlease_ms = 20000\n");
  ASSERT_FALSE(leased.has_value());
  EXPECT_NE(leased.error().message.find(
                "redeliver_after_ms (20000) must be longer than idempotency.lease_ms (20000)"),
            std::string::npos)
      << leased.error().message;
}

TEST_F(ConsumerConfigTest, TwoConsumersMayNotShareAName) {
  const std::string path = dir_.File("two.toml");
  std::ofstream(path) << "[secrets]\nfile = \"" << dir_.File("secrets.toml")
                      << "\"\ngenerate_if_missing = true\n";
  for (int i = 0; i < 2; ++i) {
    std::ofstream(path, std::ios::app)
        << "[[consumers]]\nname = \"orders\"\n"
        << Base() << "[consumers.target]\nrequest = \"POST /v1/o\"\nupstream = \"http://h:1\"\n";
  }
  auto c = LoadConfig(path, {});
  ASSERT_FALSE(c.has_value());
  EXPECT_NE(c.error().message.find("name already used at line 4"), std::string::npos)
      << c.error().message;
}

ConsumerRoute Route(KeySource source, std::string key_name) {
  ConsumerRoute r;
  r.name = "orders";
  r.stream = "orders";
  r.key_source = source;
  r.key_name = std::move(key_name);
  r.header_fields = {"x-trace"};
  r.target.method = "POST";
  r.target.pattern = "/v1/orders";
  return r;
}

Delivery Message(std::vector<std::pair<std::string, std::string>> fields) {
  Delivery d;
  d.id = "1700000000000-0";
  d.fields = std::move(fields);
  return d;
}

TEST(MessageRequest, TheKeyComesFromTheRuleAndTheBodyFromItsField) {
  const Delivery d =
      Message({{"key", "order-7"}, {"body", R"({"order":{"id":"o-7","n":42}})"}, {"x-trace", "t"}});
  auto by_field = MessageRequest(Route(KeySource::kField, "key"), d);
  ASSERT_TRUE(by_field.has_value()) << by_field.error().message;
  EXPECT_EQ(by_field->method, "POST");
  EXPECT_EQ(by_field->target, "/v1/orders");
  EXPECT_EQ(by_field->headers.Get("idempotency-key"), "order-7");
  EXPECT_EQ(by_field->headers.Get("content-type"), "application/json");
  EXPECT_EQ(by_field->headers.Get("x-trace"), "t");
  EXPECT_EQ(by_field->body, R"({"order":{"id":"o-7","n":42}})");
  EXPECT_EQ(MessageRequest(Route(KeySource::kJson, "/order/id"), d)->headers.Get("idempotency-key"),
            "o-7");
  EXPECT_EQ(MessageRequest(Route(KeySource::kJson, "/order/n"), d)->headers.Get("idempotency-key"),
            "42");
  EXPECT_EQ(MessageRequest(Route(KeySource::kBrokerId, ""), d)->headers.Get("idempotency-key"),
            "1700000000000-0");
}

TEST(MessageRequest, AMessageThatCannotBecomeARequestSaysWhy) {
  const auto route = Route(KeySource::kField, "key");
  auto no_body = MessageRequest(route, Message({{"key", "k1"}}));
  ASSERT_FALSE(no_body.has_value());
  EXPECT_NE(no_body.error().message.find("no field 'body'"), std::string::npos);
  auto no_key = MessageRequest(route, Message({{"body", "{}"}}));
  ASSERT_FALSE(no_key.has_value());
  EXPECT_NE(no_key.error().message.find("no field 'key'"), std::string::npos);
  auto not_json = MessageRequest(Route(KeySource::kJson, "/id"), Message({{"body", "{"}}));
  EXPECT_FALSE(not_json.has_value());
  auto not_a_key =
      MessageRequest(Route(KeySource::kJson, "/id"), Message({{"body", R"({"id":1.5})"}}));
  EXPECT_FALSE(not_a_key.has_value());
  // A header line cannot be broken open from a message.
  auto injected = MessageRequest(
      route, Message({{"key", "k1"}, {"body", "{}"}, {"x-trace", "t\r\nX-Admin: yes"}}));
  ASSERT_FALSE(injected.has_value());
  EXPECT_NE(injected.error().message.find("control characters"), std::string::npos);
}

Result<std::optional<FoundRecord>> Found(RecordState state, std::string point = "done") {
  FoundRecord f;
  f.record.state = state;
  f.record.recovery_point = std::move(point);
  return std::optional<FoundRecord>(std::move(f));
}

using Verdict = Judgement::Verdict;

TEST(Judge, AFinishedRecordIsAcknowledgedAndSaysHowItFinished) {
  http::Response created{201, {}, "{}"};
  EXPECT_EQ(Judge(created, Found(RecordState::kSucceeded)).verdict, Verdict::kAck);
  EXPECT_EQ(Judge(created, Found(RecordState::kSucceeded)).outcome, "executed");
  http::Response replayed = created;
  replayed.headers.Set("Idempotent-Replayed", "true");
  EXPECT_EQ(Judge(replayed, Found(RecordState::kSucceeded)).outcome, "duplicate");
  // A duplicate that found it running, and read the record after it had finished.
  const http::Response running =
      http::Problem(http::ProblemKind::kRequestInProgress, "running",
                    {.retry_after_seconds = 1, .key_expires = Timestamp(Millis(1))});
  EXPECT_EQ(Judge(running, Found(RecordState::kSucceeded)).verdict, Verdict::kAck);
  EXPECT_EQ(Judge(running, Found(RecordState::kSucceeded)).outcome, "duplicate");
  http::Response declined{402, {}, "{}"};
  EXPECT_EQ(Judge(declined, Found(RecordState::kFailedFinal)).outcome, "executed");
  EXPECT_EQ(
      Judge(declined, Found(RecordState::kFailedFinal, std::string(kOutcomeUnknownPoint))).outcome,
      "held");
}

TEST(Judge, AnotherPayloadUnderTheKeyIsQuarantinedEvenThoughItsRecordIsFinished) {
  const http::Response reused =
      http::Problem(http::ProblemKind::kIdempotencyKeyReused, "another request",
                    {.key_expires = Timestamp(Millis(1))});
  const Judgement j = Judge(reused, Found(RecordState::kSucceeded));
  EXPECT_EQ(j.verdict, Verdict::kQuarantine);
  EXPECT_EQ(j.reason, "payload-mismatch");
}

TEST(Judge, NothingUnfinishedIsAcknowledged) {
  const Result<std::optional<FoundRecord>> none = std::optional<FoundRecord>();
  EXPECT_EQ(Judge(http::Problem(http::ProblemKind::kInvalidRequest, "bad key"), none).verdict,
            Verdict::kQuarantine);
  EXPECT_EQ(Judge(http::Problem(http::ProblemKind::kUnsupportedMediaType, "json"), none).verdict,
            Verdict::kQuarantine);
  // The dead letter says which fields a validation refused (a payment command's currency).
  const Judgement refused = Judge(
      http::Problem(http::ProblemKind::kValidationFailed, "the request body failed validation",
                    {.errors = {{"currency", "required: one of USD"}, {"amount", "required"}}}),
      none);
  EXPECT_EQ(refused.reason, "invalid");
  EXPECT_EQ(refused.detail,
            "the request body failed validation: currency: required: one of USD; amount: required");
  const Judgement running =
      Judge(http::Problem(http::ProblemKind::kRequestInProgress, "running",
                          {.retry_after_seconds = 2, .key_expires = Timestamp(Millis(1))}),
            Found(RecordState::kProcessing, "forwarded"));
  EXPECT_EQ(running.verdict, Verdict::kWait);
  EXPECT_EQ(running.wait, Millis(2000));
  EXPECT_EQ(Judge(http::Problem(http::ProblemKind::kUnavailable, "store"), none).verdict,
            Verdict::kWait);
  // The store could not be read after the answer: nothing is known, keep the message.
  EXPECT_EQ(Judge(http::Response{201, {}, ""},
                  Result<std::optional<FoundRecord>>(MakeError(Errc::kUnavailable, "down")))
                .verdict,
            Verdict::kWait);
  // A retryable failure, or an unknown outcome still PROCESSING: the broker delivers it again.
  EXPECT_EQ(Judge(http::Response{502, {}, ""}, Found(RecordState::kFailedRetryable)).verdict,
            Verdict::kRetry);
  EXPECT_EQ(
      Judge(http::Response{504, {}, ""}, Found(RecordState::kProcessing, "forwarded")).verdict,
      Verdict::kRetry);
  // An upstream's own 409 on a record that is not finished is no running duplicate of idemd's.
  EXPECT_EQ(Judge(http::Response{409, {}, "{}"}, Found(RecordState::kFailedRetryable)).verdict,
            Verdict::kRetry);
}

}  // namespace
}  // namespace idem::idemd
