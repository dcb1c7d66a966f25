import PylonPluginKit

/// Who owns a stream: the plugin whose namespace names it, or the uid that first wrote it (or
/// whatever the operator pinned in the config, or an admin handed it to with `uploader.setOwner`).
/// The kit's `Owner`: written `plugin:NAME` / `uid:N` in config, status and the queue database.
package typealias StreamOwner = Owner

/// The caller of a request, from the `_pylon` member the host injects into every request it
/// forwards to the uploader (clients cannot forge it; `CallerInfo`), as the kit's ownership rule
/// for streams sees it (`Ownership.streams`): a plugin (on its own or a client's behalf) acts as
/// that plugin, a client as its uid, and an admin is the host's flag only. No `_pylon` at all is an
/// anonymous, unprivileged caller.
package struct Principal: Equatable, Sendable, CustomStringConvertible {
    var info: CallerInfo

    init(plugin: String? = nil, uid: Int64? = nil, admin: Bool = false) {
        info = CallerInfo(uid: uid, plugin: plugin, admin: admin ? true : nil)
    }

    package init(caller: JSON?) { info = CallerInfo(json: caller) }

    /// From the caller info as the plugin kit reads it (`Call.callerInfo`).
    init(caller: CallerInfo) { info = caller }

    /// An admin may use every stream: the host's flag only (`disclosure.admins`, uid 0 by
    /// default). A uid is never an admin by itself: an operator who takes root off the list
    /// takes it off here too.
    var isAdmin: Bool { info.isAdmin }

    /// The owner this caller acts as (nil: an anonymous caller).
    var identity: StreamOwner? { Ownership.streams.identity(of: info) }

    func mayUse(_ owner: StreamOwner) -> Bool { Ownership.streams.access(owner, caller: info, claims: false).isAllowed }

    package var description: String { info.description }

    package static func == (a: Principal, b: Principal) -> Bool {
        a.info.plugin == b.info.plugin && a.info.uid == b.info.uid && a.isAdmin == b.isAdmin
    }
}

/// The operator's `streams` entries (`{"pattern": {endpoint?, maxCount?, intervalMs?,
/// maxBatchBytes?, consent?, owner?}}`) and the plugin namespaces: what a stream's name fixes
/// about it. A pure value; every field of a stream comes from the most specific matching entry
/// that sets it (an exact name first, then the longest pattern).
package struct StreamCatalog: Sendable {
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
    package func settings(for stream: String, defaultEndpoint: String) -> StreamSettings {
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
    /// name itself; the opt-out reports' stream always its own switch (`OptOutReports`).
    package func consentKey(for stream: String) -> String {
        if stream == OptOutReports.stream { return OptOutReports.consentKey }
        if let c = value(stream, \.consent) { return c }
        if let (ns, rest) = StreamCatalog.split(stream) { return ns + ":" + rest }
        return stream
    }

    /// The owner fixed by configuration or by the name (nil: the first writer's uid owns it);
    /// the opt-out reports' stream is the uploader's own.
    func fixedOwner(of stream: String) -> StreamOwner? {
        if stream == OptOutReports.stream { return OptOutReports.owner }
        if let o = value(stream, \.owner) { return o }
        if let (ns, _) = StreamCatalog.split(stream), pluginNamespaces.contains(ns) { return .plugin(ns) }
        return nil
    }

    /// The owner of `stream`, given the first writer the queue database recorded.
    package func owner(of stream: String, recorded: StreamOwner?) -> StreamOwner? {
        fixedOwner(of: stream) ?? recorded
    }
}

/// The decision for one request naming a stream.
package enum StreamAccess: Equatable {
    /// Allowed; `claim` when the caller becomes the owner of a stream nobody owned yet (`owner`
    /// is nil only for an admin reading a stream nobody owns, such as one queued before owners
    /// were recorded).
    case allowed(owner: StreamOwner?, claim: Bool)
    case refused(RPCError)

    /// Whether `caller` may `action` (`"enqueue to"`, `"configure"`, ...) stream `stream` whose
    /// owner is `owner`. `claims`: the action writes, so a caller with an identity becomes the
    /// owner of an unowned stream; reading an unowned stream is for admins only.
    package static func decide(_ stream: String, owner: StreamOwner?, caller: Principal, action: String, claims: Bool) -> StreamAccess {
        switch Ownership.streams.access(owner, caller: caller.info, claims: claims) {
        case .owner, .admin, .unowned: return .allowed(owner: owner, claim: false)
        case .claim(let o): return .allowed(owner: o, claim: true)
        case .refused(let owner?):
            return .refused(
                RPCError(
                    .notPermitted, "\(caller) may not \(action) stream \(stream): it belongs to \(owner)",
                    data: ["stream": .string(stream), "owner": .string(owner.description)]))
        case .refused(nil):
            return .refused(
                RPCError(
                    .notPermitted,
                    "\(caller) may not \(action) stream \(stream): it has no owner yet"
                        + (claims ? " and the caller has no uid to own it" : " (admins only)"),
                    data: ["stream": .string(stream), "owner": .null]))
        }
    }
}
