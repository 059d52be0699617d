// server/idemd/gateway/forward.cc — the steps of a gateway forward.
#include "server/idemd/gateway/forward.h"

#include <algorithm>
#include <cctype>

#include "http/log.h"
#include "idem/failpoint.h"
#include "idem/record.h"
#include "server/idemd/problems.h"

namespace idem::idemd {
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
  if (status < 200 || status > 599) return std::nullopt;
  return status;
}

}  // namespace

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
  if (IDEM_REVERTED("upstream_key")) return ToHex(record.scope);
  // Records claimed before the key was fixed in the claim forwarded the scope's hex: they keep it.
  return record.resource_id.empty() ? ToHex(record.scope) : record.resource_id;
}

void LogUpstreamFailure(std::string_view route, std::string_view method, const Error& error) {
  http::Log(http::LogLevel::kWarn, "upstream gave no usable answer",
            {{"route", route},
             {"method", method},
             {"code", ErrcName(error.code)},
             {"why", error.message}});
}

ForwardSteps::ForwardSteps(const GatewayRoute& route, Metrics& metrics, Millis margin)
    : route_(route), metrics_(metrics), margin_(margin) {}

Resume ForwardSteps::Resuming(const Ticket& ticket) const {
  // An earlier forward may have executed: the upstream's status URL tells, when it has one, once
  // that forward can no longer be executing. Without one, only an upstream that deduplicates by
  // the forwarded key may get it again; for any other the unknown outcome is held.
  if (!ticket.resumed || ticket.record.recovery_point != kForwarded) return Resume::kForward;
  if (route_.status_path.empty()) {
    return route_.upstream_deduplicates ? Resume::kForward : Resume::kHold;
  }
  return Unsettled(ticket.record) ? Resume::kWait : Resume::kAsk;
}

std::optional<Millis> ForwardSteps::Unsettled(const Record& record) const {
  return UntilSettled(record, route_.timeout + margin_ + route_.late_execution);
}

