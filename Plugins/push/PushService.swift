import CJSONC
import PylonHTTP
import PylonMQTT
import PylonPluginKit
import PylonStore

/// The push plugin's shell: it feeds the `Registration` and `Delivery` machines with events
/// from the bus, the broker, the backend and the clock, and performs their actions (HTTP calls,
/// SQLite writes, app callbacks, one timer armed for the next deadline).
final class PushService {
    let plugin: Plugin
    var config = PushConfig(.object([:]))
    var store: PushStore!
    var http: HTTPClient!
    var mqtt: MQTTClient?
    var reg = Registration(token: nil, deferred: true)
    var delivery = Delivery(limits: Delivery.Limits())
    var activities = LiveActivities()
    var counters = PushCounters()
    var installId = ""
    var boundUser: String?
    var subscribedTopic: String?
    var seq: Int64 = 0
    var timer: Timer!

    struct Attachment { var client: Int64; var uid: Int64; var callback: String }
    var attached: [String: Attachment] = [:]

    /// bind/unbind/liveActivityBind in call order; each waits for a token, then runs alone.
    struct Op {
        var waitId: Int
        var state: OpState
        var run: (_ token: String, _ finish: @escaping () -> Void) -> Void
        var timedOut: () -> Void
    }
    enum OpState { case waiting, ready, expired }
    var ops: [Op] = []
    var opRunning = false
    var nextWaitId = 1
    /// `push.register` calls waiting for a token: waitId → reply.
    var registerWaiters: [Int: (String?) -> Void] = [:]
    /// Acknowledged ids not yet reported to the backend (sent once per loop turn).
    var pendingAcks: [String] = []
    /// Acknowledged ids whose inbox rows are deleted at the end of this loop turn.
    var pendingDeletes: [String] = []
    /// Payloads of inbox messages received by this process (others are read from SQLite).
    var payloads: [String: String] = [:]
    let tokener = Tokener(maxDepth: 16)
    var ackFlush: Timer!

    init(plugin: Plugin) { self.plugin = plugin }

    var now: Int64 { System.wallClockMs() }
    var log: Log { plugin.log }

    // MARK: Start

    func start() {
        config = PushConfig(plugin.config)
        let path = (plugin.stateDir.isEmpty ? "." : plugin.stateDir) + "/push.db"
        do throws(SQLiteError) {
            store = try PushStore(path: path, maxSeen: config.maxSeen)
        } catch {
            log.error("cannot open the push database", ["path": path, "error": error.description])
            System.exit(1)
        }
        http = HTTPClient(loop: plugin.loop)
        timer = Timer(loop: plugin.loop) { [unowned self] in self.tick() }
        ackFlush = Timer(loop: plugin.loop) { [unowned self] in self.flushAcks() }
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
            retryInitialMs: config.registerRetryInitialMs, retryMaxMs: config.registerRetryMaxMs)
        delivery = Delivery(limits: config.delivery)
        if let entries = try? store.inbox() { for e in entries { delivery.restore(e, now: now) } }
        seq = store.maxSeq()
        for a in store.activities() {
            let schema = a.schema.flatMap { try? JSON.parse($0) }.flatMap { LiveActivities.parseSchema($0) } ?? nil
            activities.restore(activityId: a.id, pushToken: a.pushToken, appId: a.appId, schema: schema)
        }
        var o = MQTTOptions(json: config.broker, clientId: "pylon-push-" + installId)
        o.cleanSession = false
        let client = MQTTClient(loop: plugin.loop, options: o)
        client.onMessage = { [unowned self] topic, payload in self.received(topic: topic, payload) }
        client.onReadBatchBegin = { [unowned self] in self.store.begin() }
        client.onReadBatchEnd = { [unowned self] in self.store.commit() }
        client.onConnect = { [unowned self] present in
            self.log.info("broker connected", ["sessionPresent": present])
            self.flushAcks()
        }
        client.onDisconnect = { [unowned self] why in self.log.warn("broker connection lost", ["reason": why]) }
        mqtt = client
        if let token { subscribe(token) }
        client.start()
        restoreAttachments()
        perform(reg.start())
        arm()
        log.info(
            "push ready",
            [
                "installId": installId, "token": token ?? "none", "deferred": config.deferRegistration,
                "inbox": delivery.count,
            ])
    }

    func shutdown() {
        flushAcks()
        mqtt?.stop()
        store?.db.close()
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

    func subscribe(_ token: String) {
        let topic = "pylon/push/d/" + token
        guard topic != subscribedTopic else { return }
        // The old token is retired by the backend: nothing more arrives on its topic.
        if let old = subscribedTopic { mqtt?.unsubscribe(old) }
        subscribedTopic = topic
        mqtt?.subscribe(topic, qos: 1)
    }

    func perform(_ actions: [Registration.Action]) {
        for a in actions {
            switch a {
            case .register: register()
            case .ready(let ids): for id in ids { waiterReady(id, token: reg.token) }
            case .timedOut(let ids): for id in ids { waiterReady(id, token: nil) }
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

    private func register(given: String? = nil) {
        var body: JSONObject = ["installId": .string(installId)]
        if let g = given { body["token"] = .string(g) }
        post("/v1/push/register", .object(body)) { [unowned self] r in
            switch r {
            case .success(let j) where j["code"]?.intValue == 0 && j["token"]?.stringValue != nil:
                self.tokenChanged(j["token"]!.stringValue!)
            case .success(let j):
                self.log.warn("registration refused", ["reply": j.serialized])
                self.reg.failed(now: self.now)
            case .failure(let why):
                self.log.warn("registration failed; retrying", ["error": why])
                self.reg.failed(now: self.now)
            }
            self.arm()
        }
    }

    private func tokenChanged(_ token: String) {
        let old = reg.token
        try? store.set("token", token)
        subscribe(token)
        perform(reg.succeeded(token: token))
        if old != nil, old != token, let user = boundUser {
            log.info("device token changed: rebinding", ["userId": user])
            enqueueOp(timedOut: {}) { [unowned self] t, finish in
                self.post("/v1/push/bind", ["token": .string(t), "userId": .string(user)]) { _ in finish() }
            }
        }
    }

    // MARK: Ops in call order

    func enqueueOp(timedOut: @escaping () -> Void, _ run: @escaping (String, @escaping () -> Void) -> Void) {
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
                head.run(token) { [unowned self] in
                    self.opRunning = false
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

    /// POSTs JSON to the backend; `.failure` for network errors and non-2xx (counted).
    func post(_ path: String, _ body: JSON, _ done: @escaping (Result<JSON, PushFailure>) -> Void) {
        let req = HTTPRequest(
            method: "POST", url: config.backend + path, headers: [("Content-Type", "application/json")],
            body: Array(body.serialized.utf8), timeoutMs: config.httpTimeoutMs)
        http.send(req) { [unowned self] r in
            switch r {
            case .success(let resp) where (200..<300).contains(resp.status):
                done(.success((try? JSON.parse(resp.bodyText)) ?? .null))
            case .success(let resp):
                self.counters.backendErrors += 1
                self.log.warn("backend error", ["path": path, "status": resp.status])
                done(.failure(PushFailure("backend answered \(resp.status)")))
            case .failure(let e):
                self.counters.backendErrors += 1
                done(.failure(PushFailure(e.description)))
            }
        }
    }

    // MARK: Timer

    func arm() {
        guard let timer else { return }
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
    init(_ d: String) { description = d }
}
