import CJSONC
import PylonCore
import PylonProtocol

#if canImport(Glibc)
import Glibc
#endif

/// The router at the heart of the host. It owns every peer (clients and plugin channels), the
/// table of forwarded requests (`PendingTable`), subscriptions and the consent switches, and
/// applies each limit.
///
/// One message's path (`handleLine`): the line is scanned once (`RawJSON.classifyMessage`); a
/// plain request or answer is routed from its bytes (`Bus+FastPath`). Anything else is parsed by
/// json-c, its envelope checked (`InboundEnvelope.classify`), its principal resolved (the peer,
/// or the client a plugin acts for), and `route` decides: host method, plugin, provided method,
/// refusal or consent denial — the same decision the fast path uses. Forwarded messages keep
/// their bytes with only the top-level `id` replaced; nothing is re-serialised. Supervision
/// lives in `Bus+Supervision`, host methods in `Bus+HostMethods`.
public final class Bus {
    let loop: Loop
    var config: HostConfig
    let log = Log("bus")
    var tokener: Tokener

    var peers: [UInt64: Peer] = [:]
    /// Connection ids are unique across restarts of pylond too (they start at the wall clock in
    /// ms × 1000, below 2^53), so a plugin that kept state about a client id from an earlier
    /// host run cannot mistake a new client for it.
    private var nextPeerId = UInt64(max(0, System.wallClockMs())) * 1000
    var pending = PendingTable<Pending>()
    private var nextRequestId: Int64 = 1
    var slots: [String: PluginSlot] = [:]
    /// Slots a reload removed or replaced whose process has not exited yet: kept until it has,
    /// so shutdown waits for them too (a plugin never outlives the host) and a replacement does
    /// not start beside them.
    var retiring: [PluginSlot] = []
    var slotOrder: [String] = []
    /// Methods served by clients (`bus.provide`), by full name.
    var provided: [String: Peer] = [:]

    var consent = ConsentStore()
    var consentRefused: [String: UInt64] = [:]
    var consentPath: String { config.stateDir + "/consent.json" }

    /// Armed for the earliest pending deadline only (none while nothing is pending).
    private var sweepTimer: Timer!
    private var sweepArmedForMs: UInt64?
    let startedAtMs: UInt64
    var shuttingDown = false
    var onShutdownComplete: () -> Void = {}

    // Counters for bus.status.
    var routed: UInt64 = 0
    /// Messages (requests and answers) routed without a json-c tree (Bus+FastPath).
    var fastRouted: UInt64 = 0
    var timeouts: UInt64 = 0
    var protocolErrors: UInt64 = 0
    var published: UInt64 = 0
    /// Times a client's input was held because the plugin it sent to was congested.
    var heldForCongestion: UInt64 = 0
    /// JSON-RPC batches received, and the one whose members are being handled now.
    var batches: UInt64 = 0
    var currentBatch: BatchReply?
    /// Clients disconnected for not reading their replies (`closeAboveQueuedBytes`).
    var slowReadersClosed: UInt64 = 0
    /// Publications not queued to a client because its uid had `maxQueuedBytesPerUid` queued.
    var droppedForUidQueue: UInt64 = 0
    /// Connections watching traffic (`bus.monitor`, Bus+Monitor); empty costs one test per hook.
    var monitors: [MonitorEntry] = []
    /// Monitors disconnected for not reading their events (`maxMonitorQueuedBytes`).
    var monitorsDropped: UInt64 = 0
    /// Forwarded requests' method and start, by host id, kept only while a monitor is connected
    /// (so `Pending` and the routing path stay as they are without one).
    var monitorTraces: [Int64: MonitorTrace] = [:]

    /// Called once every enabled plugin has left `starting` for the first time.
    public var onReady: () -> Void = {}
    /// Set by `Host`: re-reads the configuration file and applies it (`bus.reload`).
    public var onReloadRequest: (() -> Result<JSON, RPCError>)?
    /// `bus.reload` requests waiting for the next loop turn (`deferReload`).
    var reloadWaiters: [(Peer, String?)] = []
    var reloadTimer: Timer?
    var readyReported = false
    var addingPlugins = false

    public init(loop: Loop, config: HostConfig) {
        self.loop = loop
        self.config = config
        tokener = Tokener(maxDepth: config.limits.maxDepth)
        startedAtMs = loop.nowMs
        sweepTimer = Timer(loop: loop, unref: true) { [unowned self] in
            self.sweepArmedForMs = nil
            self.sweepTimeouts()
        }
        loadConsent()
    }

    /// Connected clients, in all and per uid.
    public private(set) var clientCount = 0
    /// Each uid's client connections (their count is the per-uid connection limit's; their
    /// queued bytes are the per-uid queue bound's).
    var clientsByUid: [UInt32: [Peer]] = [:]
    /// Refused connections not yet reported in the log (reported at most every `refusalLogMs`).
    var refusedUnlogged: [String: Int] = [:]
    var refusedTotal: UInt64 = 0
    var refusalLogTimer: Timer?
    var lastRefusalLogMs: UInt64?
    static let refusalLogMs: UInt64 = 10_000
    /// Clients closed since the allocator was last asked to return free memory.
    var closedSinceTrim = 0
    var trimTimer: Timer?

