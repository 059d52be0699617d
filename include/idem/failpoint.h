// include/idem/failpoint.h — named failpoints: places in the protocol where a test can make the
// process crash, stall or fail, to prove what a crash at exactly that step leaves behind.
//
// Points are armed at run time (ArmFailpoints, or the IDEM_FAILPOINTS environment variable read
// by idemd at start-up): "after_charge_sent=crash,before_complete_commit=stall:5000". Builds with
// -DIDEM_FAILPOINTS=OFF compile every point to nothing.
#pragma once

#include <string_view>

#include "include/idem/result.h"

namespace idem {

// Arms points from a spec: comma-separated name=action, action one of crash (the process exits
// at once with status 86, like a kill -9 at that line), stall:MS (sleeps), error (the step fails
// with kUnavailable). "off" disarms. Errors: kInvalidArgument for a malformed spec.
Status ArmFailpoints(std::string_view spec);

// Disarms every point.
void ClearFailpoints();

namespace internal {
Status HitFailpoint(std::string_view name);
}  // namespace internal

}  // namespace idem

#if defined(IDEM_NO_FAILPOINTS)
#define IDEM_FAILPOINT(name) ::idem::Status()
#else
// Evaluates to a Status: Ok unless the point is armed with "error".
#define IDEM_FAILPOINT(name) ::idem::internal::HitFailpoint(name)
#endif
