/// Requests waiting for a plugin that is `starting` or in `backoff` (as D-Bus activation queues a
/// call): they go through once it runs, in order; each is answered `-32002` when its request
/// deadline passes first, and all `-32001` when the plugin ends `failed` or `stopped`. Bounded
/// by a count and by the bytes of the lines held (`limits.maxStartWaiters`,
/// `maxStartWaitBytes`): past either the request is answered `-32001` at once.
///
/// A value with no I/O and no clock (times are passed in): `Bus` keeps one per plugin
/// (`PluginSlot.waiting`) and performs what it returns (Bus+StartWait.swift). Unit-tested in
/// StartWaitQueueTests.
struct StartWaitQueue<Item> {
    struct Entry {
        let item: Item
        let bytes: Int
        let deadlineMs: UInt64
    }

    private(set) var entries: [Entry] = []
    private(set) var bytes = 0
    /// Requests that waited and went through (or not) since the host started: `bus.status`.
    private(set) var admittedTotal: UInt64 = 0

    var count: Int { entries.count }
    var isEmpty: Bool { entries.isEmpty }
    /// The earliest deadline of a waiting request (when the host must look again).
    var nextDeadlineMs: UInt64? { entries.lazy.map(\.deadlineMs).min() }

    /// Whether a plugin in `state` makes a request wait (`starting`, `backoff`), rather than
    /// answering `-32001` at once (`failed`, `stopped`).
    static func waits(in state: PluginLifecycle.State) -> Bool { state == .starting || state == .backoff }

    /// Queues `item` (its line `bytes` long, answered by `deadlineMs`); false when the queue is
    /// at `maxCount` requests or would pass `maxBytes`.
    mutating func admit(_ item: Item, bytes n: Int, deadlineMs: UInt64, maxCount: Int, maxBytes: Int) -> Bool {
        guard entries.count < maxCount, bytes + n <= maxBytes else { return false }
        entries.append(Entry(item: item, bytes: n, deadlineMs: deadlineMs))
        bytes += n
        admittedTotal += 1
        return true
    }

    /// Removes and returns the requests whose deadline is at or before `nowMs`, in order.
    mutating func expire(nowMs: UInt64) -> [Item] {
        var gone: [Item] = []
        entries.removeAll { e in
            guard e.deadlineMs <= nowMs else { return false }
            gone.append(e.item)
            bytes -= e.bytes
            return true
        }
        return gone
    }

    /// Removes and returns every waiting request, in arrival order (the plugin runs, or will not).
    mutating func drain() -> [Entry] {
        let all = entries
        entries.removeAll()
        bytes = 0
        return all
    }
}
