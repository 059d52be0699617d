// client/client.cc — retries, back-off and 202 polling over the blocking HTTP call.
#include "client/client.h"

#include <boost/json.hpp>
#include <cstdio>
#include <thread>

#include "http/client.h"
#include "idem/key.h"

namespace idem::client {

struct Client::Impl {
  ClientOptions options;
  http::Url url;
  http::CallOptions call;
  Clock& clock;
  Random& random;
};

namespace {

bool Retryable(const Response& r) {
  if (r.status == 409) return r.headers.Get("retry-after").has_value();  // still running
  return r.status == 429 || r.status == 503 || r.status == 504;
}

std::optional<Millis> RetryAfter(const Response& r) {
  auto value = r.headers.Get("retry-after");
  if (!value || value->empty() || value->size() > 6 ||
      value->find_first_not_of("0123456789") != std::string_view::npos) {
    return std::nullopt;  // HTTP-date forms are not used by idemd; treat as absent
  }
  return Millis(std::stoll(std::string(*value)) * 1000);
}

Response FromHttp(http::Response r) {
  return Response{r.status, Headers{std::move(r.headers.fields)}, std::move(r.body)};
}

Result<Response> Call(const http::Url& url, const http::CallOptions& options,
                      http::Request request) {
  IDEM_ASSIGN_OR_RETURN(http::Response response, http::Call(url, std::move(request), options));
  return FromHttp(std::move(response));
}

}  // namespace

std::optional<std::string_view> Headers::Get(std::string_view name) const {
  const std::string lower = http::ToLower(name);
  for (const auto& [field, value] : fields) {
    if (http::ToLower(field) == lower) return std::string_view(value);
  }
  return std::nullopt;
}

std::string NewOperationKey(Clock& clock, Random& random) { return NewUuidV7(clock, random); }

Client::Client(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Client::Client(Client&&) noexcept = default;
Client& Client::operator=(Client&&) noexcept = default;
Client::~Client() = default;

Result<Client> Client::Create(ClientOptions options, Clock& clock, Random& random) {
  IDEM_ASSIGN_OR_RETURN(http::Url url, http::ParseHttpUrl(options.base_url));
  if (options.max_attempts < 1) return MakeError(Errc::kInvalidArgument, "max_attempts < 1");
  if (!options.sleep) options.sleep = [](Millis d) { std::this_thread::sleep_for(d); };
  http::CallOptions call;
  call.connect_timeout = options.connect_timeout;
  call.timeout = options.timeout;
  call.max_response_bytes = options.max_response_bytes;
  return Client(std::make_unique<Impl>(
      Impl{std::move(options), std::move(url), std::move(call), clock, random}));
}

Millis Client::Backoff(int retry, const Response* response) {
  // Full jitter over a capped exponential: uniform in [0, min(max, initial * 2^retry)].
  const ClientOptions& options = impl_->options;
  const int64_t cap = std::min<int64_t>(options.max_backoff.count(), options.initial_backoff.count()
                                                                         << std::min(retry, 20));
  uint64_t r;
  impl_->random.Fill(std::span<uint8_t>(reinterpret_cast<uint8_t*>(&r), sizeof r));
  Millis wait(cap > 0 ? static_cast<int64_t>(r % static_cast<uint64_t>(cap + 1)) : 0);
  if (response != nullptr) {
    if (auto after = RetryAfter(*response)) wait = std::max(wait, *after);
  }
  return wait;
}

Result<Outcome> Client::Post(const std::string& path, const std::string& body, std::string key,
                             const std::vector<std::pair<std::string, std::string>>& headers) {
  const ClientOptions& options = impl_->options;
  Clock& clock = impl_->clock;
  Outcome out;
  out.key = key.empty() ? NewOperationKey(clock, impl_->random) : std::move(key);
  const Timestamp started = clock.Now();
  std::optional<Error> last_error;
  bool accepted = false;  // after a 202, later attempts collect the answer: no respond-async
  for (int attempt = 0; attempt < options.max_attempts; ++attempt) {
    http::Request req;
    req.method = "POST";
    req.target = impl_->url.base_path + path;
    req.headers.Set("Authorization", "Bearer " + options.api_key);
    req.headers.Set("Content-Type", "application/json");
    req.headers.Set("Idempotency-Key", out.key);
    for (const auto& [n, v] : headers) {
      if (!(accepted && http::ToLower(n) == "prefer")) req.headers.Set(n, v);
    }
    req.body = body;
    ++out.attempts;
    auto response = Call(impl_->url, impl_->call, std::move(req));

    if (response && response->status == 202) {
      accepted = true;
      // Accepted: poll the operation until it is no longer running, then ask again with the
      // same key, which replays the final answer byte for byte (or executes a retryable one).
      const std::string location = std::string(response->headers.Get("location").value_or(""));
      for (int poll = 0; !location.empty() && clock.Now() - started < options.deadline; ++poll) {
        options.sleep(std::min(options.max_backoff, options.initial_backoff * (poll + 1)));
        auto op = Get(location);
        if (!op || op->status != 200) break;
        boost::system::error_code ec;
        auto doc = boost::json::parse(op->body, ec);
        if (ec || !doc.is_object()) break;
        const auto* state = doc.as_object().if_contains("state");
        if (state == nullptr || !state->is_string() || state->as_string() != "PROCESSING") break;
      }
      continue;  // the next POST (without respond-async) collects the answer
    }
    if (response && !Retryable(*response)) {
      out.response = std::move(*response);
      return out;
    }
    if (!response) last_error = response.error();
    const bool out_of_time = clock.Now() - started >= options.deadline;
    if (attempt + 1 == options.max_attempts || out_of_time) {
      if (response) {
        out.response = std::move(*response);
        return out;
      }
      break;
    }
    options.sleep(Backoff(attempt, response ? &*response : nullptr));
  }
  return last_error ? *last_error : MakeError(Errc::kUnavailable, "no attempt was made");
}

Result<Response> Client::Get(const std::string& path) {
  http::Request req;
  req.method = "GET";
  req.target = impl_->url.base_path + path;
  req.headers.Set("Authorization", "Bearer " + impl_->options.api_key);
  return Call(impl_->url, impl_->call, std::move(req));
}

}  // namespace idem::client
