// http/message.h — plain HTTP request and response values, free of Beast and Asio, so
// handlers are pure functions that tests can call directly.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "idem/clock.h"
#include "idem/result.h"

namespace idem::http {

// Header names are stored in lower case; lookups are case-insensitive.
struct Headers {
  static constexpr std::size_t kUsualFields = 12;  // reserved at the first Add
  std::vector<std::pair<std::string, std::string>> fields;

  // The first value of `name`, or nullopt.
  std::optional<std::string_view> Get(std::string_view name) const;
  // How many fields are called `name`.
  int Count(std::string_view name) const;
  // The elements of the comma-separated lists in every field called `name` (RFC 9110 §5.6.1),
  // in order, each without the whitespace around it; empty elements are dropped. Quoted commas
  // are not special: for lists of tokens and token=value pairs.
  std::vector<std::string_view> List(std::string_view name) const;
  // Appends a field (the name is lower-cased).
  void Add(std::string_view name, std::string_view value);
  // Replaces every field called `name` with one.
  void Set(std::string_view name, std::string_view value);
  // Removes every field called `name`.
  void Remove(std::string_view name);
};

struct Request {
  std::string method;  // "GET", "POST", ...
  std::string target;  // as sent: path and query
  Headers headers;
  std::string body;

  std::string_view Path() const;   // target without the query
  std::string_view Query() const;  // after '?', or empty
  // The value of query parameter `name` (not percent-decoded), or nullopt.
  std::optional<std::string_view> QueryParam(std::string_view name) const;
};

struct Response {
  int status = 200;
  Headers headers;
  std::string body;
};

std::string ToLower(std::string_view s);

// A listen address: an IP address and a port, "127.0.0.1:8080", "0.0.0.0:0" or "[::1]:8080" (an
// IPv6 address in brackets, which the host keeps without). Errors: kInvalidArgument saying what
// is wrong (a name instead of an address, no port, a port past 65535).
struct HostPort {
  std::string host;
  uint16_t port = 0;
};
Result<HostPort> ParseListenAddress(std::string_view text);

// "host:port", an IPv6 address in brackets ("[::1]:8080"): for Host headers and printed URLs.
std::string Authority(std::string_view host, uint16_t port);

// A request id for the log and the X-Request-Id header: the client's if it is a sane token
// (1..64 of A-Z a-z 0-9 - _ .), else a fresh UUIDv7, unique across instances and restarts.
std::string RequestId(const Request& request, Clock& clock, Random& random);

// W3C Trace Context: the trace a request belongs to, and this hop's own span in it.
struct TraceContext {
  std::string trace_id;   // 32 lower-case hex digits
  std::string span_id;    // 16 hex digits: this hop's span, the parent of the calls it makes
  std::string parent_id;  // the caller's span; empty when the trace starts here
  bool sampled = false;
  // "00-<trace_id>-<span_id>-<flags>": the traceparent of calls made for the request.
  std::string Traceparent() const;
  // The traceparent the caller sent, as version 00 ("" when the trace starts here).
  std::string CallerTraceparent() const;
};

// Continues the trace of the request's `traceparent` header, or starts a new one when it has
// none, more than one, or a malformed one (which W3C says to ignore); the span is new either way.
TraceContext ContinueTrace(const Request& request, Random& random);

// RFC 3339 UTC with milliseconds ("2026-11-30T06:00:00.123Z"); ParseRfc3339 reads it back for
// every time of the years 0000..9999, also before 1970.
std::string Rfc3339(int64_t unix_ms);
// Unix milliseconds of an RFC 3339 date-time ("2026-11-30T06:00:00Z", "…:00.5+08:00"), or nullopt
// if it is not one. A fraction finer than a millisecond rounds up: against times of millisecond
// resolution, a rounded bound selects exactly what the precise one does, as a lower bound and as
// an upper one.
std::optional<int64_t> ParseRfc3339(std::string_view text);

// An IMF-fixdate ("Sun, 06 Nov 1994 08:49:37 GMT") for Unix milliseconds, rounded down.
std::string HttpDate(int64_t unix_ms);

}  // namespace idem::http
