import PylonCore

/// What a plugin announces in its `bus.hello` handshake: one type for both sides. The plugin kit
/// builds one and sends `helloParams(pid:)`; the host reads it back with `parse(_:)`
/// (`parse(m.helloParams(pid:)) == m` is tested).
public struct Manifest: Equatable, Sendable {
    public struct Method: Equatable, Sendable {
        /// Full method name, `<plugin>.<method>`.
        public var name: String
        /// The consent switch the method's data falls under; `{field}` is replaced by the string
        /// value of that params field (`ma:{appKey}`). nil: not data collection.
        public var consent: String?
        /// When consent is denied: `error` answers -32003; `drop` answers `deniedResult` without
        /// reaching the plugin (the SDK behaviour of silently dropping events).
        public var dropWhenDenied = false
        public var deniedResult: JSON = .null
        /// The plugin carries on with a request of this method after the host's deadline (a
        /// start waiting for the network, an event held for a restarting uploader): the host then
        /// answers `-32008` (pending) instead of `-32002` (timeout). Wire: `"afterDeadline":
        /// "continues"` in the handshake.
        public var continuesAfterDeadline = false
        /// What the method says about itself (summary, params, result); nil from a plugin that
        /// declares none (older plugins).
        public var doc: MethodDoc?

        public init(
            name: String, consent: String? = nil, dropWhenDenied: Bool = false, deniedResult: JSON = .null, doc: MethodDoc? = nil,
            continuesAfterDeadline: Bool = false
        ) {
            self.name = name
            self.continuesAfterDeadline = continuesAfterDeadline
            self.consent = consent
            self.dropWhenDenied = dropWhenDenied
            self.deniedResult = deniedResult
            self.doc = doc
        }
    }
    public var name: String
    public var version: String
    public var protocolVersion: Int
    public var methods: [String: Method] = [:]
    public var methodOrder: [String] = []
    public var publishes: [String] = []
    public var subscribes: [TopicPattern] = []
    /// The plugin wants to know who called: forwarded requests then carry a top-level
    /// `"_pylon": {"client": N, "uid": U, "pid": P}` (or `{"plugin": name}`) member.
    public var callerInfo = false

    /// The protocol version this build speaks, and the versions a host accepts.
    public static let currentProtocol = 1
    public static let supportedProtocols = 1...1

    public init(name: String, version: String, protocolVersion: Int = Manifest.currentProtocol) {
        self.name = name
        self.version = version
        self.protocolVersion = protocolVersion
    }

    /// Adds (or replaces) a method, keeping announcement order; a short name gets the
    /// `<plugin>.` prefix.
    public mutating func add(_ method: Method) {
        var spec = method
        if !spec.name.hasPrefix(name + ".") { spec.name = name + "." + spec.name }
        if methods.updateValue(spec, forKey: spec.name) == nil { methodOrder.append(spec.name) }
    }

    /// The methods in announcement order; `deniedResult` and `afterDeadline` are part of the
    /// handshake, not of `bus.describe`.
    private func methodsJSON(withDeniedResult: Bool) -> [JSON] {
        methodOrder.compactMap { n in
            guard let s = methods[n] else { return nil }
            var o: JSONObject = ["name": .string(n)]
            if let c = s.consent {
                o["consent"] = .string(c)
                o["onDenied"] = s.dropWhenDenied ? "drop" : "error"
                if withDeniedResult { o["deniedResult"] = s.deniedResult }
            }
            if withDeniedResult, s.continuesAfterDeadline { o["afterDeadline"] = "continues" }
            if let d = s.doc { for (k, v) in d.wireMembers { o[k] = v } }
            return .object(o)
        }
    }

    /// The `bus.hello` params that announce this manifest.
    public func helloParams(pid: Int32) -> JSON {
        let ms = methodsJSON(withDeniedResult: true)
        return [
            "name": .string(name), "version": .string(version), "protocol": .int(Int64(protocolVersion)),
            "pid": .int(Int64(pid)),
            "manifest": [
                "methods": .array(ms),
                "publishes": .array(publishes.map { .string($0) }),
                "subscribes": .array(subscribes.map { .string($0.text) }),
                "callerInfo": .bool(callerInfo),
            ],
        ]
    }

    public static func parse(_ p: JSON) throws(RPCError) -> Manifest {
        func bad(_ m: String) -> RPCError { RPCError(.invalidParams, "bus.hello: \(m)") }
        guard let name = p["name"]?.stringValue else { throw bad("name (string) is required") }
        let version = p["version"]?.stringValue ?? "0"
        guard let proto = p["protocol"]?.intValue else { throw bad("protocol (integer) is required") }
        guard supportedProtocols.contains(Int(proto)) else {
            throw RPCError(
                .invalidParams, "bus.hello: protocol \(proto) not supported; host speaks \(supportedProtocols)",
                data: ["supported": [.int(Int64(supportedProtocols.lowerBound)), .int(Int64(supportedProtocols.upperBound))]])
        }
        var m = Manifest(name: name, version: version, protocolVersion: Int(proto))
        let man = p["manifest"] ?? .object([:])
        if let methods = man["methods"]?.arrayValue {
            for mj in methods {
                var spec: Method
                if let s = mj.stringValue {
                    spec = Method(name: s)
                } else if let o = mj.objectValue, let s = o["name"]?.stringValue {
                    spec = Method(name: s)
                    spec.consent = o["consent"]?.stringValue
                    spec.dropWhenDenied = o["onDenied"]?.stringValue == "drop"
                    spec.deniedResult = o["deniedResult"] ?? .null
                    spec.continuesAfterDeadline = o["afterDeadline"]?.stringValue == "continues"
                    do throws(MethodDoc.DocError) {
                        spec.doc = try MethodDoc.parse(o)
                    } catch {
                        throw bad("manifest.methods \(s): \(error.description)")
                    }
                } else {
                    throw bad(
                        "manifest.methods entries must be strings or {name, consent?, onDenied?, afterDeadline?, summary?, params?, result?}"
                    )
                }
                m.add(spec)
            }
        }
        m.publishes = man["publishes"]?.arrayValue?.compactMap { $0.stringValue } ?? []
        m.subscribes = man["subscribes"]?.arrayValue?.compactMap { $0.stringValue.map(TopicPattern.init) } ?? []
        m.callerInfo = man["callerInfo"]?.boolValue ?? false
        return m
    }

    /// The manifest as `bus.describe` shows it.
    public var json: JSON {
        [
            "version": .string(version), "protocol": .int(Int64(protocolVersion)),
            "methods": .array(methodsJSON(withDeniedResult: false)),
            "publishes": .array(publishes.map { .string($0) }),
            "subscribes": .array(subscribes.map { .string($0.text) }),
        ]
    }
}

extension Manifest.Method {
    /// Resolves the consent template against the request params. nil when the method has no
    /// switch; `.unresolved` when a `{field}` is absent (only the master switch then applies).
    public func consentKey(params: JSON?) -> ConsentKey {
        consentKey { params?[$0]?.stringValue }
    }

    /// The same, reading each `{field}` through `field` (the router looks fields up in the parsed
    /// json-c tree, so a consent check converts nothing else of the message).
    public func consentKey(field: (String) -> String?) -> ConsentKey {
        ConsentTemplate(consent).key(field: field)
    }
}

public enum ConsentKey: Equatable, Sendable {
    case none
    case unresolved
    case key(String)
}
