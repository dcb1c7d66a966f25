import PylonPluginKit
import PylonStore

/// Offline MA (docs/MA.md, "Offline"): what a device without network answers at once, what it
/// keeps on disk, and what waits.
///
/// - Events recorded while a start or identify of their AppKey is pending are **parked**: written
///   to ma.db (`parked`, one transaction per loop turn) and answered 0 once that commits. When
///   no start or identify is pending any more they are read back in order, stamped with the
///   AppKey's EUID of that moment, and handed to the uploader; each row leaves the disk once the
///   uploader stored it. Later events are parked too while parked ones remain, so order holds.
/// - A client event id (`eventId`) makes a retry safe: the device keeps each id once — parked,
///   in flight (the record id is `c:<eventId>`, which the uploader keeps once while queued), or
///   among the AppKey's last `eventIdWindow` stored ones (persisted).
/// - A start or identify whose backend attempt fails with a network error or 5xx is answered
///   pending (`-32008`, `data`: the wait) at once and goes on in the background; the ones queued
///   behind it too. `ma.status` shows the wait (`waitingForNetwork`).
/// - An enqueue the uploader could not take (restarting: -32001, or no answer in time) is kept in
///   ma.db (`held`, its params as sent) and its callers answered 0; it is sent again with backoff
///   (after a restart of this plugin too) and leaves the disk once the uploader answered.
/// - Starts and identifies not yet answered by the backend are kept in ma.db (`identity_ops`)
///   and run again after a restart of the plugin, so parked events get their EUID.
extension MAService {
    static let offlineSchema = """
        CREATE TABLE IF NOT EXISTS parked(
            seq INTEGER PRIMARY KEY AUTOINCREMENT, app_key TEXT NOT NULL, event_id TEXT, record_id TEXT NOT NULL,
            name BLOB NOT NULL, time_ms INTEGER NOT NULL, session TEXT, properties BLOB NOT NULL, tail BLOB NOT NULL,
            UNIQUE(app_key, event_id));
        CREATE TABLE IF NOT EXISTS event_ids(
            seq INTEGER PRIMARY KEY AUTOINCREMENT, app_key TEXT NOT NULL, event_id TEXT NOT NULL, UNIQUE(app_key, event_id));
        CREATE TABLE IF NOT EXISTS identity_ops(
            seq INTEGER PRIMARY KEY AUTOINCREMENT, app_key TEXT NOT NULL, kind TEXT NOT NULL, params TEXT NOT NULL);
        CREATE TABLE IF NOT EXISTS held(seq INTEGER PRIMARY KEY AUTOINCREMENT, app_key TEXT NOT NULL, params BLOB NOT NULL);
        """

    /// Parked events read back per round: the next round starts once these are settled.
    static let releaseChunk = 512

    // MARK: Parking

    /// Whether the device has the client event id `eventId` of `inst` already.
    func isKnownEvent(_ inst: MAInstance, _ eventId: String) -> Bool {
        inst.parkedEventIds.contains(eventId) || inst.recentEventIds.contains(eventId)
    }

    /// Parks one event (answered once the loop turn's transaction commits).
    func park(
        _ inst: MAInstance, name: UnsafeRawBufferPointer, properties: UnsafeRawBufferPointer, session: String?, eventId: String?,
        for call: Call?
    ) {
        guard parkedTotal < config.maxParkedEvents else {
            call?.reply(
                Self.result(MACode.failed, "too many events waiting for their AppKey's start (maxParkedEvents \(config.maxParkedEvents))"))
            return
        }
        let recordId: String
        if let eventId {
            recordId = Self.recordId(eventId: eventId)
            inst.parkedEventIds.insert(eventId)
        } else {
            eventSeq &+= 1
            recordId = String(decoding: eventIdPrefix, as: UTF8.self) + "-\(eventSeq)"
        }
        inst.parked += 1
        parkedTotal += 1
        parkQueue.append(
            ParkedEvent(
                inst: inst, eventId: eventId, recordId: recordId, name: Array(name), timeMs: System.wallClockMs(), session: session,
                properties: Array(properties), tail: eventTail(inst), call: call))
        if !parkTimer.isActive { parkTimer.start(after: 0) }
    }

