import PylonCore

#if canImport(Glibc)
import Glibc
#endif

/// Protocol limits. Each is configurable under `"limits"` and answered with a documented error.
public struct Limits: Equatable, Sendable {
    /// Longest accepted line in bytes, excluding the newline (-32006 beyond it).
    public var maxLineBytes = 1 << 20
    /// Deepest accepted JSON nesting (-32700 beyond it).
    public var maxDepth: Int32 = 64
    /// Client connections at once (-32004, then the connection is closed).
    public var maxConnections = 256
    /// Client connections of one uid at once, so one local user cannot take every slot
    /// (-32004 as above). Default: three quarters of `maxConnections`, but not below 16.
    public var maxConnectionsPerUid = 192
    static func defaultPerUid(maxConnections n: Int) -> Int { max(min(n, 16), n * 3 / 4) }
    /// Requests a connection may have awaiting replies (-32004 beyond it).
    public var maxInflightPerConnection = 1024
    /// Bytes queued to a slow reader before the host stops reading its requests and drops
    /// notifications to it (counted in `bus.status`).
    public var maxQueuedBytes = 8 << 20
    /// Bytes queued to a client that does not read, past which it is disconnected: the replies
    /// to requests already in flight when it stopped reading (up to `maxInflightPerConnection`,
    /// each up to `maxLineBytes`, and a provider's answer may be far larger than its question)
    /// are not held beyond this. Never below `maxQueuedBytes` in effect.
    public var closeAboveQueuedBytes = 64 << 20
    /// Bytes held for all client connections of one uid together (output not yet read, and
    /// replies gathered in open batches): beyond it publications to them are dropped (counted),
    /// and the ones holding the most are disconnected until the uid is back within it. So many
    /// connections of one user cannot hold `maxQueuedBytes` each. 16 MiB: one user that stops
    /// reading costs the host that much, whatever it sends (issue 32: 64 connections of batches).
    public var maxQueuedBytesPerUid = 16 << 20
    /// Topic patterns one connection may subscribe to.
    public var maxSubscriptionsPerConnection = 256
    /// Methods one connection may provide (`bus.provide`): every answer lists them all.
    public var maxProvidesPerConnection = 256
    /// Messages one JSON-RPC batch (an array on one line) may hold (-32600 beyond it).
    public var maxBatchMembers = 128
    /// Default time a routed request may wait for its reply (-32002).
    public var requestTimeoutMs: UInt64 = 30_000
    /// Not a limit but write batching: output to a connection is written once this many bytes
    /// are queued during a loop turn, the rest at the end of the turn (0 = only at the end).
    public var flushAboveBytes = Connection.defaultFlushAboveBytes
    /// Connections that may watch traffic at once (`bus.monitor`, admins only; -32004 beyond it).
    public var maxMonitors = 8
    /// Bytes of events queued to one monitor that has not read them: past it the monitor is
    /// disconnected (routing never waits for a monitor).
    public var maxMonitorQueuedBytes = 1 << 20
    /// Requests that may wait for one plugin to start (`starting`, `backoff`; StartWaitQueue),
    /// and the bytes of their lines: past either a request is answered -32001 at once.
    public var maxStartWaiters = 256
    public var maxStartWaitBytes = 4 << 20
    public init() {}

    public var json: JSON {
        [
            "maxLineBytes": .int(Int64(maxLineBytes)), "maxDepth": .int(Int64(maxDepth)),
            "maxConnections": .int(Int64(maxConnections)), "maxConnectionsPerUid": .int(Int64(maxConnectionsPerUid)),
            "maxInflightPerConnection": .int(Int64(maxInflightPerConnection)),
            "maxQueuedBytes": .int(Int64(maxQueuedBytes)), "closeAboveQueuedBytes": .int(Int64(closeAboveQueuedBytes)),
            "maxQueuedBytesPerUid": .int(Int64(maxQueuedBytesPerUid)),
            "maxSubscriptionsPerConnection": .int(Int64(maxSubscriptionsPerConnection)),
            "maxProvidesPerConnection": .int(Int64(maxProvidesPerConnection)),
            "maxBatchMembers": .int(Int64(maxBatchMembers)),
            "requestTimeoutMs": .int(Int64(requestTimeoutMs)), "flushAboveBytes": .int(Int64(flushAboveBytes)),
            "maxMonitors": .int(Int64(maxMonitors)), "maxMonitorQueuedBytes": .int(Int64(maxMonitorQueuedBytes)),
        ]
    }
}

