import PylonCore
import PylonHTTP
import PylonMQTT
import PylonStore

#if canImport(Glibc)
import Glibc
#endif

/// The simulator: K devices on one libuv loop, one curl multi handle for every HTTP request
/// (bounded by `maxInflightHTTP`), one libmosquitto client per device. A 100 ms ticker starts
/// devices at the ramp rate, retries failed setup steps, cuts and posts batches, and moves a
/// device that lost its broker to the next one; other timers send pushes and print progress.
final class Fleet {
    enum Phase: String { case load, draining, verifying, done }

    static let tickMs: Int64 = 100
    /// Backoff of failed setup steps and batches: doubling from the first to the last.
    static let retryInitialMs: Int64 = 250
    static let retryMaxMs: Int64 = 8000

    let loop: Loop
    let options: FleetOptions
    let http: HTTPClient
    let enrolSecret: String
    let operatorToken: String?
    var devices: [SimDevice] = []
    /// Set when the descriptor limit capped the device count.
    let fdNote: String?
    private(set) var phase = Phase.load

    // HTTP queues: device setup (registration, MA start, push registration, binding) first,
    // then batches and read-back, each in order. Setup goes first so the time to connect the
    // fleet measures the backend, not this process's own queue of batches: real devices do not
    // share one.
    typealias Pending = (HTTPRequest, (Result<HTTPResponse, HTTPClientError>) -> Void)
    private var setupQueue = FIFO<Pending>()
    private var queue = FIFO<Pending>()
    private var inflightHTTP = 0

    // Timers and clocks.
    private var ticker: Timer!
    private var progressTimer: Timer!
    private var pushTimer: Timer?
    private var broadcastTimer: Timer?
    private var tickNo: Int64 = 0
    let startMs: Int64
    private var loadEndMs: Int64 = 0
    private var drainDeadlineMs: Int64 = 0
    /// When the drain ended (the acknowledged rate is over the load and the drain, not the
    /// read-back).
    var drainedAtMs: Int64?
    private var ramp: Ramp
    private var rng = SplitMix64(seed: UInt64(truncatingIfNeeded: Loop.hrtimeNs))
    var onDone: (Int32) -> Void = { _ in }

    // Counters.
    var connectedCount = 0
    var everConnectedCount = 0
    var registered = 0
    var setupFailures = 0
    var batchesPosted = 0
    var batchesFailed = 0
    var httpErrors: [String: Int] = [:]
    var mqttConnects = 0
    var mqttDisconnects = 0
    var brokerMoves = 0
    var connectivity = Connectivity()
    var ackedMeter = RateMeter()
    var storedMeter = RateMeter()
    var storedBaseline: Int64?
    var storedNow: Int64 = 0
    var peakAckedRate = 0.0
    var peakStoredRate = 0.0
    var readyAllAtMs: Int64?

    // Push.
    struct Send {
        var kind: String
        var startNs: UInt64
        var expected: Int
        var delivered: Set<Int> = []
        var appDuplicates = 0
        var failed = false
        var msgId: String?
        /// Wall-clock ms of the send (another process of the run times its deliveries from it).
        var sentAtMs: Int64 = 0
        /// A broadcast another process of this run sent (recognised by its `fsid` on arrival).
        var peer = false
    }
    var sends: [String: Send] = [:]
    var sendSeq = 0
    var latency: [String: LatencyHistogram] = ["device": .init(), "user": .init(), "broadcast": .init()]
    var pushRedelivered = 0
    var pushMalformed = 0
    var pushForeign = 0

    // Processes.
    var procPrev: [Int32: (ticks: Int64, ms: Int64)] = [:]
    var procLast: [(name: String, pid: Int32, cpu: Double, rssKiB: Int)] = []
    var procPeak: [String: (cpu: Double, rssKiB: Int)] = [:]
    let ticksPerSecond = Int64(sysconf(Int32(_SC_CLK_TCK)))

    var tally: StoredTally?
    var verifyError: String?

    init(loop: Loop, options: FleetOptions, enrolSecret: String, operatorToken: String?, devices k: Int, fdNote: String?) {
        self.loop = loop
        self.options = options
        self.enrolSecret = enrolSecret
        self.operatorToken = operatorToken
        self.fdNote = fdNote
        http = HTTPClient(loop: loop)
        startMs = Int64(loop.nowMs)
        ramp = Ramp(perSecond: options.rampPerSecond, startMs: startMs)
        devices = (0..<k).map {
            SimDevice(
                index: options.firstDevice + $0, runId: options.runId, devicesPerUser: options.devicesPerUser,
                brokers: options.brokers.count)
        }
    }

    var now: Int64 { Int64(loop.nowMs) }

