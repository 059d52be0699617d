// src/core/store.cc — what libidem does over any Store: the bounds on progress, the sweeper's
// round.
#include "idem/store.h"

#include <string>

#include "idem/failpoint.h"

namespace idem {

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

Result<int> SweepExpired(Store& store, const std::vector<std::string>& sent_points,
                         int max_batches) {
  int deleted = 0;
  for (int batch = 0; batch < max_batches; ++batch) {
    IDEM_ASSIGN_OR_RETURN(int n, store.Sweep(limits::kSweepBatch, sent_points));
    deleted += n;
    if (n < limits::kSweepBatch || batch + 1 == max_batches) break;
    // Each batch is one statement that committed on its own: what a crash here leaves expired,
    // the next round deletes.
    IDEM_RETURN_IF_ERROR(IDEM_FAILPOINT("sweep_between_batches"));
  }
  return deleted;
}

}  // namespace idem
