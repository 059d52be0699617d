// src/core/store.cc — what libidem does over any Store: the sweeper's round.
#include "include/idem/store.h"

namespace idem {

Result<int> SweepExpired(Store& store, int max_batches) {
  int deleted = 0;
  for (int batch = 0; batch < max_batches; ++batch) {
    IDEM_ASSIGN_OR_RETURN(int n, store.Sweep(limits::kSweepBatch));
    deleted += n;
    if (n < limits::kSweepBatch) break;
  }
  return deleted;
}

}  // namespace idem
