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
/// their bytes with only the top-level `id` replaced; nothing is re-serialised.
///
/// The rules are value types that decide without I/O (`RoutingPolicy`, `Admission`,
/// `SubscriptionIndex`, `PendingTable`); `Bus` keeps the peers and performs their decisions.
/// Its state is in named parts (BusParts.swift): the peers (`PeerTable`), requests in flight
/// (`Forwarder`), the plugins (`PluginSet`), monitors (`MonitorSet`) and the host's run
/// (`HostState`).
/// This file: the state, admission and closing of peers, and forwarding. The inbound ladder is in
/// `Bus+Inbound`, requests in flight and timeouts in `Bus+Pending`, fan-out in `Bus+Publish`,
/// replies in `Bus+Output`, supervision in `Bus+Supervision`, host methods in `Bus+HostMethods`
/// and `Bus+Consent`.
public final class Bus {
    let loop: Loop
    var config: HostConfig { didSet { policy = RoutingPolicy(config, hostUid: policy.hostUid) } }
    /// The routing, security and consent rules of `config` (`RoutingPolicy`).
    private(set) var policy: RoutingPolicy
    let log = Log("bus")
    var tokener: Tokener
    /// The peers, their admission, subscriptions and provided methods (`PeerTable`).
    let peerTable = PeerTable()
    /// Requests in flight (`Forwarder`).
    let forwarder = Forwarder()
    /// The configured plugins' slots (`PluginSet`).
    let pluginSet = PluginSet()
    /// `bus.monitor` connections (`MonitorSet`).
    let monitoring = MonitorSet()
    /// The host's run: start, shutdown, reloads, reports (`HostState`).
    let hostState: HostState
    var consent = ConsentStore()
    /// Counters for bus.status (`BusCounters`).
    var counters = BusCounters()
    var consentPath: String { config.stateDir + "/consent.json" }

    /// Called once every enabled plugin has left `starting` for the first time.
    public var onReady: () -> Void {
        get { hostState.onReady }
        set { hostState.onReady = newValue }
    }
    /// Set by `Host`: re-reads the configuration file, checks it and applies it, then calls back
    /// with the answer (`bus.reload`; the plugins check it asynchronously, `Host.reload`).
    public var onReloadRequest: ((@escaping (Result<JSON, RPCError>) -> Void) -> Void)? {
        get { hostState.onReloadRequest }
        set { hostState.onReloadRequest = newValue }
    }

    /// `hostUid`: pylond's own uid (`getuid()`), which may `bus.reload` (`RoutingPolicy.hostUid`).
    public init(loop: Loop, config: HostConfig, hostUid: UInt32) {
        self.loop = loop
        self.config = config
        policy = RoutingPolicy(config, hostUid: hostUid)
        tokener = Tokener(maxDepth: config.limits.maxDepth)
        hostState = HostState(startedAtMs: loop.nowMs)
        forwarder.sweepTimer = Timer(loop: loop, unref: true) { [unowned self] in
            self.forwarder.sweepArmedForMs = nil
            self.sweepTimeouts()
        }
        loadConsent()
    }

    /// Connected clients.
    public var clientCount: Int { peerTable.admission.count }
    var refusedTotal: UInt64 { peerTable.admission.refusedTotal }

    // MARK: Peers

    /// Adopts an accepted client connection, or refuses it: while shutting down, at the
    /// connection limit, or at the per-uid limit (so one local user cannot take every slot).
    /// A refusal is one error line written without queueing and an immediate close, so a
    /// connect flood holds no descriptors or memory beyond the limit.
    public func adoptClient(_ conn: Connection) {
        let creds = PeerCredentials.of(fd: conn.fd)
        if case .refuse(let limit, let error) = peerTable.admission.decide(
            uid: creds?.uid, shuttingDown: hostState.shuttingDown, limits: config.limits)
        {
            conn.refuse(line: String(decoding: Envelope.error(id: .null, error), as: UTF8.self))
            noteRefusal(limit)
            return
        }
        let peer = newPeer(kind: .client(creds), conn: conn)
        peerTable.admission.admit(peer, uid: creds?.uid)
        hostState.stateRevision &+= 1
        if let uid = creds?.uid {
            let work = peerTable.uidWork[uid] ?? UidTurnWork()
            peerTable.uidWork[uid] = work
            peer.uidWork = work
        }
        // `printf '...' | socat - UNIX-CONNECT:…` shuts down its side after the last request:
        // answer what is in flight, then close.
        conn.onEOF = { [unowned self, unowned peer] in self.closeIfDone(peer) }
        if let c = peer.credentials {
            log.debug("client connected", ["client": peer.id, "pid": c.pid, "uid": c.uid])
        }
        conn.startReading()
    }

