import PylonCore
import PylonProtocol

#if canImport(Glibc)
import Glibc
#endif

/// The host's own methods: `bus.*` and `consent.*`.
extension Bus {
    static let hostMethods = HostMethod.served

    func hostMethod(_ peer: Peer, _ principal: Principal, _ method: String, _ params: JSON?) -> Result<JSON, RPCError> {
        do throws(RPCError) {
            switch method {
            case HostMethod.ping: return .success(["pong": true, "version": .string(pylonVersion)])
            case HostMethod.status: return .success(status(for: peer, principal))
            case HostMethod.describe: return .success(try describe(for: peer, principal, params))
            case HostMethod.subscribe: return .success(try subscribe(peer, params, add: true))
            case HostMethod.unsubscribe: return .success(try subscribe(peer, params, add: false))
            case HostMethod.publish: return .success(try publishMethod(peer, params))
            case HostMethod.provide: return .success(try provide(peer, params, add: true))
            case HostMethod.unprovide: return .success(try provide(peer, params, add: false))
            case HostMethod.restart: return .success(try restartMethod(params))
            case HostMethod.consentGet: return .success(try consentGet(params))
            case HostMethod.consentSet: return .success(try consentSet(params, layer: .operatorLayer))
            case HostMethod.consentSetApp:
                // The app layer of a plugin's own switches (`RoutingPolicy.setAppRefusal`).
                if let e = policy.setAppRefusal(principal, key: nil) { throw e }
                let key = try str(params, "key", aliases: ["switch", "name"])
                if let e = policy.setAppRefusal(principal, key: key) { throw e }
                return .success(try consentSet(params, layer: .app))
            case HostMethod.consentList: return .success(consentJSON(all: seesEverything(principal)))
            case HostMethod.consentClear:
                // Who may: whoever may set the switch (`RoutingPolicy.permission`, decided before).
                return .success(try consentClear(params))
            case HostMethod.monitor: return .success(try monitorMethod(peer, params))
            case HostMethod.reload:
                // A notification (requests are answered by `deferReload` from handleRequest).
                try reloadAllowed()
                deferReload(peer, idText: nil)
                return .success(["reloading": true])
            case HostMethod.logLevel: return .success(try logLevelMethod(peer, params))
            case HostMethod.hello:
                throw RPCError(.invalidRequest, "bus.hello is only valid as a plugin's first message")
            default:
                throw RPCError(.methodNotFound, "method not found: \(method)")
            }
        } catch {
            return .failure(error)
        }
    }

    /// A required non-empty string parameter; `aliases` are accepted spellings (documented).
    func str(_ params: JSON?, _ key: String, aliases: [String] = []) throws(RPCError) -> String {
        for k in [key] + aliases {
            if let s = params?[k]?.stringValue, !s.isEmpty { return s }
        }
        throw RPCError(.invalidParams, "params.\(key) (non-empty string) is required")
    }

