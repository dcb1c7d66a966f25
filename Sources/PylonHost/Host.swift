import PylonCore
import PylonProtocol

#if canImport(Glibc)
import Glibc
#endif

/// The daemon's shell: the client socket, signals, systemd notification and watchdog around a `Bus`.
public final class Host {
    public let loop: Loop
    public let bus: Bus
    let configPath: String
    var listener: Listener?
    var signals: [SignalWatcher] = []
    var watchdog: Timer?
    /// Writes `metricsTextfile` (see MetricsExporter.swift).
    var metrics: MetricsExporter?
    let log = Log("host")
    public private(set) var exitCode: Int32 = 0
    /// The plugins' checks of the configuration a reload is about to apply, while they run.
    var reloadCheck: PluginCheckRun?
    /// Reloads asked for while a check runs: one more reload answers them all once it ends (the
    /// file may have changed since the running one read it).
    var reloadsWaiting: [(source: String, done: (Result<JSON, RPCError>) -> Void)] = []
    /// Command-line overrides, re-applied to every reloaded configuration.
    public var overrides: (socket: String?, stateDir: String?, logLevel: String?) = (nil, nil, nil)

    public init(config: HostConfig, configPath: String) {
        loop = Loop()
        self.configPath = configPath
        bus = Bus(loop: loop, config: config, hostUid: getuid())
    }

    /// Creates directories, binds the socket, starts plugins and runs the loop until stopped.
    public func run() -> Int32 {
        System.ignoreSIGPIPE()
        System.unblockAllSignals()
        let cfg = bus.config
        do throws(IOError) {
            try System.createDirectories(atPath: cfg.stateDir, mode: 0o700)
        } catch {
            log.error("cannot create state directory", ["path": cfg.stateDir, "error": error.description])
            return 1
        }
        if let slash = cfg.socketPath.lastIndex(of: "/"), case let dir = String(cfg.socketPath[..<slash]), !dir.isEmpty {
            do throws(IOError) {
                try System.createDirectories(atPath: dir, mode: 0o755)
            } catch {
                log.error("cannot create socket directory", ["path": dir, "error": error.description])
                return 1
            }
        }
        var group: gid_t? = nil
        if let g = cfg.socketGroup {
            guard let gid = lookupGroup(g) else {
                log.error("unknown socketGroup", ["group": g])
                return 1
            }
            group = gid
        }
        do throws(UVError) {
            let l = try Listener(loop: loop, path: cfg.socketPath, mode: mode_t(cfg.socketMode), group: group)
            l.onConnection = { [unowned self, unowned l] in
                guard let c = l.accept(loop: self.loop, maxLineBytes: self.bus.config.limits.maxLineBytes) else { return }
                self.bus.adoptClient(c)
            }
            listener = l
        } catch {
            log.error("cannot listen on the client socket", ["path": cfg.socketPath, "error": error.description])
            return 1
        }
        log.info("listening", ["socket": cfg.socketPath, "mode": String(cfg.socketMode, radix: 8), "pid": System.pid])

        signals.append(SignalWatcher(loop: loop, signal: SIGTERM) { [unowned self] _ in self.stop(reason: "SIGTERM") })
        signals.append(SignalWatcher(loop: loop, signal: SIGINT) { [unowned self] _ in self.stop(reason: "SIGINT") })
        signals.append(SignalWatcher(loop: loop, signal: SIGHUP) { [unowned self] _ in self.reload(source: "SIGHUP") { _ in } })
        bus.onReloadRequest = { [unowned self] done in self.reload(source: "bus.reload", done) }
        startWatchdog()

        bus.onReady = { [unowned self] in
            System.sdNotify("READY=1\nSTATUS=serving \(self.bus.pluginSet.slots.count) plugins\nMAINPID=\(System.pid)")
            self.log.info("ready", ["socket": cfg.socketPath, "plugins": self.bus.pluginSet.slots.count])
        }
        bus.startPlugins()
        if let path = cfg.metricsTextfile {
            metrics = MetricsExporter(bus: bus, path: path, intervalMs: cfg.metricsIntervalMs)
        }
        loop.run()
        return exitCode
    }

    func stop(reason: String) {
        log.info("stop requested", ["reason": reason])
        System.sdNotify("STOPPING=1")
        listener?.close()
        listener = nil
        reloadCheck?.cancel()
        reloadCheck = nil
        bus.shutdown { [unowned self] in self.finish() }
    }

    private func finish() {
        for s in signals { s.close() }
        signals.removeAll()
        watchdog?.close()
        metrics?.close()
        log.info("stopped")
        // Let close callbacks and final writes run, then leave the loop.
        loop.flushDirty()
        loop.stop()
    }

