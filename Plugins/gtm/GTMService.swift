import PylonCore
import PylonHTTP
import PylonPluginKit
import PylonStore
import PylonTagEngine

#if canImport(Glibc)
import Glibc
#endif

/// The gtm plugin's service: open containers (default → saved → network, the opener), their
/// refresh schedule, preview, values, the data layer and tags.
final class GTMService {
    let plugin: Plugin
    /// The settings, read once from the host's welcome.
    let limits: GTMLimits
    /// Created on the first network load: libcurl's initialisation is a large share of an idle
    /// plugin's memory (the one lazy member, for that reason; nothing is patched after `open`).
    lazy var http = HTTPClient(loop: plugin.loop)
    /// Saved containers, lifetime values and held hits (`gtm.db`); nil when it could not be
    /// opened (saved containers disabled, said once in the log), decided in `open`.
    let store: SavedStore?
    let log: GTMLog
    let pacer: Pacer
    /// Every owner's state (Tenant.swift): a call sees only its owner's.
    var tenants: [Owner: Tenant] = [:]
    let environment: TagEnvironment
    /// The clock (wall time, ms); injected so the machines stay testable.
    var now: () -> Int64 = { System.wallClockMs() }
    /// Hits held (GTMService+Hits): on disk or waiting for this turn's transaction, plugin-wide
    /// (`maxHeldHits`).
    var hitsHeld = 0
    var holdQueue: [HoldingHit] = []
    static let uploaderRetry = BackoffPolicy(initialMs: 50, maxMs: 1_600)
    /// This process start's prefix of hit ids (and `gtm.started`'s run).
    let runPrefix = System.randomHex(6)
    var hitSeq: UInt64 = 0

    struct Handler {
        let method: String
        let client: Int64
    }

    struct Counters {
        var pushes = 0
        /// Pushes whose rules and tags are done (`pushes` minus this: still queued or waiting for
        /// function-call macros); tests wait on it instead of sleeping.
        var pushesHandled = 0
        var tagsFired = 0
        var hitsQueued = 0
        var hitsDroppedForConsent = 0
        var functionCallFailures = 0
        /// Hits sent again because the uploader was restarting or slow.
        var hitsRetried = 0
        /// Hits dropped because `maxHeldHits` were held already.
        var hitsDropped = 0

        static func + (a: Counters, b: Counters) -> Counters {
            Counters(
                pushes: a.pushes + b.pushes, pushesHandled: a.pushesHandled + b.pushesHandled, tagsFired: a.tagsFired + b.tagsFired,
                hitsQueued: a.hitsQueued + b.hitsQueued,
                hitsDroppedForConsent: a.hitsDroppedForConsent + b.hitsDroppedForConsent,
                functionCallFailures: a.functionCallFailures + b.functionCallFailures, hitsRetried: a.hitsRetried + b.hitsRetried,
                hitsDropped: a.hitsDropped + b.hitsDropped)
        }

        var json: JSONObject {
            [
                "pushes": .int(Int64(pushes)), "pushesHandled": .int(Int64(pushesHandled)), "tagsFired": .int(Int64(tagsFired)),
                "hitsQueued": .int(Int64(hitsQueued)),
                "hitsDroppedForConsent": .int(Int64(hitsDroppedForConsent)), "functionCallFailures": .int(Int64(functionCallFailures)),
                "hitsRetried": .int(Int64(hitsRetried)), "hitsDropped": .int(Int64(hitsDropped)),
            ]
        }
    }

    static let hitStream = "gtm.hits"
    /// `_img` pixels: a `"delivery": "get"` stream of the uploader, which GETs each record's `url`.
    static let pixelStream = "gtm.pixels"
    static let hitConsent = "gtm:hits"
    /// A container's own consent switch: its hits are collected only while it is granted.
    static func containerConsent(_ containerId: String) -> String { "gtm:" + containerId }

