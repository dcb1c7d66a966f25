import PylonHTTP
import Testing

@testable import pylon_uploader

/// The per-stream queue machine (`StreamState` events → steps and effects), driven with a fake
/// clock and a fake disk: no SQLite, no HTTP, no timers.
struct QueueMachineTests {
    /// A clock the test moves by hand.
    struct FakeClock {
        var nowMs: UInt64 = 1_000
        mutating func advance(_ ms: UInt64) { nowMs += ms }
    }

    /// The disk as the shell would keep it: queued record sizes and cut batches.
    struct FakeDisk {
        var queued: [Int] = []
        var batches: [String: [Int]] = [:]
        var nextKey = 0
        mutating func cut(maxCount: Int, maxBytes: Int) -> (key: String, count: Int, bytes: Int) {
            var taken: [Int] = []
            var total = 0
            for b in queued.prefix(maxCount) {
                if !taken.isEmpty && total + b > maxBytes { break }
                taken.append(b)
                total += b
            }
            queued.removeFirst(taken.count)
            nextKey += 1
            let key = "b\(nextKey)"
            if !taken.isEmpty { batches[key] = taken }
            return (key, taken.count, total)
        }
    }

    static let noJitter = RetryPolicy(initialMs: 100, maxMs: 1_000, jitter: 0)

    func stream(maxCount: Int = 5, intervalMs: UInt64 = 1_000, maxBatchBytes: Int = 1_000) -> StreamState {
        var s = StreamSettings(endpoint: "http://x/{stream}")
        s.maxCount = maxCount
        s.intervalMs = intervalMs
        s.maxBatchBytes = maxBatchBytes
        return StreamState(settings: s)
    }

    /// A stream and the fake disk holding `n` committed 10-byte records (flushed when `flush`).
    func filled(_ n: Int, maxCount: Int, maxBatchBytes: Int, flush: Bool = false) -> (StreamState, FakeDisk) {
        var disk = FakeDisk()
        var st = stream(maxCount: maxCount, maxBatchBytes: maxBatchBytes)
        disk.queued = Array(repeating: 10, count: n)
        st.committed(added: n, bytes: 10 * n, now: 0)
        if flush { st.flush() }
        return (st, disk)
    }

    /// Polls and performs cuts on the fake disk until the machine sends or idles.
    func run(_ st: inout StreamState, _ disk: inout FakeDisk, now: UInt64, hold: UInt64? = nil) -> StreamState.Step {
        while true {
            let step = st.poll(now: now, endpointHeldUntil: hold)
            guard case .cut(let maxCount, let maxBytes) = step else { return step }
            let c = disk.cut(maxCount: maxCount, maxBytes: maxBytes)
            st.cut(batch: c.key, count: c.count, bytes: c.bytes)
        }
    }

    func sent(_ st: StreamState, _ disk: FakeDisk, final: Bool = false) -> StreamState.SentBatch {
        let key = st.pendingBatches[0]
        let b = disk.batches[key] ?? []
        return .init(key: key, count: b.count, bytes: b.reduce(0, +), final: final)
    }

    // MARK: Committed and the interval

    @Test func committedRecordsWaitForTheIntervalThenOneWakeSendsThem() {
        var clock = FakeClock()
        var disk = FakeDisk()
        var st = stream()
        disk.queued = [10, 20]
        st.committed(added: 2, bytes: 30, now: clock.nowMs)
        #expect(st.queued == 2 && st.queuedBytes == 30 && st.diskBytes == 30 && st.oldestMs == 1_000)
        #expect(run(&st, &disk, now: clock.nowMs) == .idle)
        #expect(st.nextWake(now: clock.nowMs) == 2_000, "one timer for the interval's end, no polling")
        clock.advance(999)
        #expect(run(&st, &disk, now: clock.nowMs) == .idle)
        clock.advance(1)
        #expect(st.lastCutTrigger == "none")
        #expect(run(&st, &disk, now: clock.nowMs) == .send(batch: "b1"))
        #expect(st.inFlight && st.queued == 0 && st.queuedBytes == 0 && st.oldestMs == nil)
        #expect(st.nextWake(now: clock.nowMs) == nil, "in flight: only the upload's answer moves it")
        #expect(st.lastCutTrigger == "interval" && st.lastCutOldestAgeMs == 1_000, "status: cut by the interval, at its end")
    }

