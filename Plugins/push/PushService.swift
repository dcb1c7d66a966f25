import PylonHTTP
import PylonMQTT
import PylonPluginKit
import PylonStore

#if canImport(Glibc)
import Glibc
#endif

/// The push plugin's shell: it feeds the `Registration` and `Delivery` machines with events
/// from the bus, the broker, the backend and the clock, and performs their actions (HTTP calls,
/// SQLite writes, app callbacks, one timer armed for the next deadline). Built once the host's
/// welcome named the configuration and the state directory (`PushService.open`, from `onReady`),
/// with its dependencies as constants.
final class PushService {
    let plugin: Plugin
    let config: PushConfig
    let store: PushStore
    let http: HTTPClient
    var mqtt: MQTTClient?
    var reg = Registration(token: nil, deferred: true)
    var delivery = Delivery(limits: Delivery.Limits())
    var activities = LiveActivities()
    var counters = PushCounters()
    var installId = ""
    /// This device's token from `POST /v1/devices/register` (`pd1.<deviceId>.<secret>`): the
    /// bearer credential of the push calls and the broker password; nil until registered.
    var deviceToken: String?
    var deviceId: String?
    var deviceTokenPath = ""
    var boundUser: String?
    var subscribedTopic: String?
    /// CONNACK refusals of the credential since the last re-enrolment (`brokerRefusedCredential`).
    var brokerRefusals = 0
    var reEnrolling = false
    var lastReEnrolment: Int64 = 0
    var seq: Int64 = 0
    let timer: Timer

    struct Attachment { var client: Int64; var uid: Int64; var callback: String }
    var attached: [String: Attachment] = [:]
    /// Hand-overs and releases by `push.setOwner` since the start (`push.status`).
    var ownerChanges = 0

    /// bind/unbind/liveActivityBind in call order; each waits for a token, then runs alone.
    struct Op {
        var waitId: Int
        var state: OpState
        var run: (_ token: String, _ finish: @escaping (OpEnd) -> Void) -> Void
        var timedOut: () -> Void
        /// Ran once already and was refused by a backend that lost the device: a second such
        /// refusal answers the caller (3001) instead of queueing it again.
        var retried = false
    }
    enum OpState { case waiting, ready, expired }
    /// How an op ended: done, or refused because the backend lost the device (`why`): the op
    /// goes back to the head of the queue and runs again once the device registered again.
    enum OpEnd: Equatable {
        case done
        case retry(Registration.Reason)
    }
    var ops: [Op] = []
    var opRunning = false
    var nextWaitId = 1
    /// `push.register` calls waiting for a token: waitId → reply.
    var registerWaiters: [Int: (String?) -> Void] = [:]
    /// Acknowledged ids not yet reported to the backend (sent once per loop turn).
    var pendingAcks: [String] = []
    /// Acknowledged ids whose inbox rows are deleted at the end of this loop turn.
    var pendingDeletes: [String] = []
    /// The inbox and the dedup keys (`push.inbox`, an append-only log).
    let inbox: PushInbox
    let tokener = Tokener(maxDepth: 16)
    let ackFlush: Timer

    init(plugin: Plugin, config: PushConfig, store: PushStore, inbox: PushInbox) {
        self.plugin = plugin
        self.config = config
        self.store = store
        self.inbox = inbox
        http = HTTPClient(loop: plugin.loop)
        timer = Timer(loop: plugin.loop) {}
        ackFlush = Timer(loop: plugin.loop) {}
        timer.callback = { [unowned self] in self.tick() }
        ackFlush.callback = { [unowned self] in self.flushAcks() }
    }

    var now: Int64 { System.wallClockMs() }
    var log: Log { plugin.log }

    // MARK: Start

