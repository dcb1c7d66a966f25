import PylonCore
import PylonProtocol

/// Supervision's I/O shell: feeds each plugin's `PluginLifecycle` its events (start, spawn
/// outcome, timers, channel close, exit, stop, restart) and carries out every action it returns.
/// Nothing here decides; it only performs and logs.
extension Bus {
    public func startPlugins() {
        // Readiness is judged only once every configured plugin has been added: a plugin whose
        // spawn fails at once must not make the host report READY before the others start.
        pluginSet.addingPlugins = true
        for pc in config.plugins where pc.enabled { addPlugin(pc) }
        pluginSet.addingPlugins = false
        checkReady()
    }

    /// Adds a plugin and starts it, or, when it replaces a `predecessor` that is still exiting,
    /// starts it once that process is gone (until then calls get -32001 "not running").
    func addPlugin(_ pc: PluginConfig, after predecessor: PluginSlot? = nil) {
        let slot = PluginSlot(config: pc, seed: UInt64(truncatingIfNeeded: Loop.hrtimeNs) ^ UInt64(pluginSet.slots.count))
        slot.onStateChange = { [weak self, weak slot] in
            if let self, let slot { self.startWaitersChanged(slot) }
        }
        pluginSet.slots[pc.name] = slot
        pluginSet.slotOrder.append(pc.name)
        // The copy to wait for: the one replaced, or one a reload removed or replaced before and
        // is still stopping (removed then added again, changed twice): never two at once.
        let replaced = predecessor?.life.isAlive == true ? predecessor : nil
        let alive = replaced ?? pluginSet.retiring.last { $0.config.name == pc.name && $0.life.isAlive }
        if let old = alive {
            log.info("waiting for the old copy to exit before starting the new one", ["plugin": pc.name, "pid": old.life.pid ?? 0])
            old.successor = slot
            return
        }
        supervise(slot) { $0.start(now: $1) }
    }

    /// Stops one plugin (reload removed it, or shutdown).
    func stopPlugin(_ slot: PluginSlot) {
        supervise(slot) { $0.stop(now: $1) }
    }

    /// Feeds one event to `slot`'s machine at the loop's time, then performs what it returned.
    /// The machine has fully moved before any action runs, so an action that calls back in (a
    /// spawn's outcome, a channel closing) sees the new phase.
    func supervise(_ slot: PluginSlot, _ event: (inout PluginLifecycle, _ now: UInt64) -> [PluginLifecycle.Action]) {
        let actions = event(&slot.life, loop.nowMs)
        for action in actions { perform(slot, action) }
    }

    private func perform(_ slot: PluginSlot, _ action: PluginLifecycle.Action) {
        let name = slot.config.name
        switch action {
        case .spawn:
            do throws(UVError) {
                let pid = try spawn(slot)
                supervise(slot) { $0.spawned(pid: pid, now: $1) }
            } catch {
                log.error("plugin spawn failed", ["plugin": name, "error": error.description])
                slot.process = nil
                supervise(slot) { $0.spawnFailed(now: $1, error: error.description) }
            }
        case .armTimer(let t):
            if t.kind == .channelClose {
                // Usually the first sign of a crash; the exit that follows is the warning.
                log.info("plugin closed its bus channel", ["plugin": name, "pid": slot.life.pid ?? 0])
            }
            let now = loop.nowMs
            slot.armTimer(t.kind, afterMs: t.at > now ? t.at - now : 0, repeatMs: t.repeatMs, loop: loop) {
                [unowned self, unowned slot, kind = t.kind] in self.timerFired(slot, kind)
            }
        case .cancelTimer(let kind):
            slot.cancelTimer(kind)
        case .sendHeartbeat(let timeoutMs):
            guard let peer = slot.peer, !peer.closed else { return }
            // Only a result counts as an answer; a failed call leaves the heartbeat outstanding.
            _ = call(peer, method: HostMethod.heartbeat, params: nil, timeoutMs: timeoutMs) { [unowned self, weak slot] r in
                guard case .success = r, let slot else { return }
                self.supervise(slot) { $0.heartbeatAnswered(now: $1) }
            }
        case .sendShutdown:
            // Ask first: bus.shutdown, then EOF on the channel (the plugin kit exits on either).
            if let peer = slot.peer {
                peer.conn.send(envelope: Envelope.notification(method: HostMethod.shutdown))
                peer.conn.closeAfterFlush()
            }
        case .signal(let sig, let cause):
            logSignal(slot, cause)
            slot.process?.kill(sig)
        case .publishExited(let pid, let reason, let restartInMs?):
            log.info("plugin restart scheduled", ["plugin": name, "in_ms": restartInMs, "restarts": slot.life.restarts, "reason": reason])
            publish(
                topic: HostTopic.pluginExited,
                params: [
                    "plugin": .string(name), "pid": .int(Int64(pid)), "reason": .string(reason),
                    "state": "backoff", "restartInMs": .int(Int64(restartInMs)),
                ])
        case .publishExited(let pid, let reason, nil):
            log.error("plugin failed; not restarting", ["plugin": name, "reason": reason])
            publish(
                topic: HostTopic.pluginExited,
                params: [
                    "plugin": .string(name), "pid": .int(Int64(pid)), "reason": .string(reason), "state": "failed",
                ])
        case .reportReady:
            checkReady()
        }
    }