    private init(plugin: Plugin, limits: GTMLimits, store: SavedStore?, log: GTMLog) {
        self.plugin = plugin
        self.limits = limits
        self.store = store
        self.log = log
        pacer = Pacer(loop: plugin.loop, budgetMs: limits.maxBusyMsPerTurn, maxQueued: limits.maxDeferredEvaluations)
        environment = GTMService.systemEnvironment(version: plugin.version, overrides: limits.environment)
    }

    /// The service, from the host's welcome: the configuration read (`GTMLimits`; a problem: exit
    /// 78, EX_CONFIG), the log set up, `gtm.db` opened (or saved containers disabled), lifetime
    /// values and held hits restored; clients learn of the restart (`gtm.started`).
    static func open(_ plugin: Plugin) -> GTMService {
        let limits: GTMLimits
        do throws(ConfigProblems) {
            limits = try GTMLimits(plugin.config)
        } catch {
            plugin.log.error("invalid gtm configuration", ["error": error.description])
            System.exit(exitStatusConfigError)
        }
        for w in limits.warnings { plugin.log.warn("configuration", ["warning": w]) }
        let log = GTMLog(plugin: plugin, level: limits.logLevel)
        log.maxLinesPerOwner = limits.maxLogLinesPerOwner
        log.publishOwnerLines = limits.publishOwnerLogLines
        log.burst = limits.logBurst
        log.perSecond = limits.logLinesPerSecond
        var store: SavedStore?
        var storeError: String?
        do {
            store = try SavedStore(path: plugin.stateDir + "/gtm.db")
        } catch {
            storeError = error.description
        }
        let gtm = GTMService(plugin: plugin, limits: limits, store: store, log: log)
        // Clients learn of a restart (their containers and handlers are gone): no uid's data.
        plugin.publish("gtm.started", ["run": .string(gtm.runPrefix), "ts": .int(gtm.now())])
        if gtm.environment.osVersion.isEmpty { log.warning(nil, "OS version unknown (uname failed): the _ov macro is unresolved") }
        if let storeError {
            log.error(nil, "cannot open the saved-container store: \(storeError) (saved containers disabled)")
        } else {
            gtm.restoreLifetimeValues()
            gtm.restoreHeldHits()
        }
        return gtm
    }

    // MARK: Opening

    func open(_ call: Call) {
        guard let who = caller(call) else { return }
        guard let id = containerId(call) else { return }
        var type = OpenType.preferNonDefault
        if let t = call.params["openType"] {
            guard let s = t.stringValue, let ot = OpenType(rawValue: s) else {
                call.fail(RPCError(.invalidParams, "openType must be prefer_non_default, prefer_fresh or default"))
                return
            }
            type = ot
        }
        let timeout = OpenerRule.timeout(call.params["timeoutMs"]?.intValue)
        guard let tenant = tenant(who.owner, create: true, call) else { return }
        let owner = tenant.owner
        // Opening an id that is already open returns the open one (waiting only while a load
        // the open type cares about is in flight).
        if let inst = tenant.instances[id] {
            if type == .lowLevel || (!inst.loading && inst.savedPhaseDone) {
                replyOpen(call, inst)
            } else {
                wait(call, inst, type, timeout)
            }
            return
        }
        guard tenant.instances.count < limits.maxOpenContainers else {
            call.fail(
                RPCError(
                    .overloaded, "too many open containers (maxOpenContainers \(limits.maxOpenContainers) per owner)",
                    data: ["limit": "maxOpenContainers"]))
            return
        }
        let inst = ContainerInstance(
            id: id, owner: owner, container: .empty(limits: limits.engine), openedAfterPush: tenant.pushSeq,
            limiter: RefreshRateLimiter(
                capacity: limits.refreshBucket, refillMs: limits.refreshRefillMs,
                minSpacingMs: limits.refreshMinSpacingMs))
        switch DefaultContainers.load(id: id, dir: limits.defaultsDir, maxBytes: limits.maxContainerBytes, limits: limits.engine) {
        case .success(let d)?:
            inst.container = d.container
            inst.defaultFile = d.file
            for w in d.container.warnings.prefix(20) { log.warning(owner, "\(id) default container: \(w)") }
        case .failure(let e)?:
            log.error(owner, "default container for \(id) not usable: \(e.description)")
        case nil:
            log.warning(owner, "no default container for \(id) in \(limits.defaultsDir.isEmpty ? "(no defaultsDir)" : limits.defaultsDir)")
        }
        inst.preview = tenant.previews[id]
        tenant.instances[id] = inst
        if type == .lowLevel {
            replyOpen(call, inst)
        } else {
            wait(call, inst, type, timeout)
        }
        load(inst)
    }

