import PylonCore
import PylonProtocol

#if canImport(Glibc)
import Glibc
#endif

/// What the router needs to know of one configured plugin at the moment of a decision. `PluginSlot`
/// is one; tests use plain structs.
protocol RoutablePlugin {
    associatedtype Target
    var name: String { get }
    /// The plugin's channel when it is running and has completed its handshake; nil otherwise.
    var routeTarget: Target? { get }
    /// The error a call gets while the plugin cannot take it (`routeTarget` nil).
    func unavailableError() -> RPCError
    /// The manifest's methods with their consent templates (empty: every method of the
    /// namespace goes to the plugin).
    var methodRoutes: [String: PluginSlot.MethodRoute] { get }
    /// The plugin's own request timeout, if its configuration sets one.
    var requestTimeoutMs: UInt64? { get }
}

/// The live tables a decision reads: configured plugins by namespace and the methods clients
/// provide (`bus.provide`). `Bus` passes views of its own tables; tests pass dictionaries.
protocol RoutingTables {
    associatedtype Plugin: RoutablePlugin
    func plugin(namespace: Substring) -> Plugin?
    func provider(of method: String) -> Plugin.Target?
}

/// The host's routing, security and consent rules as a value: who a message acts for (the
/// `_onBehalfOf` chain), whether the first matching permission rule lets that principal call a
/// method, where the call goes (host method, plugin namespace, provided method), whether a consent
/// switch refuses it, and what a principal may see (disclosure).
///
/// It performs no I/O, holds no peers and reads no clock: `Bus` builds it from the configuration
/// (again at each reload) and performs each decision. The decision allocates nothing for a call
/// that is forwarded (the hot path: `Bus+FastPath`); only refusals build their error text.
/// Unit-tested in RoutingPolicyTests.
struct RoutingPolicy: Equatable {
    var permissions: [PermissionRule]
    var disclosure: Disclosure
    /// The request timeout of a plugin without its own, and of a provided method.
    var requestTimeoutMs: UInt64

    /// pylond's own uid: besides the admins, it may `bus.reload` without a rule (it may send
    /// pylond SIGHUP anyway; systemd's `ExecReload` runs `pylonctl reload` as it).
    var hostUid: UInt32

    init(
        permissions: [PermissionRule] = [], disclosure: Disclosure = Disclosure(), requestTimeoutMs: UInt64 = Limits().requestTimeoutMs,
        hostUid: UInt32 = 0
    ) {
        self.permissions = permissions
        self.disclosure = disclosure
        self.requestTimeoutMs = requestTimeoutMs
        self.hostUid = hostUid
    }

    /// The rules of `config`; `hostUid` is pylond's own uid (the caller passes `getuid()`: the
    /// policy reads nothing of the process).
    init(_ config: HostConfig, hostUid: UInt32) {
        self.init(
            permissions: config.permissions, disclosure: config.disclosure, requestTimeoutMs: config.limits.requestTimeoutMs,
            hostUid: hostUid)
    }

    /// Where a call goes: the one routing decision shared by requests (both paths) and client
    /// notifications.
    enum Decision<Target> {
        /// A `bus.*` or `consent.*` method, answered by the host.
        case host
        /// To a plugin, or to the client that provided the method (`provider`).
        case forward(Target, timeoutMs: UInt64, provider: Bool)
        /// Not allowed or not available: the error a request gets.
        case refused(RPCError)
        /// Refused by consent switch `key` (the method's manifest entry says how to answer: an
        /// error, or `deniedResult` when `dropWhenDenied`).
        case denied(Manifest.Method, key: String)

        var isForward: Bool {
            if case .forward = self { return true }
            return false
        }
    }

