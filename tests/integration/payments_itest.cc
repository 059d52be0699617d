// tests/integration/payments_itest.cc — the HTTP contract (docs/openapi.yaml), row by row, over
// real HTTP against real idemd and provider-sim processes. Charges are counted at the provider:
// nothing may be charged twice.
#include <signal.h>
#include <sys/wait.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "tests/integration/idemd_fixture.h"

namespace idem::itest {
namespace {

namespace json = boost::json;

std::string Str(json::object& o, const char* k) {
  const json::value* v = o.if_contains(k);
  return v && v->is_string() ? std::string(v->as_string()) : std::string();
}

// The problem type of a problem+json response.
std::string ProblemType(const http::Response& r) {
  EXPECT_EQ(r.headers.Get("content-type").value_or(""), "application/problem+json");
  auto o = IdemdTest::ParseObject(r.body);
  return Str(o, "type");
}

TEST_F(IdemdTest, FirstRequestChargesOnceAndAnswers201) {
  http::Response r = Pay("order-0001-key", Body("ORD-0001"));
  ASSERT_EQ(r.status, 201) << r.body;
  auto body = ParseObject(r.body);
  const std::string id = Str(body, "id");
  EXPECT_EQ(r.headers.Get("location").value_or(""), "/v1/payments/" + id);
  EXPECT_EQ(r.headers.Get("content-type").value_or(""), "application/json");
  EXPECT_EQ(Str(body, "merchant_order_no"), "ORD-0001");
  EXPECT_EQ(Str(body, "amount"), "100.00");
  EXPECT_EQ(Str(body, "currency"), "CNY");
  EXPECT_EQ(Str(body, "status"), "succeeded");
  EXPECT_EQ(Str(body, "provider_charge_id").rfind("ch_", 0), 0u);
  EXPECT_FALSE(Str(body, "created_at").empty());
  EXPECT_TRUE(r.headers.Get("idempotency-key-expires").has_value());
  EXPECT_FALSE(r.headers.Get("idempotent-replayed").has_value());
  EXPECT_EQ(ChargesFor(id), 1);
}

// An IPv6 listen address, from the file or the flag: idemd serves on [::1] and prints a URL a
// client can use as it is.
TEST_F(IdemdTest, ListensOnAnIpv6Address) {
  const std::string config = dir_.File("idemd-v6.toml");
  WriteConfig(config, {});
  auto v6 = testing::ChildProcess::Spawn({IDEMD_PATH, "--config", config, "--listen", "[::1]:0"},
                                         {{"IDEM_SECRETS", secrets_toml_}}, dir_.path().string(),
                                         dir_.File("idemd-v6.log"));
  ASSERT_TRUE(v6.has_value());
  auto line = v6->WaitForLine("idemd listening on ", std::chrono::seconds(10));
  ASSERT_TRUE(line.has_value()) << line.error().message;
  EXPECT_EQ(line->rfind("http://[::1]:", 0), 0u) << *line;
  auto url = http::ParseHttpUrl(*line);
  ASSERT_TRUE(url.has_value()) << url.error().message;
  EXPECT_EQ(url->host, "::1");
  http::Request req{"POST", "/v1/payments", {}, Body("ORD-V6")};
  req.headers.Set("Authorization", std::string("Bearer ") + kAlice);
  req.headers.Set("Content-Type", "application/json");
  req.headers.Set("Idempotency-Key", "ipv6-key-0001");
  auto answer = http::Call(*url, std::move(req));
  ASSERT_TRUE(answer.has_value()) << answer.error().message;
  EXPECT_EQ(answer->status, 201) << answer->body;
  EXPECT_EQ(TotalCharges(), 1);
}

// W3C Trace Context to the provider: the charge goes with the client's trace and idemd's own span
// as the parent, and every line idemd logs is one JSON object with a time and a level.
TEST_F(IdemdTest, TheProviderGetsTheClientsTraceAndEveryLogLineIsJson) {
  const std::string trace = "0af7651916cd43dd8448eb211c80319c";
  const http::Response paid = Pay("trace-key-0001", Body("ORD-TRACE"), kAlice,
                                  {{"traceparent", "00-" + trace + "-b7ad6b7169203331-00"}});
  ASSERT_EQ(paid.status, 201) << paid.body;
  const std::string payment_id(ParseObject(paid.body).at("id").as_string());
  auto stats = http::Call(provider_url_, http::Request{"GET", "/admin/stats", {}, {}});
  ASSERT_TRUE(stats.has_value());
  const json::object books = ParseObject(stats->body);
  const json::object& sent = books.at("traceparent_by_reference").as_object();
  ASSERT_TRUE(sent.contains(payment_id)) << stats->body;
  const std::string traceparent(sent.at(payment_id).as_string());
  EXPECT_EQ(traceparent.substr(0, 36), "00-" + trace + "-");
  EXPECT_NE(traceparent.substr(36, 16), "b7ad6b7169203331") << "idemd's span, not the client's";
  EXPECT_EQ(traceparent.substr(52), "-00");

  // The access log line is written once the answer is sent: wait for it (at most 5 s), and
  // read only whole lines.
  std::string text;
  for (int i = 0; i < 100; ++i) {
    std::ifstream in(dir_.File("idemd.log"));
    text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    text.erase(text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1);
    if (text.find(R"("msg":"request")") != std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  std::istringstream log(text);
  std::string line;
  std::set<std::string> request_ids;
  int lines = 0;
  while (std::getline(log, line)) {
    ++lines;
    boost::system::error_code ec;
    const json::value v = json::parse(line, ec);
    ASSERT_FALSE(ec) << "not JSON: " << line;
    const json::object& o = v.as_object();
    ASSERT_TRUE(o.contains("time") && o.contains("level") && o.contains("msg")) << line;
    EXPECT_TRUE(http::ParseRfc3339(o.at("time").as_string()).has_value()) << line;
    if (o.at("msg").as_string() == "request") {
      request_ids.insert(std::string(o.at("request_id").as_string()));
      if (o.at("span_id").as_string() == traceparent.substr(36, 16)) {
        EXPECT_EQ(o.at("trace_id").as_string(), trace);
      }
    }
  }
  EXPECT_GE(lines, 2) << "the listening line and the request";
  for (const std::string& id : request_ids) {
    EXPECT_TRUE(std::regex_match(
        id, std::regex("^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")))
        << id;
  }
}

TEST_F(IdemdTest, RetryReplaysTheFirstAnswerByteForByte) {
  http::Response first = Pay("order-0002-key", Body("ORD-0002"));
  ASSERT_EQ(first.status, 201);
  // The same request, written differently: money as a number, a trace id, other member order.
  for (const std::string& body :
       {Body("ORD-0002"), std::string(R"({"currency":"CNY","amount":100,"trace_id":"t-9",)"
                                      R"("merchant_order_no":"ORD-0002"})")}) {
    http::Response again = Pay("order-0002-key", body);
    EXPECT_EQ(again.status, 201);
    EXPECT_EQ(again.body, first.body);
    EXPECT_EQ(again.headers.Get("location"), first.headers.Get("location"));
    EXPECT_EQ(again.headers.Get("content-type"), first.headers.Get("content-type"));
    EXPECT_EQ(again.headers.Get("idempotent-replayed").value_or(""), "true");
    EXPECT_EQ(again.headers.Get("idempotency-key-expires"),
              first.headers.Get("idempotency-key-expires"));
  }
  EXPECT_EQ(TotalCharges(), 1);
}

TEST_F(IdemdTest, SameKeyDifferentRequestIs422) {
  ASSERT_EQ(Pay("order-0003-key", Body("ORD-0003")).status, 201);
  http::Response r = Pay("order-0003-key", Body("ORD-0003", "\"100.01\""));
  EXPECT_EQ(r.status, 422);
  EXPECT_EQ(ProblemType(r), "urn:idem:problem:idempotency-key-reused");
  EXPECT_EQ(TotalCharges(), 1);
}

TEST_F(IdemdTest, DuplicateWhileRunningIs409WithRetryAfterAndLocation) {
  Fault(R"({"fault":"slow","delay_ms":700,"times":1})");  // within the provider timeout (1 s)
  std::thread first([&] { EXPECT_EQ(Pay("order-0004-key", Body("ORD-0004")).status, 201); });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  http::Response dup = Pay("order-0004-key", Body("ORD-0004"));
  first.join();
  EXPECT_EQ(dup.status, 409);
  EXPECT_EQ(ProblemType(dup), "urn:idem:problem:request-in-progress");
  EXPECT_TRUE(dup.headers.Get("retry-after").has_value());
  EXPECT_EQ(dup.headers.Get("location").value_or(""), "/v1/operations/order-0004-key");
  EXPECT_TRUE(dup.headers.Get("idempotency-key-expires").has_value());
  EXPECT_EQ(TotalCharges(), 1);
}

TEST_F(IdemdTest, PreferWaitReturnsTheFirstAnswer) {
  Fault(R"({"fault":"slow","delay_ms":700,"times":1})");
  std::string first_body;
  std::thread first([&] { first_body = Pay("order-0005-key", Body("ORD-0005")).body; });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  http::Response waited = Pay("order-0005-key", Body("ORD-0005"), kAlice, {{"Prefer", "wait=10"}});
  first.join();
  EXPECT_EQ(waited.status, 201);
  EXPECT_EQ(waited.body, first_body);
  EXPECT_EQ(waited.headers.Get("idempotent-replayed").value_or(""), "true");
  EXPECT_EQ(TotalCharges(), 1);
}

TEST_F(IdemdTest, PreferRespondAsyncOnARunningKeyIs202) {
  Fault(R"({"fault":"slow","delay_ms":700,"times":1})");
  std::thread first([&] { Pay("order-0006-key", Body("ORD-0006")); });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  http::Response r = Pay("order-0006-key", Body("ORD-0006"), kAlice, {{"Prefer", "respond-async"}});
  first.join();
  EXPECT_EQ(r.status, 202);
  EXPECT_EQ(r.headers.Get("location").value_or(""), "/v1/operations/order-0006-key");
}

TEST_F(IdemdTest, NewKeyWithRespondAsyncIs202AndTheOperationShowsTheResult) {
  Fault(R"({"fault":"slow","delay_ms":300,"times":1})");
  http::Response r = Pay("order-0007-key", Body("ORD-0007"), kAlice, {{"Prefer", "respond-async"}});
  ASSERT_EQ(r.status, 202) << r.body;
  EXPECT_EQ(r.headers.Get("location").value_or(""), "/v1/operations/order-0007-key");
  json::object op;
  for (int i = 0; i < 100; ++i) {
    op = ParseObject(Get("/v1/operations/order-0007-key").body);
    if (Str(op, "state") == "SUCCEEDED") break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_EQ(Str(op, "state"), "SUCCEEDED");
  EXPECT_EQ(op["status_code"].as_int64(), 201);
  EXPECT_EQ(Str(op["response"].as_object(), "merchant_order_no"), "ORD-0007");
  EXPECT_EQ(TotalCharges(), 1);
}

TEST_F(IdemdTest, DeclineIs402AndFinal) {
  Fault(R"({"fault":"decline","times":1})");
  http::Response r = Pay("order-0008-key", Body("ORD-0008"));
  EXPECT_EQ(r.status, 402);
  EXPECT_EQ(ProblemType(r), "urn:idem:problem:payment-declined");
  // The fault is used up: were the provider called again, it would charge.
  http::Response again = Pay("order-0008-key", Body("ORD-0008"));
  EXPECT_EQ(again.status, 402);
  EXPECT_EQ(again.body, r.body);
  EXPECT_EQ(again.headers.Get("idempotent-replayed").value_or(""), "true");
  EXPECT_EQ(TotalCharges(), 0);
}

// Each final outcome of a payment is announced once in the outbox, written in the completion's
// transaction (docs/outbox.md): its replay, the order paid again under another key, and the
// decline's replay add nothing.
TEST_F(IdemdTest, EachFinalOutcomeIsAnnouncedOnceInTheOutbox) {
  const std::string url = "sqlite://" + dir_.File("idem.db");
  const http::Response paid = Pay("outbox-paid-key", Body("ORD-OUTBOX-1"));
  ASSERT_EQ(paid.status, 201) << paid.body;
  auto body = ParseObject(paid.body);
  const std::string id = Str(body, "id");
  EXPECT_EQ(Pay("outbox-paid-key", Body("ORD-OUTBOX-1")).status, 201);
  EXPECT_EQ(Pay("outbox-other-key", Body("ORD-OUTBOX-1")).status, 200);
  std::vector<OutboxEvent> events = OutboxEventsAt(url, id);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].type, "payment.succeeded");
  EXPECT_EQ(events[0].id, OutboxEventId(id, "payment.succeeded", ""));
  EXPECT_EQ(events[0].sequence, 1);
  EXPECT_FALSE(events[0].published_at_ms.has_value());
  json::object payload = ParseObject(events[0].payload);
  EXPECT_EQ(Str(payload, "type"), "payment.succeeded");
  EXPECT_EQ(Str(payload, "tenant"), "acme");
  EXPECT_FALSE(Str(payload, "occurred_at").empty());
  ASSERT_TRUE(payload["payment"].is_object()) << events[0].payload;
  EXPECT_EQ(payload["payment"].as_object(), body) << "the event carries the payment as POST did";

  Fault(R"({"fault":"decline","times":1})");
  ASSERT_EQ(Pay("outbox-declined-key", Body("ORD-OUTBOX-2")).status, 402);
  ASSERT_EQ(Pay("outbox-declined-key", Body("ORD-OUTBOX-2")).status, 402);
  std::unique_ptr<Store> store = OpenExistingStore(url);
  ASSERT_NE(store, nullptr);
  auto declined = store->Query("SELECT id FROM payments WHERE merchant_order_no = 'ORD-OUTBOX-2'");
  ASSERT_TRUE(declined.has_value() && declined->size() == 1);
  const std::string declined_id = std::get<std::string>(declined->at(0).at(0));
  events = OutboxEventsAt(url, declined_id);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].type, "payment.failed");
  payload = ParseObject(events[0].payload);
  ASSERT_TRUE(payload["payment"].is_object()) << events[0].payload;
  EXPECT_EQ(Str(payload["payment"].as_object(), "status"), "declined");
  auto all = UnpublishedOutboxEvents(*store, 100);
  ASSERT_TRUE(all.has_value());
  EXPECT_EQ(all->size(), 2u) << "nothing else was announced";
}

// A backup restored after a payment (or a failover to a replica the commit had not reached) loses
// the claim, the payment row and the record, but not the charge at the provider. The retry claims
// afresh; its payment id is derived from the merchant order (and how many payments it had), so it
// is the lost payment's id again, the provider recognises its key, and nothing is charged twice.
// Before, the retry's id was drawn at random: a second charge.
TEST_F(IdemdTest, ARestoredBackupDoesNotChargeTheOrderTwice) {
  namespace fs = std::filesystem;
  auto stop = [&] {
    idemd_->Signal(SIGTERM);
    ASSERT_TRUE(idemd_->Wait(std::chrono::seconds(10)).has_value());
  };
  const fs::path db = dir_.File("idem.db");
  const fs::path backup = dir_.File("backup");
  auto copy_files = [](const fs::path& from, const fs::path& to) {
    for (const char* suffix : {"", "-wal", "-shm"}) {
      fs::remove(to.string() + suffix);
      if (fs::exists(from.string() + suffix)) {
        fs::copy_file(from.string() + suffix, to.string() + suffix);
      }
    }
  };
  stop();
  copy_files(db, backup);
  StartIdemd();
  const http::Response paid = Pay("order-0044-key", Body("ORD-0044"));
  ASSERT_EQ(paid.status, 201) << paid.body;
  auto first = ParseObject(paid.body);
  ASSERT_EQ(TotalCharges(), 1);
  stop();
  copy_files(backup, db);  // the restore: the payment and its record are gone
  StartIdemd();
  const http::Response again = Pay("order-0044-key", Body("ORD-0044"));
  ASSERT_EQ(again.status, 201) << again.body;
  EXPECT_FALSE(again.headers.Get("idempotent-replayed").has_value()) << "the record was lost";
  auto second = ParseObject(again.body);
  EXPECT_EQ(Str(second, "id"), Str(first, "id"));
  EXPECT_EQ(Str(second, "provider_charge_id"), Str(first, "provider_charge_id"));
  EXPECT_EQ(TotalCharges(), 1);
}

// A 5xx the provider documents as "nothing was charged" ([provider] nothing_charged_statuses):
// retryable at once, the same key executes again.
TEST_F(IdemdTest, ADeclared5xxIs503AndTheSameKeyExecutesAgain) {
  StartIdemd({.extra_provider = "nothing_charged_statuses = [503]"});
  Fault(R"({"fault":"error","times":1})");
  http::Response r = Pay("order-0009-key", Body("ORD-0009"));
  EXPECT_EQ(r.status, 503);
  EXPECT_TRUE(r.headers.Get("retry-after").has_value());
  EXPECT_EQ(TotalCharges(), 0);
  http::Response again = Pay("order-0009-key", Body("ORD-0009"));
  EXPECT_EQ(again.status, 201) << again.body;
  EXPECT_FALSE(again.headers.Get("idempotent-replayed").has_value());
  EXPECT_EQ(TotalCharges(), 1);
}

// The finding: the provider's front end answers 502 while its back end still makes the charge 3 s
// later, and the provider ignores keys. The 503 is an unknown outcome: the client's retries (every
// second, as idem's client does) look the charge up and are told the operation is in progress
// until the send has settled; the one after the charge landed gets it. One charge in the end.
// Before the fix the retry a second later charged again: two charges.
TEST_F(IdemdTest, AnUndeclared5xxIsAnUnknownOutcomeAndTheLateChargeIsFoundNotRepeated) {
  StartIdemd({.lease_ms = 3000, .provider_timeout_ms = 1000, .settle_ms = 5000});
  ProviderMode(true);
  Fault(R"({"fault":"error","status":502,"charge_after_ms":3000,"times":1})");
  const http::Response first = Pay("order-0042-key", Body("ORD-0042"));
  ASSERT_EQ(first.status, 503) << first.body;
  EXPECT_EQ(ProblemType(first), "urn:idem:problem:provider-unavailable");
  EXPECT_TRUE(first.headers.Get("retry-after").has_value());
  EXPECT_EQ(TotalCharges(), 0) << "the charge has not landed yet";
  auto op = ParseObject(Get("/v1/operations/order-0042-key").body);
  EXPECT_EQ(Str(op, "state"), "PROCESSING");
  EXPECT_EQ(Str(op, "recovery_point"), "charge_sent");
  http::Response again;
  int in_progress = 0;
  for (int i = 0; i < 10; ++i) {
    std::this_thread::sleep_for(std::chrono::seconds(1));
    again = Pay("order-0042-key", Body("ORD-0042"));
    if (again.status != 409) break;
    ++in_progress;
    EXPECT_EQ(ProblemType(again), "urn:idem:problem:request-in-progress");
  }
  EXPECT_GE(in_progress, 1) << "the retry a second after the 502 was not held";
  ASSERT_EQ(again.status, 201) << again.body;
  std::this_thread::sleep_for(std::chrono::milliseconds(3500));  // anything late has landed
  auto body = ParseObject(again.body);
  EXPECT_EQ(ChargesFor(Str(body, "id")), 1);
  EXPECT_EQ(TotalCharges(), 1);
}

// A connection lost after the charge left (the provider charged, then its connection reset,
// before idemd's deadline) is not a timeout but as unknown: 503, and the retry after the settle
// window finds the charge instead of making another, with a provider that ignores keys.
TEST_F(IdemdTest, AConnectionLostAfterTheChargeLeftIs503AndTheRetryFindsTheCharge) {
  ProviderMode(true);
  Fault(R"({"fault":"succeed_then_timeout","delay_ms":200,"times":1})");
  const http::Response first = Pay("order-0043-key", Body("ORD-0043"));
  ASSERT_EQ(first.status, 503) << first.body;
  EXPECT_EQ(TotalCharges(), 1);
  http::Response again;
  for (int i = 0; i < 10; ++i) {
    again = Pay("order-0043-key", Body("ORD-0043"));
    if (again.status != 409) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  ASSERT_EQ(again.status, 201) << again.body;
  EXPECT_EQ(TotalCharges(), 1);
}

// A 5xx after the charge was sent proves nothing (the default provider semantics). The client
// gives that key up; within settle_ms + lease_ms + 2 × reconcile_interval_ms the takeover loop
// finds no charge and releases the order, and a new key for it pays, once.
TEST_F(IdemdTest, AnOrderAbandonedAfterAProvider5xxIsPayableAgainWithinTheBound) {
  constexpr int kReconcileMs = 200;
  StartIdemd({.reconcile_interval_ms = kReconcileMs});
  Fault(R"({"fault":"error","times":1})");
  ASSERT_EQ(Pay("order-0040-key-a", Body("ORD-0040")).status, 503);
  const auto failed_at = std::chrono::steady_clock::now();
  http::Response held = Pay("order-0040-key-b", Body("ORD-0040"));
  EXPECT_EQ(held.status, 409) << held.body;
  EXPECT_EQ(ProblemType(held), "urn:idem:problem:order-in-progress");

  // settle_ms (2000) + lease_ms (3000) + two intervals, and room for a slow machine.
  const auto deadline =
      failed_at + std::chrono::milliseconds(2000 + 3000 + 2 * kReconcileMs + 3000);
  http::Response paid;
  for (int attempt = 0; std::chrono::steady_clock::now() < deadline; ++attempt) {
    paid = Pay("order-0040-key-c" + std::to_string(attempt), Body("ORD-0040"));
    if (paid.status != 409) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_EQ(paid.status, 201) << paid.body;
  EXPECT_EQ(TotalCharges(), 1);
  auto op = ParseObject(Get("/v1/operations/order-0040-key-a").body);
  EXPECT_EQ(Str(op, "state"), "FAILED_RETRYABLE");
  EXPECT_EQ(Str(op, "recovery_point"), "abandoned");
  // The first key, retried late, answers from the payment that holds the order.
  http::Response late = Pay("order-0040-key-a", Body("ORD-0040"));
  EXPECT_EQ(late.status, 200) << late.body;
  EXPECT_EQ(TotalCharges(), 1);
}

TEST_F(IdemdTest, ProviderUnreachableIs503AndRetryable) {
  provider_->Signal(SIGKILL);
  provider_->Wait(std::chrono::seconds(5));
  http::Response r = Pay("order-0010-key", Body("ORD-0010"));
  EXPECT_EQ(r.status, 503);
  auto op = ParseObject(Get("/v1/operations/order-0010-key").body);
  EXPECT_EQ(Str(op, "state"), "FAILED_RETRYABLE");
}

// The provider charged but its answer never came: 504, and the retry finds the charge by
// reference instead of charging again — also with a provider that ignores idempotency keys.
void TimeoutThenRetry(IdemdTest& t, const std::string& key, const std::string& order) {
  t.Fault(R"({"fault":"succeed_then_timeout","delay_ms":3000,"times":1})");
  http::Response r = t.Pay(key, IdemdTest::Body(order));
  EXPECT_EQ(r.status, 504) << r.body;
  EXPECT_EQ(t.TotalCharges(), 1);
  http::Response again = t.Pay(key, IdemdTest::Body(order));
  ASSERT_EQ(again.status, 201) << again.body;
  auto body = IdemdTest::ParseObject(again.body);
  EXPECT_EQ(t.ChargesFor(Str(body, "id")), 1);
  EXPECT_EQ(t.TotalCharges(), 1);
}

TEST_F(IdemdTest, ProviderTimeoutIs504AndTheRetryLooksTheChargeUp) {
  TimeoutThenRetry(*this, "order-0011-key", "ORD-0011");
}

TEST_F(IdemdTest, ProviderTimeoutWithAProviderIgnoringKeys) {
  ProviderMode(true);
  TimeoutThenRetry(*this, "order-0012-key", "ORD-0012");
}

// A provider that ignores keys executes the charge 2.5 s after it arrived, 1.5 s after idemd's
// 1 s timeout, while the client retries every second. The settle window (4 s from the send)
// outlasts the late charge: retries before it lands get 409, the one after finds it, and the
// provider holds exactly one charge in the end.
TEST_F(IdemdTest, AChargeLandingAfterTheTimeoutIsChargedOnceWhileTheClientRetries) {
  StartIdemd({.lease_ms = 3000, .provider_timeout_ms = 1000, .settle_ms = 4000});
  ProviderMode(true);
  Fault(R"({"fault":"late","delay_ms":2500,"times":1})");
  const http::Response first = Pay("order-0040-key", Body("ORD-0040"));
  EXPECT_EQ(first.status, 504) << first.body;
  EXPECT_EQ(TotalCharges(), 0) << "the charge has not landed yet";
  http::Response again;
  for (int i = 0; i < 8; ++i) {
    std::this_thread::sleep_for(std::chrono::seconds(1));
    again = Pay("order-0040-key", Body("ORD-0040"));
    if (again.status != 409) break;
    EXPECT_EQ(ProblemType(again), "urn:idem:problem:request-in-progress");
    EXPECT_TRUE(again.headers.Get("retry-after").has_value());
  }
  ASSERT_EQ(again.status, 201) << again.body;
  std::this_thread::sleep_for(std::chrono::milliseconds(2000));  // anything late has landed
  auto body = ParseObject(again.body);
  EXPECT_EQ(ChargesFor(Str(body, "id")), 1);
  EXPECT_EQ(TotalCharges(), 1);
}

// While a send settles, a plain retry is told to come back when it has settled (409,
// Retry-After), and a retry that may wait (Prefer: wait) parks through the window and gets the
// charge that landed late: it is not turned away at once.
TEST_F(IdemdTest, ARetryThatMayWaitParksThroughTheSettleWindow) {
  StartIdemd({.lease_ms = 3000, .provider_timeout_ms = 1000, .settle_ms = 4000});
  ProviderMode(true);
  Fault(R"({"fault":"late","delay_ms":2500,"times":1})");
  const http::Response first = Pay("order-0041-key", Body("ORD-0041"));
  ASSERT_EQ(first.status, 504) << first.body;
  const http::Response plain = Pay("order-0041-key", Body("ORD-0041"));
  ASSERT_EQ(plain.status, 409) << plain.body;
  EXPECT_EQ(ProblemType(plain), "urn:idem:problem:request-in-progress");
  EXPECT_GE(std::stoi(std::string(plain.headers.Get("retry-after").value_or("0"))), 2)
      << "the settle window has about 3 s left";
  const auto started = std::chrono::steady_clock::now();
  const http::Response waited =
      Pay("order-0041-key", Body("ORD-0041"), kAlice, {{"Prefer", "wait=10"}});
  const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::steady_clock::now() - started);
  ASSERT_EQ(waited.status, 201) << waited.body;
  EXPECT_GE(took, std::chrono::milliseconds(1500)) << "answered before the send had settled";
  auto body = ParseObject(waited.body);
  EXPECT_EQ(ChargesFor(Str(body, "id")), 1);
  EXPECT_EQ(TotalCharges(), 1);
  const http::Response metrics = Get("/metrics", "");
  EXPECT_NE(
      metrics.body.find("idem_requests_total{route=\"payments.create\",outcome=\"in_progress\"} 1"),
      std::string::npos)
      << "the settling retry was not counted in progress:\n"
      << metrics.body;
}

TEST_F(IdemdTest, ValidationFailureIs400WithFieldErrorsAndLeavesNoRecord) {
  http::Response r =
      Pay("order-0013-key",
          R"({"merchant_order_no":"bad order!","amount":"-1","currency":"XXX","extra":1})");
  ASSERT_EQ(r.status, 400);
  EXPECT_EQ(ProblemType(r), "urn:idem:problem:validation-failed");
  auto body = ParseObject(r.body);
  std::set<std::string> fields;
  for (const json::value& e : body["errors"].as_array()) {
    fields.insert(std::string(e.as_object().at("field").as_string()));
  }
  EXPECT_EQ(fields, (std::set<std::string>{"merchant_order_no", "currency", "extra"}));
  EXPECT_EQ(Pay("order-0013-key", Body("ORD-0013", "\"1.001\"")).status, 400);
  EXPECT_EQ(Pay("order-0013-key", Body("ORD-0013", "0")).status, 400);
  EXPECT_EQ(Pay("order-0013-key", Body("ORD-0013", "\"1.5\"", "JPY")).status, 400);
  EXPECT_EQ(Get("/v1/operations/order-0013-key").status, 404);
  EXPECT_EQ(TotalCharges(), 0);
}

TEST_F(IdemdTest, OrderPaidUnderAnotherKeyIs200WithTheExistingPayment) {
  http::Response first = Pay("order-0014-key", Body("ORD-0014"));
  ASSERT_EQ(first.status, 201);
  http::Response other = Pay("order-0014-other", Body("ORD-0014", "100"));
  EXPECT_EQ(other.status, 200) << other.body;
  EXPECT_EQ(ParseObject(other.body)["id"], ParseObject(first.body)["id"]);
  http::Response conflict = Pay("order-0014-third", Body("ORD-0014", "\"99.00\""));
  EXPECT_EQ(conflict.status, 409);
  EXPECT_EQ(ProblemType(conflict), "urn:idem:problem:order-conflict");
  EXPECT_EQ(Pay("order-0014-fourth", Body("ORD-0014", "\"100.00\"", "USD")).status, 409);
  EXPECT_EQ(TotalCharges(), 1);
}

TEST_F(IdemdTest, QuotaOfRetainedKeysIs429WithRetryAfter) {
  StartIdemd({.extra_idempotency = "max_retained = 2"});
  EXPECT_EQ(Pay("quota-key-1", Body("ORD-Q1")).status, 201);
  EXPECT_EQ(Pay("quota-key-2", Body("ORD-Q2")).status, 201);
  http::Response r = Pay("quota-key-3", Body("ORD-Q3"));
  EXPECT_EQ(r.status, 429);
  EXPECT_TRUE(r.headers.Get("retry-after").has_value());
  EXPECT_EQ(ProblemType(r), "urn:idem:problem:quota-exceeded");
  EXPECT_EQ(Pay("quota-key-1", Body("ORD-Q1")).status, 201) << "replays are not limited";
  EXPECT_EQ(Pay("quota-key-3", Body("ORD-Q3"), kBob).status, 201) << "quotas are per principal";
  EXPECT_EQ(TotalCharges(), 3);
}

TEST_F(IdemdTest, QuotaOfRunningKeysIs429) {
  StartIdemd({.extra_idempotency = "max_processing = 1"});
  Fault(R"({"fault":"slow","delay_ms":600,"times":1})");
  std::thread first([&] { EXPECT_EQ(Pay("running-key-1", Body("ORD-R1")).status, 201); });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  http::Response r = Pay("running-key-2", Body("ORD-R2"));
  first.join();
  EXPECT_EQ(r.status, 429);
  EXPECT_TRUE(r.headers.Get("retry-after").has_value());
  EXPECT_EQ(Get("/v1/operations/running-key-2").status, 404) << "a refused claim leaves nothing";
  EXPECT_EQ(Pay("running-key-2", Body("ORD-R2")).status, 201) << "free again once the first ends";
}

TEST_F(IdemdTest, BadInputGetsTheDocumentedStatus) {
  EXPECT_EQ(Pay("order-0016-key", std::string(64 * 1024 + 1, ' ')).status, 413);
  EXPECT_EQ(Pay("order-0016-key", R"({"merchant_order_no":)").status, 400);
  EXPECT_EQ(Pay("order-0016-key", "{\"merchant_order_no\":\"\xff\"}").status, 400);
  EXPECT_EQ(Pay("order-0016-key", std::string(100, '[') + std::string(100, ']')).status, 400);
  EXPECT_EQ(
      Pay("order-0016-key", Body("ORD-0016"), kAlice, {{"Content-Type", "text/plain"}}).status,
      415);
  EXPECT_EQ(Pay("", Body("ORD-0016")).status, 400);
  EXPECT_EQ(Pay("short", Body("ORD-0016")).status, 400);
  EXPECT_EQ(Pay(std::string(256, 'k'), Body("ORD-0016")).status, 400);
  EXPECT_EQ(Pay("bad key with spaces", Body("ORD-0016")).status, 400);
  EXPECT_EQ(Get("/v1/operations/order-0016-key").status, 404);
  EXPECT_EQ(TotalCharges(), 0);
  // The server is unharmed.
  EXPECT_EQ(Pay("order-0016-key", Body("ORD-0016")).status, 201);
}

TEST_F(IdemdTest, MissingOrUnknownApiKeyIs401) {
  http::Response r = Pay("order-0017-key", Body("ORD-0017"), "not-a-real-key");
  EXPECT_EQ(r.status, 401);
  EXPECT_EQ(r.headers.Get("www-authenticate").value_or(""), "Bearer");
  EXPECT_EQ(Get("/v1/payments/pay_x", "").status, 401);
  EXPECT_EQ(Get("/v1/operations/order-0017-key", "").status, 401);
  EXPECT_EQ(TotalCharges(), 0);
}

TEST_F(IdemdTest, PaymentsAndOperationsAreScopedToTheirOwners) {
  http::Response r = Pay("order-0018-key", Body("ORD-0018"));
  ASSERT_EQ(r.status, 201);
  const std::string location = std::string(r.headers.Get("location").value_or(""));
  http::Response mine = Get(location);
  EXPECT_EQ(mine.status, 200);
  EXPECT_EQ(ParseObject(mine.body)["id"], ParseObject(r.body)["id"]);
  EXPECT_EQ(Get(location, kCarol).status, 404) << "another tenant";
  EXPECT_EQ(Get("/v1/payments/pay_doesnotexist").status, 404);
  EXPECT_EQ(Get("/v1/operations/order-0018-key").status, 200);
  EXPECT_EQ(Get("/v1/operations/order-0018-key", kBob).status, 404) << "another user";
  EXPECT_EQ(Get("/v1/operations/order-0018-key", kCarol).status, 404) << "another tenant";
}

TEST_F(IdemdTest, OperationShowsStateWhileRunningAndTheResponseOnceFinished) {
  Fault(R"({"fault":"slow","delay_ms":800,"times":1})");
  std::thread first([&] { Pay("order-0019-key", Body("ORD-0019")); });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  auto running = ParseObject(Get("/v1/operations/order-0019-key").body);
  first.join();
  EXPECT_EQ(Str(running, "state"), "PROCESSING");
  EXPECT_EQ(Str(running, "recovery_point"), "charge_sent");
  EXPECT_FALSE(running.contains("response"));
  auto done = ParseObject(Get("/v1/operations/order-0019-key").body);
  EXPECT_EQ(Str(done, "state"), "SUCCEEDED");
  EXPECT_EQ(Str(done, "key"), "order-0019-key");
  EXPECT_TRUE(done.contains("created_at") && done.contains("expires_at"));
  EXPECT_EQ(Str(done["response"].as_object(), "status"), "succeeded");
}

TEST_F(IdemdTest, HealthReadinessAndMetrics) {
  EXPECT_EQ(Get("/healthz", "").status, 200);
  EXPECT_EQ(Get("/readyz", "").status, 200);
  ASSERT_EQ(Pay("order-0020-key", Body("ORD-0020")).status, 201);
  ASSERT_EQ(Pay("order-0020-key", Body("ORD-0020")).status, 201);
  ASSERT_EQ(Pay("order-0020-key", Body("ORD-0020", "1")).status, 422);
  http::Response m = Get("/metrics", "");
  EXPECT_EQ(m.status, 200);
  EXPECT_NE(m.body.find(R"(idem_requests_total{route="payments.create",outcome="executed"} 1)"),
            std::string::npos);
  EXPECT_NE(m.body.find(R"(idem_requests_total{route="payments.create",outcome="replayed"} 1)"),
            std::string::npos);
  EXPECT_NE(m.body.find(R"(idem_requests_total{route="payments.create",outcome="mismatch"} 1)"),
            std::string::npos);
  EXPECT_NE(m.body.find(R"(idem_provider_request_duration_seconds_count{operation="charge"} 1)"),
            std::string::npos);
}

TEST_F(IdemdTest, SixtyFourConcurrentDuplicatesChargeOnce) {
  Fault(R"({"fault":"slow","delay_ms":300,"times":1})");
  std::vector<std::thread> threads;
  std::atomic<int> created{0}, conflict{0}, other{0};
  for (int i = 0; i < 64; ++i) {
    threads.emplace_back([&] {
      const int status = Pay("order-0021-key", Body("ORD-0021")).status;
      (status == 201 ? created : status == 409 ? conflict : other)++;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(other.load(), 0);
  EXPECT_GE(created.load(), 1);
  EXPECT_EQ(created.load() + conflict.load(), 64);
  EXPECT_EQ(TotalCharges(), 1);
}

TEST_F(IdemdTest, SixtyFourConcurrentDuplicatesWithPreferWaitGetTheSameBody) {
  Fault(R"({"fault":"slow","delay_ms":300,"times":1})");
  std::vector<std::thread> threads;
  std::vector<http::Response> responses(64);
  for (int i = 0; i < 64; ++i) {
    threads.emplace_back([&, i] {
      responses[static_cast<std::size_t>(i)] =
          Pay("order-0022-key", Body("ORD-0022"), kAlice, {{"Prefer", "wait=10"}});
    });
  }
  for (auto& t : threads) t.join();
  for (const http::Response& r : responses) {
    EXPECT_EQ(r.status, 201);
    EXPECT_EQ(r.body, responses[0].body);
  }
  EXPECT_EQ(TotalCharges(), 1);
}

TEST_F(IdemdTest, SigtermDrainsAndExitsZero) {
  Fault(R"({"fault":"slow","delay_ms":500,"times":1})");
  std::thread first([&] { EXPECT_EQ(Pay("order-0023-key", Body("ORD-0023")).status, 201); });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  idemd_->Signal(SIGTERM);
  first.join();
  auto status = idemd_->Wait(std::chrono::seconds(10));
  ASSERT_TRUE(status.has_value());
  EXPECT_TRUE(WIFEXITED(*status));
  EXPECT_EQ(WEXITSTATUS(*status), 0);
}

}  // namespace
}  // namespace idem::itest
