import PylonCore
import PylonProtocol

/// `Bus`'s state in named parts: what each part holds is read and changed by the `Bus+*.swift`
/// extension of its concern; the decisions over it are the value types (`RoutingPolicy`,
/// `Admission`, `SubscriptionIndex`, `PendingTable`, `PluginLifecycle`). Classes, so that a
/// handler changing one member (a peer closing while its pending requests fail) never holds
/// the whole part.

/// The connected peers (clients and plugin channels), their admission and per-uid work, and
/// what clients added to routing: their subscriptions and the methods they provide.
final class PeerTable {
    var peers: [UInt64: Peer] = [:]
    /// Connection ids are unique across restarts of pylond too (they start at the wall clock in
    /// ms × 1000, below 2^53), so a plugin that kept state about a client id from an earlier
    /// host run cannot mistake a new client for it.
    var nextPeerId = UInt64(max(0, System.wallClockMs())) * 1000
    /// Client connections in all and per uid (their count is the per-uid connection limit's;
    /// their queued bytes are the per-uid queue bound's), and the refusal log's throttle.
    var admission = Admission<Peer>()
    /// Armed while a refusal summary is due (`Admission.LogAction.logAfter`).
    var refusalLogTimer: Timer?
    /// Each uid's work in the current loop turn, shared by its connections (`Peer.uidWork`).
    var uidWork: [UInt32: UidTurnWork] = [:]
    /// Clients closed since the allocator was last asked to return free memory.
    var closedSinceTrim = 0
    var trimTimer: Timer?
    /// Every peer's topic patterns (clients' `bus.subscribe`, plugins' manifest `subscribes`).
    var subscriptions = SubscriptionIndex<UInt64>()
    /// Methods served by clients (`bus.provide`), by full name.
    var provided: [String: Peer] = [:] { didSet { providedRevision &+= 1 } }
    var providedRevision: UInt64 = 0
}

/// Requests in flight: the forwarded-request table with its sweep timer, the host's id
/// counter, the batch being handled, and what a forwarded call answers on success.
final class Forwarder {
    var pending = PendingTable<Pending>()
    var nextRequestId: Int64 = 1
    /// Armed for the earliest pending deadline only (none while nothing is pending); set once by
    /// `Bus.init`.
    var sweepTimer: Timer!
    var sweepArmedForMs: UInt64?
    /// The JSON-RPC batch whose members are being handled now.
    var currentBatch: BatchReply?
    /// While a request that waited for its plugin to start is handled again: its deadline
    /// (parked again, it keeps it; Bus+StartWait.swift).
    var replayDeadlineMs: UInt64?
    /// `_answers` of forwarded plugin calls, by the host id of the call (Bus+Answers).
    var pendingAnswers: [Int64: Envelope.Answers] = [:]
}

/// The configured plugins: their slots by name and in order, the slots a reload retired whose
/// process has not exited yet, and the first start's progress.
final class PluginSet {
    var slots: [String: PluginSlot] = [:] { didSet { slotSetRevision &+= 1 } }
    var slotOrder: [String] = [] { didSet { slotSetRevision &+= 1 } }
    /// Bumped whenever a slot is added, removed or replaced (`ReportCache.Version`).
    var slotSetRevision: UInt64 = 0
    /// Slots a reload removed or replaced whose process has not exited yet: kept until it has,
    /// so shutdown waits for them too (a plugin never outlives the host) and a replacement does
    /// not start beside them.
    var retiring: [PluginSlot] = []
    /// Every enabled plugin has left `starting` once (`Bus.onReady` was called).
    var readyReported = false
    var addingPlugins = false
}

/// Connections watching traffic (`bus.monitor`, Bus+Monitor); empty costs one test per hook.
final class MonitorSet {
    var monitors: [MonitorEntry] = []
    /// Forwarded requests' method and start, by host id, kept only while a monitor is connected
    /// (so `Pending` and the routing path stay as they are without one).
    var traces: [Int64: MonitorTrace] = [:]
}

/// The host's own run: when it started, whether it is stopping, the reloads asked for, the
/// callbacks `Host` set, and the `bus.describe`/`bus.status` answers built for its state.
final class HostState {
    let startedAtMs: UInt64
    var shuttingDown = false
    var onShutdownComplete: () -> Void = {}
    /// Called once every enabled plugin has left `starting` for the first time.
    var onReady: () -> Void = {}
    /// Re-reads the configuration file, checks it and applies it, then calls back with the
    /// answer (`Host.reload`).
    var onReloadRequest: ((@escaping (Result<JSON, RPCError>) -> Void) -> Void)?
    /// `bus.reload` requests waiting for the next loop turn (`deferReload`).
    var reloadWaiters: [(Peer, String?)] = []
    var reloadTimer: Timer?
    /// `bus.describe` and `bus.status` answers, built once and shared (`ReportCache`).
    var reports = ReportCache()
    /// Bumped when the host's state that `bus.status` shows changes outside a plugin slot: a
    /// client came or went, a host method that changes state ran.
    var stateRevision: UInt64 = 0

    init(startedAtMs: UInt64) { self.startedAtMs = startedAtMs }
}
