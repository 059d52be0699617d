// src/core/inbox.cc — a queue consumer's messages through the engine (include/idem/inbox.h).
#include "idem/inbox.h"

#include <algorithm>
#include <array>
#include <boost/json.hpp>
#include <exception>

#include "idem/key.h"

namespace idem {
namespace {

// The method of every message's request: a message is fingerprinted as the body of a request of
// its consumer's route, and never as one of an HTTP route (their routes differ anyway).
constexpr std::string_view kMessageMethod = "MESSAGE";
// The route ids of inboxes: "inbox.<name>".
constexpr std::string_view kRoutePrefix = "inbox.";

// The message key as an RFC 8941 sf-string, which ParseIdempotencyKey decodes to exactly the key:
// no white space trimmed, a leading quote kept. A key with a byte an sf-string cannot hold (a
// control character, non-ASCII) fails to parse, and the message is invalid.
std::string SfString(std::string_view key) {
  std::string out;
  out.reserve(key.size() + 2);
  out.push_back('"');
  for (char c : key) {
    if (c == '"' || c == '\\') out.push_back('\\');
    out.push_back(c);
  }
  out.push_back('"');
  return out;
}

// What a handler's result is kept as: a 200 answer whose body is the result.
StoredResponse ResultAnswer(std::string result) {
  return StoredResponse{200, {}, std::move(result)};
}

InboxOutcome Failed(const InboxMessage& message, Error error) {
  InboxOutcome outcome;
  outcome.kind = InboxOutcome::Kind::kFailed;
  outcome.key = message.key;
  outcome.error = std::move(error);
  return outcome;
}

// The outcome of a message from the engine's decision on it.
InboxOutcome OutcomeOf(const InboxMessage& message, Result<Decision> decided) {
  if (!decided) {
    Error error = std::move(decided).error();
    InboxOutcome outcome = Failed(message, error);
    if (error.code == Errc::kFingerprintMismatch) {
      outcome.kind = InboxOutcome::Kind::kMismatch;
    } else if (error.code == Errc::kInvalidArgument || error.code == Errc::kTooLarge) {
      // The engine refused the message's key or payload before anything ran: it never will.
      outcome.kind = InboxOutcome::Kind::kInvalid;
    }
    return outcome;
  }
  InboxOutcome outcome;
  outcome.key = message.key;
  outcome.key_expires = decided->key_expires;
  switch (decided->kind) {
    case Decision::Kind::kExecute:
      outcome.kind = InboxOutcome::Kind::kExecuted;
      outcome.result = std::move(decided->response.body);
      outcome.resumed = decided->ticket.resumed;
      break;
    case Decision::Kind::kReplay:
      outcome.kind = InboxOutcome::Kind::kDuplicate;
      outcome.result = std::move(decided->response.body);
      break;
    case Decision::Kind::kInProgress:
      outcome.kind = InboxOutcome::Kind::kInProgress;
      outcome.retry_after = decided->retry_after;
      break;
  }
  return outcome;
}

// Fixes the operation's downstream keys in its first claim, as the record's resource id
// (OperationKeyOf). A resume (a takeover, a retry) keeps it; a record claimed afresh after it
// expired has none (the store clears it), so a new operation with the same message key never
// sends an earlier operation's keys.
Status FixOperationKey(StoreTxn& txn, const Record& record) {
  if (!record.resource_id.empty()) return Ok();
  return txn.Advance(record.scope, record.lease, record.recovery_point, OperationKeyOf(record));
}

Result<std::string> RunCallHandler(const InboxCallHandler& handler, InboxCall& call) {
  try {
    return handler(call);
  } catch (const std::exception& e) {
    return MakeError(Errc::kInternal, std::string("inbox handler threw: ") + e.what());
  } catch (...) {
    return MakeError(Errc::kInternal, "inbox handler threw");
  }
}

}  // namespace

std::string_view InboxOutcomeName(InboxOutcome::Kind kind) {
  switch (kind) {
    case InboxOutcome::Kind::kExecuted:
      return "executed";
    case InboxOutcome::Kind::kDuplicate:
      return "duplicate";
    case InboxOutcome::Kind::kMismatch:
      return "mismatch";
    case InboxOutcome::Kind::kInvalid:
      return "invalid";
    case InboxOutcome::Kind::kInProgress:
      return "in_progress";
    case InboxOutcome::Kind::kFailed:
      return "failed";
  }
  return "unknown";
}

KeyPolicy InboxPolicy::BusinessKeyPolicy() {
  KeyPolicy policy;
  policy.min_length = 1;
  policy.max_length = limits::kKeyMaxLength;
  policy.allowed.reset();
  for (int c = 0x21; c <= 0x7e; ++c) policy.allowed.set(static_cast<std::size_t>(c));
  return policy;
}

InboxPolicy InboxPolicy::For(std::string group, std::string name) {
  InboxPolicy policy;
  policy.group = std::move(group);
  policy.name = std::move(name);
  return policy;
}

InboxMessage InboxMessage::Keyed(std::string key, std::string payload, std::string content_type) {
  InboxMessage message;
  message.key = std::move(key);
  message.payload = std::move(payload);
  message.content_type = std::move(content_type);
  return message;
}

Result<InboxMessage> InboxMessage::KeyedByHeader(std::optional<std::string_view> value,
                                                 std::string payload, std::string content_type) {
  if (!value || value->empty()) {
    return MakeError(Errc::kInvalidArgument, "the message has no key header");
  }
  return Keyed(std::string(*value), std::move(payload), std::move(content_type));
}

Result<InboxMessage> InboxMessage::KeyedByJson(std::string payload, std::string_view pointer,
                                               std::string content_type) {
  boost::system::error_code ec;
  const boost::json::value json = boost::json::parse(payload, ec);
  if (ec) {
    return MakeError(Errc::kInvalidArgument, "the message's payload is not JSON (" + ec.message() +
                                                 "), so it has no key at " + std::string(pointer));
  }
  const boost::json::value* member = json.find_pointer(pointer, ec);
  if (member == nullptr || ec) {
    return MakeError(Errc::kInvalidArgument,
                     "the message's payload has no JSON member " + std::string(pointer));
  }
  std::string key;
  if (member->is_string()) {
    key = member->as_string();
  } else if (member->is_int64() || member->is_uint64()) {
    key = boost::json::serialize(*member);
  } else {
    return MakeError(Errc::kInvalidArgument, "the JSON member " + std::string(pointer) +
                                                 " (the message key) is neither a string nor an "
                                                 "integer");
  }
  return Keyed(std::move(key), std::move(payload), std::move(content_type));
}

InboxMessage InboxMessage::KeyedByBrokerId(std::string broker_id, std::string payload,
                                           std::string content_type) {
  return Keyed(std::move(broker_id), std::move(payload), std::move(content_type));
}

Status InboxCall::BeforeCall(std::string_view step, Millis must_cover) {
  if (step.empty() || step == "done" || step == kOutcomeUnknownPoint ||
      step == kOperatorSettledPoint) {
    return MakeError(Errc::kInvalidArgument,
                     "a call's step needs a name of its own, not '" + std::string(step) + "'");
  }
  return engine_.AdvanceBeforeCall(ticket_, step, must_cover);
}

std::string InboxCall::DownstreamKey(std::string_view step) const {
  // The operation's key (FixOperationKey) and the step, separated as a scope's parts are.
  const std::string& operation = ticket_.record.resource_id;
  std::string input = operation.empty() ? ToHex(ticket_.scope) : operation;
  input.push_back('\x1f');
  input.append(step);
  return ToHex(Sha256({input}));
}

Status InboxCall::Renew() { return engine_.Renew(ticket_); }

Result<Inbox> Inbox::Create(Engine& engine, const InboxPolicy& policy) {
  if (policy.group.empty() || policy.name.empty()) {
    return MakeError(Errc::kInvalidArgument, "inbox: the consumer group and name are required");
  }
  RoutePolicy route;
  route.route = std::string(kRoutePrefix) + policy.name;
  // The scope's own checks (non-empty, bounded, no 0x1f), on a key that is certainly valid.
  if (auto scope = Scope{policy.tenant, policy.group, route.route, "k"}.Hash(); !scope) {
    return MakeError(Errc::kInvalidArgument, "inbox: " + scope.error().message);
  }
  if (policy.key_policy.min_length < 1 ||
      policy.key_policy.max_length < policy.key_policy.min_length) {
    return MakeError(Errc::kInvalidArgument,
                     "inbox: a key must be at least 1 character and the maximum at least that");
  }
  if (policy.lease <= Millis(0) || policy.retention <= policy.lease) {
    return MakeError(Errc::kInvalidArgument,
                     "inbox: the lease must be positive and the retention longer than it");
  }
  if (policy.max_result_bytes == 0 || policy.max_result_bytes > limits::kSealedResponseCeiling) {
    return MakeError(Errc::kInvalidArgument, "inbox: max_result_bytes must be between 1 and " +
                                                 std::to_string(limits::kSealedResponseCeiling));
  }
  route.key_policy = policy.key_policy;
  route.rules = policy.rules;
  route.lease = policy.lease;
  route.retention = policy.retention;
  route.max_processing = policy.max_processing;
  route.max_retained = policy.max_retained;
  route.max_response_bytes = policy.max_result_bytes;
  Principal principal;
  principal.tenant = policy.tenant;
  principal.user = policy.group;
  return Inbox(engine, std::move(route), std::move(principal));
}

Request Inbox::RequestOf(const InboxMessage& message, std::string& key_header) const {
  key_header = SfString(message.key);
  Request request;
  request.principal = principal_;
  request.key_header = key_header;
  request.method = kMessageMethod;
  request.content_type = message.content_type;
  request.body = message.payload;
  return request;
}

InboxOutcome Inbox::Process(const InboxMessage& message, const InboxHandler& handler) const {
  return std::move(ProcessBatch(std::span<const InboxMessage>(&message, 1), handler).front());
}

std::vector<InboxOutcome> Inbox::ProcessBatch(std::span<const InboxMessage> messages,
                                              const InboxHandler& handler) const {
  std::vector<InboxOutcome> outcomes;
  outcomes.reserve(messages.size());
  if (messages.empty()) return outcomes;
  std::vector<std::string> key_headers(messages.size());  // sized once: requests view them
  std::vector<Request> requests;
  requests.reserve(messages.size());
  for (std::size_t i = 0; i < messages.size(); ++i) {
    requests.push_back(RequestOf(messages[i], key_headers[i]));
  }
  const TxnOperation operation = [&](std::size_t index, StoreTxn& txn,
                                     const Ticket& ticket) -> Result<StoredResponse> {
    InboxTxn business(txn, messages[index], messages[index].key, ticket.resumed);
    IDEM_ASSIGN_OR_RETURN(std::string result, handler(business));
    return ResultAnswer(std::move(result));
  };
  Result<std::vector<Result<Decision>>> decided =
      engine_->ExecuteInTxn(route_, requests, operation);
  if (decided) {
    for (std::size_t i = 0; i < messages.size(); ++i) {
      outcomes.push_back(OutcomeOf(messages[i], std::move((*decided)[i])));
    }
    return outcomes;
  }
  if (messages.size() == 1) {
    outcomes.push_back(Failed(messages[0], std::move(decided).error()));
    return outcomes;
  }
  // The batch rolled back as a whole: each message on its own, so only what fails fails. (After
  // a commit whose outcome is unknown, kDeadlineExceeded, a message the batch did commit is
  // found finished, and reported as a duplicate.)
  for (const InboxMessage& message : messages) outcomes.push_back(Process(message, handler));
  return outcomes;
}

InboxOutcome Inbox::ProcessWithCalls(const InboxMessage& message,
                                     const InboxCallHandler& handler) const {
  std::string key_header;
  const Request request = RequestOf(message, key_header);
  Result<Decision> started = engine_->Start(route_, request, FixOperationKey);
  if (!started || started->kind != Decision::Kind::kExecute) {
    return OutcomeOf(message, std::move(started));
  }
  Ticket& ticket = started->ticket;
  InboxCall call(*engine_, ticket, message, message.key);
  Result<std::string> result = RunCallHandler(handler, call);
  if (!result) {
    // The calls' outcome is not known here: the record stays PROCESSING at its recovery point,
    // and the next delivery takes it over at once and asks the downstream first.
    Error error = std::move(result).error();
    if (Status released = engine_->Release(ticket); !released) {
      error.message +=
          " (the lease was not released: " + released.error().message + "; it runs out by itself)";
    }
    return Failed(message, std::move(error));
  }
  TxnHook writes;
  if (!call.at_finish_.empty()) {
    writes = [&](StoreTxn& txn, const Record&) -> Status {
      InboxTxn business(txn, message, message.key, ticket.resumed);
      for (const auto& write : call.at_finish_) IDEM_RETURN_IF_ERROR(write(business));
      return Ok();
    };
  }
  StoredResponse answer = ResultAnswer(std::move(*result));
  if (Status finished = engine_->Finish(ticket, RecordState::kSucceeded, answer, writes);
      !finished) {
    // Nothing was written (kDeadlineExceeded: perhaps it was). Fenced, the consumer that took the
    // message over finishes it; otherwise the next delivery takes it over.
    if (finished.error().code != Errc::kFenced) (void)engine_->Release(ticket);
    return Failed(message, std::move(finished).error());
  }
  InboxOutcome outcome;
  outcome.kind = InboxOutcome::Kind::kExecuted;
  outcome.key = message.key;
  outcome.result = std::move(answer.body);
  outcome.resumed = ticket.resumed;
  outcome.key_expires = started->key_expires;
  return outcome;
}

Result<std::optional<FoundRecord>> Inbox::Lookup(std::string_view key) const {
  return engine_->Lookup(principal_, route_, SfString(key));
}

}  // namespace idem
