import PylonCore
import PylonPluginKit
import PylonTagEngine

/// A push waiting to be handled: its map and its sequence number (containers opened after it
/// was made do not fire tags for it).
struct QueuedPush: Sendable {
    let data: JSONObject
    let seq: UInt64
    /// Its size as JSON text (counted in `maxDataLayerBytes` until it is merged).
    var bytes = 0
}

extension GTMService {
    // MARK: Values

    func context(event: String? = nil, params: JSON? = nil) -> EvaluationContext {
        let t = now()
        return EvaluationContext(
            environment: params.map { environment.overridden(by: $0) } ?? environment, dataLayer: dataLayer,
            event: event, nowMs: t, seed: UInt64(bitPattern: t) &+ pushSeq, registeredMacros: macroNames)
    }

    /// Params that override device facts for one call.
    static let factParams = ["app", "language", "resolution", "deviceType"]

    func getValue(_ call: Call) {
        // Read from json-c without converting the params: this is the hot method.
        guard let id = call.stringParam("containerId"), let key = call.stringParam("key") else {
            call.fail(RPCError(.invalidParams, "containerId and key (strings) are required"))
            return
        }
        var type = ValueType.string
        if call.hasParam("type") {
            guard let s = call.stringParam("type"), let vt = ValueType(rawValue: s) else {
                call.fail(RPCError(.invalidParams, "type must be string, bool, double or int64"))
                return
            }
            type = vt
        }
        guard let inst = instances[id] else {
            log.warning("getValue (\(type.rawValue)) called for a container that is not open: \(id)")
            call.reply(["value": type.defaultValue])
            return
        }
        // Only the fact members are converted (not the whole params).
        var facts: JSONObject?
        for k in GTMService.factParams where call.hasParam(k) {
            if facts == nil { facts = [:] }
            facts?[k] = JSONRef.toJSON(call.paramRef(k))
        }
        let ctx = context(params: facts.map { .object($0) })
        // The common case answers synchronously: no function-call macro is waiting.
        let first = inst.container.value(named: key, context: ctx)
        if first.pending.isEmpty {
            for w in first.warnings { log.warning("\(key): \(w)") }
            replyValue(call, first, type, id, key)
            return
        }
        evaluateValue(inst.container, key, ctx, round: 0) { [unowned self] e in self.replyValue(call, e, type, id, key) }
    }

    private func replyValue(_ call: Call, _ e: Evaluation, _ type: ValueType, _ id: String, _ key: String) {
        let (v, w) = e.converted(to: type)
        if let w { log.warning("\(id) \(key): \(w)") }
        if let bytes = GTMService.valueReply(v) {
            call.reply(serialized: bytes)
        } else {
            call.reply(["value": v])
        }
    }