    /// Reads the configuration and opens the plugin's database (exit 78 for a configuration the
    /// plugin refuses, 1 for a database it cannot open), then starts: the service `onReady` builds.
    static func open(_ plugin: Plugin) -> PushService {
        let config: PushConfig
        do throws(ConfigProblems) {
            config = try PushConfig(plugin.config)
        } catch {
            plugin.log.error("invalid push configuration", ["error": error.description])
            System.exit(exitStatusConfigError)
        }
        for w in config.warnings { plugin.log.warn("configuration", ["warning": w]) }
        let path = stateDir(plugin) + "/push.db"
        let store: PushStore
        do throws(SQLiteError) {
            store = try PushStore(path: path, maxSeen: config.maxSeen)
        } catch {
            plugin.log.error("cannot open the push database", ["path": path, "error": error.description])
            System.exit(1)
        }
        // Messages and the install id are this device's: owner-only (SQLite gives -wal/-shm the same mode).
        for f in [path, path + "-wal", path + "-shm"] { _ = chmod(f, 0o600) }
        let inboxPath = stateDir(plugin) + "/push.inbox"
        let inbox: PushInbox
        do throws(IOError) {
            try PushInbox.migrate(from: store, to: inboxPath, maxSeen: config.maxSeen)
            inbox = try PushInbox(path: inboxPath, maxSeen: config.maxSeen)
        } catch {
            plugin.log.error("cannot open the push inbox", ["path": inboxPath, "error": error.description])
            System.exit(1)
        }
        if inbox.log.truncatedBytes > 0 { plugin.log.warn("push inbox: torn tail cut", ["bytes": inbox.log.truncatedBytes]) }
        let push = PushService(plugin: plugin, config: config, store: store, inbox: inbox)
        push.start()
        return push
    }

    /// The state directory named by the welcome (`.` when none).
    static func stateDir(_ plugin: Plugin) -> String { plugin.stateDir.isEmpty ? "." : plugin.stateDir }

    private func start() {
        deviceTokenPath = config.deviceTokenFile ?? Self.stateDir(plugin) + "/device.token"
        if case .success(let t) = DeviceCredential.load(deviceTokenPath) { useDeviceToken(t) }
        installId =
            store.get("installId")
            ?? {
                let id = System.randomHex(16)
                try? store.set("installId", id)
                return id
            }()
        boundUser = store.get("user")
        let token = store.get("token")
        reg = Registration(
            token: token, deferred: config.deferRegistration,
            retryInitialMs: config.registerRetryInitialMs, retryMaxMs: config.registerRetryMaxMs,
            checkIntervalMs: config.registrationCheckMs, minReregisterIntervalMs: config.minReregisterIntervalMs,
            // A user bound but no token: the token was dropped as lost before a restart.
            rebindOwed: token == nil && boundUser != nil)
        delivery = Delivery(limits: config.delivery)
        for m in inbox.entries {
            delivery.restore(
                .init(id: m.id, appId: m.appId, seq: m.seq, bytes: m.payload.utf8.count, expiresAt: m.expiresAt, attempts: 0, cold: m.cold),
                now: now)
        }
        seq = inbox.maxSeq
        for a in store.activities() {
            let schema = a.schema.flatMap { try? JSON.parse($0) }.flatMap { LiveActivities.parseSchema($0) } ?? nil
            activities.restore(activityId: a.id, pushToken: a.pushToken, appId: a.appId, schema: schema)
        }
        if deviceToken != nil { startBroker() }
        restoreAttachments()
        perform(reg.start())
        arm()
        log.info(
            "push ready",
            [
                "deviceRegistered": deviceToken != nil, "pushToken": token != nil, "deferred": config.deferRegistration,
                "inbox": delivery.count,
            ])
        log.debug("push identity", ["installId": installId, "deviceId": deviceId ?? "none"])
    }

    /// Adopts a device token (`pd1.<deviceId>.<secret>`): its device id names the topics.
    func useDeviceToken(_ t: String) {
        let parts = t.split(separator: ".")
        guard parts.count == 3, parts[0] == "pd1" else {
            log.warn("stored device token malformed; registering again")
            return
        }
        deviceToken = t
        deviceId = String(parts[1])
    }