    func newPeer(kind: Peer.Kind, conn: Connection) -> Peer {
        let peer = Peer(id: peerTable.nextPeerId, kind: kind, conn: conn, now: loop.nowMs)
        peerTable.nextPeerId += 1
        peerTable.peers[peer.id] = peer
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
        RoutingPolicy.principal(client: peer.isPlugin ? nil : (peer.id, peer.credentials), plugin: peer.slot?.config.name, via: via) {
            guard let p = forwarder.pending[$0], p.target === peer else { return nil }
            return p.principal
        }
    }

    /// Topics only admin clients (and plugins) receive (`disclosure.adminTopics`).
    func isAdminTopic(_ topic: String) -> Bool { policy.isAdminTopic(topic) }

    func isAdmin(_ client: Peer) -> Bool { policy.isAdmin(client.credentials) }

    /// True for an admin client, or a plugin acting on its own behalf (plugins are the operator's).
    func seesEverything(_ p: Principal) -> Bool { policy.seesEverything(p) }

    /// Closes a half-closed client once nothing it asked for is still in flight.
    func closeIfDone(_ peer: Peer) {
        if peer.conn.peerShutdown && peer.inflight == 0 && !peer.closed { peer.conn.closeAfterFlush() }
    }

    /// Counts a refused connection; logs as `Admission` says (at most one line per
    /// `Admission.refusalLogMs`).
    func noteRefusal(_ limit: String) {
        switch peerTable.admission.refused(limit, nowMs: loop.nowMs) {
        case .none: break
        case .logNow(let summary): logRefusals(summary)
        case .logAfter(let ms):
            peerTable.refusalLogTimer = loop.after(ms: ms, unref: true) { [unowned self] in
                self.peerTable.refusalLogTimer = nil
                if let summary = self.peerTable.admission.logTimerFired(nowMs: self.loop.nowMs) { self.logRefusals(summary) }
            }
        }
    }

    private func logRefusals(_ s: Admission<Peer>.Summary) {
        log.warn("connections refused", ["count": s.count, "by_limit": s.byLimit, "clients": clientCount, "total": s.total])
    }

    /// After a burst of clients went away, asks the allocator to return free memory to the
    /// system (glibc keeps freed heap otherwise), once the burst is over.
    func clientGone() {
        peerTable.closedSinceTrim += 1
        guard peerTable.closedSinceTrim >= Bus.trimAfterClosedClients else { return }
        releaseFreeMemorySoon()
    }

    /// Returns free memory to the system one second from now (once for a burst): after many
    /// clients went away, or one that did not read its replies (it held a lot).
    func releaseFreeMemorySoon() {
        guard peerTable.trimTimer == nil else { return }
        peerTable.trimTimer = loop.after(ms: 1_000, unref: true) { [unowned self] in
            self.peerTable.trimTimer = nil
            self.peerTable.closedSinceTrim = 0
            System.releaseFreeMemory()
        }
    }
    static let trimAfterClosedClients = 256

