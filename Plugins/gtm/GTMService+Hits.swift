import PylonCore
import PylonPluginKit
import PylonStore
import PylonTagEngine

/// Hits and the `gtm.push` answer (docs/GTM.md, "Hits"): a push is answered `queued: true`
/// only once every hit its tags made is durable — stored by the uploader (its enqueue
/// answered), or, while the uploader cannot take it (restarting: -32001, or no answer in
/// time: -32002), committed to `gtm.db` (`held_hits`, one transaction per loop turn for all
/// the hits held in it). A held hit is sent again with backoff, after a restart of this plugin
/// too, and leaves the disk once the uploader answered; its record id is kept, so the uploader
/// stores it once. At most `maxHeldHits` are held (plugin-wide): a push one of whose hits is
/// beyond that is answered `-32004` (`limit: maxHeldHits`, `hitsDropped`).
extension GTMService {
    static let heldHitsSchema = """
        CREATE TABLE IF NOT EXISTS held_hits(seq INTEGER PRIMARY KEY AUTOINCREMENT, owner TEXT NOT NULL,
            container TEXT NOT NULL, stream TEXT NOT NULL, record TEXT NOT NULL);
        """

    /// One `gtm.push` waiting for its answer: the handling of the push and each hit it made
    /// count as one unsettled part; the answer goes out when the last is settled.
    final class PushAck {
        let call: Call
        let containers: Int
        private var pending = 1
        private(set) var dropped = 0
        private(set) var notStored: String?

        init(call: Call, containers: Int) {
            self.call = call
            self.containers = containers
        }

        func add() { pending += 1 }

        /// One part is settled (`dropped`: a hit beyond `maxHeldHits`; `notStored`: a hit that
        /// could not be made durable, why).
        func settle(dropped d: Bool = false, notStored why: String? = nil, maxHeldHits: Int = 0) {
            if d { dropped += 1 }
            if let why { notStored = why }
            pending -= 1
            guard pending == 0 else { return }
            if dropped > 0 {
                call.fail(
                    RPCError(
                        .overloaded,
                        "the push was applied but \(dropped) of its hits were dropped: the uploader is unavailable and "
                            + "maxHeldHits \(maxHeldHits) are held",
                        data: ["limit": "maxHeldHits", "hitsDropped": .int(Int64(dropped))]))
            } else if let notStored {
                call.fail(RPCError(.internalError, "the push was applied but a hit could not be stored: \(notStored)"))
            } else {
                call.reply(["queued": true, "containers": .int(Int64(containers))])
            }
        }

        /// The push will not be handled (its queue was cleared).
        func fail(_ e: RPCError) {
            pending = -1
            call.fail(e)
        }
    }

    /// A hit the uploader could not take, waiting for this loop turn's transaction.
    struct HoldingHit {
        let tenant: Tenant
        let containerId: String
        let record: JSON
        let stream: String
        let ack: PushAck?
    }

    /// Creates `held_hits` and sends every hit held in it (a previous run's) again.
    func restoreHeldHits() {
        guard let db = store?.db else { return }
        let rows: [[SQLValue]]
        do {
            try db.exec(Self.heldHitsSchema)
            rows = try db.query("SELECT seq, owner, container, stream, record FROM held_hits ORDER BY seq")
        } catch {
            log.error(nil, "cannot read held hits: \(error.description)")
            return
        }
        for r in rows {
            guard let seq = r[0].int, let ok = r[1].text, let o = Owner(key: ok), let c = r[2].text, let s = r[3].text,
                let text = r[4].text, let rec = try? JSON.parse(text), let t = tenant(o, create: true)
            else { continue }
            hitsHeld += 1
            sendHit(t, c, rec, stream: s, attempt: 1, held: seq, ack: nil)
        }
        if hitsHeld > 0 { log.info(nil, "\(hitsHeld) held hits sent again") }
    }