    private func wait(_ call: Call, _ inst: ContainerInstance, _ type: OpenType, _ timeoutMs: Int64) {
        let w = ContainerInstance.Waiter(call: call, type: type, startMs: now())
        inst.waiters.append(w)
        // The timeout: the caller gets the current container, default or not.
        w.timer = plugin.loop.after(ms: UInt64(timeoutMs)) { [unowned self, unowned inst] in self.release(w, inst) }
    }

    private func release(_ w: ContainerInstance.Waiter, _ inst: ContainerInstance) {
        guard let i = inst.waiters.firstIndex(where: { $0 === w }) else { return }
        inst.waiters.remove(at: i)
        w.timer?.close()
        w.timer = nil
        replyOpen(w.call, inst)
    }

    func openResult(_ inst: ContainerInstance) -> JSON {
        let stale =
            !inst.isDefault && RefreshTiming.isStale(fetchedAtMs: inst.lastRefreshMs, nowMs: now(), periodMs: limits.refreshPeriodMs)
        return [
            "containerId": .string(inst.id), "isDefault": .bool(inst.isDefault), "source": .string(inst.source.rawValue),
            "version": .string(inst.container.version), "stale": .bool(stale), "lastRefreshMs": .int(inst.lastRefreshMs),
            "preview": .bool(inst.preview != nil),
        ]
    }

    private func replyOpen(_ call: Call, _ inst: ContainerInstance) {
        call.reply(openResult(inst))
        if !inst.answered {
            inst.answered = true
            releaseValueWaiters(inst)
        }
        var p: JSONObject = [
            "containerId": .string(inst.id), "isDefault": .bool(inst.isDefault), "source": .string(inst.source.rawValue),
        ]
        for (k, v) in inst.owner.json { p[k] = v }
        plugin.publish("gtm.container.available", .object(p))
    }

    /// Reports a lifecycle event and releases the waiters whose open type it satisfies.
    private func report(_ inst: ContainerInstance, _ e: RefreshEvent) {
        var p: JSONObject = ["containerId": .string(inst.id)]
        for (k, v) in inst.owner.json { p[k] = v }
        switch e {
        case .begin(let k): p["status"] = "begin"; p["type"] = .string(k.rawValue)
        case .success(let k, _): p["status"] = "success"; p["type"] = .string(k.rawValue)
        case .failure(let k, let why): p["status"] = "failure"; p["type"] = .string(k.rawValue); p["reason"] = .string(why)
        }
        log.debug(
            inst.owner,
            "\(inst.id): refresh \(p["status"]!.stringValue!) (\(p["type"]!.stringValue!))\(p["reason"].map { ": " + $0.stringValue! } ?? "")"
        )
        plugin.publish("gtm.container.refresh", .object(p))
        for w in inst.waiters where OpenerRule.releases(w.type, e, startMs: w.startMs) { release(w, inst) }
    }

    // MARK: Loading: saved, then network

