import PylonPluginKit

/// MA's settings (`plugins[ma].config`, docs/MA.md), read strictly: a value of the wrong type or
/// out of bounds is an error naming its path (the plugin exits 78; `pylond --check-config` shows
/// it), an unknown setting a warning. Absent settings keep these defaults.
struct MAConfig {
    var backend = "http://127.0.0.1:8780"
    var credentialFile: String?
    var project: String?
    var advertisingId: String?
    var carrier: String?
    var retryInitialMs: UInt64 = 500
    var retryMaxMs: UInt64 = 30_000
    var maxHeldEvents = 100_000
    var maxEventBytes = 128 * 1024
    var maxEnqueueBytes = 512 * 1024
    var maxAppKeys = 1_024
    var maxEnqueuesInFlight = MAService.defaultMaxEnqueuesInFlight
    var maxParkedEvents = MAService.defaultMaxParkedEvents
    var eventIdWindow = MAService.defaultEventIdWindow
    var pendingAfterMs = MAService.defaultPendingAfterMs

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
