// http/server.cc — accept loop, coroutine sessions, handlers as coroutines, parking and
// drain.
#include "http/server.h"

#include <signal.h>
#include <sys/socket.h>

#include <atomic>
#include <boost/asio.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/url/authority_view.hpp>
#include <boost/url/parse.hpp>
#include <map>
#include <thread>

#include "http/beast_request.h"
#include "http/log.h"
#include "http/problem.h"
#include "idem/mutex.h"
#include "idem/thread_name.h"

namespace idem::http {
namespace {

namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;
using Strand = net::strand<net::io_context::executor_type>;

constexpr auto kTuple = net::as_tuple(net::use_awaitable);

struct Connection {
  Connection(tcp::socket socket, Strand executor)
      : stream(std::move(socket)), strand(std::move(executor)) {}
  beast::tcp_stream stream;
  Strand strand;
  std::atomic<bool> idle{true};
};

// RFC 3986 makes a port any run of digits, possibly empty; a port must be 1..65535.
bool PortOk(std::string_view port) {
  if (port.empty()) return true;
  const unsigned long number = port.size() > 5 ? 0 : std::stoul(std::string(port));
  return number >= 1 && number <= 65535;
}

// Why `request` (of HTTP version `version`, 10 or 11, framed as chunked when `chunked`) cannot be
// handled although Beast parsed it, or nothing. RFC 9112 §3.2: an HTTP/1.1 request without Host,
// any request with more than one Host line, and a Host that is not `host[:port]` are refused (an
// empty Host is allowed, RFC 9110 §7.2). §6.1 and §6.3: a Transfer-Encoding that does not end in
// chunked leaves the body's length unknown, and HTTP/1.0 has no transfer codings; Beast would
// read such a body as empty and the rest as the next request, so it is refused. An origin-form
// target must be a valid path and query (RFC 3986: no bad percent-encoding, no raw characters
// outside the URI grammar). An absolute-form target (§3.2.2) of http or https is rewritten to the
// origin-form of its path and query, and its authority replaces the Host the client sent; one of
// another scheme, or one that is no absolute URI, is refused. Asterisk-form (OPTIONS *) and
// authority-form (CONNECT) are left to the handler.
std::optional<std::string> Refusal(Request& request, unsigned version, bool chunked) {
  const int hosts = request.headers.Count("host");
  if (hosts > 1) return "send exactly one Host header, not " + std::to_string(hosts);
  if (hosts == 0 && version >= 11) return "an HTTP/1.1 request must carry a Host header";
  if (const std::optional<std::string_view> host = request.headers.Get("host");
      host && !host->empty()) {
    auto authority = boost::urls::parse_authority(*host);
    if (!authority || authority->has_userinfo() || !PortOk(authority->port())) {
      return "the Host header must be a host and an optional port";
    }
  }
  if (request.headers.Count("transfer-encoding") > 0 && (version < 11 || !chunked)) {
    return "a Transfer-Encoding must end in chunked, and only in HTTP/1.1";
  }
  const std::string_view target = request.target;
  if (target.starts_with('/')) {
    if (!boost::urls::parse_origin_form(target)) return "the request target is not a valid path";
    return std::nullopt;
  }
  if ((target == "*" && request.method == "OPTIONS") || request.method == "CONNECT") {
    return std::nullopt;
  }
  auto uri = boost::urls::parse_absolute_uri(target);
  if (!uri) return "the request target is neither a path nor an absolute URI";
  if (uri->scheme_id() != boost::urls::scheme::http &&
      uri->scheme_id() != boost::urls::scheme::https) {
    return "an absolute request target must be an http or https URI";
  }
  if (!uri->has_authority() || uri->encoded_host().empty() || uri->has_userinfo() ||
      !PortOk(uri->port())) {
    return "an absolute request target must name a host (and a valid port), without user info";
  }
  std::string origin(uri->encoded_path());
  if (origin.empty()) origin = "/";
  if (uri->has_query()) origin += "?" + std::string(uri->encoded_query());
  request.headers.Set("host", uri->encoded_host_and_port());
  request.target = std::move(origin);
  return std::nullopt;
}

// Whether a head refused for its size is so because of its request target: the request line is
// unfinished (`line_done` false; Beast consumes nothing of it until it is whole, so `received`
// holds it from its start) and its method has ended. RFC 9112 §3 answers that 414 (URI Too Long);
// a long header section is 431.
bool TargetTooLong(bool line_done, std::string_view received) {
  return !line_done && received.find(' ') != std::string_view::npos;
}

// `head`: the answer to a HEAD request carries the headers of the GET answer, no body.
bhttp::response<bhttp::string_body> ToBeast(Response&& in, bool keep_alive, bool head) {
  bhttp::response<bhttp::string_body> out;
  out.result(static_cast<unsigned>(in.status));
  out.version(11);
  for (auto& [name, value] : in.headers.fields) out.insert(name, value);
  const std::size_t length = in.body.size();
  if (!head) out.body() = std::move(in.body);
  out.keep_alive(keep_alive);
  out.prepare_payload();
  if (head) out.content_length(length);
  return out;
}

class ServerImpl final : public Server {
 public:
  ServerImpl(const ServerOptions& options, Handler& handler, AccessLog* log)
      : options_(options), handler_(handler), log_(log), acceptor_(ioc_) {}