    /// The routing decision for `principal` calling `method`. `field` reads a top-level params
    /// string for the consent template (nil when absent or not a string).
    func decide<T: RoutingTables>(
        _ principal: Principal, _ method: String, tables: T, consent: ConsentStore, shuttingDown: Bool,
        field: (String) -> String?
    ) -> Decision<T.Plugin.Target> {
        if shuttingDown { return .refused(RPCError(.shuttingDown, "host is shutting down")) }
        let permission = permission(method, principal)
        if !permission.allows {
            let uid = principal.credentials.map { Int64($0.uid) }
            let who = principal.actsForClient ? "uid \(uid.map(String.init) ?? "unknown")" : "plugin \(principal.plugin ?? "?")"
            let via = principal.actsForClient && principal.plugin != nil ? " (through plugin \(principal.plugin!))" : ""
            let why =
                permission == .operatorDefault(false)
                ? ": an operator method, for admins (disclosure.admins) unless a permissions rule opens it" : ""
            return .refused(
                RPCError(
                    .notPermitted, "\(who) may not call \(method)\(via)\(why)",
                    data: ["method": .string(method), "uid": uid.map { .int($0) } ?? .null]))
        }
        if HostMethod.isHostNamespace(method) {
            if let e = hostCallRefusal(method, principal) { return .refused(e) }
            return .host
        }
        // A configured plugin's namespace is the plugin's, whatever a client provided. (Method
        // names are printable ASCII, checked before routing: the first "." byte is the first "."
        // character.)
        let dot = method.utf8.firstIndex(of: UInt8(ascii: ".")) ?? method.endIndex
        guard let plugin = tables.plugin(namespace: method[..<dot]) else {
            if let provider = tables.provider(of: method) { return .forward(provider, timeoutMs: requestTimeoutMs, provider: true) }
            return .refused(RPCError(.methodNotFound, "method not found: \(method)"))
        }
        guard let target = plugin.routeTarget else { return .refused(plugin.unavailableError()) }
        let methods = plugin.methodRoutes
        if !methods.isEmpty {
            guard let m = methods[method] else {
                return .refused(RPCError(.methodNotFound, "method not found: \(method) (plugin \(plugin.name) does not serve it)"))
            }
            if m.spec.consent != nil, let key = RoutingPolicy.deniedConsent(m.consent, consent, field: field) {
                return .denied(m.spec, key: key)
            }
        }
        return .forward(target, timeoutMs: plugin.requestTimeoutMs ?? requestTimeoutMs, provider: false)
    }

    /// The host's operator methods: they change what the device does for every user (consent,
    /// supervision, configuration, logging) or watch every user's traffic. Without a matching
    /// `permissions` rule only admins may call them (`operatorDefault`); `consent.clear` follows
    /// `consent.set` (`permission`). Plugins' operator methods (`*.setOwner`, another owner's
    /// dead letters) are the plugins' to refuse: they read the host's admin flag (`Ownership`).
    static let operatorMethods: Set<String> = [
        HostMethod.consentSet, HostMethod.restart, HostMethod.reload, HostMethod.logLevel, HostMethod.monitor,
    ]

    /// Why a principal may or may not call a method.
    enum Permission: Equatable {
        /// The first matching `permissions` rule decided.
        case rule(Bool)
        /// No rule matched and the method is an operator method: admins (and the host) only.
        case operatorDefault(Bool)
        /// No rule matched: allowed.
        case open
    }

    /// The first rule matching `method` decides, for the client at the start of the chain (unknown
    /// credentials never satisfy a rule) or for a plugin acting on its own (only if listed). No
    /// matching rule: an operator method (`operatorMethods`) is for admins only, any other method
    /// is allowed. `consent.clear` can grant collection again: it needs the permission of
    /// `consent.set` as well as its own rule's, and without a rule of its own it is exactly as
    /// open as `consent.set`.
    func permission(_ method: String, _ p: Principal) -> Permission {
        if method == HostMethod.consentClear {
            let set = permission(HostMethod.consentSet, p)
            guard set.allows else { return set }
            return ruleDecision(method, p).map(Permission.rule) ?? set
        }
        if let ruled = ruleDecision(method, p) { return .rule(ruled) }
        // Host methods only: the set is not consulted for a plugin's method (the routing hot path).
        guard HostMethod.isHostNamespace(method), RoutingPolicy.operatorMethods.contains(method) else { return .open }
        return .operatorDefault(isOperator(p, method))
    }

    /// Whether `p` may call `method` (`permission`).
    func isPermitted(_ method: String, _ p: Principal) -> Bool { permission(method, p).allows }

