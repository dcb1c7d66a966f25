import PylonCore
import PylonStore

/// Dead letters: records set aside because the endpoint refused their batch (docs/UPLOADER.md
/// "uploader.deadLetters"). They stay on disk until their owner (or an admin) re-queues or
/// discards them, so they count in the disk cap and their owner's share like queued records: a
/// caller whose records are refused cannot grow the database past its share by enqueueing more.
extension UploaderStore {
    /// What a dead letter's row costs besides its text (stream, id, data, batch key and reason):
    /// its sequence number, status, times and SQLite's row and index overhead.
    static let deadLetterRowBytes = 48

    /// What a dead letter counts in the disk cap and its owner's share: the bytes of its row.
    static func deadLetterCharge(stream: String, id: String, data: Int, batch: String, reason: String) -> Int {
        stream.utf8.count + id.utf8.count + data + batch.utf8.count + reason.utf8.count + deadLetterRowBytes
    }

    /// `deadLetterCharge` in SQL, over a `dead_letters` row.
    static let deadLetterChargeSQL =
        "(length(CAST(stream AS BLOB))+length(CAST(id AS BLOB))+length(CAST(body AS BLOB))+length(CAST(batch AS BLOB))"
        + "+length(CAST(reason AS BLOB))+\(deadLetterRowBytes))"

    /// Adds `dead_letters.ts` (the record's own time, kept so a re-queued record goes with it) to
    /// a queue written before it existed; those rows re-queue with their `at_ms`.
    func addDeadLetterTS() throws(SQLiteError) {
        let columns = try db.query("PRAGMA table_info(dead_letters)").compactMap { $0[1].text }
        if !columns.contains("ts") { try db.exec("ALTER TABLE dead_letters ADD COLUMN ts INTEGER") }
    }

    /// Sets a rejected batch aside record by record: kept for inspection, never retried unless
    /// re-queued. The rows are committed first, then the batch's `done` frame is written and its
    /// texts zeroed in the segments (a crash between makes the next open finish it: a batch whose
    /// key has dead letters is done). Returns the records set aside and what they count in the
    /// disk cap.
    func deadLetter(_ key: String, status: Int, reason: String, nowMs: Int64) throws -> (count: Int, bytes: Int) {
        guard let stream = index.batch(key)?.stream else { return (0, 0) }
        var letters: [(id: String, data: String, ts: Int64)] = []
        try texts(records(ofBatch: key)) { t in
            guard let rec = RecordText.parts(t) else { return }
            // The id as the caller sent it (the text holds it JSON-escaped).
            let id = (try? JSONRef.parse(rec.escapedID, maxDepth: 2))?.json.stringValue ?? ""
            letters.append((id, String(decoding: rec.data, as: UTF8.self), rec.ts))
        }
        var bytes = 0
        try db.transaction { () throws(SQLiteError) in
            let ins = try db.prepare("INSERT INTO dead_letters(stream,id,body,batch,status,reason,at_ms,ts) VALUES(?,?,?,?,?,?,?,?)")
            for l in letters {
                ins.reset()
                try ins.bind([
                    .text(stream), .text(l.id), .text(l.data), .text(key), .int(Int64(status)), .text(reason), .int(nowMs), .int(l.ts),
                ])
                while try ins.step() {}
                bytes += UploaderStore.deadLetterCharge(stream: stream, id: l.id, data: l.data.utf8.count, batch: key, reason: reason)
            }
        }
        try deleteBatch(key, zero: true)
        return (letters.count, bytes)
    }

    /// Per stream: its dead letters and what they count in the disk cap.
    func deadLetterSummaries() throws(SQLiteError) -> [String: (count: Int, bytes: Int)] {
        var out: [String: (count: Int, bytes: Int)] = [:]
        for r in try db.query("SELECT stream, COUNT(*), SUM(\(UploaderStore.deadLetterChargeSQL)) FROM dead_letters GROUP BY stream") {
            out[r[0].text ?? ""] = (Int(r[1].int ?? 0), Int(r[2].int ?? 0))
        }
        return out
    }

    /// Dead letters of `streams` (nil: every stream), oldest first.
    func deadLetters(streams: [String]?, limit: Int) throws(SQLiteError) -> [[SQLValue]] {
        let cols = "SELECT stream,id,body,batch,status,reason,at_ms FROM dead_letters"
        guard let streams else { return try db.query("\(cols) ORDER BY seq LIMIT ?", [.int(Int64(limit))]) }
        if streams.isEmpty { return [] }
        let marks = Array(repeating: "?", count: streams.count).joined(separator: ",")
        return try db.query("\(cols) WHERE stream IN (\(marks)) ORDER BY seq LIMIT ?", streams.map { .text($0) } + [.int(Int64(limit))])
    }

    /// Streams holding dead letters.
    func deadLetterStreams() throws(SQLiteError) -> [String] {
        try db.query("SELECT DISTINCT stream FROM dead_letters").compactMap { $0[0].text }
    }

