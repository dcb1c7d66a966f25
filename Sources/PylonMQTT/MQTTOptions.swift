import PylonCore

/// How an `MQTTClient` connects: broker address, identity, session, security and reconnection.
/// Read from a plugin's or program's configuration with `MQTTOptions(json:)`.
public struct MQTTOptions: Sendable, Equatable {
    /// One broker address.
    public struct Broker: Sendable, Equatable, CustomStringConvertible {
        public var host: String
        public var port: Int32
        public init(host: String, port: Int32) {
            self.host = host
            self.port = port
        }
        public var description: String { host.contains(":") ? "[\(host)]:\(port)" : "\(host):\(port)" }

        /// `HOST:PORT` or `[V6HOST]:PORT` (`localhost` is 127.0.0.1); nil when malformed.
        public init?(parsing s: String) {
            guard let colon = s.lastIndex(of: ":"), let p = Int32(s[s.index(after: colon)...]), (1...65535).contains(p) else {
                return nil
            }
            var h = String(s[..<colon])
            if h.hasPrefix("[") && h.hasSuffix("]") { h = String(h.dropFirst().dropLast()) }
            if h == "localhost" { h = "127.0.0.1" }
            guard !h.isEmpty, h.utf8.count <= 255 else { return nil }
            self.init(host: h, port: p)
        }
    }

    /// Most broker addresses a client accepts (`brokers`).
    public static let maxBrokers = 16

    /// The single broker address (used when `brokers` is empty).
    public var host = "127.0.0.1"
    public var port: Int32 = 1883
    /// The nodes of a broker cluster, tried in order: after a failed connect or a lost
    /// connection the client goes on with the next one (after the usual backoff), so a
    /// persistent session kept by the cluster is resumed on another node. Empty: `host`/`port`.
    public var brokers: [Broker] = []
    /// The addresses the client cycles through.
    public var addresses: [Broker] { brokers.isEmpty ? [Broker(host: host, port: port)] : brokers }
    /// The MQTT client id. A persistent session needs a stable one (the push plugin derives it
    /// from the device's install id).
    public var clientId: String
    /// false: a persistent session (MQTT 3.1.1 clean session off); the broker keeps this client's
    /// subscriptions and its QoS 1 messages while it is offline.
    public var cleanSession = false
    /// MQTT keepalive (seconds): a PINGREQ goes out when nothing else did for this long, and
    /// the client's only periodic wake-up is this interval.
    public var keepaliveS: Int32 = 60
    /// 4 (3.1.1) or 5. Version 5 lets a publisher set a message expiry interval.
    public var protocolVersion: Int32 = 4
    /// With `protocolVersion` 5: a broker that refuses MQTT 5 (CONNACK "unacceptable protocol
    /// version", as nats-server and RabbitMQ 3.10 answer) is spoken to in 3.1.1 from then on
    /// (config `"protocol": "auto"`).
    public var protocolFallback = false
    public var username: String?
    public var password: String?
    /// TLS: the CA file turns TLS on; a client certificate and key are optional.
    public var caFile: String?
    public var certFile: String?
    public var keyFile: String?
    /// Reconnection backoff: `initial` doubling to `max`, each delay with ±`jitter` (fraction).
    public var backoffInitialMs: UInt64 = 250
    public var backoffMaxMs: UInt64 = 30_000
    public var backoffJitter = 0.2
    /// Messages read per readable event before yielding to the loop.
    public var maxPacketsPerRead: Int32 = 64

    /// Configuration entries `init(json:)` ignored, each with why (the caller logs them).
    public var ignored: [String] = []

    public init(clientId: String) { self.clientId = clientId }

    /// Reads `host`, `port`, `brokers` (a list of `"HOST:PORT"`, at most `maxBrokers`),
    /// `keepaliveS`, `protocol` (`"3.1.1"`, `"5"` or `"auto"`: 5, falling back to 3.1.1 when
    /// refused), `username`, `password`, `caFile`, `certFile`, `keyFile`, `backoffInitialMs`,
    /// `backoffMaxMs` from `json` over the defaults; what it cannot use is listed in `ignored`.
    public init(json: JSON?, clientId: String) {
        self.clientId = clientId
        guard let j = json else { return }
        if let v = j["host"]?.stringValue { host = v }
        if let v = j["port"]?.intValue, (1...65535).contains(v) { port = Int32(v) }
        if let list = j["brokers"] {
            let items = list.arrayValue ?? []
            if list.arrayValue == nil { ignored.append("brokers: not a list of \"HOST:PORT\" strings") }
            for item in items {
                guard let b = item.stringValue.flatMap(Broker.init(parsing:)) else {
                    ignored.append("brokers: \(item.serialized) is not HOST:PORT")
                    continue
                }
                guard brokers.count < MQTTOptions.maxBrokers else {
                    ignored.append("brokers: more than \(MQTTOptions.maxBrokers) addresses; \(b) and later ignored")
                    break
                }
                brokers.append(b)
            }
        }
        if let v = j["keepaliveS"]?.intValue, (5...3600).contains(v) { keepaliveS = Int32(v) }
        if let v = j["protocol"]?.stringValue {
            switch v {
            case "5": protocolVersion = 5
            case "auto":
                protocolVersion = 5
                protocolFallback = true
            case "3.1.1", "4": protocolVersion = 4
            default: ignored.append("protocol: \(v) is not 3.1.1, 5 or auto")
            }
        }
        username = j["username"]?.stringValue
        password = j["password"]?.stringValue
        caFile = j["caFile"]?.stringValue
        certFile = j["certFile"]?.stringValue
        keyFile = j["keyFile"]?.stringValue
        if let v = j["backoffInitialMs"]?.intValue, v > 0 { backoffInitialMs = UInt64(v) }
        if let v = j["backoffMaxMs"]?.intValue, v > 0 { backoffMaxMs = UInt64(v) }
    }
}
