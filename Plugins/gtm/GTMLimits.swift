import PylonCore
import PylonPluginKit
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
    /// `getValue` calls waiting, per container, for the answer to its first `openContainer`:
    /// one more is answered at once with the type default and `open: false, reason: "opening"`.
    var maxValuesWaitingForOpen = 256
    /// Device facts not known to the system (`appName`, `resolution`, `deviceType`, ...).
    var environment = JSONObject()
    /// Initial log level.
    var logLevel = GTMLogLevel.warning

    static let maxContainerIdBytes = 64
    /// Longest `getValue` key (a macro name).
    static let maxKeyBytes = 1024

    init() {}

    /// Warnings (unknown settings) of the last read.
    private(set) var warnings: [String] = []

    /// Bounds of the numeric settings: counts and sizes from 1 (spacing from 0) to these.
    static let maxCount: Int64 = 100_000_000
    static let maxMs: Int64 = 86_400_000 * 30

    /// Reads `plugins[gtm].config` strictly (`ConfigReader`): a wrong type or a value out of
    /// bounds is an error naming its path, an unknown setting a warning.
    init(_ c: JSON) throws(ConfigProblems) {
        var r = ConfigReader(c)
        let counts: ClosedRange<Int64> = 1...Self.maxCount
        let ms: ClosedRange<Int64> = 1...Self.maxMs
        if let s = r.httpURL("backend") { backend = s }
        credentialFile = r.string("credentialFile")
        if let s = r.string("defaultsDir") { defaultsDir = s }
        if let v = r.int("refreshPeriodMs", ms) { refreshPeriodMs = v }
        if let v = r.int("retryAfterFailureMs", ms) { retryAfterFailureMs = v }
        if let v = r.int("fetchTimeoutMs", ms) { fetchTimeoutMs = Int(v) }
        if let v = r.int("maxContainerBytes", counts) { maxContainerBytes = Int(v) }
        if let v = r.int("maxOpenContainers", counts) { maxOpenContainers = Int(v) }
        if let v = r.int("maxOwners", counts) { maxOwners = Int(v) }
        if let v = r.int("maxLogLinesPerOwner", counts) { maxLogLinesPerOwner = Int(v) }
        if let b = r.bool("publishOwnerLogLines") { publishOwnerLogLines = b }
        if let v = r.int("logBurst", counts) { logBurst = Int(v) }
        if let v = r.int("logLinesPerSecond", counts) { logLinesPerSecond = Int(v) }
        if let v = r.int("functionCallTimeoutMs", ms) { functionCallTimeoutMs = v }
        if let v = r.int("maxFunctionCallRounds", counts) { maxFunctionCallRounds = Int(v) }
        if let v = r.int("maxHandlers", counts) { maxHandlers = Int(v) }
        if let v = r.int("maxHeldHits", counts) { maxHeldHits = Int(v) }
        if let v = r.int("maxQueuedPushes", counts) { maxQueuedPushes = Int(v) }
        if let v = r.int("maxPushBytes", counts) { maxPushBytes = Int(v) }
        if let v = r.int("maxDataLayerBytes", counts) { maxDataLayerBytes = Int(v) }
        if let v = r.int("maxPersistedEntries", counts) { maxPersistedEntries = Int(v) }
        if let v = r.int("refreshBucket", counts) { refreshBucket = Int(v) }
        if let v = r.int("refreshRefillMs", ms) { refreshRefillMs = v }
        if let v = r.int("refreshMinSpacingMs", 0...Self.maxMs) { refreshMinSpacingMs = v }
        if let v = r.int("maxEvaluationSteps", counts) { engine.maxSteps = Int(v) }
        if let v = r.int("maxEvaluationBytes", counts) { engine.maxWorkBytes = Int(v) }
        if let v = r.int("maxValueBytes", counts) { engine.maxValueBytes = Int(v) }
        if let v = r.int("maxBusyMsPerTurn", ms) { maxBusyMsPerTurn = v }
        if let v = r.int("maxDeferredEvaluations", counts) { maxDeferredEvaluations = Int(v) }
        if let v = r.int("maxValuesWaitingForOpen", counts) { maxValuesWaitingForOpen = Int(v) }
        if let v = r.int("maxMacroDepth", counts) { engine.maxDepth = Int(v) }
        if let v = r.int("regexMatchLimit", 1...Int64(UInt32.max)) { engine.regexMatchLimit = UInt32(v) }
        if let o = r.object("environment") { environment = o }
        if let s = r.choice("logLevel", GTMLogLevel.allCases.map(\.rawValue)), let l = GTMLogLevel(rawValue: s) { logLevel = l }
        try r.check()
        warnings = r.unknown
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
