// server/idemd/proxy.h — a gateway route's operation: the request forwarded to the route's
// upstream once, behind the idempotency filter (docs/gateway.md).
#pragma once

#include <string>

#include "server/http/client.h"
#include "server/idemd/filter.h"
#include "server/idemd/gateway_routes.h"

namespace idem::idemd {

// The recovery point of a record whose request has been forwarded: a sent point (the upstream may
// have acted), from which a retry forwards again with the same upstream key.
inline constexpr std::string_view kForwarded = "forwarded";

// The filter policy of `route`: its route id, key policy, fingerprint (the JSON body with its
// ignored and decimal members, and the request's target), lease, retention and final statuses.
FilterPolicy GatewayPolicy(const GatewayRoute& route, const KeyPolicy& keys, int64_t max_processing,
                           int64_t max_retained, Millis wait_max);

// Thread-safe. Borrows everything. `margin` is the lease margin: what the lease must cover beyond
// the upstream's timeout when the request is forwarded, and how long after the covering advance
// the request may still leave (as for payments' charges).
class ProxyOperation final : public Operation {
 public:
  ProxyOperation(const GatewayRoute& route, http::ClientPool& upstream, http::BlockingPool& pool,
                 MonotonicClock& monotonic, Metrics& metrics, Millis margin);

  // Bodies are JSON (the fingerprint canonicalises them): 415 for another media type.
  std::optional<http::Response> Validate(const http::Request& request,
                                         const Principal& principal) override;
  Status OnClaim(StoreTxn& txn, const Record& record, const http::Request& request,
                 const Principal& principal) override;
  // A request whose earlier forward's outcome is unknown (resumed from PROCESSING at `forwarded`)
  // asks the route's status URL first, when it has one (AskStatus). Then it advances the record
  // to `forwarded` under a lease covering the exchange, and forwards: the
  // upstream's answer, kept as the route says; an unreachable upstream (nothing sent) a retryable
  // 502; a timeout or a lost connection after the send an unknown outcome (504, the record stays
  // PROCESSING at `forwarded` and a retry forwards again with the same upstream key).
  http::Async<Execution> Execute(Ticket& ticket, const http::Request& request,
                                 const Principal& principal, Engine& engine,
                                 Heartbeat& heartbeat) override;
  // The request is not stored, so a stale record cannot be forwarded from here. With a status
  // URL the upstream is asked: its answer is the outcome; 404 (never executed) makes the record
  // retryable; no answer leaves it as it is. Without one it becomes retryable, and the client's
  // retry forwards it again.
  Execution Reconcile(Ticket& ticket, Engine& engine) override;

  // A route with key = "optional" and a request without a key: forwarded as it is, no protocol.
  http::Async<http::Response> ForwardWithoutKey(const http::Request& request);

 private:
  // What goes upstream: the request without hop-by-hop headers, credentials, cookies and the
  // client's key; with the route's key header carrying `upstream_key` when it has one.
  http::Request Upstream(const http::Request& request, std::string_view upstream_key) const;
  // The upstream's answer with only the headers the route keeps.
  http::Response Kept(const http::Response& answer) const;
  // Asks the route's status URL about the operation's earlier forward: nullopt when the upstream
  // has no such request (404: forward it); else what to finish with: the upstream's answer as the
  // outcome, or an unknown outcome (502) when it could not tell (5xx, 429, no answer).
  http::Async<std::optional<Execution>> AskStatus(const Ticket& ticket);

  const GatewayRoute& route_;
  http::ClientPool& upstream_;
  http::BlockingPool& pool_;
  MonotonicClock& monotonic_;
  Metrics& metrics_;
  Millis margin_;
};

}  // namespace idem::idemd
