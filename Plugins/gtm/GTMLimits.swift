import PylonCore
import PylonTagEngine

/// The gtm plugin's settings (the plugin's `config` in etc/pylon.json; see docs/GTM.md). Every
/// limit is named here, configurable, and answered with a clear error when exceeded.
struct GTMLimits {
    /// Base URL of the container backend (`GET /v1/gtm/containers/{id}`).
    var backend = "http://127.0.0.1:8780"
    /// The device credential file sent as `Authorization: Bearer` (config `credentialFile`).
    var credentialFile: String?
    /// Directory of default containers (`<id>`, `<id>.plist`, `<id>.json`).
    var defaultsDir = ""
    /// Automatic refresh period (a saved container older than this is stale).
    var refreshPeriodMs: Int64 = RefreshTiming.staleAfterMs
    /// Delay before the next attempt after a network failure.
    var retryAfterFailureMs: Int64 = RefreshTiming.retryAfterFailureMs
    /// Whole-request timeout of a container fetch.
    var fetchTimeoutMs = 10_000
    /// Largest container accepted (default file, network body or saved copy).
    var maxContainerBytes = 4 << 20
    /// Containers open at once, per owner (each uid opens its own).
    var maxOpenContainers = 64
    /// Owners (uids, plugins) with tag-manager state at once: one more is refused (-32004).
    var maxOwners = 1_024
    /// Recent log lines kept per owner for `gtm.logLines`.
    var maxLogLinesPerOwner = 256
    /// Publish owner lines on `gtm.log` too (only for a host whose `disclosure.adminTopics`
    /// covers `gtm.log`: the host delivers a publication to every subscriber).
    var publishOwnerLogLines = false
    /// Log lines per owner: a burst, then this many a second (the rest are counted, and the next
    /// line says how many were dropped).
    var logBurst = 50
    var logLinesPerSecond = 10
    /// Longest a function-call macro or tag handler is waited for before its type default is used.
    var functionCallTimeoutMs: Int64 = 1_000
    /// Function-call rounds per evaluation (a macro whose answer makes another one needed).
    var maxFunctionCallRounds = 4
    /// Hits held (plugin-wide) while the uploader restarts: one more is dropped and counted.
    var maxHeldHits = 1_000
    /// Function-call handlers registered at once, per owner.
    var maxHandlers = 1_024
    /// Pushes queued behind the one being handled before a loop is assumed (spec: 500).
    var maxQueuedPushes = 500
    /// Largest pushed map (serialized bytes).
    var maxPushBytes = 256 * 1024
    /// The data layer's size as JSON text, pushes waiting in the queue included: a push that
    /// would take it past this is refused (-32004). 400 pushes of 1,000 new keys each grew the
    /// plugin to 172 MB with no bound.
    var maxDataLayerBytes = 8 * 1024 * 1024
    /// Data-layer entries persisted through `gtm.lifetime`.
    var maxPersistedEntries = 10_000
    /// Manual refresh bucket (spec: 30 tokens, one per 15 min, 5 s spacing).
    var refreshBucket = RefreshRateLimiter.defaultCapacity
    var refreshRefillMs = RefreshRateLimiter.defaultRefillMs
    var refreshMinSpacingMs = RefreshRateLimiter.defaultMinSpacingMs
    /// Evaluation budgets (depth, steps, bytes produced and hashed, value size, regex limits).
    var engine = EngineLimits()
    /// Loop time one turn may spend on evaluations (getValue, pushes) before the rest waits for
    /// the next turn (`Pacer`): the loop keeps answering heartbeats.
    var maxBusyMsPerTurn: Int64 = 50
    /// Evaluations waiting for a later turn at once: one more is refused (-32004).
    var maxDeferredEvaluations = 10_000
    /// Device facts not known to the system (`appName`, `resolution`, `deviceType`, ...).
    var environment = JSONObject()
    /// Initial log level.
    var logLevel = GTMLogLevel.warning

    static let maxContainerIdBytes = 64
    /// Longest `getValue` key (a macro name).
    static let maxKeyBytes = 1024

