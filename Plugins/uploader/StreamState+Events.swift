/// The per-stream upload queue as a machine: the shell (`Uploader`) feeds it events — records
/// committed, a batch cut, an upload finished with an outcome, consent denied, a flush — and
/// performs the actions it returns (cut a batch, send one, delete, dead-letter or dissolve one,
/// release disk bytes, hold an endpoint). It never touches the disk, the network or a clock:
/// every time is an argument, so tests drive it with a fake clock.
///
/// One batch is in flight per stream at a time (order is kept). While it is, the next one is cut
/// and read and compressed ahead (`Step.prepare`), so it goes the moment the backend answers:
/// the uploader's side of a batch overlaps the backend's ingest of the one before instead of
/// following it. The shell asks `poll` what to do next after every event; `nextWake` says when
/// to ask without one.
extension StreamState {
    /// How long a stream waits after a local failure (disk, gzip) before trying again.
    static let storeErrorRetryMs: UInt64 = 1_000

    /// What the stream wants done now.
    enum Step: Equatable {
        /// Nothing until an event or `nextWake`.
        case idle
        /// Cut the oldest queued records (at most this many and bytes, at least one) into a new
        /// batch on disk, then report `cut`.
        case cut(maxCount: Int, maxBytes: Int)
        /// Send this batch (now marked in flight), then report `uploadFinished`.
        case send(batch: String)
        /// Read and compress this pending batch now, while the one before it is in flight; it is
        /// sent by a later `send` of the same key. Nothing is reported back.
        case prepare(batch: String)
    }

    /// What to do with a finished batch on disk, before `uploadFinished` is reported.
    enum Disposal: Equatable {
        /// Delivered, or a final batch that failed: the records are gone.
        case delete
        /// Kept for a retry.
        case keep
        /// Set aside as dead letters (4xx, 3xx, or 413 for a single record or a final batch).
        case deadLetter(status: Int, reason: String)
        /// Dissolved so its records are cut again in smaller batches (413).
        case unbatch
    }

    /// Bookkeeping the shell does after a finished upload.
    enum Effect: Equatable {
        /// These record bytes left the disk (the disk cap and the owner's share shrink).
        case release(bytes: Int)
        /// Dead letters of these bytes were written (the disk cap and the owner's share grow).
        case charge(bytes: Int)
        /// Nothing may be sent to the stream's endpoint before this time (Retry-After).
        case holdEndpoint(untilMs: UInt64)
    }

    /// A batch as it was sent.
    struct SentBatch: Equatable {
        var key: String
        var count: Int
        /// Bytes of its record bodies (their share of the disk cap).
        var bytes: Int
        /// A consent-denied batch: sent once, never retried.
        var final: Bool
    }

    /// Whether nothing is queued, pending or in flight.
    var isDrained: Bool { queued == 0 && pendingBatches.isEmpty && !inFlight }

    // MARK: Events

    /// A group commit stored `added` new records (`bytes` of bodies) for the stream at `now`.
    mutating func committed(added: Int, bytes: Int, now: UInt64) {
        guard added > 0 else { return }
        if queued == 0 { oldestMs = now }
        queued += added
        queuedBytes += bytes
        diskBytes += bytes
    }

    /// A flush: send what is queued now, skipping a retry wait.
    mutating func flush() {
        flushRequested = true
        notBeforeMs = 0
    }

    /// What to do now. `endpointHeldUntil` is the endpoint's Retry-After hold, if any. Marks the
    /// stream in flight when it answers `send`.
    mutating func poll(now: UInt64, endpointHeldUntil: UInt64? = nil) -> Step {
        if inFlight { return workAhead(now: now) }
        if let h = endpointHeldUntil, now < h { return .idle }
        guard shouldSend(now: now) else { return .idle }
        guard let key = pendingBatches.first else {
            noteCut(now: now)
            return .cut(maxCount: batchLimit, maxBytes: settings.maxBatchBytes)
        }
        inFlight = true
        cutAheadTried = false
        if preparedAhead == key { preparedAhead = nil }
        if cutAhead?.key == key { cutAhead = nil }
        return .send(batch: key)
    }

