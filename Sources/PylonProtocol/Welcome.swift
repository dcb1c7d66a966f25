import PylonCore

/// The host's answer to a plugin's `bus.hello`: what the plugin needs to start serving. One type
/// for both sides: the host encodes it (`json`), the plugin kit decodes it (`init(json:)`).
public struct Welcome: Equatable, Sendable {
    /// The protocol version the host will speak with this plugin.
    public var protocolVersion: Int
    /// The plugin's `config` object from the host configuration.
    public var config: JSON
    /// A directory only this plugin writes (`<stateDir>/plugins/<name>`).
    public var stateDir: String
    /// The consent state at handshake time, as `consent.list` returns it (read it with
    /// `consentSnapshot`); later changes arrive as `consent.changed`.
    public var consent: JSON
    /// How often the host will send `bus.heartbeat`.
    public var heartbeatMs: UInt64
    /// The host's protocol limits (`docs/CONFIG.md`), for plugins that size their own buffers.
    public var limits: JSON

    public init(
        protocolVersion: Int = Manifest.currentProtocol, config: JSON = .object([:]), stateDir: String = "",
        consent: JSON = ConsentSnapshot().json, heartbeatMs: UInt64 = 0, limits: JSON = .object([:])
    ) {
        self.protocolVersion = protocolVersion
        self.config = config
        self.stateDir = stateDir
        self.consent = consent
        self.heartbeatMs = heartbeatMs
        self.limits = limits
    }

    public var json: JSON {
        [
            "protocol": .int(Int64(protocolVersion)), "config": config, "stateDir": .string(stateDir),
            "consent": consent, "heartbeatMs": .int(Int64(clamping: heartbeatMs)), "limits": limits,
        ]
    }

    /// Reads a welcome; absent members take their defaults (a host may add members).
    public init(json w: JSON) {
        protocolVersion = w["protocol"]?.intValue.map { Int($0) } ?? Manifest.currentProtocol
        config = w["config"] ?? .object([:])
        stateDir = w["stateDir"]?.stringValue ?? ""
        consent = w["consent"] ?? ConsentSnapshot().json
        heartbeatMs = w["heartbeatMs"]?.intValue.map { UInt64(max(0, $0)) } ?? 0
        limits = w["limits"] ?? .object([:])
    }

    public var consentSnapshot: ConsentSnapshot { ConsentSnapshot(json: consent) }
}

/// The part of the consent state a plugin acts on: the master switch and the effective value of
/// every named switch (absent = granted). `consent.list` and the welcome carry more (epoch, the
/// operator and app layers); this reads what plugins need.
public struct ConsentSnapshot: Equatable, Sendable {
    public var master: Bool
    public var switches: [String: Bool]

    public init(master: Bool = true, switches: [String: Bool] = [:]) {
        self.master = master
        self.switches = switches
    }

    public init(json j: JSON?) {
        master = j?["master"]?.boolValue ?? true
        var s: [String: Bool] = [:]
        if let sw = j?["switches"]?.objectValue {
            for (k, v) in sw { if let b = v.boolValue { s[k] = b } }
        }
        switches = s
    }

    public var json: JSON {
        var sw = JSONObject()
        for k in switches.keys.sorted() { sw[k] = .bool(switches[k]!) }
        return ["master": .bool(master), "switches": .object(sw)]
    }
}
