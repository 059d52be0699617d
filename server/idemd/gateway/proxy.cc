// server/idemd/gateway/proxy.cc — a gateway route's operation.
#include "server/idemd/gateway/proxy.h"

#include <algorithm>
#include <array>
#include <cctype>

#include "http/log.h"
#include "http/problem.h"
#include "idem/key.h"
#include "idem/record.h"
#include "server/idemd/routes.h"

namespace idem::idemd {

uint32_t RulesVersion(const GatewayRoute& route) {
  std::vector<std::string> ignore = route.fingerprint_ignore;
  std::vector<std::string> decimals = route.fingerprint_decimals;
  std::sort(ignore.begin(), ignore.end());
  std::sort(decimals.begin(), decimals.end());
  std::string text = route.json_body ? "json" : "bytes";
  for (const auto* list : {&ignore, &decimals}) {
    text += '\x1e';
    for (const std::string& name : *list) text += name + '\x1f';
  }
  const std::array<uint8_t, 32> digest = Sha256({text});
  const uint32_t hash = (uint32_t{digest[0]} << 24) | (uint32_t{digest[1]} << 16) |
                        (uint32_t{digest[2]} << 8) | uint32_t{digest[3]};
  return hash | 0x80000000u;  // never 1, the version of records made before versions were hashes
}

FilterPolicy GatewayPolicy(const GatewayRoute& route, const KeyPolicy& keys, int64_t max_processing,
                           int64_t max_retained, Millis wait_max) {
  FilterPolicy p;
  p.route.route = route.RouteId();
  p.route.key_policy = keys;
  p.route.rules.money_fields = route.fingerprint_decimals;
  p.route.rules.removed_fields = route.fingerprint_ignore;
  p.route.rules.opaque_body = !route.json_body;
  // Records made before rule versions were hashes carry version 1, under the rules of their day:
  // taken to be these (a change then already made their retries 422).
  CanonicalRules legacy = p.route.rules;
  legacy.version = 1;
  p.route.previous_rules = {legacy};
  p.route.rules.version = RulesVersion(route);
  p.route.lease = route.lease;
  p.route.retention = route.retention;
  p.route.max_processing = max_processing;
  p.route.max_retained = max_retained;
  p.route.max_response_bytes = route.max_stored_bytes;
  // No sent points: a record the takeover loop made retryable at `forwarded` waits for the client's
  // retry (only the client has the request), and is not listed again as stale.
  p.failures.only_listed_final = true;
  p.failures.success_final = route.success_final;
  p.failures.final_statuses = route.final_statuses;
  p.wait_max = wait_max;
  p.route_label = route.name;
  // Keys are per route: the operation's URL names it (route names need no encoding).
  p.operations_prefix = kOperationsPrefix;
  p.operations_suffix = "?route=" + route.name;
  p.stored_headers = route.store_headers;
  p.fingerprint_target = true;
  return p;
}

ProxyOperation::ProxyOperation(const GatewayRoute& route, http::Upstream& upstream,
                               http::BlockingPool& pool, MonotonicClock& monotonic,
                               Metrics& metrics, Millis margin)
    : route_(route),
      upstream_(upstream),
      pool_(pool),
      monotonic_(monotonic),
      metrics_(metrics),
      margin_(margin),
      steps_(route, metrics, margin) {
  metrics_.DeclareUpstream(route_.name);
  metrics_.DeclareUnknownOutcomes(route_.name);
}

std::optional<http::Response> ProxyOperation::Validate(const http::Request& request,
                                                       const Principal&, bool) {
  if (!route_.json_body) return std::nullopt;
  return RefuseUnlessJson(request);
}

Status ProxyOperation::OnClaim(StoreTxn& txn, const Record& record, const http::Request&,
                               const Principal&) {
  // Fixed once per operation, in its first claim: a resume (a retry, a takeover) keeps it. A
  // record claimed afresh after its key expired has neither (the store clears both), so a new
  // operation with the same client key never sends an earlier operation's upstream key. A
  // record at a point without an id was forwarded under the scope's hex (UpstreamKeyOf).
  if (!record.resource_id.empty() || !record.recovery_point.empty()) return Ok();
  return txn.Advance(record.scope, record.lease, record.recovery_point, OperationKeyOf(record));
}

http::Async<Execution> ProxyOperation::Execute(Ticket& ticket, const http::Request& request,
                                               const Principal&, Engine& engine,
                                               Heartbeat& heartbeat) {
  switch (steps_.Resuming(ticket)) {
    case Resume::kHold:
      co_return steps_.HeldUnknown(ticket.record);
    case Resume::kWait:
      co_return Execution::Settling(*steps_.Unsettled(ticket.record));
    case Resume::kAsk:
      if (std::optional<Execution> asked = co_await AskStatus(ticket, route_.timeout)) {
        co_return std::move(*asked);
      }
      break;  // it never ran: forward it
    case Resume::kForward:
      break;
  }
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
  if (!ready) co_return Execution::Unknown(ready.error());
  // One key per operation, the same on every forward of it, fixed in its first claim (OnClaim).
  const SteadyTime sent = monotonic_.Now();
  Result<http::Response> answer = Usable(co_await upstream_.Exchange(
      steps_.Upstream(request, UpstreamKeyOf(ticket.record)), steps_.Options(advanced)));
  metrics_.ObserveUpstream(route_.name, monotonic_.SecondsSince(sent));
  co_return steps_.AfterForward(ticket, request.method, std::move(answer));
}

http::Async<std::optional<Execution>> ProxyOperation::AskStatus(const Ticket& ticket,
                                                                Millis timeout) {
  http::CallOptions options;
  options.timeout = timeout;
  options.connect_timeout = std::min(margin_, timeout);
  const SteadyTime sent = monotonic_.Now();
  Result<http::Response> answer =
      Usable(co_await upstream_.Exchange(steps_.StatusQuestion(ticket.record), options));
  metrics_.ObserveUpstream(route_.name, monotonic_.SecondsSince(sent));
  co_return steps_.FromStatus(ticket, std::move(answer));
}

Execution ProxyOperation::TakeOver(Ticket& ticket, Engine&) {
  switch (steps_.Resuming(ticket)) {
    case Resume::kHold:
      return steps_.HeldUnknown(ticket.record);
    case Resume::kWait:
      return Execution::Unknown(http::Response{});  // not yet: a later pass asks
    case Resume::kAsk:
      if (std::optional<Execution> asked =
              http::RunSync(AskStatus(ticket, std::min(route_.timeout, kTakeoverAskTimeout)))) {
        return std::move(*asked);
      }
      break;  // it never ran
    case Resume::kForward:
      break;
  }
  return steps_.Unanswered(ticket);
}

http::Async<http::Response> ProxyOperation::ForwardWithoutKey(const http::Request& request) {
  const SteadyTime sent = monotonic_.Now();
  Result<http::Response> answer = Usable(
      co_await upstream_.Exchange(steps_.Upstream(request, ""), steps_.Options(std::nullopt)));
  metrics_.ObserveUpstream(route_.name, monotonic_.SecondsSince(sent));
  if (answer) co_return steps_.Kept(*answer);
  co_return UpstreamFailure(route_.name, request.method, answer.error());
}

}  // namespace idem::idemd
