// http/client_test.cc — ClientPool and the blocking Call against an upstream written on raw
// Asio in this file, over loopback, so that a test can make it misbehave: close a connection after
// answering, never answer, answer Connection: close or HTTP/1.0, serve TLS with a certificate made
// for the test by the openssl command.
//
// Tests bind port 0. A timing assertion's bound lies far from both the expected time and the time
// a broken feature would show.
#include "http/client.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <optional>
#include <thread>
#include <vector>

#include "idem/mutex.h"

namespace idem::http {
namespace {

namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
namespace net = boost::asio;
namespace ssl = boost::asio::ssl;
using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr auto kTuple = net::as_tuple(net::use_awaitable);

// What the upstream does with each request.
struct Behaviour {
  Millis delay{0};                      // wait this long before answering
  bool never_answer = false;            // read the request, then wait for the client to go
  bool connection_close = false;        // answer with Connection: close, then close
  bool http10 = false;                  // answer HTTP/1.0 without keep-alive, then close
  std::optional<Millis> close_after{};  // close this long after answering (keep-alive answer)
  std::size_t body_bytes = 0;           // answer a body of this many bytes instead of the echo
};

struct Seen {
  std::string method;
  std::string target;
  std::string host;
  std::string body;
};

// An HTTP/1.1 upstream on 127.0.0.1, served by one thread of its own: answers each request 201
// with X-Method, X-Target and X-Test (the request's) headers and the request's body; counts
// connections and requests. Plain TCP, or TLS with a server context. Thread-safe accessors.
class Upstream {
 public:
  explicit Upstream(Behaviour behaviour = {}, ssl::context* tls = nullptr)
      : behaviour_(behaviour), tls_(tls), acceptor_(ioc_, {net::ip::make_address("127.0.0.1"), 0}) {
    port_ = acceptor_.local_endpoint().port();
    net::co_spawn(ioc_, Accept(), net::detached);
    thread_ = std::thread([this] { ioc_.run(); });
  }
  ~Upstream() {
    ioc_.stop();
    thread_.join();
  }

  uint16_t port() const { return port_; }
  int Accepted() const {
    MutexLock lock(mu_);
    return accepted_;
  }
  int Open() const {
    MutexLock lock(mu_);
    return open_;
  }
  int MaxOpen() const {
    MutexLock lock(mu_);
    return max_open_;
  }
  int Requests() const {
    MutexLock lock(mu_);
    return static_cast<int>(seen_.size());
  }
  std::vector<Seen> SeenRequests() const {
    MutexLock lock(mu_);
    return seen_;
  }

 private:
  Async<void> Accept() {
    while (true) {
      auto [ec, socket] = co_await acceptor_.async_accept(kTuple);
      if (ec) co_return;
      {
        MutexLock lock(mu_);
        ++accepted_;
        max_open_ = std::max(max_open_, ++open_);
      }
      net::co_spawn(ioc_, Session(std::move(socket)), net::detached);
    }
  }

  Async<void> Session(tcp::socket socket) {
    if (tls_) {
      beast::ssl_stream<beast::tcp_stream> stream(std::move(socket), *tls_);
      auto [ec] = co_await stream.async_handshake(ssl::stream_base::server, kTuple);
      if (!ec) co_await Serve(stream);
    } else {
      beast::tcp_stream stream(std::move(socket));
      co_await Serve(stream);
    }
    MutexLock lock(mu_);
    --open_;
  }

