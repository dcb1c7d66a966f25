import Testing

@testable import pylon_uploader

/// The uploader's pure decisions: when to send, how to classify a response, how long to wait.
struct StreamStateTests {
    func state(_ f: (inout StreamSettings) -> Void = { _ in }) -> StreamState {
        var s = StreamSettings(endpoint: "http://x/{stream}")
        s.maxCount = 5
        s.intervalMs = 1000
        s.maxBatchBytes = 1000
        f(&s)
        return StreamState(settings: s)
    }

    @Test func nothingQueuedNothingSent() {
        #expect(!state().shouldSend(now: 10_000))
    }

    @Test func sendsWhenTheCountIsExceeded() {
        var s = state()
        s.queued = 5
        s.oldestMs = 0
        #expect(!s.shouldSend(now: 10), "maxCount 5 held: the SDK waits")
        s.queued = 6
        #expect(s.shouldSend(now: 10))
    }

    @Test func sendsWhenBytesReached() {
        var s = state()
        s.queued = 1
        s.queuedBytes = 1000
        s.oldestMs = 0
        #expect(s.shouldSend(now: 1))
    }

    @Test func sendsWhenIntervalElapsed() {
        var s = state()
        s.queued = 1
        s.oldestMs = 100
        #expect(!s.shouldSend(now: 1099))
        #expect(s.shouldSend(now: 1100))
    }

    @Test func flushSendsAtOnce() {
        var s = state()
        s.queued = 1
        s.oldestMs = 100
        s.flushRequested = true
        #expect(s.shouldSend(now: 101))
    }

    @Test func oneBatchInFlightAtATimeAndBackoffIsRespected() {
        var s = state()
        s.pendingBatches = ["k"]
        s.inFlight = true
        #expect(!s.shouldSend(now: 1))
        s.inFlight = false
        s.notBeforeMs = 500
        #expect(!s.shouldSend(now: 499))
        #expect(s.shouldSend(now: 500))
    }

    @Test func a413CapShrinksBatchesAndSendsAtTheCap() {
        var s = state { $0.maxCount = 400 }
        s.countCap = 1
        s.queued = 1
        s.oldestMs = 0
        #expect(s.batchLimit == 1)
        #expect(s.shouldSend(now: 10), "a split batch is resent without waiting for more records")
    }

    @Test(arguments: [
        (200, UploadOutcome.delivered), (204, .delivered),
        (408, .retry(reason: "HTTP 408", retryAfterMs: nil)), (429, .retry(reason: "HTTP 429", retryAfterMs: nil)),
        (500, .retry(reason: "HTTP 500", retryAfterMs: nil)), (503, .retry(reason: "HTTP 503", retryAfterMs: nil)),
        (413, .tooLarge), (400, .rejected(status: 400, reason: "HTTP 400")), (404, .rejected(status: 404, reason: "HTTP 404")),
        // An expired proxy token or a moved endpoint says nothing about the records: retried,
        // not set aside (issue 21 item 8).
        (401, .retry(reason: "HTTP 401 (credentials refused)", retryAfterMs: nil)),
        (403, .retry(reason: "HTTP 403 (credentials refused)", retryAfterMs: nil)),
        (302, .retry(reason: "HTTP 302 (redirects are not followed)", retryAfterMs: nil)),
        (307, .retry(reason: "HTTP 307 (redirects are not followed)", retryAfterMs: nil)),
    ])
    func classifiesStatuses(status: Int, expected: UploadOutcome) {
        #expect(UploadOutcome.classify(status: status, retryAfterMs: nil, error: nil) == expected)
    }

    @Test func noResponseIsRetried() {
        #expect(
            UploadOutcome.classify(status: nil, retryAfterMs: nil, error: "connection refused")
                == .retry(reason: "connection refused", retryAfterMs: nil))
    }

    @Test func retryDelayDoublesCapsJittersAndHonoursRetryAfter() {
        let p = RetryPolicy(initialMs: 100, maxMs: 1000, jitter: 0)
        let d = (1...6).map { StreamState.retryDelay(attempts: $0, policy: p, retryAfterMs: nil, random: 0.5) }
        #expect(d == [100, 200, 400, 800, 1000, 1000])
        #expect(StreamState.retryDelay(attempts: 1, policy: p, retryAfterMs: 5000, random: 0.5) == 5000)
        let j = RetryPolicy(initialMs: 1000, maxMs: 100_000, jitter: 0.2)
        #expect(StreamState.retryDelay(attempts: 1, policy: j, retryAfterMs: nil, random: 0) == 800)
        #expect(StreamState.retryDelay(attempts: 1, policy: j, retryAfterMs: nil, random: 0.999_999) <= 1200)
    }

    // MARK: Batches prepared off the loop

    /// Prepared ahead, then sent: posted when its compression is done, or at once when it was.
    @Test func aBatchPreparedAheadIsPostedByItsSend() {
        let loaded = LoadedBatch(gz: [1, 2], count: 2, recordBytes: 20)
        var s = state()
        s.startPreparing("b1")
        #expect(s.preparationFinished("b1", loaded) == .kept)
        #expect(s.startSend("b1", to: "e") == .upload(loaded))
        #expect(s.prepared.isEmpty)

        s.startPreparing("b2")
        #expect(s.startSend("b2", to: "e") == .waitForCompression)
        #expect(s.preparationFinished("b2", loaded) == .upload(loaded, endpoint: "e"))
        #expect(s.prepared.isEmpty)
    }

    /// Sent without being prepared: read now, posted when done, the stream backing off when
    /// the read fails; a failed preparation ahead is not kept (the send reads again); one
    /// dissolved meanwhile is dropped.
    @Test func aBatchNotPreparedIsReadAtItsSend() {
        let loaded = LoadedBatch(gz: [], count: 0, recordBytes: 0)
        var s = state()
        #expect(s.startSend("b1", to: "e") == .load)
        #expect(s.preparationFinished("b1", nil) == .failed)
        #expect(s.prepared.isEmpty)

        s.startPreparing("b2")
        #expect(s.preparationFinished("b2", nil) == .kept)
        #expect(s.startSend("b2", to: "e") == .load, "a failure is read again")
        #expect(s.preparationFinished("b2", loaded) == .upload(loaded, endpoint: "e"))

        s.startPreparing("b3")
        s.dropPreparation("b3")
        #expect(s.preparationFinished("b3", loaded) == .nothing)
        #expect(s.prepared.isEmpty)
    }
}