    /// Connects to the broker with the device's credential (username = device id, password = the
    /// device token, or the broker credential registration returned — a NATS user JWT on a
    /// nats-server cluster — client id `pylon-push-<installId>`, which mosquitto binds to the
    /// credential). `broker.brokers` lists a cluster's nodes: the client moves to the next one
    /// when a connection fails or is lost and resumes its persistent session there.
    func startBroker() {
        guard mqtt == nil, let deviceToken, let deviceId else { return }
        var o = config.brokerOptions(clientId: "pylon-push-" + installId)
        for why in o.ignored { log.warn("broker configuration entry ignored", ["reason": why]) }
        o.cleanSession = false
        o.username = deviceId
        o.password = store.get("brokerPassword") ?? deviceToken
        let client = MQTTClient(loop: plugin.loop, options: o)
        client.onMessage = { [unowned self] topic, payload in self.received(topic: topic, payload) }
        client.onReadBatchBegin = { [unowned self] in
            self.store.begin()
            self.inbox.begin()
        }
        client.onReadBatchEnd = { [unowned self] in
            self.store.commit()
            do throws(IOError) { try self.inbox.commit() } catch {
                // libmosquitto acknowledged these messages already: they are lost (disk full or I/O error).
                self.log.error("cannot store received messages; they are lost", ["error": error.description])
            }
        }
        client.onConnect = { [unowned self, unowned client] present in
            self.log.info("broker connected", ["sessionPresent": present, "broker": client.broker.description])
            self.brokerRefusals = 0
            self.flushAcks()
            self.hello()
        }
        client.onDisconnect = { [unowned self] why in self.log.warn("broker connection lost", ["reason": why]) }
        client.onNotAuthorised = { [unowned self] in self.brokerRefusedCredential() }
        mqtt = client
        subscribe()
        client.start()
    }

    /// The broker refused this device's credential: after `PushConfig.refusalsBeforeReEnrolment`
    /// refusals in a row, enrol again (at most once per `registerRetryMaxMs`) for a fresh one —
    /// the way a device moves from mosquitto (password = device token) to a nats-server
    /// cluster (password = a user JWT the backend returns), or recovers a credential the broker
    /// lost.
    func brokerRefusedCredential() {
        brokerRefusals += 1
        guard brokerRefusals >= PushConfig.refusalsBeforeReEnrolment, !reEnrolling,
            now - lastReEnrolment >= config.registerRetryMaxMs
        else { return }
        reEnrolling = true
        lastReEnrolment = now
        log.warn("the broker refuses this device's credential; enrolling again", ["refusals": brokerRefusals])
        registerDevice { [unowned self] ok in
            self.reEnrolling = false
            if ok { self.brokerRefusals = 0 }
        }
    }

    func shutdown() {
        flushAcks()
        mqtt?.stop()
        store.db.close()
    }

    /// Attachments recorded before a restart stay if their client still serves the callback.
    private func restoreAttachments() {
        let saved = store.attachments()
        guard !saved.isEmpty else { return }
        providers { [unowned self] provided in
            for a in saved {
                if provided[a.callback] == a.client {
                    self.attached[a.appId] = Attachment(client: a.client, uid: a.uid, callback: a.callback)
                    self.perform(self.delivery.attach(appId: a.appId, client: a.client, now: self.now))
                } else {
                    try? self.store.setApp(a.appId, uid: a.uid, client: nil, callback: nil)
                }
            }
            self.arm()
        }
    }

    /// The host's map of provided methods → client id.
    func providers(_ done: @escaping ([String: Int64]) -> Void) {
        plugin.call("bus.describe", nil) { r in
            var m: [String: Int64] = [:]
            if case .success(let j) = r, let o = j["provided"]?.objectValue {
                for (k, v) in o { if let c = v.intValue { m[k] = c } }
            }
            done(m)
        }
    }