  // Answers requests until the client goes or the behaviour ends the connection; returning closes
  // it (without a TLS close_notify).
  template <class Stream>
  Async<void> Serve(Stream& stream) {
    beast::flat_buffer buffer;
    while (true) {
      bhttp::request<bhttp::string_body> req;
      auto [ec, n] = co_await bhttp::async_read(stream, buffer, req, kTuple);
      if (ec) co_return;
      {
        MutexLock lock(mu_);
        seen_.push_back(Seen{std::string(req.method_string()), std::string(req.target()),
                             std::string(req[bhttp::field::host]), req.body()});
      }
      if (behaviour_.never_answer) {
        bhttp::request<bhttp::string_body> next;
        co_await bhttp::async_read(stream, buffer, next, kTuple);  // until the client goes
        co_return;
      }
      if (behaviour_.delay > Millis(0)) co_await Sleep(behaviour_.delay);
      bhttp::response<bhttp::string_body> res{bhttp::status::created,
                                              behaviour_.http10 ? 10u : 11u};
      res.set("X-Method", req.method_string());
      res.set("X-Target", req.target());
      res.set("X-Test", req["X-Test"]);
      res.body() = behaviour_.body_bytes > 0 ? std::string(behaviour_.body_bytes, 'x') : req.body();
      res.keep_alive(!behaviour_.connection_close && !behaviour_.http10);
      res.prepare_payload();
      auto [written, m] = co_await bhttp::async_write(stream, res, kTuple);
      if (written || behaviour_.connection_close || behaviour_.http10) co_return;
      if (behaviour_.close_after) {
        co_await Sleep(*behaviour_.close_after);
        co_return;
      }
    }
  }

 public:
  static Async<void> Sleep(Millis duration) {
    net::steady_timer timer(co_await net::this_coro::executor, duration);
    co_await timer.async_wait(kTuple);
  }

