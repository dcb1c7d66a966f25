import PylonCore

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
    var subscriptions: [TopicPattern] = []
    /// Methods this client serves for others (`bus.provide`).
    var provided: Set<String> = []
    /// Notifications not delivered because the peer was not reading (slow reader).
    var droppedNotifications: UInt64 = 0
    var requestsSent: UInt64 = 0
    /// Plugins: true once `bus.hello` succeeded.
    var handshaken = false
    var closed = false

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

/// A request the host forwarded and whose reply it awaits, keyed by the host-issued id.
struct Pending {
    enum Origin {
        /// Forwarded for a peer: its own id (as JSON text) is restored on the reply.
        case peer(Peer, originalId: String)
        /// Issued by the host itself (heartbeats, callbacks).
        case host((Result<JSON, RPCError>) -> Void)
    }
    let origin: Origin
    let target: Peer
    let deadlineMs: UInt64
}