    /// One hit to the uploader. Answered: settled (`ack`), and its row (`held`) deleted. The
    /// uploader restarting (-32001) or not answering in time (-32002): a hit not yet on disk is
    /// held (`hold`), one on disk is sent again after a backoff (the record id is unique, so the
    /// uploader never stores it twice).
    func sendHit(
        _ tenant: Tenant, _ containerId: String, _ rec: JSON, stream: String, attempt: Int, held: Int64?, ack: PushAck?
    ) {
        let owner = tenant.owner
        plugin.call(
            "uploader.enqueue",
            [
                "stream": .string(stream), "consent": .string(GTMService.hitConsent),
                "records": [rec],
            ]
        ) { [unowned self] r in
            switch r {
            case .success:
                tenant.counters.hitsQueued += 1
                self.release(held)
                ack?.settle()
            case .failure(let e) where e.code == RPCError.Code.pluginUnavailable.rawValue || e.code == RPCError.Code.timeout.rawValue:
                tenant.counters.hitsRetried += 1
                guard let held else {
                    guard self.hitsHeld < self.limits.maxHeldHits else {
                        tenant.counters.hitsDropped += 1
                        self.log.warning(
                            owner, "\(containerId): hit dropped: uploader unavailable and maxHeldHits \(self.limits.maxHeldHits) held")
                        ack?.settle(dropped: true, maxHeldHits: self.limits.maxHeldHits)
                        return
                    }
                    self.log.info(owner, "\(containerId): uploader unavailable (\(e.message)); hit held")
                    self.hold(HoldingHit(tenant: tenant, containerId: containerId, record: rec, stream: stream, ack: ack))
                    return
                }
                let delay = GTMService.uploaderRetry.delay(attempt: attempt)
                _ = self.plugin.loop.after(ms: delay) { [unowned self] in
                    self.sendHit(tenant, containerId, rec, stream: stream, attempt: attempt + 1, held: held, ack: nil)
                }
            case .failure(let e):
                if e.code == RPCError.Code.consentDenied.rawValue { tenant.counters.hitsDroppedForConsent += 1 }
                self.log.warning(owner, "\(containerId): hit not queued: \(e.message)")
                self.release(held)
                ack?.settle()
            }
        }
    }

    /// Queues a hit for this loop turn's transaction (counted in `hitsHeld` from now on).
    private func hold(_ h: HoldingHit) {
        hitsHeld += 1
        holdQueue.append(h)
        if holdQueue.count == 1 { _ = plugin.loop.after(ms: 0) { [unowned self] in self.flushHoldQueue() } }
    }

    /// Writes the loop turn's held hits in one transaction, settles their pushes, and sends
    /// each again after the first backoff. Without a store (or when the write fails) the hits
    /// are still sent again from memory, and their pushes answered with an error.
    func flushHoldQueue() {
        let q = holdQueue
        holdQueue = []
        guard !q.isEmpty else { return }
        var seqs: [Int64?] = Array(repeating: nil, count: q.count)
        var why: String?
        if let db = store?.db {
            do {
                try db.transaction { () throws(SQLiteError) in
                    for (i, h) in q.enumerated() {
                        try db.run(
                            "INSERT INTO held_hits(owner, container, stream, record) VALUES (?, ?, ?, ?)",
                            [.text(h.tenant.owner.key), .text(h.containerId), .text(h.stream), .text(h.record.serialized)])
                        seqs[i] = db.lastInsertRowID
                    }
                }
            } catch {
                seqs = Array(repeating: nil, count: q.count)
                why = error.description
            }
        } else {
            why = "gtm.db is not open"
        }
        if let why { log.error(nil, "cannot keep \(q.count) held hits on disk: \(why) (they wait in memory)") }
        let delay = GTMService.uploaderRetry.delay(attempt: 1)
        for (i, h) in q.enumerated() {
            h.ack?.settle(notStored: why)
            let seq = seqs[i]
            _ = plugin.loop.after(ms: delay) { [unowned self] in
                self.sendHit(h.tenant, h.containerId, h.record, stream: h.stream, attempt: 2, held: seq ?? 0, ack: nil)
            }
        }
    }

    /// A held hit is settled: its row (0: in memory only) leaves the disk.
    private func release(_ held: Int64?) {
        guard let held else { return }
        hitsHeld -= 1
        guard held > 0 else { return }
        do {
            try store?.db.run("DELETE FROM held_hits WHERE seq = ?", [.int(held)])
        } catch {
            // Sent again after a restart: the same record id, stored once.
            log.error(nil, "cannot delete a held hit: \(error.description)")
        }
    }
}
