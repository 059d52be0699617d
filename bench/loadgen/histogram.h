// bench/loadgen/histogram.h — the latency histogram of idem-bench: log-linear buckets with a
// bounded relative error, in the manner of HdrHistogram (which Debian does not package).
//
// Every power of two is split into kSubBuckets equal buckets, so a bucket is never wider than
// 1/kSubBuckets of the values in it, whatever their magnitude: a reported quantile (the middle of
// its bucket) is within kRelativeError of the value recorded, from 1 µs to 60 s, at a fixed
// memory cost (about 3,800 counters) and O(1) per record. Count, min, max and the sum are kept
// exactly. Values outside the tracked range are counted in their end bucket and in Clamped().
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

namespace idem::bench {

class LatencyHistogram {
 public:
  static constexpr int kSubBucketBits = 7;
  static constexpr uint64_t kSubBuckets = uint64_t{1} << kSubBucketBits;  // 128 per octave
  static constexpr uint64_t kLowestNs = 1'000;                            // 1 µs
  static constexpr uint64_t kHighestNs = 60'000'000'000;                  // 60 s
  // Half a bucket over its lowest value: the middle of a bucket is at most this far (relative)
  // from anything recorded in it.
  static constexpr double kRelativeError = 1.0 / (2.0 * static_cast<double>(kSubBuckets));

  // The bucket of `value` (any uint64_t; the histogram only uses those from kLowestNs to
  // kHighestNs). Below kSubBuckets a bucket holds one value; above, octave e (2^e..2^(e+1)-1)
  // holds kSubBuckets buckets of width 2^(e - kSubBucketBits).
  static constexpr std::size_t IndexOf(uint64_t value) {
    if (value < kSubBuckets) return static_cast<std::size_t>(value);
    const int octave = static_cast<int>(std::bit_width(value)) - 1;
    const int shift = octave - kSubBucketBits;
    return static_cast<std::size_t>((static_cast<uint64_t>(shift) + 1) * kSubBuckets +
                                    ((value >> shift) - kSubBuckets));
  }
  // The smallest and the largest value of bucket `index`.
  static constexpr uint64_t LowestOf(std::size_t index) {
    if (index < kSubBuckets) return index;
    const uint64_t shift = index / kSubBuckets - 1;
    return (index % kSubBuckets + kSubBuckets) << shift;
  }
  static constexpr uint64_t HighestOf(std::size_t index) {
    if (index < kSubBuckets) return index;
    const uint64_t shift = index / kSubBuckets - 1;
    return LowestOf(index) + (uint64_t{1} << shift) - 1;
  }
  static constexpr std::size_t BucketCount() { return IndexOf(kHighestNs) + 1; }

  void Record(uint64_t ns) {
    ++count_;
    sum_ += static_cast<double>(ns);
    min_ = std::min(min_, ns);
    max_ = std::max(max_, ns);
    if (ns < kLowestNs || ns > kHighestNs) ++clamped_;
    ++counts_[IndexOf(std::clamp(ns, kLowestNs, kHighestNs))];
  }

  void Merge(const LatencyHistogram& other) {
    for (std::size_t i = 0; i < BucketCount(); ++i) counts_[i] += other.counts_[i];
    count_ += other.count_;
    sum_ += other.sum_;
    clamped_ += other.clamped_;
    min_ = std::min(min_, other.min_);
    max_ = std::max(max_, other.max_);
  }

  uint64_t Count() const { return count_; }
  uint64_t Min() const { return count_ == 0 ? 0 : min_; }
  uint64_t Max() const { return max_; }
  double Mean() const { return count_ == 0 ? 0.0 : sum_ / static_cast<double>(count_); }
  // Values recorded outside 1 µs..60 s (their exact min and max are still known).
  uint64_t Clamped() const { return clamped_; }

  // The value at quantile q (0..1): the smallest recorded value v such that at least q of all
  // values are <= v, reported as the middle of its bucket and never outside [Min(), Max()]. q = 0
  // is Min() and q = 1 Max(), exactly; 0 when nothing was recorded.
  uint64_t ValueAtQuantile(double q) const {
    if (count_ == 0) return 0;
    if (q <= 0.0) return min_;
    if (q >= 1.0) return max_;
    const double wanted = std::ceil(q * static_cast<double>(count_));
    const uint64_t rank = std::max<uint64_t>(1, static_cast<uint64_t>(wanted));
    uint64_t seen = 0;
    for (std::size_t i = 0; i < BucketCount(); ++i) {
      seen += counts_[i];
      if (seen >= rank) {
        const uint64_t middle = LowestOf(i) + (HighestOf(i) - LowestOf(i) + 1) / 2;
        return std::clamp(middle, Min(), max_);
      }
    }
    return max_;
  }

  // Calls f(lowest, highest, count) for every bucket that holds something, lowest first.
  template <typename F>
  void ForEachBucket(F&& f) const {
    for (std::size_t i = 0; i < BucketCount(); ++i) {
      if (counts_[i] != 0) f(LowestOf(i), HighestOf(i), counts_[i]);
    }
  }

 private:
  std::vector<uint64_t> counts_ = std::vector<uint64_t>(BucketCount(), 0);
  uint64_t count_ = 0;
  uint64_t clamped_ = 0;
  uint64_t min_ = std::numeric_limits<uint64_t>::max();
  uint64_t max_ = 0;
  double sum_ = 0;
};

}  // namespace idem::bench
