import CJSONC
import PylonCore

#if canImport(Glibc)
import Glibc
#endif

/// Plugin processes: spawning with a pre-connected channel, handshake, heartbeats, and carrying
/// out what each plugin's `PluginLifecycle` decides.
extension Bus {
    public func startPlugins() {
        // Readiness is judged only once every configured plugin has been added: a plugin whose
        // spawn fails at once must not make the host report READY before the others start.
        addingPlugins = true
        for pc in config.plugins where pc.enabled { addPlugin(pc) }
        addingPlugins = false
        checkReady()
    }

    /// Adds a plugin and starts it, or, when it replaces a `predecessor` that is still exiting,
    /// starts it once that process is gone (until then calls get -32001 "not running").
    func addPlugin(_ pc: PluginConfig, after predecessor: PluginSlot? = nil) {
        let slot = PluginSlot(config: pc, seed: UInt64(truncatingIfNeeded: Loop.hrtimeNs) ^ UInt64(slots.count))
        slots[pc.name] = slot
        slotOrder.append(pc.name)
        guard let old = predecessor, old.life.isAlive else {
            perform(slot, slot.life.start(now: loop.nowMs))
            return
        }
        log.info("waiting for the old copy to exit before starting the new one", ["plugin": pc.name, "pid": old.pid])
        old.onGone = { [unowned self, weak slot] in
            // Only if no later reload replaced or removed it meanwhile.
            guard let slot, self.slots[pc.name] === slot, !self.shuttingDown else { return }
            self.perform(slot, slot.life.start(now: self.loop.nowMs))
        }
    }

