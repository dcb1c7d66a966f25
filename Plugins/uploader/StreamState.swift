import PylonCore

/// Per-stream upload settings. `maxCount` is MA's `setMaxEventCacheCount` (≤ 500): holding more
/// than that many records makes the stream send everything queued (batches of at most 500
/// records and `maxBatchBytes`). `intervalMs` is its `setReportInterval`.
package struct StreamSettings: Equatable {
    package static let maxCountLimit = 500
    /// The bounds of each setting, wherever it is set (a `streams` entry of the config, or
    /// `uploader.configureStream`); a value outside them is refused with an error naming the
    /// setting and its bounds (config: exit 78; call: -32602), never clamped.
    static let maxCountRange: ClosedRange<Int64> = 1...Int64(maxCountLimit)
    /// At most a day: MA's report interval is seconds to minutes, and a larger value only
    /// parks records until a count, a flush or a restart.
    static let intervalMsRange: ClosedRange<Int64> = 0...86_400_000
    /// 1 KiB to 8 MiB of records before compression. The stream holds up to two bodies of this
    /// size in memory (the one in flight and the one prepared ahead), and the reference backend
    /// takes 1 MiB per request by default (a larger batch is split after its 413): 1e15 was
    /// accepted, and a flush then read the whole queue into one body.
    static let maxBatchBytesRange: ClosedRange<Int64> = 1024...(8 << 20)
    package var endpoint: String
    package var maxCount = 50
    var intervalMs: UInt64 = 10_000
    var maxBatchBytes = 512 * 1024
    /// A GET stream (config `"delivery": "get"`): each record is one HTTP GET of its `data.url`,
    /// whose host must be in this set (the stream's `allowedHosts`, else the plugin's); nil: the
    /// records go in POSTed batches to `endpoint`.
    var getHosts: Set<String>?
}

/// Retry tunables for failed uploads.
struct RetryPolicy: Equatable {
    var initialMs: UInt64 = 1_000
    var maxMs: UInt64 = 300_000
    var jitter = 0.2
    /// The longest server `Retry-After` honoured (config `maxRetryAfterMs`): a longer one waits
    /// this long, so a wrong or hostile header cannot park a stream for years.
    var maxRetryAfterMs: UInt64 = 3_600_000

    /// `retryAfterMs` capped at `maxRetryAfterMs`.
    func honoured(_ retryAfterMs: UInt64) -> UInt64 { min(retryAfterMs, maxRetryAfterMs) }
}

/// What one upload attempt came back with.
enum UploadOutcome: Equatable {
    case delivered
    /// Network error, 5xx, 408, 429, 401, 403 or a 3xx: try again later (`retryAfterMs` from the
    /// server wins if longer).
    case retry(reason: String, retryAfterMs: UInt64?)
    /// 413: the batch is too large for the endpoint.
    case tooLarge
    /// Any other 4xx: the batch will never be accepted there.
    case rejected(status: Int, reason: String)

    /// Classifies the answer to a GET stream's request (a pixel): as `classify`, but a 3xx counts
    /// as delivered. The request reached the host the operator allowed; its redirect (often to
    /// another tracker's host) is not followed, and retrying the GET would count the hit again.
    /// A 401 or 403 is final for a pixel: it is sent without credentials, so no token the
    /// operator renews changes the answer (the record is set aside at once, not retried).
    static func classifyGet(status: Int?, retryAfterMs: UInt64?, error: String?) -> UploadOutcome {
        if let status, (300..<400).contains(status) { return .delivered }
        if let status, status == 401 || status == 403 {
            return .rejected(status: status, reason: "HTTP \(status) (a pixel carries no credentials)")
        }
        return classify(status: status, retryAfterMs: retryAfterMs, error: error)
    }

    /// Classifies an HTTP status (nil = no response at all). 401 and 403 say nothing about the
    /// records: an expired or missing token at a proxy or the backend, which the operator fixes;
    /// a 3xx is a proxy or a moved endpoint (redirects are never followed: the operator's
    /// endpoint is where data may go). Both are retried with backoff, shown in `status`, rather
    /// than setting a kiosk's whole queue aside while its token is renewed.
    static func classify(status: Int?, retryAfterMs: UInt64?, error: String?) -> UploadOutcome {
        guard let status else { return .retry(reason: error ?? "network error", retryAfterMs: nil) }
        switch status {
        case 200..<300: return .delivered
        case 300..<400: return .retry(reason: "HTTP \(status) (redirects are not followed)", retryAfterMs: retryAfterMs)
        case 401, 403: return .retry(reason: "HTTP \(status) (credentials refused)", retryAfterMs: retryAfterMs)
        case 408, 429: return .retry(reason: "HTTP \(status)", retryAfterMs: retryAfterMs)
        case 413: return .tooLarge
        case 400..<500: return .rejected(status: status, reason: "HTTP \(status)")
        default: return .retry(reason: "HTTP \(status)", retryAfterMs: retryAfterMs)
        }
    }
}

/// A batch cut while another was in flight: its key, records and their bytes.
struct AheadCut: Equatable {
    var key: String
    var count: Int
    var bytes: Int
}

