import PylonCore
import PylonProtocol

/// Graceful stop and configuration reload.
extension Bus {
    /// Stops accepting work, asks every plugin to exit (`bus.shutdown`, channel closed), and calls
    /// `done` once all have exited or their grace periods ran out and they were killed.
    public func shutdown(_ done: @escaping () -> Void) {
        guard !shuttingDown else { return }
        shuttingDown = true
        onShutdownComplete = done
        log.info("shutting down", ["plugins": slots.count, "clients": clientCount])
        for id in pending.ids(where: { _ in true }) { complete(id, RPCError(.shuttingDown, "host is shutting down")) }
        for name in slotOrder { if let s = slots[name] { stopPlugin(s) } }
        for p in peers.values where !p.isPlugin { p.conn.closeAfterFlush() }
        checkShutdownComplete()
    }

    func checkShutdownComplete() {
        guard shuttingDown, slots.values.allSatisfy({ !$0.life.isAlive }), retiring.allSatisfy({ !$0.life.isAlive }) else { return }
        for s in slots.values { s.closeTimers() }
        let cb = onShutdownComplete
        onShutdownComplete = {}
        cb()
    }

    /// Applies a new configuration: limits and permissions at once; plugins added, removed, or
    /// restarted when their definition changed. The socket path, mode and state directory are
    /// fixed at start (a change is logged and ignored).
    public func reload(_ new: HostConfig) {
        if new.socketPath != config.socketPath || new.stateDir != config.stateDir || new.socketMode != config.socketMode
            || new.socketGroup != config.socketGroup
        {
            log.warn("reload: socket, socketMode, socketGroup and stateDir changes need a restart; keeping the old ones")
        }
        var next = new
        next.socketPath = config.socketPath
        next.stateDir = config.stateDir
        next.socketMode = config.socketMode
        next.socketGroup = config.socketGroup
        config = next
        if next.limits.maxDepth != tokener.maxDepth { tokener = Tokener(maxDepth: next.limits.maxDepth) }
        for p in peers.values {
            p.conn.maxLineBytes = next.limits.maxLineBytes
            p.conn.pauseAbove = next.limits.maxQueuedBytes
            p.conn.flushAboveBytes = next.limits.flushAboveBytes
            p.callerMember = nil
        }
        let wanted = Dictionary(uniqueKeysWithValues: next.plugins.filter(\.enabled).map { ($0.name, $0) })
        for name in slotOrder {
            guard let slot = slots[name] else { continue }
            if let pc = wanted[name] {
                if pc != slot.config {
                    log.info("reload: plugin definition changed; restarting", ["plugin": name])
                    retire(slot)
                    addPlugin(pc, after: slot)
                }
            } else {
                log.info("reload: plugin removed; stopping", ["plugin": name])
                retire(slot)
            }
        }
        for pc in next.plugins where pc.enabled && slots[pc.name] == nil {
            log.info("reload: plugin added", ["plugin": pc.name])
            addPlugin(pc)
        }
        log.info("configuration reloaded", ["plugins": slots.count])
    }

    /// Removes a slot from routing and stops its process.
    private func retire(_ slot: PluginSlot) {
        slots[slot.config.name] = nil
        slotOrder.removeAll { $0 == slot.config.name }
        if slot.life.isAlive { retiring.append(slot) }
        stopPlugin(slot)
    }
}