    // MARK: Registration

    /// The device's own topic (by device id: a new push token keeps it), at QoS 1, and the
    /// broadcast topic every device reads, at QoS 0: a broadcast this device missed (offline,
    /// or lost by the broker) is published again on its own topic after its hello.
    func subscribe() {
        guard let deviceId, subscribedTopic == nil else { return }
        let topic = "pylon/push/d/" + deviceId
        subscribedTopic = topic
        mqtt?.subscribe(topic, qos: 1)
        mqtt?.subscribe(PushConfig.broadcastTopic, qos: 0)
    }

    func perform(_ actions: [Registration.Action]) {
        for a in actions {
            switch a {
            case .register: register()
            case .ready(let ids): for id in ids { waiterReady(id, token: reg.token) }
            case .timedOut(let ids): for id in ids { waiterReady(id, token: nil) }
            case .rebind: rebind()
            }
        }
    }

    private func waiterReady(_ id: Int, token: String?) {
        if let w = registerWaiters.removeValue(forKey: id) {
            w(token)
            return
        }
        if let i = ops.firstIndex(where: { $0.waitId == id }) { ops[i].state = token != nil ? .ready : .expired }
        kickOps()
    }

    /// Registers the device first when it has no device token (`POST /v1/devices/register`
    /// with the enrolment credential), then its push token.
    private func register(given: String? = nil) {
        guard deviceToken != nil else {
            registerDevice { [unowned self] ok in
                if ok {
                    self.register(given: given)
                } else {
                    self.reg.failed(now: self.now)
                    self.arm()
                }
            }
            return
        }
        var body: JSONObject = ["installId": .string(installId)]
        if let g = given { body["token"] = .string(g) }
        post("/v1/push/register", .object(body)) { [unowned self] r in
            switch r {
            case .success(let j) where j["code"]?.intValue == 0 && j["token"]?.stringValue != nil:
                self.tokenChanged(j["token"]!.stringValue!)
            case .success(let j):
                self.log.warn("registration refused", ["reply": j.serialized])
                self.reg.failed(now: self.now)
            case .failure(let why) where why.status == 401:
                // The backend no longer knows this device token: enrol again (this attempt ends).
                self.reg.failed(now: self.now)
                self.lost(.credentialRejected)
            case .failure(let why):
                self.log.warn("registration failed; retrying", ["error": why])
                self.reg.failed(now: self.now)
            }
            self.arm()
        }
    }

    private func tokenChanged(_ token: String) {
        try? store.set("token", token)
        perform(reg.succeeded(token: token, now: now))
    }

    /// The backend no longer knows this device's credential (a 401) or its push token (3001):
    /// drop what it refused and register again (`Registration.lost`: one attempt at a time,
    /// at most one per `minReregisterIntervalMs`); the bindings follow (`rebind`).
    func lost(_ why: Registration.Reason) {
        if why == .credentialRejected, deviceToken != nil {
            log.warn("the backend refuses this device's credential; registering again", ["reason": why.rawValue])
            forgetDeviceToken()
        } else if why == .tokenUnknown {
            log.warn("the backend does not know this device's push token; registering again", ["reason": why.rawValue])
        }
        try? store.set("token", nil)
        perform(reg.lost(why, now: now))
        arm()
    }

    /// Binds the bound user and the Live Activities again (the backend lost them with the
    /// device or its token), as the first op: calls queued meanwhile come after it, in order.
    func rebind() {
        let id = nextWaitId
        nextWaitId += 1
        let op = Op(
            waitId: id, state: .ready,
            run: { [unowned self] token, finish in
                var calls: [(String, JSON)] = []
                if let user = self.boundUser { calls.append(("/v1/push/bind", ["token": .string(token), "userId": .string(user)])) }
                for a in self.store.activities() {
                    calls.append(
                        (
                            "/v1/push/liveactivity",
                            [
                                "token": .string(token), "activityId": .string(a.id), "pushToken": .string(a.pushToken),
                                "appId": .string(a.appId),
                            ]
                        ))
                }
                self.log.info("registered again: binding again", ["user": self.boundUser != nil, "activities": calls.count])
                self.runInOrder(calls, finish)
            }, timedOut: {})
        ops.insert(op, at: 0)
        kickOps()
    }

