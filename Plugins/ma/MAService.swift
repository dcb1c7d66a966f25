import PylonHTTP
import PylonPluginKit
import PylonStore

package struct MAError: Error {
    let message: String
}

/// The `ma` plugin's service: routes each call to its AppKey's instance, talks to the MA backend
/// over HTTP, hands events to the uploader, and drives the host's `ma:<appKey>` consent switch.
final class MAService {
    let plugin: Plugin
    /// The MA backend's client (requests start only after the handshake).
    let http: HTTPClient
    /// The plugin's state (apps, client bindings, device ids), opened on first use: `ready()`,
    /// once the host's welcome has named the state directory. It cannot open: exit 78.
    lazy var db: Database = openState()
    var instances: [String: MAInstance] = [:]
    /// Which AppKey each client connection last started (ma.md: calls without `appKey` use it).
    var clientAppKey: [Int64: String] = [:]
    /// Clients not yet reported closed, and the AppKeys each has used (started, or named with
    /// `appKey`). An AppKey's app session lasts while one of them, or a bound client, is
    /// connected. (The host delivers a client's requests before its `bus.client.closed`.)
    var liveClients: [Int64: Set<String>] = [:]
    var backendURL = "http://127.0.0.1:8780"
    /// The device credential file sent as `Authorization: Bearer` (config `credentialFile`).
    var credentialFile: String?
    var defaultProject: String?
    /// Per-install vendor id (`idfv` on Linux), persisted.
    var vendorId = ""
    /// `idfa`: only when configured (Linux has no advertising id).
    var advertisingId: String?
    /// `carrier`: the network operator, only when configured.
    var carrier: String?
    var deviceId = ""
    var retryInitialMs: UInt64 = 500
    var retryMaxMs: UInt64 = 30_000
    /// The most AppKeys (MA instances) this plugin keeps (config `maxAppKeys`); a start for one
    /// more is answered -1.
    var maxAppKeys = 1_024
    /// A start or identify the backend has not answered within this many ms is answered pending
    /// (-32008) and goes on (config `pendingAfterMs`); below the host's `requestTimeoutMs`.
    var pendingAfterMs: UInt64 = MAService.defaultPendingAfterMs
    static let defaultPendingAfterMs: UInt64 = 3_000
    var eventSeq: UInt64 = 0
    /// Event ids: this install's device id and a random value drawn once per process start.
    lazy var eventIdPrefix = Array("\(deviceId)-\(System.randomHex(6))".utf8)

