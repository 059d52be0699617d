// server/idemd/gateway/proxy.h — a gateway route's operation: the request forwarded to the route's
// upstream once, behind the idempotency filter (docs/gateway.md).
#pragma once

#include <string>

#include "http/client.h"
#include "server/idemd/filter/filter.h"
#include "server/idemd/gateway/routes.h"

namespace idem::idemd {

// The recovery point of a record whose request has been forwarded and whose outcome is not known
// (the forward is out, or it timed out, or idemd stopped meanwhile): a retry asks the route's
// status URL first, when it has one, then forwards again with the same upstream key.
inline constexpr std::string_view kForwarded = "forwarded";
// The recovery point of a retryable record whose last forward's outcome is known: the upstream
// answered it, it was never sent, or the status URL said it never ran. A retry forwards again
// without asking.
inline constexpr std::string_view kSettled = "settled";

// Logs why an exchange with a route's upstream (or the unmatched one: route "unmatched") failed:
// the transport's message names the upstream's address, which answers never do.
void LogUpstreamFailure(std::string_view route, std::string_view method, const Error& error);
// The answer to a request without a record (passed through, or without a key) whose upstream
// failed, logged as LogUpstreamFailure: 503 unavailable when nothing was sent (kUnavailable), else
// 504 timeout; the details name neither the upstream nor the transport's error.
http::Response UpstreamFailure(std::string_view route, std::string_view method, const Error& error);

// The key a record's operation forwards in the route's forward_key_header and asks its status URL
// with: 64 hex digits, one per operation (fixed in its first claim as the record's resource id),
// the same on every forward and question of it, and never another operation's, also after the
// record expired and its client key began a new one.
std::string UpstreamKeyOf(const Record& record);

// The headers of `in` but those `never` names (lower case) and those the Connection header lists.
http::Headers ForwardableHeaders(const http::Headers& in, bool (*never)(std::string_view));

// An answer a proxy can pass on: a 1xx (100 Continue, 103 Early Hints) is not one; it becomes
// kDataLoss, as any other unusable answer.
Result<http::Response> Usable(Result<http::Response> answer);

// The version of `route`'s fingerprint rules (body mode, ignored and decimal members, in any
// order): a hash, so a record made under other rules is recognised as such and verified under
// those (RoutePolicy::previous_rules) instead of being taken for another request.
uint32_t RulesVersion(const GatewayRoute& route);

// The filter policy of `route`: its route id, key policy, fingerprint (the JSON body with its
// ignored and decimal members, and the request's target), lease, retention and final statuses.
FilterPolicy GatewayPolicy(const GatewayRoute& route, const KeyPolicy& keys, int64_t max_processing,
                           int64_t max_retained, Millis wait_max);

// Thread-safe. Borrows everything. `margin` is the lease margin: what the lease must cover beyond
// the upstream's timeout when the request is forwarded, and how long after the covering advance
// the request may still leave (as for payments' charges).
// The longest the reconciler waits for a status URL's answer about one record.
inline constexpr Millis kReconcileAskTimeout{2000};

class ProxyOperation final : public Operation {
 public:
  ProxyOperation(const GatewayRoute& route, http::ClientPool& upstream, http::BlockingPool& pool,
                 MonotonicClock& monotonic, Metrics& metrics, Millis margin);

  // On a route with JSON bodies (the fingerprint canonicalises them): 415 for another media
  // type. A route of bytes takes any.
  std::optional<http::Response> Validate(const http::Request& request,
                                         const Principal& principal) override;
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
  // has settled (at most kReconcileAskTimeout, the loop is shared): its answer is the outcome;
  // 404 (never executed) makes the record retryable; no answer leaves it as it is. Without one it
  // becomes retryable, and the client's retry forwards it again, when the route declares
  // upstream_deduplicates; else it ends with HeldUnknown.
  Execution Reconcile(Ticket& ticket, Engine& engine) override;

  // A route with key = "optional" and a request without a key: forwarded as it is, no protocol.
  http::Async<http::Response> ForwardWithoutKey(const http::Request& request);

 private:
  // What goes upstream: the request without hop-by-hop headers, credentials, cookies and the
  // client's key; with the route's key header carrying `upstream_key` when it has one.
  http::Request Upstream(const http::Request& request, std::string_view upstream_key) const;
  // The upstream's answer with only the headers the route keeps.
  http::Response Kept(const http::Response& answer) const;
  // Asks the route's status URL about the operation's earlier forward (with the route's
  // credential header, when it has one): nullopt when the upstream has no such request (404:
  // forward it); else what to finish with: on a 2xx, the answer it reports as the outcome (its
  // status from kOriginalStatusHeader), classified as the route classifies answers; otherwise
  // (any other status, a malformed header, no answer within `timeout`) an unknown outcome (502
  // upstream-unavailable, the record stays PROCESSING), or, once it has not told for the route's
  // status_unknown_max since the forward settled, the final 502 upstream-outcome-unknown, logged
  // at error level and counted (idem_gateway_unknown_outcomes_total).
  http::Async<std::optional<Execution>> AskStatus(const Ticket& ticket, Millis timeout);
  // The final answer to an operation whose forward's outcome is unknown on a route without a
  // status URL whose upstream is not declared to deduplicate (upstream_deduplicates): 502
  // upstream-outcome-unknown, FAILED_FINAL, never forwarded again; logged at error level and
  // counted (idem_gateway_unknown_outcomes_total) for an operator to settle.
  Execution HeldUnknown(const Record& record);
  // When the last forward of `record` can no longer be executing at the upstream, by the store's
  // clock: sent at sent_at, out for the route's timeout at most, the margin for a late arrival.
  Timestamp Settled(const Record& record) const;
  // How long until Settled(record), by the store's clock when the record was read; nullopt once
  // it has passed.
  std::optional<Millis> Unsettled(const Record& record) const;

  const GatewayRoute& route_;
  http::ClientPool& upstream_;
  http::BlockingPool& pool_;
  MonotonicClock& monotonic_;
  Metrics& metrics_;
  Millis margin_;
};

}  // namespace idem::idemd
