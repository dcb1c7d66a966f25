/// Requests awaiting replies, keyed by the host-issued id, each with a deadline and the peer it
/// was sent to — the table the router forwards through. A value type with no I/O and no clock,
/// unit-tested without sockets (PendingTableTests, with a fake clock).
///
/// Cheap on the hot path and no scan anywhere:
/// - insert: one dictionary insert, one push on a binary heap of deadlines, one insert in the
///   target's id set; remove (an answer): one dictionary removal and one set removal — the heap
///   entry is left behind and skipped when it reaches the top (`isLive`), and the heap is
///   compacted in place once stale entries outnumber live ones;
/// - the earliest deadline is the heap's top (the router's single timeout timer is armed for it);
///   expiry pops due entries in deadline order;
/// - a closed target's requests come from its id set (`takeAll(targeting:)`), not from a scan and
///   sort of the whole table.
///
/// No storage is allocated per request once the table has grown to its working size (a target's
/// set is kept while the target lives, even when empty).
struct PendingTable<Value> {
    private struct Entry {
        var value: Value
        var deadlineMs: UInt64
        var target: UInt64
    }

    private struct Due: Comparable {
        var deadlineMs: UInt64
        var id: Int64
        static func < (a: Due, b: Due) -> Bool { (a.deadlineMs, a.id) < (b.deadlineMs, b.id) }
    }

    private var entries: [Int64: Entry] = [:]
    /// Min-heap of (deadline, id); may hold ids already removed (stale).
    private var heap: [Due] = []
    /// Ids pending per target peer.
    private var byTarget: [UInt64: Set<Int64>] = [:]

    var count: Int { entries.count }
    var isEmpty: Bool { entries.isEmpty }
    var values: some Collection<Value> { entries.values.lazy.map(\.value) }
    /// Heap entries held, live and stale (bounded by about twice `count`; for tests).
    var heapCount: Int { heap.count }

    subscript(id: Int64) -> Value? { entries[id]?.value }

    mutating func insert(_ id: Int64, _ value: Value, target: UInt64, deadlineMs: UInt64) {
        if let old = entries.updateValue(Entry(value: value, deadlineMs: deadlineMs, target: target), forKey: id), old.target != target {
            byTarget[old.target]?.remove(id)
        }
        byTarget[target, default: []].insert(id)
        push(Due(deadlineMs: deadlineMs, id: id))
    }

    /// Removes and returns the entry `id`.
    @discardableResult
    mutating func remove(_ id: Int64) -> Value? {
        guard let e = entries.removeValue(forKey: id) else { return nil }
        byTarget[e.target]?.remove(id)
        compactIfStale()
        return e.value
    }

    /// Removes and returns the entry `id` if `accept` says yes to it (one lookup: the answer
    /// path's check and removal).
    mutating func remove(_ id: Int64, if accept: (Value) -> Bool) -> Value? {
        guard let i = entries.index(forKey: id), accept(entries.values[i].value) else { return nil }
        let e = entries.remove(at: i).value
        byTarget[e.target]?.remove(id)
        compactIfStale()
        return e.value
    }

    /// The earliest deadline of a pending entry, or nil when nothing is pending (stale heap tops
    /// are dropped on the way).
    mutating func nextDeadline() -> UInt64? {
        while let top = heap.first {
            if isLive(top) { return top.deadlineMs }
            popTop()
        }
        return nil
    }

    /// Removes and returns every entry whose deadline is at or before `nowMs`, earliest first
    /// (ties by id).
    mutating func expired(nowMs: UInt64) -> [(id: Int64, value: Value)] {
        var due: [(id: Int64, value: Value)] = []
        while let top = heap.first, top.deadlineMs <= nowMs {
            popTop()
            guard isLive(top), let e = entries.removeValue(forKey: top.id) else { continue }
            byTarget[e.target]?.remove(top.id)
            due.append((top.id, e.value))
        }
        return due
    }

    /// How many entries are pending at `target`.
    func count(targeting target: UInt64) -> Int { byTarget[target]?.count ?? 0 }

    /// Removes and returns every entry sent to `target`, by id, and forgets the target (it closed).
    mutating func takeAll(targeting target: UInt64) -> [(id: Int64, value: Value)] {
        guard let ids = byTarget.removeValue(forKey: target) else { return [] }
        let taken = ids.sorted().compactMap { id in entries.removeValue(forKey: id).map { (id, $0.value) } }
        compactIfStale()
        return taken
    }

    /// Ids of the entries matching `predicate`, ascending (a scan: for tests and reports).
    func ids(where predicate: (Value) -> Bool) -> [Int64] {
        entries.filter { predicate($0.value.value) }.map(\.key).sorted()
    }

    // MARK: The heap

    private func isLive(_ d: Due) -> Bool { entries[d.id]?.deadlineMs == d.deadlineMs }

    private mutating func push(_ d: Due) {
        heap.append(d)
        siftUp(heap.count - 1)
    }

    private mutating func popTop() {
        let last = heap.removeLast()
        guard !heap.isEmpty else { return }
        heap[0] = last
        siftDown(0)
    }

    private mutating func siftUp(_ start: Int) {
        var i = start
        while i > 0 {
            let parent = (i - 1) / 2
            guard heap[i] < heap[parent] else { return }
            heap.swapAt(i, parent)
            i = parent
        }
    }

    private mutating func siftDown(_ start: Int) {
        var i = start
        let n = heap.count
        while true {
            let l = 2 * i + 1
            guard l < n else { return }
            var m = l
            if l + 1 < n, heap[l + 1] < heap[l] { m = l + 1 }
            guard heap[m] < heap[i] else { return }
            heap.swapAt(i, m)
            i = m
        }
    }

    /// Stale entries (answered requests) leave the heap in place, without allocating, once they
    /// are more than the live ones (amortised: after at least `count + 64` removals).
    private mutating func compactIfStale() {
        guard heap.count > 2 * entries.count + 64 else { return }
        let live = entries  // a reference, not a copy (read only)
        heap.removeAll { live[$0.id]?.deadlineMs != $0.deadlineMs }
        var i = heap.count / 2
        while i > 0 {
            i -= 1
            siftDown(i)
        }
    }
}
