import PylonCore
import PylonProtocol

/// The value-type parts of `bus.monitor` (docs/PROTOCOL.md "Monitoring"): what a monitor asked
/// for (`MonitorFilter`), one observed message (`MonitorEvent`, rendered as a `bus.monitor.event`
/// notification) and the bound on what a monitor may have queued (`MonitorSink`). The bus
/// (`Bus+Monitor`) only looks at them while at least one monitor is connected.

/// Which methods a monitor sees, and whether it wants the params.
public struct MonitorFilter: Equatable, Sendable {
    public let pattern: TopicPattern
    public let verbose: Bool

    public init(pattern: String = "*", verbose: Bool = false) {
        self.pattern = TopicPattern(pattern)
        self.verbose = verbose
    }

    public func wants(_ method: String) -> Bool { pattern.matches(method) }

    /// Reads `bus.monitor`'s params: `pattern` (a method pattern, default `*`) and `verbose`.
    public static func parse(_ params: JSON?) throws(RPCError) -> MonitorFilter {
        var pattern = "*"
        if let p = params?["pattern"], p != .null {
            guard let s = p.stringValue, InboundEnvelope.isValidMethodName(s) else {
                throw RPCError(
                    .invalidParams, "params.pattern must be 1-\(InboundEnvelope.maxMethodBytes) bytes of printable ASCII without spaces")
            }
            pattern = s
        }
        var verbose = false
        if let v = params?["verbose"], v != .null {
            guard let b = v.boolValue else { throw RPCError(.invalidParams, "params.verbose must be true or false") }
            verbose = b
        }
        return MonitorFilter(pattern: pattern, verbose: verbose)
    }
}

/// One message the bus routed, as a monitor sees it.
public struct MonitorEvent: Equatable, Sendable {
    public enum Kind: String, Sendable {
        /// A request routed to a plugin, a provider or the host.
        case request
        /// The answer to one (from its target, or the host's error: timeout, plugin gone, refusal).
        case reply
        /// A client's notification to a plugin method.
        case notification
        /// A publication (a plugin's notification, `bus.publish`, or a host topic).
        case publication
    }

    public var kind: Kind
    public var method: String
    /// The sender's label (`client#N`, `plugin:NAME`, `host`).
    public var from: String
    /// The receiver's label; for a publication, nil (`delivered` says to how many).
    public var to: String?
    /// The principal as JSON object text (`Bus.callerJSON`): `{"client":N,"uid":U,…}`,
    /// `{"plugin":"ma"}`, both, or `{}` for the host itself.
    public var caller: String
    /// The caller's id as it wrote it (JSON text); nil for notifications and publications.
    public var id: String?
    /// The message's size on the wire, without the newline.
    public var bytes: Int
    /// Replies: time from routing the request to its answer.
    public var latencyUs: UInt64?
    /// Replies: nil for a result, else the error's code (and its message when plain text).
    public var errorCode: Int64?
    public var errorMessage: String?
    /// Publications: how many subscribers it was queued to.
    public var delivered: Int?
    /// With `verbose`: the params (requests, notifications, publications) or the result
    /// (replies), as the JSON text that was routed.
    public var payload: String?

    public init(
        _ kind: Kind, method: String, from: String, to: String?, caller: String, id: String? = nil, bytes: Int,
        latencyUs: UInt64? = nil, errorCode: Int64? = nil, errorMessage: String? = nil, delivered: Int? = nil,
        payload: String? = nil
    ) {
        self.kind = kind
        self.method = method
        self.from = from
        self.to = to
        self.caller = caller
        self.id = id
        self.bytes = bytes
        self.latencyUs = latencyUs
        self.errorCode = errorCode
        self.errorMessage = errorMessage
        self.delivered = delivered
        self.payload = payload
    }

    /// The `bus.monitor.event` notification line (without the newline). `seq` counts the events
    /// sent to this monitor; `timeMs` is the wall clock. `caller`, `id` and `payload` are JSON
    /// text the bus produced or validated, embedded as they are; the payload only when `verbose`.
    public func line(seq: UInt64, timeMs: Int64, verbose: Bool) -> [UInt8] {
        var s = #"{"jsonrpc":"2.0","method":""# + HostMethod.monitorEvent + #"","params":{"seq":"# + String(seq)
        s += #","time_ms":"# + String(timeMs) + #","type":""# + kind.rawValue + #"","method":"#
        s += JSON.string(method).serialized + #","from":"# + JSON.string(from).serialized
        if let to { s += #","to":"# + JSON.string(to).serialized }
        s += #","caller":"# + caller
        if let id { s += #","id":"# + id }
        s += #","bytes":"# + String(bytes)
        if let latencyUs { s += #","latency_us":"# + String(latencyUs) }
        if kind == .reply {
            if let errorCode {
                s += #","result":"error","error":{"code":"# + String(errorCode)
                if let errorMessage { s += #","message":"# + JSON.string(errorMessage).serialized }
                s += "}"
            } else {
                s += #","result":"ok""#
            }
        }
        if let delivered { s += #","delivered":"# + String(delivered) }
        if verbose, let payload { s += (kind == .reply ? #","payload":"# : #","params":"#) + payload }
        s += "}}"
        return Array(s.utf8)
    }
}

/// One monitor's bound: the events queued to it (on its connection) may not exceed
/// `maxQueuedBytes`. A monitor that does not read is dropped — never waited for, so routing is
/// never slowed by it — and stays dropped.
public struct MonitorSink: Equatable, Sendable {
    public enum Verdict: Equatable, Sendable {
        case send
        /// Over the bound: the monitor is to be disconnected (once: later offers say `.ignore`).
        case drop
        /// Already dropped.
        case ignore
    }

    public let filter: MonitorFilter
    public let maxQueuedBytes: Int
    public private(set) var sent: UInt64 = 0
    public private(set) var sentBytes: UInt64 = 0
    public private(set) var dropped = false

    public init(filter: MonitorFilter, maxQueuedBytes: Int) {
        self.filter = filter
        self.maxQueuedBytes = maxQueuedBytes
    }

    /// Whether an event of `bytes` (line and newline) may be queued to a monitor that has
    /// `queuedBytes` not yet read.
    public mutating func offer(bytes: Int, queuedBytes: Int) -> Verdict {
        if dropped { return .ignore }
        guard queuedBytes + bytes <= maxQueuedBytes else {
            dropped = true
            return .drop
        }
        sent += 1
        sentBytes += UInt64(bytes)
        return .send
    }
}
