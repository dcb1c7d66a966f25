import Foundation
import PylonCore
import PylonProtocol
import Testing

@testable import PylonHost

/// The host's routing, security and consent rules without a process: `RoutingPolicy` over fake
/// plugin and provider tables. (One end-to-end case per rule stays in RoutingTests,
/// SecurityTests and ConsentTests.)
struct RoutingPolicyTests {
    struct FakePlugin: RoutablePlugin {
        var name: String
        var routeTarget: String?
        var methodRoutes: [String: PluginSlot.MethodRoute] = [:]
        var requestTimeoutMs: UInt64?
        func unavailableError() -> RPCError { RPCError(.pluginUnavailable, "\(name) down") }
    }

    struct FakeTables: RoutingTables {
        var plugins: [String: FakePlugin] = [:]
        var provided: [String: String] = [:]
        func plugin(namespace: Substring) -> FakePlugin? { plugins[String(namespace)] }
        func provider(of method: String) -> String? { provided[method] }
    }

    static let root = PeerCredentials(pid: 10, uid: 0, gid: 0)
    static let user = PeerCredentials(pid: 11, uid: 1000, gid: 1000)
    static let other = PeerCredentials(pid: 12, uid: 1001, gid: 1001)

    static func client(_ c: PeerCredentials?, id: UInt64 = 7) -> Principal { Principal(plugin: nil, client: id, credentials: c) }

    static func method(_ name: String, consent: String? = nil, drop: Bool = false) -> (String, PluginSlot.MethodRoute) {
        let spec = Manifest.Method(name: name, consent: consent, dropWhenDenied: drop, deniedResult: drop ? ["dropped": true] : .null)
        return (name, PluginSlot.MethodRoute(spec: spec, consent: ConsentTemplate(consent)))
    }

    static let tables = FakeTables(
        plugins: [
            "ma": FakePlugin(
                name: "ma", routeTarget: "ma-peer",
                methodRoutes: Dictionary(
                    uniqueKeysWithValues: [
                        method("ma.eventRecord", consent: "ma:{appKey}"), method("ma.ping"),
                        method("ma.optional", consent: "ma:{appKey}", drop: true),
                    ]), requestTimeoutMs: 5_000),
            "echo": FakePlugin(name: "echo", routeTarget: "echo-peer"),
            "down": FakePlugin(name: "down", routeTarget: nil),
        ],
        provided: ["app.thing": "provider-peer", "ma.hijack": "provider-peer"])

    func decide(
        _ p: Principal, _ method: String, policy: RoutingPolicy = RoutingPolicy(requestTimeoutMs: 30_000),
        consent: ConsentStore = ConsentStore(), shuttingDown: Bool = false, fields: [String: String] = [:]
    ) -> RoutingPolicy.Decision<String> {
        policy.decide(p, method, tables: Self.tables, consent: consent, shuttingDown: shuttingDown) { fields[$0] }
    }

    // MARK: Namespaces and providers

    @Test func hostMethodsAreTheHosts() {
        guard case .host = decide(Self.client(Self.user), "bus.ping") else { Issue.record("bus.ping"); return }
        guard case .host = decide(Self.client(Self.user), "consent.get") else { Issue.record("consent.get"); return }
    }

    @Test func aPluginNamespaceGoesToThePluginWithItsTimeout() {
        guard case .forward(let t, let ms, let provider) = decide(Self.client(Self.user), "ma.ping") else {
            Issue.record("not forwarded")
            return
        }
        #expect(t == "ma-peer" && ms == 5_000 && !provider)
        guard case .forward(let e, let ems, false) = decide(Self.client(Self.user), "echo.anything") else {
            Issue.record("a plugin without a method list takes every method of its namespace")
            return
        }
        #expect(e == "echo-peer" && ems == 30_000, "no timeout of its own: the host's")
    }

    @Test func aConfiguredNamespaceWinsOverAProvider() {
        // "ma.hijack" is in the provided table, but ma is a configured plugin that does not list it.
        guard case .refused(let e) = decide(Self.client(Self.user), "ma.hijack") else {
            Issue.record("a provider reached a plugin's namespace")
            return
        }
        #expect(e.code == RPCError.Code.methodNotFound.rawValue)
        #expect(e.message.contains("plugin ma does not serve it"))
    }