    @Test func theLastCutSaysWhatMadeIt() {
        var (st, disk) = filled(6, maxCount: 5, maxBatchBytes: 1_000)
        #expect(run(&st, &disk, now: 40) == .send(batch: "b1"))
        #expect(st.lastCutTrigger == "count" && st.lastCutOldestAgeMs == 40)
        (st, disk) = filled(3, maxCount: 5, maxBatchBytes: 30)
        #expect(run(&st, &disk, now: 0) == .send(batch: "b1"))
        #expect(st.lastCutTrigger == "bytes" && st.lastCutOldestAgeMs == 0)
        (st, disk) = filled(1, maxCount: 5, maxBatchBytes: 1_000, flush: true)
        #expect(run(&st, &disk, now: 7) == .send(batch: "b1"))
        #expect(st.lastCutTrigger == "flush" && st.lastCutOldestAgeMs == 7)
    }

    @Test func laterCommitsKeepTheOldestTime() {
        var st = stream()
        st.committed(added: 1, bytes: 5, now: 100)
        st.committed(added: 1, bytes: 5, now: 900)
        #expect(st.oldestMs == 100 && st.queued == 2)
        st.committed(added: 0, bytes: 0, now: 950)  // all duplicates
        #expect(st.queued == 2 && st.diskBytes == 10)
    }

    @Test func exceedingMaxCountSendsAtOnce() {
        var disk = FakeDisk()
        var st = stream(maxCount: 2)
        disk.queued = [1, 1, 1]
        st.committed(added: 3, bytes: 3, now: 0)
        #expect(st.poll(now: 0) == .cut(maxCount: StreamSettings.maxCountLimit, maxBytes: 1_000))
        let c = disk.cut(maxCount: 500, maxBytes: 1_000)
        st.cut(batch: c.key, count: c.count, bytes: c.bytes)
        #expect(st.poll(now: 0) == .send(batch: "b1"))
    }

    @Test func aBatchIsCutWithinMaxBatchBytesAndTheRestStaysQueued() {
        var disk = FakeDisk()
        var st = stream(maxBatchBytes: 1_000)
        disk.queued = [600, 600, 600]
        st.committed(added: 3, bytes: 1_800, now: 0)
        #expect(run(&st, &disk, now: 0) == .send(batch: "b1"))
        #expect(st.queued == 2 && st.queuedBytes == 1_200, "two records still queued")
        #expect(st.oldestMs == 0, "the rest keeps its age")
    }

    // MARK: The stream emptied

    @Test func aCutOfNothingEmptiesTheStream() {
        var st = stream()
        st.committed(added: 3, bytes: 30, now: 0)
        st.flush()
        #expect(st.poll(now: 1) == .cut(maxCount: 500, maxBytes: 1_000))
        // The disk disagrees (records deleted under us): the machine resets, no send.
        st.cut(batch: "k", count: 0, bytes: 0)
        #expect(st.queued == 0 && st.queuedBytes == 0 && st.oldestMs == nil && !st.flushRequested)
        #expect(st.pendingBatches.isEmpty && st.poll(now: 2) == .idle && st.nextWake(now: 2) == nil)
        #expect(st.isDrained)
    }

    @Test func cuttingEverythingResetsTheFlushAndTheInterval() {
        var disk = FakeDisk()
        var st = stream()
        disk.queued = [1]
        st.committed(added: 1, bytes: 1, now: 0)
        st.flush()
        #expect(run(&st, &disk, now: 0) == .send(batch: "b1"))
        #expect(!st.flushRequested && st.oldestMs == nil)
    }

    // MARK: Upload outcomes