    /// Writes the loop turn's parked events in one transaction, then answers their callers.
    func flushParkQueue() {
        let q = parkQueue
        parkQueue = []
        guard !q.isEmpty else { return }
        do {
            try db.transaction { () throws(SQLiteError) in
                for e in q {
                    try db.run(
                        """
                        INSERT INTO parked(app_key,event_id,record_id,name,time_ms,session,properties,tail)
                        VALUES(?,?,?,?,?,?,?,?)
                        """,
                        [
                            .text(e.inst.appKey), e.eventId.map { .text($0) } ?? .null, .text(e.recordId), .blob(e.name),
                            .int(e.timeMs), e.session.map { .text($0) } ?? .null, .blob(e.properties), .blob(e.tail),
                        ])
                }
            }
            for e in q { e.call?.reply(serialized: Self.okReply) }
        } catch {
            plugin.log.error("cannot park events", ["events": q.count, "error": "\(error)"])
            let reply = Self.serialized(Self.result(MACode.failed, "event not stored: \(error)"))
            for e in q {
                e.inst.parked -= 1
                parkedTotal -= 1
                if let id = e.eventId { e.inst.parkedEventIds.remove(id) }
                e.call?.reply(serialized: reply)
            }
        }
        var seen = Set<ObjectIdentifier>()
        for e in q where seen.insert(ObjectIdentifier(e.inst)).inserted { releaseParked(e.inst) }
    }

    /// Hands the next round of `inst`'s parked events to the outbox, once no start or identify
    /// is pending and the last round is settled. An AppKey without an EUID (every start failed)
    /// cannot send them: they are dropped and counted (`parkedDropped`), never sent without one.
    func releaseParked(_ inst: MAInstance) {
        guard inst.pendingStarts == 0, inst.parked > 0, inst.releasing == 0 else { return }
        // Rows still waiting for their transaction come in a later round.
        guard !parkQueue.contains(where: { $0.inst === inst }) else { return }
        guard inst.started, let euid = inst.euid else {
            do {
                try db.run("DELETE FROM parked WHERE app_key=?", [.text(inst.appKey)])
            } catch {
                plugin.log.error("cannot drop parked events", ["appKey": inst.appKey, "error": "\(error)"])
                return
            }
            plugin.log.warn(
                "parked events dropped: the AppKey has no EUID (its start failed)", ["appKey": inst.appKey, "events": inst.parked])
            parkedDropped += inst.parked
            parkedTotal -= inst.parked
            inst.parked = 0
            inst.parkedEventIds = []
            eventsSettled(inst, 0)
            return
        }
        let rows: [[SQLValue]]
        do {
            rows = try db.query(
                "SELECT seq, event_id, record_id, name, time_ms, session, properties, tail FROM parked WHERE app_key=? ORDER BY seq LIMIT ?",
                [.text(inst.appKey), .int(Int64(Self.releaseChunk))])
        } catch {
            plugin.log.error("cannot read parked events", ["appKey": inst.appKey, "error": "\(error)"])
            return
        }
        for r in rows {
            guard let seq = r[0].int, let recordId = r[2].text, let time = r[4].int else { continue }
            let name = r[3].bytes, properties = r[6].bytes, tail = r[7].bytes
            let size = name.count + properties.count + tail.count + Self.recordFrameBytes
            inst.releasing += 1
            addToOutbox(inst, size: size, call: nil, eventId: r[1].text, parked: seq) { text in
                name.withUnsafeBytes { n in
                    properties.withUnsafeBytes { p in
                        tail.withUnsafeBytes { t in
                            EventText.record(
                                id: recordId, name: n, timeMs: time, euid: euid, session: r[5].text, properties: p, tail: t,
                                into: &text)
                        }
                    }
                }
            }
        }
    }

