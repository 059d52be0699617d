// server/http/client.h — a small blocking HTTP/1.1 client with deadlines, for downstream calls,
// idemctl and tests. Each call uses its own connection and its own event loop, so it is safe from
// any thread; nothing here includes Beast or Asio.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "include/idem/clock.h"
#include "include/idem/result.h"
#include "server/http/message.h"

namespace idem::http {

// "http://host:port/base" split up. Only plain http (loopback and private networks).
struct Url {
  std::string host;
  uint16_t port = 80;
  std::string base_path;  // without a trailing '/'
};

// Errors: kInvalidArgument for anything but an absolute http URL with a host.
Result<Url> ParseHttpUrl(std::string_view url);

struct CallOptions {
  Millis connect_timeout{2000};
  // For the whole exchange after connecting: writing the request and reading the response.
  Millis timeout{10000};
  std::size_t max_response_bytes = 1 << 20;
};

// Sends `request` (its target is used as is; Host and Content-Length are set) and reads the
// response. Errors: kUnavailable if the request was not completely sent — the server cannot
// have acted on it; kDeadlineExceeded if it was sent and no complete response came back in time
// or the connection broke — the outcome is unknown.
Result<Response> Call(const Url& url, Request request, const CallOptions& options = {});

}  // namespace idem::http