    @Test func deliveredDeletesReleasesAndSendsTheNextPendingBatch() {
        var disk = FakeDisk()
        var st = stream(maxBatchBytes: 1_000)
        disk.queued = [600, 600]
        st.committed(added: 2, bytes: 1_200, now: 0)
        #expect(run(&st, &disk, now: 0) == .send(batch: "b1"))
        let b = sent(st, disk)
        #expect(StreamState.disposal(of: b, .delivered) == .delete)
        let fx = st.uploadFinished(b, .delivered, now: 10, retry: Self.noJitter, random: 0.5)
        #expect(fx == [.release(bytes: 600)])
        #expect(st.delivered == 1 && st.diskBytes == 600 && st.attempts == 0 && !st.inFlight)
        #expect(st.lastResult == "delivered 1 records")
        // The leftover record exceeded no limit: it waits for its interval (0 + 1000).
        #expect(run(&st, &disk, now: 10) == .idle && st.nextWake(now: 10) == 1_000)
    }

    @Test func retryBacksOffWithTheSharedPolicyAndAWakeAtTheDeadline() {
        var clock = FakeClock()
        var disk = FakeDisk()
        var st = stream()
        disk.queued = [5]
        st.committed(added: 1, bytes: 5, now: clock.nowMs)
        st.flush()
        #expect(run(&st, &disk, now: clock.nowMs) == .send(batch: "b1"))
        let b = sent(st, disk)
        var delays: [UInt64] = []
        for _ in 0..<5 {
            let outcome = UploadOutcome.retry(reason: "HTTP 503", retryAfterMs: nil)
            #expect(StreamState.disposal(of: b, outcome) == .keep)
            #expect(st.uploadFinished(b, outcome, now: clock.nowMs, retry: Self.noJitter, random: 0.5) == [])
            delays.append(st.notBeforeMs - clock.nowMs)
            #expect(st.nextWake(now: clock.nowMs) == st.notBeforeMs)
            let due = st.notBeforeMs
            #expect(run(&st, &disk, now: due - 1) == .idle)
            clock.nowMs = due
            #expect(run(&st, &disk, now: clock.nowMs) == .send(batch: "b1"), "the same batch (same key) again")
        }
        #expect(delays == [100, 200, 400, 800, 1_000])
        #expect(st.attempts == 5 && st.lastResult == "retrying: HTTP 503" && st.pendingBatches == ["b1"])
        _ = st.uploadFinished(b, .delivered, now: clock.nowMs, retry: Self.noJitter, random: 0.5)
        #expect(st.attempts == 0 && st.notBeforeMs == 0 && st.isDrained)
    }

    /// A stream whose one queued record (5 bytes) was flushed and sent: batch "b1" in flight.
    func oneRecordInFlight() -> (StreamState, FakeDisk) {
        var disk = FakeDisk()
        var st = stream()
        disk.queued = [5]
        st.committed(added: 1, bytes: 5, now: 0)
        st.flush()
        _ = run(&st, &disk, now: 0)
        return (st, disk)
    }

    @Test func retryAfterHoldsTheEndpointAndWinsWhenLonger() {
        var (st, disk) = oneRecordInFlight()
        let b = sent(st, disk)
        let fx = st.uploadFinished(b, .retry(reason: "HTTP 429", retryAfterMs: 5_000), now: 100, retry: Self.noJitter, random: 0.5)
        #expect(fx == [.holdEndpoint(untilMs: 5_100)])
        #expect(st.notBeforeMs == 5_100 && st.lastRetryDelayMs == 5_000)
        #expect(run(&st, &disk, now: 5_200, hold: 6_000) == .idle, "the endpoint's hold is respected")
        #expect(run(&st, &disk, now: 6_000, hold: 6_000) == .send(batch: "b1"))
    }

    /// A huge Retry-After (18446744073709551 s crashed the uploader on `now + delay`; one more
    /// second overflows `* 1000`) waits `maxRetryAfterMs`, like any longer than that.
    @Test func aHugeRetryAfterWaitsTheCap() {
        #expect(HTTPResponse.retryAfterMs(" 18446744073709551 ") == 18_446_744_073_709_551_000)
        #expect(HTTPResponse.retryAfterMs("18446744073709552") == .max)
        #expect(HTTPResponse.retryAfterMs("120") == 120_000)
        #expect(HTTPResponse.retryAfterMs("-1") == nil && HTTPResponse.retryAfterMs("soon") == nil)
        var (st, disk) = oneRecordInFlight()
        var policy = Self.noJitter
        policy.maxRetryAfterMs = 60_000
        let fx = st.uploadFinished(sent(st, disk), .retry(reason: "HTTP 503", retryAfterMs: .max), now: 100, retry: policy, random: 0.5)
        #expect(fx == [.holdEndpoint(untilMs: 60_100)])
        #expect(st.notBeforeMs == 60_100 && st.lastRetryDelayMs == 60_000)
    }

