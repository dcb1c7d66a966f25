/// Requests awaiting replies, keyed by the host-issued id, each with a deadline — the table the
/// router forwards through. A value type with no I/O, unit-tested without sockets.
///
/// Cheap on the hot path: insert and remove are one dictionary operation each. Finding deadlines
/// is a scan, done only when the router's single timeout timer fires (armed for the earliest
/// deadline it knows of; none while nothing is pending), so it costs nothing per request.
struct PendingTable<Value> {
    private(set) var entries: [Int64: (value: Value, deadlineMs: UInt64)] = [:]

    var count: Int { entries.count }
    var isEmpty: Bool { entries.isEmpty }
    var values: some Collection<Value> { entries.values.lazy.map(\.value) }

    subscript(id: Int64) -> Value? { entries[id]?.value }

    mutating func insert(_ id: Int64, _ value: Value, deadlineMs: UInt64) {
        entries[id] = (value, deadlineMs)
    }

    /// Removes and returns the entry `id`.
    @discardableResult
    mutating func remove(_ id: Int64) -> Value? { entries.removeValue(forKey: id)?.value }

    /// Removes and returns the entry `id` if `accept` says yes to it (one lookup: the answer
    /// path's check and removal).
    mutating func remove(_ id: Int64, if accept: (Value) -> Bool) -> Value? {
        guard let i = entries.index(forKey: id), accept(entries.values[i].value) else { return nil }
        return entries.remove(at: i).value.value
    }

    /// The earliest deadline of a pending entry, or nil when nothing is pending (a scan).
    func nextDeadline() -> UInt64? { entries.values.lazy.map(\.deadlineMs).min() }

    /// Removes and returns every entry whose deadline is at or before `nowMs`, earliest first
    /// (ties by id).
    mutating func expired(nowMs: UInt64) -> [(id: Int64, value: Value)] {
        let due = entries.filter { $0.value.deadlineMs <= nowMs }
            .sorted { ($0.value.deadlineMs, $0.key) < ($1.value.deadlineMs, $1.key) }
        for e in due { entries[e.key] = nil }
        return due.map { ($0.key, $0.value.value) }
    }

    /// Ids of the entries matching `predicate`.
    func ids(where predicate: (Value) -> Bool) -> [Int64] {
        entries.filter { predicate($0.value.value) }.map(\.key).sorted()
    }
}
