// server/idemd/job_lease.h — the lease of a job that one instance at a time may run (the books,
// the outbox relay): a record of the records table, claimed and renewed on the store's clock and
// fenced like any execution's, so two runners never write at once and a crashed runner's lease
// ends by itself.
#pragma once

#include <string>
#include <string_view>

#include "idem/clock.h"
#include "idem/record.h"
#include "idem/store.h"

namespace idem::idemd {

// The jobs' routes: the books' and the outbox relay's. Their records are leases that end by
// themselves, never operations a takeover resolves: every instance serves them (TakeCensus).
inline constexpr std::string_view kBooksJob = "reconcile.books";
inline constexpr std::string_view kRelayJob = "outbox.relay";
inline bool IsJobRoute(std::string_view route) { return route == kBooksJob || route == kRelayJob; }

class JobLease {
 public:
  // Takes the lease of `job` for `ttl`, taking over one that ran out: the record (tenant "idem",
  // `user`, route `job`, key "lease"), e.g. ("reconciler", "reconcile.books"). Errors: kConflict
  // ("another <what> holds the lease for N ms more"); the store's.
  static Result<JobLease> Take(Store& store, std::string_view user, std::string_view job,
                               std::string_view what, Millis ttl);

  // Renews the lease for another ttl inside `txn`, which then commits only if the lease was still
  // this runner's. Errors: kFenced (another runner took it over); the store's.
  Status Renew(StoreTxn& txn);

  // Gives the lease back, so the next runner need not wait for it to run out. Best effort: a
  // lease not given back runs out by itself.
  void Release(Store& store);

 private:
  JobLease(ClaimSpec spec, Lease held) : spec_(std::move(spec)), held_(held) {}
  ClaimSpec spec_;
  Lease held_;
};

}  // namespace idem::idemd
