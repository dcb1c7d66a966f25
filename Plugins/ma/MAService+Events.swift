import PylonPluginKit

/// `ma.eventRecord` (docs/MA.md, `ma.eventRecord`): validate, stamp, hand to the uploader, answer once durable.
///
/// The hot path builds no json-c objects and no Swift values per event: the request is served
/// from its bytes (`Plugin.method(reads: .text)`), the event is checked and read from the params'
/// text (`EventParams`; json-c only for unusual text), its record is written as JSON text
/// straight into the next `uploader.enqueue` (`EventText`), that enqueue goes out as text and its
/// answer is read from its bytes (`Plugin.Answer.text`), and the caller is answered with a constant
/// reply once the enqueue is durable.
extension MAService {
    func eventRecord(_ call: Call) {
        let params = EventParams.read(call.paramsText)
        let who = call.callerInfo
        guard let inst = usable(appKey: params.appKey, client: who.client, uid: who.uid, admin: who.isAdmin, call.reply) else {
            return
        }
        if let why = params.invalid {
            call.reply(Self.result(MACode.invalidParams, why))
            return
        }
        // Behind a pending start or identify the event is parked on disk (answered once it is
        // durable) and sent with that call's EUID once it is known (MAService+Offline).
        touchSession(inst)
        params.withEvent(params: call.paramsText) { name, properties in
            record(inst, name: name, properties: properties, session: inst.sessionId, eventId: params.eventId, for: call)
        }
    }

    /// Records one of the plugin's own events (`el_session_start`, `el_session_end`).
    /// `session`: the session it belongs to (an ending one is no longer the instance's).
    func recordOwn(_ inst: MAInstance, _ name: StaticString, session: String) {
        EventParams.noProperties.withUnsafeBytes { props in
            record(
                inst, name: UnsafeRawBufferPointer(start: name.utf8Start, count: name.utf8CodeUnitCount), properties: props,
                session: session, for: nil)
        }
    }

    /// Stamps an event and puts its record in the AppKey's open batch; `call` (nil for the
    /// plugin's own events) is answered once the batch is durable in the uploader — or at once
    /// when collection is off (0, dropped as the SDK does), when `eventId` repeats one the device
    /// has (0, stored nothing) or too many events wait (-1). While a start or identify of the
    /// AppKey is pending, or parked events wait before it, the event is parked instead
    /// (`park`). `properties` is the properties' JSON text (an object, as json-c prints it).
    func record(
        _ inst: MAInstance, name: UnsafeRawBufferPointer, properties: UnsafeRawBufferPointer, session: String?,
        eventId: String? = nil, for call: Call?
    ) {
        guard inst.collectionEnabled != false, plugin.isConsentGranted(inst.consentKey) else {
            call?.reply(serialized: Self.okReply)  // collection disabled: dropped silently
            return
        }
        if let eventId, isKnownEvent(inst, eventId) {
            duplicateEvents += 1
            call?.reply(serialized: Self.okReply)  // a retry: the device has it already
            return
        }
        // The record's size, from above: its name, properties and tail, and room for the id,
        // time, EUID and session around them.
        let size = name.count + properties.count + eventTail(inst).count + Self.recordFrameBytes
        guard size <= config.maxEventBytes else {
            call?.reply(Self.result(MACode.invalidParams, "event larger than maxEventBytes (\(config.maxEventBytes))"))
            return
        }
        if inst.pendingStarts > 0 || inst.parked > 0 {
            park(inst, name: name, properties: properties, session: session, eventId: eventId, for: call)
            return
        }
        guard held + outboxCount < config.maxHeldEvents else {
            call?.reply(Self.result(MACode.failed, "too many events waiting for the uploader (maxHeldEvents \(config.maxHeldEvents))"))
            return
        }
        eventSeq &+= 1
        let timeMs = System.wallClockMs()
        addToOutbox(inst, size: size, call: call, eventId: eventId) { text in
            if let eventId {
                eventTail(inst).withUnsafeBytes { tail in
                    EventText.record(
                        id: Self.recordId(eventId: eventId), name: name, timeMs: timeMs, euid: inst.euid, session: session,
                        properties: properties, tail: tail, into: &text)
                }
            } else {
                // Unique without a syscall per event: a random per-process prefix plus a counter.
                EventText.record(
                    idPrefix: eventIdPrefix, seq: eventSeq, name: name, timeMs: timeMs, euid: inst.euid, session: session,
                    properties: properties, tail: eventTail(inst), into: &text)
            }
        }
    }

