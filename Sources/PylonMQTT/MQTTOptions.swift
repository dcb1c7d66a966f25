import PylonCore

/// How an `MQTTClient` connects: broker address, identity, session, security and reconnection.
/// Read from a plugin's or program's configuration with `MQTTOptions(json:)`.
public struct MQTTOptions: Sendable, Equatable {
    public var host = "127.0.0.1"
    public var port: Int32 = 1883
    /// The MQTT client id. A persistent session needs a stable one (the push plugin derives it
    /// from the device's install id).
    public var clientId: String
    /// false: a persistent session (MQTT 3.1.1 clean session off); the broker keeps this client's
    /// subscriptions and its QoS 1 messages while it is offline.
    public var cleanSession = false
    /// MQTT keepalive (seconds): a PINGREQ goes out when nothing else did for this long, and
    /// the client's only periodic wake-up is this interval.
    public var keepaliveS: Int32 = 60
    /// 3 (3.1.1) or 5. Version 5 lets a publisher set a message expiry interval.
    public var protocolVersion: Int32 = 4
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

    public init(clientId: String) { self.clientId = clientId }

    /// Reads `host`, `port`, `keepaliveS`, `protocol` (`"3.1.1"`/`"5"`), `username`, `password`,
    /// `caFile`, `certFile`, `keyFile`, `backoffInitialMs`, `backoffMaxMs` from `json` over the defaults.
    public init(json: JSON?, clientId: String) {
        self.clientId = clientId
        guard let j = json else { return }
        if let v = j["host"]?.stringValue { host = v }
        if let v = j["port"]?.intValue, (1...65535).contains(v) { port = Int32(v) }
        if let v = j["keepaliveS"]?.intValue, (5...3600).contains(v) { keepaliveS = Int32(v) }
        if let v = j["protocol"]?.stringValue { protocolVersion = v == "5" ? 5 : 4 }
        username = j["username"]?.stringValue
        password = j["password"]?.stringValue
        caFile = j["caFile"]?.stringValue
        certFile = j["certFile"]?.stringValue
        keyFile = j["keyFile"]?.stringValue
        if let v = j["backoffInitialMs"]?.intValue, v > 0 { backoffInitialMs = UInt64(v) }
        if let v = j["backoffMaxMs"]?.intValue, v > 0 { backoffMaxMs = UInt64(v) }
    }
}