/// One configured plugin.
public struct PluginConfig: Equatable, Sendable {
    public var name: String
    public var exec: String
    public var args: [String] = []
    public var env: [String: String] = [:]
    public var user: String?
    public var enabled = true
    /// Whether the plugin reads `--check-config` (`PLUGIN --check-config`, the plugin kit's and
    /// `pylon.Plugin`'s convention): `"checkConfig": false` for one that does not (a third-party
    /// plugin that would start, or fail, on that argument); the host then never runs it so
    /// and says so once in `pylond --check-config`.
    public var checkConfig = true
    public var policy = SupervisorPolicy()
    public var requestTimeoutMs: UInt64?
    /// The plugin's own section, handed to it in the handshake.
    public var config: JSON = .object([:])
}

/// A set of principals: client credentials (uids, gids) and plugins acting on their own behalf.
public struct AccessList: Equatable, Sendable {
    public var uids: [UInt32] = []
    public var gids: [UInt32] = []
    public var plugins: [String] = []
    public init(uids: [UInt32] = [], gids: [UInt32] = [], plugins: [String] = []) {
        self.uids = uids; self.gids = gids; self.plugins = plugins
    }
    public func allows(_ c: PeerCredentials) -> Bool { uids.contains(c.uid) || gids.contains(c.gid) }
}

/// A per-method permission rule, checked against the principal of every call: the client that
/// started the call chain (SO_PEERCRED credentials, also when a plugin calls on its behalf), or a
/// plugin acting on its own behalf (allowed only if the rule lists it). The first rule whose
/// pattern matches the method decides; no matching rule means allowed.
public struct PermissionRule: Equatable, Sendable {
    public var method: TopicPattern
    public var allowed: AccessList
    public init(method: TopicPattern, allowed: AccessList) { self.method = method; self.allowed = allowed }
}

/// Who may see what other principals do (docs/SECURITY.md). Admins (default: uid 0) see every
/// client in `bus.status`, may subscribe to host topics and read every uploader stream.
public struct Disclosure: Equatable, Sendable {
    public var admins = AccessList(uids: [0])
    /// Topics delivered to admin clients (and to plugins that subscribe in their manifest) only.
    public var adminTopics: [TopicPattern] = [TopicPattern("bus.*"), TopicPattern("consent.*")]
    /// Namespaces no client may `bus.provide` or publish in, configured or not.
    public var reservedNamespaces: Set<String> = ["ma", "push", "gtm", "uploader"]
    public init() {}
}

/// The host's configuration (a JSON file; see etc/pylon.json).
public struct HostConfig: Equatable, Sendable {
    public var socketPath = "/run/pylon/pylon.sock"
    public var socketMode: UInt32 = 0o660
    public var socketGroup: String?
    public var stateDir = "/var/lib/pylon"
    public var logLevel = "info"
    public var limits = Limits()
    public var plugins: [PluginConfig] = []
    public var permissions: [PermissionRule] = []
    public var disclosure = Disclosure()
    /// Directory searched for plugin executables named without a `/` (default: pylond's own).
    public var pluginDir: String?
    /// Where to write the OpenMetrics text (node_exporter's textfile collector), if anywhere.
    public var metricsTextfile: String?
    /// How often the metrics textfile is rewritten.
    public var metricsIntervalMs: UInt64 = 15_000
    public init() {}
}

public struct ConfigError: Error, CustomStringConvertible, Sendable {
    public let description: String
    init(_ d: String) { description = d }
}

extension HostConfig {
    /// Loads and validates a configuration file, then applies `PYLON_SOCKET` / `PYLON_STATE_DIR`.
    public static func load(path: String, environment: (String) -> String? = System.env) throws(ConfigError) -> HostConfig {
        try loadDocument(path: path, environment: environment).config
    }