    func peerClosed(_ peer: Peer) {
        guard !peer.closed else { return }
        peer.closed = true
        peerTable.peers[peer.id] = nil
        hostState.stateRevision &+= 1
        // Its batch's place (which holds the peer: a cycle) and what it gathered go now.
        peer.batchInProgress = nil
        if !peer.isPlugin {
            peerTable.admission.remove(peer, uid: peer.credentials?.uid)
            if let uid = peer.credentials?.uid, peerTable.admission.members(ofUid: uid).isEmpty { peerTable.uidWork[uid] = nil }
            clientGone()
        }
        for m in peer.provided where peerTable.provided[m] === peer { peerTable.provided[m] = nil }
        peerTable.subscriptions.remove(peer.id, from: peer.subscriptions)
        if !monitoring.monitors.isEmpty { monitorRemove(peer) }
        // Requests that peer was serving fail now, not at their timeout.
        failPending(
            targeting: peer,
            RPCError(
                .pluginUnavailable, "\(peer.label) disconnected with the request in flight",
                data: ["reason": "disconnected"]))
        if let slot = peer.slot {
            pluginChannelClosed(slot, peer)
        } else if !hostState.shuttingDown {
            // Plugins that keep per-client state (MA's "app went away") subscribe to this.
            publish(topic: HostTopic.clientClosed, params: ["client": .int(Int64(peer.id))])
        }
    }

    /// Where a call of `method` by `peer` goes (`RoutingPolicy.Decision`).
    typealias Route = RoutingPolicy.Decision<Peer>

    /// The routing decision (`RoutingPolicy.decide`) over the live slots and provided methods.
    /// `field` reads a top-level params string for the consent template (nil when absent or not a
    /// string).
    func route(_ peer: Peer, _ principal: Principal, _ method: String, field: (String) -> String?) -> Route {
        policy.decide(
            principal, method, tables: BusRoutingTables(slots: pluginSet.slots, provided: peerTable.provided), consent: consent,
            shuttingDown: hostState.shuttingDown, field: field)
    }

    /// Forwards a request with a host-issued id: the line with only its id's bytes (`idSpan`)
    /// replaced (a parsed message is never re-serialised).
    func forward(
        _ peer: Peer, _ principal: Principal, _ line: UnsafeRawBufferPointer, idSpan span: Range<Int>, to target: Peer,
        timeoutMs: UInt64, method: String, answers: Envelope.Answers? = nil
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
        let hostId = forwarder.nextRequestId
        forwarder.nextRequestId += 1
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
        if let b = forwarder.currentBatch, b.peer === peer {
            b.outstanding += 1
            origin = .batch(b, originalId: original)
        } else {
            origin = .peer(peer, originalId: original)
        }
        if !monitoring.monitors.isEmpty {
            monitoring.traces[hostId] = MonitorTrace(method: method, startNs: Loop.hrtimeNs)
            monitorRequest(peer, principal, method, line, id: original, to: target.label)
        }
        var entry = Pending(origin: origin, target: target, principal: principal)
        if let slot = target.slot, !slot.continuing.isEmpty { entry.continues = slot.continuing.contains(method) }
        addPending(hostId, entry, deadlineMs: loop.nowMs + timeoutMs)
        if let answers { forwarder.pendingAnswers[hostId] = answers }
        peer.inflight += 1
        peer.requestsSent += 1
        counters.routed += 1
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

    func isPermitted(_ method: String, _ p: Principal) -> Bool { policy.isPermitted(method, p) }
}

/// The counters `bus.status` reports (`counters`).
struct BusCounters {
    var routed: UInt64 = 0
    /// Calls refused by each consent switch.
    var consentRefused: [String: UInt64] = [:]
    /// Messages (requests and answers) routed without a json-c tree (Bus+FastPath).
    var fastRouted: UInt64 = 0
    var timeouts: UInt64 = 0
    var protocolErrors: UInt64 = 0
    var published: UInt64 = 0
    /// Times a client's input was held because the plugin it sent to was congested.
    var heldForCongestion: UInt64 = 0
    /// JSON-RPC batches received.
    var batches: UInt64 = 0
    /// Clients disconnected for not reading their replies (`closeAboveQueuedBytes`, or their uid
    /// over `maxQueuedBytesPerUid`).
    var slowReadersClosed: UInt64 = 0
    /// Publications not queued to a client because its uid had `maxQueuedBytesPerUid` queued.
    var droppedForUidQueue: UInt64 = 0
    /// Monitors disconnected for not reading their events (`maxMonitorQueuedBytes`).
    var monitorsDropped: UInt64 = 0
    /// Requests the host answered for their plugin once a call naming them succeeded (`_answers`).
    var answeredOnSuccess: UInt64 = 0
}
