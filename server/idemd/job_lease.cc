// server/idemd/job_lease.cc — a job's lease on the records table (job_lease.h).
#include "server/idemd/job_lease.h"

#include "idem/key.h"

namespace idem::idemd {

Result<JobLease> JobLease::Take(Store& store, std::string_view user, std::string_view job,
                                std::string_view what, Millis ttl) {
  ClaimSpec spec;
  IDEM_ASSIGN_OR_RETURN(spec.scope,
                        (Scope{"idem", std::string(user), std::string(job), "lease"}.Hash()));
  spec.tenant = "idem";
  spec.user = std::string(user);
  spec.route = std::string(job);
  spec.lease_ttl = ttl;
  spec.retention = Millis(24 * 3'600'000);
  IDEM_ASSIGN_OR_RETURN(std::unique_ptr<StoreTxn> txn, store.Begin());
  IDEM_ASSIGN_OR_RETURN(ClaimResult claim, txn->Claim(spec));
  Lease held = claim.record.lease;
  if (!claim.claimed) {
    const Record& other = claim.record;
    if (other.state == RecordState::kProcessing && other.lease.until >= other.observed_at) {
      return MakeError(Errc::kConflict,
                       "another " + std::string(what) + " holds the lease for " +
                           std::to_string((other.lease.until - other.observed_at).count()) +
                           " ms more");
    }
    IDEM_ASSIGN_OR_RETURN(Record mine, txn->Reclaim(spec, other.lease.fence));
    held = mine.lease;
  }
  IDEM_RETURN_IF_ERROR(txn->Commit());
  return JobLease(std::move(spec), held);
}

Status JobLease::Renew(StoreTxn& txn) {
  IDEM_ASSIGN_OR_RETURN(held_, txn.Renew(spec_.scope, held_, spec_.lease_ttl));
  return Ok();
}

void JobLease::Release(Store& store) {
  if (auto txn = store.Begin()) {
    if ((*txn)->Finish(spec_.scope, held_, {RecordState::kFailedRetryable, 0, "", ""})) {
      (void)(*txn)->Commit();
    }
  }
}

}  // namespace idem::idemd
