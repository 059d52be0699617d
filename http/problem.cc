// http/problem.cc — the problem table, the problem+json builder and Errc → ProblemKind.
#include "http/problem.h"

#include <boost/json.hpp>
#include <cstdio>
#include <cstdlib>

#include "http/log.h"

namespace idem::http {
namespace {

// Retry-After seconds and Idempotency-Key-Expires, spelled out in the table's rows.
constexpr int kNoRetry = 0;
constexpr int kRetry1s = 1;
constexpr bool kExpires = true;

[[noreturn]] void Unknown(const char* what, int value) {
  Log(LogLevel::kError, std::string("problem.cc: ") + std::to_string(value) + " is no " + what);
  std::abort();
}

}  // namespace

// The table: one case per kind and no default, so a kind without a row does not compile
// (-Wswitch). Every status an error answer of idem carries is written here and nowhere else.
ProblemSpec Spec(ProblemKind kind) {
  using K = ProblemKind;
  switch (kind) {
    // {status, type, title, Retry-After seconds, carries Idempotency-Key-Expires}
    case K::kMalformedRequest:
      return {400, "urn:idem:problem:malformed-request", "Bad Request"};
    case K::kPayloadTooLarge:
      return {413, "urn:idem:problem:payload-too-large", "Payload Too Large"};
    case K::kHeadersTooLarge:
      return {431, "urn:idem:problem:headers-too-large", "Request Header Fields Too Large"};
    case K::kUriTooLong:
      return {414, "urn:idem:problem:uri-too-long", "URI Too Long"};
    case K::kShuttingDown:
      return {503, "urn:idem:problem:shutting-down", "Service Unavailable", kRetry1s};
    case K::kOverloaded:
      return {503, "urn:idem:problem:overloaded", "Service Unavailable", kRetry1s};
    case K::kInternal:
      return {500, "urn:idem:problem:internal", "Internal Server Error"};

    case K::kInvalidRequest:
      return {400, "urn:idem:problem:invalid-request", "Bad Request"};
    case K::kMalformedJson:
      return {400, "urn:idem:problem:malformed-json", "Bad Request"};
    case K::kValidationFailed:
      return {400, "urn:idem:problem:validation-failed", "Bad Request"};
    case K::kUnsupportedMediaType:
      return {415, "urn:idem:problem:unsupported-media-type", "Unsupported Media Type"};
    case K::kUnauthorized:
      return {401, "urn:idem:problem:unauthorized", "Unauthorized"};
    case K::kMethodNotAllowed:
      return {405, "urn:idem:problem:method-not-allowed", "Method Not Allowed"};
    case K::kNotFound:
      return {404, "urn:idem:problem:not-found", "Not Found"};
    case K::kNotReady:
      return {503, "urn:idem:problem:not-ready", "Service Unavailable", kRetry1s};

    case K::kIdempotencyKeyReused:
      return {422, "urn:idem:problem:idempotency-key-reused", "Unprocessable Content", kNoRetry,
              kExpires};
    case K::kRequestInProgress:
      return {409, "urn:idem:problem:request-in-progress", "Conflict", kRetry1s, kExpires};
    case K::kQuotaExceeded:
      return {429, "urn:idem:problem:quota-exceeded", "Too Many Requests", kRetry1s};
    case K::kUnavailable:
      return {503, "urn:idem:problem:unavailable", "Service Unavailable", kRetry1s};
    case K::kTimeout:
      return {504, "urn:idem:problem:timeout", "Gateway Timeout"};
    case K::kAnswerTooLarge:
      return {502, "urn:idem:problem:answer-too-large", "Bad Gateway", kNoRetry, kExpires};
  }
  Unknown("ProblemKind", static_cast<int>(kind));
}

Response Problem(ProblemKind kind, std::string_view detail, const ProblemOptions& options) {
  return Problem(Spec(kind), detail, options);
}

Response Problem(const ProblemSpec& spec, std::string_view detail, const ProblemOptions& options) {
  const bool validation = spec.type == Spec(ProblemKind::kValidationFailed).type;
  // A caller that gives options its kind's row does not allow has a bug, but its request may come
  // from anyone: the bug is logged with the kind and answered 500, never an abort.
  const char* misfit = nullptr;
  if (options.retry_after_seconds &&
      (spec.retry_after_seconds == 0 || *options.retry_after_seconds <= 0)) {
    misfit = "a Retry-After the row does not carry, or one that is not positive";
  } else if (options.key_expires.has_value() != spec.key_expires) {
    misfit = spec.key_expires ? "no Idempotency-Key-Expires for a row that requires it"
                              : "an Idempotency-Key-Expires for a row that carries none";
  } else if (!options.errors.empty() && !validation) {
    misfit = "field errors for a kind other than validation-failed";
  }
  if (misfit != nullptr) {
    Log(LogLevel::kError, "problem options do not fit the kind (a bug)",
        {{"kind", spec.type}, {"why", misfit}, {"detail", detail}});
    return Problem(ProblemKind::kInternal, "unexpected failure");
  }

  boost::json::object body;
  body["type"] = spec.type;
  body["title"] = spec.title;
  body["status"] = spec.status;
  body["detail"] = detail;
  if (validation) {
    boost::json::array errors;
    for (const FieldError& e : options.errors) {
      errors.push_back(boost::json::object{{"field", e.field}, {"message", e.message}});
    }
    body["errors"] = std::move(errors);
  }
  Response r;
  r.status = spec.status;
  r.headers.Set("Content-Type", "application/problem+json");
  if (spec.retry_after_seconds > 0) {
    r.headers.Set("Retry-After",
                  std::to_string(options.retry_after_seconds.value_or(spec.retry_after_seconds)));
  }
  if (options.key_expires) {
    r.headers.Set("Idempotency-Key-Expires", HttpDate(ToUnixMillis(*options.key_expires)));
  }
  r.body = boost::json::serialize(body);
  return r;
}

ProblemKind ProblemKindFor(Errc code) {
  switch (code) {
    case Errc::kInvalidArgument:
      return ProblemKind::kInvalidRequest;
    case Errc::kTooLarge:
      return ProblemKind::kPayloadTooLarge;
    case Errc::kNotFound:
      return ProblemKind::kNotFound;
    case Errc::kFingerprintMismatch:
      return ProblemKind::kIdempotencyKeyReused;
    case Errc::kResourceExhausted:
      return ProblemKind::kQuotaExceeded;
    // A lost lease or a moved-on record is the store's business, not the client's: retry.
    case Errc::kUnavailable:
    case Errc::kFenced:
    case Errc::kConflict:
      return ProblemKind::kUnavailable;
    case Errc::kDeadlineExceeded:
      return ProblemKind::kTimeout;
    case Errc::kAlreadyExists:
    case Errc::kDataLoss:
    case Errc::kInternal:
      return ProblemKind::kInternal;
  }
  Unknown("Errc", static_cast<int>(code));
}

Response ProblemFor(const Error& error, std::optional<Timestamp> key_expires) {
  const ProblemKind kind = ProblemKindFor(error.code);
  // A dependency's own words (a store's host, its SQL, a timeout's statement) are for the log.
  if (kind == ProblemKind::kUnavailable || kind == ProblemKind::kTimeout) {
    Log(LogLevel::kWarn, "answered a dependency's failure",
        {{"code", ErrcName(error.code)}, {"error", error.message}});
    return Problem(kind, kind == ProblemKind::kUnavailable
                             ? "a dependency is busy or unreachable; try again shortly"
                             : "a deadline passed and the outcome may be unknown; retry with the "
                               "same key to learn it");
  }
  if (kind == ProblemKind::kInternal) return Problem(kind, "unexpected failure");
  ProblemOptions options;
  if (Spec(kind).key_expires) options.key_expires = key_expires;
  return Problem(kind, error.message, options);
}

}  // namespace idem::http
