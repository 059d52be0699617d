// http/client.cc — ClientPool: coroutines over Beast streams (a tcp_stream, or an
// ssl_stream over one for https) kept open between calls, and the blocking Call, one call of a
// private pool on a private event loop.
//
// A pool's state (its idle connections, the count of open ones, the calls waiting for one) sits
// behind one mutex and is shared by the pool and its calls in flight. A call waiting for a free
// connection sleeps on a timer of its own executor; whoever returns or closes a connection takes
// one waiter off the list and posts the cancellation of its timer to that executor.
#include "http/client.h"

#include <openssl/ssl.h>
#include <sys/socket.h>

#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <boost/url/parse.hpp>
#include <cerrno>
#include <deque>
#include <optional>
#include <vector>

#include "idem/mutex.h"

namespace idem::http {

namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
namespace net = boost::asio;
namespace ssl = boost::asio::ssl;
using tcp = net::ip::tcp;
using ErrorCode = boost::system::error_code;

namespace internal {

constexpr auto kTuple = net::as_tuple(net::use_awaitable);

net::execution_context* ContextOf(const net::any_io_executor& executor) {
  return &net::query(executor, net::execution::context);
}

// One open connection, created on (and only ever used from) `executor`.
struct Conn {
  Conn(const net::any_io_executor& ex, ssl::context* tls) : executor(ex), context(ContextOf(ex)) {
    if (tls) {
      tls_stream.emplace(ex, *tls);
    } else {
      tcp_stream.emplace(ex);
    }
  }
  beast::tcp_stream& Lowest() { return tls_stream ? tls_stream->next_layer() : *tcp_stream; }

  net::any_io_executor executor;
  net::execution_context* context;
  std::optional<beast::tcp_stream> tcp_stream;                     // http
  std::optional<beast::ssl_stream<beast::tcp_stream>> tls_stream;  // https
  SteadyTime idle_since{};
};

// A call waiting for a free connection, until its timer expires or a wake cancels it.
struct Waiter {
  Waiter(const net::any_io_executor& ex, SteadyTime deadline) : executor(ex), timer(ex, deadline) {}
  net::any_io_executor executor;
  net::steady_timer timer;
};

struct PoolState : std::enable_shared_from_this<PoolState> {
  // Wakes the first waiter, if any: a connection was returned, or a slot freed.
  void WakeOneLocked() IDEM_REQUIRES(mu) {
    if (waiters.empty()) return;
    auto waiter = std::move(waiters.front());
    waiters.pop_front();
    net::post(waiter->executor, [waiter] { waiter->timer.cancel(); });
  }

  // Gives back a leased slot and its connection, if one was opened: kept idle if `keep`, else
  // closed (here: the caller is on the connection's context).
  void Release(std::unique_ptr<Conn> conn, bool keep) {
    MutexLock lock(mu);
    if (conn && keep && !closed) {
      conn->idle_since = std::chrono::steady_clock::now();
      idle.push_back(std::move(conn));
    } else {
      --open;
    }
    WakeOneLocked();
  }

  // Closes the idle connections on `context`, which is shutting down.
  void DropIdleOf(const net::execution_context* context) {
    std::vector<std::unique_ptr<Conn>> dropped;
    MutexLock lock(mu);
    for (auto it = idle.begin(); it != idle.end();) {
      if ((*it)->context != context) {
        ++it;
        continue;
      }
      dropped.push_back(std::move(*it));
      it = idle.erase(it);
      --open;
      WakeOneLocked();
    }
  }

  Url url;
  PoolOptions options;
  std::optional<ssl::context> tls;  // https only

