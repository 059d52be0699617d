// server/idemd/gateway/proxy.cc — a gateway route's operation.
#include "server/idemd/gateway/proxy.h"

#include <openssl/sha.h>

#include <algorithm>
#include <array>
#include <cctype>

#include "http/log.h"
#include "http/problem.h"
#include "idem/record.h"
#include "server/idemd/routes.h"

namespace idem::idemd {

http::Headers ForwardableHeaders(const http::Headers& in, bool (*never)(std::string_view)) {
  const std::vector<std::string_view> listed = in.List("connection");
  http::Headers out;
  for (const auto& field : in.fields) {
    const std::string& name = field.first;  // lower case (Headers::Add)
    const bool named = std::any_of(listed.begin(), listed.end(), [&](std::string_view option) {
      return option.size() == name.size() &&
             std::equal(option.begin(), option.end(), name.begin(), [](char a, char b) {
               return std::tolower(static_cast<unsigned char>(a)) == b;
             });
    });
    if (!named && !never(name)) out.Add(name, field.second);
  }
  return out;
}

Result<http::Response> Usable(Result<http::Response> answer) {
  if (answer && answer->status < 200) {
    return MakeError(Errc::kDataLoss,
                     "an interim answer (" + std::to_string(answer->status) + ") came alone");
  }
  return answer;
}

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
  std::array<uint8_t, SHA256_DIGEST_LENGTH> digest;
  SHA256(reinterpret_cast<const unsigned char*>(text.data()), text.size(), digest.data());
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
  // No sent points: a record the reconciler made retryable at `forwarded` waits for the client's
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

ProxyOperation::ProxyOperation(const GatewayRoute& route, http::ClientPool& upstream,
                               http::BlockingPool& pool, MonotonicClock& monotonic,
                               Metrics& metrics, Millis margin)
    : route_(route),
      upstream_(upstream),
      pool_(pool),
      monotonic_(monotonic),
      metrics_(metrics),
      margin_(margin) {
  metrics_.DeclareUpstream(route_.name);
  metrics_.DeclareUnknownOutcomes(route_.name);
}

std::optional<http::Response> ProxyOperation::Validate(const http::Request& request,
                                                       const Principal&) {
  if (!route_.json_body) return std::nullopt;
  return RefuseUnlessJson(request);
}

void LogUpstreamFailure(std::string_view route, std::string_view method, const Error& error) {
  http::Log(http::LogLevel::kWarn, "upstream gave no usable answer",
            {{"route", route},
             {"method", method},
             {"code", ErrcName(error.code)},
             {"why", error.message}});
}

http::Response UpstreamFailure(std::string_view route, std::string_view method,
                               const Error& error) {
  LogUpstreamFailure(route, method, error);
  if (error.code == Errc::kUnavailable) {
    return http::Problem(http::ProblemKind::kUnavailable,
                         "the upstream could not be reached and nothing was sent; retry");
  }
  return http::Problem(http::ProblemKind::kTimeout, "the upstream gave no usable answer in time");
}

std::string UpstreamKeyOf(const Record& record) {
  // Records claimed before the key was fixed in the claim forwarded the scope's hex: they keep it.
  return record.resource_id.empty() ? ToHex(record.scope) : record.resource_id;
}

Status ProxyOperation::OnClaim(StoreTxn& txn, const Record& record, const http::Request&,
                               const Principal&) {
  // Fixed once per operation, in its first claim: a resume (a retry, a takeover) keeps it. A
  // record claimed afresh after its key expired has neither (the store clears both), so a new
  // operation with the same client key never sends an earlier operation's upstream key. A
  // record at a point without an id was forwarded under the scope's hex (UpstreamKeyOf).
  if (!record.resource_id.empty() || !record.recovery_point.empty()) return Ok();
  // The scope and the claim's owner token, which no other claim holds; hashed, so the upstream
  // learns neither the lease's token nor anything the client sent.
  std::array<uint8_t, sizeof(record.scope) + sizeof(record.lease.owner)> input;
  std::copy(record.scope.begin(), record.scope.end(), input.begin());
  std::copy(record.lease.owner.begin(), record.lease.owner.end(),
            input.begin() + static_cast<std::ptrdiff_t>(record.scope.size()));
  std::array<uint8_t, SHA256_DIGEST_LENGTH> key;
  SHA256(input.data(), input.size(), key.data());
  return txn.Advance(record.scope, record.lease, record.recovery_point, ToHex(key));
}

http::Request ProxyOperation::Upstream(const http::Request& request,
                                       std::string_view upstream_key) const {
  http::Request out{request.method, request.target,
                    ForwardableHeaders(request.headers, IsUnforwardableHeader), request.body};
  if (!route_.forward_key_header.empty()) {
    // Only idemd names the operation to the upstream: the client's copy of the header never
    // passes, also without a key of idemd's to put there (ForwardWithoutKey).
    out.headers.Remove(route_.forward_key_header);
    if (!upstream_key.empty()) out.headers.Set(route_.forward_key_header, upstream_key);
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
  // An earlier forward may have executed: the upstream's status URL tells, when it has one, once
  // that forward can no longer be executing. Without one, only an upstream that deduplicates by
  // the forwarded key may get it again; for any other the unknown outcome is held.
  const bool unknown = ticket.resumed && ticket.record.recovery_point == kForwarded;
  if (unknown && route_.status_path.empty() && !route_.upstream_deduplicates) {
    co_return HeldUnknown(ticket.record);
  }
  if (!route_.status_path.empty() && unknown) {
    if (std::optional<Millis> left = Unsettled(ticket.record)) {
      Execution settling;
      settling.settling_for = *left;
      co_return settling;
    }
    std::optional<Execution> asked = co_await AskStatus(ticket, route_.timeout);
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
  // One key per operation, the same on every forward of it, fixed in its first claim (OnClaim).
  const SteadyTime sent = monotonic_.Now();
  Result<http::Response> answer =
      Usable(co_await upstream_.Call(Upstream(request, UpstreamKeyOf(ticket.record)), options));
  metrics_.ObserveUpstream(route_.name, monotonic_.SecondsSince(sent));
  // Answered, or not sent: the outcome is known, and a retry of a retryable one forwards again
  // without asking.
  e.recovery_point = std::string(kSettled);
  if (answer) {
    e.response = Kept(*answer);
    co_return e;
  }
  const Timestamp expires = ticket.record.expires_at;
  // The transport's message names the upstream's address: for the log, not for the client.
  LogUpstreamFailure(route_.name, request.method, answer.error());
  if (answer.error().code == Errc::kUnavailable) {
    // Not sent: the upstream cannot have acted. Retryable at once.
    e.response =
        http::Problem(http::ProblemKind::kUpstreamUnavailable,
                      "the upstream could not be reached and nothing was sent; retry with the "
                      "same key",
                      {.key_expires = expires});
    e.state = RecordState::kFailedRetryable;
    co_return e;
  }
  // Sent, and no usable answer: the upstream may have acted. The record stays PROCESSING at
  // `forwarded`; a retry asks the status URL, or forwards again with the same upstream key, and
  // the upstream's own deduplication decides, or, on a route that has neither, gets the held
  // unknown outcome (HeldUnknown).
  e.recovery_point.clear();
  const bool again = !route_.status_path.empty() || route_.upstream_deduplicates;
  e.response = http::Problem(
      http::ProblemKind::kUpstreamTimeout,
      again ? "the upstream gave no usable answer in time; it may have acted. Retry with the same "
              "key: the upstream is asked, or the request is forwarded again with the same "
              "upstream key"
            : "the upstream gave no usable answer in time; it may have acted. It is not forwarded "
              "again: a retry with the same key is answered 502 upstream-outcome-unknown",
      {.key_expires = expires});
  e.outcome_unknown = true;
  co_return e;
}

Execution ProxyOperation::HeldUnknown(const Record& record) {
  http::Log(http::LogLevel::kError, "gateway outcome unknown; not forwarded again",
            {{"route", route_.name},
             {"tenant", record.tenant},
             {"user", record.user},
             {"scope", ToHex(record.scope)},
             {"upstream_key", UpstreamKeyOf(record)},
             {"why", "no status_path, and upstream_deduplicates is false"}});
  metrics_.CountUnknownOutcome(route_.name);
  Execution e;
  e.response = http::Problem(http::ProblemKind::kUpstreamOutcomeUnknown,
                             "an earlier forward of this request may have executed, and this "
                             "route can neither ask the upstream nor rely on it to deduplicate: "
                             "it is not forwarded again",
                             {.key_expires = record.expires_at});
  e.held = true;
  return e;
}

Timestamp ProxyOperation::Settled(const Record& record) const {
  const Timestamp sent = record.sent_at != Timestamp{} ? record.sent_at : record.updated_at;
  return sent + route_.timeout + margin_;
}

std::optional<Millis> ProxyOperation::Unsettled(const Record& record) const {
  const Timestamp settled = Settled(record);
  if (record.observed_at >= settled) return std::nullopt;
  return std::chrono::duration_cast<Millis>(settled - record.observed_at);
}

namespace {

// The status a status URL's 2xx reports for the answer it reports: kOriginalStatusHeader when
// sent (three digits, 200..599), else the 2xx itself; nullopt for a header that is none.
std::optional<int> OriginalStatus(const http::Response& answer) {
  const std::optional<std::string_view> header = answer.headers.Get(kOriginalStatusHeader);
  if (!header) return answer.status;
  if (answer.headers.Count(kOriginalStatusHeader) != 1 || header->size() != 3 ||
      !std::all_of(header->begin(), header->end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return std::nullopt;
  }
  const int status = std::stoi(std::string(*header));
  if (status < 200) return std::nullopt;
  return status;
}

}  // namespace

http::Async<std::optional<Execution>> ProxyOperation::AskStatus(const Ticket& ticket,
                                                                Millis timeout) {
  const std::string key = UpstreamKeyOf(ticket.record);
  std::string target = route_.status_path;
  target.replace(target.find("{key}"), 5, key);
  http::Request ask{"GET", std::move(target), {}, ""};
  ask.headers.Set(route_.forward_key_header, key);
  if (!route_.status_auth_header.empty()) {
    ask.headers.Set(route_.status_auth_header, route_.status_auth_value);
  }
  http::CallOptions options;
  options.timeout = timeout;
  options.connect_timeout = std::min(margin_, timeout);
  const SteadyTime sent = monotonic_.Now();
  Result<http::Response> answer = Usable(co_await upstream_.Call(std::move(ask), options));
  metrics_.ObserveUpstream(route_.name, monotonic_.SecondsSince(sent));
  // The status URL's own vocabulary, apart from the route's final_statuses (which are about the
  // request's answers): 404 never ran, a 2xx ran (and reports its answer), anything else cannot
  // tell.
  if (answer && answer->status == 404) co_return std::nullopt;
  const bool ran = answer && answer->status >= 200 && answer->status < 300;
  const std::optional<int> original = ran ? OriginalStatus(*answer) : std::nullopt;
  Execution e;
  if (!original) {
    const std::string why =
        !answer ? answer.error().message
        : ran   ? "a 2xx with an unusable " + std::string(kOriginalStatusHeader) + " header"
                : "it answered " + std::to_string(answer->status);
    const Record& record = ticket.record;
    if (record.observed_at >= Settled(record) + route_.status_unknown_max) {
      // Asked for long enough: the outcome stays unknown, and it is final. Nothing is forwarded
      // again; the operator finds the record by this line and the metric, and settles it.
      http::Log(http::LogLevel::kError, "gateway outcome unknown; no longer asking",
                {{"route", route_.name},
                 {"tenant", record.tenant},
                 {"user", record.user},
                 {"scope", ToHex(record.scope)},
                 {"upstream_key", key},
                 {"status_unknown_max_ms", route_.status_unknown_max.count()},
                 {"why", why}});
      metrics_.CountUnknownOutcome(route_.name);
      e.response = http::Problem(http::ProblemKind::kUpstreamOutcomeUnknown,
                                 "the upstream's status URL could not tell whether this request "
                                 "executed, and idemd no longer asks; it is not forwarded again",
                                 {.key_expires = record.expires_at});
      e.held = true;
      co_return e;
    }
    // About the question, not the request: the record stays as it is, and a later retry (or the
    // reconciler) asks again.
    http::Log(http::LogLevel::kWarn, "gateway status URL could not tell",
              {{"route", route_.name}, {"scope", ToHex(record.scope)}, {"why", why}});
    e.response = http::Problem(http::ProblemKind::kUpstreamUnavailable,
                               "the upstream's status URL could not tell whether an earlier "
                               "forward of this request executed; nothing was forwarded again. "
                               "Retry later",
                               {.key_expires = record.expires_at});
    e.outcome_unknown = true;
    co_return e;
  }
  // It ran, and this is what it answered: the outcome, classified as the route classifies the
  // upstream's answers.
  e.response = Kept(*answer);
  e.response.status = *original;
  e.recovery_point = std::string(kSettled);
  co_return e;
}

Execution ProxyOperation::Reconcile(Ticket& ticket, Engine&) {
  Execution e;
  const bool forwarded = ticket.record.recovery_point == kForwarded;
  if (forwarded && !route_.status_path.empty()) {
    if (Unsettled(ticket.record)) {
      e.outcome_unknown = true;  // not yet: a later pass asks
      return e;
    }
    std::optional<Execution> asked =
        http::RunSync(AskStatus(ticket, std::min(route_.timeout, kReconcileAskTimeout)));
    if (asked) return std::move(*asked);
  }
  if (forwarded && route_.status_path.empty() && !route_.upstream_deduplicates) {
    return HeldUnknown(ticket.record);
  }
  if (!forwarded || !route_.status_path.empty()) {
    // Never forwarded, or the status URL says it never ran: nothing happened upstream.
    e.response = http::Problem(http::ProblemKind::kUpstreamUnavailable,
                               "the request was not executed by the upstream; retry with the "
                               "same key to forward it",
                               {.key_expires = ticket.record.expires_at});
    e.recovery_point = std::string(kSettled);
  } else {
    e.response = http::Problem(http::ProblemKind::kUpstreamTimeout,
                               "the upstream's outcome is unknown; retry with the same key: the "
                               "request is forwarded again with the same upstream key",
                               {.key_expires = ticket.record.expires_at});
  }
  e.state = RecordState::kFailedRetryable;
  return e;
}

http::Async<http::Response> ProxyOperation::ForwardWithoutKey(const http::Request& request) {
  http::CallOptions options;
  options.timeout = route_.timeout;
  options.connect_timeout = margin_;
  const SteadyTime sent = monotonic_.Now();
  Result<http::Response> answer = Usable(co_await upstream_.Call(Upstream(request, ""), options));
  metrics_.ObserveUpstream(route_.name, monotonic_.SecondsSince(sent));
  if (answer) co_return Kept(*answer);
  co_return UpstreamFailure(route_.name, request.method, answer.error());
}

}  // namespace idem::idemd