    /// POSTs `calls` one after the other; a refusal that says the backend lost the device
    /// again ends the rest (`.retry`), any other failure is logged and the next call goes.
    private func runInOrder(_ calls: [(String, JSON)], _ finish: @escaping (OpEnd) -> Void) {
        guard let (path, body) = calls.first else { return finish(.done) }
        post(path, body) { [unowned self] r in
            if let why = Self.loss(r) { return finish(.retry(why)) }
            if case .success(let j) = r, j["code"]?.intValue != 0 {
                self.log.warn("binding again refused", ["path": path, "reply": j.serialized])
            }
            self.runInOrder(Array(calls.dropFirst()), finish)
        }
    }

    /// Whether a push call's answer says the backend lost the device (401) or its push token
    /// (3001): the call is worth making again after registering again.
    static func loss(_ r: Result<JSON, PushFailure>) -> Registration.Reason? {
        switch r {
        case .failure(let e) where e.status == 401: return .credentialRejected
        case .success(let j) where j["code"]?.intValue == PushCode.needToken: return .tokenUnknown
        default: return nil
        }
    }

    // MARK: Ops in call order

    func enqueueOp(timedOut: @escaping () -> Void, _ run: @escaping (String, @escaping (OpEnd) -> Void) -> Void) {
        let id = nextWaitId
        nextWaitId += 1
        ops.append(Op(waitId: id, state: .waiting, run: run, timedOut: timedOut))
        perform(reg.wait(id: id, now: now, timeoutMs: config.tokenWaitMs))
        kickOps()
        arm()
    }

    private func kickOps() {
        while !opRunning, let head = ops.first {
            switch head.state {
            case .waiting: return
            case .expired:
                ops.removeFirst()
                head.timedOut()
            case .ready:
                guard let token = reg.token else { return }
                ops.removeFirst()
                opRunning = true
                head.run(token) { [unowned self] end in
                    self.opRunning = false
                    if case .retry(let why) = end, head.retried {
                        head.timedOut()
                        self.lost(why)
                    } else if case .retry(let why) = end {
                        // Back to the head, waiting (within its own wait) for the new token.
                        var again = head
                        again.retried = true
                        again.waitId = self.nextWaitId
                        again.state = .waiting
                        self.nextWaitId += 1
                        self.ops.insert(again, at: 0)
                        self.lost(why)
                        self.perform(self.reg.wait(id: again.waitId, now: self.now, timeoutMs: self.config.tokenWaitMs))
                        self.arm()
                    }
                    self.kickOps()
                }
            }
        }
    }

    func waitForToken(timeoutMs: Int64, _ done: @escaping (String?) -> Void) {
        let id = nextWaitId
        nextWaitId += 1
        registerWaiters[id] = done
        perform(reg.wait(id: id, now: now, timeoutMs: timeoutMs))
        arm()
    }

    // MARK: Backend