    /// Re-reads the configuration file, has every enabled plugin check its own `config` with its
    /// strict reader (`PluginCheckRun`: the plugins' `--check-config`, run on the loop), and only
    /// then applies it (SIGHUP, `bus.reload`); `done` gets the answer. A refused file changes
    /// nothing and is answered with its error: file:line:col for JSON errors, the setting's path
    /// for the host's settings, file:line and the plugin for a plugin's setting (the running
    /// plugins keep their configuration). systemd's reload fails then through `pylonctl reload`
    /// (pylond.service's ExecReload, exit 78), since sd_notify has no way to say "reload failed".
    func reload(source: String, _ done: @escaping (Result<JSON, RPCError>) -> Void) {
        // Stopping: a reload would start the plugins it adds, and the host would wait for them
        // forever (a second SIGTERM is ignored once stopping).
        guard !bus.hostState.shuttingDown else {
            log.warn("reload ignored: the host is stopping")
            return done(.failure(RPCError(.shuttingDown, "host is shutting down")))
        }
        guard reloadCheck == nil else {
            reloadsWaiting.append((source, done))
            return
        }
        System.sdNotify("RELOADING=1")
        let loaded: (config: HostConfig, text: [UInt8])
        do throws(ConfigError) {
            loaded = try HostConfig.loadDocument(path: configPath)
        } catch {
            System.sdNotify("READY=1")
            return done(.failure(refused(error.description, source: source)))
        }
        let missing = loaded.config.executableProblems().map { "\(configPath): \($0)" }
        reloadCheck = PluginCheckRun(loop: loop, invocations: loaded.config.pluginCheckInvocations()) { [unowned self] check in
            self.reloadCheck = nil
            for w in check.warnings { self.log.warn("reload: a plugin's check warns", ["warning": w, "source": source]) }
            let problems = missing + HostConfig.located(check.problems, path: self.configPath, text: loaded.text)
            if !problems.isEmpty {
                var e = self.refused(problems.joined(separator: "; "), source: source)
                if var data = e.data?.objectValue {
                    data["problems"] = .array(problems.map { .string($0) })
                    if let p = check.problems.first { data["plugin"] = .string(p.plugin) }
                    e.data = .object(data)
                }
                done(.failure(e))
            } else if self.bus.hostState.shuttingDown {
                self.log.warn("reload ignored: the host is stopping")
                done(.failure(RPCError(.shuttingDown, "host is shutting down")))
            } else {
                done(.success(self.apply(loaded.config, source: source)))
            }
            System.sdNotify("READY=1")
            // Asked for meanwhile: one more reload answers them all.
            let waiting = self.reloadsWaiting
            self.reloadsWaiting = []
            guard let first = waiting.first else { return }
            self.reload(source: first.source) { r in for w in waiting { w.done(r) } }
        }
    }

    /// A refused configuration: logged, and the answer that says the running one stays.
    private func refused(_ error: String, source: String) -> RPCError {
        log.error("reload failed; keeping the running configuration", ["error": error, "source": source])
        return RPCError(
            .configRefused, "configuration refused; the running one stays: \(error)",
            data: ["path": .string(configPath), "error": .string(error)])
    }

    /// Applies a configuration every check accepted; the answer says what changed.
    private func apply(_ loaded: HostConfig, source: String) -> JSON {
        var c = loaded
        var hostNotApplied: [(setting: String, reason: String)] = []
        if let s = overrides.socket { c.socketPath = s }
        if let s = overrides.stateDir { c.stateDir = s }
        if let l = overrides.logLevel {
            if c.logLevel != l { hostNotApplied.append(("logLevel", "pylond --log-level \(l) overrides it")) }
            c.logLevel = l
        }
        for (setting, reason) in hostNotApplied {
            log.warn("reload: setting not applied; keeping the running value", ["setting": setting, "reason": reason])
        }
        Log.minimum = Log.Level(name: c.logLevel) ?? .info
        let old = bus.config
        var report = bus.reload(c)
        report.notApplied = hostNotApplied + report.notApplied
        // The metrics textfile follows the new settings (a new path or interval starts a new writer).
        if c.metricsTextfile != old.metricsTextfile || c.metricsIntervalMs != old.metricsIntervalMs {
            metrics?.close()
            metrics = c.metricsTextfile.map { MetricsExporter(bus: bus, path: $0, intervalMs: c.metricsIntervalMs) }
            log.info("reload: metrics textfile settings applied", ["path": c.metricsTextfile ?? "-", "interval_ms": c.metricsIntervalMs])
        }
        var answer = report.json.objectValue!
        answer["config"] = .string(configPath)
        answer["source"] = .string(source)
        return .object(answer)
    }

    /// systemd's watchdog: when WATCHDOG_USEC is set, ping at half the interval from the loop, so a
    /// wedged loop stops the pings and systemd restarts the daemon.
    private func startWatchdog() {
        guard let s = System.env("WATCHDOG_USEC"), let usec = UInt64(s), usec > 0 else { return }
        if let p = System.env("WATCHDOG_PID"), let pid = Int32(p), pid != System.pid { return }
        let ms = max(usec / 2000, 1)
        watchdog = Timer(loop: loop, unref: true) { System.sdNotify("WATCHDOG=1") }
        watchdog?.start(after: ms, repeat: ms)
        log.info("systemd watchdog enabled", ["interval_ms": ms])
    }
}