    @Test func aFlushSkipsTheRetryWait() {
        var (st, disk) = oneRecordInFlight()
        _ = st.uploadFinished(sent(st, disk), .retry(reason: "x", retryAfterMs: nil), now: 10, retry: Self.noJitter, random: 0.5)
        #expect(run(&st, &disk, now: 11) == .idle)
        st.flush()
        #expect(run(&st, &disk, now: 11) == .send(batch: "b1"))
    }

    @Test func aFinalBatchIsPurgedAfterOneFailedAttempt() {
        var st = stream()
        st.committed(added: 2, bytes: 20, now: 0)
        st.finalized(cuts: [(key: "f1", count: 2, bytes: 20)])
        #expect(st.queued == 0 && st.pendingBatches == ["f1"] && st.notBeforeMs == 0)
        #expect(st.poll(now: 0) == .send(batch: "f1"))
        let b = StreamState.SentBatch(key: "f1", count: 2, bytes: 20, final: true)
        let outcome = UploadOutcome.retry(reason: "HTTP 500", retryAfterMs: nil)
        #expect(StreamState.disposal(of: b, outcome) == .delete)
        #expect(st.uploadFinished(b, outcome, now: 5, retry: Self.noJitter, random: 0.5) == [.release(bytes: 20)])
        #expect(st.attempts == 0 && st.isDrained && st.diskBytes == 0)
        #expect(st.lastResult == "final batch failed (HTTP 500); purged without retry")
    }

    @Test func finalizingKeepsWhatIsLeftQueuedAndClearsAWait() {
        var st = stream()
        st.committed(added: 3, bytes: 30, now: 0)
        st.notBeforeMs = 9_999
        st.finalized(cuts: [(key: "f1", count: 2, bytes: 20), (key: "f2", count: 0, bytes: 0)])
        #expect(st.pendingBatches == ["f1"] && st.queued == 1 && st.queuedBytes == 10 && st.oldestMs == 0)
        #expect(st.notBeforeMs == 0)
    }

    @Test func a413SplitsTheBatchInHalvesDownToOneThenDeadLetters() {
        var (st, disk) = filled(4, maxCount: 400, maxBatchBytes: 100_000, flush: true)
        #expect(run(&st, &disk, now: 0) == .send(batch: "b1"))
        var b = sent(st, disk)
        #expect(StreamState.disposal(of: b, .tooLarge) == .unbatch)
        // The shell dissolves the batch: its records are queued again.
        disk.queued = disk.batches.removeValue(forKey: "b1")! + disk.queued
        #expect(st.uploadFinished(b, .tooLarge, now: 1, retry: Self.noJitter, random: 0.5) == [])
        #expect(st.countCap == 2 && st.queued == 4 && st.queuedBytes == 40 && st.flushRequested)
        #expect(run(&st, &disk, now: 1) == .send(batch: "b2"))
        b = sent(st, disk)
        #expect(b.count == 2)
        disk.queued = disk.batches.removeValue(forKey: "b2")! + disk.queued
        _ = st.uploadFinished(b, .tooLarge, now: 2, retry: Self.noJitter, random: 0.5)
        #expect(st.countCap == 1)
        #expect(run(&st, &disk, now: 2) == .send(batch: "b3"))
        b = sent(st, disk)
        #expect(b.count == 1)
        #expect(StreamState.disposal(of: b, .tooLarge) == .deadLetter(status: 413, reason: "too large for the endpoint"))
        #expect(st.uploadFinished(b, .tooLarge, deadLettered: 1, now: 3, retry: Self.noJitter, random: 0.5) == [.release(bytes: 10)])
        #expect(st.deadLetters == 1 && st.lastResult == "413 for a single record; set aside as a dead letter")
        // The cap stays while records remain; it goes once the stream is empty.
        #expect(st.countCap == 1)
        for _ in 0..<3 {
            let step = run(&st, &disk, now: 4)
            #expect(step == .send(batch: st.pendingBatches.first ?? "?"))
            _ = st.uploadFinished(sent(st, disk), .delivered, now: 4, retry: Self.noJitter, random: 0.5)
        }
        #expect(st.isDrained && st.countCap == nil && st.delivered == 3)
    }

