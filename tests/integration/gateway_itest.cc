// tests/integration/gateway_itest.cc — idemd's gateway routes in front of upstream-sim, a service
// that executes every request it gets and counts them (tools/upstream_sim): real processes over
// loopback. Every test asserts the upstream's execution count.
#include <signal.h>

#include <atomic>
#include <fstream>
#include <thread>

#include "tests/integration/idemd_fixture.h"

namespace idem::itest {
namespace {

class GatewayTest : public IdemdTest {
 public:
  void SetUp() override {
    StartService(UPSTREAM_SIM_PATH, "upstream-sim", "upstream.log", &upstream_, &upstream_url_);
    if (HasFatalFailure()) return;
    IdemdTest::SetUp();
    if (HasFatalFailure()) return;
    StartIdemd(WithRoutes());
  }

  // The routes, and requests no route matches passed through to `upstream`.
  IdemdOptions WithPassThrough(const std::string& upstream) const {
    IdemdOptions o = WithRoutes();
    o.extra_tables =
        "[gateway]\nunmatched = \"forward\"\nupstream = \"" + upstream + "\"\n" + o.extra_tables;
    return o;
  }

  IdemdOptions WithRoutes() const {
    const std::string upstream = "http://127.0.0.1:" + std::to_string(upstream_url_.port);
    IdemdOptions o;
    o.extra_tables =
        "[[routes]]\nname = \"orders.create\"\nmatch = \"POST /v1/orders\"\n"
        "upstream = \"" +
        upstream +
        "\"\n"
        "fingerprint.ignore = [\"trace_id\"]\n"
        "fingerprint.decimals = [\"amount\"]\n"
        "final_statuses = [\"2xx\", 400, 404, 422]\n"
        "store_headers = [\"Location\", \"Content-Type\"]\n"
        "forward_key_header = \"Idempotency-Key\"\n"
        // Declared, so that the tests can show what a re-forward does (upstream-sim executes it).
        "upstream_deduplicates = true\n"
        "lease_ms = 2000\ntimeout_ms = 500\n"
        "[[routes]]\nname = \"orders.capture\"\n"
        "match = \"PUT /v1/orders/{id}/capture\"\n"
        "upstream = \"" +
        upstream +
        "\"\n"
        "store_headers = [\"Content-Type\"]\n"
        "[[routes]]\nname = \"notes.create\"\nmatch = \"POST /v1/notes\"\n"
        "upstream = \"" +
        upstream + "\"\nkey = \"optional\"\n" +
        "[[routes]]\nname = \"transfers.create\"\nmatch = \"POST /v1/transfers\"\n"
        "upstream = \"" +
        upstream +
        "\"\nforward_key_header = \"Idempotency-Key\"\nstatus_path = \"/status/{key}\"\n"
        // upstream-sim's delayed requests execute up to 500 ms after they timed out here.
        "final_statuses = [\"2xx\", 422]\nlease_ms = 2000\ntimeout_ms = 500\n"
        "late_execution_ms = 500\nnothing_done_statuses = [503]\n"
        "[[routes]]\nname = \"forms.create\"\nmatch = \"POST /v1/forms\"\n"
        "upstream = \"" +
        upstream +
        "\"\nbody = \"bytes\"\n"
        // Neither a status URL nor declared deduplication: unknown outcomes are held.
        "[[routes]]\nname = \"payouts.create\"\nmatch = \"POST /v1/payouts\"\n"
        "upstream = \"" +
        upstream +
        "\"\nforward_key_header = \"Idempotency-Key\"\nlease_ms = 2000\ntimeout_ms = 500\n"
        "nothing_done_statuses = [503]\n";
    return o;
  }

  http::Response Call(const std::string& method, const std::string& target, const std::string& key,
                      const std::string& body,
                      const std::vector<std::pair<std::string, std::string>>& headers = {},
                      const std::string& api_key = kAlice) {
    http::Request req;
    req.method = method;
    req.target = target;
    req.headers.Set("Authorization", "Bearer " + api_key);
    req.headers.Set("Content-Type", "application/json");
    req.headers.Set("Cookie", "client-session=secret");
    if (!key.empty()) req.headers.Set("Idempotency-Key", key);
    for (const auto& [n, v] : headers) req.headers.Set(n, v);
    req.body = body;
    return Send(std::move(req));
  }

  // Sends `body` to `path` with `key` (the upstream takes 400 ms), SIGKILLs idemd 150 ms later,
  // while the request is at the upstream, then restarts it with the takeover loop every 200 ms.
  void KillDuringForwardAndRestart(const std::string& path, const std::string& key,
                                   const std::string& body) {
    std::thread killer([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(150));
      KillIdemd();
    });
    http::Request req{"POST", path, {}, body};
    req.headers.Set("Authorization", std::string("Bearer ") + kAlice);
    req.headers.Set("Content-Type", "application/json");
    req.headers.Set("Idempotency-Key", key);
    req.headers.Set("X-Upstream-Delay-Ms", "400");
    auto lost = http::Call(idemd_url_, req);
    killer.join();
    EXPECT_FALSE(lost.has_value()) << "answered before the kill: " << lost->status;
    IdemdOptions restart = WithRoutes();
    restart.reconcile_interval_ms = 200;
    StartIdemd(restart);
  }

  // A route like transfers.create named `name` on `path`, with `extra` lines.
  std::string StatusRoute(const std::string& name, const std::string& path,
                          const std::string& extra) const {
    return "[[routes]]\nname = \"" + name + "\"\nmatch = \"POST " + path +
           "\"\nupstream = \"http://127.0.0.1:" + std::to_string(upstream_url_.port) +
           "\"\nforward_key_header = \"Idempotency-Key\"\nstatus_path = \"/status/{key}\"\n"
           "lease_ms = 2000\ntimeout_ms = 500\nlate_execution_ms = 500\n" +
           extra;
  }

  // How upstream-sim's status URL answers (POST /admin/status).
  void StatusUrl(const std::string& json) {
    http::Request req{"POST", "/admin/status", {}, json};
    auto r = http::Call(upstream_url_, std::move(req));
    ASSERT_TRUE(r.has_value() && r->status == 200);
  }

  // upstream-sim's books.
  boost::json::object Executions() {
    http::Request req{"GET", "/admin/executions", {}, ""};
    auto r = http::Call(upstream_url_, std::move(req));
    EXPECT_TRUE(r.has_value() && r->status == 200);
    return r ? ParseObject(r->body) : boost::json::object{};
  }
  int64_t Total() { return Executions().at("total").as_int64(); }

  std::optional<testing::ChildProcess> upstream_;
  http::Url upstream_url_;
};

TEST_F(GatewayTest, TheFirstRequestIsForwardedOnceAndEveryRetryGetsItsAnswer) {
  auto first = Call("POST", "/v1/orders", "order-key-0001", R"({"sku":"A1","amount":"10.50"})");
  ASSERT_EQ(first.status, 201) << first.body;
  EXPECT_FALSE(first.headers.Get("Idempotent-Replayed").has_value());
  EXPECT_EQ(first.headers.Get("Location"), "/things/1");
  EXPECT_FALSE(first.headers.Get("Set-Cookie").has_value()) << "cookies are never passed on";
  EXPECT_FALSE(first.headers.Get("X-Upstream-Execution").has_value())
      << "only the route's store_headers are kept, so a replay is the same answer";
  EXPECT_EQ(ParseObject(first.body).at("execution").as_int64(), 1);

  // A retry, with the amount written differently and another trace id: the same request.
  for (int i = 0; i < 3; ++i) {
    auto retry = Call("POST", "/v1/orders", "order-key-0001",
                      R"({"amount":10.5,"sku":"A1","trace_id":")" + std::to_string(i) + "\"}");
    ASSERT_EQ(retry.status, 201) << retry.body;
    EXPECT_EQ(retry.headers.Get("Idempotent-Replayed"), "true");
    EXPECT_EQ(retry.body, first.body);
    EXPECT_EQ(retry.headers.Get("Location"), "/things/1");
  }
  const boost::json::object books = Executions();
  EXPECT_EQ(books.at("total").as_int64(), 1);
  EXPECT_EQ(books.at("credentials_seen").as_int64(), 0)
      << "Authorization and Cookie are never forwarded";
  // The upstream got a stable key of the operation, not the client's.
  const boost::json::object& keys = books.at("keys").as_object();
  ASSERT_EQ(keys.size(), 1u);
  EXPECT_EQ(keys.begin()->key().size(), 64u);
  EXPECT_FALSE(keys.contains("order-key-0001"));
  // Metrics per route: one exchange with the upstream, three replays.
  const std::string metrics = Get("/metrics").body;
  EXPECT_NE(
      metrics.find("idem_upstream_request_duration_seconds_count{route=\"orders.create\"} 1\n"),
      std::string::npos)
      << metrics;
  EXPECT_NE(metrics.find("idem_requests_total{route=\"orders.create\",outcome=\"replayed\"} 3\n"),
            std::string::npos)
      << metrics;
  EXPECT_NE(metrics.find("idem_provider_request_duration_seconds_count{operation=\"charge\"} 0\n"),
            std::string::npos)
      << "the upstream is not the payments provider";
}