    /// While a batch is in flight: cut the next one when the queue would send it now (once per
    /// flight, and only when nothing else is pending), and have the batch after the one in
    /// flight prepared. At most two batches are cut by this, the one in flight and the next.
    private mutating func workAhead(now: UInt64) -> Step {
        if pendingBatches.count == 1, !cutAheadTried, wantsBatch(now: now) {
            cutAheadTried = true
            noteCut(now: now)
            return .cut(maxCount: batchLimit, maxBytes: settings.maxBatchBytes)
        }
        if pendingBatches.count >= 2, preparedAhead != pendingBatches[1] {
            preparedAhead = pendingBatches[1]
            return .prepare(batch: pendingBatches[1])
        }
        return .idle
    }

    /// The shell cut batch `key` of `count` records (`bytes`) from the queue; `count` 0 means the
    /// disk held nothing more to cut, so the stream's queue is empty.
    mutating func cut(batch key: String, count: Int, bytes: Int) {
        guard count > 0 else {
            emptied()
            return
        }
        pendingBatches.append(key)
        if inFlight { cutAhead = AheadCut(key: key, count: count, bytes: bytes) }
        queued -= count
        queuedBytes = max(0, queuedBytes - bytes)
        if queued <= 0 { emptied() }
    }

    /// Consent was denied for records of the stream: the shell marked its pending batches final
    /// and cut its queued records into final batches (`cuts`, oldest first); they go at once.
    mutating func finalized(cuts: [(key: String, count: Int, bytes: Int)]) {
        for c in cuts where c.count > 0 {
            pendingBatches.append(c.key)
            queued = max(0, queued - c.count)
            queuedBytes = max(0, queuedBytes - c.bytes)
        }
        if queued == 0 { emptied() }
        notBeforeMs = 0
    }

    /// A local failure (the disk or gzip) stopped a cut or a send: try again a little later.
    mutating func storeFailed(now: UInt64) {
        inFlight = false
        notBeforeMs = now + StreamState.storeErrorRetryMs
    }

    /// The batch to send held no records (already delivered before a crash): the shell deleted
    /// it; the next one goes.
    mutating func batchWasEmpty(_ key: String) {
        pendingBatches.removeAll { $0 == key }
        inFlight = false
    }

    /// What to do with `batch` on disk given the upload's outcome (pure; the shell does it, then
    /// reports `uploadFinished`).
    static func disposal(of batch: SentBatch, _ outcome: UploadOutcome) -> Disposal {
        switch outcome {
        case .delivered: return .delete
        case .retry: return batch.final ? .delete : .keep
        case .tooLarge: return batch.final || batch.count <= 1 ? .deadLetter(status: 413, reason: "too large for the endpoint") : .unbatch
        case .rejected(let status, let reason): return .deadLetter(status: status, reason: reason)
        }
    }

