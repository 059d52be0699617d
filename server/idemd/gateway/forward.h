// server/idemd/gateway/forward.h — the steps of a gateway forward: what each answer of the
// upstream and of its status URL decides, apart from the awaits between them
// (ProxyOperation::Execute, TakeOver). Synchronous, like the charge's (payments/charge.h).
#pragma once

#include <boost/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "http/client.h"
#include "http/message.h"
#include "idem/engine.h"
#include "server/idemd/filter/filter.h"
#include "server/idemd/gateway/routes.h"
#include "server/idemd/metrics.h"
#include "server/idemd/problems.h"

namespace idem::idemd {

// The recovery point of a record whose request has been forwarded and whose outcome is not known
// (the forward is out, or it timed out, or idemd stopped meanwhile): a retry asks the route's
// status URL first, when it has one, then forwards again with the same upstream key.
inline constexpr std::string_view kForwarded = "forwarded";
// The recovery point of a retryable record whose last forward's outcome is known: the upstream
// answered it, it was never sent, or the status URL said it never ran. A retry forwards again
// without asking.
inline constexpr std::string_view kSettled = "settled";

// The key a record's operation forwards in the route's forward_key_header and asks its status URL
// with: 64 hex digits, one per operation (fixed in its first claim as the record's resource id),
// the same on every forward and question of it, and never another operation's, also after the
// record expired and its client key began a new one.
std::string UpstreamKeyOf(const Record& record);

// Logs why an exchange with a route's upstream (or the unmatched one: route "unmatched") failed:
// the transport's message names the upstream's address, which answers never do.
void LogUpstreamFailure(std::string_view route, std::string_view method, const Error& error);
// The answer to a request without a record (passed through, or without a key) whose upstream
// failed, logged as LogUpstreamFailure: 503 unavailable when nothing was sent (kUnavailable), else
// 504 timeout; the details name neither the upstream nor the transport's error.
http::Response UpstreamFailure(std::string_view route, std::string_view method, const Error& error);

// The headers of `in` but those `never` names (lower case) and those the Connection header lists.
http::Headers ForwardableHeaders(const http::Headers& in, bool (*never)(std::string_view));

// An answer a proxy can pass on: a 1xx (100 Continue, 103 Early Hints) is not one; it becomes
// kDataLoss, as any other unusable answer.
Result<http::Response> Usable(Result<http::Response> answer);

// What an operation does before it forwards, by its record.
enum class Resume {
  kForward,  // nothing earlier is unknown, or the upstream deduplicates by the upstream key
  kAsk,      // an earlier forward's outcome is unknown and has settled: ask the status URL
  kWait,     // it is unknown and may still be executing upstream: nothing is sent yet
  kHold,     // it is unknown, and the route can neither ask nor rely on the upstream: held
};

// Thread-safe. Borrows the route and the metrics. `margin` is the lease margin: what the lease
// must cover beyond the upstream's timeout when the request is forwarded, and how long after the
// covering advance the request may still leave.
class ForwardSteps {
 public:
  ForwardSteps(const GatewayRoute& route, Metrics& metrics, Millis margin);

  Resume Resuming(const Ticket& ticket) const;
  // How long until the last forward of `record` can no longer be executing at the upstream (sent
  // at sent_at, out for the route's timeout at most, the margin for a late arrival, then the
  // route's late_execution), by the store's clock when the record was read; nullopt once it has
  // passed.
  std::optional<Millis> Unsettled(const Record& record) const;

  // What goes upstream: the request without hop-by-hop headers, credentials, cookies and the
  // client's key; with the route's key header carrying `upstream_key` when it has one.
  http::Request Upstream(const http::Request& request, std::string_view upstream_key) const;
  // A forward's call options: the route's timeout, and the margin to connect and to leave, from
  // the covering advance made at `advanced` (none for a forward without a key).
  http::CallOptions Options(std::optional<SteadyTime> advanced) const;
  // The upstream's answer with only the headers the route keeps.
  http::Response Kept(const http::Response& answer) const;
  // What the forward's answer settles: the upstream's answer, kept as the route says; an
  // unreachable upstream (nothing sent) a retryable 502; a timeout or a lost connection after the
  // send an unknown outcome (504, the record stays PROCESSING at `forwarded`), and so is an
  // answer that may come from an upstream that acted (MayHaveActed: 502 upstream-failed).
  Execution AfterForward(const Ticket& ticket, std::string_view method,
                         Result<http::Response> answer) const;

  // The question to the route's status URL about the operation's earlier forward, with the
  // route's credential header when it has one.
  http::Request StatusQuestion(const Record& record) const;
  // What the status URL's answer settles: nullopt when the upstream has no such request (404:
  // forward it); else what to finish with: on a 2xx, the answer it reports as the outcome (its
  // status from kOriginalStatusHeader), classified as the route classifies answers — but one
  // that MayHaveActed is the final 502 upstream-outcome-unknown, held for an operator; otherwise
  // (any other status, a malformed header, no answer) an unknown outcome (502
  // upstream-unavailable, the record stays PROCESSING), or, once it has not told for the route's
  // status_unknown_max since the forward settled, the final 502 upstream-outcome-unknown, logged
  // at error level and counted (idem_gateway_unknown_outcomes_total).
  std::optional<Execution> FromStatus(const Ticket& ticket, Result<http::Response> answer) const;

  // The final answer to an operation whose forward's outcome is unknown on a route without a
  // status URL whose upstream is not declared to deduplicate (upstream_deduplicates): 502
  // upstream-outcome-unknown, held (never forwarded again); logged at error level and counted
  // for an operator to settle.
  Execution HeldUnknown(const Record& record) const;
  // The takeover loop's answer once nothing was asked, or the status URL said it never ran: a
  // record never forwarded, or not executed upstream, is retryable at `settled`; one whose
  // upstream deduplicates is retryable where it was, forwarded again by the client's retry.
  Execution Unanswered(const Ticket& ticket) const;

 private:
  // Whether the upstream may have acted although it answered `status`: a 5xx the route neither
  // replays (final_statuses) nor declares as "nothing done" (nothing_done_statuses).
  bool MayHaveActed(int status) const;
  // Holds the unknown outcome of `record` for an operator: logs `why` at error level with the
  // record's route, principal, scope and upstream key, then `fields`; counts it
  // (idem_gateway_unknown_outcomes_total); answers the final 502 upstream-outcome-unknown with
  // `detail`.
  Execution HoldUnknown(const Record& record, std::string_view why,
                        const boost::json::object& fields, const std::string& detail) const;
  // The unknown outcome of a forward that left: `what` happened, and the upstream may have acted.
  Execution UnknownAfterSend(ProductProblem kind, const std::string& what, Timestamp expires) const;

  const GatewayRoute& route_;
  Metrics& metrics_;
  Millis margin_;
};

}  // namespace idem::idemd