    /// The first load: the saved copy if there is one (adopted; network load at saved + 12 h),
    /// else the network now. A preview container goes to the network at once.
    private func load(_ inst: ContainerInstance) {
        if inst.preview != nil {
            inst.savedPhaseDone = true
            networkLoad(inst)
            return
        }
        report(inst, .begin(.saved))
        let saved: SavedStore.Saved?
        do throws(SQLiteError) {
            saved = try store?.load(inst.owner, inst.id)
        } catch {
            inst.savedPhaseDone = true
            report(inst, .failure(.saved, reason: "io_error"))
            networkLoad(inst)
            return
        }
        guard let saved else {
            inst.savedPhaseDone = true
            report(inst, .failure(.saved, reason: "no_saved_container"))
            networkLoad(inst)
            return
        }
        guard let c = try? Container.parse(text: saved.body, limits: limits.engine) else {
            inst.savedPhaseDone = true
            report(inst, .failure(.saved, reason: "io_error"))
            networkLoad(inst)
            return
        }
        inst.container = c
        inst.source = .saved
        inst.lastRefreshMs = saved.fetchedAtMs
        inst.etag = saved.etag
        inst.savedPhaseDone = true
        report(inst, .success(.saved, lastRefreshMs: saved.fetchedAtMs))
        schedule(
            inst,
            RefreshTiming.nextLoadDelayMs(
                after: .adoptedSaved(savedAtMs: saved.fetchedAtMs), nowMs: now(),
                periodMs: limits.refreshPeriodMs))
    }

    func schedule(_ inst: ContainerInstance, _ delayMs: Int64) {
        if inst.refreshTimer == nil {
            inst.refreshTimer = Timer(loop: plugin.loop) { [unowned self, unowned inst] in
                inst.refreshDueMs = nil
                self.networkLoad(inst)
            }
        }
        inst.refreshDueMs = now() + delayMs
        inst.refreshTimer?.start(after: UInt64(max(0, delayMs)))
    }

    func containerURL(_ inst: ContainerInstance) -> String {
        let base = limits.backend + "/v1/gtm/containers/" + inst.id
        guard let p = inst.preview else { return base }
        return base + "/draft?gtm_auth=" + GTMService.queryEscape(p.auth) + "&gtm_preview=" + GTMService.queryEscape(p.preview)
            + (p.debug ? "&gtm_debug=x" : "")
    }

    /// One network request for the container (the draft in preview), with the ETag of the
    /// copy in use so an unchanged container costs a 304.
    func networkLoad(_ inst: ContainerInstance) {
        guard !inst.loading else { return }
        inst.loading = true
        inst.refreshTimer?.stop()
        report(inst, .begin(.network))
        var headers: [(String, String)] =
            [("Accept", "application/json")] + DeviceCredential.headers(limits.credentialFile, log: plugin.log)
        if inst.preview == nil, inst.source != .default, let e = inst.etag { headers.append(("If-None-Match", e)) }
        let previewAtStart = inst.preview
        // One byte over maxContainerBytes is kept, so the check below answers server_error; curl
        // stops reading there, not at the end of whatever the server sends.
        let req = HTTPRequest(
            method: "GET", url: containerURL(inst), headers: headers, timeoutMs: limits.fetchTimeoutMs,
            maxResponseBytes: limits.maxContainerBytes + 1)
        http.send(req) {
            [weak self, weak inst] r in
            guard let self, let inst, self.tenants[inst.owner]?.instances[inst.id] === inst else { return }
            inst.loading = false
            guard inst.preview == previewAtStart else {
                self.networkLoad(inst)  // the preview changed while loading: fetch what is wanted now
                return
            }
            switch r {
            case .failure(let e) where e.responseTooLarge:
                self.networkFailed(inst, "server_error", "container larger than maxContainerBytes \(self.limits.maxContainerBytes)")
            case .failure(let e):
                // curl 6/7: cannot resolve / connect — no network; anything else a network error.
                self.networkFailed(inst, e.code == 6 || e.code == 7 ? "no_network" : "network_error", e.description)
            case .success(let resp) where resp.status == 304:
                inst.lastRefreshMs = self.now()
                if inst.source == .saved { inst.source = .network }
                try? self.store?.touch(inst.owner, inst.id, fetchedAtMs: inst.lastRefreshMs)
                self.log.info(inst.owner, "\(inst.id): not modified (ETag \(inst.etag ?? ""))")
                self.report(inst, .success(.network, lastRefreshMs: inst.lastRefreshMs))
                self.schedule(inst, self.limits.refreshPeriodMs)
            case .success(let resp) where resp.status == 200:
                guard resp.body.count <= self.limits.maxContainerBytes else {
                    self.networkFailed(inst, "server_error", "container larger than maxContainerBytes \(self.limits.maxContainerBytes)")
                    return
                }
                let text = resp.bodyText
                let c: Container
                do throws(ContainerError) { c = try Container.parse(text: text, limits: self.limits.engine) } catch {
                    self.networkFailed(inst, "server_error", "container not usable: \(error.description)")
                    return
                }
                for w in c.warnings.prefix(20) { self.log.warning(inst.owner, "\(inst.id) v\(c.version): \(w)") }
                inst.container = c
                inst.source = .network
                inst.lastRefreshMs = self.now()
                if inst.preview == nil {
                    inst.etag = resp.headers["etag"]
                    do throws(SQLiteError) {
                        try self.store?.save(
                            inst.owner, inst.id, .init(body: text, version: c.version, etag: inst.etag, fetchedAtMs: inst.lastRefreshMs))
                    } catch {
                        self.log.error(inst.owner, "\(inst.id): cannot save the container: \(error.description)")
                    }
                }
                self.log.info(
                    inst.owner, "\(inst.id): loaded version \(c.version) from the network\(inst.preview != nil ? " (preview draft)" : "")")
                self.report(inst, .success(.network, lastRefreshMs: inst.lastRefreshMs))
                self.schedule(inst, self.limits.refreshPeriodMs)
            case .success(let resp):
                self.networkFailed(
                    inst, resp.status >= 500 || resp.status == 404 || resp.status == 403 ? "server_error" : "unknown_error",
                    "HTTP \(resp.status)")
            }
        }
    }