    /// The record id of an event with a client event id: stable, so a resend of it is the same
    /// record for the uploader's and the backend's duplicate checks.
    static func recordId(eventId: String) -> String { "c:" + eventId }

    /// Puts one record, written by `write`, in the AppKey's open batch (a new one when full);
    /// `parked`: the parked row it comes from (its seq), answered already.
    func addToOutbox(
        _ inst: MAInstance, size: Int, call: Call?, eventId: String?, parked: Int64? = nil, _ write: (inout [UInt8]) -> Void
    ) {
        outboxCount += 1
        inst.eventsInFlight += 1
        let batch: EventBatch
        if let open = outbox[inst.appKey]?.last, !open.isClosed, open.count < Self.maxRecordsPerEnqueue,
            open.text.count + size <= config.maxEnqueueBytes
        {
            batch = open
        } else {
            batch = spareBatches.popLast() ?? EventBatch()
            batch.open(stream: inst.stream, consent: inst.consentKey)
            outbox[inst.appKey, default: []].append(batch)
        }
        batch.add(call, eventId: eventId, parked: parked, write)
        // Events recorded in the same loop turn go to the uploader in one enqueue (one hop and
        // one commit for many events); each caller is answered when that enqueue is durable.
        // While the AppKey has `maxEnqueuesInFlight` enqueues unanswered the batch waits and
        // keeps collecting: it is sent when an answer frees a slot.
        armOutboxFlush(inst.appKey)
    }

    /// Sends the AppKey's open batches at the end of this loop turn, unless all its enqueue
    /// slots are taken (an answer then arms the flush).
    func armOutboxFlush(_ appKey: String) {
        guard enqueuesInFlight[appKey, default: 0] < config.maxEnqueuesInFlight || uploaderDown, !outboxTimer.isActive else { return }
        outboxTimer.start(after: 0)
    }

    /// The instance's `"utm":…,"device":…` record text, rebuilt after its settings change.
    func eventTail(_ inst: MAInstance) -> [UInt8] {
        if let t = inst.eventTail { return t }
        var device: [(String, String)] = [("os", "linux")]
        if inst.collectControl["idfv"] == true { device.append(("idfv", vendorId)) }
        if inst.collectControl["idfa"] == true, let a = config.advertisingId { device.append(("idfa", a)) }
        if inst.collectControl["carrier"] == true, let c = config.carrier { device.append(("carrier", c)) }
        let t = EventText.tail(utm: inst.utm, device: device)
        inst.eventTail = t
        return t
    }

    /// Bytes of a record besides its name, properties and tail (id, time, EUID, session, keys):
    /// an upper bound, so a batch stays under `maxEnqueueBytes`.
    static let recordFrameBytes = 512

    /// Events per uploader enqueue. Small enough that the host, the uploader and this plugin
    /// work on consecutive chunks at the same time (measured: 1000 per enqueue ran the three
    /// in lock step at ~21k events/s; 128 gives ~30k with the same CPU).
    static let maxRecordsPerEnqueue = 128

    /// Sends the waiting batches (one enqueue each), oldest first, as far as each AppKey's
    /// enqueue slots (`maxEnqueuesInFlight`) allow; the rest wait for an answer.
    ///
    /// Why a limit: with nothing in flight the first event goes out at once (no added delay at
    /// one request at a time), but under load every loop turn of this plugin used to send its
    /// own small enqueue, so the host and the uploader paid per message for a few events each.
    /// With the slots taken, the events of the following turns collect in one batch until an
    /// answer comes — the batches grow with the load, by themselves.
    func flushOutbox() {
        for appKey in Array(outbox.keys) {
            guard var batches = outbox[appKey] else { continue }
            guard let inst = instances[appKey] else {  // never left unanswered
                outbox[appKey] = nil
                let reply = Self.serialized(Self.result(MACode.failed, "AppKey \(appKey) is gone"))
                for batch in batches {
                    outboxCount -= batch.count
                    for c in batch.calls { c?.reply(serialized: reply) }
                    recycle(batch)
                }
                continue
            }
            var inFlight = enqueuesInFlight[appKey, default: 0]
            var sent = 0
            while sent < batches.count, inFlight < config.maxEnqueuesInFlight {
                let batch = batches[sent]
                sent += 1
                inFlight += 1
                outboxCount -= batch.count
                held += batch.count
                enqueuesSent += 1
                eventsEnqueued += batch.count
                batch.close()
                enqueue(batch, inst, attempt: 1)
            }
            enqueuesInFlight[appKey] = inFlight
            // The uploader is down: the batches that wait for a slot are kept on disk too, and
            // their callers answered (they are sent when a slot frees).
            if uploaderDown {
                for batch in batches[sent...] where !batch.isClosed {
                    batch.close()
                    holdOnDisk(batch, inst)
                }
            }
            batches.removeFirst(sent)
            outbox[appKey] = batches.isEmpty ? nil : batches
        }
    }