    func perform(_ slot: PluginSlot, _ action: PluginLifecycle.Action) {
        let name = slot.config.name
        switch action {
        case .none:
            break
        case .spawn:
            do throws(UVError) {
                try spawn(slot)
            } catch {
                log.error("plugin spawn failed", ["plugin": name, "error": error.description])
                slot.pid = 0
                let next = slot.life.spawnFailed(now: loop.nowMs, error: error.description)
                slot.lastExit = slot.life.lastExitReason
                perform(slot, next)
            }
        case .kill(let sig):
            slot.process?.kill(sig)
        case .shutdown(let graceMs):
            // Ask first: bus.shutdown, then EOF on the channel (the plugin kit exits on either).
            if let peer = slot.peer {
                peer.conn.sendLine(#"{"jsonrpc":"2.0","method":"bus.shutdown"}"#)
                peer.conn.closeAfterFlush()
            }
            // Escalate after the grace period (neovim's proc_stop shape): SIGTERM, then SIGKILL
            // if the plugin is still there `termGraceMs` later.
            slot.timer = replaceTimer(slot.timer) { [unowned self, unowned slot] in
                guard slot.life.isAlive else { return }
                self.log.warn("plugin did not stop in time; sending SIGTERM", ["plugin": slot.config.name, "grace_ms": graceMs])
                slot.process?.kill(SIGTERM)
                slot.timer = self.replaceTimer(slot.timer) { [unowned self, unowned slot] in
                    guard slot.life.isAlive else { return }
                    self.log.warn("plugin ignored SIGTERM; killing", ["plugin": slot.config.name, "grace_ms": Bus.termGraceMs])
                    slot.process?.kill(SIGKILL)
                }
                slot.timer?.start(after: Bus.termGraceMs)
            }
            slot.timer?.start(after: graceMs)
        case .scheduleRestart(let ms):
            log.info("plugin restart scheduled", ["plugin": name, "in_ms": ms, "restarts": slot.life.restarts, "reason": slot.lastExit ?? "-"])
            publish(topic: "bus.plugin.exited", params: [
                "plugin": .string(name), "pid": .int(Int64(slot.pid)), "reason": .string(slot.lastExit ?? ""),
                "state": "backoff", "restartInMs": .int(Int64(ms)),
            ])
            slot.timer = replaceTimer(slot.timer) { [unowned self, unowned slot] in
                self.perform(slot, slot.life.backoffElapsed(now: self.loop.nowMs))
            }
            slot.timer?.start(after: ms)
        case .markFailed(let reason):
            log.error("plugin failed; not restarting", ["plugin": name, "reason": reason])
            publish(topic: "bus.plugin.exited", params: [
                "plugin": .string(name), "pid": .int(Int64(slot.pid)), "reason": .string(reason), "state": "failed",
            ])
            checkReady()
        }
    }

    func replaceTimer(_ old: Timer?, _ cb: @escaping () -> Void) -> Timer {
        old?.close()
        return Timer(loop: loop, cb)
    }

    /// Resolves a plugin executable: absolute or relative paths as given; a bare name in
    /// `pluginDir`, else next to pylond itself, else on PATH.
    func resolveExec(_ exec: String) -> String {
        if exec.contains("/") { return exec }
        var dirs: [String] = []
        if let d = config.pluginDir { dirs.append(d) }
        if let selfDir = System.executableDirectory() { dirs.append(selfDir) }
        for d in dirs where access(d + "/" + exec, X_OK) == 0 { return d + "/" + exec }
        return exec  // uv_spawn searches PATH
    }

    func spawn(_ slot: PluginSlot) throws(UVError) {
        let pc = slot.config
        let (hostEnd, pluginEnd) = try System.socketPair()
        let channel: Connection
        do {
            channel = try Connection(loop: loop, fd: hostEnd, maxLineBytes: config.limits.maxLineBytes)
        } catch {
            System.close(pluginEnd)
            throw error
        }
        let stateDir = config.stateDir + "/plugins/" + pc.name
        // plugins/ is traversable so a plugin running as another user reaches its own 0700 dir.
        _ = System.makeDirectories(config.stateDir + "/plugins", mode: 0o711)
        _ = System.makeDirectories(stateDir, mode: 0o700)

        var o = ChildProcess.Options(exec: resolveExec(pc.exec))
        o.args = pc.args
        // Inherited variables first, minus the host's private ones and any the plugin's config
        // sets (getenv returns the first match, so an override must replace, not append).
        var env = System.environment().filter { kv in
            let key = kv.split(separator: "=", maxSplits: 1).first.map(String.init) ?? kv
            return !key.hasPrefix("PYLON_BUS_FD") && !key.hasPrefix("PYLON_PLUGIN_") && key != "PYLON_LOG_LEVEL" && key != "PYLON_LOG_FORMAT" && key != "NOTIFY_SOCKET"
                && !key.hasPrefix("WATCHDOG_") && pc.env[key] == nil
        }
        env.append("PYLON_BUS_FD=3")
        env.append("PYLON_PLUGIN_NAME=\(pc.name)")
        env.append("PYLON_PLUGIN_STATE_DIR=\(stateDir)")
        if pc.env["PYLON_LOG_LEVEL"] == nil { env.append("PYLON_LOG_LEVEL=\(config.logLevel)") }
        for (k, v) in pc.env.sorted(by: { $0.key < $1.key }) { env.append("\(k)=\(v)") }
        o.env = env
        o.inheritFds = [(child: 3, parent: pluginEnd)]
        let out = Connection(loop: loop, maxLineBytes: 16 * 1024)
        let err = Connection(loop: loop, maxLineBytes: 16 * 1024)
        o.stdout = out
        o.stderr = err
        if let user = pc.user {
            guard let ids = lookupUser(user) else {
                System.close(pluginEnd); channel.close(); out.close(); err.close()
                throw UVError(-EINVAL, "unknown user \(user)")
            }
            o.uid = ids.uid
            o.gid = ids.gid
            _ = chown(stateDir, ids.uid, ids.gid)
        }
        let process: ChildProcess
        do {
            process = try ChildProcess(loop: loop, options: o) { [unowned self, slot] status, sig in
                self.pluginExited(slot, status: status, signal: sig)
            }
        } catch {
            System.close(pluginEnd)
            channel.close(); out.close(); err.close()
            throw error
        }
        System.close(pluginEnd)
        slot.process = process
        slot.pid = process.pid
        slot.manifest = nil
        slot.output = PluginOutputFilter()
        for (stream, level) in [(out, Log.Level.info), (err, Log.Level.warn)] {
            let plog = Log("plugin")
            stream.onLine = { [pid = process.pid, name = pc.name, unowned slot] line in
                // A plugin that already logs in Pylon's logfmt (the plugin kit does) is passed
                // through with its name appended; anything else is wrapped as a message; blank
                // lines and crash reports are condensed (PluginOutputFilter).
                let text = String(decoding: line, as: UTF8.self)
                switch slot.pid == pid ? slot.output.take(text) : .relay {
                case .relay: Log.relayPluginLine(text, plugin: name, pid: pid, level: level)
                case .debug: Log.relayPluginLine(text, plugin: name, pid: pid, level: .debug)
                case .drop: break
                }
            }
            stream.onOversized = { [pid = process.pid, name = pc.name] n, head in
                plog.emit(level, String(decoding: head, as: UTF8.self) + "… (line of \(n) bytes truncated)", ["plugin": name, "pid": pid])
            }
            stream.startReading()
        }
        let peer = newPeer(kind: .plugin(slot), conn: channel)
        // A plugin's replies are what drain its queue: never stop reading them.
        channel.pausesReadingWhenCongested = false
        slot.peer = peer
        channel.startReading()
        log.info("plugin spawned", ["plugin": pc.name, "pid": process.pid, "exec": o.exec])

        slot.timer = replaceTimer(slot.timer) { [unowned self, unowned slot] in
            self.perform(slot, slot.life.handshakeTimedOut(now: self.loop.nowMs))
        }
        slot.timer?.start(after: pc.policy.startTimeoutMs)
    }

    func pluginHello(_ slot: PluginSlot, _ peer: Peer, msg: JSONRef, id: OpaquePointer?) {
        let params = JSONRef.toJSON(msg.member("params"))
        let manifest: Manifest
        do throws(RPCError) {
            manifest = try Manifest.parse(params)
        } catch {
            log.error("plugin handshake rejected", ["plugin": slot.config.name, "error": error.message])
            sendError(peer.conn, id: id, error)
            return
        }
        guard manifest.name == slot.config.name else {
            let e = RPCError(.invalidParams, "bus.hello: plugin announced name \(manifest.name) but is configured as \(slot.config.name)")
            log.error("plugin handshake rejected", ["plugin": slot.config.name, "error": e.message])
            sendError(peer.conn, id: id, e)
            return
        }
        slot.manifest = manifest
        peer.handshaken = true
        slot.timer?.stop()
        sendResult(peer.conn, id: id, [
            "protocol": .int(Int64(manifest.protocolVersion)),
            "config": slot.config.config,
            "stateDir": .string(config.stateDir + "/plugins/" + slot.config.name),
            "consent": consentJSON(),
            "heartbeatMs": .int(Int64(slot.config.policy.heartbeatIntervalMs)),
            "limits": config.limits.json,
        ])
        perform(slot, slot.life.handshakeCompleted(now: loop.nowMs))
        log.info("plugin running", ["plugin": slot.config.name, "pid": slot.pid, "version": manifest.version,
                                    "methods": manifest.methods.count])
        startHeartbeat(slot)
        checkReady()
    }

    func startHeartbeat(_ slot: PluginSlot) {
        slot.heartbeatOutstanding = nil
        let interval = slot.config.policy.heartbeatIntervalMs
        slot.heartbeat = replaceTimer(slot.heartbeat) { [unowned self, unowned slot] in self.heartbeatTick(slot) }
        // Ticks aligned to multiples of the interval on the loop clock: plugins with the same
        // interval are pinged in the same loop turn, so an idle host wakes once per interval
        // rather than once per plugin (at least one full interval after the handshake).
        let now = loop.nowMs
        slot.heartbeat?.start(after: 2 * interval - now % interval, repeat: interval)
    }

    func heartbeatTick(_ slot: PluginSlot) {
        guard slot.life.state == .running, let peer = slot.peer, !peer.closed else { return }
        let now = loop.nowMs
        if slot.heartbeatOutstanding != nil {
            // Hung means silent: a plugin still answering what was queued before the heartbeat
            // (a busy one) is making progress and is not killed.
            let lastSign = max(slot.heartbeatSentAtMs, peer.lastInboundMs)
            if now - lastSign >= slot.config.policy.heartbeatTimeoutMs {
                log.error("plugin hung: heartbeat not answered", ["plugin": slot.config.name, "pid": slot.pid,
                                                                  "waited_ms": now - slot.heartbeatSentAtMs])
                slot.lastExit = "hung"
                perform(slot, slot.life.heartbeatMissed(now: now))
            }
            return
        }
        slot.heartbeatSentAtMs = now
        let timeout = slot.config.policy.heartbeatTimeoutMs + slot.config.policy.heartbeatIntervalMs * 2
        slot.heartbeatOutstanding = call(peer, method: "bus.heartbeat", params: nil, timeoutMs: timeout) {
            [unowned self, unowned slot] r in
            guard case .success = r else { return }
            slot.heartbeatOutstanding = nil
            slot.lastHeartbeatRttMs = self.loop.nowMs - slot.heartbeatSentAtMs
        }
    }

    /// How long a plugin that closed its channel may take to exit by itself before it is killed
    /// (so a clean exit is reported with its real status, not as a liveness kill).
    static let channelCloseGraceMs: UInt64 = 1_000

    func pluginChannelClosed(_ slot: PluginSlot, _ peer: Peer) {
        guard slot.peer === peer else { return }
        slot.peer = nil
        slot.heartbeat?.stop()
        // A stop in progress keeps its own SIGKILL timer.
        guard slot.life.isAlive, !shuttingDown, !slot.life.isStopping else { return }
        // Usually the first sign of a crash; the exit that follows is the warning.
        log.info("plugin closed its bus channel", ["plugin": slot.config.name, "pid": slot.pid])
        slot.timer = replaceTimer(slot.timer) { [unowned self, unowned slot] in
            self.perform(slot, slot.life.channelClosed(now: self.loop.nowMs))
        }
        slot.timer?.start(after: Bus.channelCloseGraceMs)
    }

    func pluginExited(_ slot: PluginSlot, status: Int64, signal: Int32) {
        let name = slot.config.name
        slot.process = nil
        slot.heartbeat?.stop()
        slot.heartbeatOutstanding = nil
        if let peer = slot.peer {
            slot.peer = nil
            peer.conn.close()
            peerClosed(peer)
        }
        let action = slot.life.exited(now: loop.nowMs, status: status, signal: signal)
        slot.lastExit = slot.life.lastExitReason
        // A requested stop or restart is not a failure; a crash is one warning with its reason.
        let requested = shuttingDown || slot.life.state == .stopped || slot.lastExit == "restarted on request"
        let level: Log.Level = (requested || (status == 0 && signal == 0)) ? .info : .warn
        if let crash = slot.output.crashReason {
            log.emit(level, "plugin exited", ["plugin": name, "pid": slot.pid, "status": status, "signal": signal,
                                               "reason": slot.lastExit ?? "-", "crash": crash, "next": slot.life.state.rawValue])
        } else {
            log.emit(level, "plugin exited", ["plugin": name, "pid": slot.pid, "status": status, "signal": signal,
                                               "reason": slot.lastExit ?? "-", "next": slot.life.state.rawValue])
        }
        if !slot.life.isAlive, slot.life.state != .backoff { slot.timer?.stop() }
        perform(slot, action)
        if !slot.life.isAlive, let gone = slot.onGone {
            slot.onGone = nil
            gone()
        }
        checkReady()
        if shuttingDown { checkShutdownComplete() }
    }

    /// Ready (READY=1) once every plugin has left `starting` at least once: it is running, or
    /// known to be failing (backoff/failed) — a broken plugin must not hold the whole host back.
    func checkReady() {
        guard !readyReported, !addingPlugins else { return }
        var allLeft = true
        for slot in slots.values {
            if slot.life.state != .starting { slot.everLeftStarting = true }
            allLeft = allLeft && slot.everLeftStarting
        }
        guard allLeft else { return }
        readyReported = true
        onReady()
    }

    /// Stops one plugin (reload removed it, or shutdown).
    /// Time a stopping plugin gets between SIGTERM and SIGKILL.
    static let termGraceMs: UInt64 = 1_000

    func stopPlugin(_ slot: PluginSlot) {
        slot.heartbeat?.stop()
        let action = slot.life.stop(now: loop.nowMs)
        if !slot.life.isAlive { slot.timer?.stop() }
        perform(slot, action)
    }
}
