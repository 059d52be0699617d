// http/client.h — HTTP/1.1 clients with deadlines, for downstream calls, idemctl and tests.
//
// ClientPool keeps connections to one origin (http or https) open between calls and is called from
// coroutines (Async<T>, async.h): a call waiting for the provider holds memory, not a thread. The
// blocking Call uses its own connection and its own event loop, so it is safe from any thread
// (tools and tests). Nothing here includes Beast or Asio beyond async.h's awaitable.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "http/async.h"
#include "http/message.h"
#include "idem/clock.h"
#include "idem/result.h"

namespace idem::http {

// "http://host:port/base" or "https://host:port/base" split up. `scheme` comes last so that
// Url{host, port, base_path} still means plain http.
struct Url {
  std::string host;
  uint16_t port = 80;
  std::string base_path;        // without a trailing '/'
  std::string scheme = "http";  // "http" or "https"
};

// The port defaults to 80 for http and 443 for https. Errors: kInvalidArgument for anything but
// an absolute http:// or https:// URL with a host.
Result<Url> ParseHttpUrl(std::string_view url);

struct CallOptions {
  // For getting a connection: waiting for a free one in a pool, resolving the host, connecting and
  // the TLS handshake, all together.
  Millis connect_timeout{2000};
  // For the whole exchange after that: writing the request and reading the response.
  Millis timeout{10000};
  // The largest response body accepted (the header section is bounded at 8 KiB).
  std::size_t max_response_bytes = 1 << 20;
  // When set, the request's first byte leaves by then or the call fails with kUnavailable, not
  // sent (getting a connection counts): for a call that a lease must cover from the send on.
  std::optional<std::chrono::steady_clock::time_point> send_by{};
};

// The errors of a call, blocking or pooled, say whether the server may have acted:
//   kUnavailable       the request was certainly not sent completely: the host did not resolve,
//                      the connection or the TLS handshake failed (a certificate that does not
//                      verify included), the write failed before any byte of it was handed to
//                      the connection, or no connection of a pool became free in time. The
//                      server cannot have acted on it; sending it again is safe.
//   kDeadlineExceeded  some or all of the request may have been sent, and no complete response
//                      came back within `timeout`, or the connection broke, or the response was
//                      malformed. The outcome is unknown: find out (e.g. ask the provider by
//                      reference) before sending it again.
//   kDataLoss          a response came back but is too large (its body over max_response_bytes,
//                      or its header section over 8 KiB): the server acted, its answer is
//                      unusable.
// A failed exchange is never repeated on another connection: once any byte may have left, a
// second attempt could act twice (charge twice).

// Sends `request` (its target is used as is; Host and Content-Length are set, and Connection:
// close) on a new connection and reads the response, blocking the calling thread. An https URL
// verifies the server against the system's default CA paths; use a ClientPool for another CA or
// none. Errors: as above, and kInvalidArgument for a URL whose scheme is neither http nor https.
// Thread-safe: every call has its own connection and event loop.
Result<Response> Call(const Url& url, Request request, const CallOptions& options = {});

struct TlsOptions {
  // A PEM file of the CAs to trust; empty: the system's default verify paths.
  std::string ca_file;
  // Verify the server's certificate chain and that it names the URL's host (a DNS name, or an IP
  // address for an IP literal). false accepts any certificate: for tests only.
  bool verify = true;
};

struct PoolOptions {
  // Connections open to the origin at most, busy, idle and being opened together (>= 1).
  int max_connections = 64;
  // An idle connection unused for this long is closed, not reused (>= 0; servers close idle
  // connections after a while too, and a request written on a connection the server is closing
  // ends with an unknown outcome).
  Millis idle_timeout{15000};
  TlsOptions tls{};  // https only
};

namespace internal {
struct PoolState;
}  // namespace internal

// Keep-alive connections to one origin, for calls from coroutines. Thread-safe: any number of
// coroutines on any executors may call at once.
//
// A connection is created on the executor of the call that opens it, and is reused only by calls
// whose executor belongs to the same execution context (io_context); a call from another context
// opens its own. When an io_context is destroyed, the pool's idle connections on it are closed,
// so a pool may outlive the event loops its calls ran on (RunSync). Like Beast's streams, a call
// needs an executor that runs its handlers one at a time: a strand, or an io_context run by one
// thread.
//
// https uses OpenSSL with TLS 1.2 at least and sends SNI for a host name (not for an IP literal,
// RFC 6066 §3). Connections are closed without a TLS close_notify: the client has read all it
// wants by then, and nothing can be truncated that way.
// Where a request is sent and its answer read: a ClientPool's server, or a test's or the
// simulator's stand-in for one (a gateway route's upstream). Thread-safe.
class Upstream {
 public:
  virtual ~Upstream() = default;
  // Sends `request` and reads its answer, as ClientPool::Call does.
  virtual Async<Result<Response>> Exchange(Request request, CallOptions options) = 0;
};

class ClientPool final : public Upstream {
 public:
  // Errors: kInvalidArgument for a URL that is neither http nor https or has no host,
  // max_connections < 1, a negative idle_timeout, or a CA file that cannot be loaded.
  static Result<std::unique_ptr<ClientPool>> Make(Url url, PoolOptions options = {});

  // Closes the idle connections. Calls still in flight finish normally (they share the pool's
  // state); their connections are closed afterwards instead of being kept. Must not run while an
  // io_context that ran calls of this pool is being destroyed.
  ~ClientPool() override;
  ClientPool(const ClientPool&) = delete;
  ClientPool& operator=(const ClientPool&) = delete;

  // Sends `request` (its target is used as is, so include the URL's base_path; Host and
  // Content-Length are set; keep-alive) and reads the response. Takes the most recently used idle
  // connection of this call's context that is still open (an idle connection the server closed,
  // or one that sent something unasked, is closed; one idle for idle_timeout too), or opens a new
  // one while fewer than max_connections are open; else closes an idle connection of another
  // context and opens one in its place; else waits for a connection to be returned or closed, all
  // within options.connect_timeout. The connection goes back to the pool only after a complete
  // response that allows keep-alive (not Connection: close, not HTTP/1.0 without keep-alive, not
  // delimited by the connection's end) with no extra bytes behind it; after any failure it is
  // closed. Errors: as above (kUnavailable when no connection became free in time).
  Async<Result<Response>> Call(Request request, CallOptions options = {});
  Async<Result<Response>> Exchange(Request request, CallOptions options) override {
    return Call(std::move(request), options);
  }

  // For metrics and tests, a snapshot: connections open (busy, idle and being opened), and idle.
  int OpenConnections() const;
  int IdleConnections() const;

 private:
  explicit ClientPool(std::shared_ptr<internal::PoolState> state);
  std::shared_ptr<internal::PoolState> state_;
};

}  // namespace idem::http
