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

    var peers: [UInt64: Peer] = [:]
    /// Connection ids are unique across restarts of pylond too (they start at the wall clock in
    /// ms × 1000, below 2^53), so a plugin that kept state about a client id from an earlier
    /// host run cannot mistake a new client for it.
    private var nextPeerId = UInt64(max(0, System.wallClockMs())) * 1000
    var pending = PendingTable<Pending>()
    var nextRequestId: Int64 = 1
    var slots: [String: PluginSlot] = [:] { didSet { slotSetRevision &+= 1 } }
    /// Bumped whenever a slot is added, removed or replaced (`ReportCache.Version`).
    var slotSetRevision: UInt64 = 0
    /// Slots a reload removed or replaced whose process has not exited yet: kept until it has,
    /// so shutdown waits for them too (a plugin never outlives the host) and a replacement does
    /// not start beside them.
    var retiring: [PluginSlot] = []
    var slotOrder: [String] = [] { didSet { slotSetRevision &+= 1 } }
    /// Every peer's topic patterns (clients' `bus.subscribe`, plugins' manifest `subscribes`).
    var subscriptions = SubscriptionIndex<UInt64>()
    /// Methods served by clients (`bus.provide`), by full name.
    var provided: [String: Peer] = [:] { didSet { providedRevision &+= 1 } }
    var providedRevision: UInt64 = 0
    /// `bus.describe` and `bus.status` answers, built once and shared (`ReportCache`).
    var reports = ReportCache()
    /// Bumped when the host's state that `bus.status` shows changes outside a plugin slot: a
    /// client came or went, a host method that changes state ran.
    var stateRevision: UInt64 = 0

    var consent = ConsentStore()
    var consentRefused: [String: UInt64] = [:]
    var consentPath: String { config.stateDir + "/consent.json" }

    /// Armed for the earliest pending deadline only (none while nothing is pending).
    var sweepTimer: Timer!
    var sweepArmedForMs: UInt64?
    let startedAtMs: UInt64
    var shuttingDown = false
    var onShutdownComplete: () -> Void = {}

    /// Counters for bus.status (`BusCounters`).
    var counters = BusCounters()
    /// The JSON-RPC batch whose members are being handled now.
    var currentBatch: BatchReply?
    /// While a request that waited for its plugin to start is handled again: its deadline
    /// (parked again, it keeps it; Bus+StartWait.swift).
    var replayDeadlineMs: UInt64?
    /// Connections watching traffic (`bus.monitor`, Bus+Monitor); empty costs one test per hook.
    var monitors: [MonitorEntry] = []
    /// Forwarded requests' method and start, by host id, kept only while a monitor is connected
    /// (so `Pending` and the routing path stay as they are without one).
    var monitorTraces: [Int64: MonitorTrace] = [:]
    /// `_answers` of forwarded plugin calls, by the host id of the call (Bus+Answers).
    var pendingAnswers: [Int64: Envelope.Answers] = [:]

    /// Called once every enabled plugin has left `starting` for the first time.
    public var onReady: () -> Void = {}
    /// Set by `Host`: re-reads the configuration file, checks it and applies it, then calls back
    /// with the answer (`bus.reload`; the plugins check it asynchronously, `Host.reload`).
    public var onReloadRequest: ((@escaping (Result<JSON, RPCError>) -> Void) -> Void)?
    /// `bus.reload` requests waiting for the next loop turn (`deferReload`).
    var reloadWaiters: [(Peer, String?)] = []
    var reloadTimer: Timer?
    var readyReported = false
    var addingPlugins = false

    /// `hostUid`: pylond's own uid (`getuid()`), which may `bus.reload` (`RoutingPolicy.hostUid`).
    public init(loop: Loop, config: HostConfig, hostUid: UInt32) {
        self.loop = loop
        self.config = config
        policy = RoutingPolicy(config, hostUid: hostUid)
        tokener = Tokener(maxDepth: config.limits.maxDepth)
        startedAtMs = loop.nowMs
        sweepTimer = Timer(loop: loop, unref: true) { [unowned self] in
            self.sweepArmedForMs = nil
            self.sweepTimeouts()
        }
        loadConsent()
    }

    /// Client connections in all and per uid (their count is the per-uid connection limit's;
    /// their queued bytes are the per-uid queue bound's), and the refusal log's throttle.
    var admission = Admission<Peer>()
    /// Armed while a refusal summary is due (`Admission.LogAction.logAfter`).
    var refusalLogTimer: Timer?
    /// Connected clients.
    public var clientCount: Int { admission.count }
    var refusedTotal: UInt64 { admission.refusedTotal }
    /// Each uid's work in the current loop turn, shared by its connections (`Peer.uidWork`).
    var uidWork: [UInt32: UidTurnWork] = [:]
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
        if case .refuse(let limit, let error) = admission.decide(uid: creds?.uid, shuttingDown: shuttingDown, limits: config.limits) {
            conn.refuse(line: String(decoding: Envelope.error(id: .null, error), as: UTF8.self))
            noteRefusal(limit)
            return
        }
        let peer = newPeer(kind: .client(creds), conn: conn)
        admission.admit(peer, uid: creds?.uid)
        stateRevision &+= 1
        if let uid = creds?.uid {
            let work = uidWork[uid] ?? UidTurnWork()
            uidWork[uid] = work
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
        RoutingPolicy.principal(client: peer.isPlugin ? nil : (peer.id, peer.credentials), plugin: peer.slot?.config.name, via: via) {
            guard let p = pending[$0], p.target === peer else { return nil }
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
        switch admission.refused(limit, nowMs: loop.nowMs) {
        case .none: break
        case .logNow(let summary): logRefusals(summary)
        case .logAfter(let ms):
            refusalLogTimer = loop.after(ms: ms, unref: true) { [unowned self] in
                self.refusalLogTimer = nil
                if let summary = self.admission.logTimerFired(nowMs: self.loop.nowMs) { self.logRefusals(summary) }
            }
        }
    }

    private func logRefusals(_ s: Admission<Peer>.Summary) {
        log.warn("connections refused", ["count": s.count, "by_limit": s.byLimit, "clients": clientCount, "total": s.total])
    }

    /// After a burst of clients went away, asks the allocator to return free memory to the
    /// system (glibc keeps freed heap otherwise), once the burst is over.
    func clientGone() {
        closedSinceTrim += 1
        guard closedSinceTrim >= Bus.trimAfterClosedClients else { return }
        releaseFreeMemorySoon()
    }

    /// Returns free memory to the system one second from now (once for a burst): after many
    /// clients went away, or one that did not read its replies (it held a lot).
    func releaseFreeMemorySoon() {
        guard trimTimer == nil else { return }
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
        stateRevision &+= 1
        // Its batch's place (which holds the peer: a cycle) and what it gathered go now.
        peer.batchInProgress = nil
        if !peer.isPlugin {
            admission.remove(peer, uid: peer.credentials?.uid)
            if let uid = peer.credentials?.uid, admission.members(ofUid: uid).isEmpty { uidWork[uid] = nil }
            clientGone()
        }
        for m in peer.provided where provided[m] === peer { provided[m] = nil }
        subscriptions.remove(peer.id, from: peer.subscriptions)
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

    /// Where a call of `method` by `peer` goes (`RoutingPolicy.Decision`).
    typealias Route = RoutingPolicy.Decision<Peer>

    /// The routing decision (`RoutingPolicy.decide`) over the live slots and provided methods.
    /// `field` reads a top-level params string for the consent template (nil when absent or not a
    /// string).
    func route(_ peer: Peer, _ principal: Principal, _ method: String, field: (String) -> String?) -> Route {
        policy.decide(
            principal, method, tables: BusRoutingTables(slots: slots, provided: provided), consent: consent,
            shuttingDown: shuttingDown, field: field)
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
        var entry = Pending(origin: origin, target: target, principal: principal)
        if let slot = target.slot, !slot.continuing.isEmpty { entry.continues = slot.continuing.contains(method) }
        addPending(hostId, entry, deadlineMs: loop.nowMs + timeoutMs)
        if let answers { pendingAnswers[hostId] = answers }
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