    @Test func aProvidedMethodGoesToItsProvider() {
        guard case .forward(let t, let ms, true) = decide(Self.client(Self.user), "app.thing") else {
            Issue.record("not forwarded to the provider")
            return
        }
        #expect(t == "provider-peer" && ms == 30_000)
    }

    @Test func unknownMethodsAndDownPlugins() {
        guard case .refused(let e) = decide(Self.client(Self.user), "nobody.here") else { Issue.record("routed"); return }
        #expect(e.code == RPCError.Code.methodNotFound.rawValue && e.message == "method not found: nobody.here")
        guard case .refused(let d) = decide(Self.client(Self.user), "down.x") else { Issue.record("routed to a down plugin"); return }
        #expect(d.message == "down down", "the plugin's own unavailable error")
    }

    @Test func shuttingDownRefusesEverything() {
        for m in ["bus.ping", "ma.ping", "app.thing"] {
            guard case .refused(let e) = decide(Self.client(Self.root), m, shuttingDown: true) else {
                Issue.record("\(m) routed while shutting down")
                continue
            }
            #expect(e.code == RPCError.Code.shuttingDown.rawValue)
        }
    }

    // MARK: Permissions

    static func rules(_ r: [(String, AccessList)]) -> RoutingPolicy {
        RoutingPolicy(permissions: r.map { PermissionRule(method: TopicPattern($0.0), allowed: $0.1) })
    }

    @Test func theFirstMatchingRuleDecides() {
        let policy = Self.rules([("ma.ping", AccessList(uids: [1000])), ("ma.*", AccessList(uids: [0]))])
        #expect(policy.isPermitted("ma.ping", Self.client(Self.user)), "the first rule allows uid 1000")
        #expect(!policy.isPermitted("ma.eventRecord", Self.client(Self.user)), "the second rule is root's")
        #expect(policy.isPermitted("ma.eventRecord", Self.client(Self.root)))
        #expect(!policy.isPermitted("ma.ping", Self.client(Self.root)), "the first rule decides even against root")
        #expect(policy.isPermitted("echo.x", Self.client(Self.user)), "no rule matches: allowed")
        let reversed = Self.rules([("ma.*", AccessList(uids: [0])), ("ma.ping", AccessList(uids: [1000]))])
        #expect(!reversed.isPermitted("ma.ping", Self.client(Self.user)), "order matters")
    }

    @Test func gidsAllowAndUnknownCredentialsNever() {
        let policy = Self.rules([("x.*", AccessList(gids: [1001]))])
        #expect(policy.isPermitted("x.a", Self.client(Self.other)))
        #expect(!policy.isPermitted("x.a", Self.client(Self.user)))
        #expect(!policy.isPermitted("x.a", Self.client(nil)), "a client without credentials satisfies no rule")
        #expect(policy.isPermitted("y.a", Self.client(nil)), "…but no rule: allowed")
    }

    @Test func aPluginOnItsOwnIsAllowedOnlyIfListed() {
        let policy = Self.rules([("consent.set", AccessList(uids: [0], plugins: ["ma"]))])
        #expect(policy.isPermitted("consent.set", .plugin("ma")))
        #expect(!policy.isPermitted("consent.set", .plugin("gtm")))
        #expect(policy.isPermitted("consent.set", .host), "the host's own requests")
    }

    @Test func onBehalfOfTheClientAtTheStartOfTheChainDecides() {
        let policy = Self.rules([("consent.set", AccessList(uids: [0], plugins: ["ma"]))])
        let viaUser = Principal.plugin("ma", via: Self.client(Self.user))
        #expect(!policy.isPermitted("consent.set", viaUser), "ma is listed, but it acts for uid 1000")
        #expect(policy.isPermitted("consent.set", .plugin("ma", via: Self.client(Self.root))))
        // Two hops: gtm serving ma serving the user still acts for the user.
        let twoHops = Principal.plugin("gtm", via: viaUser)
        #expect(twoHops.client == 7 && twoHops.credentials == Self.user)
        #expect(!policy.isPermitted("consent.set", twoHops))
        guard case .refused(let e) = decide(viaUser, "consent.set", policy: policy) else { Issue.record("permitted"); return }
        #expect(e.code == RPCError.Code.notPermitted.rawValue)
        #expect(e.message == "uid 1000 may not call consent.set (through plugin ma)")
        #expect(e.data?["uid"] == .int(1000) && e.data?["method"] == "consent.set")
    }