    /// The upload of `batch` (the oldest pending) came back with `outcome` and the shell did
    /// `disposal(of:)` on disk: `diskOK` false when that failed (the batch stays pending and goes
    /// again after `storeErrorRetryMs`), `deadLettered` the records it set aside,
    /// `deadLetterBytes` what they count in the disk cap, `dissolvedAhead` whether an `.unbatch`
    /// dissolved `cutAhead` too (it does unless that batch became final). `random` in [0, 1)
    /// jitters the backoff. Returns the bookkeeping to do.
    mutating func uploadFinished(
        _ batch: SentBatch, _ outcome: UploadOutcome, diskOK: Bool = true, deadLettered: Int = 0, deadLetterBytes: Int = 0,
        dissolvedAhead: Bool = false, now: UInt64, retry: RetryPolicy, random: Double
    ) -> [Effect] {
        inFlight = false
        guard diskOK else {
            notBeforeMs = now + StreamState.storeErrorRetryMs
            lastResult = "queue update failed; batch kept"
            return []
        }
        var effects: [Effect] = []
        switch (outcome, StreamState.disposal(of: batch, outcome)) {
        case (.delivered, _):
            removeSent(batch.key)
            effects.append(.release(bytes: batch.bytes))
            attempts = 0
            notBeforeMs = 0
            delivered += UInt64(batch.count)
            lastResult = "delivered \(batch.count) records"
        case (.retry(let reason, _), .delete):
            removeSent(batch.key)
            effects.append(.release(bytes: batch.bytes))
            lastResult = "final batch failed (\(reason)); purged without retry"
        case (.retry(let reason, let retryAfter), _):
            attempts += 1
            let delay = StreamState.retryDelay(attempts: attempts, policy: retry, retryAfterMs: retryAfter, random: random)
            notBeforeMs = now + delay
            lastRetryDelayMs = delay
            if let ra = retryAfter { effects.append(.holdEndpoint(untilMs: now + retry.honoured(ra))) }
            lastResult = "retrying: \(reason)"
        case (.tooLarge, .unbatch):
            // Split: the batch's records are queued again and cut at half the size.
            removeSent(batch.key)
            queued += batch.count
            queuedBytes += batch.bytes
            if dissolvedAhead, let a = cutAhead {
                // The next batch, cut behind this one, is dissolved with it: the records are cut
                // again in their queue order.
                removeSent(a.key)
                if preparedAhead == a.key { preparedAhead = nil }
                cutAhead = nil
                queued += a.count
                queuedBytes += a.bytes
            }
            if oldestMs == nil { oldestMs = now }
            countCap = max(1, batch.count / 2)
            flushRequested = true
            lastResult = "413: splitting \(batch.count) records into batches of \(max(1, batch.count / 2))"
        case (.tooLarge, _):
            removeSent(batch.key)
            effects.append(.release(bytes: batch.bytes))
            effects += setAside(deadLettered, bytes: deadLetterBytes)
            lastResult =
                batch.count <= 1
                ? "413 for a single record; set aside as a dead letter"
                : "413 for a final batch; \(deadLettered) records set aside as dead letters"
        case (.rejected(_, let reason), _):
            removeSent(batch.key)
            effects.append(.release(bytes: batch.bytes))
            effects += setAside(deadLettered, bytes: deadLetterBytes)
            lastResult = "rejected (\(reason)); \(deadLettered) records set aside as dead letters"
        }
        if pendingBatches.isEmpty && queued == 0 { countCap = nil }
        if case .release(let b) = effects.first { diskBytes = max(0, diskBytes - b) }
        return effects
    }

    /// `count` dead letters of `bytes` were written: they stay charged until re-queued or
    /// discarded (`deadLettersRemoved`).
    private mutating func setAside(_ count: Int, bytes: Int) -> [Effect] {
        deadLetters += UInt64(count)
        setAside += UInt64(count)
        deadLetterBytes += bytes
        return bytes > 0 ? [.charge(bytes: bytes)] : []
    }

    /// Dead letters were re-queued or discarded: `count` of them, `bytes` of the disk cap.
    mutating func deadLettersRemoved(count: Int, bytes: Int) {
        deadLetters -= min(deadLetters, UInt64(count))
        deadLetterBytes = max(0, deadLetterBytes - bytes)
    }

    // MARK: Internals

    private mutating func removeSent(_ key: String) {
        if pendingBatches.first == key { pendingBatches.removeFirst() } else { pendingBatches.removeAll { $0 == key } }
    }

    /// Nothing is queued any more: the interval clock, the byte count and a flush request start
    /// over with the next record.
    private mutating func emptied() {
        queued = 0
        queuedBytes = 0
        oldestMs = nil
        flushRequested = false
    }
}
