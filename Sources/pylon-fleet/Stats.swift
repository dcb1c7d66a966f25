import PylonCore

/// The fleet's bookkeeping: value types, no I/O.

/// A first-in first-out queue: pushes at the tail, pops at the head, storage reclaimed as the
/// head moves on (amortised O(1)). A value type.
struct FIFO<Element> {
    private var items: [Element?] = []
    private var head = 0

    var count: Int { items.count - head }

    mutating func push(_ x: Element) { items.append(x) }

    mutating func pop() -> Element? {
        guard head < items.count else { return nil }
        let x = items[head]
        items[head] = nil
        head += 1
        if head == items.count {
            items.removeAll(keepingCapacity: items.count <= 4096)
            head = 0
        } else if head > 1024, head * 2 > items.count {
            items.removeFirst(head)
            head = 0
        }
        return x
    }
}

/// Sorted, disjoint half-open ranges of event sequence numbers (a device's acknowledged
/// events). Ranges usually arrive in order and merge into one.
struct RangeSet: Equatable {
    private(set) var ranges: [Range<Int64>] = []

    var count: Int64 { ranges.reduce(0) { $0 + Int64($1.count) } }

    func contains(_ x: Int64) -> Bool {
        var lo = 0
        var hi = ranges.count
        while lo < hi {
            let mid = (lo + hi) / 2
            if ranges[mid].upperBound <= x { lo = mid + 1 } else { hi = mid }
        }
        return lo < ranges.count && ranges[lo].contains(x)
    }

    mutating func insert(_ r: Range<Int64>) {
        guard !r.isEmpty else { return }
        if let last = ranges.last, last.upperBound == r.lowerBound {
            ranges[ranges.count - 1] = last.lowerBound..<r.upperBound
            return
        }
        if let last = ranges.last, last.upperBound < r.lowerBound {
            ranges.append(r)
            return
        }
        var all = ranges + [r]
        all.sort { $0.lowerBound < $1.lowerBound }
        var out: [Range<Int64>] = []
        for x in all {
            if let l = out.last, x.lowerBound <= l.upperBound {
                out[out.count - 1] = l.lowerBound..<max(l.upperBound, x.upperBound)
            } else {
                out.append(x)
            }
        }
        ranges = out
    }
}

/// What the store holds of the events the fleet sent, compared with what was acknowledged:
/// every acknowledged event must be read back exactly once. Devices are counted by their global
/// index, `first..<first + devices` (this process's share of a run split over several processes);
/// the run's other devices are `peer` records, not this process's to check.
struct StoredTally: Equatable {
    /// Per device: which sequence numbers were read back (bit per event).
    private var seen: [[UInt64]]
    let first: Int
    private(set) var read: Int64 = 0
    /// Read twice (a duplicate in the store or stream).
    private(set) var duplicates: Int64 = 0
    /// Ids that are not this run's (another run's, or malformed).
    private(set) var foreign: Int64 = 0
    /// This run's records of devices another process simulates.
    private(set) var peer: Int64 = 0

    init(devices: Int, first: Int = 0) {
        seen = Array(repeating: [], count: devices)
        self.first = first
    }

    /// A record id read back: `<runId>.<device>.<seq>`.
    mutating func add(id: Substring, runId: String) {
        guard let (g, s) = StoredTally.parse(id, runId: runId) else {
            foreign += 1
            return
        }
        let d = g - first
        guard d >= 0, d < seen.count else {
            peer += 1
            return
        }
        let word = Int(s >> 6)
        let bit = UInt64(1) << UInt64(s & 63)
        if seen[d].count <= word { seen[d].append(contentsOf: repeatElement(0, count: word + 1 - seen[d].count)) }
        if seen[d][word] & bit != 0 {
            duplicates += 1
            return
        }
        seen[d][word] |= bit
        read += 1
    }

    /// Whether event `seq` of the device with global index `device` was read back.
    func has(device: Int, seq: Int64) -> Bool {
        let word = Int(seq >> 6)
        let d = device - first
        guard d >= 0, d < seen.count, word < seen[d].count else { return false }
        return seen[d][word] & (UInt64(1) << UInt64(seq & 63)) != 0
    }

    /// Acknowledged events not read back.
    func lost(device: Int, acked: RangeSet) -> Int64 {
        var n: Int64 = 0
        for r in acked.ranges { for s in r where !has(device: device, seq: s) { n += 1 } }
        return n
    }

    static func recordId(runId: String, device: Int, seq: Int64) -> String { "\(runId).\(device).\(seq)" }

    static func parse(_ id: Substring, runId: String) -> (Int, Int64)? {
        let parts = id.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 3, parts[0] == runId, let d = Int(parts[1]), d >= 0, let s = Int64(parts[2]), s >= 0 else { return nil }
        return (d, s)
    }
}