    private func networkFailed(_ inst: ContainerInstance, _ reason: String, _ detail: String) {
        log.warning(inst.owner, "\(inst.id): network load failed: \(reason) (\(detail))")
        report(inst, .failure(.network, reason: reason))
        schedule(inst, limits.retryAfterFailureMs)
    }

    // MARK: Refresh, close, preview

    /// The call's `containerId` if it follows the rule (`GTMLimits.validContainerId`); else the
    /// call is answered -32602 and nil (nothing about it is logged: it is the caller's input).
    func containerId(_ call: Call) -> String? {
        guard let id = call.stringParam("containerId"), GTMLimits.validContainerId(id) else {
            call.fail(RPCError(.invalidParams, GTMLimits.containerIdRule))
            return nil
        }
        return id
    }

    func refresh(_ call: Call) {
        guard let who = caller(call) else { return }
        guard let id = containerId(call) else { return }
        guard let inst = tenants[who.owner]?.instances[id] else {
            call.reply(["accepted": false, "reason": "not_open: open the container first"])
            return
        }
        let d = inst.limiter.request(nowMs: now())
        guard d == .accepted else {
            log.warning(who.owner, "\(id): refresh called too often. Ignored. (\(d.reason ?? ""))")
            var r: JSONObject = ["accepted": false, "reason": .string(d.reason ?? "rate_limited")]
            if case .tooSoon(let ms) = d { r["retryInMs"] = .int(ms) }
            if case .noTokens(let ms) = d { r["retryInMs"] = .int(ms) }
            call.reply(.object(r))
            return
        }
        call.reply(["accepted": true])
        networkLoad(inst)
    }

    func close(_ call: Call) {
        guard let who = caller(call) else { return }
        guard let id = containerId(call) else { return }
        guard let tenant = tenants[who.owner], let inst = tenant.instances.removeValue(forKey: id) else {
            call.reply(["closed": false])
            return
        }
        for w in inst.waiters { w.timer?.close(); w.call.reply(openResult(inst)) }
        inst.waiters.removeAll()
        // Values waiting for the open: the container is closed now (`not_open`).
        releaseValueWaiters(inst)
        inst.refreshTimer?.close()
        inst.refreshTimer = nil
        call.reply(["closed": true])
    }

