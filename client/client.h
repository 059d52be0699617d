// client/client.h — a retrying client for idem-protected APIs.
//
// One Idempotency-Key per operation, reused on every retry; retries on network errors, 409 with
// Retry-After (the key is still running), 429, 503 and 504, with capped exponential back-off and
// full jitter, never sooner than Retry-After; follows 202 to completion; never retries a final
// 4xx. Thread-safe: one Client serves many operations.
//
// This header names only libidem's public types and the standard library: the HTTP machinery
// (http/) stays inside client.cc, so a program using the client does not compile it.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "idem/clock.h"
#include "idem/result.h"

namespace idem::client {

struct ClientOptions {
  std::string base_url;  // "http://127.0.0.1:8080" or "https://..."
  std::string api_key;
  int max_attempts = 10;
  Millis initial_backoff{100};
  Millis max_backoff{5000};
  // No retry starts after this much time has passed since the first attempt.
  Millis deadline{60000};
  // Each attempt: resolving, connecting and the TLS handshake together; then the whole exchange.
  Millis connect_timeout{2000};
  Millis timeout{10000};
  // The largest response body accepted; a larger one fails the attempt with kDataLoss.
  std::size_t max_response_bytes = std::size_t{1} << 20;
  // Sleeping is injected so tests need not wait; the default sleeps.
  std::function<void(Millis)> sleep;
};

// Response header fields as received, names in lower case.
struct Headers {
  std::vector<std::pair<std::string, std::string>> fields;

  // The first value of `name` (any case), or nullopt.
  std::optional<std::string_view> Get(std::string_view name) const;
};

// An HTTP response as the client received it.
struct Response {
  int status = 0;
  Headers headers;
  std::string body;
};

struct Outcome {
  Response response;  // the final answer
  std::string key;    // the Idempotency-Key used on every attempt
  int attempts = 0;   // POSTs sent
};

// A new operation key: a UUIDv7 (time-ordered, 74 random bits).
std::string NewOperationKey(Clock& clock, Random& random);

class Client {
 public:
  // Errors: kInvalidArgument for a bad base URL or max_attempts < 1.
  static Result<Client> Create(ClientOptions options, Clock& clock = SystemClock(),
                               Random& random = SystemRandom());

  Client(Client&&) noexcept;
  Client& operator=(Client&&) noexcept;
  ~Client();

  // POSTs `body` (JSON) to `path` as one operation, retrying as described above. `key` empty:
  // a new key. Errors: the last transport error when every attempt failed at the network level
  // (kUnavailable / kDeadlineExceeded); otherwise the final response, whatever its status.
  Result<Outcome> Post(const std::string& path, const std::string& body, std::string key = {},
                       const std::vector<std::pair<std::string, std::string>>& headers = {});

  // One GET with the API key (no retries).
  Result<Response> Get(const std::string& path);

 private:
  struct Impl;  // the parsed URL and the HTTP calls (client.cc)
  explicit Client(std::unique_ptr<Impl> impl);
  Millis Backoff(int retry, const Response* response);

  std::unique_ptr<Impl> impl_;
};

}  // namespace idem::client