    @Test func a4xxDeadLettersTheBatch() {
        var st = stream()
        st.committed(added: 3, bytes: 30, now: 0)
        st.cut(batch: "k", count: 3, bytes: 30)
        #expect(st.poll(now: 0) == .send(batch: "k"))
        let b = StreamState.SentBatch(key: "k", count: 3, bytes: 30, final: false)
        let outcome = UploadOutcome.rejected(status: 400, reason: "HTTP 400")
        #expect(StreamState.disposal(of: b, outcome) == .deadLetter(status: 400, reason: "HTTP 400"))
        #expect(st.uploadFinished(b, outcome, deadLettered: 3, now: 1, retry: Self.noJitter, random: 0.5) == [.release(bytes: 30)])
        #expect(st.deadLetters == 3 && st.isDrained && st.diskBytes == 0)
        #expect(st.lastResult == "rejected (HTTP 400); 3 records set aside as dead letters")
    }

    /// Issue 21 item 8: dead letters stay on disk, so they stay charged (the disk cap and the
    /// owner's share) until they are re-queued or discarded; released at the set-aside, one uid
    /// grew the queue to 2.78 GB against a 64 MiB cap.
    @Test func deadLettersStayChargedUntilRemoved() {
        var st = stream()
        st.committed(added: 3, bytes: 30, now: 0)
        st.cut(batch: "k", count: 3, bytes: 30)
        #expect(st.poll(now: 0) == .send(batch: "k"))
        let b = StreamState.SentBatch(key: "k", count: 3, bytes: 30, final: false)
        let effects = st.uploadFinished(
            b, .rejected(status: 400, reason: "HTTP 400"), deadLettered: 3, deadLetterBytes: 36, now: 1, retry: Self.noJitter,
            random: 0.5)
        #expect(effects == [.release(bytes: 30), .charge(bytes: 36)])
        #expect(st.deadLetters == 3 && st.deadLetterBytes == 36 && st.setAside == 3)
        st.deadLettersRemoved(count: 2, bytes: 24)
        #expect(st.deadLetters == 1 && st.deadLetterBytes == 12 && st.setAside == 3)
    }

    /// A 401, 403 or 3xx (an expired proxy token, a moved endpoint) keeps the batch and retries
    /// it with backoff, shown in `lastResult`; the batch then goes and is delivered.
    @Test(arguments: [401, 403, 302]) func credentialAndRedirectAnswersAreRetried(status: Int) {
        var st = stream()
        st.committed(added: 2, bytes: 20, now: 0)
        st.cut(batch: "k", count: 2, bytes: 20)
        #expect(st.poll(now: 0) == .send(batch: "k"))
        let b = StreamState.SentBatch(key: "k", count: 2, bytes: 20, final: false)
        let outcome = UploadOutcome.classify(status: status, retryAfterMs: nil, error: nil)
        #expect(StreamState.disposal(of: b, outcome) == .keep)
        #expect(st.uploadFinished(b, outcome, now: 1, retry: Self.noJitter, random: 0.5) == [])
        #expect(st.attempts == 1 && st.lastResult.hasPrefix("retrying: HTTP \(status)") && st.deadLetters == 0)
        #expect(st.poll(now: 50) == .idle, "backoff")
        #expect(st.poll(now: 101) == .send(batch: "k"))
        _ = st.uploadFinished(b, .delivered, now: 102, retry: Self.noJitter, random: 0.5)
        #expect(st.delivered == 2 && st.isDrained)
    }

    // MARK: Local failures