    @Test func refusalsNameWhoWasRefused() {
        let policy = Self.rules([("ma.*", AccessList(uids: [0]))])
        guard case .refused(let a) = decide(Self.client(Self.user), "ma.ping", policy: policy) else { Issue.record("a"); return }
        #expect(a.message == "uid 1000 may not call ma.ping")
        guard case .refused(let b) = decide(.plugin("gtm"), "ma.ping", policy: policy) else { Issue.record("b"); return }
        #expect(b.message == "plugin gtm may not call ma.ping" && b.data?["uid"] == JSON.null)
        guard case .refused(let c) = decide(Self.client(nil), "ma.ping", policy: policy) else { Issue.record("c"); return }
        #expect(c.message == "uid unknown may not call ma.ping")
    }

    @Test func permissionsApplyToHostMethodsBeforeRouting() {
        let policy = Self.rules([("bus.*", AccessList(uids: [0]))])
        guard case .refused = decide(Self.client(Self.user), "bus.status", policy: policy) else { Issue.record("allowed"); return }
        guard case .host = decide(Self.client(Self.root), "bus.status", policy: policy) else { Issue.record("root refused"); return }
    }

    // MARK: Operator methods without rules (issue 32 item 3)

    static let operatorMethods = ["consent.set", "consent.clear", "bus.restart", "bus.reload", "bus.logLevel", "bus.monitor"]