    func preview(_ call: Call) {
        guard let who = caller(call) else { return }
        let owner = who.owner
        guard let url = call.params["url"]?.stringValue, let p = PreviewURL.parse(url) else {
            log.warning(owner, "not a preview URL: \(call.params["url"]?.stringValue?.prefix(120) ?? "(none)")")
            call.reply(["preview": false])
            return
        }
        guard let tenant = tenant(owner, create: true, call) else { return }
        let id: String
        switch p {
        case .enter(let cid, let auth, let n, let debug):
            guard GTMLimits.validContainerId(cid) else { call.reply(["preview": false]); return }
            id = cid
            tenant.previews[cid] = PreviewState(auth: auth, preview: n, debug: debug)
            log.info(owner, "\(cid): preview of draft \(n) entered")
        case .exit(let cid):
            guard GTMLimits.validContainerId(cid) else { call.reply(["preview": false]); return }
            id = cid
            tenant.previews[cid] = nil
            log.info(owner, "\(cid): preview exited")
        }
        call.reply(["preview": true])
        // An open container of this owner switches now (the SDK refreshed the matching container).
        if let inst = tenant.instances[id], inst.preview != tenant.previews[id] {
            inst.preview = tenant.previews[id]
            if inst.preview == nil { inst.etag = nil }
            networkLoad(inst)
        }
    }

    /// The caller's own state (or, for an admin with `uid`, that uid's); an admin also gets
    /// `owners`, every owner's summary, and `totals`. Nobody else's handler names, container
    /// ids or counters are shown to a non-admin.
    func status(_ call: Call) {
        guard let who = caller(call) else { return }
        var out = tenantStatus(tenants[who.owner])
        for (k, v) in who.owner.json { out[k] = v }
        out["logLevel"] = .string(log.level(of: who.owner).rawValue)
        out["logLinesSuppressed"] = .int(Int64(log.suppressed(who.owner)))
        out["hitsHeld"] = .int(Int64(hitsHeld))
        if who.admin {
            var owners: [JSON] = []
            var totals = Counters()
            for o in tenants.keys.sorted(by: Owner.ordered) {
                let t = tenants[o]!
                var e = tenantStatus(t)
                for (k, v) in o.json { e[k] = v }
                e["logLevel"] = .string(log.level(of: o).rawValue)
                owners.append(.object(e))
                totals = totals + t.counters
            }
            out["owners"] = .array(owners)
            out["totals"] = .object(totals.json)
            out["pluginLogLevel"] = .string(log.level.rawValue)
        }
        call.reply(.object(out))
    }

    private func tenantStatus(_ t: Tenant?) -> JSONObject {
        var list: [JSON] = []
        for id in (t?.instances.keys.sorted() ?? []) {
            let inst = t!.instances[id]!
            var o = openResult(inst).objectValue!
            o["loading"] = .bool(inst.loading)
            o["refreshDueMs"] = inst.refreshDueMs.map { .int($0) } ?? .null
            o["refreshTokens"] = .int(Int64(inst.limiter.tokens))
            o["macros"] = .int(Int64(inst.container.macros.count))
            o["tags"] = .int(Int64(inst.container.tags.count))
            o["rules"] = .int(Int64(inst.container.rules.count))
            o["warnings"] = .int(Int64(inst.container.warnings.count))
            o["defaultFile"] = inst.defaultFile.map { .string($0) } ?? .null
            list.append(.object(o))
        }
        var out: JSONObject = [
            "containers": .array(list),
            "macroHandlers": .array((t?.macroHandlers.keys.sorted() ?? []).map { .string($0) }),
            "tagHandlers": .array((t?.tagHandlers.keys.sorted() ?? []).map { .string($0) }),
            "queuedPushes": .int(Int64(t?.pushQueue.items.count ?? 0)),
        ]
        for (k, v) in (t?.counters ?? Counters()).json { out[k] = v }
        return out
    }

