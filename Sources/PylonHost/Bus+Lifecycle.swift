import PylonCore
import PylonProtocol

#if canImport(Glibc)
import Glibc
#endif

/// Graceful stop and configuration reload.
extension Bus {
    /// Stops accepting work, asks every plugin to exit (`bus.shutdown`, channel closed), and calls
    /// `done` once all have exited or their grace periods ran out and they were killed.
    public func shutdown(_ done: @escaping () -> Void) {
        guard !hostState.shuttingDown else { return }
        hostState.shuttingDown = true
        hostState.onShutdownComplete = done
        log.info("shutting down", ["plugins": pluginSet.slots.count, "clients": clientCount])
        for id in forwarder.pending.ids(where: { _ in true }) { complete(id, RPCError(.shuttingDown, "host is shutting down")) }
        for name in pluginSet.slotOrder { if let s = pluginSet.slots[name] { stopPlugin(s) } }
        for p in peerTable.peers.values where !p.isPlugin { p.conn.closeAfterFlush() }
        checkShutdownComplete()
    }

    func checkShutdownComplete() {
        guard hostState.shuttingDown, pluginSet.slots.values.allSatisfy({ !$0.life.isAlive }),
            pluginSet.retiring.allSatisfy({ !$0.life.isAlive })
        else { return }
        for s in pluginSet.slots.values { s.closeTimers() }
        let cb = hostState.onShutdownComplete
        hostState.onShutdownComplete = {}
        cb()
    }

    /// Applies a new configuration: limits and permissions at once; plugins added, removed, or
    /// restarted when their definition changed. The socket path, mode, group and state directory
    /// are fixed at start: a change is reported (`notApplied`, and the log) and the old value kept.
    @discardableResult
    public func reload(_ new: HostConfig) -> ReloadReport {
        var report = ReloadReport()
        for setting in HostConfig.fixedAtStart(running: config, new: new) {
            report.notApplied.append((setting, "fixed at start: restart pylond to change it"))
        }
        for (setting, reason) in report.notApplied {
            log.warn("reload: setting not applied; keeping the running value", ["setting": setting, "reason": reason])
        }
        var next = new
        next.socketPath = config.socketPath
        next.stateDir = config.stateDir
        next.socketMode = config.socketMode
        next.socketGroup = config.socketGroup
        config = next
        if next.limits.maxDepth != tokener.maxDepth { tokener = Tokener(maxDepth: next.limits.maxDepth) }
        for p in peerTable.peers.values {
            p.conn.maxLineBytes = next.limits.maxLineBytes
            p.conn.pauseAbove = next.limits.maxQueuedBytes
            p.conn.flushAboveBytes = next.limits.flushAboveBytes
            p.callerMember = nil
        }
        let wanted = Dictionary(uniqueKeysWithValues: next.plugins.filter(\.enabled).map { ($0.name, $0) })
        for name in pluginSet.slotOrder {
            guard let slot = pluginSet.slots[name] else { continue }
            if let pc = wanted[name] {
                if pc != slot.config {
                    log.info("reload: plugin definition changed; restarting", ["plugin": name])
                    retire(slot)
                    addPlugin(pc, after: slot)
                    report.restarted.append(name)
                }
            } else {
                log.info("reload: plugin removed; stopping", ["plugin": name])
                retire(slot)
                report.removed.append(name)
            }
        }
        for pc in next.plugins where pc.enabled && pluginSet.slots[pc.name] == nil {
            log.info("reload: plugin added", ["plugin": pc.name])
            addPlugin(pc)
            report.added.append(pc.name)
        }
        log.info("configuration reloaded", ["plugins": pluginSet.slots.count])
        return report
    }

    /// `bus.reload`: what SIGHUP does, answered. Who may is the routing policy's (an operator
    /// method: admins and pylond's own uid unless a rule says otherwise; a plugin never:
    /// `RoutingPolicy.hostCallRefusal`).
    func reloadAllowed() throws(RPCError) {
        guard onReloadRequest != nil else { throw RPCError(.internalError, "this host cannot reload its configuration") }
    }

    /// Reloads from a later loop turn and then answers `idText` (nil: a notification) on `peer`:
    /// a reload changes every connection's framing limits, which cannot happen while one of them
    /// is delivering the very line that asked for it. The reload answers once the plugins have
    /// checked the new file (`Host.reload`); the loop goes on meanwhile.
    func deferReload(_ peer: Peer, idText: String?) {
        hostState.reloadWaiters.append((peer, idText))
        peer.inflight += 1
        guard hostState.reloadTimer == nil else { return }  // one reload answers every request made meanwhile
        hostState.reloadTimer = loop.after(ms: 1) { [unowned self] in
            self.hostState.reloadTimer = nil
            let waiters = self.hostState.reloadWaiters
            self.hostState.reloadWaiters = []
            guard let reload = self.onReloadRequest else {
                return self.answerReload(waiters, .failure(RPCError(.internalError, "this host cannot reload its configuration")))
            }
            reload { [weak self] result in self?.answerReload(waiters, result) }
        }
    }

    private func answerReload(_ waiters: [(Peer, String?)], _ result: Result<JSON, RPCError>) {
        for (p, id) in waiters {
            p.inflight -= 1
            guard let id, !p.closed else { continue }
            switch result {
            case .success(let v): sendResult(p.conn, idText: id, v)
            case .failure(let e): sendError(p.conn, idText: id, e)
            }
            closeIfDone(p)
        }
    }

    /// `bus.logLevel {level, plugin?}`: the host's level, or a plugin's (sent to it as a
    /// `bus.logLevel` notification, and its level at later restarts). Clients only; which ones is
    /// the routing policy's (an operator method: admins unless a rule says otherwise; never a
    /// plugin: `RoutingPolicy.hostCallRefusal`).
    func logLevelMethod(_ peer: Peer, _ params: JSON?) throws(RPCError) -> JSON {
        guard let name = params?["level"]?.stringValue, let level = Log.Level(name: name) else {
            throw RPCError(.invalidParams, "params.level must be debug, info, warn or error")
        }
        guard let plugin = params?["plugin"], plugin != .null else {
            log.info("log level set", ["level": name, "client": peer.id])
            Log.minimum = level
            return ["level": .string(name), "scope": "host"]
        }
        guard let pluginName = plugin.stringValue, let slot = pluginSet.slots[pluginName] else {
            throw RPCError(.invalidParams, "no plugin named \(plugin.stringValue ?? plugin.serialized)")
        }
        slot.logLevel = name
        var sent = false
        if let p = slot.peer, p.handshaken, !p.closed {
            p.conn.send(envelope: Envelope.notification(method: HostMethod.logLevel, params: .value(["level": .string(name)])))
            sent = true
        }
        log.info("plugin log level set", ["plugin": pluginName, "level": name, "client": peer.id])
        // Not running now: it starts at this level.
        return ["level": .string(name), "plugin": .string(pluginName), "sent": .bool(sent)]
    }

    /// Removes a slot from routing and stops its process.
    private func retire(_ slot: PluginSlot) {
        pluginSet.slots[slot.config.name] = nil
        pluginSet.slotOrder.removeAll { $0 == slot.config.name }
        if slot.life.isAlive { pluginSet.retiring.append(slot) }
        stopPlugin(slot)
    }
}