    /// `load`, with the file's text (a plugin's problem is located in it: `line(of:in:)`).
    public static func loadDocument(
        path: String, environment: (String) -> String? = System.env
    ) throws(ConfigError) -> (config: HostConfig, text: [UInt8]) {
        let bytes: [UInt8]
        do throws(IOError) {
            bytes = try System.readFile(atPath: path)
        } catch {
            throw ConfigError("cannot read config file: \(error)")
        }
        let json: JSON
        do {
            json = try bytes.withUnsafeBytes { b throws(JSONParseError) in try JSONRef.parse(b).json }
        } catch {
            let (line, column) = bytes.withUnsafeBytes { HostConfig.jsonErrorLocation($0) }
            throw ConfigError("\(path):\(line):\(column): invalid JSON: \(error)")
        }
        if let dup = bytes.withUnsafeBytes({ RawJSON.duplicateKey(in: $0) }) {
            throw ConfigError("\(path): key \"\(dup)\" appears twice in one object")
        }
        var c = try parse(json)
        if let s = environment("PYLON_SOCKET"), !s.isEmpty { c.socketPath = s }
        if let s = environment("PYLON_STATE_DIR"), !s.isEmpty { c.stateDir = s }
        return (c, bytes)
    }

    public static func parse(_ j: JSON) throws(ConfigError) -> HostConfig {
        guard let o = j.objectValue else { throw ConfigError("config must be a JSON object") }
        var c = HostConfig()
        var r = Reader(o, path: "")
        if let s = try r.string("socket") { c.socketPath = s }
        if let m = try r.string("socketMode") {
            guard let v = UInt32(m, radix: 8), v <= 0o777 else {
                throw ConfigError("socketMode must be an octal string like \"0660\", not \"\(m)\"")
            }
            c.socketMode = v
        }
        c.socketGroup = try r.string("socketGroup")
        if let s = try r.string("stateDir") { c.stateDir = s }
        if let s = try r.string("logLevel") {
            guard Log.Level(name: s) != nil else { throw ConfigError("logLevel must be debug, info, warn or error, not \"\(s)\"") }
            c.logLevel = s
        }
        c.pluginDir = try r.string("pluginDir")
        c.metricsTextfile = try r.string("metricsTextfile")
        if let v = try r.int("metricsIntervalMs", min: 1000) { c.metricsIntervalMs = UInt64(v) }
        if let l = try r.object("limits") {
            var lr = Reader(l, path: "limits.")
            if let v = try lr.int("maxLineBytes", min: 256) { c.limits.maxLineBytes = v }
            if let v = try lr.int("maxDepth", min: 2, max: 1000) { c.limits.maxDepth = Int32(v) }
            if let v = try lr.int("maxConnections", min: 1) {
                c.limits.maxConnections = v
                c.limits.maxConnectionsPerUid = Limits.defaultPerUid(maxConnections: v)
            }
            if let v = try lr.int("maxConnectionsPerUid", min: 1) { c.limits.maxConnectionsPerUid = v }
            if let v = try lr.int("maxInflightPerConnection", min: 1) { c.limits.maxInflightPerConnection = v }
            if let v = try lr.int("maxQueuedBytes", min: 4096) { c.limits.maxQueuedBytes = v }
            if let v = try lr.int("closeAboveQueuedBytes", min: 4096) { c.limits.closeAboveQueuedBytes = v }
            if let v = try lr.int("maxQueuedBytesPerUid", min: 4096) { c.limits.maxQueuedBytesPerUid = v }
            if let v = try lr.int("maxSubscriptionsPerConnection", min: 1) { c.limits.maxSubscriptionsPerConnection = v }
            if let v = try lr.int("maxProvidesPerConnection", min: 1) { c.limits.maxProvidesPerConnection = v }
            if let v = try lr.int("maxBatchMembers", min: 1, max: 65_536) { c.limits.maxBatchMembers = v }
            if let v = try lr.int("requestTimeoutMs", min: 1) { c.limits.requestTimeoutMs = UInt64(v) }
            if let v = try lr.int("flushAboveBytes", min: 0) { c.limits.flushAboveBytes = v }
            if let v = try lr.int("maxMonitors", min: 0, max: 1024) { c.limits.maxMonitors = v }
            if let v = try lr.int("maxMonitorQueuedBytes", min: 4096) { c.limits.maxMonitorQueuedBytes = v }
            if let v = try lr.int("maxStartWaiters", min: 0) { c.limits.maxStartWaiters = v }
            if let v = try lr.int("maxStartWaitBytes", min: 0) { c.limits.maxStartWaitBytes = v }
            try lr.finish()
        }
        if let plugins = try r.array("plugins") {
            var seen = Set<String>()
            for (i, p) in plugins.enumerated() {
                guard let po = p.objectValue else { throw ConfigError("plugins[\(i)] must be an object") }
                let pc = try parsePlugin(po, path: "plugins[\(i)].")
                guard seen.insert(pc.name).inserted else { throw ConfigError("plugins[\(i)]: duplicate plugin name \(pc.name)") }
                c.plugins.append(pc)
            }
        }
        if let rules = try r.array("permissions") {
            for (i, rj) in rules.enumerated() {
                guard let ro = rj.objectValue else { throw ConfigError("permissions[\(i)] must be an object") }
                var rr = Reader(ro, path: "permissions[\(i)].")
                guard let m = try rr.string("method") else { throw ConfigError("permissions[\(i)].method is required") }
                let allowed = try rr.accessList()
                try rr.finish()
                c.permissions.append(PermissionRule(method: TopicPattern(m), allowed: allowed))
            }
        }
        if let d = try r.object("disclosure") {
            var dr = Reader(d, path: "disclosure.")
            if let a = try dr.object("admins") {
                var ar = Reader(a, path: "disclosure.admins.")
                c.disclosure.admins = try ar.accessList()
                try ar.finish()
            }
            if dr.has("adminTopics") { c.disclosure.adminTopics = try dr.stringArray("adminTopics").map(TopicPattern.init) }
            if dr.has("reservedNamespaces") { c.disclosure.reservedNamespaces = Set(try dr.stringArray("reservedNamespaces")) }
            try dr.finish()
        }
        try r.finish()
        return c
    }

