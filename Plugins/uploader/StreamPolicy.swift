import PylonPluginKit

/// Who owns a stream: the plugin whose namespace names it, or the uid that first wrote it (or
/// whatever the operator pinned in the config). Written `plugin:NAME` / `uid:N` in config, status
/// and the queue database.
enum StreamOwner: Hashable, Sendable, CustomStringConvertible {
    case plugin(String)
    case uid(Int64)

    /// Parses `plugin:NAME` or `uid:N`.
    init?(_ text: String) {
        if text.hasPrefix("plugin:"), case let name = String(text.dropFirst(7)), !name.isEmpty {
            self = .plugin(name)
        } else if text.hasPrefix("uid:"), let n = Int64(text.dropFirst(4)), n >= 0 {
            self = .uid(n)
        } else {
            return nil
        }
    }

    var description: String {
        switch self {
        case .plugin(let p): return "plugin:\(p)"
        case .uid(let u): return "uid:\(u)"
        }
    }
}

/// The caller of a request, from the `_pylon` member the host injects into every request it
/// forwards to the uploader (clients cannot forge it):
/// `{"plugin":"ma"}` a plugin on its own behalf, `{"client":N,"uid":U,"gid":G,"pid":P}` a client,
/// both together for a plugin calling on a client's behalf, plus `"admin":true` when the host
/// says the client principal is an admin. No `_pylon` at all is an anonymous, unprivileged caller.
struct Principal: Equatable, Sendable, CustomStringConvertible {
    var plugin: String?
    var uid: Int64?
    /// The host's `admin` flag.
    var adminFlag = false

    init(plugin: String? = nil, uid: Int64? = nil, admin: Bool = false) {
        self.plugin = plugin
        self.uid = uid
        adminFlag = admin
    }

    init(caller: JSON?) { self.init(caller: CallerInfo(json: caller)) }

    /// From the caller info as the plugin kit reads it (`RawCall.callerInfo`).
    init(caller: CallerInfo) {
        plugin = caller.plugin
        uid = caller.uid
        adminFlag = caller.admin ?? false
    }

    /// An admin may use every stream: the host's flag only (`disclosure.admins`, uid 0 by
    /// default). A uid is never an admin by itself: an operator who takes root off the list
    /// takes it off here too.
    var isAdmin: Bool { adminFlag }

    /// The owner this caller acts as: a plugin (on its own or a client's behalf) acts as that
    /// plugin, a client as its uid; an anonymous caller as nobody.
    var identity: StreamOwner? {
        if let plugin { return .plugin(plugin) }
        return uid.map { .uid($0) }
    }

    func mayUse(_ owner: StreamOwner) -> Bool { isAdmin || identity == owner }

    var description: String {
        switch (plugin, uid) {
        case (let p?, let u?): return "plugin \(p) (for uid \(u))"
        case (let p?, nil): return "plugin \(p)"
        case (nil, let u?): return "uid \(u)"
        case (nil, nil): return "an anonymous caller"
        }
    }
}

/// The operator's `streams` entries (`{"pattern": {endpoint?, maxCount?, intervalMs?,
/// maxBatchBytes?, consent?, owner?}}`) and the plugin namespaces: what a stream's name fixes
/// about it. A pure value; every field of a stream comes from the most specific matching entry
/// that sets it (an exact name first, then the longest pattern).
struct StreamCatalog: Sendable {
    struct Entry: Sendable {
        var pattern: String
        var endpoint: String?
        var maxCount: Int?
        var intervalMs: UInt64?
        var maxBatchBytes: Int?
        var consent: String?
        var owner: StreamOwner?
        /// `"delivery": "get"` with the hosts its URLs may name (the entry's `allowedHosts`, else
        /// the plugin's): `StreamSettings.getHosts`.
        var getHosts: Set<String>?
    }

    /// Most specific first.
    private(set) var entries: [Entry] = []
    /// Stream names `<ns>.<rest>` with `<ns>` here belong to plugin `<ns>`.
    var pluginNamespaces: Set<String> = ["ma", "push", "gtm", "uploader"]

