// tests/integration/hostile_itest.cc — clients that misbehave at the HTTP level: slow senders,
// garbage, oversized headers, idle connection floods. The server answers with the documented
// status, leaves no record behind, and keeps serving everyone else.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <thread>

#include "tests/integration/idemd_fixture.h"

namespace idem::itest {
namespace {

// A raw TCP connection to loopback, closed on destruction.
class RawConnection {
 public:
  explicit RawConnection(uint16_t port) : fd_(socket(AF_INET, SOCK_STREAM, 0)) {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  }
  ~RawConnection() { close(fd_); }
  bool Connected() const { return connected_; }
  bool Send(std::string_view data) {
    return ::send(fd_, data.data(), data.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(data.size());
  }
  // Everything the server sends until it closes or `timeout` passes; Closed() tells which.
  std::string ReadAll(std::chrono::milliseconds timeout) {
    std::string out;
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (true) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return out;
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
      char buf[4096];
      const ssize_t n = recv(fd_, buf, sizeof buf, 0);
      if (n <= 0) {
        closed_ = true;
        return out;
      }
      out.append(buf, static_cast<std::size_t>(n));
    }
  }
  bool Closed() const { return closed_; }

 private:
  int fd_;
  bool connected_ = false;
  std::atomic<bool> closed_{false};  // read by a sending thread while another reads
};

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