    static func parsePlugin(_ o: JSONObject, path: String) throws(ConfigError) -> PluginConfig {
        var r = Reader(o, path: path)
        guard let name = try r.string("name"), isValidPluginName(name) else {
            throw ConfigError("\(path)name is required: lowercase letters, digits, '-' or '_'; not 'bus' or 'consent'")
        }
        guard let exec = try r.string("exec"), !exec.isEmpty else { throw ConfigError("\(path)exec is required") }
        var p = PluginConfig(name: name, exec: exec)
        p.args = try r.stringArray("args")
        if let env = try r.object("env") {
            for (k, v) in env {
                guard let s = v.stringValue else { throw ConfigError("\(path)env.\(k) must be a string") }
                p.env[k] = s
            }
        }
        p.user = try r.string("user")
        if let e = try r.bool("enabled") { p.enabled = e }
        if let c = try r.bool("checkConfig") { p.checkConfig = c }
        if let s = try r.string("restart") {
            guard let rp = RestartPolicy(rawValue: s) else {
                throw ConfigError("\(path)restart must be permanent, transient or temporary")
            }
            p.policy.restart = rp
        }
        if let v = try r.int("backoffInitialMs", min: 0) { p.policy.backoffInitialMs = UInt64(v) }
        if let v = try r.int("backoffMaxMs", min: 0) { p.policy.backoffMaxMs = UInt64(v) }
        if let v = try r.double("backoffMultiplier") {
            guard v >= 1 else { throw ConfigError("\(path)backoffMultiplier must be >= 1") }
            p.policy.backoffMultiplier = v
        }
        if let v = try r.double("jitter") {
            guard v >= 0 && v < 1 else { throw ConfigError("\(path)jitter must be in [0, 1)") }
            p.policy.jitter = v
        }
        if let v = try r.int("maxRestarts", min: 0) { p.policy.maxRestarts = v }
        if let v = try r.int("intensityWindowMs", min: 1) { p.policy.intensityWindowMs = UInt64(v) }
        if let v = try r.int("resetAfterMs", min: 0) { p.policy.resetAfterMs = UInt64(v) }
        if let v = try r.int("startTimeoutMs", min: 1) { p.policy.startTimeoutMs = UInt64(v) }
        if let v = try r.int("heartbeatIntervalMs", min: 10) { p.policy.heartbeatIntervalMs = UInt64(v) }
        if let v = try r.int("heartbeatTimeoutMs", min: 10) { p.policy.heartbeatTimeoutMs = UInt64(v) }
        if let v = try r.int("stopGraceMs", min: 0) { p.policy.stopGraceMs = UInt64(v) }
        if let v = try r.int("requestTimeoutMs", min: 1) { p.requestTimeoutMs = UInt64(v) }
        if let c = o["config"] { r.accept("config"); p.config = c }
        try r.finish()
        return p
    }

