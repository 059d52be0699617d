// bench/loadgen/histogram_test.cc — the latency histogram: buckets tile the range, quantiles stay
// within the promised relative error of the exact ones, and merging equals recording together.
#include "bench/loadgen/histogram.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

namespace idem::bench {
namespace {

// The exact quantile with the histogram's definition: the value of rank max(1, ceil(q * n)).
uint64_t ExactQuantile(const std::vector<uint64_t>& sorted, double q) {
  const auto n = static_cast<double>(sorted.size());
  const auto rank = std::max<std::size_t>(1, static_cast<std::size_t>(std::ceil(q * n)));
  return sorted[std::min(rank, sorted.size()) - 1];
}

TEST(LatencyHistogram, BucketsTileTheTrackedRangeWithoutGaps) {
  for (std::size_t i = 0; i + 1 < LatencyHistogram::BucketCount(); ++i) {
    ASSERT_EQ(LatencyHistogram::HighestOf(i) + 1, LatencyHistogram::LowestOf(i + 1)) << i;
    ASSERT_EQ(LatencyHistogram::IndexOf(LatencyHistogram::LowestOf(i)), i);
    ASSERT_EQ(LatencyHistogram::IndexOf(LatencyHistogram::HighestOf(i)), i);
  }
  EXPECT_GE(LatencyHistogram::HighestOf(LatencyHistogram::BucketCount() - 1),
            LatencyHistogram::kHighestNs);
  EXPECT_LT(LatencyHistogram::BucketCount(), 4000u);  // what it costs: 8 bytes a bucket
}

TEST(LatencyHistogram, NoBucketIsWiderThanItsShareOfTheValuesInIt) {
  for (std::size_t i = LatencyHistogram::IndexOf(LatencyHistogram::kLowestNs);
       i < LatencyHistogram::BucketCount(); ++i) {
    const double low = static_cast<double>(LatencyHistogram::LowestOf(i));
    const double width = static_cast<double>(LatencyHistogram::HighestOf(i)) - low + 1;
    ASSERT_LE(width / 2 / low, LatencyHistogram::kRelativeError) << i;
  }
}

TEST(LatencyHistogram, QuantilesAreWithinTheRelativeErrorOfTheExactOnes) {
  // Log-uniform from 1 µs to 50 s, so every octave is exercised.
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> exponent(3.0, std::log10(5e10));
  std::vector<uint64_t> values;
  LatencyHistogram h;
  for (int i = 0; i < 200'000; ++i) {
    const auto v = static_cast<uint64_t>(std::pow(10.0, exponent(rng)));
    values.push_back(v);
    h.Record(v);
  }
  std::sort(values.begin(), values.end());
  for (double q : {0.0, 0.001, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99, 0.999, 0.9999, 1.0}) {
    const auto exact = static_cast<double>(ExactQuantile(values, q));
    const auto got = static_cast<double>(h.ValueAtQuantile(q));
    EXPECT_LE(std::abs(got - exact) / exact, LatencyHistogram::kRelativeError)
        << "q=" << q << " exact=" << exact << " got=" << got;
  }
  EXPECT_EQ(h.Count(), values.size());
  EXPECT_EQ(h.Min(), values.front());
  EXPECT_EQ(h.Max(), values.back());
  EXPECT_EQ(h.ValueAtQuantile(1.0), values.back());
  EXPECT_EQ(h.Clamped(), 0u);
}

TEST(LatencyHistogram, SmallSamplesReportTheRecordedValues) {
  LatencyHistogram h;
  for (uint64_t v : {1'000'000u, 2'000'000u, 3'000'000u, 4'000'000u}) h.Record(v);
  const auto near = [](uint64_t got, double want) {
    return std::abs(static_cast<double>(got) - want) / want <= LatencyHistogram::kRelativeError;
  };
  EXPECT_TRUE(near(h.ValueAtQuantile(0.5), 2e6)) << h.ValueAtQuantile(0.5);
  EXPECT_TRUE(near(h.ValueAtQuantile(0.75), 3e6)) << h.ValueAtQuantile(0.75);
  EXPECT_TRUE(near(h.ValueAtQuantile(0.76), 4e6)) << h.ValueAtQuantile(0.76);
  EXPECT_EQ(h.ValueAtQuantile(0.0), 1'000'000u);  // clamped to the exact minimum
  EXPECT_DOUBLE_EQ(h.Mean(), 2.5e6);
}

TEST(LatencyHistogram, MergingEqualsRecordingEverythingInOne) {
  LatencyHistogram a;
  LatencyHistogram b;
  LatencyHistogram all;
  std::mt19937_64 rng(3);
  std::uniform_int_distribution<uint64_t> v(1'000, 50'000'000);
  for (int i = 0; i < 10'000; ++i) {
    const uint64_t x = v(rng);
    (i % 3 == 0 ? a : b).Record(x);
    all.Record(x);
  }
  a.Merge(b);
  EXPECT_EQ(a.Count(), all.Count());
  EXPECT_EQ(a.Min(), all.Min());
  EXPECT_EQ(a.Max(), all.Max());
  EXPECT_DOUBLE_EQ(a.Mean(), all.Mean());
  for (double q : {0.5, 0.9, 0.99, 0.999}) EXPECT_EQ(a.ValueAtQuantile(q), all.ValueAtQuantile(q));
  LatencyHistogram empty;
  a.Merge(empty);
  EXPECT_EQ(a.Count(), all.Count());
  EXPECT_EQ(a.Min(), all.Min());
}

TEST(LatencyHistogram, ValuesOutsideTheRangeAreClampedAndCounted) {
  LatencyHistogram h;
  h.Record(10);               // below 1 µs
  h.Record(120'000'000'000);  // two minutes
  h.Record(5'000'000);
  EXPECT_EQ(h.Clamped(), 2u);
  EXPECT_EQ(h.Min(), 10u);
  EXPECT_EQ(h.Max(), 120'000'000'000u);
  EXPECT_EQ(h.ValueAtQuantile(1.0), 120'000'000'000u);
  // The top bucket is reported no higher than the exact maximum and no lower than its range.
  EXPECT_GE(h.ValueAtQuantile(0.99), LatencyHistogram::kHighestNs * 99 / 100);
  uint64_t buckets = 0;
  h.ForEachBucket([&](uint64_t, uint64_t, uint64_t n) { buckets += n; });
  EXPECT_EQ(buckets, 3u);
}

TEST(LatencyHistogram, AnEmptyHistogramReportsZeros) {
  const LatencyHistogram h;
  EXPECT_EQ(h.Count(), 0u);
  EXPECT_EQ(h.Min(), 0u);
  EXPECT_EQ(h.Max(), 0u);
  EXPECT_EQ(h.ValueAtQuantile(0.99), 0u);
  EXPECT_EQ(h.Mean(), 0.0);
}

}  // namespace
}  // namespace idem::bench