    /// Keeps a batch the uploader could not take in ma.db and answers its callers 0: the events
    /// are durable on the device. Once per batch; a batch without callers waiting stays in memory
    /// only (parked rows and own events: on disk already, or the plugin's).
    func holdOnDisk(_ batch: EventBatch, _ inst: MAInstance) {
        guard batch.heldSeq == nil, batch.calls.contains(where: { $0 != nil }) else { return }
        do {
            try db.run("INSERT INTO held(app_key,params) VALUES(?,?)", [.text(inst.appKey), .blob(batch.text)])
        } catch {
            plugin.log.warn("cannot keep held events on disk; they wait in memory", ["appKey": inst.appKey, "error": "\(error)"])
            return
        }
        batch.heldSeq = db.lastInsertRowID
        for c in batch.detachCalls() { c?.reply(serialized: Self.okReply) }
    }

    /// A batch was settled (`stored`: the uploader has it): its parked rows leave the disk and
    /// its client event ids enter the AppKey's window.
    func batchSettled(_ batch: EventBatch, _ inst: MAInstance, stored: Bool) {
        if stored, !batch.eventIds.isEmpty { remember(batch.eventIds, inst) }
        if let seq = batch.heldSeq {
            try? db.run("DELETE FROM held WHERE seq=?", [.int(seq)])
            batch.heldSeq = nil
        }
        guard let seqs = batch.parkedSeqs else { return }
        do {
            try db.run(
                "DELETE FROM parked WHERE app_key=? AND seq BETWEEN ? AND ?",
                [.text(inst.appKey), .int(seqs.lowerBound), .int(seqs.upperBound)])
        } catch {
            // Sent again after a restart: the same record ids, stored once.
            plugin.log.error("cannot delete parked events", ["appKey": inst.appKey, "error": "\(error)"])
        }
        for id in batch.eventIds { inst.parkedEventIds.remove(id) }
        inst.parked -= batch.parkedCount
        inst.releasing -= batch.parkedCount
        parkedTotal -= batch.parkedCount
        if inst.releasing == 0 { releaseParked(inst) }
    }

    /// Adds client event ids to `inst`'s window, on disk too (the ids that fall out leave it).
    private func remember(_ ids: [String], _ inst: MAInstance) {
        var gone: [String] = []
        for id in ids { if let old = inst.recentEventIds.add(id, limit: config.eventIdWindow) { gone.append(old) } }
        do {
            try db.transaction { () throws(SQLiteError) in
                for id in ids {
                    try db.run("INSERT OR IGNORE INTO event_ids(app_key,event_id) VALUES(?,?)", [.text(inst.appKey), .text(id)])
                }
                for id in gone { try db.run("DELETE FROM event_ids WHERE app_key=? AND event_id=?", [.text(inst.appKey), .text(id)]) }
            }
        } catch {
            plugin.log.warn("cannot persist event ids", ["appKey": inst.appKey, "error": "\(error)"])
        }
    }

    // MARK: Waiting for the network

    /// The pending answer (`-32008`) to a start, identify or other call that waits behind a start
    /// or identify waiting for the network: it goes on, and its outcome shows in `ma.status` and
    /// `ma.euid`.
    func pendingAnswer(_ inst: MAInstance) -> RPCError {
        var data: JSONObject = ["pending": true, "appKey": .string(inst.appKey)]
        if let w = inst.networkWait { data["waitingForNetwork"] = w.json }
        return RPCError(
            .pending, "waiting for the network: the call goes on and takes effect when the MA backend answers (see ma.status)",
            data: .object(data))
    }

    /// A backend attempt of the running start or identify failed (network or 5xx); the next is
    /// in `delayMs`.
    func networkFailed(_ inst: MAInstance, attempt: Int, delayMs: UInt64, reason: String) {
        let now = System.wallClockMs()
        inst.networkWait = NetworkWait(
            sinceMs: inst.networkWait?.sinceMs ?? now, attempts: attempt, nextTryMs: now + Int64(delayMs), reason: reason)
    }

    // MARK: Starts and identifies across restarts

