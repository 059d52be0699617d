// http/server_test.cc — http::Server over loopback with a fake handler: the header and body
// limits, the whole-request deadline, drain, parking, admission and a throwing handler.
//
// Tests bind port 0. A timing assertion's bound lies far from both the expected time and the
// time a broken feature would show, or compares two events of the same test.
#include "http/server.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <future>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include "http/client.h"
#include "idem/mutex.h"
#include "testing/raw_connection.h"

namespace idem::http {
namespace {

using testing::RawConnection;

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// Answers by path. Thread-safe; tests wait on its counters.
//   /echo               200, the body's size
//   /target             200, the target and the Host header as the handler sees them
//   /throw, /throw-int  throws a std::exception, or an int
//   /block              waits on the blocking pool until Open() (at most 10 s), then 200
//   /sleep?ms=D         waits D ms without a thread, then 200
//   /park?key=K&ms=D    parks on K until Release(K) ("released") or D ms after its first call
//                       ("deadline"); each call is recorded; 409 "no room" when the server
//                       refuses room to park; WaitEnded(K) once the request has ended
class FakeHandler final : public Handler {
 public:
  Async<Response> Handle(const Request& request, RequestContext& context) override {
    const std::string_view path = request.Path();
    if (path == "/echo") {
      Bump(&FakeHandler::echoes_);
      co_return Text(std::to_string(request.body.size()));
    }
    if (path == "/target") {
      Bump(&FakeHandler::echoes_);
      co_return Text(request.target +
                     " host=" + std::string(request.headers.Get("host").value_or("")) +
                     " hosts=" + std::to_string(request.headers.Count("host")));
    }
    if (path == "/throw") throw std::runtime_error("handler failure");
    if (path == "/throw-int") throw 42;
    if (path == "/block") co_return co_await pool_.Call([this] { return Block(); });
    if (path == "/sleep") {
      co_await SleepFor(milliseconds(std::stoi(std::string(*request.QueryParam("ms")))));
      Bump(&FakeHandler::slept_);
      co_return Text("slept");
    }
    if (path == "/park") co_return Park(request, context);
    co_return Response{404, {}, ""};
  }

  void Open() {
    MutexLock lock(mu_);
    open_ = true;
    changed_.NotifyAll();
  }
  void Release(const std::string& key) {
    MutexLock lock(mu_);
    released_.insert(key);
  }

  int Echoes() {
    MutexLock lock(mu_);
    return echoes_;
  }
  int Slept() {
    MutexLock lock(mu_);
    return slept_;
  }
  // The times `key`'s handler was called, in order.
  std::vector<Clock::time_point> Calls(const std::string& key) {
    MutexLock lock(mu_);
    return calls_[key];
  }
  // Waits up to 5 s for `blocked` requests in /block, or `n` calls of /park on `key`.
  bool WaitBlocked(int blocked) {
    MutexLock lock(mu_);
    return changed_.WaitFor(mu_, std::chrono::seconds(5),
                            [&]() IDEM_REQUIRES(mu_) { return blocked_ >= blocked; });
  }
  // Waits up to `timeout` for the end of the request parked on `key` (its hold destroyed).
  bool WaitEnded(const std::string& key, std::chrono::milliseconds timeout) {
    MutexLock lock(mu_);
    return changed_.WaitFor(mu_, timeout,
                            [&]() IDEM_REQUIRES(mu_) { return ended_.contains(key); });
  }
  bool WaitCalls(const std::string& key, std::size_t n) {
    MutexLock lock(mu_);
    return changed_.WaitFor(mu_, std::chrono::seconds(5),
                            [&]() IDEM_REQUIRES(mu_) { return calls_[key].size() >= n; });
  }

 private:
  static Response Text(std::string body) {
    Response r{200, {}, std::move(body)};
    r.headers.Set("Content-Type", "text/plain");
    return r;
  }

  Response Block() {
    MutexLock lock(mu_);
    ++blocked_;
    changed_.NotifyAll();
    // Bounded, so a failed test cannot hang the server's drain for ever.
    if (!changed_.WaitFor(mu_, std::chrono::seconds(10),
                          [&]() IDEM_REQUIRES(mu_) { return open_; })) {
      return Response{504, {}, "never opened"};
    }
    return Text("unblocked");
  }

  // One more of `counter` (echoes_ or slept_).
  void Bump(int FakeHandler::*counter) {
    MutexLock lock(mu_);
    ++(this->*counter);
    changed_.NotifyAll();
  }