 private:
  const Behaviour behaviour_;
  ssl::context* const tls_;
  net::io_context ioc_;
  tcp::acceptor acceptor_;
  uint16_t port_ = 0;
  mutable Mutex mu_;
  int accepted_ IDEM_GUARDED_BY(mu_) = 0;
  int open_ IDEM_GUARDED_BY(mu_) = 0;
  int max_open_ IDEM_GUARDED_BY(mu_) = 0;
  std::vector<Seen> seen_ IDEM_GUARDED_BY(mu_);
  std::thread thread_;
};

Url Local(uint16_t port, std::string host = "127.0.0.1", std::string scheme = "http") {
  return Url{std::move(host), port, "", std::move(scheme)};
}

Request Post(std::string target, std::string body, std::string test = "") {
  Request r{"POST", std::move(target), {}, std::move(body)};
  if (!test.empty()) r.headers.Add("X-Test", test);
  return r;
}

std::unique_ptr<ClientPool> MakePool(const Url& url, PoolOptions options = {}) {
  auto pool = ClientPool::Make(url, std::move(options));
  IDEM_CHECK(pool.has_value());
  return std::move(*pool);
}

// Waits up to 5 s for `done`, from plain code or (Within) a coroutine.
bool Eventually(const std::function<bool()>& done) {
  for (int i = 0; i < 1000 && !done(); ++i) std::this_thread::sleep_for(milliseconds(5));
  return done();
}
Async<bool> Within(std::function<bool()> done) {
  for (int i = 0; i < 1000 && !done(); ++i) co_await Upstream::Sleep(milliseconds(5));
  co_return done();
}

std::string Describe(const Result<Response>& r) {
  return r ? "status " + std::to_string(r->status)
           : std::string(ErrcName(r.error().code)) + ": " + r.error().message;
}

TEST(ClientTest, ParseHttpUrlTakesHttpAndHttps) {
  auto http = ParseHttpUrl("http://provider.internal/base/");
  ASSERT_TRUE(http.has_value());
  EXPECT_EQ(http->scheme, "http");
  EXPECT_EQ(http->host, "provider.internal");
  EXPECT_EQ(http->port, 80);
  EXPECT_EQ(http->base_path, "/base");
  auto https = ParseHttpUrl("HTTPS://api.example.com");
  ASSERT_TRUE(https.has_value());
  EXPECT_EQ(https->scheme, "https");
  EXPECT_EQ(https->port, 443);
  auto port = ParseHttpUrl("https://api.example.com:8443/v2");
  ASSERT_TRUE(port.has_value());
  EXPECT_EQ(port->port, 8443);
  EXPECT_EQ(port->base_path, "/v2");
  for (const char* bad : {"ftp://x/", "https:///path", "//host/", "api.example.com"}) {
    auto r = ParseHttpUrl(bad);
    ASSERT_FALSE(r.has_value()) << bad;
    EXPECT_EQ(r.error().code, Errc::kInvalidArgument) << bad;
  }
}

TEST(ClientTest, MakeRefusesBadOptions) {
  PoolOptions none;
  none.max_connections = 0;
  PoolOptions negative;
  negative.idle_timeout = Millis(-1);
  PoolOptions missing_ca;
  missing_ca.tls.ca_file = "/nonexistent/ca.pem";
  for (const auto& [url, options] :
       std::vector<std::pair<Url, PoolOptions>>{{Local(80, "127.0.0.1", "ftp"), {}},
                                                {Local(80, ""), {}},
                                                {Local(80), none},
                                                {Local(80), negative},
                                                {Local(443, "localhost", "https"), missing_ca}}) {
    auto pool = ClientPool::Make(url, options);
    ASSERT_FALSE(pool.has_value()) << url.scheme << "://" << url.host;
    EXPECT_EQ(pool.error().code, Errc::kInvalidArgument) << pool.error().message;
  }
  // The blocking Call refuses what is neither http nor https too.
  auto r = Call(Local(80, "127.0.0.1", "ftp"), Post("/", ""));
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code, Errc::kInvalidArgument);
}

// 20 calls one after another share one connection; method, target, headers, body and status
// arrive as sent. Once the event loop the calls ran on is gone, so is the connection.
TEST(ClientPoolTest, SequentialCallsReuseOneConnectionAndRoundTrip) {
  Upstream upstream;
  auto pool = MakePool(Local(upstream.port()));
  std::vector<std::optional<Result<Response>>> results(20);
  int idle_between = -1;
  RunSyncVoid([&]() -> Async<void> {
    for (std::size_t i = 0; i < results.size(); ++i) {
      const std::string n = std::to_string(i);
      results[i] = co_await pool->Call(Post("/v1/charges?n=" + n, "body " + n, "test " + n));
      if (i == 0) idle_between = pool->IdleConnections();
    }
  }());
  EXPECT_EQ(idle_between, 1);
  for (std::size_t i = 0; i < results.size(); ++i) {
    const std::string n = std::to_string(i);
    ASSERT_TRUE(*results[i]) << i << ": " << Describe(*results[i]);
    const Response& r = **results[i];
    EXPECT_EQ(r.status, 201);
    EXPECT_EQ(r.headers.Get("X-Method"), "POST");
    EXPECT_EQ(r.headers.Get("X-Target"), "/v1/charges?n=" + n);
    EXPECT_EQ(r.headers.Get("X-Test"), "test " + n);
    EXPECT_EQ(r.body, "body " + n);
  }
  EXPECT_EQ(upstream.Accepted(), 1);
  const auto seen = upstream.SeenRequests();
  ASSERT_EQ(seen.size(), 20u);
  EXPECT_EQ(seen[7].method, "POST");
  EXPECT_EQ(seen[7].target, "/v1/charges?n=7");
  EXPECT_EQ(seen[7].host, "127.0.0.1:" + std::to_string(upstream.port()));
  EXPECT_EQ(seen[7].body, "body 7");
  // RunSync's io_context is gone: its idle connection was closed with it.
  EXPECT_EQ(pool->OpenConnections(), 0);
  EXPECT_EQ(pool->IdleConnections(), 0);
  EXPECT_TRUE(Eventually([&] { return upstream.Open() == 0; }));
}

// 20 calls at once, each on its own strand of a 2-thread io_context, through at most 4
// connections: the upstream never sees more than 4 open, all 20 succeed, and the calls that waited
// for a connection were woken when one came back, not at the end of their connect_timeout.
TEST(ClientPoolTest, ConcurrentCallsStayWithinMaxConnections) {
  Upstream upstream(Behaviour{.delay = milliseconds(50)});
  PoolOptions options;
  options.max_connections = 4;
  auto pool = MakePool(Local(upstream.port()), options);
  CallOptions call;
  call.connect_timeout = milliseconds(3000);
  std::vector<std::optional<Result<Response>>> results(20);
  const auto start = Clock::now();
  {
    net::io_context ioc;
    for (std::size_t i = 0; i < results.size(); ++i) {
      net::co_spawn(
          net::make_strand(ioc),
          [&, i]() -> Async<void> {
            results[i] = co_await pool->Call(Post("/c/" + std::to_string(i), "x"), call);
          },
          net::detached);
    }
    std::thread second([&] { ioc.run(); });
    ioc.run();
    second.join();
  }
  const auto elapsed = Clock::now() - start;
  for (std::size_t i = 0; i < results.size(); ++i) {
    ASSERT_TRUE(results[i].has_value()) << i;
    EXPECT_TRUE(*results[i]) << i << ": " << Describe(*results[i]);
  }
  EXPECT_EQ(upstream.Requests(), 20);
  EXPECT_EQ(upstream.MaxOpen(), 4);
  EXPECT_EQ(upstream.Accepted(), 4);
  // 5 rounds of 50 ms; waiters left to their deadline would take 3 s.
  EXPECT_LT(elapsed, milliseconds(1500));
  EXPECT_EQ(pool->OpenConnections(), 0);
}

// The upstream closes a keep-alive connection a little after answering: the pool notices before
// reusing it and opens a new one; no request is sent twice.
TEST(ClientPoolTest, AnIdleConnectionTheUpstreamClosedIsNotReused) {
  Upstream upstream(Behaviour{.close_after = milliseconds(20)});
  auto pool = MakePool(Local(upstream.port()));
  std::optional<Result<Response>> first, second;
  bool closed = false;
  int idle_before = -1;
  RunSyncVoid([&]() -> Async<void> {
    first = co_await pool->Call(Post("/1", "one"));
    closed = co_await Within([&] { return upstream.Open() == 0; });
    idle_before = pool->IdleConnections();
    second = co_await pool->Call(Post("/2", "two"));
  }());
  ASSERT_TRUE(*first) << Describe(*first);
  ASSERT_TRUE(closed);
  EXPECT_EQ(idle_before, 1);  // still in the pool, closed by the upstream
  ASSERT_TRUE(*second) << Describe(*second);
  EXPECT_EQ((*second)->body, "two");
  EXPECT_EQ(upstream.Accepted(), 2);
  const auto seen = upstream.SeenRequests();
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0].target, "/1");
  EXPECT_EQ(seen[1].target, "/2");
}

