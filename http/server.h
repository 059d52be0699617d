// http/server.h — an HTTP/1.1 server on Boost.Beast with C++20 coroutines.
//
// Three layers: a handler (a coroutine of Request, run on an I/O thread: what it waits for — a
// provider, another request — holds memory, not a thread; its blocking store calls go to a
// BlockingPool), a thin coroutine session per connection (a deadline on every read, a body limit,
// keep-alive), and an accept loop. Beast and the rest of Asio stay inside server.cc.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <typeinfo>

#include "http/async.h"
#include "http/message.h"
#include "idem/clock.h"
#include "idem/limits.h"
#include "idem/result.h"

namespace idem::http {

struct ServerOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 8080;  // 0 picks a free port; see Server::port()
  // Threads running the sessions and the handlers' coroutines.
  int io_threads = 1;
  // Requests being handled at once (not counting parked ones), background tasks included; beyond,
  // a request is refused with 503 overloaded.
  int max_in_flight = 4096;
  // Requests parked at once (RequestContext::Park). A parked request does not count against
  // max_in_flight; beyond this bound a handler is refused room to park
  // (RequestContext::reserve_park) and answers at once instead.
  int max_parked = static_cast<int>(limits::kMaxParked);
  int max_connections = 2048;
  std::size_t max_body_bytes = limits::kJsonMaxBytes;
  std::size_t max_header_bytes = 16 * 1024;
  // The whole request (headers and body) must arrive within this: slow clients are cut off.
  Millis read_timeout{10000};
  // How long an idle keep-alive connection is kept.
  Millis idle_timeout{30000};
  Millis write_timeout{10000};
  // On Drain, how long in-flight requests may take to finish.
  Millis drain_timeout{10000};
};

// What a handler may ask of the session besides its response.
struct RequestContext {
  // Park: wait (without a thread) until Notify(key) or `deadline`, then call Handle again.
  struct Park {
    std::string key;
    std::chrono::steady_clock::time_point deadline;
  };
  std::optional<Park> park;
  // Room to park: true if this request may park, false when max_parked requests are parked
  // already or the server is draining; then answer without waiting. Once given, the room is this
  // request's until it ends, and asking again returns true. A handler that sets `park` without
  // room is answered with the response it returned alongside. Unset when a test calls a handler
  // directly: no server bound then.
  std::function<bool()> reserve_park;
  // Kept for the handler across the calls of one request and destroyed when the request ends,
  // however it ends: answered, timed out, its connection closed while parked, or cut off by a
  // drain (e.g. the request's place among its principal's waiters).
  std::shared_ptr<void> hold;
  // Likewise, for the handler's routing: what the request was first routed with (a router's
  // configuration that may be replaced meanwhile), so that its later calls route as the first did.
  // Typed: Pinned<T>() gives back what Pin(T) kept, and nullptr for any other type.
  template <class T>
  void Pin(std::shared_ptr<const T> value) {
    pinned_type_ = &typeid(T);
    pinned_ = std::move(value);
  }
  template <class T>
  std::shared_ptr<const T> Pinned() const {
    if (pinned_type_ == nullptr || *pinned_type_ != typeid(T)) return nullptr;
    return std::static_pointer_cast<const T>(pinned_);  // of the type Pin was given
  }
  // Free for the handler across calls of one request (e.g. the end of a Prefer: wait).
  std::optional<std::chrono::steady_clock::time_point> wait_until;
  int attempt = 1;  // 1 on the first call of Handle for this request, 2 after a park, ...
  // Close the connection without answering (a parked request whose client left; a test double's
  // hung downstream).
  bool drop = false;
  // The request's trace (ContinueTrace): its parent_id is the caller's span. The request the
  // handler sees carries this hop's own traceparent instead of the caller's.
  TraceContext trace;
  // For the access log line.
  std::string route;
  std::string outcome;
  // Runs the coroutine `task` makes later, apart from the request (work that outlives the
  // request: 202 Accepted); it counts against max_in_flight until it ends.
  std::function<void(std::function<Async<void>()>)> spawn;
  // Wakes requests parked on `key`.
  std::function<void(const std::string&)> notify;

 private:
  std::shared_ptr<const void> pinned_;
  const std::type_info* pinned_type_ = nullptr;
};

class Handler {
 public:
  virtual ~Handler() = default;
  // Runs as a coroutine on an I/O thread: it must not block (blocking calls go through a
  // BlockingPool). Must not throw (a throw is answered with 500 and logged).
  virtual Async<Response> Handle(const Request& request, RequestContext& context) = 0;
};

// Writes one line per finished request. Thread-safe.
class AccessLog {
 public:
  virtual ~AccessLog() = default;
  // Views of the request's own strings, valid only during Write.
  struct Entry {
    std::string_view request_id;
    std::string_view method;
    std::string_view path;
    std::string_view route;
    std::string_view outcome;
    int status = 0;
    double latency_ms = 0;
    std::string_view trace_id;  // W3C Trace Context (ContinueTrace)
    std::string_view span_id;
  };
  virtual void Write(const Entry& entry) = 0;
};

// The running server. Thread-safe.
class Server {
 public:
  // Binds and starts serving on background threads. `handler` and `log` must outlive the server.
  // Errors: kUnavailable if the address cannot be bound; kInvalidArgument for bad options.
  static Result<std::unique_ptr<Server>> Start(const ServerOptions& options, Handler& handler,
                                               AccessLog* log);
  virtual ~Server() = default;

  virtual uint16_t port() const = 0;
  // Requests being handled now, background tasks included and parked requests not (what
  // max_in_flight bounds); and requests parked now (what max_parked bounds).
  virtual int InFlight() const = 0;
  virtual int ParkedCount() const = 0;
  // Wakes requests parked on `key` (in this process).
  virtual void Notify(const std::string& key) = 0;
  // Runs the coroutine `task` makes on an I/O thread, apart from any request.
  virtual void Spawn(std::function<Async<void>()> task) = 0;
  // Stops accepting and refuses new requests with 503, lets in-flight requests finish (up to
  // drain_timeout), closes idle connections, then stops every thread. Idempotent.
  virtual void Drain() = 0;
};

// For main(): blocks SIGTERM, SIGINT and SIGHUP in the calling thread and every thread it starts
// later (so only WaitForSignal sees them) and ignores SIGPIPE. Call before starting threads.
void BlockSignals();
// Waits for SIGTERM, SIGINT (stop) or SIGHUP (reload) and returns it.
int WaitForSignal();

}  // namespace idem::http
