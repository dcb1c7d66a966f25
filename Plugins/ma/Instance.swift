import PylonPluginKit

/// One isolated MA instance per AppKey: identity, EUID, consent, settings, session.
final class MAInstance {
    let appKey: String
    /// A start succeeded (EUID known).
    var started = false
    /// Starts/identifies queued or running; other calls are allowed while > 0 (they wait).
    var pendingStarts: Int { opQueue.count + (opRunning ? 1 : 0) }
    var euid: String?
    var project: String?
    var identity: [String: String] = [:]
    /// nil until the first start decides it.
    var collectionEnabled: Bool?
    var collectControl: [String: Bool] = MAInstance.defaultCollectControl { didSet { eventTail = nil } }
    var utm: [String: String] = [:] { didSet { eventTail = nil } }
    /// The `"utm":…,"device":…` text of this instance's event records (`MAService.eventTail`);
    /// nil after either changes.
    var eventTail: [UInt8]?
    var sessionTimeoutS: Int64 = 30 * 60
    /// Set by `ma.setReportInterval` for the app's current session; reset to the configured
    /// default when the last client bound to this AppKey disconnects.
    var reportIntervalS: Int64?

    // Session: starts on first activity, ends `sessionTimeoutS` after going to background
    // (`MASession`, the machine; `sessionTimer`, the shell's one timer for it).
    var session = MASession()
    var sessionTimer: Timer?
    var sessionId: String? {
        get { session.id }
        set { session.id = newValue }
    }
    var background: Bool {
        get { session.background }
        set { session.background = newValue }
    }
    /// The session timeout in ms (`sessionTimeoutS`, at least 1 s).
    var sessionTimeoutMs: UInt64 { UInt64(max(1, sessionTimeoutS)) * 1000 }

    /// Serialised start/identifyAccount operations (strict call order, one at a time).
    var opQueue: [() -> Void] = []
    var opRunning = false
    /// Calls that need the EUID, parked until the pending starts finish.
    var waiting: [() -> Void] = []
    /// setChannelValue requests, sent one at a time in call order.
    /// Events recorded and not yet answered (in the outbox or sent to the uploader), and what
    /// waits for them to be settled (a collection switch turned off goes behind them).
    var eventsInFlight = 0
    var drainWaiters: [() -> Void] = []
    var channelQueue: [() -> Void] = []
    var channelRunning = false

    // Offline (MAService+Offline).
    /// Set while the start or identify at the head of the queue waits for the backend (network
    /// errors or 5xx, retried with backoff): `ma.status` shows it, and calls that wait behind it
    /// are answered pending (-32008) at once.
    var networkWait: NetworkWait?
    /// Events parked in ma.db (`parked`), not yet stored by the uploader: recorded while a start
    /// or identify was pending (they wait for its EUID) or behind other parked events (order).
    var parked = 0
    /// Of `parked`, those read back and handed to the outbox, not yet settled.
    var releasing = 0
    /// Client event ids (`eventId`) of parked events: a repeat is a duplicate.
    var parkedEventIds: Set<String> = []
    /// Client event ids the uploader stored lately (`eventIdWindow`, persisted): a repeat is a
    /// duplicate.
    var recentEventIds = RecentIds()

    /// Sends the next queued setChannelValue, unless one is running or a start/identify that was
    /// called earlier is still pending (it runs first; the queued request then sees its effect).
    func channelKick() {
        guard !channelRunning, !channelQueue.isEmpty else { return }
        guard pendingStarts == 0 else {
            waiting.append { [unowned self] in self.channelKick() }
            return
        }
        channelRunning = true
        channelQueue.removeFirst()()
    }

    func channelDone() {
        channelRunning = false
        channelKick()
    }

    /// The public SDK defaults (docs/MA.md, `ma.setCollectControl`): idfa off, idfv off, carrier on.
    static let defaultCollectControl: [String: Bool] = ["idfa": false, "idfv": false, "carrier": true]

    init(appKey: String) {
        self.appKey = appKey
        consentKey = "ma:" + appKey
        stream = "ma." + appKey
    }

    var isUsable: Bool { started || pendingStarts > 0 }
    let consentKey: String
    let stream: String

