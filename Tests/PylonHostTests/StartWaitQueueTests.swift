import Testing

@testable import PylonHost

/// The queue of requests waiting for a starting plugin (issue 36 item 3), on a fake clock.
@Suite struct StartWaitQueueTests {
    @Test func onlyStartingAndBackoffMakeACallWait() {
        #expect(StartWaitQueue<Int>.waits(in: .starting) && StartWaitQueue<Int>.waits(in: .backoff))
        #expect(!StartWaitQueue<Int>.waits(in: .failed) && !StartWaitQueue<Int>.waits(in: .stopped))
        #expect(!StartWaitQueue<Int>.waits(in: .running))
    }

    @Test func boundedByCountAndBytes() {
        var q = StartWaitQueue<Int>()
        var admitted: [Bool] = []
        for (item, bytes) in [(1, 10), (2, 16), (3, 15), (4, 0)] {
            admitted.append(q.admit(item, bytes: bytes, deadlineMs: 100, maxCount: 2, maxBytes: 25))
        }
        // 2: over the bytes; 4: over the count.
        #expect(admitted == [true, false, true, false])
        #expect(q.count == 2 && q.bytes == 25 && q.admittedTotal == 2)
    }

    @Test func deadlinesExpireAndTheRestGoThroughInOrder() {
        var q = StartWaitQueue<String>()
        for (name, deadline) in [("a", 300), ("b", 100), ("c", 200), ("d", 500)] {
            _ = q.admit(name, bytes: 1, deadlineMs: UInt64(deadline), maxCount: 8, maxBytes: 8)
        }
        #expect(q.count == 4 && q.nextDeadlineMs == 100)
        let none = q.expire(nowMs: 99)
        let early = q.expire(nowMs: 200)
        #expect(none.isEmpty && early == ["b", "c"])
        #expect(q.nextDeadlineMs == 300 && q.bytes == 2)
        let rest = q.drain().map(\.item)
        #expect(rest == ["a", "d"])
        #expect(q.isEmpty && q.bytes == 0 && q.nextDeadlineMs == nil && q.admittedTotal == 4)
    }
}