    init(entries: [Entry] = [], pluginNamespaces: Set<String>? = nil) {
        self.entries = entries.sorted { a, b in
            let ea = !a.pattern.contains("*"), eb = !b.pattern.contains("*")
            if ea != eb { return ea }
            return a.pattern.count > b.pattern.count
        }
        if let pluginNamespaces { self.pluginNamespaces = pluginNamespaces }
    }

    /// The most specific matching entry's value of `field`.
    func value<T>(_ stream: String, _ field: KeyPath<Entry, T?>) -> T? {
        for e in entries where TopicPattern(e.pattern).matches(stream) {
            if let v = e[keyPath: field] { return v }
        }
        return nil
    }

    /// The stream's settings before any `configureStream`.
    func settings(for stream: String, defaultEndpoint: String) -> StreamSettings {
        var s = StreamSettings(endpoint: value(stream, \.endpoint) ?? defaultEndpoint)
        if let n = value(stream, \.maxCount) { s.maxCount = n }
        if let n = value(stream, \.intervalMs) { s.intervalMs = n }
        if let n = value(stream, \.maxBatchBytes) { s.maxBatchBytes = n }
        s.getHosts = value(stream, \.getHosts)
        return s
    }

    /// `<ns>` of `<ns>.<rest>` (both non-empty), else nil.
    static func split(_ stream: String) -> (ns: String, rest: String)? {
        guard let dot = stream.firstIndex(of: "."), dot != stream.startIndex, stream.index(after: dot) != stream.endIndex
        else { return nil }
        return (String(stream[..<dot]), String(stream[stream.index(after: dot)...]))
    }

    /// The consent switch every record of `stream` falls under, whatever the caller says: the
    /// configured `consent`, else `<ns>:<rest>` for `<ns>.<rest>` (`ma.abc` → `ma:abc`), else the
    /// name itself.
    func consentKey(for stream: String) -> String {
        if let c = value(stream, \.consent) { return c }
        if let (ns, rest) = StreamCatalog.split(stream) { return ns + ":" + rest }
        return stream
    }

    /// The owner fixed by configuration or by the name (nil: the first writer's uid owns it).
    func fixedOwner(of stream: String) -> StreamOwner? {
        if let o = value(stream, \.owner) { return o }
        if let (ns, _) = StreamCatalog.split(stream), pluginNamespaces.contains(ns) { return .plugin(ns) }
        return nil
    }

    /// The owner of `stream`, given the first writer the queue database recorded.
    func owner(of stream: String, recorded: StreamOwner?) -> StreamOwner? {
        fixedOwner(of: stream) ?? recorded
    }
}

/// The decision for one request naming a stream.
enum StreamAccess: Equatable {
    /// Allowed; `claim` when the caller becomes the owner of a stream nobody owned yet (`owner`
    /// is nil only for an admin reading a stream nobody owns, such as one queued before owners
    /// were recorded).
    case allowed(owner: StreamOwner?, claim: Bool)
    case refused(RPCError)

    /// Whether `caller` may `action` (`"enqueue to"`, `"configure"`, ...) stream `stream` whose
    /// owner is `owner`. `claims`: the action writes, so a caller with an identity becomes the
    /// owner of an unowned stream; reading an unowned stream is for admins only.
    static func decide(_ stream: String, owner: StreamOwner?, caller: Principal, action: String, claims: Bool) -> StreamAccess {
        if let owner {
            if caller.mayUse(owner) { return .allowed(owner: owner, claim: false) }
            return .refused(
                RPCError(
                    .notPermitted, "\(caller) may not \(action) stream \(stream): it belongs to \(owner)",
                    data: ["stream": .string(stream), "owner": .string(owner.description)]))
        }
        if claims, let id = caller.identity { return .allowed(owner: id, claim: true) }
        if !claims, caller.isAdmin { return .allowed(owner: nil, claim: false) }
        return .refused(
            RPCError(
                .notPermitted,
                "\(caller) may not \(action) stream \(stream): it has no owner yet"
                    + (claims ? " and the caller has no uid to own it" : " (admins only)"),
                data: ["stream": .string(stream), "owner": .null]))
    }
}