// An idle connection older than idle_timeout is closed rather than reused.
TEST(ClientPoolTest, AnIdleConnectionPastTheIdleTimeoutIsNotReused) {
  Upstream upstream;
  PoolOptions options;
  options.idle_timeout = milliseconds(50);
  auto pool = MakePool(Local(upstream.port()), options);
  std::optional<Result<Response>> first, second;
  RunSyncVoid([&]() -> Async<void> {
    first = co_await pool->Call(Post("/1", ""));
    co_await Upstream::Sleep(milliseconds(300));
    second = co_await pool->Call(Post("/2", ""));
  }());
  ASSERT_TRUE(*first) << Describe(*first);
  ASSERT_TRUE(*second) << Describe(*second);
  EXPECT_EQ(upstream.Accepted(), 2);
  EXPECT_EQ(upstream.Requests(), 2);
}

// A request the upstream never answers ends at the call's timeout with an unknown outcome; the
// connection is closed, not pooled.
TEST(ClientPoolTest, NoAnswerIsDeadlineExceededAfterTheTimeout) {
  Upstream upstream(Behaviour{.never_answer = true});
  auto pool = MakePool(Local(upstream.port()));
  CallOptions call;
  call.timeout = milliseconds(300);
  const auto start = Clock::now();
  auto r = RunSync(pool->Call(Post("/charge", "x"), call));
  const auto elapsed = Clock::now() - start;
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code, Errc::kDeadlineExceeded) << r.error().message;
  EXPECT_GE(elapsed, milliseconds(300));
  EXPECT_LT(elapsed, milliseconds(5000));
  EXPECT_EQ(upstream.Requests(), 1);
  EXPECT_EQ(pool->OpenConnections(), 0);
  EXPECT_TRUE(Eventually([&] { return upstream.Open() == 0; }));
}