  ~ServerImpl() override { Drain(); }

  Status Listen() {
    boost::system::error_code ec;
    auto address = net::ip::make_address(options_.host, ec);
    if (ec) return MakeError(Errc::kInvalidArgument, "listen address: " + ec.message());
    tcp::endpoint endpoint(address, options_.port);
    acceptor_.open(endpoint.protocol(), ec);
    if (!ec) acceptor_.set_option(net::socket_base::reuse_address(true), ec);
    if (!ec) acceptor_.bind(endpoint, ec);
    if (!ec) acceptor_.listen(net::socket_base::max_listen_connections, ec);
    if (ec) {
      return MakeError(Errc::kUnavailable, "cannot listen on " + options_.host + ":" +
                                               std::to_string(options_.port) + ": " + ec.message());
    }
    port_ = acceptor_.local_endpoint().port();
    net::co_spawn(ioc_, Accept(), net::detached);
    for (int i = 0; i < options_.io_threads; ++i)
      io_threads_.emplace_back([this] {
        NameThisThread("http-io");
        ioc_.run();
      });
    return Ok();
  }

  uint16_t port() const override { return port_; }
  int InFlight() const override { return in_flight_.load(); }
  int ParkedCount() const override { return parked_count_.load(); }

  void Notify(const std::string& key) override {
    MutexLock lock(park_mu_);
    auto [begin, end] = parked_.equal_range(key);
    for (auto it = begin; it != end; ++it) Wake(it->second);
  }

  void Spawn(std::function<Async<void>()> task) override {
    ++in_flight_;
    net::co_spawn(
        net::make_strand(ioc_),
        [task = std::move(task)]() -> net::awaitable<void> { co_await task(); },
        [this](std::exception_ptr failure) {
          if (failure) Log(LogLevel::kError, "background task threw");
          --in_flight_;
        });
  }

