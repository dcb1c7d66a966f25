import CJSONC
import PylonPluginKit

/// `ma.eventRecord` (docs/MA.md, `ma.eventRecord`): validate, stamp, hand to the uploader, answer once durable.
///
/// The hot path builds no json-c objects and no Swift values per event: the event is validated
/// on the request's parsed tree, its record is written as JSON text straight into the params of
/// the next `uploader.enqueue` (`EventText`), and the caller is answered with a constant reply
/// once that enqueue is durable.
extension MAService {
    func eventRecord(_ call: Call) {
        guard let inst = usable(call) else { return }
        // Looked up on the params object once (each `Call.paramRef` finds params again).
        let params = call.paramsRef
        var props: OpaquePointer?, nameRef: OpaquePointer?
        _ = json_object_object_get_ex(params, "property", &props)
        _ = json_object_object_get_ex(params, "eventName", &nameRef)
        if let why = EventValidation.check(eventNameRef: nameRef, propertyRef: props) {
            call.reply(Self.result(MACode.invalidParams, why))
            return
        }
        // The request's tree (name and properties) lives as long as the call.
        if inst.pendingStarts == 0 {
            recordEvent(inst, call, nameRef, props)
        } else {
            inst.whenReady { [unowned self] in self.recordEvent(inst, call, nameRef, props) }
        }
    }

    private func recordEvent(_ inst: MAInstance, _ call: Call, _ nameRef: OpaquePointer?, _ props: OpaquePointer?) {
        touchSession(inst)
        // A string: checked by EventValidation.
        let name = UnsafeRawBufferPointer(start: json_object_get_string(nameRef), count: Int(json_object_get_string_len(nameRef)))
        record(inst, name: name, properties: props, for: call)
    }

    /// Records one of the plugin's own events (`el_session_start`, `el_session_end`).
    func recordOwn(_ inst: MAInstance, _ name: StaticString) {
        record(inst, name: UnsafeRawBufferPointer(start: name.utf8Start, count: name.utf8CodeUnitCount), properties: nil, for: nil)
    }

    /// Stamps an event and puts its record in the AppKey's open batch; `call` (nil for the
    /// plugin's own events) is answered once the batch is durable in the uploader — or at once
    /// when collection is off (0, dropped as the SDK does) or too many events wait (-1).
    /// `properties` is a json-c object, borrowed (nil or not an object: `{}`).
    func record(_ inst: MAInstance, name: UnsafeRawBufferPointer, properties: OpaquePointer?, for call: Call?) {
        guard inst.collectionEnabled != false, plugin.isConsentGranted(inst.consentKey) else {
            call?.reply(serialized: Self.okReply)  // collection disabled: dropped silently
            return
        }
        guard held + outboxCount < maxHeldEvents else {
            call?.reply(Self.result(MACode.failed, "too many events waiting for the uploader (maxHeldEvents \(maxHeldEvents))"))
            return
        }
        eventSeq &+= 1
        outboxCount += 1
        inst.eventsInFlight += 1
        var batches = outbox.removeValue(forKey: inst.appKey) ?? []
        if batches.last.map({ $0.count >= Self.maxRecordsPerEnqueue }) ?? true {
            batches.append(EventBatch(inst, buffer: spareBatchBuffers.popLast() ?? [], waiters: spareWaiters.popLast() ?? EventWaiters()))
        }
        batches[batches.count - 1].add(call) { text in
            // Unique without a syscall per event: a random per-process prefix plus a counter.
            withPropertiesText(properties) { props in
                EventText.record(
                    idPrefix: eventIdPrefix, seq: eventSeq, name: name, timeMs: System.wallClockMs(),
                    euid: inst.euid, session: inst.sessionId, properties: props, tail: eventTail(inst),
                    into: &text)
            }
        }
        outbox[inst.appKey] = batches
        // Events recorded in the same loop turn go to the uploader in one enqueue (one hop and
        // one commit for many events); each caller is answered when that enqueue is durable.
        if !outboxTimer.isActive { outboxTimer.start(after: 0) }
    }

    /// The properties' compact JSON text (json-c's serialisation of the request's subtree, kept
    /// with it), or `{}`.
    private func withPropertiesText(_ p: OpaquePointer?, _ body: (UnsafeRawBufferPointer) -> Void) {
        var len = 0
        if json_object_get_type(p) == json_type_object, let c = json_object_to_json_string_length(p, flagsPlain, &len) {
            body(UnsafeRawBufferPointer(start: c, count: len))
        } else {
            Self.noProperties.withUnsafeBytes { body($0) }
        }
    }

    private static let noProperties = Array("{}".utf8)

    /// The instance's `"utm":…,"device":…` record text, rebuilt after its settings change.
    func eventTail(_ inst: MAInstance) -> [UInt8] {
        if let t = inst.eventTail { return t }
        var device: [(String, String)] = [("os", "linux")]
        if inst.collectControl["idfv"] == true { device.append(("idfv", vendorId)) }
        if inst.collectControl["idfa"] == true, let a = advertisingId { device.append(("idfa", a)) }
        if inst.collectControl["carrier"] == true, let c = carrier { device.append(("carrier", c)) }
        let t = EventText.tail(utm: inst.utm, device: device)
        inst.eventTail = t
        return t
    }