    /// The first matching rule's decision, nil when no rule matches.
    private func ruleDecision(_ method: String, _ p: Principal) -> Bool? {
        for rule in permissions where rule.method.matches(method) {
            if p.actsForClient {
                guard let c = p.credentials else { return false }
                return rule.allowed.allows(c)
            }
            if let name = p.plugin { return rule.allowed.plugins.contains(name) }
            return true
        }
        return nil
    }

    /// Who may call an operator method no rule names: an admin client, also through plugins acting
    /// for it (the client at the start of the chain, as for rules); pylond's own uid for
    /// `bus.reload`; the host's own requests. Not a plugin acting on its own (a rule may list it).
    func isOperator(_ p: Principal, _ method: String) -> Bool {
        if p.actsForClient {
            guard let c = p.credentials else { return false }
            return disclosure.admins.allows(c) || (method == HostMethod.reload && c.uid == hostUid)
        }
        return p.plugin == nil
    }

    /// Host methods a plugin may not call, even for a client: it cannot watch traffic, reload the
    /// host or set log levels (these are the operator's, through a client).
    static let clientOnlyMethods: Set<String> = [HostMethod.reload, HostMethod.logLevel, HostMethod.monitor]

    /// Why `p` may not call host method `method` although a permission allows it (nil: it may):
    /// `clientOnlyMethods` are refused to plugins (decided with the route).
    func hostCallRefusal(_ method: String, _ p: Principal) -> RPCError? {
        guard p.plugin != nil, RoutingPolicy.clientOnlyMethods.contains(method) else { return nil }
        return RPCError(.notPermitted, "\(method) is for clients, not plugins", data: ["method": .string(method)])
    }

    /// Why `p` may not set switch `key` with `consent.setApp` (nil: it may). The app layer is for
    /// plugins only, on their own switches (`<plugin>:…`): an app narrows collection through the
    /// plugin that serves it and never touches another plugin's switches or the master switch.
    /// `consent.setApp` is open as a method (a client gets this refusal from the method, after the
    /// route). `key` nil: only who may call it (the method then reads the required key).
    func setAppRefusal(_ p: Principal, key: String?) -> RPCError? {
        guard let plugin = p.plugin else {
            return RPCError(.notPermitted, "consent.setApp is called by plugins for their apps; clients use consent.set")
        }
        guard let key, !key.hasPrefix(plugin + ":") else { return nil }
        return RPCError(.notPermitted, "plugin \(plugin) may set the app layer of its own switches (\(plugin):…) only, not \(key)")
    }

    /// The switch that refuses a call under `template`, or nil when it may pass: the master switch
    /// first, then the template's key (a template whose field is absent does not refuse).
    static func deniedConsent(_ template: ConsentTemplate, _ consent: ConsentStore, field: (String) -> String?) -> String? {
        if !consent.masterGranted { return ConsentStore.master }
        switch template.key(field: field) {
        case .none, .unresolved: return nil
        case .key(let k): return consent.isGranted(k) ? nil : k
        }
    }

    // MARK: Principals

    /// The principal of a message. A client's acts for the client (it cannot name a request:
    /// `via` must be nil). A plugin's acts for the plugin, or — with `_onBehalfOf` (`via`) — for
    /// the principal of the request `via`, which must be one forwarded to that plugin and not yet
    /// answered (`served` answers that principal, or nil). Nil: refused.
    static func principal(
        client: (id: UInt64, credentials: PeerCredentials?)?, plugin: String?, via: Int64?, served: (Int64) -> Principal?
    ) -> Principal? {
        guard let plugin else {
            guard via == nil, let client else { return nil }
            return Principal(plugin: nil, client: client.id, credentials: client.credentials)
        }
        guard let via else { return .plugin(plugin) }
        guard let chain = served(via) else { return nil }
        return .plugin(plugin, via: chain)
    }

    // MARK: Disclosure

    func isAdmin(_ credentials: PeerCredentials?) -> Bool { credentials.map { disclosure.admins.allows($0) } ?? false }

    /// True for an admin client (also through a plugin acting for it), or a plugin acting on its
    /// own behalf (plugins are the operator's).
    func seesEverything(_ p: Principal) -> Bool {
        if p.actsForClient { return isAdmin(p.credentials) }
        return true
    }

