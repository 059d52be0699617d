// bench/loadgen/report.h — what idem-bench prints: a table for people, and JSON with every figure
// (--json) for whatever compares runs later.
#pragma once

#include <string>

#include "bench/loadgen/check.h"
#include "bench/loadgen/driver.h"
#include "bench/loadgen/options.h"

namespace idem::bench {

struct Report {
  const Options* options = nullptr;
  std::string run_id;
  Figures figures;
  Totals totals;
  CheckResult check;
};

std::string FormatTable(const Report& report);
// Just the exactly-once part, with its PASS or FAIL line (also all that --check-only prints).
std::string FormatCheck(const CheckResult& check);
std::string ReportJson(const Report& report);
std::string CheckJson(const CheckResult& check);

}  // namespace idem::bench
