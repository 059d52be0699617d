// tests/integration/hostile_itest.cc — clients that misbehave at the HTTP level: slow senders,
// garbage, oversized headers, idle connection floods. The server answers with the documented
// status, leaves no record behind, and keeps serving everyone else.
#include <atomic>
#include <thread>

#include "testing/raw_connection.h"
#include "tests/integration/idemd_fixture.h"

namespace idem::itest {
namespace {

using testing::RawConnection;

TEST_F(IdemdTest, SlowlorisIsCutOffWhileOthersAreServed) {
  RawConnection slow(idemd_url_.port);
  ASSERT_TRUE(slow.Connected());
  ASSERT_TRUE(slow.Send("POST /v1/payments HTTP/1.1\r\nHost: x\r\n"));
  const auto started = std::chrono::steady_clock::now();
  std::thread dribble([&] {
    for (int i = 0; i < 40 && !slow.Closed(); ++i) {
      if (!slow.Send("X-Slow: a\r\n")) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });
  // Meanwhile, a normal client is served at once.
  EXPECT_EQ(Pay("slowloris-order-1", Body("ORD-SL")).status, 201);
  slow.ReadAll(std::chrono::seconds(6));
  dribble.join();
  EXPECT_TRUE(slow.Closed()) << "the slow client must be disconnected";
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(4))
      << "within the read timeout (2 s in the test config)";
}

TEST_F(IdemdTest, IdleConnectionsDoNotStarveService) {
  std::vector<std::unique_ptr<RawConnection>> idle;
  for (int i = 0; i < 200; ++i) idle.push_back(std::make_unique<RawConnection>(idemd_url_.port));
  EXPECT_EQ(Pay("idle-flood-order-1", Body("ORD-IDLE")).status, 201);
  EXPECT_EQ(Get("/healthz", "").status, 200);
}

TEST_F(IdemdTest, GarbageIsAnsweredWith400AndTheConnectionClosed) {
  RawConnection c(idemd_url_.port);
  ASSERT_TRUE(c.Send("THIS IS NOT HTTP\r\n\r\n"));
  const std::string answer = c.ReadAll(std::chrono::seconds(3));
  EXPECT_EQ(answer.rfind("HTTP/1.1 400", 0), 0u) << answer;
  EXPECT_NE(answer.find("urn:idem:problem:malformed-request"), std::string::npos);
  EXPECT_TRUE(c.Closed());
}

TEST_F(IdemdTest, OversizedHeadersAre431) {
  RawConnection c(idemd_url_.port);
  ASSERT_TRUE(c.Send("GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + std::string(32 * 1024, 'a') +
                     "\r\n\r\n"));
  EXPECT_EQ(c.ReadAll(std::chrono::seconds(3)).rfind("HTTP/1.1 431", 0), 0u);
}

TEST_F(IdemdTest, DeclaredBodyOverTheLimitIs413BeforeItArrives) {
  RawConnection c(idemd_url_.port);
  ASSERT_TRUE(
      c.Send("POST /v1/payments HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
             "Authorization: Bearer " +
             std::string(kAlice) +
             "\r\nIdempotency-Key: too-large-order-1\r\nContent-Length: 10000000\r\n\r\n{"));
  EXPECT_EQ(c.ReadAll(std::chrono::seconds(3)).rfind("HTTP/1.1 413", 0), 0u);
  EXPECT_EQ(Get("/v1/operations/too-large-order-1").status, 404);
}

TEST_F(IdemdTest, TwoIdempotencyKeysAreRefused) {
  http::Request req{"POST", "/v1/payments", {}, Body("ORD-2K")};
  req.headers.Set("Authorization", std::string("Bearer ") + kAlice);
  req.headers.Set("Content-Type", "application/json");
  req.headers.Add("Idempotency-Key", "first-key-0001");
  req.headers.Add("Idempotency-Key", "second-key-0002");
  EXPECT_EQ(Send(std::move(req)).status, 400);
  EXPECT_EQ(Get("/v1/operations/first-key-0001").status, 404);
  EXPECT_EQ(TotalCharges(), 0);
}

// A raw POST /v1/payments for `key`: request line `target` and `version`, then `host_lines`
// (each a whole "Host: ...\r\n" line) and a valid body.
std::string RawPay(const std::string& target, const std::string& version,
                   const std::string& host_lines, const std::string& key,
                   const std::string& order) {
  const std::string body = IdemdTest::Body(order);
  return "POST " + target + " " + version + "\r\n" + host_lines +
         "Content-Type: application/json\r\nAuthorization: Bearer " + std::string(kAlice) +
         "\r\nIdempotency-Key: " + key + "\r\nContent-Length: " + std::to_string(body.size()) +
         "\r\n\r\n" + body;
}

// RFC 9112 §3.2: an HTTP/1.1 request without Host, and any request with two Host lines, is 400;
// the handler never runs, so no record is made and nothing is charged.
TEST_F(IdemdTest, APaymentWithoutHostOrWithTwoHostsIs400AndChargesNothing) {
  const struct {
    std::string what, raw, key;
  } cases[] = {
      {"no Host", RawPay("/v1/payments", "HTTP/1.1", "", "no-host-key-0001", "ORD-NH1"),
       "no-host-key-0001"},
      {"two Hosts",
       RawPay("/v1/payments", "HTTP/1.1", "Host: a\r\nHost: b\r\n", "two-hosts-key-0001",
              "ORD-TH1"),
       "two-hosts-key-0001"},
      {"two Hosts, HTTP/1.0",
       RawPay("/v1/payments", "HTTP/1.0", "Host: a\r\nHost: a\r\n", "two-hosts-key-0002",
              "ORD-TH2"),
       "two-hosts-key-0002"},
      {"absolute-form without Host",
       RawPay("http://127.0.0.1:" + std::to_string(idemd_url_.port) + "/v1/payments", "HTTP/1.1",
              "", "abs-no-host-0001", "ORD-ANH1"),
       "abs-no-host-0001"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    RawConnection conn(idemd_url_.port);
    ASSERT_TRUE(conn.Send(c.raw));
    const std::string answer = conn.ReadAll(std::chrono::seconds(3));
    EXPECT_EQ(answer.rfind("HTTP/1.1 400", 0), 0u) << answer;
    EXPECT_NE(answer.find("urn:idem:problem:malformed-request"), std::string::npos) << answer;
    EXPECT_EQ(Get("/v1/operations/" + c.key).status, 404);
  }
  EXPECT_EQ(TotalCharges(), 0);
  // HTTP/1.0 without Host is still served.
  RawConnection old(idemd_url_.port);
  ASSERT_TRUE(old.Send(RawPay("/v1/payments", "HTTP/1.0", "", "http10-key-0001", "ORD-H10")));
  const std::string answer = old.ReadAll(std::chrono::seconds(3));
  EXPECT_EQ(answer.rfind("HTTP/1.1 201", 0), 0u) << answer;
  EXPECT_EQ(TotalCharges(), 1);
}

// RFC 9112 §3.2.2: absolute-form is routed by its path as if it were origin-form.
TEST_F(IdemdTest, AnAbsoluteFormPaymentIsServedLikeAnOriginFormOne) {
  const std::string authority = "127.0.0.1:" + std::to_string(idemd_url_.port);
  RawConnection c(idemd_url_.port);
  ASSERT_TRUE(c.Send(RawPay("http://" + authority + "/v1/payments", "HTTP/1.1",
                            "Host: " + authority + "\r\n", "absolute-key-0001", "ORD-ABS1")));
  const std::string answer = c.ReadResponse(std::chrono::seconds(3));
  EXPECT_EQ(answer.rfind("HTTP/1.1 201", 0), 0u) << answer;
  EXPECT_EQ(TotalCharges(), 1);
  // The same key in origin-form is the same request: a replay, no second charge.
  const http::Response replay = Pay("absolute-key-0001", Body("ORD-ABS1"));
  EXPECT_EQ(replay.status, 201) << replay.body;
  EXPECT_EQ(replay.headers.Get("idempotent-replayed"), "true");
  EXPECT_EQ(TotalCharges(), 1);
  // A read in absolute-form, query and all.
  RawConnection read(idemd_url_.port);
  ASSERT_TRUE(read.Send("GET http://" + authority +
                        "/v1/operations/absolute-key-0001?x=1 HTTP/1.1\r\nHost: " + authority +
                        "\r\nAuthorization: Bearer " + std::string(kAlice) + "\r\n\r\n"));
  const std::string operation = read.ReadResponse(std::chrono::seconds(3));
  EXPECT_EQ(operation.rfind("HTTP/1.1 200", 0), 0u) << operation;
  EXPECT_NE(operation.find("SUCCEEDED"), std::string::npos) << operation;
}

TEST_F(IdemdTest, AnAbsoluteFormTargetOfAnotherSchemeOrUnparsableIs400AndChargesNothing) {
  const std::string authority = "127.0.0.1:" + std::to_string(idemd_url_.port);
  int n = 0;
  for (const std::string& target : std::vector<std::string>{
           "ftp://" + authority + "/v1/payments", "urn:v1:payments", "http:/v1/payments",
           "http://" + authority + "/v1/payments#f", "v1/payments"}) {
    SCOPED_TRACE(target);
    const std::string key = "bad-target-key-" + std::to_string(++n);
    RawConnection c(idemd_url_.port);
    ASSERT_TRUE(c.Send(RawPay(target, "HTTP/1.1", "Host: " + authority + "\r\n", key,
                              "ORD-BT" + std::to_string(n))));
    const std::string answer = c.ReadAll(std::chrono::seconds(3));
    EXPECT_EQ(answer.rfind("HTTP/1.1 400", 0), 0u) << answer;
    EXPECT_NE(answer.find("urn:idem:problem:malformed-request"), std::string::npos) << answer;
    EXPECT_EQ(Get("/v1/operations/" + key).status, 404);
  }
  EXPECT_EQ(TotalCharges(), 0);
}

// docs/openapi.yaml: a string amount is a plain decimal; "1e2" is not one and charges nothing.
// The number 1e2 stays a valid amount.
TEST_F(IdemdTest, AStringAmountInExponentFormIs400AndChargesNothing) {
  const http::Response r = Pay("exponent-key-0001", Body("ORD-EXP1", "\"1e2\""));
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_NE(r.body.find("urn:idem:problem:validation-failed"), std::string::npos) << r.body;
  EXPECT_NE(r.body.find(R"("field":"amount")"), std::string::npos) << r.body;
  EXPECT_EQ(Get("/v1/operations/exponent-key-0001").status, 404);
  EXPECT_EQ(TotalCharges(), 0);
  const http::Response number = Pay("exponent-key-0002", Body("ORD-EXP2", "1e2"));
  EXPECT_EQ(number.status, 201) << number.body;
  EXPECT_NE(number.body.find(R"("amount":"100.00")"), std::string::npos) << number.body;
  EXPECT_EQ(TotalCharges(), 1);
}

TEST_F(IdemdTest, HeadAnswersHeadersWithoutABody) {
  RawConnection c(idemd_url_.port);
  ASSERT_TRUE(
      c.Send("HEAD /healthz HTTP/1.1\r\nHost: x\r\n\r\nGET /healthz HTTP/1.1\r\nHost: x\r\n"
             "Connection: close\r\n\r\n"));
  const std::string answers = c.ReadAll(std::chrono::seconds(3));
  // The HEAD answer announces the GET body's length and sends none: the next bytes are the
  // GET answer's status line.
  const std::size_t head_end = answers.find("\r\n\r\n");
  ASSERT_NE(head_end, std::string::npos);
  EXPECT_NE(answers.find("Content-Length: 15"), std::string::npos) << answers;
  EXPECT_EQ(answers.compare(head_end + 4, 12, "HTTP/1.1 200"), 0) << answers;
}

TEST_F(IdemdTest, KeepAliveServesManyRequestsOnOneConnection) {
  RawConnection c(idemd_url_.port);
  std::string requests;
  for (int i = 0; i < 5; ++i) requests += "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n";
  ASSERT_TRUE(c.Send(requests));
  const std::string answers = c.ReadAll(std::chrono::milliseconds(800));
  std::size_t count = 0;
  for (std::size_t at = answers.find("HTTP/1.1 200"); at != std::string::npos;
       at = answers.find("HTTP/1.1 200", at + 1)) {
    ++count;
  }
  EXPECT_EQ(count, 5u);
  EXPECT_FALSE(c.Closed()) << "kept alive";
}

}  // namespace
}  // namespace idem::itest