    /// With no `permissions` rule at all, every operator method is an admin's: root, an admin by
    /// gid, and an admin through a plugin may; another uid, a client without credentials and a
    /// plugin on its own may not. Every other host method stays open.
    @Test func anEmptyPermissionsListLeavesOperatorMethodsToAdmins() {
        var d = Disclosure()
        d.admins = AccessList(uids: [0], gids: [1001])
        let policy = RoutingPolicy(permissions: [], disclosure: d, hostUid: 4242)
        for m in Self.operatorMethods {
            #expect(policy.isPermitted(m, Self.client(Self.root)), "\(m): root")
            #expect(policy.isPermitted(m, Self.client(Self.other)), "\(m): an admin by gid")
            #expect(policy.isPermitted(m, .plugin("echo", via: Self.client(Self.root))), "\(m): an admin through a plugin")
            #expect(policy.isPermitted(m, .host), "\(m): the host itself")
            #expect(!policy.isPermitted(m, Self.client(Self.user)), "\(m): uid 1000")
            #expect(!policy.isPermitted(m, .plugin("echo", via: Self.client(Self.user))), "\(m): uid 1000 through a plugin")
            #expect(!policy.isPermitted(m, Self.client(nil)), "\(m): unknown credentials")
            #expect(!policy.isPermitted(m, .plugin("ma")), "\(m): a plugin on its own")
            guard case .refused(let e) = decide(Self.client(Self.user), m, policy: policy) else {
                Issue.record("\(m) reached the host for uid 1000")
                continue
            }
            #expect(e.code == RPCError.Code.notPermitted.rawValue && e.code == -32005)
            #expect(
                e.message
                    == "uid 1000 may not call \(m): an operator method, for admins (disclosure.admins) unless a permissions rule opens it")
            #expect(e.data?["uid"] == .int(1000) && e.data?["method"] == .string(m))
            guard case .host = decide(Self.client(Self.root), m, policy: policy) else { Issue.record("\(m) refused to root"); continue }
        }
        for m in [
            "bus.ping", "bus.status", "bus.describe", "bus.subscribe", "bus.provide", "consent.get", "consent.list", "consent.setApp",
        ] {
            guard case .host = decide(Self.client(Self.user), m, policy: policy) else { Issue.record("\(m) refused to uid 1000"); continue }
        }
        guard case .forward = decide(Self.client(Self.user), "ma.ping", policy: policy) else { Issue.record("ma.ping refused"); return }
    }

    /// pylond's own uid may reload (it may send SIGHUP anyway), and nothing else of the operator's.
    @Test func theHostsOwnUidMayReloadOnly() {
        let policy = RoutingPolicy(hostUid: 1000)
        #expect(policy.isPermitted("bus.reload", Self.client(Self.user)))
        #expect(!policy.isPermitted("bus.reload", Self.client(Self.other)))
        for m in Self.operatorMethods where m != "bus.reload" { #expect(!policy.isPermitted(m, Self.client(Self.user)), "\(m)") }
    }

    /// Rules change the default only where they say so: a rule opens an operator method to a
    /// non-admin, a rule narrows it below the admins (an admin does not bypass a rule).
    @Test func rulesWidenOrNarrowOperatorMethodsExplicitly() {
        var d = Disclosure()
        d.admins = AccessList(uids: [0], gids: [1001])
        let widen = RoutingPolicy(
            permissions: [PermissionRule(method: TopicPattern("bus.restart"), allowed: AccessList(uids: [1000]))], disclosure: d)
        #expect(widen.isPermitted("bus.restart", Self.client(Self.user)), "opened to uid 1000")
        #expect(!widen.isPermitted("bus.restart", Self.client(Self.root)), "the rule decides, also against root")
        #expect(!widen.isPermitted("consent.set", Self.client(Self.user)), "other operator methods keep their default")
        let narrow = RoutingPolicy(
            permissions: [PermissionRule(method: TopicPattern("consent.*"), allowed: AccessList(uids: [0]))], disclosure: d)
        #expect(narrow.isPermitted("consent.set", Self.client(Self.root)))
        #expect(!narrow.isPermitted("consent.set", Self.client(Self.other)), "an admin by gid, not in the rule")
        #expect(!narrow.isPermitted("consent.get", Self.client(Self.user)), "the rule also narrows an open method")
        #expect(narrow.isPermitted("bus.monitor", Self.client(Self.other)), "no rule: the admin default")
        let plugins = RoutingPolicy(permissions: [PermissionRule(method: TopicPattern("consent.set"), allowed: AccessList(plugins: ["ma"]))]
        )
        #expect(plugins.isPermitted("consent.set", .plugin("ma")), "a plugin on its own only where a rule lists it")
        #expect(!plugins.isPermitted("consent.set", Self.client(Self.root)), "…and that rule lists no uid")
    }

    /// `consent.clear` can grant again: it needs `consent.set`'s permission, and without a rule
    /// of its own it is as open as `consent.set`.
    @Test func consentClearFollowsConsentSet() {
        let opened = RoutingPolicy(permissions: [PermissionRule(method: TopicPattern("consent.set"), allowed: AccessList(uids: [1000]))])
        #expect(opened.isPermitted("consent.clear", Self.client(Self.user)), "whoever may set may clear")
        #expect(!opened.isPermitted("consent.clear", Self.client(Self.root)), "whoever may not set may not clear")
        let clearOnly = RoutingPolicy(permissions: [
            PermissionRule(method: TopicPattern("consent.clear"), allowed: AccessList(uids: [1000]))
        ])
        #expect(!clearOnly.isPermitted("consent.clear", Self.client(Self.user)), "a clear rule does not bypass set's default")
        let both = RoutingPolicy(permissions: [
            PermissionRule(method: TopicPattern("consent.clear"), allowed: AccessList(uids: [0])),
            PermissionRule(method: TopicPattern("consent.set"), allowed: AccessList(uids: [0, 1000])),
        ])
        #expect(both.isPermitted("consent.set", Self.client(Self.user)) && !both.isPermitted("consent.clear", Self.client(Self.user)))
        #expect(both.isPermitted("consent.clear", Self.client(Self.root)))
    }

    /// Watching traffic, reloading and log levels are a client's (the operator's, through a
    /// client): a plugin is refused even where a rule lets it call them, on its own or for an
    /// admin client (was in the handlers; SecurityTests checked one through a process).
    @Test func clientOnlyHostMethodsAreRefusedToPlugins() {
        let everyone = AccessList(uids: [0, 1000], plugins: ["echo"])
        let policy = RoutingPolicy(
            permissions: RoutingPolicy.clientOnlyMethods.map { PermissionRule(method: TopicPattern($0), allowed: everyone) }, hostUid: 4242)
        for m in RoutingPolicy.clientOnlyMethods.sorted() {
            for p: Principal in [.plugin("echo"), .plugin("echo", via: Self.client(Self.root))] {
                #expect(policy.isPermitted(m, p), "\(m): the rule lets \(p) through")
                guard case .refused(let e) = decide(p, m, policy: policy) else {
                    Issue.record("\(m) reached the host for \(p)")
                    continue
                }
                #expect(e.code == RPCError.Code.notPermitted.rawValue && e.message == "\(m) is for clients, not plugins")
                #expect(e.data?["method"] == .string(m))
            }
            guard case .host = decide(Self.client(Self.user), m, policy: policy) else { Issue.record("\(m) refused to a client"); continue }
        }
    }

    /// `consent.setApp` is the app layer of a plugin's own switches: plugins only (also acting
    /// for a client), on `<plugin>:…` only (was in the handler; SecurityTests checks one of each
    /// through a process).
    @Test func setAppIsAPluginsOnItsOwnSwitchesOnly() {
        let policy = RoutingPolicy()
        #expect(policy.setAppRefusal(.plugin("echo"), key: "echo:W") == nil)
        #expect(policy.setAppRefusal(.plugin("echo", via: Self.client(Self.user)), key: "echo:W") == nil, "for a client")
        #expect(policy.setAppRefusal(.plugin("echo"), key: nil) == nil, "who: a plugin (the method then reads the key)")
        let other = policy.setAppRefusal(.plugin("echo"), key: "ma:W")
        #expect(other?.code == RPCError.Code.notPermitted.rawValue)
        #expect(other?.message == "plugin echo may set the app layer of its own switches (echo:…) only, not ma:W")
        #expect(policy.setAppRefusal(.plugin("echo"), key: "device")?.code == -32005, "the master switch is the operator's")
        #expect(policy.setAppRefusal(.plugin("echo"), key: "echoX:W")?.code == -32005, "the prefix is the name and a colon")
        for key: String? in [nil, "echo:W"] {
            let client = policy.setAppRefusal(Self.client(Self.root), key: key)
            #expect(client?.message == "consent.setApp is called by plugins for their apps; clients use consent.set")
        }
        guard case .host = decide(Self.client(Self.user), "consent.setApp") else { Issue.record("not the host's"); return }
    }

    /// Topics and patterns follow the method-name rule (a publication's topic is its method):
    /// unbounded ones let one client hold the loop while matching (a review held it 34 s). Was
    /// SecurityTests.topicsAndPatternsFollowTheMethodNameRule, through a process.
    @Test func topicsAndPatternsFollowTheMethodNameRule() {
        let policy = RoutingPolicy()
        for bad in [String(repeating: "a", count: 257), "a b", "x.\u{7F}", "", "echo.echo\u{0}.x"] {
            #expect(policy.subscribeRefusal(bad)?.code == RPCError.Code.invalidParams.rawValue, "\(bad.prefix(9))")
            #expect(policy.publishRefusal(bad, configured: { _ in false })?.code == RPCError.Code.invalidParams.rawValue)
        }
        #expect(policy.subscribeRefusal(String(repeating: "a", count: 254) + ".*") == nil, "256 bytes")
    }

    /// A namespace a user provides methods in is that user's while any of its methods is
    /// provided (was SecurityTests.aProvidedNamespaceIsOneUsers, through two processes).
    @Test func aProvidedNamespaceIsOneUsers() {
        let policy = RoutingPolicy()
        let providers: [RoutingPolicy.Provider] = [("kiosk.render", 3, 0)]
        let refused = policy.provideRefusal("kiosk.pay", uid: 65534, configured: { _ in false }, providers: providers)
        #expect(refused?.code == RPCError.Code.notPermitted.rawValue)
        #expect(refused?.message == "cannot provide kiosk.pay: kiosk.* is provided by another user (client#3)")
        #expect(refused?.data?["namespace"] == "kiosk")
        #expect(
            policy.provideRefusal("mine.hello", uid: 65534, configured: { _ in false }, providers: providers) == nil, "a free namespace")
        #expect(policy.provideRefusal("kiosk.pay", uid: 0, configured: { _ in false }, providers: providers) == nil, "the same uid")
        #expect(
            policy.provideRefusal("kiosk.pay", configured: { _ in false }, providers: providers) == nil, "unknown credentials: names only")
        #expect(
            policy.provideRefusal("kiosk.pay", uid: 0, configured: { _ in false }, providers: [("kiosk.x", 4, nil)])?.code == -32005,
            "a provider without credentials is another user")
        #expect(policy.provideRefusal("kioskx.pay", uid: 65534, configured: { _ in false }, providers: providers) == nil, "by namespace")
    }

    /// Consent gates a call a plugin makes for a client as it gates the client's own (was
    /// ConsentTests.pluginToPluginMessagesAreGatedToo).
    @Test func pluginToPluginCallsAreGatedToo() {
        let c = Self.consent(["ma:Q": false])
        for p: Principal in [.plugin("echo", via: Self.client(Self.user)), .plugin("echo")] {
            guard case .denied(_, "ma:Q") = decide(p, "ma.eventRecord", consent: c, fields: ["appKey": "Q"]) else {
                Issue.record("\(p) passed a denied switch")
                continue
            }
        }
    }

    /// The configuration's `limits.requestTimeoutMs` is the timeout of a plugin without its own
    /// and of a provided method (was RoutingTests.requestTimeoutAnswersWithTimeoutError; the
    /// deadline's answer is PendingTableTests').
    @Test func theConfiguredRequestTimeoutIsTheDefault() {
        var config = HostConfig()
        config.limits.requestTimeoutMs = 300
        let policy = RoutingPolicy(config, hostUid: 0)
        guard case .forward(_, 300, false) = decide(Self.client(Self.user), "echo.sleep", policy: policy),
            case .forward(_, 300, true) = decide(Self.client(Self.user), "app.thing", policy: policy),
            case .forward(_, 5_000, false) = decide(Self.client(Self.user), "ma.ping", policy: policy)
        else {
            Issue.record("not the configured timeout")
            return
        }
    }

    /// A configuration without rules is at least as closed as the shipped etc/pylon.json for
    /// every operator method and principal.
    @Test func noRulesIsAsSafeAsTheShippedConfig() throws {
        let path = URL(fileURLWithPath: #filePath).deletingLastPathComponent().appendingPathComponent("../../etc/pylon.json").path
        let shipped = RoutingPolicy(try HostConfig.load(path: path, environment: { _ in nil }), hostUid: 4242)
        let empty = RoutingPolicy(hostUid: 4242)
        let principals: [Principal] = [
            Self.client(Self.root), Self.client(Self.user), Self.client(nil), Self.client(PeerCredentials(pid: 1, uid: 4242, gid: 4242)),
            .plugin("ma"), .plugin("ma", via: Self.client(Self.user)), .plugin("ma", via: Self.client(Self.root)),
        ]
        for m in Self.operatorMethods {
            for p in principals where empty.isPermitted(m, p) { #expect(shipped.isPermitted(m, p), "\(m) for \(p)") }
        }
    }

    // MARK: Principals (_onBehalfOf)

    @Test func principalsOfClientsAndPlugins() {
        let served: (Int64) -> Principal? = { $0 == 41 ? Self.client(Self.user, id: 3) : nil }
        #expect(RoutingPolicy.principal(client: (3, Self.user), plugin: nil, via: nil, served: served) == Self.client(Self.user, id: 3))
        #expect(RoutingPolicy.principal(client: (3, Self.user), plugin: nil, via: 41, served: served) == nil, "clients cannot name one")
        #expect(RoutingPolicy.principal(client: nil, plugin: "ma", via: nil, served: served) == .plugin("ma"))
        let chained = RoutingPolicy.principal(client: nil, plugin: "ma", via: 41, served: served)
        #expect(chained == Principal(plugin: "ma", client: 3, credentials: Self.user))
        #expect(chained?.actsForClient == true)
        #expect(RoutingPolicy.principal(client: nil, plugin: "ma", via: 42, served: served) == nil, "not a request it serves")
    }

    // MARK: Consent

    static func consent(_ switches: [String: Bool]) -> ConsentStore {
        var c = ConsentStore()
        for (k, v) in switches { c.set(k, granted: v) }
        return c
    }

    @Test func aDeniedSwitchRefusesWithItsKey() {
        let c = Self.consent(["ma:app1": false])
        guard case .denied(let spec, let key) = decide(Self.client(Self.user), "ma.eventRecord", consent: c, fields: ["appKey": "app1"])
        else {
            Issue.record("not denied")
            return
        }
        #expect(key == "ma:app1" && !spec.dropWhenDenied, "error form")
        guard case .forward = decide(Self.client(Self.user), "ma.eventRecord", consent: c, fields: ["appKey": "app2"]) else {
            Issue.record("another app's switch refused it")
            return
        }
        guard case .forward = decide(Self.client(Self.user), "ma.eventRecord", consent: c) else {
            Issue.record("an absent field refused it")
            return
        }
    }

    @Test func theDropFormCarriesItsResult() {
        let c = Self.consent(["ma:app1": false])
        guard case .denied(let spec, "ma:app1") = decide(Self.client(Self.user), "ma.optional", consent: c, fields: ["appKey": "app1"])
        else {
            Issue.record("not denied")
            return
        }
        #expect(spec.dropWhenDenied && spec.deniedResult == ["dropped": true])
    }

    @Test func theMasterSwitchRefusesEveryConsentMethodButNoOther() {
        let c = Self.consent([ConsentStore.master: false])
        guard case .denied(_, let key) = decide(Self.client(Self.root), "ma.eventRecord", consent: c) else {
            Issue.record("not denied")
            return
        }
        #expect(key == ConsentStore.master, "even without the field")
        guard case .forward = decide(Self.client(Self.root), "ma.ping", consent: c) else {
            Issue.record("a method without a consent template was refused")
            return
        }
        guard case .forward = decide(Self.client(Self.root), "echo.x", consent: c) else { Issue.record("echo refused"); return }
    }

    @Test func permissionIsCheckedBeforeConsent() {
        let policy = RoutingPolicy(permissions: [PermissionRule(method: TopicPattern("ma.*"), allowed: AccessList(uids: [0]))])
        let c = Self.consent(["ma:app1": false])
        guard
            case .refused(let e) = decide(Self.client(Self.user), "ma.eventRecord", policy: policy, consent: c, fields: ["appKey": "app1"])
        else {
            Issue.record("consent answered before permissions")
            return
        }
        #expect(e.code == RPCError.Code.notPermitted.rawValue)
    }

    // MARK: Disclosure

    @Test func whoSeesEverything() {
        var d = Disclosure()
        d.admins = AccessList(uids: [0], gids: [1001])
        let policy = RoutingPolicy(disclosure: d)
        #expect(policy.seesEverything(Self.client(Self.root)))
        #expect(policy.seesEverything(Self.client(Self.other)), "by gid")
        #expect(!policy.seesEverything(Self.client(Self.user)))
        #expect(!policy.seesEverything(Self.client(nil)))
        #expect(policy.seesEverything(.plugin("ma")), "a plugin on its own")
        #expect(!policy.seesEverything(.plugin("ma", via: Self.client(Self.user))), "a plugin acting for a user sees what the user sees")
        #expect(policy.seesEverything(.plugin("ma", via: Self.client(Self.root))))
    }

    @Test func adminTopicsReachAdminsOnly() {
        let policy = RoutingPolicy()
        #expect(policy.isAdminTopic("bus.plugin.exited") && policy.isAdminTopic("consent.changed"))
        #expect(!policy.isAdminTopic("app.news"))
        #expect(policy.clientReceives("bus.plugin.exited", credentials: Self.root))
        #expect(!policy.clientReceives("bus.plugin.exited", credentials: Self.user))
        #expect(!policy.clientReceives("bus.plugin.exited", credentials: nil))
        #expect(policy.clientReceives("app.news", credentials: Self.user))
        // `disclosure.adminTopics: []` opens host topics to every subscriber (was
        // SecurityTests.hostTopicsReachOnlyAdminsUnlessConfigured, through processes).
        var open = Disclosure()
        open.adminTopics = []
        let opened = RoutingPolicy(disclosure: open)
        #expect(opened.clientReceives("consent.changed", credentials: Self.user))
        #expect(opened.clientReceives("bus.client.closed", credentials: nil))
    }

    @Test func reservedAndConfiguredNamespacesCannotBeProvidedOrPublished() {
        let policy = RoutingPolicy()
        let configured: (String) -> Bool = { $0 == "echo" }
        #expect(policy.provideRefusal("app.thing", configured: configured) == nil)
        for m in ["bus.x", "consent.x", "echo.x", "ma.x", "uploader.enqueue"] {
            #expect(policy.provideRefusal(m, configured: configured)?.code == RPCError.Code.notPermitted.rawValue, "\(m)")
        }
        for m in ["nodot", "app.", "app.with space"] {
            #expect(policy.provideRefusal(m, configured: configured)?.code == RPCError.Code.invalidParams.rawValue, "\(m)")
        }
        #expect(policy.publishRefusal("app.news", configured: configured) == nil)
        #expect(policy.publishRefusal("plain", configured: configured) == nil, "a topic need not have a namespace")
        for t in ["bus.x", "consent.changed", "echo.x", "push.x"] {
            #expect(policy.publishRefusal(t, configured: configured)?.code == RPCError.Code.notPermitted.rawValue, "\(t)")
        }
        #expect(policy.publishRefusal("bad topic", configured: configured)?.code == RPCError.Code.invalidParams.rawValue)
    }
}