    // MARK: Peers

    /// Adopts an accepted client connection, or refuses it: while shutting down, at the
    /// connection limit, or at the per-uid limit (so one local user cannot take every slot).
    /// A refusal is one error line written without queueing and an immediate close, so a
    /// connect flood holds no descriptors or memory beyond the limit.
    public func adoptClient(_ conn: Connection) {
        let creds = PeerCredentials.of(fd: conn.fd)
        let limits = config.limits
        var refusal: (String, RPCError)?
        if shuttingDown {
            refusal = ("shuttingDown", RPCError(.shuttingDown, "host is shutting down"))
        } else if clientCount >= limits.maxConnections {
            refusal = (
                "maxConnections",
                RPCError(
                    .overloaded, "too many connections (limit \(limits.maxConnections))",
                    data: ["limit": "maxConnections", "value": .int(Int64(limits.maxConnections))])
            )
        } else if let uid = creds?.uid, clientsByUid[uid, default: []].count >= limits.maxConnectionsPerUid {
            refusal = (
                "maxConnectionsPerUid",
                RPCError(
                    .overloaded, "too many connections from uid \(uid) (limit \(limits.maxConnectionsPerUid))",
                    data: ["limit": "maxConnectionsPerUid", "value": .int(Int64(limits.maxConnectionsPerUid))])
            )
        }
        if let (name, error) = refusal {
            conn.refuse(line: String(decoding: Envelope.error(id: .null, error), as: UTF8.self))
            noteRefusal(name)
            return
        }
        let peer = newPeer(kind: .client(creds), conn: conn)
        clientCount += 1
        if let uid = creds?.uid { clientsByUid[uid, default: []].append(peer) }
        // `printf '...' | socat - UNIX-CONNECT:…` shuts down its side after the last request:
        // answer what is in flight, then close.
        conn.onEOF = { [unowned self, unowned peer] in self.closeIfDone(peer) }
        if let c = peer.credentials {
            log.debug("client connected", ["client": peer.id, "pid": c.pid, "uid": c.uid])
        }
        conn.startReading()
    }

    func newPeer(kind: Peer.Kind, conn: Connection) -> Peer {
        let peer = Peer(id: nextPeerId, kind: kind, conn: conn, now: loop.nowMs)
        nextPeerId += 1
        peers[peer.id] = peer
        conn.maxLineBytes = config.limits.maxLineBytes
        conn.pauseAbove = config.limits.maxQueuedBytes
        conn.flushAboveBytes = config.limits.flushAboveBytes
        conn.onLine = { [unowned self, unowned peer] line in self.handleLine(peer, line) }
        conn.onOversized = { [unowned self, unowned peer] n, head in self.handleOversized(peer, n, head) }
        conn.onClose = { [unowned self] _ in self.peerClosed(peer) }
        return peer
    }

    /// Whom a request acts for, for plugins whose manifest asks (`callerInfo`):
    /// `{"plugin":P}`, `{"client":N,"uid":U,"gid":G,"pid":P}` or both (a plugin acting for a
    /// client), with `"admin":true` for an admin client. Only the host writes it (`CallerInfo`,
    /// which the plugin kit reads).
    func callerJSON(_ p: Principal) -> String {
        let c = p.client != nil ? p.credentials : nil
        return CallerInfo(
            client: p.client.map { Int64(truncatingIfNeeded: $0) }, uid: c.map { Int64($0.uid) }, gid: c.map { Int64($0.gid) },
            pid: c.map { Int64($0.pid) }, plugin: p.plugin, admin: c.map { config.disclosure.admins.allows($0) } == true ? true : nil
        ).serialized
    }

    /// The principal of a message from `peer`. `via` is the `_onBehalfOf` request id a plugin
    /// named: it must be a request forwarded to that plugin and not yet answered; nil otherwise
    /// (clients cannot name one).
    func principal(of peer: Peer, via: Int64?) -> Principal? {
        guard let slot = peer.slot else { return via == nil ? .client(peer) : nil }
        guard let via else { return .plugin(slot.config.name) }
        guard let p = pending[via], p.target === peer else { return nil }
        return .plugin(slot.config.name, via: p.principal)
    }

    /// Topics only admin clients (and plugins) receive (`disclosure.adminTopics`).
    func isAdminTopic(_ topic: String) -> Bool { config.disclosure.adminTopics.contains { $0.matches(topic) } }

    func isAdmin(_ client: Peer) -> Bool { client.credentials.map { config.disclosure.admins.allows($0) } ?? false }

    /// True for an admin client, or a plugin acting on its own behalf (plugins are the operator's).
    func seesEverything(_ p: Principal) -> Bool {
        if p.actsForClient { return p.credentials.map { config.disclosure.admins.allows($0) } ?? false }
        return true
    }

    /// Closes a half-closed client once nothing it asked for is still in flight.
    func closeIfDone(_ peer: Peer) {
        if peer.conn.peerShutdown && peer.inflight == 0 && !peer.closed { peer.conn.closeAfterFlush() }
    }