    private func timerFired(_ slot: PluginSlot, _ kind: PluginLifecycle.TimerKind) {
        let lastInbound = slot.peer?.lastInboundMs ?? 0
        supervise(slot) { $0.timerFired(kind, now: $1, lastInboundMs: lastInbound) }
    }

    private func logSignal(_ slot: PluginSlot, _ cause: PluginLifecycle.SignalCause) {
        let (name, pid) = (slot.config.name, slot.life.pid ?? 0)
        switch cause {
        case .noHandshake(let ms):
            log.warn("plugin did not complete its handshake in time; killing", ["plugin": name, "pid": pid, "timeout_ms": ms])
        case .hung(let ms):
            log.error("plugin hung: heartbeat not answered", ["plugin": name, "pid": pid, "waited_ms": ms])
        case .channelClosed(let ms):
            log.warn("plugin closed its bus channel but did not exit; killing", ["plugin": name, "pid": pid, "grace_ms": ms])
        case .restartRequested:
            log.debug("killing plugin for the requested restart", ["plugin": name, "pid": pid])
        case .stopGraceExpired(let ms):
            log.warn("plugin did not stop in time; sending SIGTERM", ["plugin": name, "pid": pid, "grace_ms": ms])
        case .termIgnored(let ms):
            log.warn("plugin ignored SIGTERM; killing", ["plugin": name, "pid": pid, "grace_ms": ms])
        }
    }

    func pluginChannelClosed(_ slot: PluginSlot, _ peer: Peer) {
        guard slot.peer === peer else { return }
        slot.peer = nil
        supervise(slot) { $0.channelClosed(now: $1) }
    }

    func pluginExited(_ slot: PluginSlot, status: Int64, signal: Int32) {
        let name = slot.config.name
        let pid = slot.life.pid ?? 0
        let requested = hostState.shuttingDown || slot.life.exitIsRequested
        if let peer = slot.peer {
            slot.peer = nil
            peer.conn.close()
            peerClosed(peer)
        }
        let actions = slot.life.exited(now: loop.nowMs, status: status, signal: signal)
        // A requested stop or restart is not a failure; a crash is one warning with its reason.
        let level: Log.Level = (requested || (status == 0 && signal == 0)) ? .info : .warn
        let (reason, next) = (slot.life.lastExitReason ?? "-", slot.life.state.rawValue)
        if let crash = slot.output.crashReason {
            log.emit(
                level, "plugin exited",
                [
                    "plugin": name, "pid": pid, "status": status, "signal": signal,
                    "reason": reason, "crash": crash, "next": next,
                ])
        } else {
            log.emit(
                level, "plugin exited",
                [
                    "plugin": name, "pid": pid, "status": status, "signal": signal,
                    "reason": reason, "next": next,
                ])
        }
        for action in actions { perform(slot, action) }
        if !slot.life.isAlive, let i = pluginSet.retiring.firstIndex(where: { $0 === slot }) {
            pluginSet.retiring.remove(at: i)
            slot.closeTimers()
        }
        if !slot.life.isAlive, let next = slot.successor {
            slot.successor = nil
            // Only if no later reload replaced or removed it meanwhile.
            if pluginSet.slots[next.config.name] === next, !hostState.shuttingDown { supervise(next) { $0.start(now: $1) } }
        }
        if hostState.shuttingDown { checkShutdownComplete() }
    }

    /// Ready (READY=1) once every plugin has left `starting` at least once: it is running, or
    /// known to be failing (backoff/failed) — a broken plugin must not hold the whole host back.
    func checkReady() {
        guard !pluginSet.readyReported, !pluginSet.addingPlugins, pluginSet.slots.values.allSatisfy(\.life.hasLeftStarting) else { return }
        pluginSet.readyReported = true
        onReady()
    }
}
