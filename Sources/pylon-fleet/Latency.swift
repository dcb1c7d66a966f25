import PylonCore

/// A latency histogram with logarithmic buckets (each bucket 4% wider than the one before, from
/// 1 µs to about 1,000 s): constant memory whatever the count, percentiles within one bucket's
/// width (4%) of the exact value. A value type with no I/O.
struct LatencyHistogram: Equatable {
    /// Bucket growth factor: a percentile is reported as its bucket's upper bound, at most this
    /// much above the exact value.
    static let growth = 1.04
    /// Values (µs) at or above this go to the last bucket.
    static let maxMicros: Double = 1e9
    static let bucketCount: Int = Int((log(maxMicros) / log(growth)).rounded(.up)) + 1

    private(set) var buckets: [UInt64] = Array(repeating: 0, count: LatencyHistogram.bucketCount)
    private(set) var count: UInt64 = 0
    private(set) var sumMicros: Double = 0
    private(set) var minMicros: UInt64 = .max
    private(set) var maxMicrosSeen: UInt64 = 0

    /// The bucket of `us` microseconds: 0 holds 0 and 1 µs, bucket i holds (growth^(i-1), growth^i].
    static func bucket(_ us: UInt64) -> Int {
        guard us > 1 else { return 0 }
        let i = Int((log(Double(us)) / log(growth)).rounded(.up))
        return min(max(i, 0), bucketCount - 1)
    }

    /// The largest value bucket `i` holds.
    static func upperBound(_ i: Int) -> Double { i == 0 ? 1 : pow(growth, Double(i)) }

    mutating func record(micros us: UInt64) {
        buckets[LatencyHistogram.bucket(us)] += 1
        count += 1
        sumMicros += Double(us)
        minMicros = min(minMicros, us)
        maxMicrosSeen = max(maxMicrosSeen, us)
    }

    mutating func merge(_ o: LatencyHistogram) {
        for i in 0..<buckets.count { buckets[i] += o.buckets[i] }
        count += o.count
        sumMicros += o.sumMicros
        minMicros = min(minMicros, o.minMicros)
        maxMicrosSeen = max(maxMicrosSeen, o.maxMicrosSeen)
    }

    /// The `p`-th percentile (0...100) in microseconds: the upper bound of the bucket holding the
    /// value of that rank, capped by the largest value seen; nil when empty.
    func percentile(_ p: Double) -> Double? {
        guard count > 0 else { return nil }
        let rank = max(1, UInt64((p / 100 * Double(count)).rounded(.up)))
        var seen: UInt64 = 0
        for (i, n) in buckets.enumerated() where n > 0 {
            seen += n
            if seen >= rank {
                return min(LatencyHistogram.upperBound(i), Double(maxMicrosSeen))
            }
        }
        return Double(maxMicrosSeen)
    }

    var meanMicros: Double? { count == 0 ? nil : sumMicros / Double(count) }

    /// The non-empty buckets as `[index, count]` pairs, and the largest value: what a merger of
    /// several processes' summaries needs to compute percentiles over all of them
    /// (tools/fleet/fleet.py does, with `upperBound`'s rule).
    var sparse: JSON {
        .array(buckets.enumerated().filter { $0.element > 0 }.map { .array([.int(Int64($0.offset)), .int(Int64($0.element))]) })
    }
}

#if canImport(Glibc)
import Glibc
#endif
