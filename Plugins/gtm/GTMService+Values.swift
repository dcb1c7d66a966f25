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

    /// An evaluation context over `tenant`'s data layer and handler names only.
    func context(_ tenant: Tenant, event: String? = nil, params: JSON? = nil) -> EvaluationContext {
        let t = now()
        return EvaluationContext(
            environment: params.map { environment.overridden(by: $0) } ?? environment, dataLayer: tenant.dataLayer,
            event: event, nowMs: t, seed: UInt64(bitPattern: t) &+ tenant.pushSeq, registeredMacros: tenant.macroNames)
    }

    /// Params that override device facts for one call.
    static let factParams = ["app", "language", "resolution", "deviceType"]

    func getValue(_ call: Call) {
        guard pacer.run({ [unowned self] in self.getValueNow(call) }) else {
            call.fail(
                RPCError(
                    .overloaded, "too many evaluations waiting (maxDeferredEvaluations \(limits.maxDeferredEvaluations))",
                    data: ["limit": "maxDeferredEvaluations"]))
            return
        }
    }

    /// Answers the getValue calls that waited for `inst`'s first open (or its close), in the order
    /// they came.
    func releaseValueWaiters(_ inst: ContainerInstance) {
        let waiting = inst.valueWaiters
        inst.valueWaiters.removeAll()
        for call in waiting { getValueNow(call) }
    }

    private func getValueNow(_ call: Call) {
        guard let who = caller(call) else { return }
        let owner = who.owner
        // Read from json-c without converting the params: this is the hot method.
        guard let id = containerId(call) else { return }
        guard let key = call.stringParam("key"), key.utf8.count <= GTMLimits.maxKeyBytes else {
            call.fail(RPCError(.invalidParams, "key must be a string of at most \(GTMLimits.maxKeyBytes) bytes"))
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
        guard let tenant = tenants[owner], let inst = tenant.instances[id] else {
            log.warning(owner, "getValue (\(type.rawValue)) called for a container that is not open: \(id)")
            // The type default, as before (the spec's `{value}`), marked `open: false` with the
            // reason: after a tag-manager restart the client learns it must open it again.
            call.reply(["value": type.defaultValue, "open": false, "reason": "not_open"])
            return
        }
        // Opening (the first open not answered yet): wait for that answer, so a getValue
        // pipelined behind its own open reads the container the open settles on.
        if !inst.answered {
            guard inst.valueWaiters.count < limits.maxValuesWaitingForOpen else {
                call.reply(["value": type.defaultValue, "open": false, "reason": "opening"])
                return
            }
            inst.valueWaiters.append(call)
            return
        }
        // Answered without any container (no default, the loads failed or still run): not an
        // answer from a container, and it says so.
        guard inst.hasContainer else {
            call.reply(["value": type.defaultValue, "open": false, "reason": "not_loaded"])
            return
        }
        // Only the fact members are converted (not the whole params).
        var facts: JSONObject?
        for k in GTMService.factParams where call.hasParam(k) {
            if facts == nil { facts = [:] }
            facts?[k] = call.params[k] ?? .null
        }
        let ctx = context(tenant, params: facts.map { .object($0) })
        // The common case answers synchronously: no function-call macro is waiting.
        let first = inst.container.value(named: key, context: ctx)
        if first.pending.isEmpty {
            for w in first.warnings { log.warning(owner, "\(key): \(w)") }
            replyValue(call, owner, first, type, id, key)
            return
        }
        evaluateValue(tenant, inst.container, key, ctx, round: 0) { [unowned self] e in
            self.replyValue(call, owner, e, type, id, key)
        }
    }

    private func replyValue(_ call: Call, _ owner: Owner, _ e: Evaluation, _ type: ValueType, _ id: String, _ key: String) {
        if let stop = e.stop {
            call.fail(GTMService.stopped(stop, limits.engine, key))
            return
        }
        let (v, w) = e.converted(to: type)
        if let w { log.warning(owner, "\(id) \(key): \(w)") }
        // The answer as sent (a list or map asked for as a string is its JSON text, escaped
        // once more) stays under maxValueBytes: the host drops a reply over its line limit.
        guard TagConversion.jsonSize(v, limit: limits.engine.maxValueBytes) != nil else {
            call.fail(GTMService.stopped(.valueBytes, limits.engine, key))
            return
        }
        if let bytes = GTMService.valueReply(v) {
            call.reply(serialized: bytes)
        } else {
            call.reply(["value": v])
        }
    }

    /// The error for an evaluation a limit stopped: -32004 naming the limit.
    static func stopped(_ s: EvaluationStop, _ l: EngineLimits, _ key: String) -> RPCError {
        let (value, what): (Int, String)
        switch s {
        case .steps: (value, what) = (l.maxSteps, "its evaluation took more than \(l.maxSteps) steps")
        case .workBytes: (value, what) = (l.maxWorkBytes, "its evaluation produced or hashed more than \(l.maxWorkBytes) bytes")
        case .valueBytes: (value, what) = (l.maxValueBytes, "its value is larger than \(l.maxValueBytes) bytes as JSON")
        }
        return RPCError(
            .overloaded, "value of \(key.prefix(64)) not answered: \(what) (\(s.limitName))",
            data: ["limit": .string(s.limitName), "value": .int(Int64(value))])
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
    func evaluateValue(
        _ tenant: Tenant, _ c: Container, _ key: String, _ ctx: EvaluationContext, round: Int, _ done: @escaping (Evaluation) -> Void
    ) {
        let e = c.value(named: key, context: ctx)
        if e.pending.isEmpty || round >= limits.maxFunctionCallRounds {
            for w in e.warnings { log.warning(tenant.owner, "\(key): \(w)") }
            done(e)
            return
        }
        resolve(tenant, e.pending, ctx) { [unowned self] ctx2 in self.evaluateValue(tenant, c, key, ctx2, round: round + 1, done) }
    }

    /// Calls the handlers of `reqs` (through the host, to the clients that registered them)
    /// and waits at most `functionCallTimeoutMs`; a missing, failing or slow handler answers
    /// null (→ the type default), with a warning.
    func resolve(
        _ tenant: Tenant, _ reqs: [FunctionCallRequest], _ ctx: EvaluationContext, _ done: @escaping (EvaluationContext) -> Void
    ) {
        let owner = tenant.owner
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
            guard let h = tenant.macroHandlers[r.name] else {
                ctx.functionResults[r.key] = .null
                remaining.remove(r.key)
                log.warning(owner, "No function-call macro handler registered for \(r.name)")
                continue
            }
            plugin.call(h.method, ["name": .string(r.name), "parameters": r.parameters]) { [unowned self] res in
                guard !finished, remaining.remove(r.key) != nil else { return }
                switch res {
                case .success(let j): ctx.functionResults[r.key] = j["value"] ?? .null
                case .failure(let e):
                    ctx.functionResults[r.key] = .null
                    tenant.counters.functionCallFailures += 1
                    self.log.warning(owner, "Custom macro \(r.name) threw exception: \(e.message) (type default used)")
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
                tenant.counters.functionCallFailures += 1
            }
            self.log.warning(
                owner, "function-call macro handler did not answer within \(self.limits.functionCallTimeoutMs) ms (type default used)")
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
        guard let who = caller(call) else { return }
        guard let client = who.client else {
            call.fail(RPCError(.invalidParams, "only a client connection can register a handler (it serves method through bus.provide)"))
            return
        }
        // Handler names are per owner: another uid's registration of the same name is another
        // name (its own tags call it), so registering first takes nothing from anyone.
        guard let tenant = tenant(who.owner, create: true, call) else { return }
        let owner = tenant.owner
        guard
            tenant.macroHandlers.count + tenant.tagHandlers.count < limits.maxHandlers
                || (tag ? tenant.tagHandlers[name] : tenant.macroHandlers[name]) != nil
        else {
            call.fail(RPCError(.overloaded, "too many function-call handlers (maxHandlers \(limits.maxHandlers))"))
            return
        }
        // A name another client registered stays its own: replacing it would send that client's
        // calls (and the data layer values they carry) to the newcomer.
        if let other = (tag ? tenant.tagHandlers[name] : tenant.macroHandlers[name]), other.client != client {
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
            let existing = tag ? tenant.tagHandlers[name] : tenant.macroHandlers[name]
            if let other = existing, other.client != client {
                call.fail(RPCError(.notPermitted, "function-call \(tag ? "tag" : "macro") \(name) is registered by another client"))
                return
            }
            // Checked again: registrations sent together all passed the first check.
            guard existing != nil || tenant.macroHandlers.count + tenant.tagHandlers.count < self.limits.maxHandlers else {
                call.fail(RPCError(.overloaded, "too many function-call handlers (maxHandlers \(self.limits.maxHandlers))"))
                return
            }
            if tag {
                tenant.tagHandlers[name] = Handler(method: method, client: client)
            } else {
                tenant.macroHandlers[name] = Handler(method: method, client: client)
            }
            self.log.info(owner, "function-call \(tag ? "tag" : "macro") \(name) → \(method) (client \(client))")
            call.reply(["registered": true])
        }
    }

    func clientClosed(_ client: Int64) {
        for t in tenants.values {
            if t.macroHandlers.values.contains(where: { $0.client == client }) {
                t.macroHandlers = t.macroHandlers.filter { $0.value.client != client }
            }
            if t.tagHandlers.values.contains(where: { $0.client == client }) {
                t.tagHandlers = t.tagHandlers.filter { $0.value.client != client }
            }
        }
    }

    // MARK: Data layer

    func push(_ call: Call) {
        guard let who = caller(call) else { return }
        guard let data = call.params["data"]?.objectValue else {
            call.fail(RPCError(.invalidParams, "data must be a JSON object"))
            return
        }
        if let k = data.keys.first(where: { $0.utf8.lazy.filter { $0 == UInt8(ascii: ".") }.count >= DataLayer.maxKeyParts }) {
            call.fail(
                RPCError(.invalidParams, "data key \"\(k.prefix(64))…\" has more than \(DataLayer.maxKeyParts) dot-separated parts"))
            return
        }
        guard let t = tenant(who.owner, create: true, call) else { return }
        var bytes = 0
        if let n = call.withParamText("data", { $0?.count }) {
            bytes = n
            guard n <= limits.maxPushBytes else {
                call.fail(RPCError(.invalidParams, "data exceeds maxPushBytes \(limits.maxPushBytes)"))
                return
            }
            if t.dataLayerBytesBound + n > limits.maxDataLayerBytes {
                // Measured again: the data layer as it is, and the pushes still queued.
                t.dataLayerBytesBound =
                    JSON.object(t.dataLayer.root).serialized.utf8.count + t.pushQueue.items.reduce(0) { $0 + $1.bytes }
                guard t.dataLayerBytesBound + n <= limits.maxDataLayerBytes else {
                    call.fail(
                        RPCError(
                            .overloaded, "the data layer is full (maxDataLayerBytes \(limits.maxDataLayerBytes))",
                            data: ["limit": "maxDataLayerBytes"]))
                    return
                }
            }
            t.dataLayerBytesBound += n
        }
        t.pushSeq += 1
        guard t.pushQueue.enqueue(QueuedPush(data: data, seq: t.pushSeq, bytes: bytes)) == .accepted else {
            let cleared = t.pushAcks
            t.pushAcks = [:]
            for a in cleared.values {
                a.fail(
                    RPCError(.overloaded, "data-layer push loop: more than \(limits.maxQueuedPushes) pushes queued; the queue was cleared"))
            }
            log.error(
                t.owner,
                "Seems like an infinite loop of pushing to the data layer: more than \(limits.maxQueuedPushes) pushes queued; queue cleared"
            )
            call.fail(
                RPCError(.overloaded, "data-layer push loop: more than \(limits.maxQueuedPushes) pushes queued; the queue was cleared"))
            return
        }
        t.counters.pushes += 1
        // How many containers this push can fire tags in: 0 after a tag-manager restart tells
        // the client to open its containers again. Answered once its tags ran and their hits
        // are durable (GTMService+Hits).
        t.pushAcks[t.pushSeq] = PushAck(call: call, containers: t.instances.count)
        if !t.processing {
            t.processing = true
            if !pacer.run({ [unowned self] in self.drain(t) }) { drain(t) }
        }
    }

    /// Handles queued pushes in order; a push whose tags wait for function-call macros holds
    /// the ones behind it.
    func drain(_ t: Tenant) {
        t.processing = true
        while let p = t.pushQueue.next() {
            var completedInline = false
            var returned = false
            handle(t, p) { [unowned self] in
                t.counters.pushesHandled += 1
                if returned { self.drain(t) } else { completedInline = true }
            }
            returned = true
            if !completedInline { return }  // waiting for handlers: the callback resumes
            // Over this turn's budget: the rest of the queue in a later turn.
            if !t.pushQueue.items.isEmpty, pacer.shouldYield, pacer.run({ [unowned self] in self.drain(t) }) { return }
        }
        t.processing = false
    }

    func handle(_ t: Tenant, _ p: QueuedPush, _ finished: @escaping () -> Void) {
        let ack = t.pushAcks.removeValue(forKey: p.seq)
        let done = {
            finished()
            ack?.settle()
        }
        var data = p.data
        let lifetime = data.removeValue("gtm.lifetime")
        t.dataLayer.push(data)
        if let lifetime {
            if let ms = DataLayer.lifetimeMs(lifetime) {
                let entries = DataLayer.flatten(DataLayer.expand(data))
                do {
                    try store?.persist(t.owner, entries, expiresAtMs: now() + ms, maxEntries: limits.maxPersistedEntries)
                } catch {
                    log.error(t.owner, "cannot persist gtm.lifetime values: \(error.description)")
                }
            } else {
                log.warning(t.owner, "unknown or non-positive gtm.lifetime \(lifetime.serialized): values not persisted")
            }
        }
        guard let ev = data["event"] else {
            done()
            return
        }
        let event = TagConversion.toString(ev)
        // Only this owner's containers: another uid's pushes never fire them.
        let targets = t.instances.keys.sorted().compactMap { t.instances[$0] }.filter { $0.openedAfterPush < p.seq }
        fireAll(t, targets[...], event: event, seq: p.seq, ack: ack, done)
    }

    private func fireAll(
        _ tenant: Tenant, _ targets: ArraySlice<ContainerInstance>, event: String, seq: UInt64, ack: PushAck?,
        _ done: @escaping () -> Void
    ) {
        guard let inst = targets.first else {
            done()
            return
        }
        let rest = targets.dropFirst()
        evaluateTags(tenant, inst, context(tenant, event: event), round: 0) { [unowned self] tags in
            for t in tags { self.fire(tenant, t, inst, event: event, ack: ack) }
            self.fireAll(tenant, rest, event: event, seq: seq, ack: ack, done)
        }
    }

    func evaluateTags(
        _ tenant: Tenant, _ inst: ContainerInstance, _ ctx: EvaluationContext, round: Int, _ done: @escaping ([TagFiring]) -> Void
    ) {
        let t = inst.container.tagsToFire(context: ctx)
        if t.pending.isEmpty || round >= limits.maxFunctionCallRounds {
            for w in t.warnings { log.warning(tenant.owner, "\(inst.id) event \(ctx.event ?? ""): \(w)") }
            done(t.tags)
            return
        }
        resolve(tenant, t.pending, ctx) { [unowned self] ctx2 in self.evaluateTags(tenant, inst, ctx2, round: round + 1, done) }
    }

    func fire(_ tenant: Tenant, _ t: TagFiring, _ inst: ContainerInstance, event: String, ack: PushAck?) {
        let owner = tenant.owner
        tenant.counters.tagsFired += 1
        switch t.function {
        case .functionCall:
            let name = TagConversion.toString(t.properties["name"] ?? t.properties["function_call_macro_name"])
            guard let h = tenant.tagHandlers[name] else {
                log.warning(owner, "\(inst.id): no function-call tag handler registered for \(name)")
                return
            }
            let params: JSON = t.properties["additional_params"].flatMap { $0.objectValue != nil ? $0 : nil } ?? .object([:])
            log.debug(owner, "\(inst.id): firing function-call tag \(name)")
            plugin.call(h.method, ["name": .string(name), "parameters": params]) { [unowned self] r in
                if case .failure(let e) = r {
                    tenant.counters.functionCallFailures += 1
                    self.log.warning(owner, "Custom tag \(name) threw exception: \(e.message)")
                }
            }
        case .analyticsHit, .pixel:
            hit(tenant, t, inst, event: event, ack: ack)
        default:
            log.warning(owner, "\(inst.id): tag \(t.index) (\(t.functionId)) has no backing implementation")
        }
    }

    /// `_ua` hits (and `_img` pixels) go to the uploader under their own switch `gtm:hits`
    /// (stream `gtm.hits`), which the host enforces, and only while the container's own switch
    /// `gtm:<containerId>` is granted (one switch per container, as host.md asks).
    func hit(_ tenant: Tenant, _ t: TagFiring, _ inst: ContainerInstance, event: String, ack: PushAck?) {
        let owner = tenant.owner
        for key in [GTMService.hitConsent, GTMService.containerConsent(inst.id)] where !plugin.isConsentGranted(key) {
            tenant.counters.hitsDroppedForConsent += 1
            log.info(owner, "\(inst.id): hit not sent: consent \(key) denied")
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
        // A pixel goes to the uploader's GET stream, which requests its `url`; `owner` names the
        // uid it was made for: the uploader's pixel lanes are per owner and destination, so one
        // uid's failing pixel host holds only that uid's pixels there.
        if pixel {
            fields["url"] = .string(TagConversion.toString(props["url"]))
            fields["owner"] = .string(owner.key)
        }
        let data = JSON.object(fields)
        let rec: JSON = ["id": .string("\(runPrefix)-\(hitSeq)"), "data": data]
        ack?.add()
        sendHit(tenant, inst.id, rec, stream: pixel ? GTMService.pixelStream : GTMService.hitStream, attempt: 1, held: nil, ack: ack)
    }

    // MARK: Persistence

    /// Each owner's unexpired `gtm.lifetime` values back into its own data layer.
    func restoreLifetimeValues() {
        guard let store else { return }
        do {
            for (ownerKey, k, v) in try store.lifetimeValues(nowMs: now()) {
                guard let o = Owner(key: ownerKey), let t = tenant(o, create: true) else { continue }
                t.dataLayer.push([k: v])
            }
        } catch {
            log.error(nil, "cannot load persisted data-layer values: \(error.description)")
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
