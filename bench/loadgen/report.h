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
  bool checked = true;  // false under --no-check: `check` is empty and reported as not made
};

// Measured answers that were 200 or 201.
uint64_t Succeeded(const Figures& figures);

std::string FormatTable(const Report& report);
// Just the exactly-once part, with its PASS or FAIL line (also all that --check-only prints).
std::string FormatCheck(const CheckResult& check);
std::string ReportJson(const Report& report);
std::string CheckJson(const CheckResult& check);

}  // namespace idem::bench
