// client/client.h — a retrying client for idem-protected APIs.
//
// One Idempotency-Key per operation, reused on every retry; retries on network errors, 409 with
// Retry-After (the key is still running), 429, 503 and 504, with capped exponential back-off and
// full jitter, never sooner than Retry-After; follows 202 to completion; never retries a final
// 4xx. Thread-safe: one Client serves many operations.
#pragma once

#include <functional>
#include <string>

#include "idem/clock.h"
#include "idem/result.h"
#include "server/http/client.h"

namespace idem::client {

struct ClientOptions {
  std::string base_url;  // "http://127.0.0.1:8080"
  std::string api_key;
  int max_attempts = 10;
  Millis initial_backoff{100};
  Millis max_backoff{5000};
  // No retry starts after this much time has passed since the first attempt.
  Millis deadline{60000};
  http::CallOptions call;
  // Sleeping is injected so tests need not wait; the default sleeps.
  std::function<void(Millis)> sleep;
};

struct Outcome {
  http::Response response;  // the final answer
  std::string key;          // the Idempotency-Key used on every attempt
  int attempts = 0;         // POSTs sent
};

// A new operation key: a UUIDv7 (time-ordered, 74 random bits).
std::string NewOperationKey(Clock& clock, Random& random);

class Client {
 public:
  // Errors: kInvalidArgument for a bad base URL.
  static Result<Client> Create(ClientOptions options, Clock& clock = SystemClock(),
                               Random& random = SystemRandom());

  // POSTs `body` (JSON) to `path` as one operation, retrying as described above. `key` empty:
  // a new key. Errors: the last transport error when every attempt failed at the network level
  // (kUnavailable / kDeadlineExceeded); otherwise the final response, whatever its status.
  Result<Outcome> Post(const std::string& path, const std::string& body, std::string key = {},
                       const std::vector<std::pair<std::string, std::string>>& headers = {});

  // One GET with the API key (no retries).
  Result<http::Response> Get(const std::string& path);

 private:
  Client(ClientOptions options, http::Url url, Clock& clock, Random& random)
      : options_(std::move(options)), url_(std::move(url)), clock_(clock), random_(random) {}
  Millis Backoff(int retry, const http::Response* response);

  ClientOptions options_;
  http::Url url_;
  Clock& clock_;
  Random& random_;
};

}  // namespace idem::client