// Nothing listens: the request cannot have been sent.
TEST(ClientPoolTest, AClosedPortIsUnavailable) {
  uint16_t port = 0;
  {
    net::io_context ioc;
    tcp::acceptor probe(ioc, {net::ip::make_address("127.0.0.1"), 0});
    port = probe.local_endpoint().port();
  }
  auto pool = MakePool(Local(port));
  auto r = RunSync(pool->Call(Post("/charge", "x")));
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code, Errc::kUnavailable) << r.error().message;
  EXPECT_EQ(pool->OpenConnections(), 0);
  auto blocking = Call(Local(port), Post("/charge", "x"));
  ASSERT_FALSE(blocking.has_value());
  EXPECT_EQ(blocking.error().code, Errc::kUnavailable) << blocking.error().message;
}

// A pool of one connection whose upstream never answers: the first call takes the connection
// (and ends kDeadlineExceeded after 3 s), the second waits for it with `waiter`'s options.
struct BusyPoolWait {
  std::optional<Result<Response>> busy, waited;
  Clock::duration waited_for{};
  std::vector<Seen> seen;
};
BusyPoolWait WaitOnABusyPool(CallOptions waiter) {
  Upstream upstream(Behaviour{.never_answer = true});
  PoolOptions options;
  options.max_connections = 1;
  auto pool = MakePool(Local(upstream.port()), options);
  CallOptions slow;
  slow.timeout = milliseconds(3000);
  BusyPoolWait out;
  {
    net::io_context ioc;
    // co_spawn runs them in this order: the first takes the only slot.
    net::co_spawn(
        ioc, [&]() -> Async<void> { out.busy = co_await pool->Call(Post("/busy", ""), slow); },
        net::detached);
    net::co_spawn(
        ioc,
        [&]() -> Async<void> {
          const auto start = Clock::now();
          out.waited = co_await pool->Call(Post("/waited", ""), waiter);
          out.waited_for = Clock::now() - start;
        },
        net::detached);
    ioc.run();
  }
  out.seen = upstream.SeenRequests();
  return out;
}

// With its one connection busy, a second call waits for it at most connect_timeout, then gives up
// with kUnavailable without sending anything.
TEST(ClientPoolTest, WaitingForABusyPoolIsBoundedByTheConnectTimeout) {
  CallOptions impatient;
  impatient.connect_timeout = milliseconds(200);
  const BusyPoolWait w = WaitOnABusyPool(impatient);
  ASSERT_TRUE(w.waited.has_value());
  ASSERT_FALSE(*w.waited);
  EXPECT_EQ(w.waited->error().code, Errc::kUnavailable) << w.waited->error().message;
  EXPECT_GE(w.waited_for, milliseconds(200));
  EXPECT_LT(w.waited_for, milliseconds(2000));  // not released by the busy call's end at 3 s
  ASSERT_TRUE(w.busy.has_value());
  ASSERT_FALSE(*w.busy);
  EXPECT_EQ(w.busy->error().code, Errc::kDeadlineExceeded);
  ASSERT_EQ(w.seen.size(), 1u);
  EXPECT_EQ(w.seen[0].target, "/busy");
}

// send_by ends the wait for a busy pool before connect_timeout (2 s here) would.
TEST(ClientPoolTest, WaitingForABusyPoolEndsAtSendBy) {
  CallOptions bounded;
  bounded.send_by = Clock::now() + milliseconds(200);
  const BusyPoolWait w = WaitOnABusyPool(bounded);
  ASSERT_TRUE(w.waited.has_value());
  ASSERT_FALSE(*w.waited);
  EXPECT_EQ(w.waited->error().code, Errc::kUnavailable) << w.waited->error().message;
  EXPECT_GE(w.waited_for, milliseconds(150));
  EXPECT_LT(w.waited_for, milliseconds(1500)) << "ended by send_by, not by connect_timeout";
  ASSERT_EQ(w.seen.size(), 1u);
  EXPECT_EQ(w.seen[0].target, "/busy");
}