  void Drain() override {
    if (drained_.exchange(true)) return;
    draining_ = true;
    // Parked requests decide once more now (an answer that arrived, else 503 shutting-down)
    // instead of at their deadlines.
    {
      MutexLock lock(park_mu_);
      for (auto& [key, parked] : parked_) Wake(parked);
    }
    net::post(ioc_, [this] {
      boost::system::error_code ec;
      acceptor_.close(ec);
    });
    // Idle keep-alive connections are closed now; busy ones close after their response.
    {
      MutexLock lock(conn_mu_);
      for (auto& [id, weak] : connections_) {
        if (auto conn = weak.lock(); conn && conn->idle) {
          net::post(conn->strand, [conn] {
            boost::system::error_code ec;
            conn->stream.socket().shutdown(tcp::socket::shutdown_both, ec);
            conn->stream.socket().close(ec);
          });
        }
      }
    }
    const auto deadline = std::chrono::steady_clock::now() + options_.drain_timeout;
    while (in_flight_ + parked_count_ > 0 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    ioc_.stop();
    for (auto& t : io_threads_) t.join();
  }

 private:
  net::awaitable<void> Accept() {
    while (!draining_) {
      auto [ec, socket] = co_await acceptor_.async_accept(kTuple);
      if (ec) {
        if (ec == net::error::operation_aborted || draining_) co_return;
        continue;  // e.g. too many open files: keep serving the others
      }
      if (open_connections_ >= options_.max_connections) {
        boost::system::error_code ignored;
        socket.close(ignored);
        continue;
      }
      // Counted as it is accepted, not when its session first runs on its strand: a burst of
      // connections accepted before their sessions start would otherwise pass the bound.
      ++open_connections_;
      auto strand = net::make_strand(ioc_);
      auto conn = std::make_shared<Connection>(std::move(socket), strand);
      net::co_spawn(strand, Session(conn), net::detached);
    }
  }

  net::awaitable<void> Session(std::shared_ptr<Connection> conn) {  // counted by Accept
    const uint64_t id = next_id_++;
    {
      MutexLock lock(conn_mu_);
      connections_[id] = conn;
    }
    beast::flat_buffer buffer;
    while (true) {
      conn->idle = true;
      if (draining_) break;
      bhttp::request_parser<bhttp::string_body> parser;
      parser.header_limit(static_cast<std::uint32_t>(options_.max_header_bytes));
      parser.body_limit(options_.max_body_bytes);
      // One deadline for the whole request: a client sending slowly is cut off.
      conn->stream.expires_after(options_.read_timeout);
      auto [ec, bytes] = co_await bhttp::async_read(conn->stream, buffer, parser, kTuple);
      conn->idle = false;
      if (ec) {
        std::optional<Response> refusal;
        if (ec == bhttp::error::body_limit) {
          refusal = Problem(
              ProblemKind::kPayloadTooLarge,
              "the body is larger than " + std::to_string(options_.max_body_bytes) + " bytes");
        } else if (ec == bhttp::error::header_limit &&
                   TargetTooLong(!parser.get().target().empty(),
                                 std::string_view(static_cast<const char*>(buffer.data().data()),
                                                  buffer.size()))) {
          refusal = Problem(ProblemKind::kUriTooLong, "the request target is too long");
        } else if (ec == bhttp::error::header_limit) {
          refusal = Problem(ProblemKind::kHeadersTooLarge, "the header section is too large");
        } else if (ec != bhttp::error::end_of_stream && ec != beast::error::timeout &&
                   ec != net::error::operation_aborted && ec != net::error::eof &&
                   ec != net::error::connection_reset && (bytes > 0 || buffer.size() > 0)) {
          refusal = Problem(ProblemKind::kMalformedRequest,
                            "the request is not valid HTTP/1.1: " + ec.message());
        }
        if (refusal) co_await Write(*conn, std::move(*refusal), false);
        break;
      }
      const auto started = std::chrono::steady_clock::now();
      const unsigned version = parser.get().version();
      const bool chunked = parser.chunked();
      Request request = FromBeast(parser.release());
      // A request that is not one the handler may see is answered here, and its connection closed.
      const std::optional<std::string> malformed = Refusal(request, version, chunked);
      const bool keep_alive = parser.keep_alive() && !malformed;
      const std::string request_id = RequestId(request, SystemClock(), SystemRandom());
      RequestContext context;
      context.trace = ContinueTrace(request, SystemRandom());
      const TraceContext& trace = context.trace;
      // The calls made for this request (to the provider, to a gateway's upstream) carry this
      // hop's span as their parent.
      request.headers.Set("traceparent", trace.Traceparent());
      // W3C: a tracestate belongs to the traceparent it came with; a new trace drops it.
      if (trace.parent_id.empty()) request.headers.Remove("tracestate");
      Response response;
      if (malformed) {
        response = Problem(ProblemKind::kMalformedRequest, *malformed);
        context.outcome = "malformed";
      } else if (draining_) {
        response = Problem(ProblemKind::kShuttingDown, "the server is stopping");
        context.outcome = "draining";
      } else if (in_flight_ >= options_.max_in_flight) {
        response = Problem(ProblemKind::kOverloaded, "too many requests at once");
        context.outcome = "overloaded";
      } else {
        // Counted among executing requests until it parks, then among parked ones.
        ++in_flight_;
        bool parked = false;
        response = co_await Run(*conn, request, context, parked);
        if (parked) {
          --parked_count_;
        } else {
          --in_flight_;
        }
      }
      if (context.drop) break;
      response.headers.Set("X-Request-Id", request_id);
      const int status = response.status;
      const bool keep = keep_alive && !draining_;
      const bool written =
          co_await Write(*conn, std::move(response), keep, request.method == "HEAD");
      if (log_ != nullptr) {
        log_->Write(AccessLog::Entry{
            request_id, request.method, request.Path(), context.route, context.outcome, status,
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started)
                .count(),
            trace.trace_id, trace.span_id});
      }
      if (!written || !keep) break;
    }
    boost::system::error_code ignored;
    conn->stream.socket().shutdown(tcp::socket::shutdown_send, ignored);
    conn->stream.socket().close(ignored);
    {
      MutexLock lock(conn_mu_);
      connections_.erase(id);
    }
    --open_connections_;
  }

