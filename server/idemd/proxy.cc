// server/idemd/proxy.cc — a gateway route's operation.
#include "server/idemd/proxy.h"

#include "include/idem/record.h"
#include "server/http/problem.h"

namespace idem::idemd {

FilterPolicy GatewayPolicy(const GatewayRoute& route, const KeyPolicy& keys, int64_t max_processing,
                           int64_t max_retained, Millis wait_max) {
  FilterPolicy p;
  p.route.route = route.RouteId();
  p.route.key_policy = keys;
  p.route.rules.version = 1;
  p.route.rules.money_fields = route.fingerprint_decimals;
  p.route.rules.removed_fields = route.fingerprint_ignore;
  p.route.lease = route.lease;
  p.route.retention = route.retention;
  p.route.max_processing = max_processing;
  p.route.max_retained = max_retained;
  // No sent points: a record the reconciler made retryable at `forwarded` waits for the client's
  // retry (only the client has the request), and is not listed again as stale.
  p.failures.only_listed_final = true;
  p.failures.success_final = route.success_final;
  p.failures.final_statuses = route.final_statuses;
  p.wait_max = wait_max;
  p.route_label = route.name;
  // Keys are per route: the operation's URL names it (route names need no encoding).
  p.operations_prefix = "/v1/operations/";
  p.operations_suffix = "?route=" + route.name;
  p.stored_headers = route.store_headers;
  p.fingerprint_target = true;
  return p;
}

ProxyOperation::ProxyOperation(const GatewayRoute& route, http::ClientPool& upstream,
                               http::BlockingPool& pool, MonotonicClock& monotonic,
                               Metrics& metrics, Millis margin)
    : route_(route),
      upstream_(upstream),
      pool_(pool),
      monotonic_(monotonic),
      metrics_(metrics),
      margin_(margin) {}

std::optional<http::Response> ProxyOperation::Validate(const http::Request& request,
                                                       const Principal&) {
  return RefuseUnlessJson(request);
}

Status ProxyOperation::OnClaim(StoreTxn&, const Record&, const http::Request&, const Principal&) {
  return Ok();
}

http::Request ProxyOperation::Upstream(const http::Request& request,
                                       std::string_view upstream_key) const {
  http::Request out{request.method, request.target, {}, request.body};
  for (const auto& [name, value] : request.headers.fields) {
    if (!IsUnforwardableHeader(name)) out.headers.Add(name, value);
  }
  if (!route_.forward_key_header.empty() && !upstream_key.empty()) {
    out.headers.Set(route_.forward_key_header, upstream_key);
  }
  return out;
}

http::Response ProxyOperation::Kept(const http::Response& answer) const {
  http::Response kept{answer.status, {}, answer.body};
  for (const std::string& name : route_.store_headers) {
    for (const auto& [field, value] : answer.headers.fields) {
      if (field == name) kept.headers.Add(field, value);
    }
  }
  return kept;
}

http::Async<Execution> ProxyOperation::Execute(Ticket& ticket, const http::Request& request,
                                               const Principal&, Engine& engine,
                                               Heartbeat& heartbeat) {
  // An earlier forward may have executed: the upstream's status URL tells, when it has one.
  if (!route_.status_path.empty() && ticket.resumed &&
      ticket.resumed_from == RecordState::kProcessing &&
      ticket.record.recovery_point == kForwarded) {
    std::optional<Execution> asked = co_await AskStatus(ticket);
    if (asked) co_return std::move(*asked);
  }
  Execution e;
  // The request leaves only under a lease that outlasts the exchange, with the record at
  // `forwarded` first: a crash from here on leaves it there, and a retry forwards again.
  SteadyTime advanced{};
  Status ready = Ok();
  co_await pool_.Run([&] {
    ready = heartbeat.Check();
    if (!ready) return;
    advanced = monotonic_.Now();
    ready = engine.AdvanceBeforeCall(ticket, kForwarded, route_.timeout + margin_);
  });
  if (!ready) {
    e.response = http::ProblemFor(ready.error());
    e.outcome_unknown = true;
    co_return e;
  }
  http::CallOptions options;
  options.timeout = route_.timeout;
  options.connect_timeout = margin_;
  options.send_by = advanced + margin_;
  // One key per operation, the same on every forward of it: the scope hash (the principal, the
  // route and the client's key), which names nothing the client sent.
  const SteadyTime sent = monotonic_.Now();
  Result<http::Response> answer =
      co_await upstream_.Call(Upstream(request, ToHex(ticket.scope)), options);
  metrics_.ObserveUpstream(route_.name, monotonic_.SecondsSince(sent));
  if (answer) {
    e.response = Kept(*answer);
    co_return e;
  }
  const Timestamp expires = ticket.record.expires_at;
  if (answer.error().code == Errc::kUnavailable) {
    // Not sent: the upstream cannot have acted. Retryable at once.
    e.response = http::Problem(
        http::ProblemKind::kUpstreamUnavailable,
        "the upstream could not be reached and nothing was sent: " + answer.error().message,
        {.key_expires = expires});
    e.state = RecordState::kFailedRetryable;
    co_return e;
  }
  // Sent, and no usable answer: the upstream may have acted. The record stays PROCESSING at
  // `forwarded`; a retry forwards again with the same upstream key, and the upstream's own
  // deduplication decides.
  e.response = http::Problem(http::ProblemKind::kUpstreamTimeout,
                             "the upstream gave no usable answer (" + answer.error().message +
                                 "); it may have acted. Retry with the same key: the request is "
                                 "forwarded again with the same upstream key",
                             {.key_expires = expires});
  e.outcome_unknown = true;
  co_return e;
}

http::Async<std::optional<Execution>> ProxyOperation::AskStatus(const Ticket& ticket) {
  const std::string key = ToHex(ticket.scope);
  std::string target = route_.status_path;
  target.replace(target.find("{key}"), 5, key);
  http::Request ask{"GET", std::move(target), {}, ""};
  ask.headers.Set(route_.forward_key_header, key);
  http::CallOptions options;
  options.timeout = route_.timeout;
  options.connect_timeout = margin_;
  const SteadyTime sent = monotonic_.Now();
  Result<http::Response> answer = co_await upstream_.Call(std::move(ask), options);
  metrics_.ObserveUpstream(route_.name, monotonic_.SecondsSince(sent));
  if (answer && answer->status == 404) co_return std::nullopt;
  Execution e;
  if (!answer || answer->status >= 500 || answer->status == 429) {
    const std::string why =
        answer ? "it answered " + std::to_string(answer->status) : answer.error().message;
    e.response = http::Problem(http::ProblemKind::kUpstreamUnavailable,
                               "the upstream's status URL could not tell whether an earlier "
                               "forward of this request executed (" +
                                   why + "); nothing was forwarded again. Retry later",
                               {.key_expires = ticket.record.expires_at});
    e.outcome_unknown = true;
    co_return e;
  }
  e.response = Kept(*answer);
  co_return e;
}

Execution ProxyOperation::Reconcile(Ticket& ticket, Engine&) {
  if (!route_.status_path.empty()) {
    std::optional<Execution> asked = http::RunSync(AskStatus(ticket));
    if (asked) return std::move(*asked);
  }
  Execution e;
  e.response = http::Problem(http::ProblemKind::kUpstreamTimeout,
                             "the upstream's outcome is unknown; retry with the same key: the "
                             "request is forwarded again with the same upstream key",
                             {.key_expires = ticket.record.expires_at});
  e.state = RecordState::kFailedRetryable;
  return e;
}

http::Async<http::Response> ProxyOperation::ForwardWithoutKey(const http::Request& request) {
  http::CallOptions options;
  options.timeout = route_.timeout;
  options.connect_timeout = margin_;
  const SteadyTime sent = monotonic_.Now();
  Result<http::Response> answer = co_await upstream_.Call(Upstream(request, ""), options);
  metrics_.ObserveUpstream(route_.name, monotonic_.SecondsSince(sent));
  if (answer) co_return Kept(*answer);
  co_return http::Problem(answer.error().code == Errc::kUnavailable
                              ? http::ProblemKind::kUnavailable
                              : http::ProblemKind::kTimeout,
                          "the upstream gave no usable answer: " + answer.error().message);
}

}  // namespace idem::idemd