    @Test func aFailedDiskUpdateKeepsTheBatchAndRetriesAfterAPause() {
        var st = stream()
        st.committed(added: 1, bytes: 10, now: 0)
        st.cut(batch: "k", count: 1, bytes: 10)
        _ = st.poll(now: 0)
        let b = StreamState.SentBatch(key: "k", count: 1, bytes: 10, final: false)
        #expect(st.uploadFinished(b, .delivered, diskOK: false, now: 50, retry: Self.noJitter, random: 0.5) == [])
        #expect(st.pendingBatches == ["k"] && st.diskBytes == 10 && st.delivered == 0 && !st.inFlight)
        #expect(st.nextWake(now: 50) == 50 + StreamState.storeErrorRetryMs)
        #expect(st.poll(now: 50 + StreamState.storeErrorRetryMs) == .send(batch: "k"))
    }

    @Test func aFailedCutOrLoadPausesTheStream() {
        var st = stream()
        st.committed(added: 1, bytes: 10, now: 0)
        st.flush()
        #expect(st.poll(now: 0) == .cut(maxCount: 500, maxBytes: 1_000))
        st.storeFailed(now: 0)
        #expect(st.poll(now: StreamState.storeErrorRetryMs - 1) == .idle)
        #expect(st.nextWake(now: 1) == StreamState.storeErrorRetryMs)
        st.cut(batch: "k", count: 1, bytes: 10)
        #expect(st.poll(now: StreamState.storeErrorRetryMs) == .send(batch: "k"))
        st.storeFailed(now: 2_000)  // the batch could not be loaded
        #expect(!st.inFlight && st.pendingBatches == ["k"] && st.poll(now: 2_999) == .idle)
    }

    @Test func anEmptyPendingBatchIsDroppedAndTheNextGoes() {
        var st = stream()
        st.pendingBatches = ["old", "next"]
        #expect(st.poll(now: 0) == .send(batch: "old"))
        st.batchWasEmpty("old")
        #expect(st.poll(now: 0) == .send(batch: "next"))
    }

    @Test func oneBatchAtATime() {
        var st = stream()
        st.pendingBatches = ["a", "b"]
        #expect(st.poll(now: 0) == .send(batch: "a"))
        #expect(st.poll(now: 0) == .prepare(batch: "b"), "b is read and compressed while a is in flight")
        #expect(st.poll(now: 0) == .idle, "a is in flight")
        _ = st.uploadFinished(.init(key: "a", count: 1, bytes: 0, final: false), .delivered, now: 0, retry: Self.noJitter, random: 0)
        #expect(st.poll(now: 0) == .send(batch: "b"))
        #expect(st.preparedAhead == nil && st.poll(now: 0) == .idle)
    }

    // MARK: Work ahead of the batch in flight

    @Test func theNextBatchIsCutAndPreparedWhileOneIsInFlightAndSentInOrder() {
        var (st, disk) = filled(12, maxCount: 5, maxBatchBytes: 50, flush: true)
        #expect(run(&st, &disk, now: 0) == .send(batch: "b1"))
        // In flight: one cut ahead, then its preparation, then nothing more this flight.
        #expect(run(&st, &disk, now: 0) == .prepare(batch: "b2"))
        #expect(st.pendingBatches == ["b1", "b2"] && st.cutAhead == AheadCut(key: "b2", count: 5, bytes: 50))
        #expect(st.queued == 2 && st.queuedBytes == 20)
        #expect(run(&st, &disk, now: 0) == .idle, "at most one batch cut ahead")
        #expect(st.nextWake(now: 0) == nil, "in flight: only the answer moves it")
        _ = st.uploadFinished(sent(st, disk), .delivered, now: 5, retry: Self.noJitter, random: 0.5)
        #expect(run(&st, &disk, now: 5) == .send(batch: "b2"), "the prepared batch goes next")
        #expect(st.cutAhead == nil && st.preparedAhead == nil)
        #expect(run(&st, &disk, now: 5) == .prepare(batch: "b3"), "the flush still asks for the rest")
        #expect(st.queued == 0 && !st.flushRequested)
        _ = st.uploadFinished(sent(st, disk), .delivered, now: 6, retry: Self.noJitter, random: 0.5)
        #expect(run(&st, &disk, now: 6) == .send(batch: "b3"))
        #expect(run(&st, &disk, now: 6) == .idle)
        _ = st.uploadFinished(sent(st, disk), .delivered, now: 7, retry: Self.noJitter, random: 0.5)
        #expect(st.isDrained && st.delivered == 12 && st.diskBytes == 0)
    }