    /// The dead letters of `stream` (those with one of `ids`, or all): sequence number, id,
    /// data, ts (nil: written before ts was kept; `at_ms` is used) and charge.
    private func deadLetterRows(stream: String, ids: [String]?) throws(SQLiteError)
        -> [(seq: Int64, id: String, data: String, ts: Int64, bytes: Int)]
    {
        var sql = "SELECT seq, id, body, COALESCE(ts, at_ms), \(UploaderStore.deadLetterChargeSQL) FROM dead_letters WHERE stream=?"
        var args: [SQLValue] = [.text(stream)]
        if let ids {
            if ids.isEmpty { return [] }
            sql += " AND id IN (\(Array(repeating: "?", count: ids.count).joined(separator: ",")))"
            args += ids.map { .text($0) }
        }
        return try db.query(sql + " ORDER BY seq", args).map { r in
            (r[0].int ?? 0, r[1].text ?? "", r[2].text ?? "null", r[3].int ?? 0, Int(r[4].int ?? 0))
        }
    }

    /// What `requeue` would do, or did.
    struct Requeue: Equatable {
        /// Records queued again.
        var requeued = 0
        /// Dead letters whose id is already queued in the stream: deleted, the queued record goes.
        var duplicates = 0
        /// Dead letters whose id or ts the enqueue refuses today (the backend would refuse them
        /// again): left set aside.
        var invalid = 0
        /// What the queued records count in the disk cap, and what the deleted dead letters did.
        var addedBytes = 0
        var removedBytes = 0
    }

    /// Queues the dead letters of `stream` (those with one of `ids`, or all) again, under
    /// `consent`, at the end of the queue, as an enqueue would. When the records would add more
    /// than `room` bytes to the disk cap (net of the dead letters deleted) nothing is changed
    /// and the plan is returned with `requeued` as it would have been: the caller refuses.
    func requeue(stream: String, consent: String, ids: [String]?, room: Int, nowMs: Int64) throws -> (Requeue, done: Bool) {
        var plan = Requeue()
        var chunks: [Chunk] = []
        var deleted: [Int64] = []
        var keys: [RecordKey] = []
        var seen = index.ids[stream] ?? []
        var escaped: [UInt8] = []
        for row in try deadLetterRows(stream: stream, ids: ids) {
            var id = row.id
            guard id.withUTF8({ EnqueueParams.isValidID(UnsafeRawBufferPointer($0)) }), row.ts >= 0 else {
                plan.invalid += 1
                continue
            }
            escaped.removeAll(keepingCapacity: true)
            JSONText.appendString(row.id, to: &escaped)
            let key = escaped.withUnsafeBytes { RecordKey($0) }
            deleted.append(row.seq)
            plan.removedBytes += row.bytes
            guard seen.insert(key).inserted else {
                plan.duplicates += 1
                continue
            }
            keys.append(key)
            if chunks.isEmpty || chunks[chunks.count - 1].isFull { chunks.append(Chunk()) }
            var data = Array(row.data.utf8)
            if data.isEmpty { data = Array("null".utf8) }
            let charge = escaped.withUnsafeBytes { id in
                data.withUnsafeBytes { d in chunks[chunks.count - 1].append(escapedID: id, ts: row.ts, data: d) }
            }
            plan.addedBytes += charge
            plan.requeued += 1
        }
        // Re-queueing never adds more than it removes at a share or cap already full: allowed.
        let net = plan.addedBytes - plan.removedBytes
        guard net <= 0 || net <= room else { return (plan, false) }
        guard !deleted.isEmpty else { return (plan, true) }
        // The records first (a crash after them leaves the dead letters too: a second
        // re-queue finds their ids queued and deletes them as duplicates).
        if !chunks.isEmpty {
            let r = try appendChunks(chunks.map { (stream, consent, $0, nil, nowMs) }, prefix: [])
            insert(r.placed, seg: r.seg)
        }
        try db.transaction { () throws(SQLiteError) in
            let del = try db.prepare("DELETE FROM dead_letters WHERE seq=?")
            for seq in deleted {
                del.reset()
                try del.bind([.int(seq)])
                while try del.step() {}
            }
        }
        if !keys.isEmpty { index.ids[stream, default: []].formUnion(keys) }
        return (plan, true)
    }

    /// Deletes the dead letters of `stream` (those with one of `ids`, or all), zeroing the freed
    /// pages (they may hold personal data). Returns how many and what they counted.
    func discard(stream: String, ids: [String]?) throws(SQLiteError) -> (count: Int, bytes: Int) {
        var sql = "DELETE FROM dead_letters WHERE stream=?"
        var args: [SQLValue] = [.text(stream)]
        if let ids {
            if ids.isEmpty { return (0, 0) }
            sql += " AND id IN (\(Array(repeating: "?", count: ids.count).joined(separator: ",")))"
            args += ids.map { .text($0) }
        }
        let rows = try db.transaction { () throws(SQLiteError) in
            try db.query(sql + " RETURNING \(UploaderStore.deadLetterChargeSQL)", args)
        }
        return (rows.count, rows.reduce(0) { $0 + Int($1[0].int ?? 0) })
    }
}