    static func queryEscape(_ s: String) -> String {
        var out = ""
        for b in s.utf8 {
            switch b {
            case 0x30...0x39, 0x41...0x5A, 0x61...0x7A, UInt8(ascii: "-"), UInt8(ascii: "."), UInt8(ascii: "_"), UInt8(ascii: "~"):
                out.append(Character(Unicode.Scalar(b)))
            default:
                out += "%" + (b < 16 ? "0" : "") + String(b, radix: 16, uppercase: true)
            }
        }
        return out
    }

    /// Device facts on Linux: the language from `LC_ALL`/`LC_MESSAGES`/`LANG`, the kernel
    /// release, the DMI vendor and product; the rest from config `environment` (and per call
    /// from the calling app's params).
    static func systemEnvironment(version: String, overrides: JSONObject) -> TagEnvironment {
        var e = TagEnvironment()
        let lang =
            System.env("LC_ALL").flatMap { $0.isEmpty ? nil : $0 } ?? System.env("LC_MESSAGES").flatMap { $0.isEmpty ? nil : $0 }
            ?? System.env("LANG") ?? ""
        let code = lang.prefix { $0 != "_" && $0 != "." && $0 != "@" && $0 != "-" }
        e.language = (code == "C" || code == "POSIX") ? "en" : String(code).lowercased()
        func file(_ p: String) -> String {
            (try? System.readFile(atPath: p, maxBytes: 256)).map { String(decoding: $0, as: UTF8.self).trimmingCharacters(in: " \n\t") }
                ?? ""
        }
        // uname(2), not /proc/sys/kernel/osrelease: the shipped unit's ProcSubset=pid hides
        // /proc/sys (the macro was "" there). /sys/class/dmi stays readable under the unit.
        e.osVersion = GTMService.kernelRelease() ?? file("/proc/sys/kernel/osrelease")
        let vendor = file("/sys/class/dmi/id/sys_vendor")
        let product = file("/sys/class/dmi/id/product_name")
        // The SDK's device name: the model, prefixed by the manufacturer unless the model starts
        // with it or the manufacturer is unknown.
        if vendor.isEmpty || vendor.lowercased() == "unknown" || product.lowercased().hasPrefix(vendor.lowercased()) {
            e.deviceName = product
        } else {
            e.deviceName = product.isEmpty ? vendor : vendor + " " + product
        }
        e.platform = "linux"
        e.deviceType = "desktop"
        e.sdkVersion = "pylon-gtm " + version
        e.runtimeVersion = "1"
        let o = JSON.object(overrides)
        if let s = o["language"]?.stringValue { e.language = s }
        if let s = o["osVersion"]?.stringValue { e.osVersion = s }
        if let s = o["appName"]?.stringValue { e.appName = s }
        if let s = o["appVersion"]?.stringValue { e.appVersion = s }
        if let s = o["appId"]?.stringValue { e.appId = s }
        if let s = o["deviceName"]?.stringValue { e.deviceName = s }
        if let s = o["deviceType"]?.stringValue { e.deviceType = s }
        if let s = o["resolution"]?.stringValue { e.resolution = s }
        if let s = o["platform"]?.stringValue { e.platform = s }
        return e
    }
}

extension GTMService {
    /// The kernel release from uname(2) (what `/proc/sys/kernel/osrelease` says), nil if empty.
    static func kernelRelease() -> String? {
        var u = utsname()
        guard uname(&u) == 0 else { return nil }
        let s = withUnsafeBytes(of: &u.release) { raw in
            String(decoding: raw.prefix { $0 != 0 }, as: UTF8.self)
        }
        return s.isEmpty ? nil : s
    }
}

extension String {
    func trimmingCharacters(in set: String) -> String {
        let chars = Set(set)
        guard let a = firstIndex(where: { !chars.contains($0) }), let b = lastIndex(where: { !chars.contains($0) }) else { return "" }
        return String(self[a...b])
    }
}