http::Request ForwardSteps::Upstream(const http::Request& request,
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

http::CallOptions ForwardSteps::Options(std::optional<SteadyTime> advanced) const {
  http::CallOptions options;
  options.timeout = route_.timeout;
  options.connect_timeout = margin_;
  if (advanced) options.send_by = *advanced + margin_;
  return options;
}

http::Response ForwardSteps::Kept(const http::Response& answer) const {
  http::Response kept{answer.status, {}, answer.body};
  for (const std::string& name : route_.store_headers) {
    for (const auto& [field, value] : answer.headers.fields) {
      if (field == name) kept.headers.Add(field, value);
    }
  }
  return kept;
}

Execution ForwardSteps::AfterForward(const Ticket& ticket, std::string_view method,
                                     Result<http::Response> answer) const {
  // Answered, or not sent: the outcome is known, and a retry of a retryable one forwards again
  // without asking.
  const Timestamp expires = ticket.record.expires_at;
  if (answer && MayHaveActed(answer->status)) {
    // A failure answer is not proof of no work: a 500 may come from an upstream that acted and
    // then failed. Unknown, as after a timeout.
    http::Log(http::LogLevel::kWarn, "upstream failed; it may have acted",
              {{"route", route_.name}, {"method", method}, {"status", answer->status}});
    const std::string answered = "the upstream answered " + std::to_string(answer->status);
    // The same answer to a repeat of a forward whose outcome was unknown, from an upstream that
    // deduplicates by the key and has no status URL to ask: it answers every repeat so (as an
    // upstream that keeps its answers, 500s included, does), so forwarding again never ends.
    // The outcome stays unknown, for an operator, as HeldUnknown's.
    if (ticket.resumed && ticket.record.recovery_point == kForwarded &&
        route_.upstream_deduplicates && route_.status_path.empty()) {
      return HoldUnknown(ticket.record, "gateway outcome unknown; the upstream failed again",
                         {{"status", answer->status}},
                         answered +
                             " again to a repeat of a forward whose outcome was unknown, which "
                             "does not prove it did nothing; it is not forwarded again");
    }
    return UnknownAfterSend(ProductProblem::kUpstreamFailed,
                            answered + ", which does not prove it did nothing", expires);
  }
  if (answer) {
    Execution e = Execution::Answer(Kept(*answer));
    e.recovery_point = std::string(kSettled);
    return e;
  }
  // The transport's message names the upstream's address: for the log, not for the client.
  LogUpstreamFailure(route_.name, method, answer.error());
  if (answer.error().code == Errc::kUnavailable) {
    // Not sent: the upstream cannot have acted. Retryable at once.
    return Execution::Retryable(
        Problem(ProductProblem::kUpstreamUnavailable,
                "the upstream could not be reached and nothing was sent; retry with the "
                "same key",
                {.key_expires = expires}),
        kSettled);
  }
  return UnknownAfterSend(ProductProblem::kUpstreamTimeout,
                          "the upstream gave no usable answer in time", expires);
}

bool ForwardSteps::MayHaveActed(int status) const {
  if (status < 500 || status > 599 || IDEM_REVERTED("gateway_5xx")) return false;
  const auto listed = [status](const std::vector<int>& statuses) {
    return std::find(statuses.begin(), statuses.end(), status) != statuses.end();
  };
  return !listed(route_.final_statuses) && !listed(route_.nothing_done_statuses);
}

// Sent, and what came back proves nothing: the record stays PROCESSING at `forwarded`; a retry
// asks the status URL, or forwards again with the same upstream key and the upstream's own
// deduplication decides, or, on a route that has neither, gets the held unknown outcome
// (HeldUnknown).
Execution ForwardSteps::UnknownAfterSend(ProductProblem kind, const std::string& what,
                                         Timestamp expires) const {
  const bool again = !route_.status_path.empty() || route_.upstream_deduplicates;
  return Execution::Unknown(Problem(
      kind,
      what + (again ? "; it may have acted. Retry with the same key: the upstream is asked, or "
                      "the request is forwarded again with the same upstream key"
                    : "; it may have acted. It is not forwarded again: a retry with the same key "
                      "is answered 502 upstream-outcome-unknown"),
      {.key_expires = expires}));
}

http::Request ForwardSteps::StatusQuestion(const Record& record) const {
  const std::string key = UpstreamKeyOf(record);
  std::string target = route_.status_path;
  target.replace(target.find("{key}"), 5, key);
  http::Request ask{"GET", std::move(target), {}, ""};
  ask.headers.Set(route_.forward_key_header, key);
  if (!route_.status_auth_header.empty()) {
    ask.headers.Set(route_.status_auth_header, route_.status_auth_value);
  }
  return ask;
}

std::optional<Execution> ForwardSteps::FromStatus(const Ticket& ticket,
                                                  Result<http::Response> answer) const {
  // The status URL's own vocabulary, apart from the route's final_statuses (which are about the
  // request's answers): 404 never ran, a 2xx ran (and reports its answer), anything else cannot
  // tell.
  if (answer && answer->status == 404) return std::nullopt;
  if (IDEM_REVERTED("status_vocabulary") &&
      !(answer && answer->status >= 200 && answer->status < 300)) {
    return std::nullopt;
  }
  const bool ran = answer && answer->status >= 200 && answer->status < 300;
  const std::optional<int> original = ran ? OriginalStatus(*answer) : std::nullopt;
  const Record& record = ticket.record;
  if (!original) {
    const std::string why =
        !answer ? answer.error().message
        : ran   ? "a 2xx with an unusable " + std::string(kOriginalStatusHeader) + " header"
                : "it answered " + std::to_string(answer->status);
    if (!UntilSettled(
            record, route_.timeout + margin_ + route_.late_execution + route_.status_unknown_max)) {
      // Asked for long enough: the outcome stays unknown, and it is final. Nothing is forwarded
      // again; the operator finds the record by this line and the metric, and settles it.
      return HoldUnknown(
          record, "gateway outcome unknown; no longer asking",
          {{"status_unknown_max_ms", route_.status_unknown_max.count()}, {"why", why}},
          "the upstream's status URL could not tell whether this request executed, and idemd no "
          "longer asks; it is not forwarded again");
    }
    // About the question, not the request: the record stays as it is, and a later retry (or the
    // takeover loop) asks again.
    http::Log(http::LogLevel::kWarn, "gateway status URL could not tell",
              {{"route", route_.name}, {"scope", ToHex(record.scope)}, {"why", why}});
    return Execution::Unknown(Problem(
        ProductProblem::kUpstreamUnavailable,
        "the upstream's status URL could not tell whether an earlier forward of this request "
        "executed; nothing was forwarded again. Retry later",
        {.key_expires = record.expires_at}));
  }
  // It ran, and answered a failure that does not prove it did nothing: it must not run again,
  // and nobody can tell what it did. Held for an operator, as an outcome the status URL never
  // tells.
  if (MayHaveActed(*original)) {
    return HoldUnknown(record, "gateway outcome unknown; the upstream reports a failure",
                       {{"status", *original}},
                       "the upstream's status URL reports that this request executed and "
                       "answered " +
                           std::to_string(*original) +
                           ", which does not prove it did nothing; it is not forwarded again");
  }
  // It ran, and this is what it answered: the outcome, classified as the route classifies the
  // upstream's answers.
  Execution e = Execution::Answer(Kept(*answer));
  e.response.status = *original;
  e.recovery_point = std::string(kSettled);
  return e;
}

Execution ForwardSteps::HeldUnknown(const Record& record) const {
  return HoldUnknown(record, "gateway outcome unknown; not forwarded again",
                     {{"why", "no status_path, and upstream_deduplicates is false"}},
                     "an earlier forward of this request may have executed, and this route can "
                     "neither ask the upstream nor rely on it to deduplicate: it is not forwarded "
                     "again");
}

Execution ForwardSteps::HoldUnknown(const Record& record, std::string_view why,
                                    const boost::json::object& fields,
                                    const std::string& detail) const {
  boost::json::object line{{"route", route_.name},
                           {"tenant", record.tenant},
                           {"user", record.user},
                           {"scope", ToHex(record.scope)},
                           {"upstream_key", UpstreamKeyOf(record)}};
  for (const auto& field : fields) line.insert_or_assign(field.key(), field.value());
  http::Log(http::LogLevel::kError, why, line);
  metrics_.CountUnknownOutcome(route_.name);
  return Execution::Held(
      Problem(ProductProblem::kUpstreamOutcomeUnknown, detail, {.key_expires = record.expires_at}));
}

Execution ForwardSteps::Unanswered(const Ticket& ticket) const {
  const Timestamp expires = ticket.record.expires_at;
  const bool forwarded = ticket.record.recovery_point == kForwarded;
  if (!forwarded || !route_.status_path.empty()) {
    // Never forwarded, or the status URL says it never ran: nothing happened upstream.
    return Execution::Retryable(Problem(ProductProblem::kUpstreamUnavailable,
                                        "the request was not executed by the upstream; "
                                        "retry with the same key to forward it",
                                        {.key_expires = expires}),
                                kSettled);
  }
  return Execution::Retryable(
      Problem(ProductProblem::kUpstreamTimeout,
              "the upstream's outcome is unknown; retry with the same key: the request is "
              "forwarded again with the same upstream key",
              {.key_expires = expires}));
}

}  // namespace idem::idemd
