// src/core/store.cc — what libidem does over any Store: the names of its operations, the
// forwarding wrappers, the bounds on progress, the sweeper's round.
#include "idem/store.h"

#include <array>
#include <chrono>
#include <optional>
#include <string>

#include "idem/failpoint.h"

namespace idem {

std::string_view StoreOperationName(StoreOperation operation) {
  static constexpr std::array<std::string_view, kStoreOperations> kNames = {
      "begin", "claim", "reclaim", "renew",  "advance",  "advance_covered", "finish",
      "get",   "count", "exec",    "commit", "read",     "query",           "list_stale",
      "sweep", "ping",  "census",  "settle", "list_held"};
  return kNames[static_cast<std::size_t>(operation)];
}

namespace {

// Runs `forward` (the inner call) through `around` (a wrapper's Around) and answers as
// StoreTxnWrapper::Around says.
template <typename Around, typename Forward>
auto RunAround(Around&& around, Forward&& forward) -> decltype(forward()) {
  std::optional<decltype(forward())> result;
  auto call = [&]() -> Status {
    result.emplace(forward());
    if (!result->has_value()) return result->error();
    return Ok();
  };
  Status status = around(ForwardedCall(call));
  if (!status.has_value()) return std::move(status).error();
  IDEM_CHECK(result.has_value());  // an Around that answered Ok without forwarding
  return std::move(*result);
}

}  // namespace

template <typename Forward>
auto StoreTxnWrapper::Through(StoreOperation operation, Forward&& forward) {
  return RunAround([&](const ForwardedCall& call) { return Around(operation, call); }, forward);
}

template <typename Forward>
auto StoreWrapper::Through(StoreOperation operation, Forward&& forward) {
  return RunAround([&](const ForwardedCall& call) { return Around(operation, call); }, forward);
}

Result<ClaimResult> StoreTxnWrapper::Claim(const ClaimSpec& spec) {
  return Through(StoreOperation::kClaim, [&] { return target_->Claim(spec); });
}
Result<Record> StoreTxnWrapper::Reclaim(const ClaimSpec& spec, int64_t seen_fence) {
  return Through(StoreOperation::kReclaim, [&] { return target_->Reclaim(spec, seen_fence); });
}
Result<Lease> StoreTxnWrapper::Renew(const ScopeHash& scope, const Lease& lease, Millis ttl) {
  return Through(StoreOperation::kRenew, [&] { return target_->Renew(scope, lease, ttl); });
}
Status StoreTxnWrapper::Advance(const ScopeHash& scope, const Lease& lease, std::string_view point,
                                std::string_view resource_id) {
  return Through(StoreOperation::kAdvance,
                 [&] { return target_->Advance(scope, lease, point, resource_id); });
}
Status StoreTxnWrapper::AdvanceCovered(const ScopeHash& scope, const Lease& lease,
                                       std::string_view point, Millis must_cover) {
  return Through(StoreOperation::kAdvanceCovered,
                 [&] { return target_->AdvanceCovered(scope, lease, point, must_cover); });
}
Status StoreTxnWrapper::Finish(const ScopeHash& scope, const Lease& lease, const Outcome& outcome) {
  return Through(StoreOperation::kFinish, [&] { return target_->Finish(scope, lease, outcome); });
}
Status StoreTxnWrapper::Settle(const ScopeHash& scope, int64_t seen_fence, const Outcome& outcome) {
  return Through(StoreOperation::kSettle,
                 [&] { return target_->Settle(scope, seen_fence, outcome); });
}
Result<std::optional<Record>> StoreTxnWrapper::Get(const ScopeHash& scope) {
  return Through(StoreOperation::kGet, [&] { return target_->Get(scope); });
}
Result<int64_t> StoreTxnWrapper::Count(std::string_view tenant, std::string_view user,
                                       std::optional<RecordState> state, int64_t limit) {
  return Through(StoreOperation::kCount,
                 [&] { return target_->Count(tenant, user, state, limit); });
}
Result<StoreTxn::QuotaCounts> StoreTxnWrapper::CountQuota(std::string_view tenant,
                                                          std::string_view user,
                                                          int64_t processing_limit,
                                                          int64_t retained_limit) {
  return Through(StoreOperation::kCount, [&] {
    return target_->CountQuota(tenant, user, processing_limit, retained_limit);
  });
}
Result<std::vector<SqlRow>> StoreTxnWrapper::Exec(std::string_view sql,
                                                  const std::vector<SqlValue>& params) {
  return Through(StoreOperation::kExec, [&] { return target_->Exec(sql, params); });
}
Status StoreTxnWrapper::Commit() {
  return Through(StoreOperation::kCommit, [&] { return target_->Commit(); });
}

Status StoreTxnWrapper::Around(StoreOperation /*operation*/, const ForwardedCall& call) {
  return call();
}

Status StoreWrapper::Ping(Millis timeout) {
  return Through(StoreOperation::kPing, [&] { return target_.Ping(timeout); });
}
Result<std::unique_ptr<StoreTxn>> StoreWrapper::Begin() {
  return Through(StoreOperation::kBegin, [&]() -> Result<std::unique_ptr<StoreTxn>> {
    IDEM_ASSIGN_OR_RETURN(std::unique_ptr<StoreTxn> txn, target_.Begin());
    return WrapTxn(std::move(txn));
  });
}
Result<std::optional<Record>> StoreWrapper::Read(const ScopeHash& scope) {
  return Through(StoreOperation::kRead, [&] { return target_.Read(scope); });
}
Result<std::vector<SqlRow>> StoreWrapper::Query(std::string_view sql,
                                                const std::vector<SqlValue>& params) {
  return Through(StoreOperation::kQuery, [&] { return target_.Query(sql, params); });
}
Result<std::vector<Record>> StoreWrapper::ListStale(std::string_view route,
                                                    const std::vector<std::string>& sent_points,
                                                    int limit) {
  return Through(StoreOperation::kListStale,
                 [&] { return target_.ListStale(route, sent_points, limit); });
}
Result<std::vector<Record>> StoreWrapper::ListHeld(std::string_view route, int limit) {
  return Through(StoreOperation::kListHeld, [&] { return target_.ListHeld(route, limit); });
}
Result<int> StoreWrapper::Sweep(int batch, const std::vector<std::string>& sent_points) {
  return Through(StoreOperation::kSweep, [&] { return target_.Sweep(batch, sent_points); });
}
Result<RecordCensus> StoreWrapper::Census() {
  return Through(StoreOperation::kCensus, [&] { return target_.Census(); });
}

Status StoreWrapper::Around(StoreOperation /*operation*/, const ForwardedCall& call) {
  return call();
}

// Recovery points and resource ids are short labels the business code chooses; a longer one is
// a bug or hostile input, refused before it reaches the table.
Status CheckProgress(std::string_view point, std::string_view resource_id) {
  if (point.size() > limits::kRecoveryPointMaxLength) {
    return MakeError(
        Errc::kInvalidArgument,
        "recovery point longer than " + std::to_string(limits::kRecoveryPointMaxLength) + " bytes");
  }
  if (resource_id.size() > limits::kResourceIdMaxLength) {
    return MakeError(
        Errc::kInvalidArgument,
        "resource id longer than " + std::to_string(limits::kResourceIdMaxLength) + " bytes");
  }
  return Ok();
}

Status CheckSettlement(const Outcome& outcome) {
  if (outcome.state == RecordState::kProcessing) {
    return MakeError(Errc::kInvalidArgument, "settle: a held outcome cannot become PROCESSING");
  }
  return CheckProgress(outcome.recovery_point, {});
}

Error SettleRefused(const std::optional<Record>& record, int64_t seen_fence) {
  if (!record || record->expires_at <= record->observed_at) {
    return MakeError(Errc::kNotFound, "settle: no such record (or it expired)");
  }
  if (record->state != RecordState::kFailedFinal ||
      record->recovery_point != kOutcomeUnknownPoint) {
    return MakeError(Errc::kConflict, "settle: the record is not a held outcome (" +
                                          std::string(RecordStateName(record->state)) +
                                          " at point '" + record->recovery_point + "')");
  }
  return MakeError(Errc::kConflict, "settle: the record changed since it was read (fence " +
                                        std::to_string(record->lease.fence) + ", not " +
                                        std::to_string(seen_fence) + ")");
}

Result<int64_t> SweepExpired(Store& store, const std::vector<std::string>& sent_points,
                             int max_batches, const SweepPacing* pacing) {
  int64_t deleted = 0;
  for (int batch = 0; batch < max_batches; ++batch) {
    const SteadyTime started = pacing ? pacing->clock->Now() : SteadyTime{};
    IDEM_ASSIGN_OR_RETURN(int n, store.Sweep(limits::kSweepBatch, sent_points));
    deleted += n;
    if (pacing && pacing->swept && n > 0) pacing->swept(n);
    if (n < limits::kSweepBatch || batch + 1 == max_batches) break;
    if (pacing) {
      const auto took = pacing->clock->Now() - started;
      if (!pacing->rest(std::chrono::ceil<Millis>(took * pacing->rest_per_work))) break;
    }
    // Each batch is one statement that committed on its own: what a crash here leaves expired,
    // the next round deletes.
    IDEM_RETURN_IF_ERROR(IDEM_FAILPOINT("sweep_between_batches"));
  }
  return deleted;
}

}  // namespace idem