    /// Counts a refused connection. The log gets at most one line per `refusalLogMs`: the first
    /// refusal after a quiet period at once, the rest summed at the end of the window.
    func noteRefusal(_ limit: String) {
        refusedTotal += 1
        refusedUnlogged[limit, default: 0] += 1
        guard refusalLogTimer == nil else { return }
        let now = loop.nowMs
        let wait = lastRefusalLogMs.map { $0 + Bus.refusalLogMs > now ? $0 + Bus.refusalLogMs - now : 0 } ?? 0
        if wait == 0 { return logRefusals() }
        refusalLogTimer = loop.after(ms: wait, unref: true) { [unowned self] in
            self.refusalLogTimer = nil
            self.logRefusals()
        }
    }

    private func logRefusals() {
        guard !refusedUnlogged.isEmpty else { return }
        let counts = refusedUnlogged.keys.sorted().map { "\($0)=\(refusedUnlogged[$0]!)" }.joined(separator: ",")
        let n = refusedUnlogged.values.reduce(0, +)
        refusedUnlogged = [:]
        lastRefusalLogMs = loop.nowMs
        log.warn("connections refused", ["count": n, "by_limit": counts, "clients": clientCount, "total": refusedTotal])
    }

    /// After a burst of clients went away, asks the allocator to return free memory to the
    /// system (glibc keeps freed heap otherwise), once the burst is over.
    func clientGone() {
        closedSinceTrim += 1
        guard closedSinceTrim >= Bus.trimAfterClosedClients, trimTimer == nil else { return }
        trimTimer = loop.after(ms: 1_000, unref: true) { [unowned self] in
            self.trimTimer = nil
            self.closedSinceTrim = 0
            System.releaseFreeMemory()
        }
    }
    static let trimAfterClosedClients = 256

    func peerClosed(_ peer: Peer) {
        guard !peer.closed else { return }
        peer.closed = true
        peers[peer.id] = nil
        if !peer.isPlugin {
            clientCount -= 1
            if let uid = peer.credentials?.uid {
                var same = clientsByUid[uid, default: []]
                same.removeAll { $0 === peer }
                clientsByUid[uid] = same.isEmpty ? nil : same
            }
            clientGone()
        }
        for m in peer.provided where provided[m] === peer { provided[m] = nil }
        if !monitors.isEmpty { monitorRemove(peer) }
        // Requests that peer was serving fail now, not at their timeout.
        failPending(
            targeting: peer,
            RPCError(
                .pluginUnavailable, "\(peer.label) disconnected with the request in flight",
                data: ["reason": "disconnected"]))
        if let slot = peer.slot {
            pluginChannelClosed(slot, peer)
        } else if !shuttingDown {
            // Plugins that keep per-client state (MA's "app went away") subscribe to this.
            publish(topic: HostTopic.clientClosed, params: ["client": .int(Int64(peer.id))])
        }
    }

    // MARK: Inbound

    func handleOversized(_ peer: Peer, _ n: Int, _ head: [UInt8]) {
        protocolErrors += 1
        log.warn("message too large", ["peer": peer.label, "bytes": n, "limit": config.limits.maxLineBytes])
        let id = Bus.scanId(head)
        // An answer too large to relay (a plugin's, or a provider's): whoever asked gets the
        // error now instead of waiting for its timeout; the sender gets nothing back (an answer
        // is not answered).
        if case .int(let hostId)? = id, let p = pending[hostId], p.target === peer, Bus.looksLikeResponse(head) {
            complete(
                hostId,
                RPCError(
                    .messageTooLarge,
                    "the reply from \(peer.label) was \(n) bytes, over the limit of \(config.limits.maxLineBytes) bytes",
                    data: [
                        "limit": "maxLineBytes", "value": .int(Int64(config.limits.maxLineBytes)), "received": .int(Int64(n)),
                        "target": .string(peer.label),
                    ]))
            return
        }
        sendError(
            peer.conn, jsonId: id,
            RPCError(
                .messageTooLarge,
                "message of \(n) bytes exceeds the limit of \(config.limits.maxLineBytes) bytes; it was skipped",
                data: ["limit": "maxLineBytes", "value": .int(Int64(config.limits.maxLineBytes)), "received": .int(Int64(n))]))
    }