  Response Park(const Request& request, RequestContext& context) {
    const std::string key(request.QueryParam("key").value_or(""));
    const auto now = Clock::now();
    if (!context.wait_until) {
      context.wait_until = now + milliseconds(std::stoi(std::string(*request.QueryParam("ms"))));
    }
    MutexLock lock(mu_);
    calls_[key].push_back(now);
    changed_.NotifyAll();
    if (released_.contains(key)) return Text("released");
    if (now >= *context.wait_until) return Text("deadline");
    if (context.reserve_park && !context.reserve_park()) return Response{409, {}, "no room"};
    if (!context.hold) {
      // Given back when the request ends, however it ends.
      context.hold = std::make_shared<Ender>(this, key);
    }
    context.park = RequestContext::Park{key, *context.wait_until};
    return {};
  }

  // Records the end of the request parked on `key` when the request's context lets it go.
  struct Ender {
    Ender(FakeHandler* handler, std::string key) : handler_(handler), key_(std::move(key)) {}
    ~Ender() {
      MutexLock lock(handler_->mu_);
      handler_->ended_.insert(key_);
      handler_->changed_.NotifyAll();
    }
    FakeHandler* handler_;
    std::string key_;
  };

  Mutex mu_;
  CondVar changed_;
  int echoes_ IDEM_GUARDED_BY(mu_) = 0;
  int slept_ IDEM_GUARDED_BY(mu_) = 0;
  int blocked_ IDEM_GUARDED_BY(mu_) = 0;
  bool open_ IDEM_GUARDED_BY(mu_) = false;
  std::set<std::string> released_ IDEM_GUARDED_BY(mu_);
  std::set<std::string> ended_ IDEM_GUARDED_BY(mu_);
  std::map<std::string, std::vector<Clock::time_point>> calls_ IDEM_GUARDED_BY(mu_);
  BlockingPool pool_{8};
};

int StatusOf(std::string_view raw) {
  if (raw.substr(0, 9) != "HTTP/1.1 " || raw.size() < 12) return 0;
  return std::stoi(std::string(raw.substr(9, 3)));
}

class ServerTest : public ::testing::Test {
 protected:
  ServerTest() {
    options_.port = 0;
    options_.drain_timeout = milliseconds(3000);
  }
  ~ServerTest() override {
    handler_.Open();  // a failed test must not leave the server waiting for a blocked request
    if (server_) server_->Drain();
  }

  void Start() {
    auto server = Server::Start(options_, handler_, nullptr);
    ASSERT_TRUE(server.has_value()) << server.error().message;
    server_ = std::move(*server);
    url_ = Url{"127.0.0.1", server_->port(), ""};
  }

  Result<Response> Get(std::string target) {
    Request r;
    r.method = "GET";
    r.target = std::move(target);
    return Call(url_, std::move(r), CallOptions{.timeout = milliseconds(10000)});
  }
  std::future<Result<Response>> GetAsync(std::string target) {
    return std::async(std::launch::async, [this, target] { return Get(target); });
  }

  // The header fields of a "GET /echo": one X-Pad field, Host and the blank line, `size` bytes in
  // all. X-Pad comes first so that no field is complete before the last bytes arrive.
  static std::string FieldsOfSize(std::size_t size) {
    const std::string name = "X-Pad: ";
    const std::string end = "\r\nHost: x\r\n\r\n";
    return name + std::string(size - name.size() - end.size(), 'p') + end;
  }