/// Another process of the same run, as its `--status-file` says: whether its load ended with
/// every send answered (its list of broadcasts is then final), and the broadcasts it sent. A
/// value type; parsing only.
struct PeerStatus: Equatable {
    struct Broadcast: Equatable {
        var fsid: String
        var sentAtMs: Int64
    }
    /// A status file larger than this is refused (a run sends a few hundred broadcasts at most).
    static let maxFileBytes = 1 << 20

    var phase: String
    var sendsPending: Int
    var broadcasts: [Broadcast]

    var final: Bool { phase != "load" && sendsPending == 0 }

    static func parse(_ bytes: [UInt8]) -> PeerStatus? {
        guard let j = try? JSON.parse(String(decoding: bytes, as: UTF8.self)), let phase = j["phase"]?.stringValue else { return nil }
        var out: [Broadcast] = []
        for b in j["broadcasts"]?.arrayValue ?? [] {
            guard let f = b["fsid"]?.stringValue, let at = b["sentAtMs"]?.intValue else { return nil }
            out.append(Broadcast(fsid: f, sentAtMs: at))
        }
        return PeerStatus(phase: phase, sendsPending: Int(j["sendsPending"]?.intValue ?? 0), broadcasts: out)
    }
}

/// Periods when clearly fewer devices were connected than had connected so far: one starts when
/// the connected count falls below `target` less `slack` (1 %, at least one device, so a lone
/// device reconnecting is not an outage) and ends when the count is back to the target it had
/// at the start. A value type; time from arguments.
struct Connectivity: Equatable {
    struct Outage: Equatable {
        var startMs: Int64
        var endMs: Int64?
        var lowest: Int
        /// The devices connected before it began (the count that ends it).
        var target: Int
        var durationMs: Int64? { endMs.map { $0 - startMs } }
    }
    private(set) var outages: [Outage] = []

    static func slack(_ target: Int) -> Int { max(1, target / 100) }

    /// `target`: the devices that connected at least once so far.
    mutating func update(nowMs: Int64, connected: Int, target: Int) {
        guard target > 0 else { return }
        if var o = outages.last, o.endMs == nil {
            o.lowest = min(o.lowest, connected)
            if connected >= o.target { o.endMs = nowMs }
            outages[outages.count - 1] = o
        } else if connected < target - Connectivity.slack(target) {
            outages.append(Outage(startMs: nowMs, endMs: nil, lowest: connected, target: target))
        }
    }
}

/// A per-interval rate of a growing counter.
struct RateMeter: Equatable {
    private var lastValue: Int64?
    private var lastMs: Int64 = 0
    private(set) var rate: Double = 0

    mutating func sample(_ value: Int64, nowMs: Int64) {
        if let v = lastValue, nowMs > lastMs { rate = Double(value - v) * 1000 / Double(nowMs - lastMs) }
        lastValue = value
        lastMs = nowMs
    }
}

/// CPU and memory of a process from /proc: `utime + stime` (clock ticks) of /proc/PID/stat.
enum ProcStat {
    /// The CPU ticks (user + system) in the text of /proc/PID/stat: fields 14 and 15, counted
    /// after the command name's closing parenthesis (a name may hold spaces and parentheses).
    static func cpuTicks(stat: String) -> Int64? {
        guard let close = stat.lastIndex(of: ")") else { return nil }
        let fields = stat[stat.index(after: close)...].split(separator: " ")
        // After ")": state(3) ppid(4) ... utime(14) stime(15): indices 11 and 12.
        guard fields.count > 12, let u = Int64(fields[11]), let s = Int64(fields[12]) else { return nil }
        return u + s
    }

    /// The parent pid in the text of /proc/PID/stat (field 4).
    static func parentPid(stat: String) -> Int32? {
        guard let close = stat.lastIndex(of: ")") else { return nil }
        let fields = stat[stat.index(after: close)...].split(separator: " ")
        guard fields.count > 1 else { return nil }
        return Int32(fields[1])
    }

    /// VmRSS in KiB in the text of /proc/PID/status.
    static func rssKiB(status: String) -> Int? {
        for line in status.split(separator: "\n") where line.hasPrefix("VmRSS:") {
            return Int(line.dropFirst(6).filter { $0 >= "0" && $0 <= "9" })
        }
        return nil
    }

    /// A process's CPU share over an interval (1.0 = one core busy).
    static func cpuShare(ticks: Int64, previous: Int64, intervalMs: Int64, ticksPerSecond: Int64) -> Double {
        guard intervalMs > 0, ticksPerSecond > 0, ticks >= previous else { return 0 }
        return Double(ticks - previous) / Double(ticksPerSecond) / (Double(intervalMs) / 1000)
    }

    /// Lines `NAME PID` (the fleet script's pid file); others are ignored.
    static func parseWatchList(_ text: String) -> [(name: String, pid: Int32)] {
        text.split(separator: "\n").compactMap { line in
            let f = line.split(separator: " ")
            guard f.count == 2, let pid = Int32(f[1]), pid > 0 else { return nil }
            return (String(f[0]), pid)
        }
    }
}