    func handleLine(_ peer: Peer, _ line: UnsafeRawBufferPointer) {
        peer.lastInboundMs = loop.nowMs
        // A person pressing Enter in socat sends an empty line: ignore it.
        if line.allSatisfy({ $0 == 0x20 || $0 == 0x09 || $0 == 0x0D }) { return }
        let scan = RawJSON.classifyMessage(line, maxDepth: Int(config.limits.maxDepth) - 1)
        if case .message(let spans) = scan, fastRoute(peer, line, spans) { return }
        let msg: JSONRef
        do throws(JSONParseError) {
            msg = try tokener.parse(line)
            // json-c accepts a few things RFC 8259 does not (single quotes, `2.`); relaying them
            // would hand other peers lines they cannot parse.
            if case .invalid(let at) = scan {
                throw JSONParseError(kind: .syntax, detail: "not strict JSON (RFC 8259) at byte \(at)")
            }
        } catch {
            protocolErrors += 1
            var data: JSONObject = ["reason": .string(error.detail)]
            if error.kind == .depth { data["limit"] = "maxDepth"; data["value"] = .int(Int64(config.limits.maxDepth)) }
            sendError(peer.conn, id: nil, RPCError(.parseError, "parse error: \(error.detail)", data: .object(data)))
            return
        }
        if json_object_get_type(msg.ptr) == json_type_array, currentBatch == nil {
            handleBatch(peer, line, count: Int(json_object_array_length(msg.ptr)))
            return
        }
        // The id's bytes, for the splice: found by the scan, else looked up in the line.
        var idSpan: Range<Int>?
        if case .message(let spans) = scan {
            idSpan = spans.id
        } else {
            // The scan was not sure (a key with escapes, among others). json-c decodes escaped
            // keys and cuts them at U+0000; a byte search does neither. So a second "id" spelled
            // another way (`"i\u0064"`) would stay in the line past the splice, and the receiver
            // would read it as the id: refused. A key holding U+0000 is one member to json-c and
            // another to other parsers (the host and a plugin would read different values):
            // refused anywhere in the message.
            if RawJSON.hasNULKey(line) {
                protocolErrors += 1
                sendError(peer.conn, id: nil, RPCError(.invalidRequest, "member names must not contain U+0000"))
                return
            }
            let ids = RawJSON.topLevelMembers(line, named: "id")
            guard ids.count <= 1, msg.has("id") == (ids.count == 1) else {
                protocolErrors += 1
                sendError(peer.conn, id: nil, RPCError(.invalidRequest, "\"id\" appears more than once (spelled differently)"))
                return
            }
            idSpan = ids.first
        }
        dispatch(peer, InboundEnvelope.classify(msg), msg, line, idSpan: idSpan)
    }

    /// The rungs after parsing: the envelope's verdict, who the message speaks for, where it goes.
    private func dispatch(
        _ peer: Peer, _ envelope: InboundEnvelope, _ msg: JSONRef, _ line: UnsafeRawBufferPointer,
        idSpan: Range<Int>?
    ) {
        switch envelope {
        case .invalid(let e, let id, let answer):
            protocolErrors += 1
            if answer { sendError(peer.conn, id: id, e) }
        case .response(let id):
            handleResponse(peer, msg, line, id: id, idSpan: idSpan!)
        case .request(let method, let id):
            switch principal(of: peer, msg) {
            case .success(let principal):
                handleRequest(peer, principal, msg, line, method: method, id: id, idSpan: idSpan!)
            case .failure(let e):
                protocolErrors += 1
                sendError(peer.conn, id: id, e)
            }
        case .notification(let method):
            switch principal(of: peer, msg) {
            case .success(let principal): handleNotification(peer, principal, msg, line, method: method)
            case .failure: protocolErrors += 1
            }
        }
    }

    /// The message's principal: the peer itself, or — for a plugin's `_onBehalfOf` — the client
    /// whose request it serves.
    func principal(of peer: Peer, _ msg: JSONRef) -> Result<Principal, RPCError> {
        var via: Int64?
        if msg.has("_onBehalfOf") {
            let v = msg.member("_onBehalfOf")
            guard peer.isPlugin, json_object_get_type(v) == json_type_int else {
                return .failure(RPCError(.invalidRequest, "\"_onBehalfOf\" is for plugins: the integer id of a request they serve"))
            }
            via = json_object_get_int64(v)
        }
        guard let principal = principal(of: peer, via: via) else {
            return .failure(
                RPCError(.notPermitted, "\"_onBehalfOf\": \(via ?? 0) is not a request \(peer.label) is serving (answered or timed out)"))
        }
        return .success(principal)
    }

    /// Work units a `bus.status` or `bus.describe` costs against a connection's turn budget.
    static let reportCost = 32