    /// Events per uploader enqueue. Small enough that the host, the uploader and this plugin
    /// work on consecutive chunks at the same time (measured: 1000 per enqueue ran the three
    /// in lock step at ~21k events/s; 128 gives ~30k with the same CPU).
    static let maxRecordsPerEnqueue = 128

    /// Sends every open batch (one enqueue each).
    func flushOutbox() {
        var all: [String: [EventBatch]] = [:]
        swap(&all, &outbox)
        outboxCount = 0
        for appKey in Array(all.keys) {
            // Taken out of the dictionary so that closing a batch appends in place (no copy).
            guard var batches = all.removeValue(forKey: appKey) else { continue }
            for i in batches.indices {
                guard let inst = instances[appKey] else {  // never left unanswered
                    for c in batches[i].waiters.calls { c?.reply(Self.result(MACode.failed, "AppKey \(appKey) is gone")) }
                    continue
                }
                held += batches[i].count
                batches[i].close()
                let params = PrebuiltJSON.node(batches[i].text) { [weak self] text in self?.reuseBatchBuffer(&text) }
                enqueue(params, batches[i].waiters, inst, attempt: 1)
            }
        }
    }

    /// Keeps a sent batch's buffer for a later batch: a fresh one of this size would be a large
    /// malloc, which makes glibc consolidate its fast bins first (~15% of this plugin's profile
    /// before buffers were reused).
    private func reuseBatchBuffer(_ text: inout [UInt8]) {
        guard spareBatchBuffers.count < Self.maxSpareBatchBuffers else { return }
        text.removeAll(keepingCapacity: true)
        spareBatchBuffers.append(text)
    }

    /// Buffers kept for reuse (batches of several AppKeys in one turn take one each).
    static let maxSpareBatchBuffers = 8

    /// Sends one enqueue (`params`: one reference, taken). If the uploader is restarting (-32001)
    /// or did not answer in time (-32002), the same records are sent again after a backoff: the
    /// app's reply waits, and the uploader ignores records it already has (ids are unique per
    /// stream), so nothing is doubled. Any other answer settles the batch.
    private func enqueue(_ params: OpaquePointer?, _ waiters: EventWaiters, _ inst: MAInstance, attempt: Int) {
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
                    self.plugin.log.warn("uploader unavailable; holding events", ["events": waiters.calls.count, "error": e.message])
                }
                self.plugin.loop.after(ms: delay) { [unowned self] in
                    self.enqueue(json_object_get(again.ptr), waiters, inst, attempt: attempt + 1)
                }
                return
            case .failure(let e): err = e.message
            }
            let n = waiters.calls.count
            self.held -= n
            if let err {
                let reply = Self.result(MACode.failed, err)
                for c in waiters.calls { c?.reply(reply) }
            } else {
                for c in waiters.calls { c?.reply(serialized: Self.okReply) }
            }
            if self.spareWaiters.count < Self.maxSpareBatchBuffers {
                waiters.calls.removeAll(keepingCapacity: true)  // for a later batch (no large malloc)
                self.spareWaiters.append(waiters)
            }
            self.eventsSettled(inst, n)
        }
    }

    /// Runs `action` once no event of `inst` is waiting for the uploader (sending the outbox now).
    func whenEventsSettled(_ inst: MAInstance, _ action: @escaping () -> Void) {
        guard inst.eventsInFlight > 0 else { return action() }
        inst.drainWaiters.append(action)
        if !outbox.isEmpty { flushOutbox() }
    }

    private func eventsSettled(_ inst: MAInstance, _ n: Int) {
        inst.eventsInFlight -= n
        guard inst.eventsInFlight == 0, !inst.drainWaiters.isEmpty else { return }
        let waiters = inst.drainWaiters
        inst.drainWaiters = []
        for w in waiters { w() }
    }
}

/// Events recorded for one AppKey in this loop turn, up to `maxRecordsPerEnqueue`: the params of
/// one `uploader.enqueue` as JSON text (its records so far) and who waits for each record (nil:
/// the plugin's own session events).
struct EventBatch {
    private(set) var text: [UInt8] = []
    /// Who waits for each record, in order.
    let waiters: EventWaiters
    var count: Int { waiters.calls.count }

    /// `buffer`: an empty array whose capacity is reused.
    init(_ inst: MAInstance, buffer: [UInt8], waiters: EventWaiters) {
        text = buffer
        self.waiters = waiters
        // Room for a full batch of typical records (~350 bytes each): no regrowth on the way.
        text.reserveCapacity(MAService.maxRecordsPerEnqueue * 384)
        waiters.calls.reserveCapacity(MAService.maxRecordsPerEnqueue)
        EventText.paramsHead(stream: inst.stream, consent: inst.consentKey, into: &text)
    }

    /// Adds one record, written by `write`, and who waits for it.
    mutating func add(_ call: Call?, _ write: (inout [UInt8]) -> Void) {
        if !waiters.calls.isEmpty { text.append(UInt8(ascii: ",")) }
        write(&text)
        waiters.calls.append(call)
    }

    /// Completes `text` as the enqueue's params (no record is added after).
    mutating func close() { EventText.paramsTail(into: &text) }
}

/// The callers waiting for one batch's records (nil: the plugin's own events); a class so that
/// its array is reused, emptied, for a later batch once they are answered.
final class EventWaiters {
    var calls: [Call?] = []
}
