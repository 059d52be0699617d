// server/idemd/gateway/proxy.h — a gateway route's operation: the request forwarded to the route's
// upstream once, behind the idempotency filter (docs/gateway.md).
#pragma once

#include <string>

#include "http/client.h"
#include "server/idemd/filter/filter.h"
#include "server/idemd/gateway/forward.h"
#include "server/idemd/gateway/routes.h"

namespace idem::idemd {

// The version of `route`'s fingerprint rules (body mode, ignored and decimal members, in any
// order): a hash, so a record made under other rules is recognised as such and verified under
// those (RoutePolicy::previous_rules) instead of being taken for another request.
uint32_t RulesVersion(const GatewayRoute& route);

// The filter policy of `route`: its route id, key policy, fingerprint (the JSON body with its
// ignored and decimal members, and the request's target), lease, retention and final statuses.
FilterPolicy GatewayPolicy(const GatewayRoute& route, const KeyPolicy& keys, int64_t max_processing,
                           int64_t max_retained, Millis wait_max);

// The longest the takeover loop waits for a status URL's answer about one record.
inline constexpr Millis kTakeoverAskTimeout{2000};

// Thread-safe. Borrows everything. `margin` is the lease margin: what the lease must cover beyond
// the upstream's timeout when the request is forwarded, and how long after the covering advance
// the request may still leave (as for payments' charges). The decisions are ForwardSteps'; this
// awaits the upstream between them.
class ProxyOperation final : public Operation {
 public:
  ProxyOperation(const GatewayRoute& route, http::Upstream& upstream, http::BlockingPool& pool,
                 MonotonicClock& monotonic, Metrics& metrics, Millis margin);

  // On a route with JSON bodies (the fingerprint canonicalises them): 415 for another media
  // type. A route of bytes takes any.
  std::optional<http::Response> Validate(const http::Request& request, const Principal& principal,
                                         bool canonical) override;
  // Fixes the operation's upstream key (UpstreamKeyOf) as the record's resource id in its first
  // claim; a resume keeps it. Errors: the store's (the claim is then not made).
  Status OnClaim(StoreTxn& txn, const Record& record, const http::Request& request,
                 const Principal& principal) override;
  // A request whose earlier forward's outcome is unknown (resumed at `forwarded`) asks the route's
  // status URL first, when it has one (AskStatus), once that forward can no longer be executing
  // (before then: in progress, Unsettled). Then it advances the record to `forwarded` under a
  // lease covering the exchange, and forwards: the
  // upstream's answer, kept as the route says; an unreachable upstream (nothing sent) a retryable
  // 502; a timeout or a lost connection after the send an unknown outcome (504, the record stays
  // PROCESSING at `forwarded`). A retry of such a record asks the status URL (above), or, with
  // upstream_deduplicates, forwards again with the same upstream key, or else gets HeldUnknown.
  http::Async<Execution> Execute(Ticket& ticket, const http::Request& request,
                                 const Principal& principal, Engine& engine,
                                 Heartbeat& heartbeat) override;
  // The request is not stored, so a stale record cannot be forwarded from here. A record never
  // forwarded becomes retryable. Else, with a status URL, the upstream is asked once the forward
  // has settled (at most kTakeoverAskTimeout, the loop is shared): its answer is the outcome;
  // 404 (never executed) makes the record retryable; no answer leaves it as it is. Without one it
  // becomes retryable, and the client's retry forwards it again, when the route declares
  // upstream_deduplicates; else it ends with HeldUnknown.
  Execution TakeOver(Ticket& ticket, Engine& engine) override;

  // A route with key = "optional" and a request without a key: forwarded as it is, no protocol.
  http::Async<http::Response> ForwardWithoutKey(const http::Request& request);

 private:
  // Asks the route's status URL about the operation's earlier forward, waiting `timeout` at most
  // for its answer (ForwardSteps::FromStatus).
  http::Async<std::optional<Execution>> AskStatus(const Ticket& ticket, Millis timeout);

  const GatewayRoute& route_;
  http::Upstream& upstream_;
  http::BlockingPool& pool_;
  MonotonicClock& monotonic_;
  Metrics& metrics_;
  Millis margin_;
  const ForwardSteps steps_;
};

}  // namespace idem::idemd