    func handleRequest(
        _ peer: Peer, _ principal: Principal, _ msg: JSONRef, _ line: UnsafeRawBufferPointer, method: String,
        id: OpaquePointer?, idSpan: Range<Int>
    ) {
        if let slot = peer.slot, !peer.handshaken {
            if method == HostMethod.hello {
                pluginHello(slot, peer, msg: msg, id: id)
            } else {
                sendError(peer.conn, id: id, RPCError(.invalidRequest, "the first message must be bus.hello"))
            }
            return
        }
        // Answers carry the id exactly as the caller wrote it (json-c would rewrite 2^64-1 or -0).
        let idText = String(decoding: UnsafeRawBufferPointer(rebasing: line[idSpan]), as: UTF8.self)
        switch route(peer, principal, method, field: Bus.paramField(msg)) {
        case .host:
            // A report costs much more than a routed message: fewer of the peer's lines follow
            // in this loop turn (a flood of them cannot stall everyone else).
            if method == HostMethod.status || method == HostMethod.describe { peer.conn.charge(Bus.reportCost) }
            let params = msg.has("params") ? JSONRef.toJSON(msg.member("params")) : nil
            if method == HostMethod.reload {
                do throws(RPCError) {
                    try reloadAllowed(peer, principal)
                    if currentBatch != nil { throw RPCError(.invalidRequest, "bus.reload is answered on its own, not in a batch") }
                    deferReload(peer, idText: idText)
                } catch {
                    sendError(peer.conn, idText: idText, error)
                }
                return
            }
            let startNs = monitors.isEmpty ? 0 : Loop.hrtimeNs
            let answer = hostMethod(peer, principal, method, params)
            switch answer {
            case .success(let v): sendResult(peer.conn, idText: idText, v)
            case .failure(let e): sendError(peer.conn, idText: idText, e)
            }
            if !monitors.isEmpty, method != HostMethod.monitor {
                var error: RPCError?
                if case .failure(let e) = answer { error = e }
                monitorHostAnswer(peer, principal, method, line, id: idText, startNs: startNs, error: error)
            }
        case .refused(let e):
            sendError(peer.conn, idText: idText, e)
            if !monitors.isEmpty { monitorHostAnswer(peer, principal, method, line, id: idText, startNs: Loop.hrtimeNs, error: e) }
        case .denied(let spec, let key):
            consentRefused[key, default: 0] += 1
            let error = RPCError(.consentDenied, "consent switch \(key) is denied", data: ["switch": .string(key)])
            if spec.dropWhenDenied {
                sendResult(peer.conn, idText: idText, spec.deniedResult)
            } else {
                sendError(peer.conn, idText: idText, error)
            }
            if !monitors.isEmpty {
                monitorHostAnswer(
                    peer, principal, method, line, id: idText, startNs: Loop.hrtimeNs, error: spec.dropWhenDenied ? nil : error)
            }
        case .forward(let target, let timeoutMs, _):
            if let e = paramCheckError(target, method, msg) { return sendError(peer.conn, idText: idText, e) }
            forward(peer, principal, line, idSpan: idSpan, to: target, timeoutMs: timeoutMs, method: method)
        }
    }

    /// Where a call of `method` by `peer` goes: the one routing decision shared by requests (both
    /// paths) and client notifications.
    enum Route {
        /// A `bus.*` or `consent.*` method, answered by the host.
        case host
        /// To a plugin, or to the client that provided the method (`provider`).
        case forward(Peer, timeoutMs: UInt64, provider: Bool)
        /// Not allowed or not available: the error a request gets.
        case refused(RPCError)
        /// Refused by consent switch `key` (the method's manifest entry says how to answer).
        case denied(Manifest.Method, key: String)
    }

    /// The routing decision. `field` reads a top-level params string for the consent template
    /// (nil when absent or not a string).
    func route(_ peer: Peer, _ principal: Principal, _ method: String, field: (String) -> String?) -> Route {
        if shuttingDown { return .refused(RPCError(.shuttingDown, "host is shutting down")) }
        if !isPermitted(method, principal) {
            let uid = principal.credentials.map { Int64($0.uid) }
            let who = principal.actsForClient ? "uid \(uid.map(String.init) ?? "unknown")" : "plugin \(principal.plugin ?? "?")"
            let via = principal.actsForClient && principal.plugin != nil ? " (through plugin \(principal.plugin!))" : ""
            return .refused(
                RPCError(
                    .notPermitted, "\(who) may not call \(method)\(via)",
                    data: ["method": .string(method), "uid": uid.map { .int($0) } ?? .null]))
        }
        if HostMethod.isHostNamespace(method) { return .host }
        // A configured plugin's namespace is the plugin's, whatever a client provided. (Method
        // names are printable ASCII, checked before routing: the first "." byte is the first "."
        // character.)
        let dot = method.utf8.firstIndex(of: UInt8(ascii: ".")) ?? method.endIndex
        guard let slot = slots[String(method[..<dot])] else {
            if let provider = provided[method] { return .forward(provider, timeoutMs: config.limits.requestTimeoutMs, provider: true) }
            return .refused(RPCError(.methodNotFound, "method not found: \(method)"))
        }
        guard slot.life.state == .running, let target = slot.peer, target.handshaken else {
            return .refused(slot.unavailableError())
        }
        if !slot.methods.isEmpty {
            guard let m = slot.methods[method] else {
                return .refused(RPCError(.methodNotFound, "method not found: \(method) (plugin \(slot.config.name) does not serve it)"))
            }
            if m.spec.consent != nil, let key = deniedConsent(m.consent, field: field) { return .denied(m.spec, key: key) }
        }
        return .forward(target, timeoutMs: slot.config.requestTimeoutMs ?? config.limits.requestTimeoutMs, provider: false)
    }

    /// Reads top-level string params of a parsed message (for consent templates).
    static func paramField(_ msg: JSONRef) -> (String) -> String? {
        let params = msg.member("params")
        return { name in
            var v: OpaquePointer?
            guard json_object_object_get_ex(params, name, &v) != 0, json_object_get_type(v) == json_type_string else { return nil }
            return String(cString: json_object_get_string(v))
        }
    }

