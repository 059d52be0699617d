// src/store/postgres/postgres_values.cc — the PostgreSQL store's values: parameters go as text
// (bytes as binary), results come back binary and are decoded by their column's type.
#include <libpq-fe.h>

#include <cinttypes>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <string>
#include <vector>

#include "src/store/postgres/postgres_internal.h"

namespace idem::postgres_internal {
namespace {

uint64_t BigEndian(const char* p, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; ++i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}

int64_t SignedBigEndian(const char* p, int n) {
  uint64_t v = BigEndian(p, n);
  if (n < 8 && (v >> (8 * n - 1)) != 0) v |= ~uint64_t{0} << (8 * n);  // sign-extend
  return static_cast<int64_t>(v);
}

// Microseconds between the Unix epoch and PostgreSQL's (2000-01-01 UTC).
constexpr int64_t kPostgresEpochMicros = 946'684'800'000'000;

// numeric's binary form: ndigits, weight, sign, dscale (int16 each), then base-10000 digits.
Result<std::string> NumericText(const char* p, int len) {
  if (len < 8) return MakeError(Errc::kDataLoss, "numeric value is truncated");
  const int ndigits = static_cast<int>(SignedBigEndian(p, 2));
  const int weight = static_cast<int>(SignedBigEndian(p + 2, 2));
  const uint64_t sign = BigEndian(p + 4, 2);
  const int dscale = static_cast<int>(SignedBigEndian(p + 6, 2));
  if (ndigits < 0 || dscale < 0 || len != 8 + 2 * ndigits) {
    return MakeError(Errc::kDataLoss, "numeric value is malformed");
  }
  if (sign == 0xC000) return std::string("NaN");
  if (sign == 0xD000) return std::string("Infinity");
  if (sign == 0xF000) return std::string("-Infinity");
  auto digit = [&](int i) -> int {
    return i >= 0 && i < ndigits ? static_cast<int>(SignedBigEndian(p + 8 + 2 * i, 2)) : 0;
  };
  std::string out = sign == 0x4000 ? "-" : "";
  if (weight < 0) {
    out += "0";
  } else {
    for (int i = 0; i <= weight; ++i) {
      char group[8];
      std::snprintf(group, sizeof group, i == 0 ? "%d" : "%04d", digit(i));
      out += group;
    }
  }
  if (dscale > 0) {
    std::string fraction;
    for (int i = weight + 1; static_cast<int>(fraction.size()) < dscale; ++i) {
      char group[8];
      std::snprintf(group, sizeof group, "%04d", digit(i));
      fraction += group;
    }
    out += "." + fraction.substr(0, static_cast<std::size_t>(dscale));
  }
  return out;
}

// One binary-format result value of type `oid` (see the SqlValue table in store.h).
Result<SqlValue> Decode(Oid oid, const char* v, int len, int column) {
  switch (oid) {
    case 16:  // bool
      return SqlValue{int64_t{v[0] != 0}};
    case 20:  // int8
    case 21:  // int2
    case 23:  // int4
      return SqlValue{SignedBigEndian(v, len)};
    case 700: {  // float4
      const uint32_t bits = static_cast<uint32_t>(BigEndian(v, 4));
      float f;
      std::memcpy(&f, &bits, sizeof f);
      return SqlValue{static_cast<double>(f)};
    }
    case 701: {  // float8
      const uint64_t bits = BigEndian(v, 8);
      double d;
      std::memcpy(&d, &bits, sizeof d);
      return SqlValue{d};
    }
    case 1700: {  // numeric: exact, as decimal text
      IDEM_ASSIGN_OR_RETURN(std::string text, NumericText(v, len));
      return SqlValue{std::move(text)};
    }
    case 18:    // "char"
    case 19:    // name
    case 25:    // text
    case 114:   // json
    case 705:   // unknown (an untyped literal)
    case 1042:  // bpchar
    case 1043:  // varchar
      return SqlValue{std::string(v, static_cast<std::size_t>(len))};
    case 3802:  // jsonb: a version byte, then the text
      if (len < 1 || v[0] != 1) return MakeError(Errc::kDataLoss, "jsonb value is malformed");
      return SqlValue{std::string(v + 1, static_cast<std::size_t>(len - 1))};
    case 2950: {  // uuid
      if (len != 16) return MakeError(Errc::kDataLoss, "uuid value is malformed");
      std::string text = ToHex(reinterpret_cast<const uint8_t*>(v), 16);
      for (std::size_t at : {8, 13, 18, 23}) text.insert(at, "-");
      return SqlValue{std::move(text)};
    }
    case 17:  // bytea
      return SqlValue{Blob{std::string(v, static_cast<std::size_t>(len))}};
    case 1114:    // timestamp (read as UTC)
    case 1184: {  // timestamptz
      const int64_t micros = SignedBigEndian(v, 8);
      if (micros == INT64_MAX || micros == INT64_MIN) {
        return MakeError(Errc::kInvalidArgument,
                         "column " + std::to_string(column) + " holds an infinite timestamp");
      }
      const int64_t unix_micros = micros + kPostgresEpochMicros;
      const int64_t ms = unix_micros >= 0 ? unix_micros / 1000 : -((-unix_micros + 999) / 1000);
      return SqlValue{FromUnixMillis(ms)};
    }
    case 2278:  // void (pg_notify, pg_advisory_xact_lock)
      return SqlValue{std::monostate{}};
    default:
      return MakeError(Errc::kInvalidArgument,
                       "column " + std::to_string(column) + " has a type (oid " +
                           std::to_string(oid) +
                           ") that idem does not decode; cast it to text, bigint, double "
                           "precision, numeric, bytea or timestamptz");
  }
}

}  // namespace

std::string TimestampText(Timestamp t) {
  const int64_t ms = ToUnixMillis(t);
  const int64_t seconds = ms >= 0 ? ms / 1000 : -((-ms + 999) / 1000);
  const std::time_t tt = static_cast<std::time_t>(seconds);
  std::tm tm{};
  gmtime_r(&tt, &tm);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02d %02d:%02d:%02d.%03d+00", tm.tm_year + 1900,
                tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                static_cast<int>(ms - seconds * 1000));
  return buf;
}

std::string DoubleText(double d) {
  if (std::isnan(d)) return "NaN";
  if (std::isinf(d)) return d > 0 ? "Infinity" : "-Infinity";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.17g", d);
  return buf;
}

Result<std::vector<SqlRow>> Rows(const PGresult* res) {
  std::vector<SqlRow> rows;
  const int n = PQntuples(res), m = PQnfields(res);
  rows.reserve(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) {
    SqlRow row;
    row.reserve(static_cast<std::size_t>(m));
    for (int c = 0; c < m; ++c) {
      if (PQgetisnull(res, r, c)) {
        row.emplace_back(std::monostate{});
        continue;
      }
      IDEM_ASSIGN_OR_RETURN(SqlValue value, Decode(PQftype(res, c), PQgetvalue(res, r, c),
                                                   PQgetlength(res, r, c), c));
      row.push_back(std::move(value));
    }
    rows.push_back(std::move(row));
  }
  return rows;
}

}  // namespace idem::postgres_internal