  mutable Mutex mu;
  int open IDEM_GUARDED_BY(mu) = 0;                                 // busy, idle and being opened
  std::deque<std::unique_ptr<Conn>> idle IDEM_GUARDED_BY(mu);       // least recently used first
  std::deque<std::shared_ptr<Waiter>> waiters IDEM_GUARDED_BY(mu);  // first come, first woken
  bool closed IDEM_GUARDED_BY(mu) = false;  // the ClientPool is gone: keep nothing
};

// One per execution context on which a pool opened a connection. When the context shuts down
// (its io_context is destroyed), every pool's idle connections on it are closed while the
// context's socket services still exist: Asio shuts services down in the reverse order of their
// creation, and this one is created after the context's first socket. Without it a pool that
// outlives a RunSync loop would hold sockets of a destroyed io_context.
class IdleRegistry final : public net::execution_context::service {
 public:
  static net::execution_context::id id;  // NOLINT(readability-identifier-naming): Asio's name

  explicit IdleRegistry(net::execution_context& context) : service(context) {}

  void Add(const std::shared_ptr<PoolState>& state) {
    MutexLock lock(mu_);
    std::erase_if(pools_, [](const std::weak_ptr<PoolState>& p) { return p.expired(); });
    for (const auto& p : pools_) {
      if (!p.owner_before(state) && !state.owner_before(p)) return;
    }
    pools_.push_back(state);
  }

 private:
  void shutdown() override {
    std::vector<std::weak_ptr<PoolState>> pools;
    {
      MutexLock lock(mu_);
      pools.swap(pools_);
    }
    for (const auto& p : pools) {
      if (auto state = p.lock()) state->DropIdleOf(&context());
    }
  }

