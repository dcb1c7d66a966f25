import CLibUV
import CNATS
import CNATSLoop
import PylonCore

#if canImport(Glibc)
import Glibc
#endif

/// How the backend reaches NATS (`--nats` and friends).
package struct NATSSettings: Equatable {
    /// `nats://host:port` URLs; libnats reconnects through all of them (and the cluster's
    /// advertised ones) in turn.
    package var urls: [String] = []
    package var user: String?
    package var password: String?
    /// A `.creds` file (user JWT and NKey seed), for decentralised auth.
    package var credsFile: String?
    package var stream = JetStreamWire.StreamSettings()
    package var ackTimeoutMs = Limits.defaultNATSAckTimeoutMs
    package var maxPending = Limits.defaultNATSMaxPending

    package init() {}
}

/// Publishes batches to the ingest stream and hands each acknowledgement back on the loop
/// thread. The one-loop rule with libnats:
///
/// - The socket is driven by the backend's libuv loop (libnats's libuv adapter): reads,
///   writes and the parsing of what arrives run on the loop thread. `SendAsap` removes
///   libnats's flusher thread: a publish is queued on the socket's write poll at once.
/// - No asynchronous subscription (whose callbacks libnats runs on its own threads): acks and
///   API replies come to one *synchronous* subscription on `_INBOX.<id>.*`, which a
///   `uv_check_t` drains with `natsSubscription_NextMsg(timeout 0)` after every poll phase —
///   i.e. right after the read event that delivered them, on the loop thread. Each publish
///   names a reply subject `_INBOX.<id>.<token>` (`PendingPublishes`).
/// - Nothing blocks: no `Request`, `Flush` or `js_*` call. The stream is created with a plain
///   publish to `$JS.API.STREAM.CREATE.<name>` answered on the same inbox; until it answered
///   (and after a reply saying the stream is gone) `isReady` is false and ingest answers 503.
/// - Connection state is read with `natsConnection_Status` on the loop (no status callbacks).
///   libnats's own threads (its timer thread; the reconnect thread, which reaches the loop
///   through the adapter's `uv_async_t`) touch no Pylon state.
package final class JetStreamPublisher: UVHandleOwner {
    /// What became of one publish (given to its callback on the loop thread).
    enum Outcome {
        /// JetStream stored it as `seq` (`duplicate`: a message with this id was already
        /// stored within the duplicate window). `late`: after `.timedOut` was given.
        case acked(seq: Int64, duplicate: Bool, late: Bool)
        /// JetStream refused it (an API error) or answered something unreadable.
        case failed(String)
        /// JetStream refused it as larger than the stream's `max_msg_size`.
        case tooLarge(String)
        /// No ack within `ackTimeoutMs`; an ack may still follow (`acked(late: true)`).
        case timedOut
    }

    enum Admission {
        case published
        /// Not connected, or the stream is not (yet) ready.
        case unavailable(String)
        /// `maxPending` publishes are waiting for their acks.
        case busy
        /// Body and headers exceed the server's `max_payload` (libnats checks before sending).
        case tooLarge(String)
    }

    private let loop: Loop
    let settings: NATSSettings
    private var nc: OpaquePointer?
    private var sub: OpaquePointer?
    /// Replies to stream setup requests (`<inbox>.api.*`): apart from publish acks, so a
    /// "no responders" status (JetStream not up yet), which libnats reports without its
    /// subject, is known to be about setup.
    private var apiSub: OpaquePointer?
    private let inboxPrefix: String
    private let check = UVHandle<uv_check_t>()
    private var timer: Timer?
    private var retryTimer: Timer?
    private var pending: PendingPublishes<(Outcome) -> Void>
    private let log = Log("jetstream")

    /// Stream setup: not started, a create/info request in flight (its token and deadline),
    /// or ready.
    private enum Setup {
        case idle
        case creating(token: UInt64, deadline: UInt64)
        case checking(token: UInt64, deadline: UInt64)
        case ready
    }
    private var setup = Setup.idle
    /// API requests besides stream setup (message deletes), by token: the callback and deadline.
    private var apiCalls: [UInt64: (done: (Bool) -> Void, deadline: UInt64)] = [:]
    /// The stream's `max_age` as this instance last set or confirmed it (`--nats-max-age-s`
    /// until `updateMaxAge` succeeds).
    private(set) var maxAgeS: Int
    private var apiToken: UInt64 = 1 << 62
    private var connected = false
    private var stopped = false

    /// Counters for `/v1/inspect/stats` (`nats`).
    package private(set) var counters = Counters()
    package struct Counters {
        package var published = 0
        package var acked = 0
        package var duplicates = 0
        package var failed = 0
        package var timedOut = 0
        package var lateAcks = 0
        package var unavailable = 0
        package var busy = 0
        package var reconnects = 0
    }

    package struct StartError: Error, CustomStringConvertible { package let description: String }

    /// Creates the connection (it keeps trying in the background when no server answers now:
    /// `RetryOnFailedConnect`) and the reply subscription. Must run on the loop's thread
    /// before `uv_run` (the adapter records that thread).
    /// Start: a connection libnats closes while the inbox subscriptions are made (seen now and
    /// then right after the first connect) is made anew this many times, before the loop runs.
    package static let startAttempts = 3
    package static let startRetryMs: UInt32 = 100

    package init(loop: Loop, settings: NATSSettings) throws(StartError) {
        self.loop = loop
        self.settings = settings
        maxAgeS = settings.stream.maxAgeS
        pending = PendingPublishes(
            maxInFlight: settings.maxPending, ackTimeoutMs: settings.ackTimeoutMs, lateAckMs: Limits.natsLateAckMs)
        inboxPrefix = "_INBOX.pylon-" + System.randomHex(8)
        pylon_nats_loop_init(loop.uv)
        var opts: OpaquePointer?
        try NATS.check(natsOptions_Create(&opts), "natsOptions_Create")
        defer { natsOptions_Destroy(opts) }
        var cURLs = settings.urls.map { strdup($0) }
        defer { for p in cURLs { free(p) } }
        let rc: natsStatus = cURLs.withUnsafeMutableBufferPointer { b in
            b.baseAddress!.withMemoryRebound(to: UnsafePointer<CChar>?.self, capacity: b.count) {
                natsOptions_SetServers(opts, $0, Int32(b.count))
            }
        }
        try NATS.check(rc, "natsOptions_SetServers")
        try NATS.check(pylon_nats_loop_attach(opts, loop.uv), "natsOptions_SetEventLoop")
        try NATS.check(natsOptions_SetSendAsap(opts, true), "natsOptions_SetSendAsap")
        try NATS.check(natsOptions_SetName(opts, "pylon-backend"), "natsOptions_SetName")
        try NATS.check(natsOptions_SetMaxReconnect(opts, -1), "natsOptions_SetMaxReconnect")
        try NATS.check(natsOptions_SetReconnectWait(opts, Int64(Limits.natsReconnectWaitMs)), "natsOptions_SetReconnectWait")
        try NATS.check(natsOptions_SetTimeout(opts, Int64(Limits.natsConnectTimeoutMs)), "natsOptions_SetTimeout")
        try NATS.check(natsOptions_SetPingInterval(opts, Int64(Limits.natsPingIntervalMs)), "natsOptions_SetPingInterval")
        try NATS.check(natsOptions_SetMaxPingsOut(opts, 2), "natsOptions_SetMaxPingsOut")
        try NATS.check(
            natsOptions_SetRetryOnFailedConnect(opts, true, pylon_nats_ignore_connected, nil), "natsOptions_SetRetryOnFailedConnect")
        if let u = settings.user { try NATS.check(natsOptions_SetUserInfo(opts, u, settings.password), "natsOptions_SetUserInfo") }
        if let c = settings.credsFile {
            try NATS.check(natsOptions_SetUserCredentialsFromFiles(opts, c, nil), "natsOptions_SetUserCredentialsFromFiles")
        }
        let s = natsConnection_Connect(&nc, opts)
        guard s == NATS_OK || s == NATS_NOT_YET_CONNECTED else { throw StartError(description: NATS.describe(s, "connect")) }
        var sp: OpaquePointer?
        let ss = natsConnection_SubscribeSync(&sp, nc, inboxPrefix + ".*")
        guard ss == NATS_OK else {
            natsConnection_Destroy(nc)
            nc = nil
            throw StartError(description: NATS.describe(ss, "subscribe"))
        }
        sub = sp
        var ap: OpaquePointer?
        let asr = natsConnection_SubscribeSync(&ap, nc, inboxPrefix + ".api.*")
        guard asr == NATS_OK else {
            natsSubscription_Destroy(sub)
            natsConnection_Destroy(nc)
            nc = nil
            throw StartError(description: NATS.describe(asr, "subscribe"))
        }
        apiSub = ap
        // Replies for a publisher that cannot keep up pile up here rather than being dropped.
        _ = natsSubscription_SetPendingLimits(sub, -1, Int32(Limits.natsMaxReplyBytes))
        uv_check_init(loop.uv, check.pointer)
        check.retain(self)
        uv_check_start(check.pointer) { h in
            Unmanaged<JetStreamPublisher>.fromOpaque(h!.pointee.data).takeUnretainedValue().drain()
        }
        uv_unref(check.base)
        timer = Timer(loop: loop, unref: true) { [unowned self] in self.timerFired() }
        retryTimer = Timer(loop: loop, unref: true) { [unowned self] in self.startSetup() }
        drain()
    }

    /// Connected and the stream exists: ingest may publish.
    package var isReady: Bool {
        if case .ready = setup { return connected }
        return false
    }

    package var inFlight: Int { pending.inFlight }

    /// Publishes `body` on `subject` with `Nats-Msg-Id: msgID` and `headers`; `done` gets the
    /// outcome later (never from inside this call). Refuses at once when not ready or full.
    func publish(
        subject: String, msgID: String, headers: [(String, String)], body: [UInt8], done: @escaping (Outcome) -> Void
    ) -> Admission {
        refreshStatus()
        guard isReady, let nc else {
            counters.unavailable += 1
            return .unavailable(connected ? "the ingest stream \(settings.stream.name) is not ready" : "not connected to NATS")
        }
        guard let token = pending.add(done, now: loop.nowMs) else {
            counters.busy += 1
            return .busy
        }
        let s = send(nc, subject: subject, reply: "\(inboxPrefix).\(token)", body: body, headers: [("Nats-Msg-Id", msgID)] + headers)
        guard s == NATS_OK else {
            _ = pending.resolve(token)
            if s == NATS_MAX_PAYLOAD {
                return .tooLarge("the batch and its headers exceed the NATS server's max_payload")
            }
            counters.unavailable += 1
            return .unavailable(NATS.describe(s, "publish"))
        }
        counters.published += 1
        armTimer()
        return .published
    }

    private func send(_ nc: OpaquePointer, subject: String, reply: String, body: [UInt8], headers: [(String, String)]) -> natsStatus {
        var msg: OpaquePointer?
        var s = body.withUnsafeBytes { b in
            natsMsg_Create(&msg, subject, reply, b.baseAddress?.assumingMemoryBound(to: CChar.self), Int32(b.count))
        }
        guard s == NATS_OK else { return s }
        defer { natsMsg_Destroy(msg) }
        for (k, v) in headers where s == NATS_OK { s = natsMsgHeader_Set(msg, k, v) }
        guard s == NATS_OK else { return s }
        return natsConnection_PublishMsg(nc, msg)
    }

    // MARK: Loop side

    /// Runs after every poll phase: notes connection changes, then hands every reply that
    /// arrived to its publish (or to stream setup).
    private func drain() {
        guard !stopped, let sub, let apiSub else { return }
        refreshStatus()
        drain(apiSub) { [unowned self] in
            if setupDeadline != nil {
                setup = .idle
                retryLater("JetStream is not available yet (no responders)")
            }
        }
        drain(sub) {}  // unattributable: its publish times out
    }

    /// Hands each queued reply of `sub` to `reply(token:_:)`; `noResponders` for a "no
    /// responders" status.
    private func drain(_ sub: OpaquePointer, noResponders: () -> Void) {
        while !stopped {
            var m: OpaquePointer?
            let s = natsSubscription_NextMsg(&m, sub, 0)
            if s == NATS_TIMEOUT { break }  // nothing more queued
            if s == NATS_NO_RESPONDERS {
                noResponders()
                continue
            }
            if s == NATS_SLOW_CONSUMER { continue }
            guard s == NATS_OK, let m else { break }
            let subject = String(cString: natsMsg_GetSubject(m))
            let len = Int(natsMsg_GetDataLength(m))
            let body: [UInt8] =
                len > 0 ? Array(UnsafeRawBufferPointer(start: natsMsg_GetData(m), count: len)) : []
            natsMsg_Destroy(m)
            guard let dot = subject.lastIndex(of: "."), let token = UInt64(subject[subject.index(after: dot)...]) else { continue }
            reply(token: token, JetStreamWire.parseReply(body))
        }
    }

    private func refreshStatus() {
        guard let nc else { return }
        let now = natsConnection_Status(nc) == NATS_CONN_STATUS_CONNECTED
        guard now != connected else { return }
        connected = now
        if now {
            log.info("connected to NATS", ["stream": settings.stream.name])
            counters.reconnects += 1
            if case .ready = setup {} else { startSetup() }
        } else {
            // Acks for what is in flight would have come on the lost connection: answer now.
            let lost = pending.expireAll(now: loop.nowMs)
            log.warn("NATS connection lost: ingest answers 503 until it is back", ["inFlight": lost.count])
            for done in lost {
                counters.timedOut += 1
                done(.timedOut)
            }
            armTimer()
        }
    }

    private func reply(token: UInt64, _ r: JetStreamWire.Reply) {
        if token >= 1 << 62, let call = apiCalls.removeValue(forKey: token) {
            switch r {
            case .success, .streamInfo: call.done(true)
            case .error(_, let errCode, _): call.done(errCode == JetStreamWire.ErrorCode.noMessageFound)
            case .ack, .invalid: call.done(false)
            }
            return
        }
        if token >= 1 << 62 {
            setupReply(token: token, r)
            return
        }
        guard let (done, late) = pending.resolve(token) else { return }
        switch r {
        case .ack(_, let seq, let duplicate):
            counters.acked += 1
            if duplicate { counters.duplicates += 1 }
            if late { counters.lateAcks += 1 }
            done(.acked(seq: seq, duplicate: duplicate, late: late))
        case .error(_, let errCode, let d):
            counters.failed += 1
            if errCode == JetStreamWire.ErrorCode.streamNotFound {
                log.warn("the ingest stream is gone: creating it again", ["stream": settings.stream.name])
                setup = .idle
                startSetup()
            }
            if !late {
                done(
                    errCode == JetStreamWire.ErrorCode.messageTooLarge
                        ? .tooLarge("JetStream refused the batch: \(d)") : .failed("JetStream refused the batch: \(d) (\(errCode))"))
            }
        case .streamInfo, .invalid, .success:
            counters.failed += 1
            if !late { done(.failed("unexpected JetStream reply")) }
        }
        armTimer()
    }

    // MARK: Stream setup

    private func nextAPIToken() -> UInt64 {
        apiToken += 1
        return apiToken
    }

    /// Sends the stream's create request (when connected and not already under way).
    private func startSetup() {
        guard !stopped, connected, let nc else { return }
        switch setup {
        case .idle: break
        case .creating, .checking, .ready: return
        }
        let token = nextAPIToken()
        let body = Array(JetStreamWire.createRequest(settings.stream).serialized.utf8)
        let s = send(
            nc, subject: JetStreamWire.createSubject(settings.stream.name), reply: "\(inboxPrefix).api.\(token)", body: body, headers: [])
        guard s == NATS_OK else {
            retryLater(NATS.describe(s, "stream create"))
            return
        }
        setup = .creating(token: token, deadline: loop.nowMs + Limits.natsAPITimeoutMs)
        armTimer()
    }

    private func setupReply(token: UInt64, _ r: JetStreamWire.Reply) {
        switch setup {
        case .creating(let t, _) where t == token:
            switch r {
            case .streamInfo(let replicas, _):
                setup = .ready
                log.info("ingest stream ready", ["stream": settings.stream.name, "replicas": replicas])
            case .error(_, let errCode, _) where errCode == JetStreamWire.ErrorCode.streamNameInUse:
                // It exists with another configuration (set by an operator, or an older
                // backend): use it as it is.
                guard let nc else { return }
                let t2 = nextAPIToken()
                let s = send(
                    nc, subject: JetStreamWire.infoSubject(settings.stream.name), reply: "\(inboxPrefix).api.\(t2)", body: [], headers: [])
                if s == NATS_OK {
                    setup = .checking(token: t2, deadline: loop.nowMs + Limits.natsAPITimeoutMs)
                } else {
                    setup = .idle
                    retryLater(NATS.describe(s, "stream info"))
                }
            case .error(_, let errCode, let d):
                setup = .idle
                retryLater("stream create refused: \(d) (\(errCode))")
            case .ack, .invalid, .success:
                setup = .idle
                retryLater("unexpected reply to stream create")
            }
        case .checking(let t, _) where t == token:
            if case .streamInfo(let replicas, let subjects) = r {
                setup = .ready
                log.warn(
                    "ingest stream exists with another configuration: using it",
                    ["stream": settings.stream.name, "replicas": replicas, "subjects": subjects.joined(separator: ",")])
            } else {
                setup = .idle
                retryLater("stream info failed")
            }
        default: break  // a reply to an abandoned request
        }
        armTimer()
    }

    private func retryLater(_ why: String) {
        log.warn("ingest stream not ready; retrying", ["stream": settings.stream.name, "reason": why, "retryMs": Limits.natsSetupRetryMs])
        retryTimer?.start(after: Limits.natsSetupRetryMs)
    }

    // MARK: Deadlines

    private var setupDeadline: UInt64? {
        switch setup {
        case .creating(_, let d), .checking(_, let d): d
        case .idle, .ready: nil
        }
    }

    private func armTimer() {
        let wake = ([pending.nextWake, setupDeadline] + apiCalls.values.map { Optional($0.deadline) }).compactMap { $0 }.min()
        guard let wake else {
            timer?.stop()
            return
        }
        let now = loop.nowMs
        timer?.start(after: wake > now ? wake - now : 0)
    }

    private func timerFired() {
        let now = loop.nowMs
        for done in pending.expire(now: now) {
            counters.timedOut += 1
            done(.timedOut)
        }
        if let d = setupDeadline, d <= now {
            setup = .idle
            retryLater("no reply from JetStream within \(Limits.natsAPITimeoutMs) ms")
        }
        for (token, call) in apiCalls where call.deadline <= now {
            apiCalls[token] = nil
            call.done(false)
        }
        armTimer()
    }

    /// Deletes message `seq` from the stream, overwriting it (`$JS.API.STREAM.MSG.DELETE.<name>`,
    /// an erasure's stream part). `done(true)` once it is gone (deleted now, or not there);
    /// `done(false)` on an error or no answer within `Limits.natsAPITimeoutMs`. Answers false,
    /// without calling `done`, when not connected.
    func deleteMessage(seq: Int64, done: @escaping (Bool) -> Void) -> Bool {
        refreshStatus()
        guard connected, !stopped, let nc else { return false }
        let token = nextAPIToken()
        let body = Array(JSON.object(["seq": .int(seq), "no_erase": .bool(false)]).serialized.utf8)
        let s = send(
            nc, subject: "$JS.API.STREAM.MSG.DELETE." + settings.stream.name, reply: "\(inboxPrefix).api.\(token)", body: body,
            headers: [])
        guard s == NATS_OK else { return false }
        apiCalls[token] = (done, loop.nowMs + Limits.natsAPITimeoutMs)
        armTimer()
        return true
    }

    /// Sets the stream's `max_age` (`$JS.API.STREAM.UPDATE.<name>` with the stream's settings
    /// and that age: the rule of `PUT /v1/admin/retention`). `done(true)` once JetStream
    /// confirmed (`maxAgeS` is then `seconds`). False, without calling `done`, when not ready.
    func updateMaxAge(seconds: Int, done: @escaping (Bool) -> Void) -> Bool {
        refreshStatus()
        guard isReady, !stopped, let nc else { return false }
        var stream = settings.stream
        stream.maxAgeS = seconds
        let token = nextAPIToken()
        let body = Array(JetStreamWire.createRequest(stream).serialized.utf8)
        let s = send(nc, subject: "$JS.API.STREAM.UPDATE." + stream.name, reply: "\(inboxPrefix).api.\(token)", body: body, headers: [])
        guard s == NATS_OK else { return false }
        apiCalls[token] = (
            { [weak self] ok in
                if ok { self?.maxAgeS = seconds }
                done(ok)
            }, loop.nowMs + Limits.natsAPITimeoutMs
        )
        armTimer()
        return true
    }

    /// Closes the connection and the handles (at shutdown, on the loop thread).
    package func stop() {
        guard !stopped else { return }
        stopped = true
        timer?.close()
        retryTimer?.close()
        check.close()
        if let sub { natsSubscription_Destroy(sub) }
        if let apiSub { natsSubscription_Destroy(apiSub) }
        sub = nil
        apiSub = nil
        if let nc {
            natsConnection_Close(nc)
            natsConnection_Destroy(nc)
        }
        nc = nil
    }
}