    /// The daemon's state. Every client's entry (pid, uid, gid, what it provides) is shown to those
    /// who see everything (admins, plugins); others see their own entry and how many there are.
    func status(for requester: Peer?, _ principal: Principal) -> JSON {
        let all = seesEverything(principal)
        let now = loop.nowMs
        var plugins: [JSON] = []
        for name in pluginSet.slotOrder {
            guard let s = pluginSet.slots[name] else { continue }
            var o: JSONObject = [
                "name": .string(name), "pid": s.life.pid.map { .int(Int64($0)) } ?? .null,
                "state": .string(s.life.state.rawValue), "restarts": .int(Int64(s.life.restarts)),
                "uptime_s": s.life.runningSince.map { .double(Double(now - $0) / 1000) } ?? .int(0),
                "requests_served": .int(Int64(s.served)),
                "inflight": .int(Int64(s.peer.map { forwarder.pending.count(targeting: $0.id) } ?? 0)),
                "queued_bytes": .int(Int64(s.peer?.conn.queuedBytes ?? 0)),
                "restart_policy": .string(s.config.policy.restart.rawValue),
                // Requests waiting for it to start (StartWaitQueue).
                "waiting": .int(Int64(s.waiting.count)),
                "version": s.manifest.map { .string($0.version) } ?? .null,
            ]
            if let r = s.life.lastExitReason { o["last_exit"] = .string(r) }
            if let r = s.life.failedReason { o["failed_reason"] = .string(r) }
            if let ms = s.life.backoffMs { o["backoff_ms"] = .int(Int64(ms)) }
            if let rtt = s.life.lastHeartbeatRttMs { o["heartbeat_rtt_ms"] = .int(Int64(rtt)) }
            if let pid = s.life.pid, let rss = System.rssKiB(pid: pid) { o["rss_kib"] = .int(Int64(rss)) }
            plugins.append(.object(o))
        }
        var clients: [JSON] = []
        for p in peerTable.peers.values.sorted(by: { $0.id < $1.id }) where !p.isPlugin && (all || p === requester) {
            var o: JSONObject = [
                "id": .int(Int64(p.id)), "inflight": .int(Int64(p.inflight)),
                "queued_bytes": .int(Int64(p.conn.queuedBytes)), "requests": .int(Int64(p.requestsSent)),
                "subscriptions": .array(p.subscriptions.map { .string($0.text) }),
                "dropped_notifications": .int(Int64(p.droppedNotifications)),
                "connected_s": .double(Double(now - p.connectedAtMs) / 1000),
            ]
            if let c = p.credentials { o["pid"] = .int(Int64(c.pid)); o["uid"] = .int(Int64(c.uid)); o["gid"] = .int(Int64(c.gid)) }
            if !p.provided.isEmpty { o["provides"] = .array(p.provided.sorted().map { .string($0) }) }
            if p.conn.isBackpressured { o["backpressured"] = true }
            if p.conn.isHeld { o["held"] = true }
            clients.append(.object(o))
        }
        var refused = JSONObject()
        for k in counters.consentRefused.keys.sorted() { refused[k] = .int(Int64(counters.consentRefused[k]!)) }
        var consentInfo = consentJSON(all: all).objectValue!
        if all { consentInfo["refused"] = .object(refused) }
        return [
            "version": .string(pylonVersion), "pid": .int(Int64(System.pid)),
            "uptime_s": .double(Double(now - hostState.startedAtMs) / 1000), "socket": .string(config.socketPath),
            "state": hostState.shuttingDown ? "stopping" : (pluginSet.readyReported ? "running" : "starting"),
            "rss_kib": System.rssKiB().map { .int(Int64($0)) } ?? .null,
            "plugins": .array(plugins), "clients": .array(clients), "clients_total": .int(Int64(clientCount)),
            "counters": [
                "routed": .int(Int64(counters.routed)), "routed_fast": .int(Int64(counters.fastRouted)),
                "inflight": .int(
                    Int64(
                        forwarder.pending.values.reduce(0) {
                            $1.isHostCall ? $0 : $0 + 1
                        })),
                "timeouts": .int(Int64(counters.timeouts)), "protocol_errors": .int(Int64(counters.protocolErrors)),
                "published": .int(Int64(counters.published)), "held_for_congestion": .int(Int64(counters.heldForCongestion)),
                "slow_readers_closed": .int(Int64(counters.slowReadersClosed)), "batches": .int(Int64(counters.batches)),
                "dropped_for_uid_queue": .int(Int64(counters.droppedForUidQueue)),
                "connections_refused": .int(Int64(refusedTotal)),
                "monitors": .int(Int64(monitoring.monitors.count)), "monitors_dropped": .int(Int64(counters.monitorsDropped)),
                "answered_on_success": .int(Int64(counters.answeredOnSuccess)),
                "waited_for_start": .int(Int64(pluginSet.slots.values.reduce(0) { $0 + $1.waiting.admittedTotal })),
            ],
            "limits": config.limits.json,
            "consent": .object(consentInfo),
        ]
    }

    /// The manifests, the host's methods, and the methods clients provide: every provider to
    /// those who see everything, only the caller's own to others (a provider is a client: its
    /// methods say what another user runs). `{"format":"openrpc"}`: the same methods, under the
    /// same rule, as an OpenRPC document (`describeOpenRPC`, Bus+Describe.swift).
    func describe(for requester: Peer?, _ principal: Principal, _ params: JSON? = nil) throws(RPCError) -> JSON {
        switch params?["format"] {
        case nil, .null?, .string("pylon")?: break
        case .string("openrpc")?: return describeOpenRPC(for: requester, principal)
        default: throw RPCError(.invalidParams, "params.format must be \"pylon\" or \"openrpc\"")
        }
        var plugins = JSONObject()
        for name in pluginSet.slotOrder {
            guard let s = pluginSet.slots[name] else { continue }
            if let m = s.manifest {
                var o = m.json.objectValue!
                o["state"] = .string(s.life.state.rawValue)
                plugins[name] = .object(o)
            } else {
                plugins[name] = ["state": .string(s.life.state.rawValue), "methods": []]
            }
        }
        return [
            "host": .array(Bus.hostMethods.map { .string($0) }),
            "hostMethods": .array(Bus.hostMethodsJSON),
            "plugins": .object(plugins),
            "provided": .object(providedVisible(to: requester, principal)),
            "protocol": .int(Int64(Manifest.supportedProtocols.upperBound)),
        ]
    }