    /// Keeps a settled batch (its buffer and its list) for a later one: a fresh buffer of this
    /// size would be a large malloc, which makes glibc consolidate its fast bins first (~15% of
    /// this plugin's profile before buffers were reused).
    private func recycle(_ batch: EventBatch) {
        guard spareBatches.count < Self.maxSpareBatches else { return }
        spareBatches.append(batch)
    }

    /// Batches kept for reuse (batches of several AppKeys in one turn take one each).
    static let maxSpareBatches = 8

    /// Sends one batch as an enqueue (also a batch read back from disk at start: `MAService+Offline`). If the uploader is restarting (-32001) or did not answer
    /// in time (-32002), the same records are sent again after a backoff: the app's reply waits,
    /// and the uploader ignores records it already has (ids are unique per stream), so nothing
    /// is doubled. Any other answer settles the batch.
    func enqueue(_ batch: EventBatch, _ inst: MAInstance, attempt: Int) {
        // Once the enqueue succeeds the host answers the callers itself (`okReply`), in the
        // loop turn it relays the uploader's answer here: no reply of this plugin's to read.
        let answering = Plugin.Answering(batch.calls.compactMap { $0 }, with: Self.okReply)
        batch.text.withUnsafeBytes { params in
            plugin.call(
                "uploader.enqueue", .text(params), answering: answering,
                answer: .text { [unowned self] r in
                    let err: String?
                    switch r {
                    case .success:
                        err = nil
                        self.uploaderDown = false
                    case .failure(let e) where e.code == RPCError.Code.consentDenied.rawValue:
                        // The switch was denied between recording and storing (the operator's decision
                        // overtook it): not stored, so not answered as if it were.
                        err = "not stored: \(e.message)"
                    case .failure(let e)
                    where e.code == RPCError.Code.pluginUnavailable.rawValue || e.code == RPCError.Code.timeout.rawValue:
                        let delay = Self.uploaderRetry.delay(attempt: attempt)
                        if attempt == 1 {
                            self.plugin.log.warn("uploader unavailable; holding events", ["events": batch.count, "error": e.message])
                        }
                        // Kept on disk and answered now: the callers need not wait for the uploader,
                        // nor do those of the batches waiting for a slot meanwhile.
                        self.uploaderDown = true
                        self.holdOnDisk(batch, inst)
                        if self.outbox[inst.appKey] != nil { self.armOutboxFlush(inst.appKey) }
                        self.plugin.loop.after(ms: delay) { [unowned self] in self.enqueue(batch, inst, attempt: attempt + 1) }
                        return
                    case .failure(let e): err = e.message
                    }
                    let n = batch.count
                    self.held -= n
                    self.enqueueSettled(inst.appKey)
                    // On success the calls are answered already (by the host), and these replies are ignored.
                    let reply = err.map { Self.serialized(Self.result(MACode.failed, $0)) } ?? Self.okReply
                    for c in batch.calls { c?.reply(serialized: reply) }
                    // Parked rows leave the disk, and client event ids enter the window.
                    self.batchSettled(batch, inst, stored: err == nil)
                    self.recycle(batch)
                    self.eventsSettled(inst, n)
                })
        }
    }

    /// An enqueue of `appKey` is answered: its slot is free, so a waiting batch goes out at the
    /// end of this loop turn (with whatever else this turn records).
    private func enqueueSettled(_ appKey: String) {
        let n = enqueuesInFlight[appKey, default: 1] - 1
        enqueuesInFlight[appKey] = n > 0 ? n : nil
        if outbox[appKey] != nil { armOutboxFlush(appKey) }
    }

