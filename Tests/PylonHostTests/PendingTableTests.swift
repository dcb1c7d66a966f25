import Testing

@testable import PylonHost

/// The forwarded-request table without sockets: deadlines, take, expiry order, stale heap entries.
struct PendingTableTests {
    @Test func nextDeadlineIsTheEarliestLiveOne() {
        var t = PendingTable<String>()
        #expect(t.nextDeadline() == nil, "nothing pending: no timer")
        t.insert(1, "a", deadlineMs: 300)
        t.insert(2, "b", deadlineMs: 100)
        t.insert(3, "c", deadlineMs: 200)
        #expect(t.nextDeadline() == 100)
        #expect(t.remove(2) == "b")
        #expect(t.nextDeadline() == 200, "an answered request no longer arms the timer")
        #expect(t.remove(2) == nil)
    }

    @Test func expiredReturnsDueEntriesEarliestFirstAndKeepsTheRest() {
        var t = PendingTable<String>()
        for (id, d) in [(5, 50), (1, 10), (3, 30), (2, 10), (9, 90)] { t.insert(Int64(id), "r\(id)", deadlineMs: UInt64(d)) }
        t.remove(3)
        let due = t.expired(nowMs: 50)
        #expect(due.map(\.id) == [1, 2, 5], "deadline order, ties by id; the taken one is skipped")
        #expect(t.count == 1 && t[9] == "r9")
        #expect(t.expired(nowMs: 89).isEmpty)
        #expect(t.nextDeadline() == 90)
        #expect(t.expired(nowMs: 1000).map(\.id) == [9])
        #expect(t.isEmpty && t.nextDeadline() == nil)
    }

    @Test func manyAnsweredRequestsDoNotGrowTheTable() {
        var t = PendingTable<Int>()
        for i in 0..<10_000 {
            t.insert(Int64(i), i, deadlineMs: UInt64(1000 + i))
            if i >= 64 { t.remove(Int64(i - 64)) }
        }
        #expect(t.count == 64)
        #expect(t.nextDeadline() == UInt64(1000 + 10_000 - 64))
        #expect(t.expired(nowMs: UInt64.max).count == 64)
    }

    @Test func idsWhereSelectsByValue() {
        var t = PendingTable<String>()
        t.insert(7, "x", deadlineMs: 1)
        t.insert(4, "y", deadlineMs: 1)
        t.insert(5, "x", deadlineMs: 1)
        #expect(t.ids { $0 == "x" } == [5, 7])
    }
}
