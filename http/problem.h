// http/problem.h — the HTTP problems of the HTTP layer, of requests and of the idempotency
// protocol, in one closed table, and the one function that builds application/problem+json
// (RFC 9457) responses from a row of it or of another table (idemd's products keep theirs in
// server/idemd/problems.h).
//
// A problem's status, type URI, title and headers come from its kind's row; callers add only the
// detail text and, where a row allows it, a computed Retry-After, the record's expiry or field
// errors.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "http/message.h"
#include "idem/clock.h"
#include "idem/result.h"

namespace idem::http {

// Every problem of the HTTP layer, of requests and of the protocol. Closed: each kind has exactly
// one row in the table (in problem.cc, a switch without a default: a kind without a row fails to
// compile with -Werror, and problem_test aborts on it), and clients depend on each row's type URI.
enum class ProblemKind : uint8_t {
  // The HTTP layer, before any handler runs (or when it fails).
  kMalformedRequest,  // the bytes are not HTTP/1.1
  kPayloadTooLarge,   // the body is over the limit
  kHeadersTooLarge,   // the header section is over the limit
  kUriTooLong,        // the request line alone is over the header limit
  kShuttingDown,      // the server is draining
  kOverloaded,        // too many requests at once
  kInternal,          // a bug or an environment failure; never names its cause

  // The request as a whole.
  kInvalidRequest,        // a malformed Idempotency-Key, header or parameter
  kMalformedJson,         // the body is not JSON
  kValidationFailed,      // the body is JSON but fails validation; lists the field errors
  kUnsupportedMediaType,  // the body is not application/json
  kUnauthorized,          // no or an unknown API key
  kMethodNotAllowed,      // the route exists, the method does not
  kNotFound,              // no such route or resource (or the caller may not know of it)
  kNotReady,              // the store is unreachable (/readyz)

  // The idempotency protocol.
  kIdempotencyKeyReused,  // the key was used for a different request
  kRequestInProgress,     // the key's first request is still running
  kQuotaExceeded,         // too many running or retained keys for the principal
  kUnavailable,           // the store is busy or unreachable; retry
  kTimeout,               // a deadline passed; the outcome may be unknown
  kAnswerTooLarge,        // executed, but its answer is too large to keep: final, replayed

  kLast = kAnswerTooLarge,  // keep naming the last kind: tests walk every kind up to it
};

// One row of the problem table. Value type.
struct ProblemSpec {
  int status = 0;
  std::string_view type;   // "urn:idem:problem:<slug>", stable for clients
  std::string_view title;  // the status's reason phrase
  // Seconds of Retry-After that answers of this kind carry by default; 0: they carry none.
  int retry_after_seconds = 0;
  // Answers of this kind are about a record that was found or created, so they carry
  // Idempotency-Key-Expires (docs/idemd.md: every such answer does). Kinds without this flag may
  // still end an execution; the idempotency filter stamps every answer of an execution.
  bool key_expires = false;
};

// The row of `kind`. Aborts for a value that is no ProblemKind (a programmer error).
ProblemSpec Spec(ProblemKind kind);

// One field that failed validation. `field` is the member's name, "" for the body as a whole.
struct FieldError {
  std::string field;
  std::string message;
};

// What a caller may add to its kind's row.
struct ProblemOptions {
  // Replaces the row's Retry-After seconds (e.g. the engine's estimate of a running lease).
  // Only for kinds whose row carries Retry-After; must be positive.
  std::optional<int> retry_after_seconds = std::nullopt;
  // Until when the record's key is recognised. Required for kinds whose row has key_expires,
  // refused for the others.
  std::optional<Timestamp> key_expires = std::nullopt;
  // kValidationFailed only: the body's `errors` member, in this order.
  std::vector<FieldError> errors = {};
};

// The answer of `kind`: the row's status, Content-Type application/problem+json, Retry-After and
// Idempotency-Key-Expires as the row says, and the body
// {"type","title","status","detail"} (then "errors":[{"field","message"},...] for
// kValidationFailed, always present there). Options the row does not allow are programmer errors,
// but the request may be anyone's: they are logged (error level, with the kind) and answered 500
// kInternal ("unexpected failure"), never an abort.
Response Problem(ProblemKind kind, std::string_view detail, const ProblemOptions& options = {});

// The same, for a row of another closed table (server/idemd/problems.h). Field errors are only
// for kValidationFailed's row.
Response Problem(const ProblemSpec& spec, std::string_view detail,
                 const ProblemOptions& options = {});

// The kind that answers a libidem error. Exhaustive over Errc.
ProblemKind ProblemKindFor(Errc code);

// The answer to a libidem error: ProblemKindFor's kind with the error's message as detail, except
// kUnavailable ("try again shortly: " + message) and kInternal (a fixed "unexpected failure":
// internal messages are not for clients). `key_expires` is the expiry of the record the error is
// about (Engine::Start reports it with kFingerprintMismatch); kinds whose row carries
// Idempotency-Key-Expires require it (leaving it out is a programmer error, answered as Problem
// answers one: a logged 500), the others ignore it.
Response ProblemFor(const Error& error, std::optional<Timestamp> key_expires = std::nullopt);

}  // namespace idem::http