    /// A result's JSON text, for answering many calls with one value.
    static func serialized(_ result: JSON) -> [UInt8] { JSONRef(result).withSerialized { Array($0) } }

    /// Runs `action` once no event of `inst` is waiting for the uploader (sending the outbox now).
    /// Parked events count too, unless a start or identify is pending: they can go only once none
    /// is (a start turning collection off waits for the events before it, not for those parked
    /// behind it, which the switch then drops).
    func whenEventsSettled(_ inst: MAInstance, _ action: @escaping () -> Void) {
        guard inst.eventsInFlight > 0 || (inst.parked > 0 && inst.pendingStarts == 0) else { return action() }
        inst.drainWaiters.append(action)
        if inst.parked > 0 { releaseParked(inst) }
        if !outbox.isEmpty { flushOutbox() }
    }

    func eventsSettled(_ inst: MAInstance, _ n: Int) {
        inst.eventsInFlight -= n
        guard inst.eventsInFlight == 0, inst.parked == 0 || inst.pendingStarts > 0, !inst.drainWaiters.isEmpty else { return }
        let waiters = inst.drainWaiters
        inst.drainWaiters = []
        for w in waiters { w() }
    }
}

/// Events recorded for one AppKey in this loop turn, up to `maxRecordsPerEnqueue`: the params of
/// one `uploader.enqueue` as JSON text (its records so far) and who waits for each record (nil:
/// the plugin's own session events). A class, so that a settled batch is reused, emptied, for a
/// later one (no large malloc per enqueue).
final class EventBatch {
    private(set) var text: [UInt8] = []
    /// Who waits for each record, in order.
    private(set) var calls: [Call?] = []
    var count: Int { calls.count }
    /// The client event ids of its records.
    private(set) var eventIds: [String] = []
    /// The parked rows among its records (`MAService+Offline`): the lowest and highest seq
    /// (they are consecutive) and how many.
    private(set) var parkedSeqs: ClosedRange<Int64>?
    private(set) var parkedCount = 0
    /// Its row in ma.db's `held` while the uploader is unavailable (`MAService.holdOnDisk`).
    var heldSeq: Int64?
    /// Its params are complete (`close`): no record is added.
    private(set) var isClosed = false

    init() {
        // Room for a full batch of typical records (~350 bytes each): no regrowth on the way.
        text.reserveCapacity(MAService.maxRecordsPerEnqueue * 384)
        calls.reserveCapacity(MAService.maxRecordsPerEnqueue)
    }

    /// Empties the batch (keeping its storage) and starts the params of an enqueue to `stream`.
    func open(stream: String, consent: String) {
        text.removeAll(keepingCapacity: true)
        calls.removeAll(keepingCapacity: true)
        eventIds.removeAll(keepingCapacity: true)
        parkedSeqs = nil
        parkedCount = 0
        heldSeq = nil
        isClosed = false
        EventText.paramsHead(stream: stream, consent: consent, into: &text)
    }

    /// Adds one record, written by `write`, and who waits for it.
    func add(_ call: Call?, eventId: String? = nil, parked: Int64? = nil, _ write: (inout [UInt8]) -> Void) {
        if !calls.isEmpty { text.append(UInt8(ascii: ",")) }
        write(&text)
        calls.append(call)
        if let eventId { eventIds.append(eventId) }
        if let parked {
            parkedSeqs = parkedSeqs.map { min($0.lowerBound, parked)...max($0.upperBound, parked) } ?? parked...parked
            parkedCount += 1
        }
    }

    /// Completes `text` as the enqueue's params (no record is added after).
    func close() {
        guard !isClosed else { return }
        isClosed = true
        EventText.paramsTail(into: &text)
    }

    /// Takes the callers out (they were answered): the batch then waits for nobody.
    func detachCalls() -> [Call?] {
        let c = calls
        calls = Array(repeating: nil, count: c.count)
        return c
    }

    /// A closed batch read back from ma.db's `held`: its params, its `count` records, their
    /// client event ids.
    func restore(params: [UInt8], count: Int, eventIds: [String], heldSeq: Int64) {
        open(stream: "", consent: "")
        text = params
        isClosed = true
        calls = Array(repeating: nil, count: count)
        self.eventIds = eventIds
        self.heldSeq = heldSeq
    }
}