/// When a stream should cut and send its next batch. A pure value: the plugin feeds it the
/// queue's shape and the time, and it answers; it never touches the disk or the network.
struct StreamState {
    var settings: StreamSettings
    /// Who may use the stream (nil: nobody yet; the first writer will own it).
    var owner: StreamOwner?
    /// The consent switch every record of the stream falls under (fixed by name or config).
    var consentKey = ""
    /// Bytes of the stream's records on disk, queued or in a batch.
    var diskBytes = 0
    /// Records queued and not yet in a batch, and their bytes.
    var queued = 0
    var queuedBytes = 0
    /// Enqueue time of the oldest queued record.
    var oldestMs: UInt64?
    /// A batch is being sent (one at a time per stream, so order is kept).
    var inFlight = false
    /// The batch cut while the one before it was in flight and not sent yet (`Step.cut` while
    /// in flight): after a 413 it is dissolved too, so the records are cut again in queue order.
    var cutAhead: AheadCut?
    /// The pending batch read and compressed while the one before it is in flight (`Step.prepare`).
    var preparedAhead: String?
    /// Batches read and compressed off the loop, by key (`StreamState+Preparation.swift`): the
    /// next one, and the one just sent while it still compresses.
    var prepared: [String: Preparation] = [:]
    /// Whether the current flight already asked for a cut ahead (at most one per flight).
    var cutAheadTried = false
    /// Consecutive failed attempts of the current batch.
    var attempts = 0
    /// Do not send before this time (backoff or Retry-After).
    var notBeforeMs: UInt64 = 0
    var flushRequested = false
    var lastResult = "none"
    /// What made the last new batch (status `lastCutTrigger`: `none`, `flush`, `count`, `bytes`,
    /// `interval`) and the age of its oldest record then (`lastCutOldestAgeMs`, this machine's
    /// clock): tests check the trigger without watching the wall clock.
    var lastCutTrigger = "none"
    var lastCutOldestAgeMs: UInt64 = 0
    var lastRetryDelayMs: UInt64 = 0
    var delivered: UInt64 = 0
    /// Dead letters of the stream on disk, and what they count in the disk cap (its owner's
    /// share included) until they are re-queued or discarded.
    var deadLetters: UInt64 = 0
    var deadLetterBytes = 0
    /// Records set aside since start (what a waiting flush reports).
    var setAside: UInt64 = 0
    var refusedConsent: UInt64 = 0
    /// A persisted batch not yet delivered (from before a crash, or awaiting retry).
    var pendingBatches: [String] = []
    /// After a 413 the next batches are cut smaller (halved each time, down to 1).
    var countCap: Int?

    init(settings: StreamSettings) { self.settings = settings }

    /// Whether the queued count makes the stream send: more than `maxCount` records (MA's SDK
    /// reports once the cached events *exceed* its max cache count), or, after a 413, as many as
    /// the smaller batch size.
    var countReached: Bool {
        if let cap = countCap, queued >= cap { return true }
        return queued > settings.maxCount
    }
    /// How many records one batch may carry: everything queued (as MA's SDK reports "all data"
    /// once the cache count is exceeded), up to 500 and `maxBatchBytes`, or the cap after a 413.
    /// A GET stream's batch is one record: one request each, one in flight per stream.
    var batchLimit: Int { settings.getHosts != nil ? 1 : countCap ?? StreamSettings.maxCountLimit }

    /// Whether to send now: a pending batch whose wait is over, or a new batch because the count,
    /// the bytes or the interval says so (or a flush was asked for).
    func shouldSend(now: UInt64) -> Bool {
        guard !inFlight, now >= notBeforeMs else { return false }
        return !pendingBatches.isEmpty || wantsBatch(now: now)
    }

    /// Notes why a new batch is cut now (`wantsBatch`'s first reason) and how old its oldest record is.
    mutating func noteCut(now: UInt64) {
        lastCutTrigger =
            flushRequested ? "flush" : countReached ? "count" : queuedBytes >= settings.maxBatchBytes ? "bytes" : "interval"
        lastCutOldestAgeMs = oldestMs.map { now >= $0 ? now - $0 : 0 } ?? 0
    }

    /// Whether the queued records make a new batch now: the count, the bytes, the interval or a
    /// flush.
    func wantsBatch(now: UInt64) -> Bool {
        guard queued > 0 else { return false }
        if flushRequested || countReached || queuedBytes >= settings.maxBatchBytes { return true }
        if let o = oldestMs, now >= o, now - o >= settings.intervalMs { return true }
        return false
    }

    /// The earliest time `shouldSend` can turn true with nothing else happening (the interval
    /// running out, a backoff ending), or nil when only an event can make it send (a batch in
    /// flight completes, records arrive, a flush): the uploader arms one timer for the earliest
    /// of these and none when there is none, instead of polling.
    func nextWake(now: UInt64) -> UInt64? {
        guard !inFlight else { return nil }
        if !pendingBatches.isEmpty { return max(now, notBeforeMs) }
        guard queued > 0 else { return nil }
        if flushRequested || countReached || queuedBytes >= settings.maxBatchBytes { return max(now, notBeforeMs) }
        guard let o = oldestMs else { return nil }
        return max(notBeforeMs, o + settings.intervalMs)
    }

    /// Backoff before retry number `attempts` (1-based): exponential, jittered, capped; a longer
    /// Retry-After wins.
    static func retryDelay(attempts: Int, policy: RetryPolicy, retryAfterMs: UInt64?, random: Double) -> UInt64 {
        let d = BackoffPolicy(initialMs: policy.initialMs, maxMs: policy.maxMs, jitter: policy.jitter)
            .delay(attempt: attempts, random: random)
        return max(d, policy.honoured(retryAfterMs ?? 0))
    }
}