    public static func isValidPluginName(_ s: String) -> Bool {
        guard !s.isEmpty, s.utf8.count <= 64, s != "bus", s != "consent" else { return false }
        return s.utf8.allSatisfy { ($0 >= 0x61 && $0 <= 0x7A) || ($0 >= 0x30 && $0 <= 0x39) || $0 == 0x2D || $0 == 0x5F }
    }
}

func lookupGroup(_ name: String) -> UInt32? {
    if let n = UInt32(name) { return n }
    guard let g = getgrnam(name) else { return nil }
    return g.pointee.gr_gid
}

func lookupUser(_ name: String) -> (uid: UInt32, gid: UInt32)? {
    guard let p = getpwnam(name) else { return nil }
    return (p.pointee.pw_uid, p.pointee.pw_gid)
}

/// The host's view of the one config reader (`ConfigReader`, PylonCore): the same types, bounds
/// and messages as every plugin's, but the first problem is thrown (`ConfigError`) where the host
/// reads it, and an unknown key is always an error (`finish`: typos fail loudly).
struct Reader {
    private var r: ConfigReader
    /// `path`: `""` at the top level, else the object's name and a dot (`limits.`).
    init(_ o: JSONObject, path: String) { r = ConfigReader(.object(o), path: path.hasSuffix(".") ? String(path.dropLast()) : path) }

    /// Runs one read; throws the problem it found.
    private mutating func read<T>(_ f: (inout ConfigReader) -> T) throws(ConfigError) -> T {
        let before = r.problems.count
        let v = f(&r)
        if r.problems.count > before { throw ConfigError(r.problems[before]) }
        return v
    }

    mutating func has(_ k: String) -> Bool { r.has(k) }
    mutating func accept(_ k: String) { r.accept(k) }
    mutating func string(_ k: String) throws(ConfigError) -> String? { try read { $0.string(k, nonEmpty: false) } }
    mutating func bool(_ k: String) throws(ConfigError) -> Bool? { try read { $0.bool(k) } }
    mutating func int(_ k: String, min lo: Int = Int.min, max hi: Int = Int.max) throws(ConfigError) -> Int? {
        try read { $0.int(k, atLeast: Int64(lo), atMost: Int64(hi)) }.map { Int($0) }
    }
    mutating func double(_ k: String) throws(ConfigError) -> Double? { try read { $0.double(k) } }
    mutating func object(_ k: String) throws(ConfigError) -> JSONObject? { try read { $0.object(k) } }
    mutating func array(_ k: String) throws(ConfigError) -> [JSON]? { try read { $0.array(k) } }
    mutating func stringArray(_ k: String) throws(ConfigError) -> [String] { try read { $0.stringArray(k) } }
    mutating func intArray(_ k: String) throws(ConfigError) -> [Int] { try read { $0.intArray(k) }.map { Int($0) } }
    /// A setting's full name in messages (`limits.maxLineBytes`).
    func name(_ k: String) -> String { r.name(k) }

    /// `uids`, `gids`, `groups` (names resolved to gids) and `plugins` of a rule or admin list.
    mutating func accessList() throws(ConfigError) -> AccessList {
        var a = AccessList()
        for u in try intArray("uids") {
            guard let v = UInt32(exactly: u) else { throw ConfigError("\(name("uids")): \(u) is not a uid") }
            a.uids.append(v)
        }
        for g in try intArray("gids") {
            guard let v = UInt32(exactly: g) else { throw ConfigError("\(name("gids")): \(g) is not a gid") }
            a.gids.append(v)
        }
        for g in try stringArray("groups") {
            guard let gid = lookupGroup(g) else { throw ConfigError("\(name("groups")): unknown group \(g)") }
            a.gids.append(gid)
        }
        a.plugins = try stringArray("plugins")
        return a
    }

    /// An unknown key is an error (keys starting with `_` or `//` are comments).
    func finish() throws(ConfigError) {
        if let u = r.unknown.first { throw ConfigError(u) }
    }
}
