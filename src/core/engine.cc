// src/core/engine.cc — the protocol steps of docs/design.md over the Store interface.
#include "idem/engine.h"

#include <openssl/crypto.h>

#include <algorithm>
#include <exception>
#include <tuple>

#include "idem/failpoint.h"

namespace idem {

Engine::Engine(Store& store, const Fingerprinter& fingerprinter, const Sealer& sealer, Clock& clock,
               InFlightMarkers* markers)
    : store_(store),
      fingerprinter_(fingerprinter),
      sealer_(sealer),
      clock_(clock),
      markers_(markers) {}

namespace {

// Claims made in one transaction when the record keeps vanishing under the sweeper.
constexpr int kClaimAttempts = 3;

// Runs caller code inside a transaction. A hook that throws is reported as kInternal, so no
// exception crosses the engine and the transaction rolls back.
Status RunHook(const TxnHook& hook, StoreTxn& txn, const Record& record) {
  try {
    return hook(txn, record);
  } catch (const std::exception& e) {
    return MakeError(Errc::kInternal, std::string("transaction hook threw: ") + e.what());
  } catch (...) {
    return MakeError(Errc::kInternal, "transaction hook threw");
  }
}

const CanonicalRules* RulesOfVersion(const RoutePolicy& policy, uint32_t version) {
  if (policy.rules.version == version) return &policy.rules;
  for (const CanonicalRules& r : policy.previous_rules) {
    if (r.version == version) return &r;
  }
  return nullptr;
}

RequestFacts FactsOf(const RoutePolicy& policy, const Request& request) {
  return RequestFacts{request.method,      policy.route, request.content_type,
                      request.api_version, request.body, request.principal.user,
                      request.target};
}

// Whether `stored` fingerprints this request, under the rules and secret that made it.
Status VerifySameRequest(const RoutePolicy& policy, const Request& request,
                         const CanonicalRequest& current, const Fingerprinter& fingerprinter,
                         const Fingerprint& stored) {
  const CanonicalRequest* canonical = &current;
  CanonicalRequest older;
  if (stored.rules_version != current.rules_version) {
    const CanonicalRules* rules = RulesOfVersion(policy, stored.rules_version);
    if (rules == nullptr) {
      return MakeError(Errc::kDataLoss, "record made under canonical rules v" +
                                            std::to_string(stored.rules_version) +
                                            ", which are no longer configured");
    }
    IDEM_ASSIGN_OR_RETURN(older, MakeCanonicalRequest(FactsOf(policy, request), *rules));
    canonical = &older;
  }
  IDEM_ASSIGN_OR_RETURN(bool same, fingerprinter.Verify(*canonical, stored));
  if (!same) {
    return MakeError(Errc::kFingerprintMismatch,
                     "this Idempotency-Key was already used with a different request");
  }
  return Ok();
}

// VerifySameRequest against `record`; on a mismatch, reports the record's expiry to the caller
// of Engine::Start.
Status VerifyRecord(const RoutePolicy& policy, const Request& request,
                    const CanonicalRequest& current, const Fingerprinter& fingerprinter,
                    const Record& record, Timestamp* mismatch_expires) {
  Status same = VerifySameRequest(policy, request, current, fingerprinter, record.fingerprint);
  if (!same && same.error().code == Errc::kFingerprintMismatch && mismatch_expires != nullptr) {
    *mismatch_expires = record.expires_at;
  }
  return same;
}

// Whether a snapshot read of `seen` decides the request without the claim's write transaction:
// a finished, unexpired record never changes again, and while a live lease holds a PROCESSING
// record the claim could only answer "in progress" too. (By the store's clock, as the claim's.)
bool DecidedByRead(const Record& seen) {
  if (IsReplayable(seen.state)) return seen.expires_at > seen.observed_at;
  return seen.state == RecordState::kProcessing && seen.lease.until >= seen.observed_at;
}

// The answer for a duplicate of the operation `record` is running: retry after what is left of
// its lease, at most policy.retry_after.
Decision InProgress(const RoutePolicy& policy, Decision decision, Record record) {
  decision.kind = Decision::Kind::kInProgress;
  decision.retry_after =
      std::clamp(std::chrono::duration_cast<Millis>(record.lease.until - record.observed_at),
                 Millis(1), policy.retry_after);
  decision.key_expires = record.expires_at;
  decision.record = std::move(record);
  return decision;
}

// What Start and ExecuteInTxn make of a request before any store is asked: the parsed key, the
// scope's hash and the canonical request under the route's current rules.
struct Prepared {
  std::string key;
  ScopeHash hash{};
  CanonicalRequest canonical;
};

Result<Prepared> Prepare(const RoutePolicy& policy, const Request& request) {
  if (!request.key_header) {
    return MakeError(Errc::kInvalidArgument, "the Idempotency-Key header is required");
  }
  Prepared prepared;
  IDEM_ASSIGN_OR_RETURN(prepared.key, ParseIdempotencyKey(*request.key_header, policy.key_policy));
  const Scope scope{request.principal.tenant, request.principal.user, policy.route, prepared.key};
  IDEM_ASSIGN_OR_RETURN(prepared.hash, scope.Hash());
  if (request.canonical != nullptr) {
    prepared.canonical = *request.canonical;
  } else {
    IDEM_ASSIGN_OR_RETURN(prepared.canonical, Engine::Canonical(policy, request));
  }
  return prepared;
}

ClaimSpec SpecOf(const RoutePolicy& policy, const Request& request, const Prepared& prepared,
                 const Fingerprinter& fingerprinter) {
  return ClaimSpec{prepared.hash,
                   request.principal.tenant,
                   request.principal.user,
                   policy.route,
                   fingerprinter.Sign(prepared.canonical),
                   policy.lease,
                   policy.retention};
}

// What the claim of step 5 found inside a transaction (ClaimIn): the record claimed for this
// request, or the record that decides it without a claim.
struct TxnClaim {
  // This request holds record.lease; resumed and resumed_from say from what.
  bool claimed = false;
  Record record;
  bool resumed = false;
  RecordState resumed_from = RecordState::kProcessing;
  // Not claimed: the error the request gets from what the transaction read (a mismatch, or a
  // record that failed to verify). Otherwise `record` is finished (a replay) or runs under a
  // live lease (in progress).
  std::optional<Error> refused;
};

// Step 5 inside `txn`: claims the request's record, or finds the record that decides it. Nothing
// found here is an answer until `txn` has committed: a store that commits transactions in groups
// (SQLite) shows a transaction the writes of the group's earlier members, and commits them with
// its own Commit, or fails it. Errors: the store's (the transaction must then be dropped).
Result<TxnClaim> ClaimIn(StoreTxn& txn, const RoutePolicy& policy, const Request& request,
                         const ClaimSpec& spec, const CanonicalRequest& canonical,
                         const Fingerprinter& fingerprinter, Timestamp* mismatch_expires) {
  TxnClaim found;
  // A record read here can be gone by the reclaim: a sweeper on another connection deleted it
  // as expired (PostgreSQL orders nothing between the two statements). Nothing is left to resume
  // then, so the claim is made again, and a retry that races the sweeper executes or meets the
  // request that claimed first — it never answers "not found".
  for (int attempt = 1;; ++attempt) {
    IDEM_ASSIGN_OR_RETURN(ClaimResult claim, txn.Claim(spec));
    found.record = std::move(claim.record);
    if (claim.claimed) {
      found.claimed = true;
      return found;
    }
    // By the store's clock, as the reclaim's own conditions are.
    const Timestamp now = found.record.observed_at;
    // Past retention a finished operation is forgotten and this is a new one. (An unresolved
    // PROCESSING record is never forgotten; it is decided below like a live one.)
    const bool forgotten =
        found.record.expires_at <= now && found.record.state != RecordState::kProcessing;
    if (!forgotten) {
      if (Status verified = VerifyRecord(policy, request, canonical, fingerprinter, found.record,
                                         mismatch_expires);
          !verified) {
        found.refused = std::move(verified).error();
        return found;
      }
      if (IsReplayable(found.record.state)) return found;
      if (found.record.state == RecordState::kProcessing && found.record.lease.until >= now) {
        return found;
      }
    }
    // A new operation on a forgotten record; or a retry after a retryable failure, or a takeover
    // of an expired lease.
    const RecordState seen_state = found.record.state;
    Result<Record> reclaimed = txn.Reclaim(spec, found.record.lease.fence);
    if (reclaimed) {
      found.claimed = true;
      found.resumed_from = forgotten ? RecordState::kProcessing : seen_state;
      found.record = std::move(*reclaimed);
      found.resumed = !forgotten;
      return found;
    }
    if (reclaimed.error().code != Errc::kNotFound || attempt == kClaimAttempts) {
      return std::move(reclaimed).error();
    }
  }
}

// The ticket of a claim ClaimIn made.
Ticket TicketOf(const RoutePolicy& policy, const ClaimSpec& spec, const TxnClaim& claim) {
  return Ticket{spec.scope,     claim.record.lease,        claim.record,
                claim.resumed,  claim.resumed_from,        std::nullopt,
                spec.lease_ttl, policy.max_response_bytes, policy.retention};
}

// Runs an operation of ExecuteInTxn inside its transaction; one that throws is reported as
// kInternal, as RunHook reports a hook that throws.
Result<StoredResponse> RunOperation(const TxnOperation& operation, std::size_t index, StoreTxn& txn,
                                    const Ticket& ticket) {
  try {
    return operation(index, txn, ticket);
  } catch (const std::exception& e) {
    return MakeError(Errc::kInternal, std::string("operation threw: ") + e.what());
  } catch (...) {
    return MakeError(Errc::kInternal, "operation threw");
  }
}

}  // namespace

Result<CanonicalRequest> Engine::Canonical(const RoutePolicy& policy, const Request& request) {
  return MakeCanonicalRequest(FactsOf(policy, request), policy.rules);
}

Result<Decision> Engine::Start(const RoutePolicy& policy, const Request& request,
                               const TxnHook& on_claim, Timestamp* mismatch_expires,
                               bool read_first) {
  IDEM_ASSIGN_OR_RETURN(Prepared prepared, Prepare(policy, request));
  const ScopeHash& hash = prepared.hash;
  const CanonicalRequest& canonical = prepared.canonical;
  Decision decision;
  decision.key = prepared.key;

  // A finished record, or one a live lease holds, is answered from a snapshot read, without
  // taking the write lock (DecidedByRead).
  if (read_first) {
    IDEM_ASSIGN_OR_RETURN(std::optional<Record> seen, store_.Read(hash));
    if (seen && DecidedByRead(*seen)) {
      return AnswerRead(policy, request, canonical, hash, std::move(decision), std::move(*seen),
                        mismatch_expires);
    }
  }

  const ClaimSpec spec = SpecOf(policy, request, prepared, fingerprinter_);

  // In-flight markers may turn an obvious concurrent duplicate away before the database: same
  // fingerprint, live marker → a retryable "in progress". Anything else goes to the database.
  Placement placed;
  if (markers_ != nullptr) {
    placed = markers_->Place(hash, InFlight{spec.fingerprint, clock_.Now() + policy.retention},
                             policy.lease);
    if (const std::optional<InFlight>& other = placed.held) {
      const bool same_request =
          other->fingerprint.secret_id == spec.fingerprint.secret_id &&
          other->fingerprint.rules_version == spec.fingerprint.rules_version &&
          CRYPTO_memcmp(other->fingerprint.mac.data(), spec.fingerprint.mac.data(), 32) == 0;
      if (same_request && other->lease_left > Millis(0)) {
        decision.kind = Decision::Kind::kInProgress;
        decision.retry_after = std::clamp(other->lease_left, Millis(1), policy.retry_after);
        decision.key_expires = other->expires_at;
        decision.record.scope = hash;
        return decision;
      }
    }
    // The marker is placed, the claim not yet made: two stores written one after the other, so
    // a crash here leaves a marker without a record, which only its ttl (the lease) removes.
    if (placed.token) {
      if (Status fp = IDEM_FAILPOINT("cache_after_marker"); !fp) {
        ReleaseMarker(hash, placed.token);
        return std::move(fp).error();
      }
    }
  }
  auto decided =
      ClaimInTxn(policy, request, spec, canonical, std::move(decision), on_claim, mismatch_expires);
  // An execution keeps the marker this request placed; every other outcome removes it (and only
  // it: a marker held by another request stays), so later requests get through.
  if (decided && decided->kind == Decision::Kind::kExecute) {
    decided->ticket.marker = std::move(placed.token);
  } else {
    ReleaseMarker(hash, placed.token);
  }
  return decided;
}

Result<std::optional<Decision>> Engine::ReplayFromMemory(const RoutePolicy& policy,
                                                         const Request& request,
                                                         Timestamp* mismatch_expires) {
  return ReplayOf(policy, request, mismatch_expires,
                  [&](const ScopeHash& scope) -> Result<std::optional<Record>> {
                    return store_.ReadCached(scope);
                  });
}

Result<std::optional<Decision>> Engine::ReplayFromStore(const RoutePolicy& policy,
                                                        const Request& request,
                                                        Timestamp* mismatch_expires) {
  return ReplayOf(policy, request, mismatch_expires,
                  [&](const ScopeHash& scope) { return store_.Read(scope); });
}

Result<std::optional<Decision>> Engine::ReplayOf(
    const RoutePolicy& policy, const Request& request, Timestamp* mismatch_expires,
    const std::function<Result<std::optional<Record>>(const ScopeHash&)>& read) {
  if (!request.key_header) return std::optional<Decision>();  // Start says what is wrong
  auto key = ParseIdempotencyKey(*request.key_header, policy.key_policy);
  if (!key) return std::optional<Decision>();
  const Scope scope{request.principal.tenant, request.principal.user, policy.route, *key};
  auto hash = scope.Hash();
  if (!hash) return std::optional<Decision>();
  IDEM_ASSIGN_OR_RETURN(std::optional<Record> held, read(*hash));
  if (!held || !DecidedByRead(*held)) return std::optional<Decision>();
  CanonicalRequest made;
  if (request.canonical == nullptr) {
    IDEM_ASSIGN_OR_RETURN(made, Canonical(policy, request));
  }
  const CanonicalRequest& canonical = request.canonical != nullptr ? *request.canonical : made;
  Decision decision;
  decision.key = std::move(*key);
  IDEM_ASSIGN_OR_RETURN(Decision answer,
                        AnswerRead(policy, request, canonical, *hash, std::move(decision),
                                   std::move(*held), mismatch_expires));
  return std::optional<Decision>(std::move(answer));
}

Result<Decision> Engine::AnswerRead(const RoutePolicy& policy, const Request& request,
                                    const CanonicalRequest& canonical, const ScopeHash& scope,
                                    Decision decision, Record seen, Timestamp* mismatch_expires) {
  IDEM_RETURN_IF_ERROR(
      VerifyRecord(policy, request, canonical, fingerprinter_, seen, mismatch_expires));
  if (!IsReplayable(seen.state)) return InProgress(policy, std::move(decision), std::move(seen));
  decision.record = std::move(seen);
  return Replay(scope, std::move(decision));
}

void Engine::ReleaseMarker(const ScopeHash& scope, const std::optional<MarkerToken>& token) {
  if (markers_ != nullptr && token) markers_->Release(scope, *token);
}

Result<Decision> Engine::ClaimInTxn(const RoutePolicy& policy, const Request& request,
                                    const ClaimSpec& spec, const CanonicalRequest& canonical,
                                    Decision decision, const TxnHook& on_claim,
                                    Timestamp* mismatch_expires) {
  IDEM_ASSIGN_OR_RETURN(std::unique_ptr<StoreTxn> txn, store_.Begin());
  IDEM_ASSIGN_OR_RETURN(TxnClaim claim, ClaimIn(*txn, policy, request, spec, canonical,
                                                fingerprinter_, mismatch_expires));
  if (!claim.claimed) {
    // An answer taken from what this transaction read is given only once that is durable
    // (ClaimIn): the transaction commits first, even though it wrote nothing.
    IDEM_RETURN_IF_ERROR(txn->Commit());
    return Unclaimed(policy, spec.scope, std::move(decision), std::move(claim.record),
                     std::move(claim.refused));
  }
  if (on_claim) {
    IDEM_RETURN_IF_ERROR(RunHook(on_claim, *txn, claim.record));
    IDEM_ASSIGN_OR_RETURN(std::optional<Record> updated, txn->Get(spec.scope));
    if (!updated) return MakeError(Errc::kInternal, "claim hook deleted its own record");
    claim.record = std::move(*updated);
  }
  // Last before the commit: the count serialises the claims of one principal until they commit
  // (StoreTxn::Count), so nothing else of this transaction runs while it holds them up.
  IDEM_RETURN_IF_ERROR(CheckQuota(policy, *txn, request.principal));
  IDEM_RETURN_IF_ERROR(txn->Commit());
  IDEM_RETURN_IF_ERROR(IDEM_FAILPOINT("after_claim"));
  decision.kind = Decision::Kind::kExecute;
  decision.key_expires = claim.record.expires_at;
  decision.ticket = TicketOf(policy, spec, claim);
  decision.record = std::move(claim.record);
  return decision;
}

Result<Decision> Engine::Unclaimed(const RoutePolicy& policy, const ScopeHash& scope,
                                   Decision decision, Record record,
                                   std::optional<Error> refused) const {
  if (refused) return std::move(*refused);
  if (!IsReplayable(record.state)) {
    return InProgress(policy, std::move(decision), std::move(record));
  }
  decision.record = std::move(record);
  return Replay(scope, std::move(decision));
}

Result<std::vector<Result<Decision>>> Engine::ExecuteInTxn(const RoutePolicy& policy,
                                                           std::span<const Request> requests,
                                                           const TxnOperation& operation) {
  // Each request's answer, in the order given; unset while its claim is still to be made.
  std::vector<std::optional<Result<Decision>>> answers(requests.size());
  struct Pending {
    std::size_t index = 0;
    Prepared prepared;
    ClaimSpec spec;
  };
  std::vector<Pending> pending;
  for (std::size_t i = 0; i < requests.size(); ++i) {
    const Request& request = requests[i];
    Result<Prepared> prepared = Prepare(policy, request);
    if (!prepared) {
      answers[i] = std::move(prepared).error();
      continue;
    }
    Decision decision;
    decision.key = prepared->key;
    // As Start: a finished record, or one a live lease holds, is answered from a snapshot read
    // (a redelivery of a message already processed takes no write lock).
    IDEM_ASSIGN_OR_RETURN(std::optional<Record> seen, store_.Read(prepared->hash));
    if (seen && DecidedByRead(*seen)) {
      answers[i] = AnswerRead(policy, request, prepared->canonical, prepared->hash,
                              std::move(decision), std::move(*seen), nullptr);
      continue;
    }
    ClaimSpec spec = SpecOf(policy, request, *prepared, fingerprinter_);
    pending.push_back(Pending{i, std::move(*prepared), std::move(spec)});
  }
  if (pending.empty()) {
    std::vector<Result<Decision>> decided;
    for (std::optional<Result<Decision>>& answer : answers) decided.push_back(std::move(*answer));
    return decided;
  }
  // Claimed in the order of their scopes, so two transactions that claim the same records take
  // their row locks (PostgreSQL) in one order and cannot deadlock on them; stable, so of two
  // requests with one key the first given is the one that executes.
  std::stable_sort(pending.begin(), pending.end(), [](const Pending& a, const Pending& b) {
    return a.prepared.hash < b.prepared.hash;
  });

  IDEM_ASSIGN_OR_RETURN(std::unique_ptr<StoreTxn> txn, store_.Begin());
  // The requests decided by what this transaction read (replays, in progress, mismatches),
  // answered once it has committed (ClaimIn).
  std::vector<std::pair<const Pending*, TxnClaim>> unclaimed;
  std::vector<const Principal*> principals;
  for (Pending& p : pending) {
    const Request& request = requests[p.index];
    // A request whose key came earlier in this transaction meets that request's record,
    // finished by now: it is answered as a replay (or a mismatch), never executed twice.
    IDEM_ASSIGN_OR_RETURN(TxnClaim claim, ClaimIn(*txn, policy, request, p.spec,
                                                  p.prepared.canonical, fingerprinter_, nullptr));
    if (!claim.claimed) {
      unclaimed.emplace_back(&p, std::move(claim));
      continue;
    }
    Decision decision;
    decision.key = std::move(p.prepared.key);
    decision.ticket = TicketOf(policy, p.spec, claim);
    IDEM_ASSIGN_OR_RETURN(StoredResponse response,
                          RunOperation(operation, p.index, *txn, decision.ticket));
    if (response.status < 200 || response.status > 599) {
      return MakeError(Errc::kInvalidArgument, "an operation's answer has status " +
                                                   std::to_string(response.status) +
                                                   ", not a final HTTP status (200..599)");
    }
    // As Finish finishes it, sealed here because the answer is known only now: inside the
    // transaction, which holds the write lock meanwhile.
    Outcome outcome;
    outcome.state = response.status < 300 ? RecordState::kSucceeded : RecordState::kFailedFinal;
    outcome.status_code = response.status;
    outcome.recovery_point = "done";
    outcome.retention = policy.retention;
    const std::string encoded = EncodeResponse(response);
    if (encoded.size() > policy.max_response_bytes) {
      return MakeError(Errc::kTooLarge, "an answer of " + std::to_string(encoded.size()) +
                                            " bytes exceeds the route's stored-response cap of " +
                                            std::to_string(policy.max_response_bytes));
    }
    IDEM_ASSIGN_OR_RETURN(outcome.sealed_response, sealer_.Seal(p.spec.scope, encoded));
    IDEM_RETURN_IF_ERROR(txn->Finish(p.spec.scope, decision.ticket.lease, outcome));
    decision.kind = Decision::Kind::kExecute;
    decision.key_expires = claim.record.expires_at;
    decision.record = std::move(claim.record);
    decision.response = std::move(response);
    answers[p.index] = std::move(decision);
    if (std::find_if(principals.begin(), principals.end(), [&](const Principal* who) {
          return who->tenant == request.principal.tenant && who->user == request.principal.user;
        }) == principals.end()) {
      principals.push_back(&request.principal);
    }
  }
  // Last before the commit, as in a claim (ClaimInTxn); in the order of the principals, so two
  // transactions that count the same principals take their locks (PostgreSQL's counter rows) in
  // one order and cannot deadlock on them.
  std::sort(principals.begin(), principals.end(), [](const Principal* a, const Principal* b) {
    return std::tie(a->tenant, a->user) < std::tie(b->tenant, b->user);
  });
  for (const Principal* who : principals) IDEM_RETURN_IF_ERROR(CheckQuota(policy, *txn, *who));
  IDEM_RETURN_IF_ERROR(IDEM_FAILPOINT("before_complete_commit"));
  IDEM_RETURN_IF_ERROR(txn->Commit());
  IDEM_RETURN_IF_ERROR(IDEM_FAILPOINT("after_complete_commit"));
  for (auto& [p, claim] : unclaimed) {
    Decision decision;
    decision.key = p->prepared.key;
    answers[p->index] = Unclaimed(policy, p->spec.scope, std::move(decision),
                                  std::move(claim.record), std::move(claim.refused));
  }
  std::vector<Result<Decision>> decided;
  decided.reserve(answers.size());
  for (std::optional<Result<Decision>>& answer : answers) decided.push_back(std::move(*answer));
  return decided;
}

Status Engine::CheckQuota(const RoutePolicy& policy, StoreTxn& txn, const Principal& who) {
  // Counted after the claim's own write, inside its transaction: over the limit rolls it back.
  IDEM_ASSIGN_OR_RETURN(
      StoreTxn::QuotaCounts counted,
      txn.CountQuota(who.tenant, who.user, policy.max_processing + 1, policy.max_retained + 1));
  if (counted.processing > policy.max_processing) {
    return MakeError(Errc::kResourceExhausted,
                     "too many operations in progress for this principal (limit " +
                         std::to_string(policy.max_processing) + ")");
  }
  if (counted.retained > policy.max_retained) {
    return MakeError(Errc::kResourceExhausted,
                     "too many retained idempotency keys for this principal (limit " +
                         std::to_string(policy.max_retained) + ")");
  }
  return Ok();
}

Result<StoredResponse> Engine::OpenAnswer(const ScopeHash& scope, const Record& record) const {
  IDEM_ASSIGN_OR_RETURN(std::string plain, sealer_.Open(scope, record.response));
  return DecodeResponse(plain);
}

Result<Decision> Engine::Replay(const ScopeHash& scope, Decision decision) const {
  IDEM_ASSIGN_OR_RETURN(decision.response, OpenAnswer(scope, decision.record));
  decision.kind = Decision::Kind::kReplay;
  decision.key_expires = decision.record.expires_at;
  return decision;
}

Result<std::optional<FoundRecord>> Engine::Lookup(const Principal& principal,
                                                  const RoutePolicy& policy, std::string_view key) {
  IDEM_ASSIGN_OR_RETURN(std::string parsed, ParseIdempotencyKey(key, policy.key_policy));
  const Scope scope{principal.tenant, principal.user, policy.route, parsed};
  IDEM_ASSIGN_OR_RETURN(ScopeHash hash, scope.Hash());
  IDEM_ASSIGN_OR_RETURN(std::optional<FoundRecord> found, Lookup(hash));
  if (found) found->key = std::move(parsed);
  return found;
}

Result<std::optional<FoundRecord>> Engine::Lookup(const ScopeHash& scope) {
  IDEM_ASSIGN_OR_RETURN(std::optional<Record> record, store_.Read(scope));
  if (!record) return std::optional<FoundRecord>();
  FoundRecord found;
  const Timestamp now = record->observed_at;
  found.expired = record->expires_at <= now;
  if (record->state == RecordState::kProcessing && record->lease.until >= now) {
    found.lease_left = std::chrono::duration_cast<Millis>(record->lease.until - now);
  }
  if (IsReplayable(record->state) && !found.expired) {
    IDEM_ASSIGN_OR_RETURN(found.response, OpenAnswer(scope, *record));
  }
  found.record = std::move(*record);
  return std::optional<FoundRecord>(std::move(found));
}

Result<std::vector<Record>> Engine::ListStale(const RoutePolicy& policy, int limit) {
  return store_.ListStale(policy.route, policy.sent_points, limit);
}

Status Engine::Advance(const Ticket& ticket, std::string_view point, std::string_view resource_id,
                       const TxnHook& business) {
  IDEM_ASSIGN_OR_RETURN(std::unique_ptr<StoreTxn> txn, store_.Begin());
  IDEM_RETURN_IF_ERROR(txn->Advance(ticket.scope, ticket.lease, point, resource_id));
  if (business) IDEM_RETURN_IF_ERROR(RunHook(business, *txn, ticket.record));
  return txn->Commit();
}

Status Engine::AdvanceBeforeCall(Ticket& ticket, std::string_view point, Millis must_cover) {
  IDEM_ASSIGN_OR_RETURN(std::unique_ptr<StoreTxn> txn, store_.Begin());
  // Renewed and advanced in one transaction: the covered advance checks the renewed lease, and a
  // refusal rolls the renewal back with it.
  IDEM_ASSIGN_OR_RETURN(Lease renewed, txn->Renew(ticket.scope, ticket.lease, ticket.lease_ttl));
  IDEM_RETURN_IF_ERROR(txn->AdvanceCovered(ticket.scope, renewed, point, must_cover));
  IDEM_RETURN_IF_ERROR(txn->Commit());
  ticket.lease = renewed;
  ticket.record.lease = renewed;
  return Ok();
}

Status Engine::Renew(const RoutePolicy& policy, Ticket& ticket) {
  return RenewFor(ticket, policy.lease);
}

Status Engine::Renew(Ticket& ticket) { return RenewFor(ticket, ticket.lease_ttl); }

Status Engine::RenewFor(Ticket& ticket, Millis ttl) {
  IDEM_ASSIGN_OR_RETURN(std::unique_ptr<StoreTxn> txn, store_.Begin());
  IDEM_ASSIGN_OR_RETURN(Lease renewed, txn->Renew(ticket.scope, ticket.lease, ttl));
  IDEM_RETURN_IF_ERROR(txn->Commit());
  ticket.lease = renewed;
  ticket.record.lease = renewed;
  return Ok();
}

Status Engine::Release(Ticket& ticket, Millis hold) {
  IDEM_ASSIGN_OR_RETURN(std::unique_ptr<StoreTxn> txn, store_.Begin());
  // A lease is live while lease.until >= now, and a takeover needs lease_until < now: a released
  // lease ends one millisecond ago, so the next attempt may take over in this very millisecond.
  const Millis ends = hold > Millis(0) ? hold : Millis(-1);
  IDEM_ASSIGN_OR_RETURN(Lease released, txn->Renew(ticket.scope, ticket.lease, ends));
  IDEM_RETURN_IF_ERROR(txn->Commit());
  ReleaseMarker(ticket.scope, ticket.marker);  // the next attempt must reach the database
  ticket.marker.reset();
  ticket.lease = released;
  ticket.record.lease = released;
  return Ok();
}

Result<Ticket> Engine::TakeOver(const RoutePolicy& policy, const Record& stale) {
  ClaimSpec spec{stale.scope,       stale.tenant, stale.user,      stale.route,
                 stale.fingerprint, policy.lease, policy.retention};
  IDEM_ASSIGN_OR_RETURN(std::unique_ptr<StoreTxn> txn, store_.Begin());
  IDEM_ASSIGN_OR_RETURN(Record record, txn->Reclaim(spec, stale.lease.fence));
  IDEM_RETURN_IF_ERROR(txn->Commit());
  return Ticket{stale.scope,
                record.lease,
                record,
                /*resumed=*/true,
                stale.state,
                /*marker=*/std::nullopt,
                policy.lease,
                policy.max_response_bytes,
                policy.retention};
}

Status Engine::Finish(const Ticket& ticket, RecordState state, const StoredResponse& response,
                      const TxnHook& business, std::string_view recovery_point) {
  IDEM_CHECK(state != RecordState::kProcessing);
  const bool held = state == RecordState::kFailedFinal && recovery_point == kOutcomeUnknownPoint;
  if (!recovery_point.empty() && state != RecordState::kFailedRetryable && !held) {
    return MakeError(Errc::kInvalidArgument,
                     "finish: only a retryable failure names the point to resume from");
  }
  Outcome outcome;
  outcome.recovery_point = std::string(recovery_point);
  outcome.state = state;
  outcome.status_code = response.status;
  outcome.retention = ticket.retention;
  if (IsReplayable(state)) {
    const std::string encoded = EncodeResponse(response);
    if (encoded.size() > ticket.max_response_bytes) {
      return MakeError(Errc::kTooLarge, "response of " + std::to_string(encoded.size()) +
                                            " bytes exceeds the route's stored-response cap of " +
                                            std::to_string(ticket.max_response_bytes));
    }
    // Sealed before the transaction starts, so the write lock is held only for the writes.
    IDEM_ASSIGN_OR_RETURN(outcome.sealed_response, sealer_.Seal(ticket.scope, encoded));
    if (!held) outcome.recovery_point = "done";
  }
  IDEM_ASSIGN_OR_RETURN(std::unique_ptr<StoreTxn> txn, store_.Begin());
  // The fenced record update first: a stale executor learns it lost before writing business rows.
  IDEM_RETURN_IF_ERROR(txn->Finish(ticket.scope, ticket.lease, outcome));
  if (business) IDEM_RETURN_IF_ERROR(RunHook(business, *txn, ticket.record));
  IDEM_RETURN_IF_ERROR(IDEM_FAILPOINT("before_complete_commit"));
  IDEM_RETURN_IF_ERROR(txn->Commit());
  IDEM_RETURN_IF_ERROR(IDEM_FAILPOINT("after_complete_commit"));
  ReleaseMarker(ticket.scope, ticket.marker);
  if (IsReplayable(state) && ticket.claim_began != SteadyTime{}) {
    // What the record is now: the claim's, as this finish left it (nothing else changes a
    // record under a held lease), kept as if read at claim_began, which came before the claim
    // read it back (observed_at).
    Record finished = ticket.record;
    finished.lease = ticket.lease;
    finished.state = state;
    finished.status_code = response.status;
    finished.response = std::move(outcome.sealed_response);
    finished.recovery_point = std::move(outcome.recovery_point);
    store_.KeepFinished(finished, ticket.claim_began);
  }
  return Ok();
}

Result<Record> Engine::Settle(const ScopeHash& scope, const std::optional<StoredResponse>& answer) {
  Outcome outcome;
  outcome.state = RecordState::kFailedRetryable;  // not executed: as a fresh claim left it
  if (answer) {
    if (answer->status < 200 || answer->status > 599) {
      return MakeError(Errc::kInvalidArgument, "settle: status " + std::to_string(answer->status) +
                                                   " is not a final HTTP status (200..599)");
    }
    const std::string encoded = EncodeResponse(*answer);
    if (encoded.size() > limits::kSealedResponseCeiling) {
      return MakeError(Errc::kTooLarge, "settle: an answer of " + std::to_string(encoded.size()) +
                                            " bytes is over the ceiling of " +
                                            std::to_string(limits::kSealedResponseCeiling));
    }
    outcome.state = answer->status < 300 ? RecordState::kSucceeded : RecordState::kFailedFinal;
    outcome.status_code = answer->status;
    outcome.recovery_point = std::string(kOperatorSettledPoint);
    IDEM_ASSIGN_OR_RETURN(outcome.sealed_response, sealer_.Seal(scope, encoded));
  }
  IDEM_ASSIGN_OR_RETURN(std::unique_ptr<StoreTxn> txn, store_.Begin());
  IDEM_ASSIGN_OR_RETURN(std::optional<Record> held, txn->Get(scope));
  if (!held) return SettleRefused(held, 0);
  IDEM_RETURN_IF_ERROR(txn->Settle(scope, held->lease.fence, outcome));
  IDEM_ASSIGN_OR_RETURN(std::optional<Record> settled, txn->Get(scope));
  IDEM_RETURN_IF_ERROR(txn->Commit());
  if (!settled) return MakeError(Errc::kInternal, "settle: the record vanished in its transaction");
  return std::move(*settled);
}

}  // namespace idem