    func start() {
        ticker = Timer(loop: loop) { [unowned self] in self.tick() }
        ticker.start(after: UInt64(Fleet.tickMs), repeat: UInt64(Fleet.tickMs))
        progressTimer = Timer(loop: loop) { [unowned self] in self.progress() }
        let p = UInt64(options.progressS * 1000)
        progressTimer.start(after: p, repeat: p)
        loadEndMs = startMs + Int64(options.durationS) * 1000
        pollStored()
        sampleProcesses()
        if options.pushEveryS > 0 {
            let t = Timer(loop: loop) { [unowned self] in
                self.sendPush(kind: "device")
                self.sendPush(kind: "user")
            }
            let ms = UInt64(options.pushEveryS * 1000)
            t.start(after: ms, repeat: ms)
            pushTimer = t
        }
        if options.broadcastEveryS > 0 {
            let t = Timer(loop: loop) { [unowned self] in self.sendPush(kind: "broadcast") }
            let ms = UInt64(options.broadcastEveryS * 1000)
            t.start(after: ms, repeat: ms)
            broadcastTimer = t
        }
    }

    /// Ctrl-C: end the load now (the drain and the summary follow).
    func interrupt() {
        if phase == .load {
            loadEndMs = now
            say("interrupted: ending the load, draining")
        } else {
            say("interrupted again: stopping without the summary")
            onDone(130)
        }
    }

    // MARK: HTTP

    func request(_ r: HTTPRequest, setup: Bool = false, _ done: @escaping (Result<HTTPResponse, HTTPClientError>) -> Void) {
        if setup { setupQueue.push((r, done)) } else { queue.push((r, done)) }
        pump()
    }

    private func pump() {
        while inflightHTTP < options.maxInflightHTTP, let next = setupQueue.pop() ?? queue.pop() {
            let (r, done) = next
            inflightHTTP += 1
            http.send(r) { [unowned self] res in
                self.inflightHTTP -= 1
                if case .failure(let e) = res { self.httpErrors["transport: " + e.description, default: 0] += 1 }
                if case .success(let resp) = res, resp.status >= 400 { self.httpErrors["HTTP \(resp.status)", default: 0] += 1 }
                done(res)
                self.pump()
            }
        }
    }

    var queuedHTTP: Int { setupQueue.count + queue.count }

    /// A device setup step: queued ahead of the batches.
    func setupPost(_ path: String, bearer: String?, json: JSON, _ done: @escaping (Int, JSON?) -> Void) {
        post(path, bearer: bearer, json: json, setup: true, done)
    }

    func post(
        _ path: String, bearer: String?, json: JSON, queued: Bool = true, setup: Bool = false, _ done: @escaping (Int, JSON?) -> Void
    ) {
        var headers = [("Content-Type", "application/json")]
        if let bearer { headers.append(("Authorization", "Bearer " + bearer)) }
        typealias Done = (Result<HTTPResponse, HTTPClientError>) -> Void
        let send: (HTTPRequest, @escaping Done) -> Void =
            queued ? { [unowned self] r, d in self.request(r, setup: setup, d) } : { [unowned self] r, d in self.http.send(r, d) }
        send(
            HTTPRequest(method: "POST", url: options.backend + path, headers: headers, body: Array(json.serialized.utf8), timeoutMs: 30_000)
        ) {
            r in
            switch r {
            case .success(let resp): done(resp.status, try? JSON.parse(resp.bodyText))
            case .failure: done(0, nil)
            }
        }
    }

    static func backoff(_ attempt: Int) -> Int64 {
        min(retryMaxMs, retryInitialMs << Int64(min(max(attempt - 1, 0), 10)))
    }

    // MARK: The ticker

    private func tick() {
        tickNo += 1
        let t = now
        if phase == .load {
            let waiting = devices.count - ramp.started
            if waiting > 0 {
                let n = ramp.take(nowMs: t, remaining: waiting)
                let first = ramp.started - n
                for i in first..<(first + n) { setup(devices[i]) }
            }
            if t >= loadEndMs { beginDrain() }
        }
        let slots = max(1, options.batchIntervalMs / Fleet.tickMs)
        for d in devices {
            if let r = d.setupRetryAtMs, r <= t {
                d.setupRetryAtMs = nil
                setup(d)
            }
            if phase == .load, var p = d.pacer {
                let n = p.due(nowMs: t)
                d.pacer = p
                let room = FleetOptions.Limits.maxPendingEventsPerDevice - d.pendingEvents
                let take = min(n, max(0, room))
                d.generated += take
                d.throttled += n - take
            }
            if d.inflight != nil, !d.inflightSent, let r = d.batchRetryAtMs, r <= t {
                d.batchRetryAtMs = nil
                sendBatch(d)
            } else if d.inflight == nil, d.token != nil, d.generated > d.batchedUpTo,
                phase != .load || Int64(d.index) % slots == tickNo % slots
                    || d.generated - d.batchedUpTo >= Int64(options.maxBatchRecords)
            {
                cutBatch(d)
            }
            if options.brokers.count > 1, d.mqtt != nil, !d.connected, let since = d.disconnectedSinceMs,
                t - since >= options.brokerFailoverMs
            {
                moveBroker(d)
            }
        }
        connectivity.update(nowMs: t, connected: connectedCount, target: everConnectedCount)
        if tickNo % (1000 / Fleet.tickMs) == 0 { writeStatus() }
        if readyAllAtMs == nil, connectedCount == devices.count { readyAllAtMs = t }
        if phase == .draining { checkDrained() }
    }