    /// `POST /v1/devices/register {installId}`: with the device token held (the backend renews
    /// an install only for its own token), else with the enrolment credential (`credentialFile`;
    /// none: open enrolment), which registers a new install only. A held token the backend
    /// refuses (401: it forgot the device; 403: the token is another install's, a copied state
    /// file) is dropped and the install enrolled again at once;
    /// a 409 means the backend knows the install but not from this device's token (an
    /// operator approves its re-enrolment, docs/SECURITY.md "Enrolment"). Stores the device
    /// token (0600) and connects to the broker with it.
    func registerDevice(_ done: @escaping (Bool) -> Void) {
        let withToken = deviceToken != nil
        let headers =
            deviceToken.map { [("Authorization", "Bearer " + $0)] } ?? DeviceCredential.headers(config.credentialFile, log: log)
        post("/v1/devices/register", ["installId": .string(installId)], headers: headers) { [unowned self] r in
            guard case .success(let j) = r, let t = j["token"]?.stringValue else {
                if case .failure(let e) = r, e.status == 401 || e.status == 403, withToken {
                    self.log.warn("the backend refuses this device's token; enrolling the install again")
                    self.forgetDeviceToken()
                    self.registerDevice(done)
                    return
                }
                if case .failure(let e) = r, e.status == 409 {
                    self.log.error(
                        "the backend knows this install but this device holds no token for it: an operator must approve "
                            + "its re-enrolment (POST /v1/admin/devices/\(self.installId)/reenrol)", ["installId": self.installId])
                } else if case .failure(let e) = r {
                    self.log.warn("device registration failed", ["error": e.description])
                }
                done(false)
                return
            }
            guard DeviceCredential.store(t, at: self.deviceTokenPath) else {
                self.log.error("cannot store the device token", ["path": self.deviceTokenPath])
                done(false)
                return
            }
            self.useDeviceToken(t)
            // The broker credential, when it is not the device token (a nats-server cluster).
            if let pw = j["mqtt"]?["password"]?.stringValue, (1...PushConfig.maxBrokerPasswordBytes).contains(pw.utf8.count) {
                try? self.store.set("brokerPassword", pw)
            } else {
                try? self.store.set("brokerPassword", nil)
            }
            // A renewed token is a new broker password: reconnect with it.
            if let old = self.mqtt {
                old.stop()
                self.mqtt = nil
                self.subscribedTopic = nil
            }
            guard self.deviceToken != nil else { done(false); return }
            self.log.info("device registered")
            self.startBroker()
            done(true)
        }
    }

    /// Drops a device token the backend refused (the next registration enrols again).
    func forgetDeviceToken() {
        deviceToken = nil
        unlink(deviceTokenPath)
    }

    /// POSTs JSON to the backend with the device token (or `headers`); `.failure` for network
    /// errors and non-2xx (counted).
    func post(
        _ path: String, _ body: JSON, headers: [(String, String)]? = nil, _ done: @escaping (Result<JSON, PushFailure>) -> Void
    ) {
        let auth = headers ?? deviceToken.map { [("Authorization", "Bearer " + $0)] } ?? []
        let req = HTTPRequest(
            method: "POST", url: config.backend + path, headers: [("Content-Type", "application/json")] + auth,
            body: Array(body.serialized.utf8), timeoutMs: config.httpTimeoutMs)
        http.send(req) { [unowned self] r in
            switch r {
            case .success(let resp) where (200..<300).contains(resp.status):
                done(.success((try? JSON.parse(resp.bodyText)) ?? .null))
            case .success(let resp):
                self.counters.backendErrors += 1
                self.log.warn("backend error", ["path": path, "status": resp.status])
                done(.failure(PushFailure("backend answered \(resp.status)", status: resp.status)))
            case .failure(let e):
                self.counters.backendErrors += 1
                done(.failure(PushFailure(e.description)))
            }
        }
    }

    // MARK: Timer

    func arm() {
        let d = [delivery.nextDeadline(), reg.nextDeadline()].compactMap { $0 }.min()
        guard let d else { timer.stop(); return }
        timer.start(after: UInt64(max(0, d - now)))
    }

    private func tick() {
        let t = now
        perform(reg.tick(now: t))
        perform(delivery.tick(now: t))
        arm()
    }
}

/// Why a backend call failed.
struct PushFailure: Error, CustomStringConvertible {
    let description: String
    /// The HTTP status when the backend answered (nil: network error).
    var status: Int?
    init(_ d: String, status: Int? = nil) {
        description = d
        self.status = status
    }
}
