import Testing

@testable import PylonHost

/// The forwarded-request table without sockets: deadlines on a fake clock, take, expiry order,
/// stale heap entries, and the by-target index a closing peer's requests come from.
struct PendingTableTests {
    @Test func nextDeadlineIsTheEarliestLiveOne() {
        var t = PendingTable<String>()
        #expect(t.nextDeadline() == nil, "nothing pending: no timer")
        t.insert(1, "a", target: 1, deadlineMs: 300)
        t.insert(2, "b", target: 1, deadlineMs: 100)
        t.insert(3, "c", target: 2, deadlineMs: 200)
        #expect(t.nextDeadline() == 100)
        #expect(t.remove(2) == "b")
        #expect(t.nextDeadline() == 200, "an answered request no longer arms the timer")
        #expect(t.remove(2) == nil)
    }

    @Test func expiredReturnsDueEntriesEarliestFirstAndKeepsTheRest() {
        var t = PendingTable<String>()
        for (id, d) in [(5, 50), (1, 10), (3, 30), (2, 10), (9, 90)] {
            t.insert(Int64(id), "r\(id)", target: UInt64(id % 2), deadlineMs: UInt64(d))
        }
        t.remove(3)
        let due = t.expired(nowMs: 50)
        #expect(due.map(\.id) == [1, 2, 5], "deadline order, ties by id; the taken one is skipped")
        #expect(t.count == 1 && t[9] == "r9")
        #expect(t.expired(nowMs: 89).isEmpty)
        #expect(t.nextDeadline() == 90)
        #expect(t.expired(nowMs: 1000).map(\.id) == [9])
        #expect(t.isEmpty && t.nextDeadline() == nil)
        #expect(t.count(targeting: 0) == 0 && t.count(targeting: 1) == 0, "expired entries leave the target index")
    }

    /// A fake clock: requests issued every ms with a 30 ms timeout, most answered at once; the
    /// timer (the earliest deadline) fires and expires exactly the unanswered ones, on time.
    @Test func aFakeClockExpiresTheUnansweredOnesOnTime() {
        var t = PendingTable<Int>()
        var now: UInt64 = 0
        var expired: [(at: UInt64, id: Int64)] = []
        for i in 0..<1_000 {
            now = UInt64(i)
            t.insert(Int64(i), i, target: 7, deadlineMs: now + 30)
            if i % 10 != 0 { t.remove(Int64(i)) }  // answered
            while let d = t.nextDeadline(), d <= now { expired += t.expired(nowMs: now).map { (at: now, id: $0.id) } }
        }
        #expect(expired.count == 97, "ids 0, 10, … 960 expired; 970-990 still pending")
        #expect(expired.allSatisfy { $0.at == UInt64($0.id) + 30 }, "each at its own deadline, not later")
        #expect(t.count == 3 && t.count(targeting: 7) == 3)
        #expect(t.heapCount <= 2 * t.count + 64 + 2, "answered requests do not pile up in the heap")
    }

    @Test func manyAnsweredRequestsDoNotGrowTheTable() {
        var t = PendingTable<Int>()
        for i in 0..<10_000 {
            t.insert(Int64(i), i, target: UInt64(i % 3), deadlineMs: UInt64(1000 + i))
            if i >= 64 { t.remove(Int64(i - 64)) }
        }
        #expect(t.count == 64)
        #expect(t.heapCount <= 2 * 64 + 64 + 1, "stale heap entries are compacted")
        #expect(t.nextDeadline() == UInt64(1000 + 10_000 - 64))
        #expect(t.expired(nowMs: UInt64.max).count == 64)
    }

    @Test func takeAllTargetingReturnsOnlyThatTargetsRequestsByIdAndForgetsIt() {
        var t = PendingTable<String>()
        t.insert(7, "x7", target: 1, deadlineMs: 5)
        t.insert(4, "y4", target: 2, deadlineMs: 1)
        t.insert(5, "x5", target: 1, deadlineMs: 9)
        t.insert(6, "x6", target: 1, deadlineMs: 2)
        t.remove(6)
        #expect(t.count(targeting: 1) == 2 && t.count(targeting: 2) == 1)
        let taken = t.takeAll(targeting: 1)
        #expect(taken.map(\.id) == [5, 7] && taken.map(\.value) == ["x5", "x7"], "by id, without the answered one")
        #expect(t.count == 1 && t[4] == "y4")
        #expect(t.takeAll(targeting: 1).isEmpty)
        #expect(t.nextDeadline() == 1)
        #expect(t.expired(nowMs: 100).map(\.id) == [4], "taken entries do not expire later")
        #expect(t.ids { $0.hasPrefix("x") }.isEmpty)
    }

    @Test func theAnswerPathRemovesOnlyWhatItAccepts() {
        var t = PendingTable<String>()
        t.insert(1, "a", target: 3, deadlineMs: 10)
        #expect(t.remove(1, if: { $0 == "b" }) == nil)
        #expect(t.count(targeting: 3) == 1)
        #expect(t.remove(1, if: { $0 == "a" }) == "a")
        #expect(t.count(targeting: 3) == 0 && t.isEmpty && t.nextDeadline() == nil)
    }

    @Test func idsWhereSelectsByValue() {
        var t = PendingTable<String>()
        t.insert(7, "x", target: 0, deadlineMs: 1)
        t.insert(4, "y", target: 0, deadlineMs: 1)
        t.insert(5, "x", target: 0, deadlineMs: 1)
        #expect(t.ids { $0 == "x" } == [5, 7])
    }
}