    /// The `--status-file`: progress for the fleet script, and for the run's other processes
    /// the broadcasts this one sent (`PeerStatus`).
    private func writeStatus() {
        guard let f = options.statusFile else { return }
        let own = sends.filter { !$0.value.peer && !$0.value.failed }
        let broadcasts = own.filter { $0.value.kind == "broadcast" && $0.value.msgId != nil }.sorted { $0.key < $1.key }
        let j: JSON = [
            "phase": .string(phase.rawValue), "elapsedMs": .int(now - startMs), "devices": .int(Int64(devices.count)),
            "connected": .int(Int64(connectedCount)), "everConnected": .int(Int64(everConnectedCount)),
            "sendsPending": .int(Int64(own.filter { $0.value.msgId == nil }.count)),
            "broadcasts": .array(broadcasts.map { ["fsid": .string($0.key), "sentAtMs": .int($0.value.sentAtMs)] }),
        ]
        _ = System.writeFileAtomically(f, Array(j.serialized.utf8), mode: 0o644)
    }

    // MARK: Device setup

    private func setupFailed(_ d: SimDevice, _ why: String) {
        setupFailures += 1
        d.setupAttempts += 1
        d.setupRetryAtMs = now + Fleet.backoff(d.setupAttempts)
        if d.setupAttempts == 5 { say("device \(d.index): setup still failing (\(why)); retrying") }
    }

    /// The next setup step of a device: register, push-register, bind, connect.
    func setup(_ d: SimDevice) {
        switch d.phase {
        case .waiting, .registering:
            d.phase = .registering
            // A device that holds a token renews with it; the enrolment secret registers new
            // installs only (409 for one whose earlier answer was lost: the operator token
            // approves its re-enrolment, then the next attempt succeeds).
            setupPost("/v1/devices/register", bearer: d.token ?? enrolSecret, json: ["installId": .string(d.installId)]) {
                [unowned self] st, j in
                guard st == 200, let j, let id = j["deviceId"]?.stringValue, let token = j["token"]?.stringValue else {
                    if st == 401, d.token != nil { d.token = nil }
                    if st == 409, let op = self.operatorToken {
                        self.post("/v1/admin/devices/\(d.installId)/reenrol", bearer: op, json: [:], queued: false) { _, _ in }
                    }
                    self.setupFailed(d, "register: HTTP \(st)")
                    return
                }
                d.deviceId = id
                d.token = token
                let m = j["mqtt"]
                d.mqttUsername = m?["username"]?.stringValue ?? id
                d.mqttPassword = m?["password"]?.stringValue ?? token
                d.clientId = m?["clientId"]?.stringValue ?? "pylon-push-" + d.installId
                d.deviceTopic = m?["deviceTopic"]?.stringValue ?? "pylon/push/d/" + id
                d.ackTopic = m?["ackTopic"]?.stringValue ?? "pylon/push/ack/" + id
                d.broadcastTopic = m?["broadcastTopic"]?.stringValue ?? self.options.broadcastTopic
                self.registered += 1
                d.setupAttempts = 0
                d.phase = .appRegistering
                self.setup(d)
            }
        case .appRegistering:
            // The app's MA start with the device's own token registers the AppKey on the device,
            // as the MA plugin's does: its stream takes the device's batches only after it.
            setupPost("/v1/ma/\(options.appKey)/start", bearer: d.token, json: ["deviceId": .string(d.installId)]) {
                [unowned self] st, j in
                guard st == 200, let j, j["code"]?.intValue == 0 else {
                    if st == 401 { d.phase = .registering }
                    self.setupFailed(d, "ma start: HTTP \(st)")
                    return
                }
                d.setupAttempts = 0
                if d.pacer == nil {
                    d.pacer = RatePacer(ratePerSecond: self.options.ratePerDevice, startMs: self.now)
                    d.eventsStartWallMs = System.wallClockMs()
                }
                d.phase = .pushRegistering
                self.setup(d)
            }
        case .pushRegistering:
            setupPost("/v1/push/register", bearer: d.token, json: [:]) { [unowned self] st, j in
                guard st == 200, let j, j["code"]?.intValue == 0, let pt = j["token"]?.stringValue else {
                    self.setupFailed(d, "push register: HTTP \(st)")
                    return
                }
                d.pushToken = pt
                d.pushRegisteredWallMs = System.wallClockMs()
                d.setupAttempts = 0
                d.phase = .binding
                self.setup(d)
            }
        case .binding:
            setupPost("/v1/push/bind", bearer: d.token, json: ["token": .string(d.pushToken ?? ""), "userId": .string(d.userId)]) {
                [unowned self] st, j in
                guard st == 200, let j, j["code"]?.intValue == 0 else {
                    self.setupFailed(d, "bind: HTTP \(st)")
                    return
                }
                d.bound = true
                d.setupAttempts = 0
                d.phase = .connecting
                self.setup(d)
            }
        case .connecting:
            connectMQTT(d)
            d.phase = .ready
        case .ready: break
        }
    }