    /// Topics only admin clients (and plugins) receive (`disclosure.adminTopics`).
    func isAdminTopic(_ topic: String) -> Bool { disclosure.adminTopics.contains { $0.matches(topic) } }

    /// Whether a client with `credentials` receives a publication on `topic`.
    func clientReceives(_ topic: String, credentials: PeerCredentials?) -> Bool { !isAdminTopic(topic) || isAdmin(credentials) }

    /// A method a client provides now: its name, the providing connection and that client's uid.
    typealias Provider = (method: String, client: UInt64, uid: UInt32?)

    /// Why a client may not `bus.provide` `method` (nil: it may, as far as names go). `configured`:
    /// whether a plugin of that namespace is configured. With `uid` (the caller's, when known) and
    /// `providers` (the methods provided now), a namespace is one user's while any of its methods
    /// is provided: another uid cannot add methods beside them and catch calls meant for that
    /// user's program.
    func provideRefusal(
        _ method: String, uid: UInt32? = nil, configured: (String) -> Bool, providers: some Sequence<Provider> = [Provider]()
    ) -> RPCError? {
        let ns = method.split(separator: ".", maxSplits: 1).first.map(String.init) ?? method
        guard method.contains("."), !method.hasSuffix("."), InboundEnvelope.isValidMethodName(method) else {
            return RPCError(.invalidParams, "cannot provide \(method): use <namespace>.<name> (printable ASCII)")
        }
        guard ns != "bus", ns != "consent", !configured(ns), !disclosure.reservedNamespaces.contains(ns) else {
            return RPCError(.notPermitted, "cannot provide \(method): \(ns).* belongs to the host or a plugin")
        }
        if let uid, let other = providers.first(where: { $0.method.hasPrefix(ns + ".") && $0.uid != uid }) {
            return RPCError(
                .notPermitted, "cannot provide \(method): \(ns).* is provided by another user (client#\(other.client))",
                data: ["namespace": .string(ns)])
        }
        return nil
    }

    /// Why a client may not `bus.subscribe` to `pattern` (nil: it may): a publication is a
    /// notification whose method is the topic, so patterns follow the method-name rule (an
    /// unbounded one let one client hold the loop while matching).
    func subscribeRefusal(_ pattern: String) -> RPCError? {
        guard InboundEnvelope.isValidMethodName(pattern) else {
            return RPCError(.invalidParams, "pattern must be 1-\(InboundEnvelope.maxMethodBytes) bytes of printable ASCII without spaces")
        }
        return nil
    }

    /// Why a client may not `bus.publish` on `topic` (nil: it may).
    func publishRefusal(_ topic: String, configured: (String) -> Bool) -> RPCError? {
        guard InboundEnvelope.isValidMethodName(topic) else {
            return RPCError(.invalidParams, "topic must be 1-\(InboundEnvelope.maxMethodBytes) bytes of printable ASCII without spaces")
        }
        guard !HostMethod.isHostNamespace(topic) else {
            return RPCError(.notPermitted, "topics bus.* and consent.* are published by the host only")
        }
        let ns = topic.split(separator: ".", maxSplits: 1).first.map(String.init) ?? topic
        guard !configured(ns), !disclosure.reservedNamespaces.contains(ns) else {
            return RPCError(.notPermitted, "topics \(ns).* are published by the \(ns) plugin only")
        }
        return nil
    }
}

extension RoutingPolicy.Permission {
    var allows: Bool {
        switch self {
        case .rule(let ok), .operatorDefault(let ok): return ok
        case .open: return true
        }
    }
}

extension PluginSlot: RoutablePlugin {
    var name: String { config.name }
    var routeTarget: Peer? {
        guard life.state == .running, let target = peer, target.handshaken else { return nil }
        return target
    }
    var methodRoutes: [String: MethodRoute] { methods }
    var requestTimeoutMs: UInt64? { config.requestTimeoutMs }
}

/// The bus's own tables as a decision reads them (two dictionary references; nothing copied).
struct BusRoutingTables: RoutingTables {
    let slots: [String: PluginSlot]
    let provided: [String: Peer]
    func plugin(namespace: Substring) -> PluginSlot? { slots[String(namespace)] }
    func provider(of method: String) -> Peer? { provided[method] }
}