  ServerOptions options_;
  FakeHandler handler_;  // outlives server_
  std::unique_ptr<Server> server_;
  Url url_;
};

// --- limits -----------------------------------------------------------------------------------

// max_header_bytes bounds the header fields that follow the request line, through the blank
// line. (Beast counts from where its parse stands when it first needs more bytes; the request
// line is sent on its own first so that is always after the request line.)
TEST_F(ServerTest, HeaderFieldsAtTheLimitAreServedAndOnePastThemAre431) {
  options_.max_header_bytes = 1024;
  Start();
  {
    RawConnection c(server_->port());
    ASSERT_TRUE(c.Send("GET /echo HTTP/1.1\r\n"));
    std::this_thread::sleep_for(milliseconds(20));
    ASSERT_TRUE(c.Send(FieldsOfSize(1024)));
    const std::string answer = c.ReadResponse(milliseconds(3000));
    EXPECT_EQ(StatusOf(answer), 200) << answer;
  }
  {
    RawConnection c(server_->port());
    ASSERT_TRUE(c.Send("GET /echo HTTP/1.1\r\n"));
    std::this_thread::sleep_for(milliseconds(20));
    ASSERT_TRUE(c.Send(FieldsOfSize(1025)));
    const std::string answer = c.ReadAll(milliseconds(3000));
    EXPECT_EQ(StatusOf(answer), 431) << answer;
    EXPECT_NE(answer.find(R"("type":"urn:idem:problem:headers-too-large")"), std::string::npos);
    EXPECT_NE(answer.find(R"("detail":"the header section is too large")"), std::string::npos);
    EXPECT_TRUE(c.Closed());
  }
  EXPECT_EQ(handler_.Echoes(), 1);
}

// RFC 9112 §3: a request target longer than the server parses is 414, not 431. The request line
// alone is over max_header_bytes here; Beast has read none of it as a line.
TEST_F(ServerTest, ARequestLineOverTheHeaderLimitIs414) {
  options_.max_header_bytes = 1024;
  Start();
  RawConnection c(server_->port());
  ASSERT_TRUE(c.Send("GET /echo?pad=" + std::string(2048, 'a') + " HTTP/1.1\r\nHost: x\r\n\r\n"));
  const std::string answer = c.ReadAll(milliseconds(3000));
  EXPECT_EQ(StatusOf(answer), 414) << answer;
  EXPECT_NE(answer.find(R"("type":"urn:idem:problem:uri-too-long")"), std::string::npos);
  EXPECT_TRUE(c.Closed());
  EXPECT_EQ(handler_.Echoes(), 0);
}

TEST_F(ServerTest, BodyAtTheLimitIsServedAndOnePastItIs413) {
  options_.max_body_bytes = 1000;
  Start();
  Request at_limit{"POST", "/echo", {}, std::string(1000, 'b')};
  auto served = Call(url_, at_limit);
  ASSERT_TRUE(served.has_value()) << served.error().message;
  EXPECT_EQ(served->status, 200);
  EXPECT_EQ(served->body, "1000");

  // Refused on the declared length, before the body is read: send only the header.
  RawConnection c(server_->port());
  ASSERT_TRUE(c.Send("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 1001\r\n\r\n"));
  const std::string answer = c.ReadAll(milliseconds(3000));
  EXPECT_EQ(StatusOf(answer), 413) << answer;
  EXPECT_NE(answer.find(R"("type":"urn:idem:problem:payload-too-large")"), std::string::npos);
  EXPECT_NE(answer.find(R"("detail":"the body is larger than 1000 bytes")"), std::string::npos);
  EXPECT_TRUE(c.Closed());
  EXPECT_EQ(handler_.Echoes(), 1);
}

// --- Host and the request target (RFC 9112 §3.2) ---------------------------------------------

// One request on a fresh connection; its answer (status line, headers, body).
std::string Exchange(uint16_t port, std::string_view raw) {
  RawConnection c(port);
  if (!c.Send(raw)) return "";
  return c.ReadResponse(milliseconds(3000));
}

std::string BodyOf(std::string_view answer) {
  const std::size_t end = answer.find("\r\n\r\n");
  return end == std::string_view::npos ? "" : std::string(answer.substr(end + 4));
}

// A request of the tables below: `why` names it in failures, `raw` is its bytes.
struct RawCase {
  std::string why;
  std::string raw;
  bool closes = false;          // refused: the connection closes after the one answer
  std::string_view names = "";  // refused: a word the answer must hold
  int status = 200;             // served: the status
  std::optional<std::string> body = std::nullopt;  // served: the body, when given
};

std::string GetWithHost(std::string_view target, std::string_view host) {
  return "GET " + std::string(target) + " HTTP/1.1\r\nHost: " + std::string(host) + "\r\n\r\n";
}

// Requests the server refuses with 400 malformed-request before any handler runs.
std::vector<RawCase> MalformedRequests() {
  std::vector<RawCase> cases = {
      {.why = "garbage", .raw = "THIS IS NOT HTTP\r\n\r\n", .closes = true},
      // RFC 9112 §3.2: HTTP/1.1 requires one Host; the detail names it.
      {.why = "no Host", .raw = "GET /echo HTTP/1.1\r\n\r\n", .names = "Host"},
      {.why = "no Host",
       .raw = "POST /echo HTTP/1.1\r\nContent-Length: 2\r\n\r\nab",
       .names = "Host"},
      {.why = "no Host",
       .raw = "GET /echo HTTP/1.1\r\nX-Host: x\r\nHosts: x\r\n\r\n",
       .names = "Host"},
      // Absolute-form does not lift the Host requirement of HTTP/1.1.
      {.why = "no Host", .raw = "GET http://example.com/target HTTP/1.1\r\n\r\n"},
      // Two Host fields, in any version.
      {.why = "two Hosts", .raw = "GET /echo HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n"},
      {.why = "two Hosts", .raw = "GET /echo HTTP/1.1\r\nHost: a\r\nhost: a\r\n\r\n"},
      {.why = "two Hosts", .raw = "GET /echo HTTP/1.0\r\nHost: a\r\nHost: b\r\n\r\n"},
      {.why = "two Hosts", .raw = "GET http://a/echo HTTP/1.1\r\nHost: a\r\nHost: a\r\n\r\n"},
      // RFC 9112 §6.1 and §6.3: Beast reads a body whose Transfer-Encoding does not end in
      // chunked as empty and its bytes as the next request (or lets a Content-Length frame it);
      // HTTP/1.0 has no transfer codings. Refused, and the connection closed.
      {.why = "Transfer-Encoding",
       .raw = "POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\nContent-Length: "
              "2\r\n\r\nab",
       .closes = true},
      {.why = "Transfer-Encoding",
       .raw = "POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked, "
              "gzip\r\n\r\n2\r\nab\r\n0\r\n\r\n",
       .closes = true},
      {.why = "Transfer-Encoding",
       .raw =
           "POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked, chunked\r\n\r\n0\r\n\r\n",
       .closes = true},
      {.why = "Transfer-Encoding",
       .raw = "POST /echo HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\n0\r\n\r\n",
       .closes = true},
  };
  // An absolute-form target of another scheme, or one that does not parse (RFC 9112 §3.2.2).
  for (std::string_view target :
       {"ftp://example.com/target", "mailto:a@example.com", "urn:x:target", "http:/target",
        "http:///target", "http://example.com/target#f", "http://u@example.com/target",
        "http://[::1/target", "http://example.com:99999/target", "target", "*",
        "1http://x/target"}) {
    cases.push_back({.why = "absolute-form target", .raw = GetWithHost(target, "x")});
  }
  // RFC 9112 §3.2: a Host that is not uri-host [":" port] is 400 like a missing one.
  for (std::string_view host : {"a b", "user@example.com", "example.com/x", "[::1", "x:99999"}) {
    cases.push_back({.why = "Host", .raw = GetWithHost("/echo", host)});
  }
  // An origin-form target is a path and a query of RFC 3986: no bad percent-encoding, no raw
  // character outside the grammar, no fragment.
  for (std::string_view target : {"/echo%", "/echo%zz", "/echo?a=%4", "/ec{ho", "/echo|", "/echo#f",
                                  "/ech\xc3\xb6", "/echo\\x"}) {
    cases.push_back({.why = "origin-form target", .raw = GetWithHost(target, "x")});
  }
  return cases;
}

TEST_F(ServerTest, MalformedRequestsAre400AndNeverHandled) {
  Start();
  for (const RawCase& c : MalformedRequests()) {
    SCOPED_TRACE(c.why + ": " + c.raw);
    RawConnection connection(server_->port());
    ASSERT_TRUE(connection.Send(c.raw));
    const std::string answer = c.closes ? connection.ReadAll(milliseconds(3000))
                                        : connection.ReadResponse(milliseconds(3000));
    EXPECT_EQ(StatusOf(answer), 400) << answer;
    EXPECT_NE(answer.find(R"("type":"urn:idem:problem:malformed-request")"), std::string::npos)
        << answer;
    EXPECT_NE(answer.find(c.names), std::string::npos) << "the detail names what is missing";
    if (c.closes) {
      EXPECT_EQ(answer.find("HTTP/1.1 ", 1), std::string::npos) << "one answer only: " << answer;
      EXPECT_TRUE(connection.Closed());
    }
    EXPECT_EQ(handler_.Echoes(), 0);
  }
}

// Requests near the ones refused above that are served, each by one handler call.
std::vector<RawCase> EdgeRequestsServed() {
  std::vector<RawCase> cases = {
      // HTTP/1.0 has no Host requirement; an HTTP/1.1 request with one Host is served, even an
      // empty one (RFC 9110 §7.2).
      {.why = "HTTP/1.0 without Host", .raw = "GET /echo HTTP/1.0\r\n\r\n", .body = "0"},
      {.why = "empty Host", .raw = "GET /echo HTTP/1.1\r\nHost:\r\n\r\n", .body = "0"},
      {.why = "Host in capitals", .raw = "GET /echo HTTP/1.1\r\nHOST: x\r\n\r\n", .body = "0"},
      // Absolute-form (RFC 9112 §3.2.2) is routed by its path and query as if it were
      // origin-form, and the target's authority replaces the Host field the client sent.
      {.why = "absolute-form",
       .raw = "GET http://127.0.0.1:8080/target HTTP/1.1\r\nHost: 127.0.0.1:8080\r\n\r\n",
       .body = "/target host=127.0.0.1:8080 hosts=1"},
      {.why = "absolute-form",
       .raw = "GET http://example.com/target?a=1&b=%20 HTTP/1.1\r\nHost: other\r\n\r\n",
       .body = "/target?a=1&b=%20 host=example.com hosts=1"},
      {.why = "absolute-form",
       .raw = "POST HTTPS://example.com:443/target HTTP/1.1\r\nHost: x\r\nContent-Length: "
              "2\r\n\r\nab",
       .body = "/target host=example.com:443 hosts=1"},
      {.why = "absolute-form",
       .raw = "GET http://example.com/target HTTP/1.0\r\n\r\n",
       .body = "/target host=example.com hosts=1"},
      // An empty path is "/" (RFC 9112 §3.2.1): the fake answers 404 there, not the server 400.
      {.why = "absolute-form, empty path",
       .raw = "GET http://example.com HTTP/1.1\r\nHost: x\r\n\r\n",
       .status = 404},
      // Every character RFC 3986 allows raw in a query, and a percent-encoded one.
      {.why = "origin-form target",
       .raw = "GET /echo?a=%41&b=:@!$'()*+,;=/? HTTP/1.1\r\nHost: x\r\n\r\n"},
  };
  // An IP literal with a port is a host (RFC 9112 §3.2).
  for (std::string_view host : {"[::1]:8080", "example.com:8080", "127.0.0.1"}) {
    cases.push_back({.why = "Host", .raw = GetWithHost("/echo", host)});
  }
  return cases;
}

TEST_F(ServerTest, EdgeRequestsAreServed) {
  Start();
  for (const RawCase& c : EdgeRequestsServed()) {
    SCOPED_TRACE(c.why + ": " + c.raw);
    const int echoes = handler_.Echoes();
    const std::string answer = Exchange(server_->port(), c.raw);
    EXPECT_EQ(StatusOf(answer), c.status) << answer;
    if (c.body) {
      EXPECT_EQ(BodyOf(answer), *c.body);
    }
    EXPECT_EQ(handler_.Echoes(), echoes + (c.status == 200 ? 1 : 0)) << "handled once";
  }
}

// Found by fuzz/http_fuzz.cc, which also reads its input in pieces: a chunked body whose last
// chunk arrives as "0\r\n" and then its final CRLF byte by byte made Beast 1.81's parser assert
// (wrongly: boostorg/beast#2861), aborting debug and sanitizer builds of the server on a valid
// request. asio_impl.cc compiles Boost's sources without their assertions now.
TEST_F(ServerTest, AChunkedBodyWhoseLastChunkArrivesInPiecesIsServed) {
  Start();
  RawConnection c(server_->port());
  ASSERT_TRUE(c.Send("POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n"));
  for (const char* piece : {"\r", "\n"}) {
    std::this_thread::sleep_for(milliseconds(50));
    ASSERT_TRUE(c.Send(piece));
  }
  const std::string answer = c.ReadResponse(milliseconds(3000));
  EXPECT_EQ(StatusOf(answer), 200) << answer;
  EXPECT_EQ(handler_.Echoes(), 1);
}

// --- the whole-request deadline ---------------------------------------------------------------

TEST_F(ServerTest, AClientSendingHeadersSlowlyIsCutOffWhileAnotherIsServed) {
  options_.read_timeout = milliseconds(1000);
  Start();
  RawConnection slow(server_->port());
  ASSERT_TRUE(slow.Connected());
  const auto started = Clock::now();
  ASSERT_TRUE(slow.Send("GET /echo HTTP/1.1\r\nHost: x\r\n"));
  // A byte every 50 ms: a deadline per read would never fire; the one for the whole request does.
  std::thread dribble([&] {
    for (int i = 0; i < 100 && !slow.Closed(); ++i) {
      if (!slow.Send("X-Slow: a\r\n")) break;
      std::this_thread::sleep_for(milliseconds(50));
    }
  });
  std::this_thread::sleep_for(milliseconds(100));
  auto other = Get("/echo");
  const auto other_done = Clock::now();
  const std::string answer = slow.ReadAll(milliseconds(5000));
  const auto cut_off = Clock::now();
  dribble.join();

  ASSERT_TRUE(other.has_value()) << other.error().message;
  EXPECT_EQ(other->status, 200);
  EXPECT_TRUE(slow.Closed()) << "the slow client must be disconnected";
  EXPECT_EQ(answer, "") << "a cut-off client gets no answer";
  EXPECT_LT(other_done, cut_off) << "the other client is served while the slow one is connected";
  EXPECT_GE(cut_off - started, milliseconds(500)) << "not before the read timeout";
  EXPECT_LT(cut_off - started, milliseconds(3000)) << "within the read timeout (1 s), generously";
}

// --- drain ------------------------------------------------------------------------------------

TEST_F(ServerTest, DrainFinishesInFlightRequestsAndRefusesNewOnes) {
  Start();
  // An idle keep-alive connection that has been served once.
  RawConnection idle(server_->port());
  ASSERT_TRUE(idle.Send("GET /echo HTTP/1.1\r\nHost: x\r\n\r\n"));
  ASSERT_EQ(StatusOf(idle.ReadResponse(milliseconds(3000))), 200);
  ASSERT_EQ(handler_.Echoes(), 1);
  // One request running in the handler, one parked.
  auto running = GetAsync("/block");
  ASSERT_TRUE(handler_.WaitBlocked(1));
  auto parked = GetAsync("/park?key=drain&ms=20000");
  ASSERT_TRUE(handler_.WaitCalls("drain", 1));

  auto drained = std::async(std::launch::async, [&] { server_->Drain(); });
  // New connections are refused once the acceptor is closed.
  bool refused = false;
  for (int i = 0; i < 200 && !refused; ++i) {
    RawConnection probe(server_->port());
    refused = !probe.Connected();
    if (!refused) std::this_thread::sleep_for(milliseconds(10));
  }
  EXPECT_TRUE(refused) << "Drain must stop accepting";

  // A new request on the open keep-alive connection is not served: it gets 503 shutting-down or,
  // if Drain closed the idle connection first, no answer at all.
  idle.Send("GET /echo HTTP/1.1\r\nHost: x\r\n\r\n");
  const std::string refusal = idle.ReadAll(milliseconds(3000));
  EXPECT_TRUE(idle.Closed());
  if (!refusal.empty()) {
    EXPECT_EQ(StatusOf(refusal), 503) << refusal;
    EXPECT_NE(refusal.find(R"("type":"urn:idem:problem:shutting-down")"), std::string::npos);
  }
  EXPECT_EQ(handler_.Echoes(), 1);

  // The parked request is answered 503 shutting-down at its next wake-up, with Retry-After.
  ASSERT_EQ(parked.wait_for(std::chrono::seconds(5)), std::future_status::ready);
  auto parked_answer = parked.get();
  ASSERT_TRUE(parked_answer.has_value()) << parked_answer.error().message;
  EXPECT_EQ(parked_answer->status, 503);
  EXPECT_EQ(parked_answer->headers.Get("retry-after"), "1");
  EXPECT_NE(parked_answer->body.find(R"("type":"urn:idem:problem:shutting-down")"),
            std::string::npos);

  // The running request finishes with its own answer, then Drain returns.
  handler_.Open();
  ASSERT_EQ(running.wait_for(std::chrono::seconds(5)), std::future_status::ready);
  auto running_answer = running.get();
  ASSERT_TRUE(running_answer.has_value()) << running_answer.error().message;
  EXPECT_EQ(running_answer->status, 200);
  EXPECT_EQ(running_answer->body, "unblocked");
  EXPECT_EQ(drained.wait_for(std::chrono::seconds(5)), std::future_status::ready);
}

// --- parking ----------------------------------------------------------------------------------

TEST_F(ServerTest, NotifyWakesAParkedRequestAtOnce) {
  Start();
  auto parked = GetAsync("/park?key=n&ms=20000");
  // By its fifth call the server's own re-poll of a parked request is 800 ms away (50 ms,
  // doubling): a wake-up much sooner than that can only come from Notify.
  ASSERT_TRUE(handler_.WaitCalls("n", 5));
  handler_.Release("n");
  const auto notified = Clock::now();
  // Notify until the handler runs again: a notification that lands between the handler's
  // decision to park and the server's registration of the park is lost by design.
  while (handler_.Calls("n").size() < 6 && Clock::now() - notified < std::chrono::seconds(3)) {
    server_->Notify("n");
    std::this_thread::sleep_for(milliseconds(10));
  }
  ASSERT_EQ(parked.wait_for(std::chrono::seconds(5)), std::future_status::ready);
  auto answer = parked.get();
  ASSERT_TRUE(answer.has_value()) << answer.error().message;
  EXPECT_EQ(answer->status, 200);
  EXPECT_EQ(answer->body, "released");
  const auto calls = handler_.Calls("n");
  ASSERT_GE(calls.size(), 6u);
  EXPECT_LT(calls[5] - notified, milliseconds(400)) << "woken by Notify, not by the next poll";
}

TEST_F(ServerTest, AParkedRequestIsCalledAgainAtItsDeadlineWithoutANotify) {
  Start();
  // Polls alone would call at 0, 50, 150, 350, 750 and 1550 ms; the deadline at 900 ms must
  // wake it between the last two.
  auto parked = GetAsync("/park?key=d&ms=900");
  ASSERT_EQ(parked.wait_for(std::chrono::seconds(5)), std::future_status::ready);
  auto answer = parked.get();
  ASSERT_TRUE(answer.has_value()) << answer.error().message;
  EXPECT_EQ(answer->status, 200);
  EXPECT_EQ(answer->body, "deadline");
  const auto calls = handler_.Calls("d");
  ASSERT_GE(calls.size(), 2u);
  EXPECT_GE(calls.back() - calls.front(), milliseconds(900));
  EXPECT_LT(calls.back() - calls.front(), milliseconds(1400)) << "woken by the deadline";
}

// --- admission --------------------------------------------------------------------------------

TEST_F(ServerTest, BeyondMaxInFlightRequestsAre503Overloaded) {
  options_.max_in_flight = 2;
  Start();
  // Two requests admitted (the limit is 2) ...
  auto running = GetAsync("/block");
  auto queued = GetAsync("/block");
  ASSERT_TRUE(handler_.WaitBlocked(2));
  // ... and a third is refused without reaching the handler.
  auto refused = Get("/echo");
  ASSERT_TRUE(refused.has_value()) << refused.error().message;
  EXPECT_EQ(refused->status, 503);
  EXPECT_EQ(refused->headers.Get("retry-after"), "1");
  EXPECT_EQ(refused->headers.Get("content-type"), "application/problem+json");
  EXPECT_NE(refused->body.find(R"("type":"urn:idem:problem:overloaded")"), std::string::npos);
  EXPECT_EQ(handler_.Echoes(), 0);

  handler_.Open();
  for (auto* pending : {&running, &queued}) {
    ASSERT_EQ(pending->wait_for(std::chrono::seconds(5)), std::future_status::ready);
    auto answer = pending->get();
    ASSERT_TRUE(answer.has_value()) << answer.error().message;
    EXPECT_EQ(answer->status, 200);
  }
  // Admission reopens as work finishes.
  auto later = Get("/echo");
  ASSERT_TRUE(later.has_value()) << later.error().message;
  EXPECT_EQ(later->status, 200);
}

// A handler that waits holds no thread: with one I/O thread, a hundred requests waiting on their
// handlers' timers leave the server free to answer another request before any of them ends.
TEST_F(ServerTest, WaitingHandlersHoldNoThread) {
  options_.io_threads = 1;
  Start();
  std::vector<std::future<Result<Response>>> sleepers;
  for (int i = 0; i < 100; ++i) sleepers.push_back(GetAsync("/sleep?ms=4000"));
  std::this_thread::sleep_for(milliseconds(300));  // the sleepers are read and waiting
  auto echo = Get("/echo");
  const int slept_when_answered = handler_.Slept();
  ASSERT_TRUE(echo.has_value()) << echo.error().message;
  EXPECT_EQ(echo->status, 200);
  EXPECT_EQ(slept_when_answered, 0) << "the echo must not wait for the sleepers";
  for (auto& sleeper : sleepers) {
    auto answer = sleeper.get();
    ASSERT_TRUE(answer.has_value()) << answer.error().message;
    EXPECT_EQ(answer->body, "slept");
  }
  EXPECT_EQ(handler_.Slept(), 100);
}

// A parked request takes none of the room meant for executing requests: with a limit of one
// executing request, two parked ones leave it free.
TEST_F(ServerTest, ParkedRequestsDoNotCountAgainstMaxInFlight) {
  options_.max_in_flight = 1;
  Start();
  auto first = GetAsync("/park?key=p1&ms=20000");
  ASSERT_TRUE(handler_.WaitCalls("p1", 1));
  auto second = GetAsync("/park?key=p2&ms=20000");
  ASSERT_TRUE(handler_.WaitCalls("p2", 1)) << "a second waiter must park, not be refused";
  auto running = GetAsync("/block");
  ASSERT_TRUE(handler_.WaitBlocked(1)) << "an executing request must be admitted";
  // The one executing request fills the limit.
  auto refused = Get("/echo");
  ASSERT_TRUE(refused.has_value()) << refused.error().message;
  EXPECT_EQ(refused->status, 503);
  // What the server reports (idemd's gauges), until the counts are as expected or a while passed.
  auto counts = [&](int in_flight, int parked) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while ((server_->InFlight() != in_flight || server_->ParkedCount() != parked) &&
           std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return std::pair(server_->InFlight(), server_->ParkedCount());
  };
  EXPECT_EQ(counts(1, 2), std::pair(1, 2)) << "one executing, two parked";

  handler_.Open();
  for (const char* key : {"p1", "p2"}) {
    handler_.Release(key);
    server_->Notify(key);
  }
  for (auto* pending : {&first, &second, &running}) {
    ASSERT_EQ(pending->wait_for(std::chrono::seconds(5)), std::future_status::ready);
    auto answer = pending->get();
    ASSERT_TRUE(answer.has_value()) << answer.error().message;
    EXPECT_EQ(answer->status, 200);
  }
  EXPECT_EQ(counts(0, 0), std::pair(0, 0));
}

// Parked requests have their own bound, max_parked: at the bound requests park; one past it the
// handler is refused room and answers at once. Room comes back as parked requests end.
TEST_F(ServerTest, AtMostMaxParkedRequestsParkBeyondThatTheHandlerAnswersAtOnce) {
  options_.max_parked = 2;
  Start();
  auto a = GetAsync("/park?key=a&ms=20000");
  ASSERT_TRUE(handler_.WaitCalls("a", 1));
  auto b = GetAsync("/park?key=b&ms=20000");
  ASSERT_TRUE(handler_.WaitCalls("b", 1));
  auto c = GetAsync("/park?key=c&ms=20000");
  ASSERT_EQ(c.wait_for(std::chrono::seconds(3)), std::future_status::ready)
      << "one past max_parked must be answered at once";
  auto refused = c.get();
  ASSERT_TRUE(refused.has_value()) << refused.error().message;
  EXPECT_EQ(refused->status, 409);
  EXPECT_EQ(refused->body, "no room");

  handler_.Release("a");
  server_->Notify("a");
  ASSERT_EQ(a.wait_for(std::chrono::seconds(5)), std::future_status::ready);
  EXPECT_EQ(a.get()->body, "released");
  auto d = GetAsync("/park?key=d&ms=20000");
  ASSERT_TRUE(handler_.WaitCalls("d", 2)) << "room came back: d parks and polls";
  for (const char* key : {"b", "d"}) {
    handler_.Release(key);
    server_->Notify(key);
  }
  for (auto* pending : {&b, &d}) {
    ASSERT_EQ(pending->wait_for(std::chrono::seconds(5)), std::future_status::ready);
    EXPECT_EQ(pending->get()->body, "released");
  }
}

// A parked request whose client goes away ends at once (its hold is given back), not at its
// deadline.
TEST_F(ServerTest, AParkedRequestEndsWhenItsConnectionCloses) {
  Start();
  {
    RawConnection c(server_->port());
    ASSERT_TRUE(c.Send("GET /park?key=gone&ms=20000 HTTP/1.1\r\nHost: x\r\n\r\n"));
    ASSERT_TRUE(handler_.WaitCalls("gone", 1));
  }
  EXPECT_TRUE(handler_.WaitEnded("gone", milliseconds(3000)))
      << "a closed connection must end its parked request long before the 20 s deadline";
  // A pipelined second request on a parked connection does not end the first.
  RawConnection p(server_->port());
  ASSERT_TRUE(
      p.Send("GET /park?key=piped&ms=1000 HTTP/1.1\r\nHost: x\r\n\r\n"
             "GET /echo HTTP/1.1\r\nHost: x\r\n\r\n"));
  const std::string first = p.ReadResponse(milliseconds(5000));
  EXPECT_EQ(StatusOf(first), 200) << first;
  EXPECT_NE(first.find("deadline"), std::string::npos) << first;
  EXPECT_EQ(StatusOf(p.ReadResponse(milliseconds(5000))), 200);
}

// --- handler failures -------------------------------------------------------------------------

TEST_F(ServerTest, AHandlerThatThrowsIsAnswered500Internal) {
  Start();
  for (const char* target : {"/throw", "/throw-int"}) {
    SCOPED_TRACE(target);
    auto answer = Get(target);
    ASSERT_TRUE(answer.has_value()) << answer.error().message;
    EXPECT_EQ(answer->status, 500);
    EXPECT_EQ(answer->headers.Get("content-type"), "application/problem+json");
    EXPECT_EQ(answer->body,
              R"({"type":"urn:idem:problem:internal","title":"Internal Server Error",)"
              R"("status":500,"detail":"unexpected failure"})");
  }
  // The server goes on serving.
  auto after = Get("/echo");
  ASSERT_TRUE(after.has_value()) << after.error().message;
  EXPECT_EQ(after->status, 200);
}

}  // namespace
}  // namespace idem::http
