/// Requests awaiting replies, keyed by the host-issued id, each with a deadline — the table the
/// router forwards through. A value type with no I/O: the router asks it for the next deadline and
/// arms one timer for exactly that (no timer at all while nothing is pending).
///
/// Deadlines are kept in a min-heap; an entry taken before its deadline leaves a stale heap
/// entry behind, skipped when it surfaces and swept out when stale ones outnumber live ones.
struct PendingTable<Value> {
    private(set) var entries: [Int64: (value: Value, deadlineMs: UInt64)] = [:]
    private var heap: [(deadlineMs: UInt64, id: Int64)] = []

    var count: Int { entries.count }
    var isEmpty: Bool { entries.isEmpty }
    var values: some Collection<Value> { entries.values.lazy.map(\.value) }

    subscript(id: Int64) -> Value? { entries[id]?.value }

    mutating func insert(_ id: Int64, _ value: Value, deadlineMs: UInt64) {
        entries[id] = (value, deadlineMs)
        push((deadlineMs, id))
        if heap.count > 64 && heap.count > 2 * entries.count { compact() }
    }

    /// Removes and returns the entry `id`.
    @discardableResult
    mutating func remove(_ id: Int64) -> Value? { entries.removeValue(forKey: id)?.value }

    /// The earliest deadline of a live entry, or nil when nothing is pending.
    mutating func nextDeadline() -> UInt64? {
        while let top = heap.first {
            if let e = entries[top.id], e.deadlineMs == top.deadlineMs { return top.deadlineMs }
            pop()
        }
        return nil
    }

    /// Removes and returns every entry whose deadline is at or before `nowMs`, earliest first
    /// (ties by id).
    mutating func expired(nowMs: UInt64) -> [(id: Int64, value: Value)] {
        var out: [(id: Int64, value: Value)] = []
        while let top = heap.first, top.deadlineMs <= nowMs {
            pop()
            guard let e = entries[top.id], e.deadlineMs == top.deadlineMs else { continue }
            entries[top.id] = nil
            out.append((top.id, e.value))
        }
        return out
    }

    /// Ids of the entries matching `predicate`.
    func ids(where predicate: (Value) -> Bool) -> [Int64] {
        entries.filter { predicate($0.value.value) }.map(\.key).sorted()
    }

    // MARK: Heap

    private static func less(_ a: (deadlineMs: UInt64, id: Int64), _ b: (deadlineMs: UInt64, id: Int64)) -> Bool {
        a.deadlineMs != b.deadlineMs ? a.deadlineMs < b.deadlineMs : a.id < b.id
    }

    private mutating func push(_ x: (deadlineMs: UInt64, id: Int64)) {
        heap.append(x)
        var i = heap.count - 1
        while i > 0 {
            let parent = (i - 1) / 2
            guard Self.less(heap[i], heap[parent]) else { break }
            heap.swapAt(i, parent)
            i = parent
        }
    }

    private mutating func pop() {
        heap.swapAt(0, heap.count - 1)
        heap.removeLast()
        var i = 0
        while true {
            let l = 2 * i + 1, r = l + 1
            var m = i
            if l < heap.count && Self.less(heap[l], heap[m]) { m = l }
            if r < heap.count && Self.less(heap[r], heap[m]) { m = r }
            guard m != i else { return }
            heap.swapAt(i, m)
            i = m
        }
    }

    private mutating func compact() {
        let live = entries.map { (deadlineMs: $0.value.deadlineMs, id: $0.key) }
        heap = []
        for x in live { push(x) }
    }
}