  // Calls the handler, parking between calls when it asks to. `parked` is set once the request
  // has room to park: from then on it counts in parked_count_, not in_flight_.
  net::awaitable<Response> Run(Connection& conn, const Request& request, RequestContext& context,
                               bool& parked) {
    using namespace net::experimental::awaitable_operators;
    context.spawn = [this](std::function<Async<void>()> task) { Spawn(std::move(task)); };
    context.notify = [this](const std::string& key) { Notify(key); };
    context.reserve_park = [this, &parked] {
      if (parked) return true;
      if (draining_) return false;
      int count = parked_count_.load();
      do {
        if (count >= options_.max_parked) return false;
      } while (!parked_count_.compare_exchange_weak(count, count + 1));
      parked = true;
      --in_flight_;  // a parked request leaves the admission count
      return true;
    };
    auto poll = std::chrono::milliseconds(50);
    while (true) {
      Response response;
      try {
        response = co_await handler_.Handle(request, context);
      } catch (const std::exception& e) {
        Log(LogLevel::kError, "handler threw", {{"error", e.what()}});
        response = Problem(ProblemKind::kInternal, "unexpected failure");
      } catch (...) {
        Log(LogLevel::kError, "handler threw");
        response = Problem(ProblemKind::kInternal, "unexpected failure");
      }
      if (!context.park) co_return response;
      if (draining_) {
        context.park.reset();
        co_return Problem(ProblemKind::kShuttingDown, "the server is stopping");
      }
      // A handler that parks without asking for room gets it now if there is any; else its
      // own answer is sent.
      if (!context.reserve_park()) {
        context.park.reset();
        co_return response;
      }
      // Wait for a notification, but poll too: a completion in another process, or one that
      // happened between the handler's decision and this registration, is found by the next call.
      RequestContext::Park park = *context.park;
      context.park.reset();
      ++context.attempt;
      const auto wake = std::min(park.deadline, std::chrono::steady_clock::now() + poll);
      poll = std::min(poll * 2, std::chrono::milliseconds(1000));
      auto timer = std::make_shared<net::steady_timer>(conn.strand, wake);
      std::multimap<std::string, Parked>::iterator registration;
      {
        MutexLock lock(park_mu_);
        registration = parked_.emplace(park.key, Parked{timer, conn.strand});
      }
      // Also watch the connection: a client that goes away ends its parked request now, giving
      // back what it holds, rather than at its deadline.
      auto woken = co_await (timer->async_wait(kTuple) ||
                             conn.stream.socket().async_wait(tcp::socket::wait_read, kTuple));
      bool closed = false;
      if (woken.index() == 1 && !std::get<0>(std::get<1>(woken))) {
        char byte;
        const ssize_t n =
            ::recv(conn.stream.socket().native_handle(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
        closed = n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
        // Otherwise the client sent its next request already (pipelining): it is read after this
        // one's answer; until then only the timer wakes this request.
        if (!closed) co_await timer->async_wait(kTuple);
      }
      {
        MutexLock lock(park_mu_);
        parked_.erase(registration);
      }
      if (closed) {
        context.drop = true;
        context.outcome = "closed";
        co_return Response{};
      }
    }
  }

  // Writes a response; false if the connection failed.
  net::awaitable<bool> Write(Connection& conn, Response&& response, bool keep_alive,
                             bool head = false) {
    auto message = ToBeast(std::move(response), keep_alive, head);
    conn.stream.expires_after(options_.write_timeout);
    auto [ec, n] = co_await bhttp::async_write(conn.stream, message, kTuple);
    co_return !ec;
  }

  struct Parked {
    std::weak_ptr<net::steady_timer> timer;
    Strand strand;
  };

  // Ends a parked request's wait now; `parked` is one of parked_.
  void Wake(const Parked& parked) const IDEM_REQUIRES(park_mu_) {
    net::post(parked.strand, [timer = parked.timer] {
      if (auto t = timer.lock()) t->cancel();
    });
  }

  ServerOptions options_;
  Handler& handler_;
  AccessLog* log_;
  net::io_context ioc_;
  tcp::acceptor acceptor_;
  std::vector<std::thread> io_threads_;
  uint16_t port_ = 0;
  std::atomic<bool> draining_{false};
  std::atomic<bool> drained_{false};
  // Requests admitted and not parked (and background tasks): held against max_in_flight. Parked
  // requests count apart, against max_parked.
  std::atomic<int> in_flight_{0};
  std::atomic<int> parked_count_{0};
  std::atomic<int> open_connections_{0};
  std::atomic<uint64_t> next_id_{1};
  Mutex conn_mu_;
  std::map<uint64_t, std::weak_ptr<Connection>> connections_ IDEM_GUARDED_BY(conn_mu_);
  Mutex park_mu_;
  std::multimap<std::string, Parked> parked_ IDEM_GUARDED_BY(park_mu_);
};

}  // namespace

namespace {
sigset_t WaitedSignals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGHUP);
  return signals;
}
}  // namespace

void BlockSignals() {
  const sigset_t signals = WaitedSignals();
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  signal(SIGPIPE, SIG_IGN);
}

int WaitForSignal() {
  const sigset_t signals = WaitedSignals();
  int sig = 0;
  sigwait(&signals, &sig);
  return sig;
}

Result<std::unique_ptr<Server>> Server::Start(const ServerOptions& options, Handler& handler,
                                              AccessLog* log) {
  if (options.io_threads < 1 || options.max_in_flight < 1 || options.max_connections < 1 ||
      options.max_parked < 0) {
    return MakeError(Errc::kInvalidArgument, "server: thread and queue sizes must be positive");
  }
  auto server = std::make_unique<ServerImpl>(options, handler, log);
  IDEM_RETURN_IF_ERROR(server->Listen());
  return std::unique_ptr<Server>(std::move(server));
}

}  // namespace idem::http