    // Events on their way to the uploader (MAService+Events).
    /// Per AppKey, the batches of events recorded in this loop turn (the last one open).
    var outbox: [String: [EventBatch]] = [:]
    lazy var outboxTimer = Timer(loop: plugin.loop) { [unowned self] in self.flushOutbox() }
    var outboxCount = 0
    /// Settled batches, kept (emptied) for the next ones.
    var spareBatches: [EventBatch] = []
    /// Events sent to the uploader and not yet answered (or waiting to be sent again).
    var held = 0
    /// The most events held while the uploader is unavailable (config `maxHeldEvents`); beyond
    /// it new events are answered -1 at once instead of waiting.
    var maxHeldEvents = 100_000
    // Offline (MAService+Offline).
    /// Events recorded and waiting to be parked in ma.db at the end of this loop turn (one
    /// transaction for all), answered once it commits.
    var parkQueue: [ParkedEvent] = []
    lazy var parkTimer = Timer(loop: plugin.loop) { [unowned self] in self.flushParkQueue() }
    /// The last enqueue met an uploader restarting or not answering in time (cleared by one that
    /// succeeds): batches waiting for an enqueue slot are kept on disk and answered
    /// (`flushOutbox`).
    var uploaderDown = false
    /// Events parked in ma.db, every AppKey (`eventsWaitingForStart` in `ma.status`).
    var parkedTotal = 0
    /// The most events parked at once (config `maxParkedEvents`); beyond it `ma.eventRecord`
    /// answers -1 at once.
    var maxParkedEvents = MAService.defaultMaxParkedEvents
    static let defaultMaxParkedEvents = 200_000
    /// Client event ids remembered per AppKey after the uploader stored them (config
    /// `eventIdWindow`): a repeat within the window is answered 0 and stored nothing.
    var eventIdWindow = MAService.defaultEventIdWindow
    static let defaultEventIdWindow = 10_000
    /// Events answered as repeats of a client event id, since the start (`ma.status`).
    var duplicateEvents = 0
    /// Parked events dropped because their AppKey never got an EUID (its starts failed), since
    /// the start (`ma.status`).
    var parkedDropped = 0
    /// The largest event record (config `maxEventBytes`), answered -3 beyond: it must stay under
    /// the uploader's `maxRecordBytes` (256 KiB by default), which refuses the whole enqueue of a
    /// record over it, the other apps' events with it.
    var maxEventBytes = 128 * 1024
    /// The largest `uploader.enqueue` this plugin sends (config `maxEnqueueBytes`): a batch is
    /// closed before it would grow past it. It must stay under the host's `limits.maxLineBytes`
    /// (1 MiB by default), which skips a longer line, and with it every event in it.
    var maxEnqueueBytes = 512 * 1024
    /// Unanswered `uploader.enqueue` calls per AppKey, at most `maxEnqueuesInFlight`.
    var enqueuesInFlight: [String: Int] = [:]
    /// Enqueues one AppKey may have unanswered at once (config `maxEnqueuesInFlight`); its
    /// later events wait in the outbox, counted against `maxHeldEvents`, and go out in the next
    /// enqueues when answers free a slot. See `flushOutbox` for why.
    var maxEnqueuesInFlight = MAService.defaultMaxEnqueuesInFlight
    static let defaultMaxEnqueuesInFlight = 2
    /// Enqueues sent and the events they carried, since the start (`ma.status`), resends not
    /// counted: events per enqueue is the batching under load.
    var enqueuesSent = 0
    var eventsEnqueued = 0
    /// Hand-overs and releases by `ma.setOwner` since the start (`ma.status`).
    var ownerChanges = 0

    init(plugin: Plugin) {
        self.plugin = plugin
        http = HTTPClient(loop: plugin.loop)
    }

    private func openState() -> Database {
        precondition(!plugin.stateDir.isEmpty, "MA state opened before the host's welcome")
        do {
            return try Database(path: plugin.stateDir + "/ma.db")
        } catch {
            plugin.log.error("cannot open MA state", ["error": "\(error)"])
            System.exit(exitStatusConfigError)
        }
    }

    /// Reads the configuration and the persisted state (after the handshake).
    func ready() {
        let c: MAConfig
        do throws(ConfigProblems) {
            c = try MAConfig(plugin.config)
        } catch {
            plugin.log.error("invalid ma configuration", ["error": error.description])
            System.exit(exitStatusConfigError)
        }
        for w in c.warnings { plugin.log.warn("configuration", ["warning": w]) }
        backendURL = c.backend
        credentialFile = c.credentialFile
        defaultProject = c.project
        advertisingId = c.advertisingId
        carrier = c.carrier
        retryInitialMs = c.retryInitialMs
        retryMaxMs = c.retryMaxMs
        maxHeldEvents = c.maxHeldEvents
        maxEventBytes = c.maxEventBytes
        maxEnqueueBytes = c.maxEnqueueBytes
        maxAppKeys = c.maxAppKeys
        maxEnqueuesInFlight = c.maxEnqueuesInFlight
        maxParkedEvents = c.maxParkedEvents
        pendingAfterMs = c.pendingAfterMs
        eventIdWindow = c.eventIdWindow
        do {
            try db.exec(
                """
                PRAGMA journal_mode=WAL;
                CREATE TABLE IF NOT EXISTS apps(app_key TEXT PRIMARY KEY, state TEXT NOT NULL);
                CREATE TABLE IF NOT EXISTS bindings(client INTEGER PRIMARY KEY, app_key TEXT NOT NULL);
                CREATE TABLE IF NOT EXISTS device(k TEXT PRIMARY KEY, v TEXT NOT NULL);
                """)
            try db.exec(MAService.offlineSchema)
            for r in try db.query("SELECT app_key, state FROM apps") {
                guard let k = r[0].text, let t = r[1].text, let j = try? JSON.parse(t) else { continue }
                guard AppKey.isValid(k) else {
                    plugin.log.warn("stored AppKey not valid any more; ignored", ["appKey": k])
                    continue
                }
                let inst = MAInstance(appKey: k)
                inst.restore(j)
                inst.started = inst.euid != nil
                instances[k] = inst
            }
            for r in try db.query("SELECT client, app_key FROM bindings") {
                if let c = r[0].int, let k = r[1].text { clientAppKey[c] = k }
            }
            restoredBindings = Set(clientAppKey.keys)
            vendorId = try deviceValue("vendor_id") { System.randomHex(16) }
            deviceId = try deviceValue("device_id") { System.randomHex(16) }
            // Parked events and the starts and identifies they wait for, before anything is
            // recorded (a session ended by the restart is recorded behind them).
            try restoreOffline()
            // A session that was in the background when the plugin stopped ends after a full
            // timeout from now.
            for inst in instances.values { restoreSession(inst) }
        } catch {
            plugin.log.error("cannot open MA state", ["error": "\(error)"])
            System.exit(exitStatusConfigError)
        }
        plugin.log.info("ma ready", ["appKeys": instances.count, "backend": backendURL])
        pruneRestoredBindings()
        clearUtmWhereDenied()  // a switch denied while this plugin was down
    }