    func subscribe(_ peer: Peer, _ params: JSON?, add: Bool) throws(RPCError) -> JSON {
        let pattern = try str(params, "pattern", aliases: ["topic"])
        guard !peer.isPlugin else { throw RPCError(.invalidRequest, "plugins subscribe through their manifest") }
        if let e = policy.subscribeRefusal(pattern) { throw e }
        let p = TopicPattern(pattern)
        if add {
            if !peer.subscriptions.contains(p) {
                guard peer.subscriptions.count < config.limits.maxSubscriptionsPerConnection else {
                    throw RPCError(
                        .overloaded, "too many subscriptions (limit \(config.limits.maxSubscriptionsPerConnection))",
                        data: ["limit": "maxSubscriptionsPerConnection"])
                }
                peer.subscriptions.append(p)
                peerTable.subscriptions.add(p, peer.id)
            }
        } else {
            peer.subscriptions.removeAll { $0 == p }
            peerTable.subscriptions.remove(p, peer.id)
        }
        return ["subscriptions": .array(peer.subscriptions.map { .string($0.text) })]
    }

    func publishMethod(_ peer: Peer, _ params: JSON?) throws(RPCError) -> JSON {
        let topic = try str(params, "topic")
        // It becomes the notification's method: the method-name rule, and no namespace of the
        // host's or a plugin's.
        if let e = policy.publishRefusal(topic, configured: { pluginSet.slots[$0] != nil }) { throw e }
        let data = params?["data"] ?? params?["params"] ?? .null
        switch data {
        case .null, .object, .array: break
        default: throw RPCError(.invalidParams, "params.data must be an object or an array (it becomes the notification's params)")
        }
        let n = Envelope.notification(method: topic, params: .value(data)).withUnsafeBytes {
            publish(topic: topic, line: $0, from: peer)
        }
        return ["delivered": .int(Int64(n))]
    }

    func provide(_ peer: Peer, _ params: JSON?, add: Bool) throws(RPCError) -> JSON {
        guard !peer.isPlugin else { throw RPCError(.invalidRequest, "plugins serve methods through their manifest") }
        var names: [String] = []
        if let m = params?["method"]?.stringValue { names.append(m) }
        if let ms = params?["methods"]?.arrayValue {
            for m in ms {
                guard let s = m.stringValue else { throw RPCError(.invalidParams, "params.methods must be strings") }
                names.append(s)
            }
        }
        guard !names.isEmpty else { throw RPCError(.invalidParams, "params.method or params.methods is required") }
        for n in names {
            if add, let other = peerTable.provided[n], other !== peer {
                throw RPCError(.invalidParams, "\(n) is already provided by client#\(other.id)")
            }
            // Names, namespaces, and a namespace another user provides in (`RoutingPolicy`).
            let providers = peerTable.provided.lazy.map { RoutingPolicy.Provider($0.key, $0.value.id, $0.value.credentials?.uid) }
            let uid = add ? peer.credentials?.uid : nil
            if let e = policy.provideRefusal(n, uid: uid, configured: { pluginSet.slots[$0] != nil }, providers: providers) { throw e }
        }
        if add, peer.provided.union(names).count > config.limits.maxProvidesPerConnection {
            throw RPCError(
                .overloaded, "too many provided methods (limit \(config.limits.maxProvidesPerConnection))",
                data: ["limit": "maxProvidesPerConnection", "value": .int(Int64(config.limits.maxProvidesPerConnection))])
        }
        for n in names {
            if add {
                peerTable.provided[n] = peer
                peer.provided.insert(n)
            } else if peerTable.provided[n] === peer {
                peerTable.provided[n] = nil
                peer.provided.remove(n)
            }
        }
        return ["provides": .array(peer.provided.sorted().map { .string($0) })]
    }

    /// Manual restart: clears `failed` without spending the automatic restart budget.
    func restartMethod(_ params: JSON?) throws(RPCError) -> JSON {
        let name = try str(params, "plugin")
        guard let slot = pluginSet.slots[name] else { throw RPCError(.invalidParams, "no plugin named \(name)") }
        // A new definition waiting for the old copy to exit starts then: starting it now would
        // run two copies on one state directory.
        if pluginSet.retiring.contains(where: { $0.successor === slot && $0.life.isAlive }) {
            throw RPCError(.pluginUnavailable, "\(name) is waiting for its old copy to exit; it starts then")
        }
        log.info("manual restart requested", ["plugin": name])
        supervise(slot) { $0.restartRequested(now: $1) }
        return ["plugin": .string(name), "state": .string(slot.life.state.rawValue)]
    }
}

public let pylonVersion = "0.1.0"