// send_by: a request that cannot leave by then is not sent at all (kUnavailable), whether it
// waited for a connection or got one too late; the unused connection stays in the pool.
TEST(ClientPoolTest, ARequestThatCannotLeaveBySendByIsNotSent) {
  Upstream upstream(Behaviour{});
  auto pool = MakePool(Local(upstream.port()));
  std::optional<Result<Response>> refused;
  int idle_after_refusal = -1;
  bool in_time = false;
  RunSync([&]() -> Async<void> {
    EXPECT_TRUE((co_await pool->Call(Post("/first", ""))).has_value());
    CallOptions late;
    late.send_by = Clock::now() - milliseconds(1);
    refused = co_await pool->Call(Post("/late", ""), late);
    idle_after_refusal = pool->IdleConnections();
    CallOptions soon;
    soon.send_by = Clock::now() + milliseconds(5000);
    in_time = (co_await pool->Call(Post("/in-time", ""), soon)).has_value();
  }());
  ASSERT_TRUE(refused.has_value());
  ASSERT_FALSE(refused->has_value());
  EXPECT_EQ(refused->error().code, Errc::kUnavailable) << refused->error().message;
  EXPECT_EQ(idle_after_refusal, 1) << "the connection was not used and is kept";
  EXPECT_TRUE(in_time);
  EXPECT_EQ(upstream.Accepted(), 1) << "one connection served all three";
  const auto seen = upstream.SeenRequests();
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[1].target, "/in-time");
}

// A response over max_response_bytes: the upstream acted, its answer is unusable.
TEST(ClientPoolTest, AnOversizedResponseIsDataLoss) {
  Upstream upstream(Behaviour{.body_bytes = 2000});
  auto pool = MakePool(Local(upstream.port()));
  CallOptions call;
  call.max_response_bytes = 1000;
  auto r = RunSync(pool->Call(Post("/big", ""), call));
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code, Errc::kDataLoss) << r.error().message;
  EXPECT_EQ(upstream.Requests(), 1);
  EXPECT_EQ(pool->OpenConnections(), 0);
}

// A response with Connection: close, or HTTP/1.0 without keep-alive, ends its connection: the next
// call opens a new one.
TEST(ClientPoolTest, ConnectionCloseIsNotReused) {
  for (const Behaviour& behaviour :
       {Behaviour{.connection_close = true}, Behaviour{.http10 = true}}) {
    SCOPED_TRACE(behaviour.http10 ? "HTTP/1.0" : "Connection: close");
    Upstream upstream(behaviour);
    auto pool = MakePool(Local(upstream.port()));
    std::optional<Result<Response>> first, second;
    int open_between = -1;
    RunSyncVoid([&]() -> Async<void> {
      first = co_await pool->Call(Post("/1", "one"));
      open_between = pool->OpenConnections();
      second = co_await pool->Call(Post("/2", "two"));
    }());
    ASSERT_TRUE(*first) << Describe(*first);
    ASSERT_TRUE(*second) << Describe(*second);
    EXPECT_EQ((*second)->body, "two");
    EXPECT_EQ(open_between, 0);
    EXPECT_EQ(upstream.Accepted(), 2);
    EXPECT_EQ(upstream.Requests(), 2);
  }
}

// A CA and a certificate for "localhost" (a DNS name only: not 127.0.0.1), made by the openssl
// command in a temporary directory, removed on destruction.
class TestCerts {
 public:
  TestCerts() {
    char pattern[] = "/tmp/idem-client-test-XXXXXX";
    IDEM_CHECK(mkdtemp(pattern) != nullptr);
    dir_ = pattern;
    const std::string key = " -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
    const std::string script =
        "cd '" + dir_.string() + "' && " +  //
        "openssl req -x509" + key + " -keyout ca.key -out ca.pem -days 2 -subj '/CN=idem test CA'" +
        " && openssl req" + key + " -keyout server.key -out server.csr -subj '/CN=localhost'" +
        " && printf 'subjectAltName=DNS:localhost\\n' > san.ext" +
        " && openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial" +
        " -out server.pem -days 2 -extfile san.ext";
    ok_ = std::system(("(" + script + ") >/dev/null 2>&1").c_str()) == 0;
  }
  ~TestCerts() { std::filesystem::remove_all(dir_); }

  bool Made() const { return ok_; }
  std::string Ca() const { return (dir_ / "ca.pem").string(); }
  ssl::context ServerContext() const {
    ssl::context context(ssl::context::tls_server);
    context.use_certificate_chain_file((dir_ / "server.pem").string());
    context.use_private_key_file((dir_ / "server.key").string(), ssl::context::pem);
    return context;
  }

 private:
  std::filesystem::path dir_;
  bool ok_ = false;
};

