import PylonPluginKit

/// MA's settings (`plugins[ma].config`, docs/MA.md), read strictly: a value of the wrong type or
/// out of bounds is an error naming its path (the plugin exits 78; `pylond --check-config` shows
/// it), an unknown setting a warning (an error under `--check-config`). Absent settings keep these
/// defaults, written here only: the service reads them from its `config`.
struct MAConfig {
    /// The MA backend.
    var backend = "http://127.0.0.1:8780"
    /// The device credential file sent as `Authorization: Bearer`.
    var credentialFile: String?
    /// The project of a start that names none.
    var project: String?
    /// `idfa`: only when configured (Linux has no advertising id).
    var advertisingId: String?
    /// `carrier`: the network operator, only when configured.
    var carrier: String?
    var retryInitialMs: UInt64 = 500
    var retryMaxMs: UInt64 = 30_000
    /// The most events held while the uploader is unavailable; beyond it new events are answered
    /// -1 at once instead of waiting.
    var maxHeldEvents = 100_000
    /// The largest event record, answered -3 beyond: it must stay under the uploader's
    /// `maxRecordBytes` (256 KiB by default), which refuses the whole enqueue of a record over it,
    /// the other apps' events with it.
    var maxEventBytes = 128 * 1024
    /// The largest `uploader.enqueue` this plugin sends: a batch is closed before it would grow
    /// past it. It must stay under the host's `limits.maxLineBytes` (1 MiB by default), which skips
    /// a longer line, and with it every event in it.
    var maxEnqueueBytes = 512 * 1024
    /// The most AppKeys (MA instances) this plugin keeps; a start for one more is answered -1.
    var maxAppKeys = 1_024
    /// Enqueues one AppKey may have unanswered at once; its later events wait in the outbox,
    /// counted against `maxHeldEvents`, and go out in the next enqueues when answers free a slot
    /// (`MAService.flushOutbox` says why).
    var maxEnqueuesInFlight = 2
    /// The most events parked at once; beyond it `ma.eventRecord` answers -1 at once.
    var maxParkedEvents = 200_000
    /// Client event ids remembered per AppKey after the uploader stored them: a repeat within
    /// the window is answered 0 and stored nothing.
    var eventIdWindow = 10_000
    /// A start or identify the backend has not answered within this many ms is answered pending
    /// (-32008) and goes on; below the host's `requestTimeoutMs`.
    var pendingAfterMs: UInt64 = 3_000

    /// Bounds: retries up to a day; counts and sizes from 1 to the values below.
    static let retryRange: ClosedRange<Int64> = 0...86_400_000
    static let countRange: ClosedRange<Int64> = 1...100_000_000
    static let pendingRange: ClosedRange<Int64> = 1...3_600_000
    static let bytesRange: ClosedRange<Int64> = 1...(64 << 20)

    /// Warnings (unknown settings) of the last read.
    private(set) var warnings: [String] = []

    init() {}

    init(_ j: JSON) throws(ConfigProblems) {
        var r = ConfigReader(j)
        if let v = r.httpURL("backend") { backend = v }
        credentialFile = r.string("credentialFile")
        project = r.string("project")
        advertisingId = r.string("advertisingId")
        carrier = r.string("carrier")
        if let v = r.int("retryInitialMs", Self.retryRange) { retryInitialMs = UInt64(v) }
        if let v = r.int("retryMaxMs", Self.retryRange) { retryMaxMs = UInt64(v) }
        if let v = r.int("maxHeldEvents", Self.countRange) { maxHeldEvents = Int(v) }
        if let v = r.int("maxEventBytes", Self.bytesRange) { maxEventBytes = Int(v) }
        if let v = r.int("maxEnqueueBytes", Self.bytesRange) { maxEnqueueBytes = Int(v) }
        if let v = r.int("maxAppKeys", Self.countRange) { maxAppKeys = Int(v) }
        if let v = r.int("maxEnqueuesInFlight", Self.countRange) { maxEnqueuesInFlight = Int(v) }
        if let v = r.int("maxParkedEvents", Self.countRange) { maxParkedEvents = Int(v) }
        if let v = r.int("eventIdWindow", Self.countRange) { eventIdWindow = Int(v) }
        if let v = r.int("pendingAfterMs", Self.pendingRange) { pendingAfterMs = UInt64(v) }
        if retryMaxMs < retryInitialMs { r.fail("retryMaxMs", "must not be less than retryInitialMs (\(retryInitialMs))") }
        try r.check()
        warnings = r.unknown
    }
}