// W3C Trace Context through the gateway: the upstream gets the client's trace with idemd's own span
// as the parent, and idemd's log line names both.
TEST_F(GatewayTest, TheUpstreamGetsTheClientsTraceWithIdemdsSpanAsTheParent) {
  const std::string trace = "4bf92f3577b34da6a3ce929d0e0e4736";
  const std::string client_span = "00f067aa0ba902b7";
  auto first = Call("POST", "/v1/orders", "order-trace-0001", R"({"sku":"T1"})",
                    {{"traceparent", "00-" + trace + "-" + client_span + "-01"},
                     {"tracestate", "vendor=opaque"}});
  ASSERT_EQ(first.status, 201) << first.body;
  const std::string sent(ParseObject(first.body).at("traceparent").as_string());
  ASSERT_EQ(sent.size(), 55u) << sent;
  EXPECT_EQ(sent.substr(0, 36), "00-" + trace + "-") << "the client's trace goes on";
  const std::string idemd_span = sent.substr(36, 16);
  EXPECT_NE(idemd_span, client_span) << "idemd's own span is the parent";
  EXPECT_EQ(sent.substr(52), "-01") << "the sampled flag is kept";
  EXPECT_EQ(ParseObject(first.body).at("tracestate"), "vendor=opaque");
  // The access line of that request carries the trace and idemd's span. idemd writes it after the
  // answer, so it may come a moment after the answer did.
  bool logged = false;
  for (int i = 0; i < 100 && !logged; ++i) {
    if (i > 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    std::ifstream log(dir_.File("idemd.log"));
    std::string line;
    while (std::getline(log, line)) {
      if (line.find("\"msg\":\"request\"") == std::string::npos) continue;
      const boost::json::object o = boost::json::parse(line).as_object();
      if (o.at("span_id").as_string() == idemd_span) {
        logged = true;
        EXPECT_EQ(o.at("trace_id").as_string(), trace);
        EXPECT_EQ(o.at("route").as_string(), "orders.create");
      }
    }
  }
  EXPECT_TRUE(logged) << "no request line with span_id " << idemd_span;
  // Without a traceparent, idemd starts a trace and the upstream still gets one.
  auto second = Call("POST", "/v1/orders", "order-trace-0002", R"({"sku":"T2"})",
                     {{"tracestate", "vendor=orphan"}});
  ASSERT_EQ(second.status, 201) << second.body;
  const std::string started(ParseObject(second.body).at("traceparent").as_string());
  EXPECT_EQ(started.size(), 55u);
  EXPECT_EQ(started.find(trace), std::string::npos);
  EXPECT_TRUE(ParseObject(second.body).at("tracestate").is_null())
      << "a tracestate without its traceparent is dropped";
}

TEST_F(GatewayTest, TheSameKeyWithAnotherRequestIs422AndExecutesNothing) {
  ASSERT_EQ(Call("POST", "/v1/orders", "order-key-0002", R"({"sku":"A1"})").status, 201);
  auto other = Call("POST", "/v1/orders", "order-key-0002", R"({"sku":"B2"})");
  EXPECT_EQ(other.status, 422) << other.body;
  EXPECT_NE(other.body.find("idempotency-key-reused"), std::string::npos) << other.body;
  // The path is part of the request: the same key on another order's capture is another request.
  ASSERT_EQ(Call("PUT", "/v1/orders/1/capture", "capture-key-1", "{}").status, 201);
  EXPECT_EQ(Call("PUT", "/v1/orders/2/capture", "capture-key-1", "{}").status, 422);
  // Another principal's identical key is its own operation.
  EXPECT_EQ(Call("POST", "/v1/orders", "order-key-0002", R"({"sku":"B2"})", {}, kCarol).status,
            201);
  EXPECT_EQ(Total(), 3);
}

TEST_F(GatewayTest, ConcurrentDuplicatesExecuteOnce) {
  constexpr int kCopies = 50;
  std::atomic<int> created{0}, in_progress{0}, other{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kCopies; ++i) {
    threads.emplace_back([&] {
      auto r = Call("POST", "/v1/orders", "order-key-0003", R"({"sku":"C3"})",
                    {{"X-Upstream-Delay-Ms", "300"}});
      (r.status == 201 ? created : r.status == 409 ? in_progress : other)++;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(other.load(), 0);
  EXPECT_GE(created.load(), 1);
  EXPECT_EQ(created.load() + in_progress.load(), kCopies);
  EXPECT_EQ(Total(), 1);
}

// A duplicate of a request the upstream is still executing: Prefer: wait holds it until the answer
// is in; Prefer: respond-async answers 202 with the operation's URL, which shows it running, then
// its answer. One execution.
TEST_F(GatewayTest, ASlowUpstreamsDuplicatesWaitForItsAnswerOrComeBackToItsOperation) {
  std::optional<http::Response> first;
  std::thread slow([&] {
    first = Call("POST", "/v1/orders", "order-key-0010", R"({"sku":"F6"})",
                 {{"X-Upstream-Delay-Ms", "400"}});
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  auto later = Call("POST", "/v1/orders", "order-key-0010", R"({"sku":"F6"})",
                    {{"Prefer", "respond-async"}});
  EXPECT_EQ(later.status, 202) << later.body;
  const std::string location(later.headers.Get("Location").value_or(""));
  EXPECT_EQ(location, "/v1/operations/order-key-0010?route=orders.create");
  auto running = Get(location);
  EXPECT_EQ(running.status, 200) << running.body;
  EXPECT_EQ(ParseObject(running.body).at("state").as_string(), "PROCESSING") << running.body;
  EXPECT_EQ(ParseObject(running.body).at("recovery_point").as_string(), "forwarded");
  auto waited =
      Call("POST", "/v1/orders", "order-key-0010", R"({"sku":"F6"})", {{"Prefer", "wait=5"}});
  slow.join();
  ASSERT_TRUE(first.has_value());
  ASSERT_EQ(first->status, 201) << first->body;
  EXPECT_EQ(waited.status, 201) << waited.body;
  EXPECT_EQ(waited.headers.Get("Idempotent-Replayed"), "true");
  EXPECT_EQ(waited.body, first->body);
  auto done = Get(location);
  ASSERT_EQ(done.status, 200) << done.body;
  const boost::json::object operation = ParseObject(done.body);
  EXPECT_EQ(operation.at("state").as_string(), "SUCCEEDED");
  EXPECT_EQ(operation.at("status_code").as_int64(), 201);
  EXPECT_EQ(operation.at("recovery_point").as_string(), "done");
  EXPECT_EQ(boost::json::serialize(operation.at("response")), first->body);
  // The operation is the caller's own, and on its own route.
  EXPECT_EQ(Get(location, kCarol).status, 404);
  EXPECT_EQ(Get("/v1/operations/order-key-0010").status, 404) << "payments has no such key";
  EXPECT_EQ(Get("/v1/operations/order-key-0010?route=no.such.route").status, 404);
  EXPECT_EQ(Total(), 1);
}

TEST_F(GatewayTest, OversizedAndMalformedRequestsAreRefusedAndNothingIsForwarded) {
  auto oversized = Call("POST", "/v1/orders", "order-key-0011",
                        R"({"sku":")" + std::string(70 * 1024, 'x') + "\"}");
  EXPECT_EQ(oversized.status, 413) << oversized.body;
  auto malformed = Call("POST", "/v1/orders", "order-key-0012", R"({"sku":)");
  EXPECT_EQ(malformed.status, 400) << malformed.body;
  EXPECT_NE(malformed.body.find("invalid JSON at byte 7"), std::string::npos) << malformed.body;
  auto bad_key = Call("POST", "/v1/orders", "bad key!", R"({"sku":"G7"})");
  EXPECT_EQ(bad_key.status, 400) << bad_key.body;
  // Refused requests hold no key: the same key with a good request is its first execution.
  EXPECT_EQ(Call("POST", "/v1/orders", "order-key-0012", R"({"sku":"G7"})").status, 201);
  EXPECT_EQ(Total(), 1);
}

TEST_F(GatewayTest, AnUpstreamTimeoutLeavesTheOutcomeUnknownAndTheRetryForwardsWithTheSameKey) {
  auto slow = Call("POST", "/v1/orders", "order-key-0004", R"({"sku":"D4"})",
                   {{"X-Upstream-Delay-Ms", "1500"}});
  EXPECT_EQ(slow.status, 504) << slow.body;
  EXPECT_NE(slow.body.find("upstream-timeout"), std::string::npos) << slow.body;
  auto retry = Call("POST", "/v1/orders", "order-key-0004", R"({"sku":"D4"})");
  ASSERT_EQ(retry.status, 201) << retry.body;
  EXPECT_FALSE(retry.headers.Get("Idempotent-Replayed").has_value());
  const boost::json::object books = Executions();
  EXPECT_EQ(books.at("total").as_int64(), 2)
      << "the route declares upstream_deduplicates; upstream-sim does not, and executes again";
  const boost::json::object& keys = books.at("keys").as_object();
  ASSERT_EQ(keys.size(), 1u) << "both forwards carried the same upstream key";
  EXPECT_EQ(keys.begin()->value().as_int64(), 2);
  EXPECT_EQ(Call("POST", "/v1/orders", "order-key-0004", R"({"sku":"D4"})").body, retry.body);
}

// The upstream key is one per operation: every forward of one operation carries it, and once its
// record has expired the same client key is a new operation, with a new upstream key, so an
// upstream that keeps keys longer than idemd does not answer it with the earlier execution.
TEST_F(GatewayTest, AnOperationKeepsOneUpstreamKeyAndANewOneAfterExpiryGetsAnother) {
  IdemdOptions options = WithRoutes();
  options.extra_tables +=
      "[[routes]]\nname = \"tokens.create\"\nmatch = \"POST /v1/tokens\"\n"
      "upstream = \"http://127.0.0.1:" +
      std::to_string(upstream_url_.port) +
      "\"\nforward_key_header = \"Idempotency-Key\"\nupstream_deduplicates = true\n"
      "lease_ms = 1200\ntimeout_ms = 300\nretention_ms = 2000\n";
  StartIdemd(options);
  auto slow =
      Call("POST", "/v1/tokens", "token-key-0001", R"({"n":1})", {{"X-Upstream-Delay-Ms", "700"}});
  EXPECT_EQ(slow.status, 504) << slow.body;
  auto retry = Call("POST", "/v1/tokens", "token-key-0001", R"({"n":1})");
  ASSERT_EQ(retry.status, 201) << retry.body;
  const std::string first_key(ParseObject(retry.body).at("key").as_string());
  EXPECT_EQ(first_key.size(), 64u);
  EXPECT_EQ(Executions().at("keys").as_object().at(first_key).as_int64(), 2)
      << "the retry of the operation carried its key";

  std::this_thread::sleep_for(std::chrono::milliseconds(2300));  // retention_ms = 2000
  auto again = Call("POST", "/v1/tokens", "token-key-0001", R"({"n":1})");
  ASSERT_EQ(again.status, 201) << again.body;
  EXPECT_FALSE(again.headers.Get("Idempotent-Replayed").has_value()) << "the record had expired";
  const std::string second_key(ParseObject(again.body).at("key").as_string());
  EXPECT_EQ(second_key.size(), 64u);
  EXPECT_NE(second_key, first_key) << "a new operation must not send the earlier one's key";
  const boost::json::object books = Executions();
  EXPECT_EQ(books.at("keys").as_object().size(), 2u);
  EXPECT_EQ(books.at("total").as_int64(), 3);
}

// payouts.create has no status URL and does not declare upstream_deduplicates: after a forward
// whose outcome is unknown nothing is forwarded again; retries get a final 502 naming it.
TEST_F(GatewayTest, WithoutAStatusUrlOrDeduplicationAnUnknownOutcomeIsHeld) {
  auto slow = Call("POST", "/v1/payouts", "payout-key-0001", R"({"to":"R"})",
                   {{"X-Upstream-Delay-Ms", "1500"}});
  EXPECT_EQ(slow.status, 504) << slow.body;
  EXPECT_NE(slow.body.find("not forwarded again"), std::string::npos) << slow.body;
  auto held = Call("POST", "/v1/payouts", "payout-key-0001", R"({"to":"R"})");
  EXPECT_EQ(held.status, 502) << held.body;
  EXPECT_NE(held.body.find("urn:idem:problem:upstream-outcome-unknown"), std::string::npos)
      << held.body;
  auto replay = Call("POST", "/v1/payouts", "payout-key-0001", R"({"to":"R"})");
  EXPECT_EQ(replay.headers.Get("Idempotent-Replayed"), "true") << replay.body;
  EXPECT_EQ(replay.body, held.body);
  EXPECT_EQ(Total(), 1) << "never forwarded a second time";
  EXPECT_NE(Get("/metrics")
                .body.find("idem_gateway_unknown_outcomes_total{route=\"payouts.create\"} 1\n"),
            std::string::npos);
  // A forward the upstream answered with a status it declares as "nothing done" is known: it is
  // forwarded again.
  EXPECT_EQ(
      Call("POST", "/v1/payouts", "payout-key-0002", "{}", {{"X-Upstream-Status", "503"}}).status,
      503);
  EXPECT_EQ(Call("POST", "/v1/payouts", "payout-key-0002", "{}").status, 201);
  EXPECT_EQ(Total(), 3);
}

// A failure answer is not proof of no work: upstream-sim executes the payout and answers 500.
// 500 is not in the route's nothing_done_statuses, so the outcome is unknown, as after a timeout:
// on this route (no status URL, no deduplication) it is held, never forwarded again. Before, the
// 500 was retryable and the retry paid the payout a second time.
TEST_F(GatewayTest, AFiveHundredThatMayHaveActedIsNeverForwardedAgainOnItsOwn) {
  auto failed = Call("POST", "/v1/payouts", "payout-key-0500", R"({"to":"F"})",
                     {{"X-Upstream-Status", "500"}});
  EXPECT_EQ(failed.status, 502) << failed.body;
  EXPECT_NE(failed.body.find("urn:idem:problem:upstream-failed"), std::string::npos) << failed.body;
  EXPECT_NE(failed.body.find("answered 500"), std::string::npos) << failed.body;
  EXPECT_EQ(Total(), 1);
  for (int retry = 0; retry < 2; ++retry) {
    auto held = Call("POST", "/v1/payouts", "payout-key-0500", R"({"to":"F"})");
    EXPECT_EQ(held.status, 502) << held.body;
    EXPECT_NE(held.body.find("urn:idem:problem:upstream-outcome-unknown"), std::string::npos)
        << held.body;
  }
  EXPECT_EQ(Total(), 1) << "executed once, however often the client retried";
}

// A held outcome waits for an operator: idemctl lists it and settles it, executed (every copy then
// gets the answer the operator stored, and nothing is forwarded) or not executed (the next copy
// forwards, with the upstream key of the first forward). Each is settled once.
TEST_F(GatewayTest, AnOperatorListsAndSettlesHeldOutcomesWithIdemctl) {
  for (const char* key : {"payout-key-0101", "payout-key-0102"}) {
    ASSERT_EQ(
        Call("POST", "/v1/payouts", key, R"({"to":"S"})", {{"X-Upstream-Delay-Ms", "1500"}}).status,
        504);
    ASSERT_EQ(Call("POST", "/v1/payouts", key, R"({"to":"S"})").status, 502);
  }
  ASSERT_EQ(Total(), 2);
  const std::string config = dir_.File("idemd.toml");
  auto [listed, listing] = RunIdemctl({"record", "held", "--config", config, "-o", "json"});
  ASSERT_EQ(listed, 0) << listing;
  const boost::json::array held = boost::json::parse(listing).as_array();
  ASSERT_EQ(held.size(), 2u) << listing;
  for (const auto& record : held) {
    EXPECT_EQ(record.at("route").as_string(), "gw.payouts.create");
    EXPECT_EQ(record.at("state").as_string(), "FAILED_FINAL");
    EXPECT_EQ(record.at("recovery_point").as_string(), "outcome_unknown");
  }
  // The second held is the one settled by its scope hash below (the listing does not know keys).
  const auto inspect = [&](const std::string& key) {
    auto [code, out] =
        RunIdemctl({"record", "inspect", "--config", config, "--route", "gw.payouts.create",
                    "--tenant", "acme", "--user", "alice", "--key", key, "-o", "json"});
    EXPECT_EQ(code, 0) << out;
    return code == 0 ? ParseObject(out) : boost::json::object{};
  };
  const std::string second_scope(inspect("payout-key-0102").at("scope_hash").as_string());
  const std::string upstream_key(inspect("payout-key-0102").at("resource_id").as_string());

  // Executed: the operator's answer is every copy's from now on.
  const std::string answer_file = dir_.File("payout-answer.json");
  std::ofstream(answer_file) << R"({"payout":"po_77","state":"sent"})";
  auto [settled, settled_out] = RunIdemctl(
      {"record", "settle", "--config", config, "--route", "gw.payouts.create", "--tenant", "acme",
       "--user", "alice", "--key", "payout-key-0101", "--executed", "--status", "201",
       "--body-file", answer_file, "--content-type", "application/json"});
  ASSERT_EQ(settled, 0) << settled_out;
  auto replay = Call("POST", "/v1/payouts", "payout-key-0101", R"({"to":"S"})");
  EXPECT_EQ(replay.status, 201) << replay.body;
  EXPECT_EQ(replay.body, R"({"payout":"po_77","state":"sent"})");
  EXPECT_EQ(replay.headers.Get("Content-Type"), "application/json");
  EXPECT_EQ(replay.headers.Get("Idempotent-Replayed"), "true");
  auto [again, again_out] = RunIdemctl({"record", "settle", "--config", config, "--route",
                                        "gw.payouts.create", "--tenant", "acme", "--user", "alice",
                                        "--key", "payout-key-0101", "--not-executed"});
  EXPECT_EQ(again, 6) << "settled once: " << again_out;
  EXPECT_EQ(Total(), 2) << "nothing forwarded";

  // Not executed: the next copy forwards, under the first forward's upstream key.
  auto [retry_ok, retry_out] = RunIdemctl(
      {"record", "settle", "--config", config, "--scope", second_scope, "--not-executed"});
  ASSERT_EQ(retry_ok, 0) << retry_out;
  auto forwarded = Call("POST", "/v1/payouts", "payout-key-0102", R"({"to":"S"})");
  EXPECT_EQ(forwarded.status, 201) << forwarded.body;
  EXPECT_NE(forwarded.headers.Get("Idempotent-Replayed"), "true");
  EXPECT_EQ(Total(), 3);
  EXPECT_EQ(Executions().at("keys").as_object().at(upstream_key).as_int64(), 2)
      << "the forward after the settlement carried the held one's upstream key";

  auto [none, none_out] = RunIdemctl({"record", "held", "--config", config});
  EXPECT_EQ(none, 0) << none_out;
  EXPECT_NE(none_out.find("0 held outcomes"), std::string::npos) << none_out;
  auto [missing, missing_out] = RunIdemctl({"record", "settle", "--config", config, "--route",
                                            "gw.payouts.create", "--tenant", "acme", "--user",
                                            "alice", "--key", "payout-key-none", "--not-executed"});
  EXPECT_EQ(missing, 4) << missing_out;
  auto [usage, usage_out] =
      RunIdemctl({"record", "settle", "--config", config, "--scope", second_scope});
  EXPECT_EQ(usage, 2) << "neither --executed nor --not-executed: " << usage_out;
}

// The same after a crash: the takeover loop holds the killed forward's unknown outcome.
TEST_F(GatewayTest, TheReconcilerHoldsAKilledForwardsUnknownOutcomeWithoutAStatusUrl) {
  KillDuringForwardAndRestart("/v1/payouts", "payout-key-0003", R"({"to":"T"})");
  std::this_thread::sleep_for(std::chrono::milliseconds(2800));  // lease_ms = 2000
  auto retry = Call("POST", "/v1/payouts", "payout-key-0003", R"({"to":"T"})");
  EXPECT_EQ(retry.status, 502) << retry.body;
  EXPECT_NE(retry.body.find("upstream-outcome-unknown"), std::string::npos) << retry.body;
  EXPECT_EQ(retry.headers.Get("Idempotent-Replayed"), "true") << "settled by the reconciler";
  EXPECT_EQ(Total(), 1);
}

// idemd is killed (SIGKILL) while a request is at the upstream, and restarted. Until the lease
// ends a retry is told the operation is running; then the takeover loop makes the record retryable,
// and the retry forwards again with the same upstream key.
TEST_F(GatewayTest, AKilledGatewayForwardsAgainWithTheSameKeyOnceTheLeaseHasEnded) {
  KillDuringForwardAndRestart("/v1/orders", "order-key-0009", R"({"sku":"E5"})");
  auto running = Call("POST", "/v1/orders", "order-key-0009", R"({"sku":"E5"})");
  EXPECT_EQ(running.status, 409) << "the dead forward's lease is still live: " << running.body;
  std::this_thread::sleep_for(std::chrono::milliseconds(2500));  // lease_ms = 2000
  auto retry = Call("POST", "/v1/orders", "order-key-0009", R"({"sku":"E5"})");
  ASSERT_EQ(retry.status, 201) << retry.body;
  const boost::json::object books = Executions();
  EXPECT_EQ(books.at("total").as_int64(), 2) << "the killed forward executed, and the retry";
  ASSERT_EQ(books.at("keys").as_object().size(), 1u) << "both carried the same upstream key";
  EXPECT_EQ(Call("POST", "/v1/orders", "order-key-0009", R"({"sku":"E5"})").body, retry.body);
  EXPECT_EQ(Total(), 2);
}

// transfers.create has a status URL: a retry after an unknown outcome asks it before forwarding.
TEST_F(GatewayTest, AStatusUrlTellsTheOutcomeOfAnUnknownForwardSoNothingRunsTwice) {
  auto slow = Call("POST", "/v1/transfers", "transfer-key-1", R"({"to":"X"})",
                   {{"X-Upstream-Delay-Ms", "1000"}});
  EXPECT_EQ(slow.status, 504) << slow.body;
  // The forward may still be executing (timeout_ms + lease_margin_ms + late_execution_ms after
  // it left): the retry is told to come back, and nothing is asked or forwarded.
  auto early = Call("POST", "/v1/transfers", "transfer-key-1", R"({"to":"X"})");
  EXPECT_EQ(early.status, 409) << early.body;
  EXPECT_TRUE(early.headers.Get("Retry-After").has_value());
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  // Done: its answer is the outcome, and the operation's from then on.
  auto told = Call("POST", "/v1/transfers", "transfer-key-1", R"({"to":"X"})");
  ASSERT_EQ(told.status, 201) << told.body;
  EXPECT_EQ(ParseObject(told.body).at("execution").as_int64(), 1) << "the first forward's answer";
  auto replay = Call("POST", "/v1/transfers", "transfer-key-1", R"({"to":"X"})");
  EXPECT_EQ(replay.headers.Get("Idempotent-Replayed"), "true");
  EXPECT_EQ(replay.body, told.body);
  EXPECT_EQ(Total(), 1);

  // The connection lost after the send, but the upstream never executed it: the status URL says
  // 404, and the retry forwards it.
  auto lost = Call("POST", "/v1/transfers", "transfer-key-2", R"({"to":"Y"})",
                   {{"X-Upstream-Drop", "unexecuted"}});
  EXPECT_EQ(lost.status, 504) << lost.body;
  std::this_thread::sleep_for(std::chrono::milliseconds(1600));  // settled: 1500 ms after the send
  auto forwarded = Call("POST", "/v1/transfers", "transfer-key-2", R"({"to":"Y"})");
  ASSERT_EQ(forwarded.status, 201) << forwarded.body;
  EXPECT_EQ(ParseObject(forwarded.body).at("execution").as_int64(), 2);
  EXPECT_EQ(Total(), 2);
}

// The status URL's own vocabulary: a 2xx says the request ran and reports its answer, whatever its
// status (Original-Status); any other answer cannot tell, even one the route lists as final.
TEST_F(GatewayTest, AStatusUrlReportsTheOutcomeInA2xxAndNothingElseCounts) {
  // The forward timed out; the upstream went on and answered 503.
  auto slow = Call("POST", "/v1/transfers", "transfer-key-5", R"({"to":"P"})",
                   {{"X-Upstream-Delay-Ms", "1000"}, {"X-Upstream-Status", "503"}});
  EXPECT_EQ(slow.status, 504) << slow.body;
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));  // settled, and answered
  auto told = Call("POST", "/v1/transfers", "transfer-key-5", R"({"to":"P"})");
  EXPECT_EQ(told.status, 503) << "the outcome the status URL reports: " << told.body;
  EXPECT_EQ(ParseObject(told.body).at("execution").as_int64(), 1) << told.body;
  // 503 is declared "nothing done" on this route: the next retry forwards again, at once.
  auto again = Call("POST", "/v1/transfers", "transfer-key-5", R"({"to":"P"})");
  ASSERT_EQ(again.status, 201) << again.body;
  EXPECT_EQ(ParseObject(again.body).at("execution").as_int64(), 2);

  // The status URL's own 422 is no outcome, although final_statuses lists 422.
  auto lost = Call("POST", "/v1/transfers", "transfer-key-6", R"({"to":"Q"})",
                   {{"X-Upstream-Delay-Ms", "1000"}});
  EXPECT_EQ(lost.status, 504) << lost.body;
  StatusUrl(R"({"status":422})");
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  auto cannot_tell = Call("POST", "/v1/transfers", "transfer-key-6", R"({"to":"Q"})");
  EXPECT_EQ(cannot_tell.status, 502) << cannot_tell.body;
  EXPECT_NE(cannot_tell.body.find("upstream-unavailable"), std::string::npos) << cannot_tell.body;
  StatusUrl("{}");
  auto found = Call("POST", "/v1/transfers", "transfer-key-6", R"({"to":"Q"})");
  ASSERT_EQ(found.status, 201) << "not a stored 422: " << found.body;
  EXPECT_EQ(ParseObject(found.body).at("execution").as_int64(), 3) << "the timed-out forward's";
  EXPECT_EQ(Total(), 3);
}

// A status URL behind a credential: the route sends it in a header, its value from idemd's
// environment, and never logs it.
TEST_F(GatewayTest, AStatusUrlThatWantsACredentialGetsItFromTheEnvironment) {
  IdemdOptions options = WithRoutes();
  options.extra_tables += StatusRoute("transfers.secure", "/v1/secure-transfers",
                                      "status_auth_header = \"Authorization\"\n"
                                      "status_auth_env = \"TRANSFERS_STATUS_TOKEN\"\n");
  options.env["TRANSFERS_STATUS_TOKEN"] = "Bearer s3cret-status-token";
  StartIdemd(options);
  StatusUrl(R"({"token":"s3cret-status-token"})");
  auto slow = Call("POST", "/v1/secure-transfers", "secure-key-1", R"({"to":"S"})",
                   {{"X-Upstream-Delay-Ms", "1000"}});
  EXPECT_EQ(slow.status, 504) << slow.body;
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  auto told = Call("POST", "/v1/secure-transfers", "secure-key-1", R"({"to":"S"})");
  ASSERT_EQ(told.status, 201) << told.body;
  EXPECT_EQ(ParseObject(told.body).at("execution").as_int64(), 1);
  EXPECT_EQ(Total(), 1);
  EXPECT_GE(Executions().at("status_questions").as_int64(), 1);
  std::ifstream log(dir_.File("idemd.log"));
  const std::string logged((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  EXPECT_EQ(logged.find("s3cret"), std::string::npos) << "the credential was logged";
}

// "Cannot tell" is bounded: once the status URL has not told for status_unknown_max_ms after the
// forward settled, the operation's answer is a final 502 upstream-outcome-unknown, logged and
// counted, and nothing is forwarded again.
TEST_F(GatewayTest, AStatusUrlThatCannotTellIsGivenUpOnAfterItsBound) {
  IdemdOptions options = WithRoutes();
  options.extra_tables +=
      StatusRoute("transfers.bounded", "/v1/bounded-transfers", "status_unknown_max_ms = 1500\n");
  StartIdemd(options);
  StatusUrl(R"({"status":503})");
  auto slow = Call("POST", "/v1/bounded-transfers", "bounded-key-1", R"({"to":"B"})",
                   {{"X-Upstream-Delay-Ms", "1000"}});
  EXPECT_EQ(slow.status, 504) << slow.body;
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));  // settled 1500 ms after the send
  auto unknown = Call("POST", "/v1/bounded-transfers", "bounded-key-1", R"({"to":"B"})");
  EXPECT_EQ(unknown.status, 502) << unknown.body;
  EXPECT_NE(unknown.body.find("upstream-unavailable"), std::string::npos) << unknown.body;
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  auto given_up = Call("POST", "/v1/bounded-transfers", "bounded-key-1", R"({"to":"B"})");
  EXPECT_EQ(given_up.status, 502) << given_up.body;
  EXPECT_NE(given_up.body.find("urn:idem:problem:upstream-outcome-unknown"), std::string::npos)
      << given_up.body;
  auto replay = Call("POST", "/v1/bounded-transfers", "bounded-key-1", R"({"to":"B"})");
  EXPECT_EQ(replay.headers.Get("Idempotent-Replayed"), "true") << "final: " << replay.body;
  EXPECT_EQ(replay.body, given_up.body);
  EXPECT_EQ(Total(), 1) << "never forwarded again";
  EXPECT_NE(Get("/metrics")
                .body.find("idem_gateway_unknown_outcomes_total{route=\"transfers.bounded\"} 1\n"),
            std::string::npos);
  std::ifstream log(dir_.File("idemd.log"));
  const std::string logged((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  EXPECT_NE(logged.find(R"("level":"error","msg":"gateway outcome unknown; no longer asking")"),
            std::string::npos)
      << logged;
}

// As AKilledGatewayForwardsAgainWithTheSameKeyOnceTheLeaseHasEnded, on a route with a status URL:
// the takeover loop learns the killed forward's outcome from the upstream, and the retry is a
// replay.
TEST_F(GatewayTest, TheReconcilerAsksTheStatusUrlAboutAKilledForward) {
  KillDuringForwardAndRestart("/v1/transfers", "transfer-key-3", R"({"to":"Z"})");
  std::this_thread::sleep_for(std::chrono::milliseconds(2800));  // lease_ms = 2000
  auto retry = Call("POST", "/v1/transfers", "transfer-key-3", R"({"to":"Z"})");
  ASSERT_EQ(retry.status, 201) << retry.body;
  EXPECT_EQ(retry.headers.Get("Idempotent-Replayed"), "true") << "settled by the reconciler";
  EXPECT_EQ(ParseObject(retry.body).at("execution").as_int64(), 1);
  EXPECT_EQ(Total(), 1);
}

// forms.create has body = "bytes": any media type, and the body counts byte for byte.
TEST_F(GatewayTest, ARouteOfBytesTakesAnyMediaTypeAndCountsTheBodyAsItCame) {
  const std::pair<std::string, std::string> form{"Content-Type",
                                                 "application/x-www-form-urlencoded"};
  auto first = Call("POST", "/v1/forms", "form-key-0001", "sku=A1&qty=2", {form});
  ASSERT_EQ(first.status, 201) << first.body;
  EXPECT_EQ(ParseObject(first.body).at("body").as_string(), "sku=A1&qty=2");
  auto replay = Call("POST", "/v1/forms", "form-key-0001", "sku=A1&qty=2", {form});
  EXPECT_EQ(replay.headers.Get("Idempotent-Replayed"), "true");
  EXPECT_EQ(replay.body, first.body);
  EXPECT_EQ(Call("POST", "/v1/forms", "form-key-0001", "qty=2&sku=A1", {form}).status, 422)
      << "other bytes are another request";
  EXPECT_EQ(
      Call("POST", "/v1/forms", "form-key-0001", "sku=A1&qty=2", {{"Content-Type", "text/plain"}})
          .status,
      422)
      << "so is another media type";
  EXPECT_EQ(Total(), 1);
}

TEST_F(GatewayTest, RetryableAndFinalStatusesFollowTheRoute) {
  // 429 is not listed: retryable, so the retry executes again.
  auto failed = Call("POST", "/v1/orders", "order-key-0005", "{}", {{"X-Upstream-Status", "429"}});
  EXPECT_EQ(failed.status, 429);
  auto again = Call("POST", "/v1/orders", "order-key-0005", "{}");
  EXPECT_EQ(again.status, 201);
  // 404 is listed: final, replayed.
  ASSERT_EQ(
      Call("POST", "/v1/orders", "order-key-0006", "{}", {{"X-Upstream-Status", "404"}}).status,
      404);
  auto replayed = Call("POST", "/v1/orders", "order-key-0006", "{}");
  EXPECT_EQ(replayed.status, 404);
  EXPECT_EQ(replayed.headers.Get("Idempotent-Replayed"), "true");
  EXPECT_EQ(Total(), 3);
}

TEST_F(GatewayTest, KeysAndCredentialsAreEnforced) {
  // Required key, none sent: refused, nothing forwarded.
  EXPECT_EQ(Call("POST", "/v1/orders", "", "{}").status, 400);
  // No API key.
  http::Request anonymous{"POST", "/v1/orders", {}, "{}"};
  anonymous.headers.Set("Content-Type", "application/json");
  anonymous.headers.Set("Idempotency-Key", "order-key-0007");
  EXPECT_EQ(Send(std::move(anonymous)).status, 401);
  // Not JSON.
  EXPECT_EQ(Call("POST", "/v1/orders", "order-key-0008", "sku=A1",
                 {{"Content-Type", "application/x-www-form-urlencoded"}})
                .status,
            415);
  EXPECT_EQ(Total(), 0);
  // An optional key: without one, each request is forwarded as it is.
  EXPECT_EQ(Call("POST", "/v1/notes", "", R"({"text":"hi"})").status, 201);
  EXPECT_EQ(Call("POST", "/v1/notes", "", R"({"text":"hi"})").status, 201);
  EXPECT_EQ(Total(), 2);
  // A path no route matches is not forwarded.
  EXPECT_EQ(Call("POST", "/v1/unknown", "k-00000001", "{}").status, 404);
  EXPECT_EQ(Total(), 2);
}

TEST_F(GatewayTest, UnmatchedPathsPassThroughAsTheyAreWhenTheGatewaySaysSo) {
  StartIdemd(WithPassThrough("http://127.0.0.1:" + std::to_string(upstream_url_.port)));
  // No protocol and no authentication by idemd: every copy executes, with the client's headers.
  for (int i = 1; i <= 2; ++i) {
    auto r = Call("POST", "/v2/things?x=1", "client-key-1", "plain text",
                  {{"Content-Type", "text/plain"}});
    ASSERT_EQ(r.status, 201) << r.body;
    const boost::json::object body = ParseObject(r.body);
    EXPECT_EQ(body.at("execution").as_int64(), i);
    EXPECT_EQ(body.at("target").as_string(), "/v2/things?x=1");
    EXPECT_EQ(body.at("key").as_string(), "client-key-1") << "the client's own key, as sent";
    EXPECT_EQ(r.headers.Get("X-Upstream-Execution"), std::to_string(i)) << "every header back";
    EXPECT_TRUE(r.headers.Get("Set-Cookie").has_value());
    EXPECT_FALSE(r.headers.Get("Idempotent-Replayed").has_value());
  }
  EXPECT_EQ(Executions().at("credentials_seen").as_int64(), 2) << "Authorization went as sent";
  EXPECT_EQ(Get("/v2/things").status, 405) << "a GET passes too: upstream-sim refuses it";
  EXPECT_NE(Get("/metrics")
                .body.find("idem_upstream_request_duration_seconds_count{route=\"unmatched\"} 3\n"),
            std::string::npos);
  // idemd's own paths and its routes stay idemd's.
  EXPECT_EQ(Get("/healthz").status, 200);
  EXPECT_EQ(Call("POST", "/v1/orders", "", "{}").status, 400) << "the route still wants a key";
  EXPECT_EQ(Total(), 2);
}

// Passed-through requests have no record, so their failures name no key expiry: every way the
// unmatched upstream can fail is a problem answer, and idemd serves on after each.
TEST_F(GatewayTest, APassThroughToAFailingUpstreamIsAProblemAndIdemdServesOn) {
  auto expect_problem = [&](const http::Response& r, int status, const std::string& type) {
    EXPECT_EQ(r.status, status) << r.body;
    EXPECT_NE(r.body.find("\"type\":\"urn:idem:problem:" + type + "\""), std::string::npos)
        << r.body;
    EXPECT_FALSE(r.headers.Get("Idempotency-Key-Expires").has_value())
        << "no record stands behind it";
    EXPECT_FALSE(idemd_->Wait(std::chrono::milliseconds(0)).has_value()) << "idemd exited";
    EXPECT_EQ(Get("/healthz").status, 200);
  };
  // Down: nothing listens at port 1, so nothing was sent.
  StartIdemd(WithPassThrough("http://127.0.0.1:1"));
  expect_problem(Call("POST", "/v2/things", "", "{}"), 503, "unavailable");

  IdemdOptions up = WithPassThrough("http://127.0.0.1:" + std::to_string(upstream_url_.port));
  up.extra_tables =
      "[gateway]\ntimeout_ms = 300\n" + up.extra_tables.substr(std::string("[gateway]\n").size());
  StartIdemd(up);
  // Slower than [gateway] timeout_ms.
  expect_problem(Call("POST", "/v2/things", "", "{}", {{"X-Upstream-Delay-Ms", "1000"}}), 504,
                 "timeout");
  // A lone interim answer.
  expect_problem(Call("POST", "/v2/things", "", "{}", {{"X-Upstream-Status", "100"}}), 504,
                 "timeout");
  // A body over 1 MiB.
  expect_problem(Call("POST", "/v2/things", "", "{}",
                      {{"X-Upstream-Body-Bytes", std::to_string(1 << 20 | 1)}}),
                 504, "timeout");
  // And one that fits still passes.
  EXPECT_EQ(Call("POST", "/v2/things", "", "{}").status, 201);
}

// A {name} segment that a normalising upstream would read as a step up or as more than one segment
// is refused: POST /v1/orders/../capture must not reach /v1/capture.
TEST_F(GatewayTest, PathParametersThatAreDotSegmentsOrHoldEncodedSlashesAreRefused) {
  for (const std::string segment :
       {"..", ".", "%2e%2E", "%2E", "a%2Fb", "a%2fb", "a%5Cb", "a%5cb"}) {
    SCOPED_TRACE(segment);
    auto r = Call("PUT", "/v1/orders/" + segment + "/capture", "capture-key-9", "{}");
    EXPECT_EQ(r.status, 400) << r.body;
    EXPECT_NE(r.body.find("urn:idem:problem:invalid-request"), std::string::npos) << r.body;
  }
  // A raw backslash is no valid path for the HTTP layer already.
  EXPECT_EQ(Call("PUT", "/v1/orders/a\\b/capture", "capture-key-9", "{}").status, 400);
  EXPECT_EQ(Total(), 0) << "nothing forwarded";
  // Dots inside a segment, and other escapes, are a plain segment.
  EXPECT_EQ(Call("PUT", "/v1/orders/a..b/capture", "capture-key-9", "{}").status, 201);
  EXPECT_EQ(Call("PUT", "/v1/orders/%41.1/capture", "capture-key-10", "{}").status, 201);
  EXPECT_EQ(Total(), 2);
}

// CONNECT (a tunnel) and TRACE (an echo of the request, credentials included) are never passed
// through: idemd authenticates nothing there.
TEST_F(GatewayTest, ConnectAndTraceAreNotPassedThrough) {
  StartIdemd(WithPassThrough("http://127.0.0.1:" + std::to_string(upstream_url_.port)));
  for (const std::string method : {"TRACE", "CONNECT"}) {
    SCOPED_TRACE(method);
    auto r = Call(method, "/v2/things", "", "");
    EXPECT_EQ(r.status, 405) << r.body;
    EXPECT_NE(r.body.find("method-not-allowed"), std::string::npos) << r.body;
    EXPECT_TRUE(r.headers.Get("Allow").has_value());
  }
  EXPECT_TRUE(Executions().at("by_target").as_object().empty()) << "nothing reached the upstream";
  EXPECT_EQ(Call("POST", "/v2/things", "", "{}").status, 201) << "other methods still pass";
}

// On a key-optional route the forward key header is idemd's alone: a client without an
// Idempotency-Key cannot set it for the upstream, nor can one with a key.
TEST_F(GatewayTest, TheClientsCopyOfTheForwardKeyHeaderIsNeverForwarded) {
  IdemdOptions options = WithRoutes();
  options.extra_tables +=
      "[[routes]]\nname = \"notes.keyed\"\nmatch = \"POST /v1/keyed-notes\"\n"
      "upstream = \"http://127.0.0.1:" +
      std::to_string(upstream_url_.port) +
      "\"\nkey = \"optional\"\nforward_key_header = \"X-Operation-Key\"\n";
  StartIdemd(options);
  const std::vector<std::pair<std::string, std::string>> forged = {
      {"X-Operation-Key", "forged-key"}, {"X-Upstream-Echo", "x-operation-key"}};
  auto keyless = Call("POST", "/v1/keyed-notes", "", "{}", forged);
  ASSERT_EQ(keyless.status, 201) << keyless.body;
  EXPECT_TRUE(ParseObject(keyless.body).at("echo").is_null()) << keyless.body;
  auto keyed = Call("POST", "/v1/keyed-notes", "note-key-0001", "{}", forged);
  ASSERT_EQ(keyed.status, 201) << keyed.body;
  EXPECT_EQ(ParseObject(keyed.body).at("echo").as_string().size(), 64u) << keyed.body;
  EXPECT_EQ(Total(), 2);
}

// Error answers say what happened in plain words; the upstream's address and the transport's
// error text go to the log only.
TEST_F(GatewayTest, ErrorAnswersNameNeitherTheUpstreamNorTheTransportError) {
  IdemdOptions options = WithPassThrough("http://127.0.0.1:1");
  options.extra_tables +=
      "[[routes]]\nname = \"down.create\"\nmatch = \"POST /v1/down\"\n"
      "upstream = \"http://127.0.0.1:1\"\nkey = \"optional\"\n";
  StartIdemd(options);
  auto expect_plain = [](const http::Response& r, int status) {
    EXPECT_EQ(r.status, status) << r.body;
    for (const char* internal : {"127.0.0.1", "http://", "refused", "connecting",
                                 "timeout:", "end of stream", "operation"}) {
      EXPECT_EQ(r.body.find(internal), std::string::npos) << internal << " in " << r.body;
    }
  };
  expect_plain(Call("POST", "/v1/down", "down-key-0001", "{}"), 502);  // a route's record
  expect_plain(Call("POST", "/v1/down", "", "{}"), 503);               // no key
  expect_plain(Call("POST", "/v2/anything", "", "{}"), 503);           // passed through
  expect_plain(Call("POST", "/v1/orders", "order-key-0060", R"({"sku":"M1"})",
                    {{"X-Upstream-Delay-Ms", "1500"}}),
               504);  // sent, no answer in time
  std::ifstream log(dir_.File("idemd.log"));
  const std::string logged((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  EXPECT_NE(logged.find("Connection refused"), std::string::npos) << "the cause is logged";
}

// A trusted principal header's value is the user part of every record's scope: one longer than a
// scope part is no principal (401), not a request that fails at its claim.
TEST_F(GatewayTest, APrincipalHeaderLongerThanAScopePartIsNoPrincipal) {
  IdemdOptions options = WithRoutes();
  options.extra_tables =
      "[gateway]\nprincipal_header = \"X-Authenticated-User\"\n" + options.extra_tables;
  StartIdemd(options);
  auto longest = Call("POST", "/v1/orders", "order-key-0070", R"({"sku":"N1"})",
                      {{"X-Authenticated-User", std::string(128, 'u')}});
  EXPECT_EQ(longest.status, 201) << longest.body;
  auto longer = Call("POST", "/v1/orders", "order-key-0071", R"({"sku":"N1"})",
                     {{"X-Authenticated-User", std::string(129, 'u')}});
  EXPECT_EQ(longer.status, 401) << longer.body;
  EXPECT_EQ(Total(), 1);
}

TEST_F(GatewayTest, ATrustedPrincipalHeaderNamesThePrincipalWhenTheGatewaySaysSo) {
  IdemdOptions options = WithRoutes();
  options.extra_tables =
      "[gateway]\nprincipal_header = \"X-Authenticated-User\"\n" + options.extra_tables;
  StartIdemd(options);
  // The API key is no principal on a route any more: the header is.
  auto no_header = Call("POST", "/v1/orders", "order-key-0030", R"({"sku":"J1"})");
  EXPECT_EQ(no_header.status, 401) << no_header.body;
  EXPECT_EQ(no_header.body.find("uthenticated-User"), std::string::npos)
      << "the trusted header is not named to whoever lacks it: " << no_header.body;
  const std::pair<std::string, std::string> u1{"X-Authenticated-User", "u-1"};
  const std::pair<std::string, std::string> u2{"X-Authenticated-User", "u-2"};
  auto first = Call("POST", "/v1/orders", "order-key-0030", R"({"sku":"J1"})", {u1});
  ASSERT_EQ(first.status, 201) << first.body;
  auto replay = Call("POST", "/v1/orders", "order-key-0030", R"({"sku":"J1"})", {u1});
  EXPECT_EQ(replay.headers.Get("Idempotent-Replayed"), "true");
  EXPECT_EQ(replay.body, first.body);
  // Another principal's identical request is its own operation, and its record its own.
  auto other = Call("POST", "/v1/orders", "order-key-0030", R"({"sku":"J1"})", {u2});
  EXPECT_EQ(other.status, 201);
  EXPECT_FALSE(other.headers.Get("Idempotent-Replayed").has_value());
  http::Request get{"GET", "/v1/operations/order-key-0030?route=orders.create", {}, ""};
  get.headers.Set(u1.first, u1.second);
  auto operation = Send(get);
  ASSERT_EQ(operation.status, 200) << operation.body;
  EXPECT_EQ(boost::json::serialize(ParseObject(operation.body).at("response")), first.body);
  // The payments route keeps its API keys.
  EXPECT_EQ(Pay("pay-key-00000001", Body("order-1")).status, 201);
  EXPECT_EQ(Total(), 2);
}

// SIGHUP while a request is at the upstream and a 202 Accepted one runs apart: both finish on the
// routes they began on; the routes of the new file serve from then on; a kept route keeps its
// keys; a file that does not load changes nothing.
TEST_F(GatewayTest, SighupReloadsTheRoutesAndRequestsInFlightFinishOnTheirs) {
  std::optional<http::Response> in_flight;
  std::thread slow([&] {
    in_flight = Call("POST", "/v1/orders", "order-key-0040", R"({"sku":"K1"})",
                     {{"X-Upstream-Delay-Ms", "350"}});
  });
  auto apart = Call("POST", "/v1/orders", "order-key-0041", R"({"sku":"K2"})",
                    {{"X-Upstream-Delay-Ms", "350"}, {"Prefer", "respond-async"}});
  ASSERT_EQ(apart.status, 202) << apart.body;
  std::this_thread::sleep_for(
      std::chrono::milliseconds(100));  // both at the upstream (timeout_ms = 500)

  IdemdOptions next = WithRoutes();
  const std::string upstream = "http://127.0.0.1:" + std::to_string(upstream_url_.port);
  next.extra_tables =
      next.extra_tables.substr(0, next.extra_tables.find("[[routes]]\nname = \"notes"));
  next.extra_tables +=
      "[[routes]]\nname = \"refunds.create\"\nmatch = \"POST /v1/refunds\"\n"
      "upstream = \"" +
      upstream + "\"\n";
  WriteConfig(dir_.File("idemd.toml"), next);
  idemd_->Signal(SIGHUP);
  http::Response refund;
  for (int i = 0; i < 100; ++i) {
    refund = Call("POST", "/v1/refunds", "refund-key-01", "{}");
    if (refund.status != 404) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(refund.status, 201) << "the new route serves: " << refund.body;
  EXPECT_EQ(Call("POST", "/v1/notes", "", "{}").status, 404) << "the removed route is gone";

  slow.join();
  ASSERT_TRUE(in_flight.has_value());
  EXPECT_EQ(in_flight->status, 201) << in_flight->body;
  auto replay = Call("POST", "/v1/orders", "order-key-0040", R"({"sku":"K1"})");
  EXPECT_EQ(replay.headers.Get("Idempotent-Replayed"), "true") << "the kept route kept its keys";
  EXPECT_EQ(replay.body, in_flight->body);
  const std::string location(apart.headers.Get("Location").value_or(""));
  std::string state;
  for (int i = 0; i < 100 && state != "SUCCEEDED"; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    auto operation = Get(location);
    ASSERT_EQ(operation.status, 200) << operation.body;
    state = ParseObject(operation.body).at("state").as_string();
  }
  EXPECT_EQ(state, "SUCCEEDED") << "the work left running apart finished on its routes";

  // A file that does not load: the routes stay as they are, and idemd serves on.
  {
    std::ofstream out(dir_.File("idemd.toml"), std::ios::app);
    out << "[[routes]]\nname = \"broken\"\n";
  }
  idemd_->Signal(SIGHUP);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(Call("POST", "/v1/refunds", "refund-key-02", "{}").status, 201);
  EXPECT_EQ(Total(), 4) << "two orders, two refunds";
}

// A duplicate parked on Prefer: wait when SIGHUP removes its route and passes unmatched paths
// through: it still finishes on the route it began on, with the first request's answer.
TEST_F(GatewayTest, AParkedDuplicateFinishesOnItsRouteAcrossAReload) {
  std::optional<http::Response> first;
  std::thread slow([&] {
    first = Call("POST", "/v1/orders", "order-key-0050", R"({"sku":"L1"})",
                 {{"X-Upstream-Delay-Ms", "400"}});
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  std::optional<http::Response> parked;
  std::thread waiter([&] {
    parked =
        Call("POST", "/v1/orders", "order-key-0050", R"({"sku":"L1"})", {{"Prefer", "wait=5"}});
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  IdemdOptions next = WithRoutes();
  const std::string upstream = "http://127.0.0.1:" + std::to_string(upstream_url_.port);
  next.extra_tables = "[gateway]\nunmatched = \"forward\"\nupstream = \"" + upstream + "\"\n";
  WriteConfig(dir_.File("idemd.toml"), next);
  idemd_->Signal(SIGHUP);
  for (int i = 0; i < 100; ++i) {  // until the reload: orders.create is gone, POSTs pass through
    if (Call("POST", "/v1/probe", "", "{}").status != 404) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  slow.join();
  waiter.join();
  ASSERT_TRUE(first.has_value() && parked.has_value());
  ASSERT_EQ(first->status, 201) << first->body;
  EXPECT_EQ(parked->status, 201) << parked->body;
  EXPECT_EQ(parked->headers.Get("Idempotent-Replayed"), "true") << parked->body;
  EXPECT_EQ(parked->body, first->body);
  EXPECT_EQ(Executions().at("by_target").as_object().at("/v1/orders").as_int64(), 1)
      << "the parked copy was not passed through";
}

// Reloads the config as `next` plus a probe route, refunds.create, and returns once the reload
// took effect (the probe answers) or, when `expect_refused`, once idemd logged that it refused it.
void ReloadWithProbe(GatewayTest& t, GatewayTest::IdemdOptions next, bool expect_refused);

// The finding: a SIGHUP that changes a kept route's fingerprint rules made every retry of its
// earlier keys 422 (the records' fingerprints were checked under the new rules). Now the rules
// have versions: a record made before is verified under the rules it was made with, so its retry
// is the replay it always was, while new keys follow the new rules.
TEST_F(GatewayTest, ASighupThatChangesARoutesFingerprintKeepsItsEarlierKeysVerifiable) {
  auto first = Call("POST", "/v1/orders", "order-key-rules-1", R"({"sku":"R1","note":"first"})");
  ASSERT_EQ(first.status, 201) << first.body;
  IdemdOptions next = WithRoutes();
  const std::string before = "fingerprint.ignore = [\"trace_id\"]";
  next.extra_tables.replace(next.extra_tables.find(before), before.size(),
                            "fingerprint.ignore = [\"trace_id\", \"note\"]");
  ReloadWithProbe(*this, next, /*expect_refused=*/false);
  if (HasFatalFailure()) return;

  auto retry = Call("POST", "/v1/orders", "order-key-rules-1", R"({"sku":"R1","note":"first"})");
  EXPECT_EQ(retry.status, 201) << retry.body;
  EXPECT_EQ(retry.headers.Get("Idempotent-Replayed").value_or(""), "true");
  EXPECT_EQ(retry.body, first.body);
  auto fresh = Call("POST", "/v1/orders", "order-key-rules-2", R"({"sku":"R2","note":"a"})");
  ASSERT_EQ(fresh.status, 201) << fresh.body;
  auto other_note = Call("POST", "/v1/orders", "order-key-rules-2", R"({"sku":"R2","note":"b"})");
  EXPECT_EQ(other_note.headers.Get("Idempotent-Replayed").value_or(""), "true")
      << "the new rules ignore note";
  EXPECT_EQ(Executions().at("by_target").as_object().at("/v1/orders").as_int64(), 2);
}

// A reload that would point a kept route with PROCESSING records at another upstream is refused:
// the outcome of their forwards would be asked of, and forwarded again to, a service that never
// had them. The routes stay as they were.
TEST_F(GatewayTest, ASighupThatMovesARouteWithLiveRecordsToAnotherUpstreamIsRefused) {
  auto lost = Call("POST", "/v1/orders", "order-key-moved-1", R"({"sku":"U1"})",
                   {{"X-Upstream-Delay-Ms", "1500"}});
  ASSERT_EQ(lost.status, 504) << "timeout_ms = 500: " << lost.body;
  IdemdOptions next = WithRoutes();
  const std::string upstream =
      "upstream = \"http://127.0.0.1:" + std::to_string(upstream_url_.port) +
      "\"\nfingerprint.ignore";
  next.extra_tables.replace(next.extra_tables.find(upstream), upstream.size(),
                            "upstream = \"http://127.0.0.1:1\"\nfingerprint.ignore");
  ReloadWithProbe(*this, next, /*expect_refused=*/true);
  if (HasFatalFailure()) return;
  EXPECT_EQ(Call("POST", "/v1/refunds", "refund-key-moved", "{}").status, 404)
      << "the reload took effect";
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // the first forward has run
  auto retry = Call("POST", "/v1/orders", "order-key-moved-1", R"({"sku":"U1"})");
  EXPECT_EQ(retry.status, 201) << "forwarded again to its own upstream: " << retry.body;
}

void ReloadWithProbe(GatewayTest& t, GatewayTest::IdemdOptions next, bool expect_refused) {
  next.extra_tables +=
      "[[routes]]\nname = \"refunds.create\"\nmatch = \"POST /v1/refunds\"\n"
      "upstream = \"http://127.0.0.1:" +
      std::to_string(t.upstream_url_.port) + "\"\n";
  t.WriteConfig(t.dir_.File("idemd.toml"), next);
  t.idemd_->Signal(SIGHUP);
  for (int i = 0; i < 200; ++i) {
    if (expect_refused) {
      std::ifstream log(t.dir_.File("idemd.log"));
      const std::string logged((std::istreambuf_iterator<char>(log)),
                               std::istreambuf_iterator<char>());
      const std::size_t at = logged.find("reload failed");
      if (at != std::string::npos) {
        EXPECT_NE(logged.find("orders.create would change its upstream", at), std::string::npos)
            << logged.substr(at, 400);
        return;
      }
    } else if (t.Call("POST", "/v1/refunds", "refund-key-probe", "{}").status != 404) {
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  FAIL() << (expect_refused ? "no refusal logged" : "the reload never took effect");
}

// The finding: an upstream answering 201 with a body of 20 KiB (upstream-sim echoes the request
// body), three requests with one key, each after the route's lease (2 s) has ended. Before the
// fix: three upstream executions, every answer 413 — the answer did not fit the 16 KiB stored-
// answer cap, Finish failed, and the record stayed PROCESSING to be forwarded again. Now the
// operation is finished with 502 answer-too-large kept in its place, and nothing is forwarded
// again; a route whose max_stored_bytes holds the answer keeps it as it is.
TEST_F(GatewayTest, AnAnswerTooLargeToKeepIsFinishedAndNeverForwardedAgain) {
  IdemdOptions options = WithRoutes();
  options.reconcile_interval_ms = 200;
  options.extra_tables +=
      "[[routes]]\nname = \"big.create\"\nmatch = \"POST /v1/big\"\n"
      "upstream = \"http://127.0.0.1:" +
      std::to_string(upstream_url_.port) +
      "\"\nmax_stored_bytes = 65536\nlease_ms = 2000\ntimeout_ms = 500\n";
  StartIdemd(options);
  const std::string body = R"({"sku":"Z1","note":")" + std::string(20 * 1024, 'n') + R"("})";
  std::string first_body;
  for (int i = 0; i < 3; ++i) {
    if (i > 0) std::this_thread::sleep_for(std::chrono::milliseconds(2300));
    auto r = Call("POST", "/v1/orders", "order-key-big-1", body);
    ASSERT_EQ(r.status, 502) << r.body;
    EXPECT_NE(r.body.find("urn:idem:problem:answer-too-large"), std::string::npos) << r.body;
    EXPECT_EQ(r.headers.Get("Location").value_or(""), "/things/1") << "where the upstream put it";
    EXPECT_TRUE(r.headers.Get("Idempotency-Key-Expires").has_value());
    if (i == 0) first_body = r.body;
    EXPECT_EQ(r.body, first_body);
    EXPECT_EQ(Total(), 1) << "forwarded again after " << i << " retries";
  }
  auto op = ParseObject(Get("/v1/operations/order-key-big-1?route=orders.create").body);
  EXPECT_EQ(op.at("state").as_string(), "SUCCEEDED");

  auto kept = Call("POST", "/v1/big", "big-key-0001", body);
  ASSERT_EQ(kept.status, 201) << kept.body.substr(0, 300);
  EXPECT_GT(kept.body.size(), 20u * 1024);
  auto replay = Call("POST", "/v1/big", "big-key-0001", body);
  EXPECT_EQ(replay.status, 201);
  EXPECT_EQ(replay.headers.Get("Idempotent-Replayed").value_or(""), "true");
  EXPECT_EQ(replay.body, kept.body);
  EXPECT_EQ(Total(), 2);
}

}  // namespace
}  // namespace idem::itest