// https: the server's certificate must chain to a trusted CA (the given file, or the system's,
// which do not know the test CA) and name the URL's host, else nothing is sent; verify=false
// accepts it. Connections are reused over TLS too.
TEST(ClientPoolTest, HttpsVerifiesTheServer) {
  TestCerts certs;
  ASSERT_TRUE(certs.Made()) << "the openssl command failed";
  ssl::context server_tls = certs.ServerContext();
  Upstream upstream({}, &server_tls);
  const Url url = Local(upstream.port(), "localhost", "https");

  PoolOptions trusted;
  trusted.tls.ca_file = certs.Ca();
  auto pool = MakePool(url, trusted);
  std::vector<std::optional<Result<Response>>> results(3);
  RunSyncVoid([&]() -> Async<void> {
    for (auto& r : results) r = co_await pool->Call(Post("/tls", "secret"));
  }());
  for (const auto& r : results) {
    ASSERT_TRUE(*r) << Describe(*r);
    EXPECT_EQ((*r)->body, "secret");
  }
  EXPECT_EQ(upstream.Accepted(), 1);
  EXPECT_EQ(upstream.SeenRequests()[0].host, "localhost:" + std::to_string(upstream.port()));

  // The system's CAs do not know the test CA: the handshake fails, nothing is sent.
  auto system = RunSync(MakePool(url)->Call(Post("/tls", "secret")));
  ASSERT_FALSE(system.has_value());
  EXPECT_EQ(system.error().code, Errc::kUnavailable);
  EXPECT_NE(system.error().message.find("certificate verify failed"), std::string::npos)
      << system.error().message;
  auto blocking = Call(url, Post("/tls", "secret"));
  ASSERT_FALSE(blocking.has_value());
  EXPECT_EQ(blocking.error().code, Errc::kUnavailable) << blocking.error().message;

  // The certificate names localhost, not 127.0.0.1.
  auto by_ip =
      RunSync(MakePool(Local(upstream.port(), "127.0.0.1", "https"), trusted)->Call(Post("/", "")));
  ASSERT_FALSE(by_ip.has_value());
  EXPECT_EQ(by_ip.error().code, Errc::kUnavailable) << by_ip.error().message;
  EXPECT_EQ(upstream.Requests(), 3);

  PoolOptions unverified;
  unverified.tls.verify = false;
  auto accepted = RunSync(MakePool(url, unverified)->Call(Post("/tls", "anyway")));
  ASSERT_TRUE(accepted) << Describe(accepted);
  EXPECT_EQ(accepted->body, "anyway");
  EXPECT_EQ(upstream.Requests(), 4);
}

// A call on another io_context does not take the idle connection of the first (its socket belongs
// to that context): it opens its own. Destroying an io_context closes the pool's idle connections
// on it.
TEST(ClientPoolTest, ACallOnAnotherIoContextOpensItsOwnConnection) {
  Upstream upstream;
  auto pool = MakePool(Local(upstream.port()));
  auto first_loop = std::make_unique<net::io_context>();
  auto work = net::make_work_guard(*first_loop);
  std::thread runner([&] { first_loop->run(); });

  std::optional<Result<Response>> first;
  net::co_spawn(
      *first_loop, [&]() -> Async<void> { first = co_await pool->Call(Post("/a", "a")); },
      net::use_future)
      .get();
  ASSERT_TRUE(*first) << Describe(*first);
  EXPECT_EQ(pool->IdleConnections(), 1);
  auto second = RunSync(pool->Call(Post("/b", "b")));  // a private io_context
  ASSERT_TRUE(second) << Describe(second);
  EXPECT_EQ(upstream.Accepted(), 2);
  EXPECT_EQ(upstream.Requests(), 2);
  EXPECT_EQ(pool->IdleConnections(), 1);  // the first loop's; RunSync's went with its loop

  work.reset();
  runner.join();
  first_loop.reset();
  EXPECT_EQ(pool->OpenConnections(), 0);
  EXPECT_EQ(pool->IdleConnections(), 0);
  EXPECT_TRUE(Eventually([&] { return upstream.Open() == 0; }));
}

}  // namespace
}  // namespace idem::http