/// libnats status helpers.
enum NATS {
    static func describe(_ s: natsStatus, _ what: String) -> String {
        "\(what): \(String(cString: natsStatus_GetText(s)))"
    }

    static func check(_ s: natsStatus, _ what: String) throws(JetStreamPublisher.StartError) {
        guard s == NATS_OK else { throw JetStreamPublisher.StartError(description: describe(s, what)) }
    }
}

extension Limits {
    /// Default `--nats-stream`: the JetStream stream batches are published to.
    static let defaultNATSStream = "PYLON_INGEST"
    /// Default `--nats-subject-prefix`: a batch of Pylon stream S goes to `pylon.ingest.S`.
    static let defaultNATSSubjectPrefix = "pylon.ingest"
    /// The stream's duplicate window (`--nats-duplicate-window-ms`; JetStream's own default).
    static let defaultNATSDuplicateWindowMs = 120_000
    /// The stream's `max_age` (`--nats-max-age-s`): 7 days.
    static let defaultNATSMaxAgeS = 7 * 24 * 3600
    /// Default `--nats-ack-timeout-ms`: a batch not acknowledged by JetStream this long after
    /// its publish is answered 503 `stream_unavailable`, Retry-After: 1.
    static let defaultNATSAckTimeoutMs: UInt64 = 5_000
    /// Default `--nats-max-pending`: publishes waiting for their acks; beyond it ingest answers
    /// 503 `server_busy`, Retry-After: 1.
    static let defaultNATSMaxPending = 4096
    /// After its deadline, how long an ack is still taken (its key recorded) for a batch that
    /// was answered 503.
    static let natsLateAckMs: UInt64 = 30_000
    /// A stream create/info request unanswered this long is sent again.
    static let natsAPITimeoutMs: UInt64 = 2_000
    /// Between stream setup attempts that failed.
    static let natsSetupRetryMs: UInt64 = 1_000
    /// libnats: between reconnect attempts to one server, and the connect timeout.
    static let natsReconnectWaitMs = 250
    static let natsConnectTimeoutMs = 2_000
    /// libnats: PING interval (two unanswered PINGs drop the connection).
    static let natsPingIntervalMs = 5_000
    /// Reply bytes queued on the inbox subscription before libnats drops replies (their
    /// publishes then time out).
    static let natsMaxReplyBytes = 64 << 20
    /// Room for a message's headers (key and stream name are at most 256 bytes each) on top of
    /// `--max-body` in the stream's `max_msg_size`. The NATS servers' `max_payload` must be at
    /// least `--max-body` plus this (tools/pylon-nats-cluster sets 2 MiB; nats-server's
    /// default is 1 MiB): a larger batch is answered 413.
    static let natsHeaderAllowance = 4096
}