    init() {}

    init(_ c: JSON) {
        if let s = c["backend"]?.stringValue { backend = s }
        credentialFile = c["credentialFile"]?.stringValue
        if let s = c["defaultsDir"]?.stringValue { defaultsDir = s }
        func int(_ k: String, _ min: Int64 = 1) -> Int64? {
            guard let v = c[k]?.intValue, v >= min else { return nil }
            return v
        }
        if let v = int("refreshPeriodMs") { refreshPeriodMs = v }
        if let v = int("retryAfterFailureMs") { retryAfterFailureMs = v }
        if let v = int("fetchTimeoutMs") { fetchTimeoutMs = Int(v) }
        if let v = int("maxContainerBytes") { maxContainerBytes = Int(v) }
        if let v = int("maxOpenContainers") { maxOpenContainers = Int(v) }
        if let v = int("maxOwners") { maxOwners = Int(v) }
        if let v = int("maxLogLinesPerOwner") { maxLogLinesPerOwner = Int(v) }
        if let b = c["publishOwnerLogLines"]?.boolValue { publishOwnerLogLines = b }
        if let v = int("logBurst") { logBurst = Int(v) }
        if let v = int("logLinesPerSecond") { logLinesPerSecond = Int(v) }
        if let v = int("functionCallTimeoutMs") { functionCallTimeoutMs = v }
        if let v = int("maxFunctionCallRounds") { maxFunctionCallRounds = Int(v) }
        if let v = int("maxHandlers") { maxHandlers = Int(v) }
        if let v = int("maxHeldHits") { maxHeldHits = Int(v) }
        if let v = int("maxQueuedPushes") { maxQueuedPushes = Int(v) }
        if let v = int("maxPushBytes") { maxPushBytes = Int(v) }
        if let v = int("maxDataLayerBytes") { maxDataLayerBytes = Int(v) }
        if let v = int("maxPersistedEntries") { maxPersistedEntries = Int(v) }
        if let v = int("refreshBucket") { refreshBucket = Int(v) }
        if let v = int("refreshRefillMs") { refreshRefillMs = v }
        if let v = int("refreshMinSpacingMs", 0) { refreshMinSpacingMs = v }
        if let v = int("maxEvaluationSteps") { engine.maxSteps = Int(v) }
        if let v = int("maxEvaluationBytes") { engine.maxWorkBytes = Int(v) }
        if let v = int("maxValueBytes") { engine.maxValueBytes = Int(v) }
        if let v = int("maxBusyMsPerTurn") { maxBusyMsPerTurn = v }
        if let v = int("maxDeferredEvaluations") { maxDeferredEvaluations = Int(v) }
        if let v = int("maxMacroDepth") { engine.maxDepth = Int(v) }
        if let v = int("regexMatchLimit") { engine.regexMatchLimit = UInt32(clamping: v) }
        if let o = c["environment"]?.objectValue { environment = o }
        if let s = c["logLevel"]?.stringValue, let l = GTMLogLevel(rawValue: s) { logLevel = l }
    }

    static let containerIdRule = "containerId must be 1-\(maxContainerIdBytes) characters of [A-Za-z0-9._-] (not . or ..)"

    /// `[A-Za-z0-9._-]{1,64}`: a container id names files, URL path segments and rows.
    static func validContainerId(_ s: String) -> Bool {
        (1...maxContainerIdBytes).contains(s.utf8.count) && s != "." && s != ".."
            && s.utf8.allSatisfy { c in
                (0x30...0x39).contains(c) || (0x41...0x5A).contains(c) || (0x61...0x7A).contains(c)
                    || c == UInt8(ascii: ".") || c == UInt8(ascii: "_") || c == UInt8(ascii: "-")
            }
    }
}

/// The SDK's logger levels. Default: warnings and errors.
enum GTMLogLevel: String, CaseIterable {
    case verbose, debug, info, warning, error, none

    var rank: Int { GTMLogLevel.allCases.firstIndex(of: self)! }
}