    /// Runs `op` after every earlier start/identify (and its reply) completed.
    func enqueueOp(_ op: @escaping () -> Void) {
        opQueue.append(op)
        runNextOp()
    }

    /// Called by an op when it (and its reply) are complete.
    func opFinished() {
        opRunning = false
        runNextOp()
    }

    private func runNextOp() {
        guard !opRunning, !opQueue.isEmpty else {
            if !opRunning {  // the queue is empty: nothing pending any more
                let w = waiting
                waiting.removeAll()
                for f in w { f() }
            }
            return
        }
        opRunning = true
        let op = opQueue.removeFirst()
        op()
    }

    /// Runs `f` now, or once pending starts are done.
    func whenReady(_ f: @escaping () -> Void) {
        if pendingStarts == 0 { f() } else { waiting.append(f) }
    }

    // MARK: Persistence

    /// The uid that first started this AppKey (nil: not yet started by a client, or started
    /// before owners were recorded): other non-admin uids may not use it (`MAService.mayUse`).
    var ownerUid: Int64?

    var snapshot: JSON {
        var cc = JSONObject()
        for k in collectControl.keys.sorted() { cc[k] = .bool(collectControl[k]!) }
        var u = JSONObject()
        for k in utm.keys.sorted() { u[k] = .string(utm[k]!) }
        var id = JSONObject()
        for k in identity.keys.sorted() { id[k] = .string(identity[k]!) }
        return [
            "euid": euid.map { .string($0) } ?? .null, "project": project.map { .string($0) } ?? .null,
            "identity": .object(id), "collectionEnabled": collectionEnabled.map { .bool($0) } ?? .null,
            "collectControl": .object(cc), "utm": .object(u), "sessionTimeoutS": .int(sessionTimeoutS),
            "reportIntervalS": reportIntervalS.map { .int($0) } ?? .null,
            "sessionId": sessionId.map { .string($0) } ?? .null, "background": .bool(background),
            "ownerUid": ownerUid.map { .int($0) } ?? .null,
        ]
    }

    func restore(_ j: JSON) {
        euid = j["euid"]?.stringValue
        project = j["project"]?.stringValue
        for (k, v) in j["identity"]?.objectValue ?? JSONObject() { identity[k] = v.stringValue }
        collectionEnabled = j["collectionEnabled"]?.boolValue
        for (k, v) in j["collectControl"]?.objectValue ?? JSONObject() { collectControl[k] = v.boolValue }
        for (k, v) in j["utm"]?.objectValue ?? JSONObject() { utm[k] = v.stringValue }
        if let t = j["sessionTimeoutS"]?.intValue { sessionTimeoutS = min(max(1, t), MAService.maxSessionTimeoutS) }
        reportIntervalS = j["reportIntervalS"]?.intValue
        sessionId = j["sessionId"]?.stringValue
        background = j["background"]?.boolValue ?? false
        ownerUid = j["ownerUid"]?.intValue
    }
}

/// A start or identify waiting for the network: since when (Unix ms, the first failed attempt),
/// the attempts made, when the next one goes (Unix ms) and why the last one failed.
struct NetworkWait: Equatable {
    var sinceMs: Int64
    var attempts: Int
    var nextTryMs: Int64
    var reason: String

    var json: JSON {
        ["since": .int(sinceMs), "attempts": .int(Int64(attempts)), "nextTryMs": .int(nextTryMs), "reason": .string(reason)]
    }
}

/// The latest client event ids of one AppKey, at most `limit` (the oldest leaves first): a set
/// for the check, a ring for the order.
struct RecentIds {
    private var ids: Set<String> = []
    private var ring: [String] = []
    private var head = 0

    func contains(_ id: String) -> Bool { ids.contains(id) }
    var count: Int { ids.count }

    /// Adds `id`; returns the id that left to keep at most `limit`, if one did.
    mutating func add(_ id: String, limit: Int) -> String? {
        guard ids.insert(id).inserted else { return nil }
        if ring.count < limit {
            ring.append(id)
            return nil
        }
        let old = ring[head]
        ring[head] = id
        head = (head + 1) % ring.count
        ids.remove(old)
        return old
    }
}