    /// Keeps a start or identify until the backend has answered it; returns its row.
    func persistOp(_ appKey: String, kind: String, _ params: JSON) -> Int64? {
        do {
            try db.run(
                "INSERT INTO identity_ops(app_key,kind,params) VALUES(?,?,?)", [.text(appKey), .text(kind), .text(params.serialized)])
            return db.lastInsertRowID
        } catch {
            plugin.log.warn("cannot persist a pending start", ["appKey": appKey, "error": "\(error)"])
            return nil
        }
    }

    func forgetOp(_ seq: Int64?) {
        guard let seq else { return }
        try? db.run("DELETE FROM identity_ops WHERE seq=?", [.int(seq)])
    }

    /// At `open`: parked events, client event ids, and the starts and identifies that were
    /// pending when the plugin stopped (run again, in order, with nobody to answer).
    func restoreOffline() throws(SQLiteError) {
        for r in try db.query("SELECT seq, app_key, kind, params FROM identity_ops ORDER BY seq") {
            guard let seq = r[0].int, let k = r[1].text, let kind = r[2].text, let p = r[3].text.flatMap({ try? JSON.parse($0) }),
                AppKey.isValid(k)
            else { continue }
            let inst = instances[k] ?? MAInstance(appKey: k)
            instances[k] = inst
            switch kind {
            case "start":
                if inst.ownerUid == nil { inst.ownerUid = p["ownerUid"]?.intValue }
                runStart(inst, StartInput(p), client: nil, call: nil, opSeq: seq)
            case "identify": runIdentify(inst, IdentityInput(p), call: nil, opSeq: seq)
            default: forgetOp(seq)
            }
        }
        for r in try db.query("SELECT app_key, event_id FROM parked ORDER BY seq") {
            guard let k = r[0].text, AppKey.isValid(k) else { continue }
            let inst = instances[k] ?? MAInstance(appKey: k)
            instances[k] = inst
            inst.parked += 1
            parkedTotal += 1
            if let id = r[1].text { inst.parkedEventIds.insert(id) }
        }
        for r in try db.query("SELECT app_key, event_id FROM event_ids ORDER BY seq") {
            guard let k = r[0].text, let id = r[1].text, let inst = instances[k] else { continue }
            _ = inst.recentEventIds.add(id, limit: config.eventIdWindow)
        }
        // Enqueues held for the uploader when the plugin stopped: sent again first.
        for r in try db.query("SELECT seq, app_key, params FROM held ORDER BY seq") {
            guard let seq = r[0].int, let k = r[1].text, AppKey.isValid(k),
                let p = try? JSON.parse(String(decoding: r[2].bytes, as: UTF8.self)),
                let recs = p["records"]?.arrayValue, !recs.isEmpty
            else {
                if let seq = r[0].int { try db.run("DELETE FROM held WHERE seq=?", [.int(seq)]) }
                continue
            }
            let inst = instances[k] ?? MAInstance(appKey: k)
            instances[k] = inst
            let ids = recs.compactMap { $0["id"]?.stringValue }.filter { $0.hasPrefix("c:") }.map { String($0.dropFirst(2)) }
            let batch = EventBatch()
            batch.restore(params: r[2].bytes, count: recs.count, eventIds: ids, heldSeq: seq)
            held += recs.count
            inst.eventsInFlight += recs.count
            enqueuesInFlight[k, default: 0] += 1
            enqueue(batch, inst, attempt: 1)
        }
        let parked = instances.values.filter { $0.parked > 0 }
        if !parked.isEmpty {
            plugin.log.info("parked events restored", ["events": parkedTotal, "appKeys": parked.count])
            for inst in parked { releaseParked(inst) }
        }
    }
}

/// One event on its way into ma.db's `parked` table.
struct ParkedEvent {
    let inst: MAInstance
    let eventId: String?
    let recordId: String
    let name: [UInt8]
    let timeMs: Int64
    let session: String?
    let properties: [UInt8]
    let tail: [UInt8]
    let call: Call?
}

extension SQLValue {
    /// A blob's (or text's) bytes; empty for anything else.
    fileprivate var bytes: [UInt8] {
        switch self {
        case .blob(let b): b
        case .text(let t): Array(t.utf8)
        default: []
        }
    }
}