    /// `{"value":<v>}` written directly for scalars that need no escaping (the hot path builds
    /// no json-c objects); nil for anything else.
    static func valueReply(_ v: JSON) -> [UInt8]? {
        var out = Array(#"{"value":"#.utf8)
        switch v {
        case .bool(let b): out += Array((b ? "true" : "false").utf8)
        case .int(let i): out += Array(String(i).utf8)
        case .double(let d):
            guard d.isFinite else { return nil }
            out += Array(d.description.utf8)
        case .string(let s):
            guard s.utf8.count <= 4096, !s.utf8.contains(where: { $0 < 0x20 || $0 == 0x22 || $0 == 0x5C || $0 == 0x7F }) else { return nil }
            out.append(0x22)
            out += Array(s.utf8)
            out.append(0x22)
        default: return nil
        }
        out.append(0x7D)
        return out
    }

    /// Evaluates `key`, asking function-call macro handlers and re-evaluating with their
    /// answers (at most `maxFunctionCallRounds` rounds).
    func evaluateValue(_ c: Container, _ key: String, _ ctx: EvaluationContext, round: Int, _ done: @escaping (Evaluation) -> Void) {
        let e = c.value(named: key, context: ctx)
        if e.pending.isEmpty || round >= limits.maxFunctionCallRounds {
            for w in e.warnings { log.warning("\(key): \(w)") }
            done(e)
            return
        }
        resolve(e.pending, ctx) { [unowned self] ctx2 in self.evaluateValue(c, key, ctx2, round: round + 1, done) }
    }

    /// Calls the handlers of `reqs` (through the host, to the clients that registered them)
    /// and waits at most `functionCallTimeoutMs`; a missing, failing or slow handler answers
    /// null (→ the type default), with a warning.
    func resolve(_ reqs: [FunctionCallRequest], _ ctx: EvaluationContext, _ done: @escaping (EvaluationContext) -> Void) {
        var ctx = ctx
        var remaining = Set(reqs.map(\.key))
        var finished = false
        var timer: Timer?
        func finish() {
            guard !finished else { return }
            finished = true
            timer?.cancel()
            done(ctx)
        }
        for r in reqs {
            guard let h = macroHandlers[r.name] else {
                ctx.functionResults[r.key] = .null
                remaining.remove(r.key)
                log.warning("No function-call macro handler registered for \(r.name)")
                continue
            }
            plugin.call(h.method, ["name": .string(r.name), "parameters": r.parameters]) { [unowned self] res in
                guard !finished, remaining.remove(r.key) != nil else { return }
                switch res {
                case .success(let j): ctx.functionResults[r.key] = j["value"] ?? .null
                case .failure(let e):
                    ctx.functionResults[r.key] = .null
                    self.counters.functionCallFailures += 1
                    self.log.warning("Custom macro \(r.name) threw exception: \(e.message) (type default used)")
                }
                if remaining.isEmpty { finish() }
            }
        }
        if remaining.isEmpty {
            finish()
            return
        }
        timer = plugin.loop.after(ms: UInt64(limits.functionCallTimeoutMs)) { [unowned self] in
            for k in remaining {
                ctx.functionResults[k] = .null
                self.counters.functionCallFailures += 1
            }
            self.log.warning(
                "function-call macro handler did not answer within \(self.limits.functionCallTimeoutMs) ms (type default used)")
            remaining.removeAll()
            finish()
        }
    }

    // MARK: Handlers

    func register(_ call: Call, tag: Bool) {
        guard let name = call.params["name"]?.stringValue, !name.isEmpty, let method = call.params["method"]?.stringValue, !method.isEmpty
        else {
            call.fail(RPCError(.invalidParams, "name and method (non-empty strings) are required"))
            return
        }
        guard let client = call.callerClient else {
            call.fail(RPCError(.invalidParams, "only a client connection can register a handler (it serves method through bus.provide)"))
            return
        }
        guard macroHandlers.count + tagHandlers.count < limits.maxHandlers || (tag ? tagHandlers[name] : macroHandlers[name]) != nil else {
            call.fail(RPCError(.overloaded, "too many function-call handlers (maxHandlers \(limits.maxHandlers))"))
            return
        }
        // A name another client registered stays its own: replacing it would send that client's
        // calls (and the data layer values they carry) to the newcomer.
        if let other = (tag ? tagHandlers[name] : macroHandlers[name]), other.client != client {
            call.fail(RPCError(.notPermitted, "function-call \(tag ? "tag" : "macro") \(name) is registered by another client"))
            return
        }
        // The method must be one the caller serves (`bus.provide`): the plugin calls it, and any
        // other method (a host method, another plugin's) would run with this plugin's rights.
        plugin.call("bus.describe", nil) { [unowned self] r in
            guard case .success(let d) = r, d["provided"]?[method]?.intValue == client else {
                call.fail(RPCError(.notPermitted, "\(method) is not a method this connection provides (bus.provide it first)"))
                return
            }
            let existing = tag ? self.tagHandlers[name] : self.macroHandlers[name]
            if let other = existing, other.client != client {
                call.fail(RPCError(.notPermitted, "function-call \(tag ? "tag" : "macro") \(name) is registered by another client"))
                return
            }
            // Checked again: registrations sent together all passed the first check.
            guard existing != nil || self.macroHandlers.count + self.tagHandlers.count < self.limits.maxHandlers else {
                call.fail(RPCError(.overloaded, "too many function-call handlers (maxHandlers \(self.limits.maxHandlers))"))
                return
            }
            if tag {
                self.tagHandlers[name] = Handler(method: method, client: client)
            } else {
                self.macroHandlers[name] = Handler(method: method, client: client)
            }
            self.log.info("function-call \(tag ? "tag" : "macro") \(name) → \(method) (client \(client))")
            call.reply(["registered": true])
        }
    }

    func clientClosed(_ client: Int64) {
        macroHandlers = macroHandlers.filter { $0.value.client != client }
        tagHandlers = tagHandlers.filter { $0.value.client != client }
    }

    // MARK: Data layer

    func push(_ call: Call) {
        guard let data = call.params["data"]?.objectValue else {
            call.fail(RPCError(.invalidParams, "data must be a JSON object"))
            return
        }
        if let k = data.keys.first(where: { $0.utf8.lazy.filter { $0 == UInt8(ascii: ".") }.count >= DataLayer.maxKeyParts }) {
            call.fail(
                RPCError(.invalidParams, "data key \"\(k.prefix(64))…\" has more than \(DataLayer.maxKeyParts) dot-separated parts"))
            return
        }
        var bytes = 0
        if let raw = call.paramRef("data") {
            let n = JSONRef(retaining: raw).withSerialized { $0.count }
            bytes = n
            guard n <= limits.maxPushBytes else {
                call.fail(RPCError(.invalidParams, "data exceeds maxPushBytes \(limits.maxPushBytes)"))
                return
            }
            if dataLayerBytesBound + n > limits.maxDataLayerBytes {
                // Measured again: the data layer as it is, and the pushes still queued.
                dataLayerBytesBound =
                    JSON.object(dataLayer.root).serialized.utf8.count + pushQueue.items.reduce(0) { $0 + $1.bytes }
                guard dataLayerBytesBound + n <= limits.maxDataLayerBytes else {
                    call.fail(
                        RPCError(
                            .overloaded, "the data layer is full (maxDataLayerBytes \(limits.maxDataLayerBytes))",
                            data: ["limit": "maxDataLayerBytes"]))
                    return
                }
            }
            dataLayerBytesBound += n
        }
        pushSeq += 1
        guard pushQueue.enqueue(QueuedPush(data: data, seq: pushSeq, bytes: bytes)) == .accepted else {
            log.error(
                "Seems like an infinite loop of pushing to the data layer: more than \(limits.maxQueuedPushes) pushes queued; queue cleared"
            )
            call.fail(
                RPCError(.overloaded, "data-layer push loop: more than \(limits.maxQueuedPushes) pushes queued; the queue was cleared"))
            return
        }
        counters.pushes += 1
        call.reply(["queued": true])
        if !processing { drain() }
    }

    /// Handles queued pushes in order; a push whose tags wait for function-call macros holds
    /// the ones behind it.
    func drain() {
        processing = true
        while let p = pushQueue.next() {
            var completedInline = false
            var returned = false
            handle(p) { [unowned self] in
                if returned { self.drain() } else { completedInline = true }
            }
            returned = true
            if !completedInline { return }  // waiting for handlers: the callback resumes
        }
        processing = false
    }

    func handle(_ p: QueuedPush, _ done: @escaping () -> Void) {
        var data = p.data
        let lifetime = data.removeValue("gtm.lifetime")
        dataLayer.push(data)
        if let lifetime {
            if let ms = DataLayer.lifetimeMs(lifetime) {
                let entries = DataLayer.flatten(DataLayer.expand(data))
                do { try store?.persist(entries, expiresAtMs: now() + ms, maxEntries: limits.maxPersistedEntries) } catch {
                    log.error("cannot persist gtm.lifetime values: \(error.description)")
                }
            } else {
                log.warning("unknown or non-positive gtm.lifetime \(lifetime.serialized): values not persisted")
            }
        }
        guard let ev = data["event"] else {
            done()
            return
        }
        let event = TagConversion.toString(ev)
        let targets = instances.keys.sorted().compactMap { instances[$0] }.filter { $0.openedAfterPush < p.seq }
        fireAll(targets[...], event: event, seq: p.seq, done)
    }

    private func fireAll(_ targets: ArraySlice<ContainerInstance>, event: String, seq: UInt64, _ done: @escaping () -> Void) {
        guard let inst = targets.first else {
            done()
            return
        }
        let rest = targets.dropFirst()
        evaluateTags(inst, context(event: event), round: 0) { [unowned self] tags in
            for t in tags { self.fire(t, inst, event: event) }
            self.fireAll(rest, event: event, seq: seq, done)
        }
    }

    func evaluateTags(_ inst: ContainerInstance, _ ctx: EvaluationContext, round: Int, _ done: @escaping ([TagFiring]) -> Void) {
        let t = inst.container.tagsToFire(context: ctx)
        if t.pending.isEmpty || round >= limits.maxFunctionCallRounds {
            for w in t.warnings { log.warning("\(inst.id) event \(ctx.event ?? ""): \(w)") }
            done(t.tags)
            return
        }
        resolve(t.pending, ctx) { [unowned self] ctx2 in self.evaluateTags(inst, ctx2, round: round + 1, done) }
    }

    func fire(_ t: TagFiring, _ inst: ContainerInstance, event: String) {
        counters.tagsFired += 1
        switch t.function {
        case .functionCall:
            let name = TagConversion.toString(t.properties["name"] ?? t.properties["function_call_macro_name"])
            guard let h = tagHandlers[name] else {
                log.warning("\(inst.id): no function-call tag handler registered for \(name)")
                return
            }
            let params: JSON = t.properties["additional_params"].flatMap { $0.objectValue != nil ? $0 : nil } ?? .object([:])
            log.debug("\(inst.id): firing function-call tag \(name)")
            plugin.call(h.method, ["name": .string(name), "parameters": params]) { [unowned self] r in
                if case .failure(let e) = r {
                    self.counters.functionCallFailures += 1
                    self.log.warning("Custom tag \(name) threw exception: \(e.message)")
                }
            }
        case .analyticsHit, .pixel:
            hit(t, inst, event: event)
        default:
            log.warning("\(inst.id): tag \(t.index) (\(t.functionId)) has no backing implementation")
        }
    }

    /// `_ua` hits (and `_img` pixels) go to the uploader under their own switch `gtm:hits`
    /// (stream `gtm.hits`), which the host enforces, and only while the container's own switch
    /// `gtm:<containerId>` is granted (one switch per container, as host.md asks).
    func hit(_ t: TagFiring, _ inst: ContainerInstance, event: String) {
        for key in [GTMService.hitConsent, GTMService.containerConsent(inst.id)] where !plugin.isConsentGranted(key) {
            counters.hitsDroppedForConsent += 1
            log.info("\(inst.id): hit not sent: consent \(key) denied")
            return
        }
        hitSeq += 1
        var props = t.properties
        props["function"] = nil
        let pixel = t.function == .pixel
        var fields: JSONObject = [
            "containerId": .string(inst.id), "containerVersion": .string(inst.container.version),
            "kind": pixel ? "pixel" : "analytics", "event": .string(event),
            "tag": .object(props), "ts": .int(now()),
        ]
        // A pixel goes to the uploader's GET stream, which requests its `url`.
        if pixel { fields["url"] = .string(TagConversion.toString(props["url"])) }
        let data = JSON.object(fields)
        let rec: JSON = ["id": .string("\(runPrefix)-\(hitSeq)"), "data": data]
        plugin.call(
            "uploader.enqueue",
            [
                "stream": .string(pixel ? GTMService.pixelStream : GTMService.hitStream), "consent": .string(GTMService.hitConsent),
                "records": [rec],
            ]
        ) { [unowned self] r in
            switch r {
            case .success: self.counters.hitsQueued += 1
            case .failure(let e):
                if e.code == RPCError.Code.consentDenied.rawValue { self.counters.hitsDroppedForConsent += 1 }
                self.log.warning("\(inst.id): hit not queued: \(e.message)")
            }
        }
    }

    // MARK: Persistence

    func restoreLifetimeValues() {
        guard let store else { return }
        do {
            for (k, v) in try store.lifetimeValues(nowMs: now()) { dataLayer.push([k: v]) }
        } catch {
            log.error("cannot load persisted data-layer values: \(error.description)")
        }
    }
}

extension JSONObject {
    mutating func removeValue(_ key: String) -> JSON? {
        let v = self[key]
        self[key] = nil
        return v
    }
}