    /// The switch that refuses this message, or nil when it may pass.
    func deniedConsent(_ template: ConsentTemplate, field: (String) -> String?) -> String? {
        if !consent.masterGranted { return ConsentStore.master }
        switch template.key(field: field) {
        case .none, .unresolved: return nil
        case .key(let k): return consent.isGranted(k) ? nil : k
        }
    }

    /// Forwards a request with a host-issued id: the line with only its id's bytes (`idSpan`)
    /// replaced (a parsed message is never re-serialised).
    func forward(
        _ peer: Peer, _ principal: Principal, _ line: UnsafeRawBufferPointer, idSpan span: Range<Int>, to target: Peer,
        timeoutMs: UInt64, method: String
    ) {
        // Backpressure reaches whoever fills a congested target: a client's request waits (the
        // line is dispatched again later) and its input is held until the target drains, so a
        // target's queue stays within maxQueuedBytes plus one message. Plugins are not held: a
        // held plugin could not answer its heartbeats; their own callers are held instead.
        if !peer.isPlugin && deferIfCongested(peer, target) { return }
        let original = String(decoding: UnsafeRawBufferPointer(rebasing: line[span]), as: UTF8.self)
        if peer.inflight >= config.limits.maxInflightPerConnection {
            sendError(
                peer.conn, idText: original,
                RPCError(
                    .overloaded,
                    "too many requests in flight on this connection (limit \(config.limits.maxInflightPerConnection))",
                    data: ["limit": "maxInflightPerConnection", "value": .int(Int64(config.limits.maxInflightPerConnection))]))
            return
        }
        let hostId = nextRequestId
        nextRequestId += 1
        if target.slot?.wantsCallerInfo == true {
            // `"id":N,"_pylon":{…}`. A client's own caller text is the same for each of its
            // requests (until a reload): built once.
            if principal.plugin == nil, principal.client == peer.id {
                if peer.callerMember == nil { peer.callerMember = Array((#","_pylon":"# + callerJSON(principal)).utf8) }
                peer.callerMember!.withUnsafeBytes { target.conn.sendSpliced(line, span, int: hostId, then: $0) }
            } else {
                var replacement = "\(hostId),\"_pylon\":" + callerJSON(principal)
                replacement.withUTF8 { target.conn.sendSpliced(line, span, UnsafeRawBufferPointer($0)) }
            }
        } else {
            target.conn.sendSpliced(line, span, int: hostId)
        }
        let origin: Pending.Origin
        if let b = currentBatch, b.peer === peer {
            b.outstanding += 1
            origin = .batch(b, originalId: original)
        } else {
            origin = .peer(peer, originalId: original)
        }
        if !monitors.isEmpty {
            monitorTraces[hostId] = MonitorTrace(method: method, startNs: Loop.hrtimeNs)
            monitorRequest(peer, principal, method, line, id: original, to: target.label)
        }
        addPending(hostId, Pending(origin: origin, target: target, principal: principal), deadlineMs: loop.nowMs + timeoutMs)
        peer.inflight += 1
        peer.requestsSent += 1
        routed += 1
    }

    /// When `target` is congested: defers `peer`'s current line and holds its input until the
    /// target drains; returns true (the caller routes nothing now).
    func deferIfCongested(_ peer: Peer, _ target: Peer) -> Bool {
        guard target.conn.isCongested else { return false }
        // A batch member cannot wait alone (the line holds the members already sent): the
        // batch goes through, and the peer's input is held after it (`handleBatch`).
        if let b = currentBatch, b.peer === peer {
            b.congested = target
            return false
        }
        peer.conn.hold(until: target.conn)
        peer.conn.deferCurrentLine()
        heldForCongestion += 1
        return true
    }

    /// Issues a request from the host itself (heartbeats, callbacks to providers).
    func call(
        _ target: Peer, method: String, params: JSON?, timeoutMs: UInt64,
        _ done: @escaping (Result<JSON, RPCError>) -> Void
    ) -> Int64 {
        let hostId = nextRequestId
        nextRequestId += 1
        addPending(hostId, Pending(origin: .host(done), target: target), deadlineMs: loop.nowMs + timeoutMs)
        target.conn.send(envelope: Envelope.request(id: .int(hostId), method: method, params: .params(params)))
        return hostId
    }

    func handleResponse(_ peer: Peer, _ msg: JSONRef, _ line: UnsafeRawBufferPointer, id: OpaquePointer?, idSpan: Range<Int>) {
        guard json_object_get_type(id) == json_type_int, case let hostId = json_object_get_int64(id),
            let p = takePending(hostId, answeredBy: peer)
        else {
            log.debug("reply to an unknown request ignored", ["peer": peer.label])
            return
        }
        if !monitors.isEmpty, let t = monitorTraces.removeValue(forKey: hostId) { monitorReply(p, t, line) }
        switch p.origin {
        case .peer(let origin, let originalId): relayResponse(line, idSpan: idSpan, to: origin, originalId: originalId)
        case .batch(let b, let originalId): relayToBatch(line, idSpan: idSpan, b, originalId: originalId)
        case .host(let done): done(msg.responseResult)
        }
    }

    /// Removes and returns the pending request `hostId` if `peer` is the one it was sent to.
    func takePending(_ hostId: Int64, answeredBy peer: Peer, if accept: (Pending) -> Bool = { _ in true }) -> Pending? {
        guard let p = pending.remove(hostId, if: { $0.target === peer && accept($0) }) else { return nil }
        peer.slot?.served += 1
        return p
    }

    func handleNotification(_ peer: Peer, _ principal: Principal, _ msg: JSONRef, _ line: UnsafeRawBufferPointer, method: String) {
        if let slot = peer.slot, !peer.handshaken {
            log.warn("notification before bus.hello ignored", ["plugin": slot.config.name, "method": method])
            return
        }
        if let slot = peer.slot {
            // A plugin's notification is a publication on the topic named by its method.
            guard !HostMethod.isHostNamespace(method) else {
                log.warn("plugin tried to publish on a host topic; dropped", ["plugin": slot.config.name, "topic": method])
                return
            }
            publish(topic: method, line: line, from: peer)
            return
        }
        // A client notification to a plugin method: forwarded without a reply, under the same
        // permission, manifest and consent rules as a request.
        // (Methods a client provided take requests only.)
        switch route(peer, principal, method, field: Bus.paramField(msg)) {
        case .forward(let target, _, provider: false):
            if deferIfCongested(peer, target) { return }  // held like a request (see forward)
            forwardNotification(line, principal, to: target)
            routed += 1
            if !monitors.isEmpty { monitorNotification(peer, principal, method, line, to: target) }
        case .host:
            // Done as the request would be; the answer, error or not, is nobody's.
            if method == HostMethod.status || method == HostMethod.describe { peer.conn.charge(Bus.reportCost) }
            _ = hostMethod(peer, principal, method, msg.has("params") ? JSONRef.toJSON(msg.member("params")) : nil)
        case .denied(_, let key):
            consentRefused[key, default: 0] += 1
        case .refused, .forward:
            break
        }
    }

    /// Sends a client's notification to a plugin method. A plugin that wants caller info gets
    /// `"_pylon":{…}` as the object's first member, as a request would carry it: a notification
    /// acts for its sender exactly as a request does (the kit runs no handler for a notification
    /// without one).
    func forwardNotification(_ line: UnsafeRawBufferPointer, _ principal: Principal, to target: Peer) {
        guard target.slot?.wantsCallerInfo == true, let open = line.firstIndex(of: UInt8(ascii: "{")) else {
            target.conn.sendLine(line)
            return
        }
        var member = #""_pylon":"# + callerJSON(principal) + ","
        member.withUTF8 { target.conn.sendSpliced(line, (open + 1)..<(open + 1), UnsafeRawBufferPointer($0)) }
    }

    /// Delivers one notification line, as it is, to every subscriber of `topic` but the sender.
    @discardableResult
    func publish(topic: String, line: UnsafeRawBufferPointer, from sender: Peer?) -> Int {
        published += 1
        var delivered = 0
        let adminOnly = isAdminTopic(topic)
        // What each uid has queued, summed when first needed and kept up to date as this
        // publication is queued (one pass over that uid's connections per publication).
        var uidQueued: [UInt32: Int] = [:]
        for peer in peers.values where peer !== sender && !peer.closed {
            let subs: [TopicPattern]
            if let slot = peer.slot {
                guard peer.handshaken else { continue }
                subs = slot.manifest?.subscribes ?? []
            } else {
                if adminOnly && !isAdmin(peer) { continue }
                subs = peer.subscriptions
            }
            guard subs.contains(where: { $0.matches(topic) }) else { continue }
            if peer.conn.queuedBytes > config.limits.maxQueuedBytes {
                peer.droppedNotifications += 1
                continue
            }
            if let uid = peer.credentials?.uid {
                let queued = uidQueued[uid] ?? queuedBytes(ofUid: uid)
                guard queued + line.count <= config.limits.maxQueuedBytesPerUid else {
                    uidQueued[uid] = queued
                    peer.droppedNotifications += 1
                    droppedForUidQueue += 1
                    continue
                }
                uidQueued[uid] = queued + line.count + 1
            }
            peer.conn.sendLine(line)
            delivered += 1
        }
        if !monitors.isEmpty { monitorPublication(topic, line, from: sender, delivered: delivered) }
        return delivered
    }

    /// Bytes queued to all client connections of `uid`.
    func queuedBytes(ofUid uid: UInt32) -> Int {
        clientsByUid[uid, default: []].reduce(0) { $0 + $1.conn.queuedBytes }
    }

    func publish(topic: String, params: JSON, from sender: Peer? = nil) {
        Envelope.notification(method: topic, params: .value(params)).withUnsafeBytes {
            _ = publish(topic: topic, line: $0, from: sender)
        }
    }

    // MARK: Pending requests

    func failPending(targeting peer: Peer, _ error: RPCError) {
        for id in pending.ids(where: { $0.target === peer }) { complete(id, error) }
    }

    /// Answers a pending request with an error (plugin death, timeout).
    func complete(_ id: Int64, _ error: RPCError) {
        guard let p = pending.remove(id) else { return }
        finish(id, p, error)
    }

    private func finish(_ id: Int64, _ p: Pending, _ error: RPCError) {
        if !monitors.isEmpty, let t = monitorTraces.removeValue(forKey: id) { monitorReply(p, t, error: error) }
        switch p.origin {
        case .peer(let origin, let originalId):
            origin.inflight -= 1
            guard !origin.closed else { return }
            sendError(origin.conn, idText: originalId, error)
            if origin.conn.peerShutdown { closeIfDone(origin) }
        case .batch(let b, let originalId):
            var idText = originalId
            idText.withUTF8 { id in
                Envelope.error(id: .text(UnsafeRawBufferPointer(id)), error).withUnsafeBytes { batchMemberAnswered(b, $0) }
            }
        case .host(let done):
            done(.failure(error))
        }
    }

    func addPending(_ id: Int64, _ p: Pending, deadlineMs: UInt64) {
        pending.insert(id, p, deadlineMs: deadlineMs)
        if let armed = sweepArmedForMs, armed <= deadlineMs { return }  // the usual case: no work
        arm(deadlineMs)
    }

    /// Arms the timeout timer for the earliest pending deadline; with nothing pending it stays
    /// idle: an idle host does not wake up for timeouts.
    private func armSweep() {
        guard let next = pending.nextDeadline() else { return }
        arm(next)
    }

    private func arm(_ deadlineMs: UInt64) {
        sweepArmedForMs = deadlineMs
        // At least 1 ms: a zero timer started from the timer's own callback would run again in
        // the same loop phase.
        sweepTimer.start(after: max(1, deadlineMs > loop.nowMs ? deadlineMs - loop.nowMs : 0))
    }

    private func sweepTimeouts() {
        for (id, p) in pending.expired(nowMs: loop.nowMs) {
            if !p.isHostCall { timeouts += 1 }
            finish(id, p, RPCError(.timeout, "no reply from \(p.target.label) in time", data: ["target": .string(p.target.label)]))
        }
        armSweep()
    }

    // MARK: Output helpers

    /// Sends one reply line, or takes it into the batch being handled for `conn`'s peer.
    func sendReply(_ conn: Connection, _ envelope: [UInt8]) {
        if currentBatch != nil, takeIntoBatch(conn, envelope) { return }
        conn.send(envelope: envelope)
    }

    func sendResult(_ conn: Connection, id: OpaquePointer?, _ result: JSON) {
        sendReply(conn, Envelope.result(id: .ref(id), .value(result)))
    }

    func sendError(_ conn: Connection, id: OpaquePointer?, _ e: RPCError) {
        sendReply(conn, Envelope.error(id: .ref(id), e))
    }

    /// An error response for an id kept as JSON text (the caller's own bytes).
    func sendError(_ conn: Connection, idText: String, _ e: RPCError) {
        var idText = idText
        idText.withUTF8 { sendReply(conn, Envelope.error(id: .text(UnsafeRawBufferPointer($0)), e)) }
    }

    /// A result for an id kept as JSON text (the caller's own bytes).
    func sendResult(_ conn: Connection, idText: String, _ result: JSON) {
        var idText = idText
        idText.withUTF8 { sendReply(conn, Envelope.result(id: .text(UnsafeRawBufferPointer($0)), .value(result))) }
    }

    func sendError(_ conn: Connection, jsonId id: JSON?, _ e: RPCError) {
        sendReply(conn, Envelope.error(id: id.map { .value($0) } ?? .null, e))
    }

    /// Best effort: whether the first bytes of a too-long line are those of a response (a
    /// `result` or `error` member and no `method` among them).
    static func looksLikeResponse(_ head: [UInt8]) -> Bool {
        let s = String(decoding: head, as: UTF8.self)
        return (s.contains("\"result\"") || s.contains("\"error\"")) && !s.contains("\"method\"")
    }

    /// Best effort: the `id` of a message whose line was too long, from its first bytes.
    static func scanId(_ head: [UInt8]) -> JSON? {
        let s = String(decoding: head, as: UTF8.self)
        guard let r = s.range(of: "\"id\"") else { return nil }
        var rest = s[r.upperBound...].drop { $0 == " " || $0 == "\t" }
        guard rest.first == ":" else { return nil }
        rest = rest.dropFirst().drop { $0 == " " || $0 == "\t" }
        if rest.first == "\"" {
            let body = rest.dropFirst()
            guard let end = body.firstIndex(of: "\""), !body[..<end].contains("\\") else { return nil }
            return .string(String(body[..<end]))
        }
        let digits = rest.prefix { $0 == "-" || ($0 >= "0" && $0 <= "9") }
        if let i = Int64(digits) { return .int(i) }
        return nil
    }

    /// The first rule matching `method` decides, for the client at the start of the chain (unknown
    /// credentials never satisfy a rule) or for a plugin acting on its own (only if listed).
    func isPermitted(_ method: String, _ p: Principal) -> Bool {
        for rule in config.permissions where rule.method.matches(method) {
            if p.actsForClient {
                guard let c = p.credentials else { return false }
                return rule.allowed.allows(c)
            }
            if let name = p.plugin { return rule.allowed.plugins.contains(name) }
            return true
        }
        return true
    }
}