    private func connectMQTT(_ d: SimDevice) {
        let b = options.brokers[d.brokerIndex % options.brokers.count]
        var o = MQTTOptions(clientId: d.clientId)
        o.host = b.host
        o.port = b.port
        o.cleanSession = false
        o.keepaliveS = options.keepaliveS
        o.username = d.mqttUsername
        o.password = d.mqttPassword
        // pylon-push's defaults but a slower first retry: a device refused because the broker
        // has not yet applied its credential must not turn K devices into a reconnect storm.
        o.backoffInitialMs = 1000
        o.backoffMaxMs = 30_000
        let c = MQTTClient(loop: loop, options: o)
        c.subscribe(d.deviceTopic, qos: 1)
        // The topic every device reads broadcasts on, at QoS 0 as pylon-push does (a device that
        // missed one gets it on its own topic after its hello).
        if !d.broadcastTopic.isEmpty { c.subscribe(d.broadcastTopic, qos: 0) }
        c.onConnect = { [unowned self, unowned d, unowned c] _ in
            guard d.mqtt === c else { return }
            if !d.connected { self.connectedCount += 1 }
            if !d.everConnected { self.everConnectedCount += 1 }
            d.connected = true
            d.everConnected = true
            d.disconnectedSinceMs = nil
            self.mqttConnects += 1
            // After the SUBSCRIBE: ask the backend for what this device has not acknowledged.
            c.publish(d.ackTopic, Array(#"{"ids":[],"hello":true}"#.utf8), qos: 1)
        }
        c.onDisconnect = { [unowned self, unowned d, unowned c] _ in
            guard d.mqtt === c else { return }
            if d.connected { self.connectedCount -= 1 }
            d.connected = false
            self.mqttDisconnects += 1
            if d.disconnectedSinceMs == nil { d.disconnectedSinceMs = self.now }
        }
        c.onMessage = { [unowned self, unowned d] _, payload in self.received(d, payload) }
        d.mqtt = c
        d.disconnectedSinceMs = now
        c.start()
    }

    /// A device whose broker is gone for `brokerFailoverMs` moves to the next one in the list.
    private func moveBroker(_ d: SimDevice) {
        d.mqtt?.stop()
        d.mqtt = nil
        if d.connected { connectedCount -= 1 }
        d.connected = false
        d.brokerIndex += 1
        brokerMoves += 1
        connectMQTT(d)
    }

    // MARK: Batches

    private func cutBatch(_ d: SimDevice) {
        let end = min(d.generated, d.batchedUpTo + Int64(options.maxBatchRecords))
        d.inflight = d.batchedUpTo..<end
        d.batchedUpTo = end
        d.batchAttempts = 0
        sendBatch(d)
    }

    /// The batch body in the uploader's format, with MA event records (docs/MA.md): the same
    /// bytes on every attempt.
    func batchBody(_ d: SimDevice, _ r: Range<Int64>, key: String) -> [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(64 + r.count * 220)
        func s(_ x: String) { out.append(contentsOf: x.utf8) }
        s(#"{"batch":""#)
        s(key)
        s(#"","stream":""#)
        s(options.stream)
        s(#"","records":["#)
        let rate = max(options.ratePerDevice, 0.001)
        for q in r {
            if q != r.lowerBound { s(",") }
            let ts = d.eventsStartWallMs + Int64(Double(q) * 1000 / rate)
            s(#"{"id":""#)
            s(StoredTally.recordId(runId: options.runId, device: d.index, seq: q))
            s(#"","ts":"#)
            s(String(ts))
            s(#","data":{"event":"fleet_tick","time":"#)
            s(String(ts))
            s(#","euid":null,"session":"s"#)
            s(String(d.index))
            s(#"","properties":{"n":"#)
            s(String(q))
            s(#"},"device":{"model":"pylon-fleet","installId":""#)
            s(d.installId)
            s(#""}}}"#)
        }
        s("]}")
        return out
    }

    private func sendBatch(_ d: SimDevice) {
        guard let r = d.inflight, let token = d.token else { return }
        let key = "\(options.runId).\(d.index).b\(r.lowerBound)-\(r.upperBound)"
        var body = batchBody(d, r, key: key)
        var headers = [("Content-Type", "application/json"), ("Idempotency-Key", key), ("Authorization", "Bearer " + token)]
        if options.gzip, let gz = try? Gzip.compress(body) {
            body = gz
            headers.append(("Content-Encoding", "gzip"))
        }
        d.inflightSent = true
        batchesPosted += 1
        let req = HTTPRequest(
            method: "POST", url: options.backend + "/v1/batches/" + options.stream, headers: headers, body: body, timeoutMs: 30_000)
        request(req) { [unowned self] res in
            d.inflightSent = false
            var status = 0
            if case .success(let resp) = res { status = resp.status }
            switch status {
            case 200...299:
                d.acked.insert(r)
                d.inflight = nil
                d.batchAttempts = 0
            case 0, 408, 425, 429, 500...599:
                self.batchesFailed += 1
                d.batchAttempts += 1
                d.batchRetryAtMs = self.now + Fleet.backoff(d.batchAttempts)
            default:
                // Refused for good (the uploader sets such a batch aside): its events are not
                // acknowledged and not expected in the stream.
                self.batchesFailed += 1
                d.rejected += Int64(r.count)
                d.inflight = nil
                if d.rejected == Int64(r.count) { self.say("device \(d.index): batch refused with HTTP \(status)") }
            }
        }
    }

    var ackedEvents: Int64 { devices.reduce(0) { $0 + $1.acked.count } }
    var generatedEvents: Int64 { devices.reduce(0) { $0 + $1.generated } }

    // MARK: Push

    private func pick(_ ok: (SimDevice) -> Bool) -> SimDevice? {
        guard !devices.isEmpty else { return nil }
        for _ in 0..<16 {
            let d = devices[Int(rng.next() % UInt64(devices.count))]
            if ok(d) { return d }
        }
        return devices.first(where: ok)
    }

    /// One admin send (`POST /v1/admin/push/send`) with a `msgKey`, so a retry after a lost
    /// answer is not a second send. The expected deliveries are counted here: the fleet's own
    /// devices the target resolves to.
    func sendPush(kind: String) {
        // Pushes start once every device connected (or a minute after the ramp ended without
        // that), so their latency is delivery, not the ramp's connect time.
        let rampDoneMs = startMs + Int64(Double(devices.count) / options.rampPerSecond * 1000)
        guard phase == .load, operatorToken != nil, readyAllAtMs != nil || now > rampDoneMs + 60_000 else { return }
        var body: JSONObject = ["appId": .string(options.appId), "title": .string("fleet " + kind)]
        var expected = 0
        switch kind {
        case "device":
            guard let d = pick({ $0.pushToken != nil && $0.connected }), let t = d.pushToken else { return }
            body["targetType"] = "device"
            body["target"] = .string(t)
            expected = 1
        case "user":
            guard let d = pick({ $0.bound && $0.connected }) else { return }
            body["targetType"] = "user"
            body["target"] = .string(d.userId)
            expected = devices.filter { $0.userId == d.userId && $0.bound }.count
        default:
            body["targetType"] = "broadcast"
            expected = devices.filter { $0.pushToken != nil }.count
            guard expected > 0 else { return }
        }
        sendSeq += 1
        // Unique across the run's processes (each has its own first device).
        let fsid = "\(options.runId)-\(options.firstDevice)-\(sendSeq)"
        body["msgKey"] = .string(fsid)
        // The kind and the send's wall-clock time let another process of this run count a
        // broadcast reaching its devices, and time it.
        let at = System.wallClockMs()
        body["extendedParams"] = ["fsid": .string(fsid), "kind": .string(kind), "sentAtMs": .string(String(at))]
        sends[fsid] = Send(kind: kind, startNs: Loop.hrtimeNs, expected: expected, sentAtMs: at)
        postSend(fsid, .object(body), attempt: 1)
    }

    /// Sent at once, not behind the devices' queue: the operator is another client.
    private func postSend(_ fsid: String, _ body: JSON, attempt: Int) {
        post("/v1/admin/push/send", bearer: operatorToken, json: body, queued: false) { [unowned self] st, j in
            if st == 200 {
                if let m = j?["msgId"]?.stringValue { self.sends[fsid]?.msgId = m }
                return
            }
            if attempt < 6, st == 0 || st == 503 || st >= 500 {
                self.loop.after(ms: UInt64(Fleet.backoff(attempt))) { self.postSend(fsid, body, attempt: attempt + 1) }
                return
            }
            self.sends[fsid]?.failed = true
            self.say("push send \(fsid) failed: HTTP \(st)")
        }
    }

    /// A message on a device topic: dropped if its id was delivered already (as pylon-push
    /// does), otherwise handed to the simulated app, which acknowledges at once.
    private func received(_ d: SimDevice, _ payload: UnsafeRawBufferPointer) {
        guard let j = try? JSONRef.parse(payload, maxDepth: 8).json, let id = j["id"]?.stringValue else {
            pushMalformed += 1
            return
        }
        if d.markSeen(id) {
            if let fsid = j["extras"]?["fsid"]?.stringValue, sends[fsid] == nil, let x = j["extras"] { peerBroadcast(fsid, x) }
            if let fsid = j["extras"]?["fsid"]?.stringValue, var s = sends[fsid] {
                if s.delivered.insert(d.index).inserted {
                    latency[s.kind, default: .init()].record(micros: (Loop.hrtimeNs - s.startNs) / 1000)
                } else {
                    s.appDuplicates += 1
                }
                sends[fsid] = s
            } else {
                pushForeign += 1
            }
        } else {
            pushRedelivered += 1
        }
        d.mqtt?.publish(d.ackTopic, Array(("{\"ids\":[" + JSON.string(id).serialized + "]}").utf8), qos: 1)
    }

    /// The first delivery of a broadcast another process of this run sent: a send of this
    /// process from now on, expected on each of its devices that had registered for push
    /// before it was sent, timed from the sender's wall clock (one machine, one clock).
    private func peerBroadcast(_ fsid: String, _ extras: JSON) {
        guard fsid.hasPrefix(options.runId + "-"), extras["kind"]?.stringValue == "broadcast",
            let at = extras["sentAtMs"]?.stringValue.flatMap({ Int64($0) })
        else { return }
        addPeerBroadcast(fsid, sentAtMs: at)
    }

    private func addPeerBroadcast(_ fsid: String, sentAtMs at: Int64) {
        let ageMs = max(0, System.wallClockMs() - at)
        let now = Loop.hrtimeNs
        let start = now - min(now, UInt64(ageMs) * 1_000_000)
        let expected = devices.filter { $0.pushToken != nil && ($0.pushRegisteredWallMs ?? .max) <= at }.count
        sends[fsid] = Send(kind: "broadcast", startNs: start, expected: expected, sentAtMs: at, peer: true)
    }

    /// The run's other processes (`--peer-status-file`): whether all of them ended their load
    /// with every send answered, and the broadcasts they sent. A file that cannot be read or
    /// parsed is a peer not yet final.
    private func peers() -> (final: Bool, broadcasts: [PeerStatus.Broadcast]) {
        var final = true
        var out: [PeerStatus.Broadcast] = []
        for f in options.peerStatusFiles {
            guard let b = System.readFile(f, limit: PeerStatus.maxFileBytes), let p = PeerStatus.parse(b) else {
                final = false
                continue
            }
            final = final && p.final
            out += p.broadcasts
        }
        return (final, out)
    }

    var pushExpected: Int { sends.values.filter { !$0.failed }.reduce(0) { $0 + $1.expected } }
    var pushDelivered: Int { sends.values.filter { !$0.failed }.reduce(0) { $0 + min($1.expected, $1.delivered.count) } }
    var pushAppDuplicates: Int { sends.values.reduce(0) { $0 + $1.appDuplicates } }

    // MARK: Drain, verify, finish

    private func beginDrain() {
        phase = .draining
        drainDeadlineMs = now + Int64(options.drainTimeoutS) * 1000
        pushTimer?.close()
        broadcastTimer?.close()
        say("load ended after \((now - startMs) / 1000) s: draining (up to \(options.drainTimeoutS) s)")
    }

    private func checkDrained() {
        let eventsDone = devices.allSatisfy { $0.inflight == nil && $0.generated == $0.batchedUpTo }
        var pushDone = pushDelivered >= pushExpected
        if !options.peerStatusFiles.isEmpty {
            // Every broadcast of the other processes is expected here too: wait until their
            // lists are final and each has reached this process (or the deadline: then the
            // ones none of its devices received are added, undelivered).
            let (final, list) = peers()
            let missing = list.filter { sends[$0.fsid] == nil }
            if now >= drainDeadlineMs { for b in missing { addPeerBroadcast(b.fsid, sentAtMs: b.sentAtMs) } }
            pushDone = pushDone && final && missing.isEmpty
        }
        guard (eventsDone && pushDone) || now >= drainDeadlineMs else { return }
        if !(eventsDone && pushDone) { say("drain timed out: some batches or push deliveries are outstanding") }
        drainedAtMs = now
        phase = .verifying
        if !options.verify {
            finish()
        } else if let cmd = options.verifyExec {
            verifyFromProgram(cmd)
        } else {
            verify(after: 0)
        }
    }

    /// Reads the stream back through the inspection API, page by page (a failed page is asked
    /// again, up to `verifyAttempts` times).
    static let verifyAttempts = 5

    private func verify(after: Int64, attempt: Int = 1) {
        if tally == nil, after == 0 { tally = StoredTally(devices: devices.count, first: options.firstDevice) }
        guard let op = operatorToken else {
            verifyError = "no operator token: the stream was not read back"
            finish()
            return
        }
        let url = options.backend + "/v1/inspect/streams/\(options.stream)/records?limit=1000&after=\(after)"
        request(HTTPRequest(url: url, headers: [("Authorization", "Bearer " + op)], timeoutMs: 60_000, maxResponseBytes: 16 << 20)) {
            [unowned self] r in
            guard case .success(let resp) = r, resp.status == 200, let j = try? JSON.parse(resp.bodyText),
                let recs = j["records"]?.arrayValue
            else {
                if attempt < Fleet.verifyAttempts {
                    self.loop.after(ms: UInt64(Fleet.backoff(attempt + 2))) { self.verify(after: after, attempt: attempt + 1) }
                    return
                }
                var why = "no answer"
                if case .success(let resp) = r { why = "HTTP \(resp.status)" }
                if case .failure(let e) = r { why = e.description }
                self.verifyError = "reading the stream back failed after \(after): \(why)"
                self.tally = nil
                self.finish()
                return
            }
            for rec in recs { if let id = rec["id"]?.stringValue { self.tally!.add(id: Substring(id), runId: self.options.runId) } }
            if let next = j["next"]?.intValue, !recs.isEmpty { self.verify(after: next) } else { self.finish() }
        }
    }

    /// The largest line read from a `--verify-exec` program (one stream message).
    static let maxVerifyLineBytes = 64 << 20
    private var verifier: ChildProcess?
    private var verifierOut: Connection?

    /// Reads the stream back from a program's stdout: one JSON object a line, a record (`id`)
    /// or a stream message whose `batch` holds the records as posted.
    private func verifyFromProgram(_ cmd: [String]) {
        tally = StoredTally(devices: devices.count, first: options.firstDevice)
        var o = ChildProcess.Options(exec: cmd[0])
        o.args = Array(cmd.dropFirst())
        o.env = System.environment()
        let out = Connection(loop: loop, maxLineBytes: Fleet.maxVerifyLineBytes)
        o.stdout = out
        out.onLine = { [unowned self] line in
            guard let ref = try? JSONRef.parse(line, maxDepth: 64) else { return }
            let j = ref.json
            let recs = j["batch"]?["records"]?.arrayValue ?? j["records"]?.arrayValue ?? (j["id"] != nil ? [j] : [])
            for r in recs { if let id = r["id"]?.stringValue { self.tally!.add(id: Substring(id), runId: self.options.runId) } }
        }
        out.onOversized = { [unowned self] n, _ in self.verifyError = "a line of \(n) bytes from the verify program was skipped" }
        do throws(UVError) {
            verifier = try ChildProcess(loop: loop, options: o) { [unowned self] status, sig in
                if status != 0 || sig != 0 {
                    self.verifyError = "the verify program exited with status \(status) signal \(sig)"
                    self.tally = nil
                }
                // Its last lines may still be in the pipe: finish on the next turns.
                self.loop.after(ms: 200) { self.finish() }
            }
            verifierOut = out
            out.startReading()
        } catch {
            verifyError = "cannot run \(cmd[0]): \(error)"
            tally = nil
            out.close()
            finish()
        }
    }

    private func finish() {
        guard phase != .done else { return }
        phase = .done
        writeStatus()
        ticker.close()
        progressTimer.close()
        sampleProcesses()
        // The summary first: it counts the devices connected at the end.
        let s = summary()
        for d in devices {
            d.mqtt?.stop()
            d.mqtt = nil
        }
        if options.json { print(s.json.prettySerialized) } else { print(s.text) }
        onDone(s.exitCode)
    }

    // MARK: Progress

    func say(_ line: String) {
        let who = options.processName == "pylon-fleet" ? "" : options.processName + " "
        Log.writeRaw("[" + Format.pad(Format.fixed(Double(now - startMs) / 1000, 1), 6) + "s] " + who + line + "\n")
    }

    private func pollStored() {
        guard let op = operatorToken else { return }
        let url = options.backend + "/v1/inspect/streams/\(options.stream)"
        http.send(HTTPRequest(url: url, headers: [("Authorization", "Bearer " + op)], timeoutMs: 10_000)) { [unowned self] r in
            guard case .success(let resp) = r, resp.status == 200, let j = try? JSON.parse(resp.bodyText),
                let n = j["records"]?.intValue
            else { return }
            if self.storedBaseline == nil { self.storedBaseline = n }
            self.storedNow = n - (self.storedBaseline ?? 0)
        }
    }

    /// CPU and RSS of this process and every watched one, each with its children (a pylond's
    /// plugins, PostgreSQL's backends): summed, so shared memory counts once per process.
    func sampleProcesses() {
        let t = now
        var list: [(String, Int32)] = [(options.processName, getpid())]
        if let f = options.watchFile, let b = System.readFile(f, limit: 1 << 20) {
            list += ProcStat.parseWatchList(String(decoding: b, as: UTF8.self)).map { ($0.name, $0.pid) }
        }
        func read(_ pid: Int32) -> (ticks: Int64, ppid: Int32, rss: Int)? {
            guard let sb = System.readFile("/proc/\(pid)/stat", limit: 1 << 16) else { return nil }
            let stat = String(decoding: sb, as: UTF8.self)
            guard let ticks = ProcStat.cpuTicks(stat: stat), let ppid = ProcStat.parentPid(stat: stat) else { return nil }
            let rss =
                System.readFile("/proc/\(pid)/status", limit: 1 << 16).flatMap {
                    ProcStat.rssKiB(status: String(decoding: $0, as: UTF8.self))
                } ?? 0
            return (ticks, ppid, rss)
        }
        // Every process's parent, once per sample.
        var children: [Int32: [Int32]] = [:]
        var info: [Int32: (ticks: Int64, ppid: Int32, rss: Int)] = [:]
        var dirs: [Int32] = []
        if let d = opendir("/proc") {
            while let e = readdir(d) {
                let name = withUnsafeBytes(of: e.pointee.d_name) { b in String(decoding: b.prefix { $0 != 0 }, as: UTF8.self) }
                if let pid = Int32(name) { dirs.append(pid) }
            }
            closedir(d)
        }
        let watched = Set(list.map(\.1))
        for pid in dirs {
            guard let i = read(pid) else { continue }
            if watched.contains(i.ppid) || watched.contains(pid) {
                info[pid] = i
                children[i.ppid, default: []].append(pid)
            }
        }
        var out: [(String, Int32, Double, Int)] = []
        for (name, pid) in list {
            guard let own = info[pid] else { continue }
            var ticks = own.ticks
            var rss = own.rss
            for c in children[pid] ?? [] where !watched.contains(c) {
                ticks += info[c]?.ticks ?? 0
                rss += info[c]?.rss ?? 0
            }
            var cpu = 0.0
            if let p = procPrev[pid], ticks >= p.ticks {
                cpu = ProcStat.cpuShare(ticks: ticks, previous: p.ticks, intervalMs: t - p.ms, ticksPerSecond: ticksPerSecond)
            }
            procPrev[pid] = (ticks, t)
            out.append((name, pid, cpu, rss))
            let peak = procPeak[name] ?? (0, 0)
            procPeak[name] = (max(peak.cpu, cpu), max(peak.rssKiB, rss))
        }
        procLast = out.map { (name: $0.0, pid: $0.1, cpu: $0.2, rssKiB: $0.3) }
    }

    private func progress() {
        let t = now
        let acked = ackedEvents
        ackedMeter.sample(acked, nowMs: t)
        storedMeter.sample(storedNow, nowMs: t)
        if phase == .load, t - startMs > 2 * Int64(options.progressS * 1000) {
            peakAckedRate = max(peakAckedRate, ackedMeter.rate)
            peakStoredRate = max(peakStoredRate, storedMeter.rate)
        }
        pollStored()
        sampleProcesses()
        func ms(_ h: LatencyHistogram?, _ p: Double) -> String {
            guard let v = h?.percentile(p) else { return "-" }
            return Format.ms(v / 1000)
        }
        var line = "\(phase.rawValue): devices \(connectedCount)/\(devices.count) connected (\(registered) registered)"
        line += " | events acked \(Format.fixed(ackedMeter.rate, 0))/s stored \(Format.fixed(storedMeter.rate, 0))/s"
        line += " (acked \(acked), stored \(storedNow), pending \(generatedEvents - acked), http queue \(queuedHTTP))"
        line += " | push \(pushDelivered)/\(pushExpected)"
        for k in ["device", "user", "broadcast"] { line += " \(k) p50 \(ms(latency[k], 50)) p99 \(ms(latency[k], 99))" }
        line += " |"
        for p in procLast { line += " \(p.name) \(Format.fixed(p.cpu * 100, 0))% \(p.rssKiB / 1024)MB" }
        say(line)
    }
}