  Mutex mu_;
  std::vector<std::weak_ptr<PoolState>> pools_ IDEM_GUARDED_BY(mu_);
};

net::execution_context::id IdleRegistry::id;

// Closes a connection taken out of the pool: here if it belongs to the context `here`, else on
// its own context (its socket is not this thread's to touch).
void Close(std::unique_ptr<Conn> conn, const net::execution_context* here) {
  if (conn->context == here) return;
  const auto executor = conn->executor;
  net::post(executor, [doomed = std::move(conn)] {});
}

// Whether an idle connection is still usable: the server has neither closed it (a read would see
// the end) nor sent anything unasked (a late answer, a TLS alert), and the socket has no error.
bool StillOpen(Conn& conn) {
  char byte;
  const ssize_t n =
      ::recv(conn.Lowest().socket().native_handle(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
}

// A slot in the pool (counted in `open`) and, once there is one, its connection. Given back when
// destroyed, however the call ends: kept idle only if `keep` was set.
struct Lease {
  explicit Lease(std::shared_ptr<PoolState> s) : state(std::move(s)) {}
  ~Lease() {
    if (held) state->Release(std::move(conn), keep);
  }
  Lease(const Lease&) = delete;
  Lease& operator=(const Lease&) = delete;

  std::shared_ptr<PoolState> state;
  bool held = false;
  std::unique_ptr<Conn> conn;
  bool keep = false;
};

// Takes `waiter` off the list when its wait ends, however it ends (a wake may have done so).
struct Unpark {
  ~Unpark() {
    MutexLock lock(state.mu);
    std::erase(state.waiters, waiter);
  }
  PoolState& state;
  const std::shared_ptr<Waiter>& waiter;
};

// A host name lookup that a deadline abandons: getaddrinfo cannot be interrupted, so on time-out
// the call goes on without it and the lookup finishes in the background.
struct Lookup {
  Lookup(const net::any_io_executor& ex, SteadyTime deadline) : resolver(ex), timer(ex, deadline) {}
  tcp::resolver resolver;
  net::steady_timer timer;
  ErrorCode ec;
  tcp::resolver::results_type results;
  bool done = false;
};

// Opens the connection of `lease`'s slot by `deadline`: resolve, connect, TLS handshake.
// Errors: kUnavailable.
Async<Status> Connect(Lease& lease, net::any_io_executor ex, SteadyTime deadline) {
  PoolState& state = *lease.state;
  auto lookup = std::make_shared<Lookup>(ex, deadline);
  lookup->resolver.async_resolve(state.url.host, std::to_string(state.url.port),
                                 [lookup](ErrorCode ec, tcp::resolver::results_type results) {
                                   lookup->ec = ec;
                                   lookup->results = std::move(results);
                                   lookup->done = true;
                                   lookup->timer.cancel();
                                 });
  co_await lookup->timer.async_wait(kTuple);
  if (!lookup->done) {
    lookup->resolver.cancel();
    co_return MakeError(Errc::kUnavailable, "resolving the host: timed out");
  }
  if (lookup->ec)
    co_return MakeError(Errc::kUnavailable, "resolving the host: " + lookup->ec.message());

  auto conn = std::make_unique<Conn>(ex, state.tls ? &*state.tls : nullptr);
  net::use_service<IdleRegistry>(*conn->context).Add(state.shared_from_this());
  beast::tcp_stream& lowest = conn->Lowest();
  lowest.expires_at(deadline);
  auto [ec, endpoint] = co_await lowest.async_connect(lookup->results, kTuple);
  if (ec) co_return MakeError(Errc::kUnavailable, "connecting: " + ec.message());
  if (conn->tls_stream) {
    const std::string& host = state.url.host;
    ErrorCode not_ip;
    (void)net::ip::make_address(host, not_ip);
    // SSL_set_tlsext_host_name, without the macro's C cast.
    if (not_ip && SSL_ctrl(conn->tls_stream->native_handle(), SSL_CTRL_SET_TLSEXT_HOSTNAME,
                           TLSEXT_NAMETYPE_host_name, const_cast<char*>(host.c_str())) != 1) {
      co_return MakeError(Errc::kUnavailable, "TLS: cannot set the server name '" + host + "'");
    }
    if (state.options.tls.verify) {
      conn->tls_stream->set_verify_callback(ssl::host_name_verification(host));
    }
    auto [handshake] = co_await conn->tls_stream->async_handshake(ssl::stream_base::client, kTuple);
    if (handshake) co_return MakeError(Errc::kUnavailable, "TLS handshake: " + handshake.message());
  }
  lowest.expires_never();
  lease.conn = std::move(conn);
  co_return Ok();
}

// Leases a connection for a call on `ex`, by `deadline` (see ClientPool::Call). Errors:
// kUnavailable.
Async<Status> Acquire(Lease& lease, net::any_io_executor ex, SteadyTime deadline) {
  PoolState& state = *lease.state;
  const net::execution_context* here = ContextOf(ex);
  while (true) {
    std::vector<std::unique_ptr<Conn>> stale;
    std::unique_ptr<Conn> candidate;
    std::shared_ptr<Waiter> waiter;
    int open = 0;
    const auto now = std::chrono::steady_clock::now();
    {
      MutexLock lock(state.mu);
      while (!state.idle.empty() &&
             now - state.idle.front()->idle_since >= state.options.idle_timeout) {
        stale.push_back(std::move(state.idle.front()));
        state.idle.pop_front();
        --state.open;
        state.WakeOneLocked();
      }
      for (auto it = state.idle.rbegin(); it != state.idle.rend(); ++it) {
        if ((*it)->context != here) continue;
        candidate = std::move(*it);
        state.idle.erase(std::next(it).base());
        lease.held = true;  // the idle connection's slot
        break;
      }
      if (!candidate) {
        if (state.open < state.options.max_connections) {
          ++state.open;
          lease.held = true;
        } else if (!state.idle.empty()) {
          // Every slot is taken and the idle connections belong to other contexts: close the
          // least recently used one and take its slot.
          stale.push_back(std::move(state.idle.front()));
          state.idle.pop_front();
          lease.held = true;
        } else if (now < deadline) {
          waiter = std::make_shared<Waiter>(ex, deadline);
          state.waiters.push_back(waiter);
        }
      }
      open = state.open;
    }
    for (auto& conn : stale) Close(std::move(conn), here);
    if (candidate) {
      if (StillOpen(*candidate)) {
        lease.conn = std::move(candidate);
        co_return Ok();
      }
      lease.held = false;
      state.Release(nullptr, false);  // candidate is closed here; try again
      continue;
    }
    if (lease.held) co_return co_await Connect(lease, ex, deadline);
    if (!waiter) {
      co_return MakeError(Errc::kUnavailable,
                          "no connection became free in time (" + std::to_string(open) + " open)");
    }
    Unpark unpark{state, waiter};
    co_await waiter->timer.async_wait(kTuple);
  }
}

struct Exchanged {
  ErrorCode ec;
  bool sent = false;  // some of the request may have left
};

template <class Stream>
Async<Exchanged> WriteRead(Stream& stream, bhttp::request<bhttp::string_body>& request,
                           beast::flat_buffer& buffer,
                           bhttp::response_parser<bhttp::string_body>& parser) {
  auto [written, bytes] = co_await bhttp::async_write(stream, request, kTuple);
  if (written) co_return Exchanged{written, bytes > 0};
  auto [read, unused] = co_await bhttp::async_read(stream, buffer, parser, kTuple);
  co_return Exchanged{read, true};
}

// One call: lease a connection, write, read. Connection: keep-alive if `keep_alive`, else close.
Async<Result<Response>> Exchange(std::shared_ptr<PoolState> state, Request request,
                                 CallOptions options, bool keep_alive) {
  const Url& url = state->url;
  const std::string authority = Authority(url.host, url.port);
  const std::string what =
      "http " + request.method + " " + url.scheme + "://" + authority + request.target + ": ";
  Lease lease(state);
  const auto executor = co_await net::this_coro::executor;
  auto deadline = std::chrono::steady_clock::now() + options.connect_timeout;
  if (options.send_by) deadline = std::min(deadline, *options.send_by);
  Status got = co_await Acquire(lease, executor, deadline);
  if (!got) co_return MakeError(got.error().code, what + got.error().message);
  if (options.send_by && std::chrono::steady_clock::now() > *options.send_by) {
    lease.keep = true;  // unused and healthy
    co_return MakeError(Errc::kUnavailable, what + "not sent: the time to send it had passed");
  }

  bhttp::request<bhttp::string_body> req;
  req.method_string(request.method);
  req.target(request.target);
  req.version(11);
  for (auto& [name, value] : request.headers.fields) req.insert(name, value);
  req.set(bhttp::field::host, authority);
  req.body() = std::move(request.body);
  req.keep_alive(keep_alive);
  req.prepare_payload();

  bhttp::response_parser<bhttp::string_body> parser;
  parser.body_limit(options.max_response_bytes);
  if (request.method == "HEAD") parser.skip(true);
  beast::flat_buffer buffer;

  Conn& conn = *lease.conn;
  conn.Lowest().expires_after(options.timeout);
  Exchanged done;
  if (conn.tls_stream) {
    done = co_await WriteRead(*conn.tls_stream, req, buffer, parser);
  } else {
    done = co_await WriteRead(*conn.tcp_stream, req, buffer, parser);
  }
  if (done.ec) {
    Errc code = done.sent ? Errc::kDeadlineExceeded : Errc::kUnavailable;
    if (done.ec == bhttp::error::body_limit || done.ec == bhttp::error::header_limit) {
      code = Errc::kDataLoss;
    }
    co_return MakeError(code, what + done.ec.message());
  }
  conn.Lowest().expires_never();

  auto& res = parser.get();
  lease.keep = keep_alive && res.keep_alive() && !parser.need_eof() && buffer.size() == 0;
  Response out;
  out.status = static_cast<int>(res.result_int());
  for (const auto& field : res) out.headers.Add(field.name_string(), field.value());
  out.body = std::move(res.body());
  co_return out;
}

Result<std::shared_ptr<PoolState>> MakeState(Url url, PoolOptions options) {
  const std::string where = "'" + url.scheme + "://" + url.host + "'";
  if (url.scheme != "http" && url.scheme != "https") {
    return MakeError(Errc::kInvalidArgument, where + " is neither http nor https");
  }
  if (url.host.empty()) return MakeError(Errc::kInvalidArgument, where + " has no host");
  if (options.max_connections < 1) {
    return MakeError(Errc::kInvalidArgument, "max_connections must be at least 1");
  }
  if (options.idle_timeout < Millis(0)) {
    return MakeError(Errc::kInvalidArgument, "idle_timeout must not be negative");
  }
  auto state = std::make_shared<PoolState>();
  if (url.scheme == "https") {
    ssl::context& tls = state->tls.emplace(ssl::context::tls_client);
    if (SSL_CTX_set_min_proto_version(tls.native_handle(), TLS1_2_VERSION) != 1) {
      return MakeError(Errc::kInvalidArgument, "TLS: cannot require TLS 1.2");
    }
    ErrorCode ec;
    const std::string& ca_file = options.tls.ca_file;
    if (!ca_file.empty()) {
      tls.load_verify_file(ca_file, ec);
    } else if (options.tls.verify) {
      tls.set_default_verify_paths(ec);
    }
    if (ec) {
      return MakeError(Errc::kInvalidArgument,
                       "TLS: cannot load the CAs of '" + ca_file + "': " + ec.message());
    }
    tls.set_verify_mode(options.tls.verify ? ssl::verify_peer : ssl::verify_none);
  }
  state->url = std::move(url);
  state->options = std::move(options);
  return state;
}

}  // namespace internal

Result<Url> ParseHttpUrl(std::string_view text) {
  auto parsed = boost::urls::parse_absolute_uri(text);
  const bool https = parsed && parsed->scheme_id() == boost::urls::scheme::https;
  if (!parsed || !(https || parsed->scheme_id() == boost::urls::scheme::http) ||
      parsed->host().empty()) {
    return MakeError(Errc::kInvalidArgument, "'" + std::string(text) +
                                                 "' is not an absolute http:// or https:// URL "
                                                 "with a host");
  }
  Url url;
  url.scheme = https ? "https" : "http";
  url.host = parsed->host_address();  // an IPv6 address without its brackets
  url.port = https ? 443 : 80;
  if (parsed->has_port()) {
    const auto port = parsed->port_number();
    if (port == 0)
      return MakeError(Errc::kInvalidArgument, "bad port in '" + std::string(text) + "'");
    url.port = port;
  }
  url.base_path = std::string(parsed->encoded_path());
  while (!url.base_path.empty() && url.base_path.back() == '/') url.base_path.pop_back();
  return url;
}

Result<Response> Call(const Url& url, Request request, const CallOptions& options) {
  PoolOptions one;
  one.max_connections = 1;
  IDEM_ASSIGN_OR_RETURN(auto state, internal::MakeState(url, std::move(one)));
  return RunSync(internal::Exchange(std::move(state), std::move(request), options, false));
}

ClientPool::ClientPool(std::shared_ptr<internal::PoolState> state) : state_(std::move(state)) {}

Result<std::unique_ptr<ClientPool>> ClientPool::Make(Url url, PoolOptions options) {
  IDEM_ASSIGN_OR_RETURN(auto state, internal::MakeState(std::move(url), std::move(options)));
  return std::unique_ptr<ClientPool>(new ClientPool(std::move(state)));
}

ClientPool::~ClientPool() {
  std::deque<std::unique_ptr<internal::Conn>> idle;
  MutexLock lock(state_->mu);
  state_->closed = true;
  state_->open -= static_cast<int>(state_->idle.size());
  idle.swap(state_->idle);
}

Async<Result<Response>> ClientPool::Call(Request request, CallOptions options) {
  return internal::Exchange(state_, std::move(request), options, true);
}

int ClientPool::OpenConnections() const {
  MutexLock lock(state_->mu);
  return state_->open;
}

int ClientPool::IdleConnections() const {
  MutexLock lock(state_->mu);
  return static_cast<int>(state_->idle.size());
}

}  // namespace idem::http
