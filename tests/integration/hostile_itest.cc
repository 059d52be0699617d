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