    /// Bindings restored from disk after a restart of this plugin (or of the host).
    private var restoredBindings: Set<Int64> = []

    /// Drops restored bindings whose client is gone: it closed while this plugin was down (its
    /// `bus.client.closed` was missed), or the host restarted. The host's client list decides;
    /// bindings made since the restart are not touched.
    private func pruneRestoredBindings() {
        guard !restoredBindings.isEmpty else { return }
        plugin.call("bus.status", nil) { [unowned self] r in
            guard case .success(let st) = r else { return }
            let live = Set((st["clients"]?.arrayValue ?? []).compactMap { $0["id"]?.intValue })
            for c in self.restoredBindings.sorted() where !live.contains(c) {
                if let k = self.clientAppKey[c], self.liveClients[c] == nil {
                    self.clientAppKey[c] = nil
                    try? self.db.run("DELETE FROM bindings WHERE client=?", [.int(c)])
                    if !self.sessionActive(k), let inst = self.instances[k] { self.setBackground(inst, true); self.endReportInterval(inst) }
                }
            }
            self.plugin.log.info("restored client bindings checked", ["restored": self.restoredBindings.count, "live": live.count])
            self.restoredBindings = []
        }
    }

    private func deviceValue(_ k: String, _ make: () -> String) throws(SQLiteError) -> String {
        if let v = try db.query("SELECT v FROM device WHERE k=?", [.text(k)]).first?[0].text { return v }
        let v = make()
        try db.run("INSERT INTO device(k,v) VALUES(?,?)", [.text(k), .text(v)])
        return v
    }

    func persist(_ inst: MAInstance) {
        do {
            try db.run("INSERT OR REPLACE INTO apps(app_key,state) VALUES(?,?)", [.text(inst.appKey), .text(inst.snapshot.serialized)])
        } catch {
            plugin.log.error("cannot persist MA state", ["appKey": inst.appKey, "error": "\(error)"])
        }
    }

    /// Notes that `client` used `appKey` (called at receipt of a call).
    func touch(_ client: Int64?, _ appKey: String) {
        guard let client else { return }
        if liveClients[client]?.contains(appKey) != true { liveClients[client, default: []].insert(appKey) }
    }

    /// Whether a connected client still uses `appKey`.
    func sessionActive(_ appKey: String) -> Bool {
        liveClients.values.contains { $0.contains(appKey) } || clientAppKey.values.contains(appKey)
    }

    /// Clients connected and using `appKey`.
    func clientCount(_ appKey: String) -> Int {
        Set(liveClients.filter { $0.value.contains(appKey) }.keys).union(clientAppKey.filter { $0.value == appKey }.keys).count
    }

    func bind(client: Int64?, to appKey: String) {
        // A client that closed while its start waited in the queue is not bound (it would stay
        // bound for ever: its close was already handled).
        guard let client, liveClients[client] != nil else { return }
        clientAppKey[client] = appKey
        try? db.run("INSERT OR REPLACE INTO bindings(client,app_key) VALUES(?,?)", [.int(client), .text(appKey)])
    }