    @Test func aBatchIsCutAheadOnlyWhenTheQueueWouldSendIt() {
        var disk = FakeDisk()
        var st = stream(maxCount: 5, intervalMs: 1_000)
        disk.queued = [10]
        st.committed(added: 1, bytes: 10, now: 0)
        st.flush()
        #expect(run(&st, &disk, now: 0) == .send(batch: "b1"))
        disk.queued = [10, 10]
        st.committed(added: 2, bytes: 20, now: 100)
        #expect(run(&st, &disk, now: 100) == .idle, "two records wait for their interval, flight or not")
        #expect(run(&st, &disk, now: 1_100) == .prepare(batch: "b2"), "the interval is over: cut ahead")
        #expect(st.pendingBatches == ["b1", "b2"] && st.queued == 0)
    }

    @Test func aRetryKeepsTheBatchPreparedAheadForAfterIt() {
        var disk = FakeDisk()
        var st = stream(maxCount: 1, maxBatchBytes: 10)
        disk.queued = [10, 10]
        st.committed(added: 2, bytes: 20, now: 0)
        #expect(run(&st, &disk, now: 0) == .send(batch: "b1"))
        #expect(run(&st, &disk, now: 0) == .prepare(batch: "b2"))
        let b1 = sent(st, disk)
        _ = st.uploadFinished(b1, .retry(reason: "HTTP 503", retryAfterMs: nil), now: 10, retry: Self.noJitter, random: 0.5)
        #expect(run(&st, &disk, now: 10) == .idle, "backing off")
        #expect(run(&st, &disk, now: 110) == .send(batch: "b1"), "the failed batch again, first")
        #expect(run(&st, &disk, now: 110) == .idle, "b2 is still prepared and nothing more is cut")
        #expect(st.preparedAhead == "b2" && st.cutAhead?.key == "b2")
        _ = st.uploadFinished(b1, .delivered, now: 120, retry: Self.noJitter, random: 0.5)
        #expect(run(&st, &disk, now: 120) == .send(batch: "b2"))
    }

    /// Eight 10-byte records, 4 per batch: b1 in flight, b2 cut and prepared ahead.
    func inFlightWithOneCutAhead() -> (StreamState, FakeDisk, StreamState.SentBatch) {
        var (st, disk) = filled(8, maxCount: 2, maxBatchBytes: 40)
        #expect(run(&st, &disk, now: 0) == .send(batch: "b1"))
        #expect(run(&st, &disk, now: 0) == .prepare(batch: "b2"))
        return (st, disk, sent(st, disk))
    }

    @Test func a413DissolvesTheBatchCutAheadSoTheRecordsGoAgainInOrder() {
        let (start, startDisk, b1) = inFlightWithOneCutAhead()
        var st = start, disk = startDisk
        #expect(b1.count == 4 && st.queued == 0)
        // The shell dissolves both on disk, in one transaction: their records are queued again.
        disk.queued = disk.batches.removeValue(forKey: "b1")! + disk.batches.removeValue(forKey: "b2")! + disk.queued
        _ = st.uploadFinished(b1, .tooLarge, dissolvedAhead: true, now: 1, retry: Self.noJitter, random: 0.5)
        #expect(st.pendingBatches.isEmpty && st.cutAhead == nil && st.preparedAhead == nil)
        #expect(st.queued == 8 && st.queuedBytes == 80 && st.countCap == 2)
        #expect(run(&st, &disk, now: 1) == .send(batch: "b3"))
        #expect(sent(st, disk).count == 2)
    }

    @Test func a413KeepsABatchCutAheadThatBecameFinal() {
        let (start, startDisk, b1) = inFlightWithOneCutAhead()
        var st = start, disk = startDisk
        disk.queued = disk.batches.removeValue(forKey: "b1")! + disk.queued
        _ = st.uploadFinished(b1, .tooLarge, dissolvedAhead: false, now: 1, retry: Self.noJitter, random: 0.5)
        #expect(st.pendingBatches == ["b2"] && st.queued == 4)
        #expect(run(&st, &disk, now: 1) == .send(batch: "b2"), "the kept batch goes first")
    }
}
