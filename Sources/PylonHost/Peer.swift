import PylonCore
import PylonProtocol

/// One end of the bus the host talks to: a client connection or a plugin's channel.
final class Peer {
    enum Kind {
        case client(PeerCredentials?)
        case plugin(PluginSlot)
    }

    let id: UInt64
    let kind: Kind
    let conn: Connection
    let connectedAtMs: UInt64
    /// Requests this peer sent that still await a reply.
    var inflight = 0
    /// Topic patterns: a client's `bus.subscribe`s, a plugin's manifest `subscribes` (from its
    /// handshake); mirrored in `Bus.subscriptions`.
    var subscriptions: [TopicPattern] = []
    /// Methods this client serves for others (`bus.provide`).
    var provided: Set<String> = []
    /// Notifications not delivered because the peer was not reading (slow reader).
    var droppedNotifications: UInt64 = 0
    var requestsSent: UInt64 = 0
    /// When the peer last sent a message (a plugin answering anything is not hung).
    var lastInboundMs: UInt64 = 0
    /// Clients: `,"_pylon":{…}` for requests the client makes itself (`Bus.callerJSON`), built at
    /// its first request to a plugin that wants caller information; cleared by a reload (the
    /// admin list may change).
    var callerMember: [UInt8]?
    /// Plugins: true once `bus.hello` succeeded.
    var handshaken = false
    var closed = false
    /// Bytes of replies gathered in this peer's open batches and not yet queued to `conn`: they
    /// count toward its output bounds as queued bytes do (`heldBytes`).
    var batchBytes = 0
    /// The batch line being worked through over several loop turns (`Bus.continueBatch`): its
    /// members cost what they would cost as lines of their own.
    var batchInProgress: BatchCursor?

    /// What the host holds for this peer: output queued to it, and its open batches' replies.
    var heldBytes: Int { conn.queuedBytes + batchBytes }
    /// Clients with known credentials: the work their uid's connections took in this loop turn
    /// (`Bus.maxWorkPerUidPerTurn`), one object shared by them.
    var uidWork: UidTurnWork?

    init(id: UInt64, kind: Kind, conn: Connection, now: UInt64) {
        self.id = id
        self.kind = kind
        self.conn = conn
        connectedAtMs = now
    }

    var isPlugin: Bool { if case .plugin = kind { return true }; return false }
    var slot: PluginSlot? { if case .plugin(let s) = kind { return s }; return nil }
    var credentials: PeerCredentials? { if case .client(let c) = kind { return c }; return nil }

    var label: String {
        switch kind {
        case .client: return "client#\(id)"
        case .plugin(let s): return "plugin:\(s.config.name)"
        }
    }
}

/// The work units one uid's client connections took together in one loop turn.
final class UidTurnWork {
    var turn: UInt64 = .max
    var units = 0
}

/// Who a message acts for: the subject of permission rules, disclosure and the caller information
/// plugins receive. A client's request acts for that client; a plugin's request acts for the
/// plugin itself, or — when it names a request it is serving (`_onBehalfOf`) — for the client that
/// started that call chain, so a plugin cannot be used to reach what the client may not.
struct Principal: Equatable {
    /// The plugin that sent the message; nil when a client sent it.
    var plugin: String?
    /// The client at the start of the call chain (connection id), if there is one.
    var client: UInt64?
    var credentials: PeerCredentials?

    /// The host's own requests (heartbeats, callbacks).
    static let host = Principal()

    static func client(_ peer: Peer) -> Principal {
        Principal(plugin: nil, client: peer.id, credentials: peer.credentials)
    }
    /// `via`: the principal of the request the plugin is serving, when it acts on its behalf.
    static func plugin(_ name: String, via: Principal? = nil) -> Principal {
        Principal(plugin: name, client: via?.client, credentials: via?.credentials)
    }

    /// True when a client is at the start of the chain (its credentials decide).
    var actsForClient: Bool { client != nil }
}

/// A request the host forwarded and whose reply it awaits, keyed by the host-issued id.
struct Pending {
    enum Origin {
        /// Forwarded for a peer: its own id (as JSON text) is restored on the reply.
        case peer(Peer, originalId: String)
        /// Forwarded for a member of a batch: its reply, with its own id, goes into the batch.
        case batch(BatchReply, originalId: String)
        /// Issued by the host itself (heartbeats, callbacks).
        case host((Result<JSON, RPCError>) -> Void)
    }
    let origin: Origin
    let target: Peer
    /// Issued by the host itself, not forwarded for anyone.
    var isHostCall: Bool {
        if case .host = origin { return true }
        return false
    }
    /// Whom the request acts for; inherited by calls the target makes on its behalf.
    var principal = Principal.host
    /// The target carries on with it after the deadline (`PluginSlot.continuing`): the deadline
    /// is answered `-32008` (pending), not `-32002`.
    var continues = false
}