    // MARK: Replies

    /// How long MA holds events while the uploader is unavailable: 50 ms doubling to 1.6 s.
    static let uploaderRetry = BackoffPolicy(initialMs: 50, maxMs: 1_600)
    /// Upper bounds of `ma.setReportInterval` (1 day) and `ma.setSessionTimeout` (7 days), in
    /// seconds; larger values are answered -3.
    static let maxReportIntervalS: Int64 = 86_400
    static let maxSessionTimeoutS: Int64 = 7 * 86_400

    /// `ma.setChannelValue`: at most this many values per call, each at most this many bytes
    /// (push tokens are well under it); more is -3.
    static let maxChannelValues = 100
    static let maxChannelValueBytes = 1_024

    /// `{"code":0,"message":""}`, serialized once (the answer to every recorded event).
    static let okReply = Array(#"{"code":0,"message":""}"#.utf8)

    static func result(_ code: Int64, _ message: String, _ extra: JSONObject = [:]) -> JSON {
        var o: JSONObject = ["code": .int(code), "message": .string(message)]
        for (k, v) in extra { o[k] = v }
        return .object(o)
    }

    /// The instance a call addresses: `params.appKey`, else the caller's last start.
    func instance(for call: Call) -> MAInstance? { instance(appKey: Self.appKeyParam(call), client: call.callerInfo.client) }

    /// `params.appKey` when it is a string, as written (not trimmed).
    static func appKeyParam(_ call: Call) -> String? { call.params["appKey"]?.stringValue }

    /// The instance addressed by `appKey` (`params.appKey` when a string, as written), else by
    /// the last start of the calling `client`.
    func instance(appKey: String?, client: Int64?) -> MAInstance? {
        let key: String?
        if let k = appKey.map(\.trimmedWhitespace), !k.isEmpty {
            key = k
        } else {
            key = client.flatMap { clientAppKey[$0] }
        }
        guard let key, let inst = instances[key] else { return nil }
        touch(client, key)
        return inst
    }

    /// Whether a caller may use `inst`: an admin, the uid that first started it, or anyone while
    /// no uid has. A caller without a uid — a plugin acting on its own, or a message without
    /// caller information — is not the owner of a user's AppKey. An AppKey's identity, profile
    /// and switch are one app's: another local user reading its EUID or identifying it as someone
    /// else is what push (appIds) and the uploader (streams) already refuse. The kit's rule
    /// (`Ownership.appKeys`): "admin" is the host's flag only; `ma.setOwner` hands an AppKey over.
    func mayUse(_ inst: MAInstance, uid: Int64?, admin: Bool) -> Bool {
        Ownership.appKeys.access(inst.ownerUid.map { Owner.uid($0) }, caller: CallerInfo(uid: uid, admin: admin), claims: false).isAllowed
    }

    /// `mayUse` for the caller of `call` (its `_pylon` uid and admin flag).
    func mayUse(_ inst: MAInstance, _ call: Call) -> Bool {
        Ownership.appKeys.access(inst.ownerUid.map { Owner.uid($0) }, caller: call.callerInfo, claims: false).isAllowed
    }

    /// The answer to a caller that may not use `appKey` (-1).
    static func notYours(_ appKey: String) -> JSON { result(MACode.failed, "AppKey \(appKey) belongs to another user") }

    /// Replies -2 unless the call's AppKey has a successful or in-flight start, -1 when it
    /// belongs to another uid.
    func usable(_ call: Call) -> MAInstance? {
        usable(
            appKey: Self.appKeyParam(call), client: call.callerInfo.client, uid: call.callerInfo.uid,
            admin: call.callerInfo.isAdmin, call.reply)
    }

    /// `usable` for a call served from its bytes (`appKey`, `client` as for `instance`).
    func usable(appKey: String?, client: Int64?, uid: Int64?, admin: Bool, _ reply: (JSON) -> Void) -> MAInstance? {
        guard let inst = instance(appKey: appKey, client: client), inst.isUsable else {
            reply(MAService.result(MACode.notStarted, "start not called for this AppKey"))
            return nil
        }
        guard mayUse(inst, uid: uid, admin: admin) else {
            reply(MAService.notYours(inst.appKey))
            return nil
        }
        return inst
    }
}
