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
    /// The settings, read once from the host's welcome (`MAConfig`: every default is there).
    let config: MAConfig
    /// The MA backend's client.
    let http: HTTPClient
    /// The plugin's state (apps, client bindings, device ids, parked events), `ma.db` in the
    /// state directory the welcome named.
    let db: Database
    /// Per-install vendor id (`idfv` on Linux) and device id, persisted.
    let vendorId: String
    let deviceId: String
    var instances: [String: MAInstance] = [:]
    /// Which AppKey each client connection last started (ma.md: calls without `appKey` use it).
    var clientAppKey: [Int64: String] = [:]
    /// Clients not yet reported closed, and the AppKeys each has used (started, or named with
    /// `appKey`). An AppKey's app session lasts while one of them, or a bound client, is
    /// connected. (The host delivers a client's requests before its `bus.client.closed`.)
    var liveClients: [Int64: Set<String>] = [:]
    var eventSeq: UInt64 = 0
    /// Event ids: this install's device id and a random value drawn once per process start.
    let eventIdPrefix: [UInt8]

    // Events on their way to the uploader (MAService+Events).
    /// Per AppKey, the batches of events recorded in this loop turn (the last one open).
    var outbox: [String: [EventBatch]] = [:]
    /// Fires at the end of the loop turn the outbox's first event came in (`flushOutbox`).
    let outboxTimer: Timer
    var outboxCount = 0
    /// Settled batches, kept (emptied) for the next ones.
    var spareBatches: [EventBatch] = []
    /// Events sent to the uploader and not yet answered (or waiting to be sent again).
    var held = 0
    // Offline (MAService+Offline).
    /// Events recorded and waiting to be parked in ma.db at the end of this loop turn (one
    /// transaction for all), answered once it commits.
    var parkQueue: [ParkedEvent] = []
    /// Fires at the end of the loop turn the park queue's first event came in (`flushParkQueue`).
    let parkTimer: Timer
    /// The last enqueue met an uploader restarting or not answering in time (cleared by one that
    /// succeeds): batches waiting for an enqueue slot are kept on disk and answered
    /// (`flushOutbox`).
    var uploaderDown = false
    /// Events parked in ma.db, every AppKey (`eventsWaitingForStart` in `ma.status`).
    var parkedTotal = 0
    /// Events answered as repeats of a client event id, since the start (`ma.status`).
    var duplicateEvents = 0
    /// Parked events dropped because their AppKey never got an EUID (its starts failed), since
    /// the start (`ma.status`).
    var parkedDropped = 0
    /// Unanswered `uploader.enqueue` calls per AppKey, at most `maxEnqueuesInFlight`.
    var enqueuesInFlight: [String: Int] = [:]
    /// Enqueues sent and the events they carried, since the start (`ma.status`), resends not
    /// counted: events per enqueue is the batching under load.
    var enqueuesSent = 0
    var eventsEnqueued = 0
    /// Hand-overs and releases by `ma.setOwner` since the start (`ma.status`).
    var ownerChanges = 0

    /// Built by `open` once the host's welcome named the config and the state directory.
    private init(plugin: Plugin, config: MAConfig, db: Database, vendorId: String, deviceId: String) {
        self.plugin = plugin
        self.config = config
        self.db = db
        self.vendorId = vendorId
        self.deviceId = deviceId
        eventIdPrefix = Array("\(deviceId)-\(System.randomHex(6))".utf8)
        http = HTTPClient(loop: plugin.loop)
        outboxTimer = Timer(loop: plugin.loop) {}
        parkTimer = Timer(loop: plugin.loop) {}
        outboxTimer.callback = { [unowned self] in self.flushOutbox() }
        parkTimer.callback = { [unowned self] in self.flushParkQueue() }
    }

    /// The service, from the host's welcome: the configuration read (`MAConfig`), `ma.db` opened
    /// and its schema made, the device ids and the persisted apps, bindings and parked events
    /// restored. A configuration or state it cannot use: exit 78 (EX_CONFIG).
    static func open(_ plugin: Plugin) -> MAService {
        let c: MAConfig
        do throws(ConfigProblems) {
            c = try MAConfig(plugin.config)
        } catch {
            plugin.log.error("invalid ma configuration", ["error": error.description])
            System.exit(exitStatusConfigError)
        }
        for w in c.warnings { plugin.log.warn("configuration", ["warning": w]) }
        precondition(!plugin.stateDir.isEmpty, "MA state opened before the host's welcome")
        let ma: MAService
        do {
            let db = try Database(path: plugin.stateDir + "/ma.db")
            try db.exec(
                """
                PRAGMA journal_mode=WAL;
                CREATE TABLE IF NOT EXISTS apps(app_key TEXT PRIMARY KEY, state TEXT NOT NULL);
                CREATE TABLE IF NOT EXISTS bindings(client INTEGER PRIMARY KEY, app_key TEXT NOT NULL);
                CREATE TABLE IF NOT EXISTS device(k TEXT PRIMARY KEY, v TEXT NOT NULL);
                """)
            try db.exec(MAService.offlineSchema)
            ma = MAService(
                plugin: plugin, config: c, db: db, vendorId: try deviceValue(db, "vendor_id") { System.randomHex(16) },
                deviceId: try deviceValue(db, "device_id") { System.randomHex(16) })
            try ma.restore()
        } catch {
            plugin.log.error("cannot open MA state", ["error": "\(error)"])
            System.exit(exitStatusConfigError)
        }
        plugin.log.info("ma ready", ["appKeys": ma.instances.count, "backend": c.backend])
        ma.pruneRestoredBindings()
        ma.clearUtmWhereDenied()  // a switch denied while this plugin was down
        return ma
    }

    /// The persisted apps, client bindings and parked events.
    private func restore() throws {
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
        // Parked events and the starts and identifies they wait for, before anything is
        // recorded (a session ended by the restart is recorded behind them).
        try restoreOffline()
        // A session that was in the background when the plugin stopped ends after a full
        // timeout from now.
        for inst in instances.values { restoreSession(inst) }
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

    private static func deviceValue(_ db: Database, _ k: String, _ make: () -> String) throws(SQLiteError) -> String {
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
