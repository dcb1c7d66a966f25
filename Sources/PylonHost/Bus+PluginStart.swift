import CJSONC
import PylonCore
import PylonProtocol

#if canImport(Glibc)
import Glibc
#endif

/// Starting a plugin's process: resolving the executable, spawning it with a pre-connected
/// channel and its output relayed to the log, and the `bus.hello` handshake. When to start and
/// what to do about an exit is `Bus+Supervision`'s.
extension Bus {
    /// Resolves a plugin executable: absolute or relative paths as given; a bare name in
    /// `pluginDir`, else next to pylond itself, else on PATH.
    func resolveExec(_ exec: String) -> String {
        if exec.contains("/") { return exec }
        // PATH is left to uv_spawn, which searches it itself.
        for d in config.execSearchPath(selfDir: System.executableDirectory(), path: "") where access(d + "/" + exec, X_OK) == 0 {
            return d + "/" + exec
        }
        return exec
    }

    /// Spawns the plugin's process with its channel (fd 3) and output relays; returns its pid.
    func spawn(_ slot: PluginSlot) throws(UVError) -> Int32 {
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
            return !key.hasPrefix("PYLON_BUS_FD") && !key.hasPrefix("PYLON_PLUGIN_") && key != "PYLON_LOG_LEVEL"
                && key != "PYLON_LOG_FORMAT" && key != "NOTIFY_SOCKET"
                && !key.hasPrefix("WATCHDOG_") && pc.env[key] == nil
        }
        env.append("PYLON_BUS_FD=3")
        env.append("PYLON_PLUGIN_NAME=\(pc.name)")
        env.append("PYLON_PLUGIN_STATE_DIR=\(stateDir)")
        if let l = slot.logLevel {
            env.append("PYLON_LOG_LEVEL=\(l)")
        } else if pc.env["PYLON_LOG_LEVEL"] == nil {
            env.append("PYLON_LOG_LEVEL=\(config.logLevel)")
        }
        for (k, v) in pc.env.sorted(by: { $0.key < $1.key }) where !(k == "PYLON_LOG_LEVEL" && slot.logLevel != nil) {
            env.append("\(k)=\(v)")
        }
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
        slot.manifest = nil
        slot.output = PluginOutputFilter()
        for (stream, level) in [(out, Log.Level.info), (err, Log.Level.info)] {
            let plog = Log("plugin")
            // Weak: a child of the plugin may hold the pipe open after a reload retired the slot
            // and its process exited (an unowned reference then trapped the host).
            stream.onLine = { [pid = process.pid, name = pc.name, weak slot] line in
                // A plugin that already logs in Pylon's logfmt (the plugin kit does) is passed
                // through with its name appended; anything else is wrapped as a message; blank
                // lines and crash reports are condensed (PluginOutputFilter).
                // An sd-daemon `<N>` prefix sets the level (and is removed); other lines: info.
                let raw = String(decoding: line, as: UTF8.self)
                var scratch = PluginOutputFilter()
                let (action, lineLevel, text) =
                    slot.flatMap { $0.process?.pid == pid ? $0.output.classify(raw, plain: level) : nil }
                    ?? scratch.classify(raw, plain: level)
                if action != .drop { Log.relayPluginLine(text, plugin: name, pid: pid, level: lineLevel) }
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
        return process.pid
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
        // Its publications from now on (`publish` looks subscribers up in the index).
        peer.subscriptions = manifest.subscribes
        for p in manifest.subscribes { peerTable.subscriptions.add(p, peer.id) }
        let welcome = Welcome(
            protocolVersion: manifest.protocolVersion, config: slot.config.config,
            stateDir: config.stateDir + "/plugins/" + slot.config.name, consent: consentJSON(),
            heartbeatMs: slot.config.policy.heartbeatIntervalMs, limits: config.limits.json)
        sendResult(peer.conn, id: id, welcome.json)
        log.info(
            "plugin running",
            [
                "plugin": slot.config.name, "pid": slot.life.pid ?? 0, "version": manifest.version,
                "methods": manifest.methods.count,
            ])
        supervise(slot) { $0.handshakeCompleted(now: $1) }
    }
}
