import CJSONC
import PylonPluginKit

/// `ma.eventRecord` (ma.md §3): validate, stamp, hand to the uploader, answer once durable.
extension MAService {
    func eventRecord(_ call: Call) {
        guard let inst = usable(call) else { return }
        // Validated and recorded straight from the parsed json-c tree (no Swift values per event).
        let props = call.paramRef("property")
        let nameRef = call.paramRef("eventName")
        if let why = EventValidation.check(eventNameRef: nameRef, propertyRef: props) {
            call.reply(Self.result(MACode.invalidParams, why))
            return
        }
        let name = String(cString: json_object_get_string(nameRef))  // a string: checked above
        inst.whenReady { [unowned self] in
            self.touchSession(inst)
            self.record(inst, name: name, properties: props) { err in
                if let err { call.reply(Self.result(MACode.failed, err)) } else { call.reply(serialized: Self.okReply) }
            }
        }
    }

    func whenEventsSettled(_ inst: MAInstance, _ action: @escaping () -> Void) {
        guard inst.eventsInFlight > 0 else { return action() }
        inst.drainWaiters.append(action)
        if !outbox.isEmpty { flushOutbox() }
    }

    private func eventSettled(_ inst: MAInstance) {
        inst.eventsInFlight -= 1
        guard inst.eventsInFlight == 0, !inst.drainWaiters.isEmpty else { return }
        let waiters = inst.drainWaiters
        inst.drainWaiters = []
        for w in waiters { w() }
    }

    // MARK: Events

    /// Stamps an event and hands it to the uploader; `done` gets nil once it is durable.
    /// `properties` is a json-c object (borrowed; nil = none). The record is built as json-c
    /// objects: the event's properties are shared with the request, never converted or copied.
    func record(_ inst: MAInstance, name: String, properties: OpaquePointer?, _ done: @escaping (String?) -> Void) {
        guard inst.collectionEnabled != false, plugin.isConsentGranted(inst.consentKey) else {
            done(nil)  // collection disabled: dropped silently, as the SDK does
            return
        }
        guard held + outboxCount < maxHeldEvents else {
            done("too many events waiting for the uploader (maxHeldEvents \(maxHeldEvents))")
            return
        }
        eventSeq &+= 1
        outboxCount += 1
        inst.eventsInFlight += 1
        let done: (String?) -> Void = { [unowned self] err in
            done(err)
            self.eventSettled(inst)
        }
        let data = json_object_new_object()
        json_object_object_add(data, "event", json_object_new_string(name))
        json_object_object_add(data, "time", json_object_new_int64(System.wallClockMs()))
        json_object_object_add(data, "euid", inst.euid.map { json_object_new_string($0) } ?? nil)
        json_object_object_add(data, "session", inst.sessionId.map { json_object_new_string($0) } ?? nil)
        json_object_object_add(data, "properties",
                               json_object_get_type(properties) == json_type_object ? json_object_get(properties) : json_object_new_object())
        if !inst.utm.isEmpty {
            let u = json_object_new_object()
            for k in inst.utm.keys.sorted() { json_object_object_add(u, k, json_object_new_string(inst.utm[k]!)) }
            json_object_object_add(data, "utm", u)
        }
        let device = json_object_new_object()
        json_object_object_add(device, "os", json_object_new_string("linux"))
        if inst.collectControl["idfv"] == true { json_object_object_add(device, "idfv", json_object_new_string(vendorId)) }
        if inst.collectControl["idfa"] == true, let a = advertisingId { json_object_object_add(device, "idfa", json_object_new_string(a)) }
        if inst.collectControl["carrier"] == true, let c = carrier { json_object_object_add(device, "carrier", json_object_new_string(c)) }
        json_object_object_add(data, "device", device)
        let rec = json_object_new_object()
        // Unique without a syscall per event: a random per-process prefix plus a counter.
        json_object_object_add(rec, "id", json_object_new_string("\(runPrefix)-\(eventSeq)"))
        json_object_object_add(rec, "data", data)
        // Events recorded in the same loop turn go to the uploader in one enqueue (one hop and
        // one commit for many events); each caller is answered when that enqueue is durable.
        outbox[inst.appKey, default: []].append((JSONRef(owning: rec), done))
        if !outboxTimer.isActive { outboxTimer.start(after: 0) }
    }

    /// Events per uploader enqueue. Small enough that the host, the uploader and this plugin
    /// work on consecutive chunks at the same time (measured: 1000 per enqueue ran the three
    /// in lock step at ~21k events/s; 128 gives ~30k with the same CPU).
    static let maxRecordsPerEnqueue = 128

    func flushOutbox() {
        let all = outbox
        outbox.removeAll()
        outboxCount = 0
        for (appKey, items) in all {
            guard let inst = instances[appKey] else {
                for item in items { item.done("AppKey \(appKey) is gone") }  // never left unanswered
                continue
            }
            var start = 0
            while start < items.count {
                let chunk = Array(items[start..<min(items.count, start + MAService.maxRecordsPerEnqueue)])
                start += chunk.count
                let params = json_object_new_object()
                json_object_object_add(params, "stream", json_object_new_string(inst.stream))
                json_object_object_add(params, "consent", json_object_new_string(inst.consentKey))
                let recs = json_object_new_array_ext(Int32(chunk.count))
                for item in chunk { json_object_array_add(recs, json_object_get(item.record.ptr)) }
                json_object_object_add(params, "records", recs)
                held += chunk.count
                enqueue(params, chunk, attempt: 1)
            }
        }
    }

    /// Sends one enqueue. If the uploader is restarting (-32001) or did not answer in time
    /// (-32002), the same records are sent again after a backoff: the app's reply waits, and the
    /// uploader ignores records it already has (ids are unique per stream), so nothing is
    /// doubled. Any other answer settles the chunk.
    private func enqueue(_ params: OpaquePointer?, _ chunk: [(record: JSONRef, done: (String?) -> Void)], attempt: Int) {
        let again = JSONRef(owning: json_object_get(params))
        plugin.callRaw("uploader.enqueue", params: params) { [unowned self] r in
            let err: String?
            switch r {
            case .success: err = nil
            case .failure(let e) where e.code == RPCError.Code.consentDenied.rawValue:
                // The switch was denied between recording and storing (the operator's decision
                // overtook it): not stored, so not answered as if it were.
                err = "not stored: \(e.message)"
            case .failure(let e) where e.code == RPCError.Code.pluginUnavailable.rawValue || e.code == RPCError.Code.timeout.rawValue:
                let delay = Self.uploaderRetry.delay(attempt: attempt)
                if attempt == 1 {
                    self.plugin.log.warn("uploader unavailable; holding events", ["events": chunk.count, "error": e.message])
                }
                let t = Timer(loop: self.plugin.loop) {}
                t.callback = { [unowned self, unowned t] in
                    t.close()
                    self.enqueue(json_object_get(again.ptr), chunk, attempt: attempt + 1)
                }
                t.start(after: delay)
                return
            case .failure(let e): err = e.message
            }
            self.held -= chunk.count
            for item in chunk { item.done(err) }
        }
    }
}
