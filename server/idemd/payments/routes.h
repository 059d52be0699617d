// server/idemd/payments/routes.h — idemd's route ids. A route id is part of every record's scope,
// so it lives here, apart from the route's code, for tools that look records up (idemctl).
#pragma once

#include <string_view>

namespace idem::idemd {

// POST /v1/payments. Stored (hashed) in every payment record's scope: never change it.
inline constexpr std::string_view kPaymentsCreateRoute = "payments.create";

}  // namespace idem::idemd
