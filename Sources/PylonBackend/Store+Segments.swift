import PylonCore
import PylonStore

/// Segments evaluated over the MA tables (docs/AUTOMATION.md "Segments"), and one-off sends to
/// a segment's members:
///
/// - a segment's members are `ma_users` rows of its AppKey; identity and push-binding
///   conditions are `EXISTS` over `ma_identities`, `push_bindings` and `push_devices`; event
///   history is a `GROUP BY euid HAVING count(*)` over the event index (`events_app_event_time`),
///   or for one user a count over `events_app_euid_time`; profile conditions are checked in
///   Swift on the page read (the two engines' JSON functions differ).
/// - `automation_sends`: a one-off send (its segment, its push or template), and
///   `automation_send_members` its members as snapshotted at the request, each `pending`,
///   `claimed` by one instance, then `sent` (message id) or `suppressed` (reason). The push's
///   dedup key is `automation-send:<send id>:<euid>`.
extension Store {
    static let segmentSendSchema = """
        CREATE TABLE IF NOT EXISTS automation_sends (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            segment_id INTEGER NOT NULL,
            app_key TEXT NOT NULL,
            content TEXT NOT NULL,
            actor TEXT NOT NULL,
            created_ms INTEGER NOT NULL,
            members INTEGER NOT NULL
        );
        CREATE TABLE IF NOT EXISTS automation_send_members (
            send_id INTEGER NOT NULL,
            euid TEXT NOT NULL,
            state TEXT NOT NULL,
            claimed_ms INTEGER,
            reason TEXT,
            msg_id TEXT,
            PRIMARY KEY (send_id, euid)
        );
        CREATE INDEX IF NOT EXISTS automation_send_members_state ON automation_send_members(state, send_id);
        """

    static let segmentSendReset = "DELETE FROM automation_sends; DELETE FROM automation_send_members;"

    /// The SQL condition and arguments of the segment's non-profile conditions on `ma_users u`
    /// (`oneUser`: correlated counts that use the per-user index).
    static func segmentSQL(_ s: Segment, now: Int64, oneUser: Bool) -> (sql: String, args: [SQLBind]) {
        var sql = "u.app_key = ?"
        var args: [SQLBind] = [.text(s.appKey)]
        for c in s.conditions {
            switch c {
            case .profile: continue
            case .identity(let kind, let has):
                sql +=
                    " AND \(has ? "" : "NOT ")EXISTS (SELECT 1 FROM ma_identities i WHERE i.app_key = u.app_key AND i.euid = u.euid AND i.kind = ?)"
                args.append(.text(kind))
            case .pushBinding(let bound):
                sql += """
                     AND \(bound ? "" : "NOT ")EXISTS (SELECT 1 FROM ma_identities i JOIN push_bindings b ON b.user_id = i.value
                        JOIN push_devices d ON d.token = b.token
                        WHERE i.app_key = u.app_key AND i.euid = u.euid AND i.kind = 'user_id' AND d.active = 1)
                    """
            case .did(let event, let atLeast, let days, let negate):
                let since = now - Int64(days) * 86_400_000
                if oneUser {
                    sql += """
                         AND (SELECT count(*) FROM events e WHERE e.app_key = u.app_key AND e.euid = u.euid AND e.time_ms >= ?
                            AND e.event = ?) \(negate ? "<" : ">=") ?
                        """
                    args += [.int(since), .text(event), .int(Int64(atLeast))]
                } else {
                    sql += """
                         AND u.euid \(negate ? "NOT " : "")IN (SELECT e.euid FROM events e WHERE e.app_key = ? AND e.event = ?
                            AND e.time_ms >= ? GROUP BY e.euid HAVING count(*) >= ?)
                        """
                    args += [.text(s.appKey), .text(event), .int(since), .int(Int64(atLeast))]
                }
            }
        }
        return (sql, args)
    }

    /// One page of the segment's candidates after `after` (euid order): the users the SQL
    /// conditions admit, at most `scan`, and of those the members (profile conditions too).
    func segmentPage(_ s: Segment, after: String, scan: Int, now: Int64) throws(StoreError) -> (
        members: [String], scanned: Int, last: String?
    ) {
        let (cond, args) = Store.segmentSQL(s, now: now, oneUser: false)
        let rows = try db.query(
            "SELECT u.euid, u.properties FROM ma_users u WHERE \(cond) AND u.euid > ? ORDER BY u.euid LIMIT ?",
            args + [.text(after), .int(Int64(scan))])
        var members: [String] = []
        let profile = !s.profileConditions.isEmpty
        for r in rows {
            let euid = r[0].text ?? ""
            if profile {
                guard let p = try? JSON.parse(r[1].text ?? "{}"), s.matchesProfile(p) else { continue }
            }
            members.append(euid)
        }
        return (members, rows.count, rows.last?[0].text)
    }

    /// The segment's size: a SQL count without profile conditions, else a scan of at most
    /// `AutomationLimits.segmentScanUsers` candidates (`complete: false` when cut there).
    func segmentSize(_ s: Segment, now: Int64) throws(StoreError) -> (size: Int64, complete: Bool) {
        if s.profileConditions.isEmpty {
            let (cond, args) = Store.segmentSQL(s, now: now, oneUser: false)
            return (try db.query("SELECT count(*) FROM ma_users u WHERE \(cond)", args).first?.first?.int ?? 0, true)
        }
        var size: Int64 = 0
        var after = ""
        var scanned = 0
        while scanned < AutomationLimits.segmentScanUsers {
            let page = try segmentPage(s, after: after, scan: AutomationLimits.segmentScanPage, now: now)
            size += Int64(page.members.count)
            scanned += page.scanned
            guard let last = page.last, page.scanned == AutomationLimits.segmentScanPage else { return (size, true) }
            after = last
        }
        return (size, false)
    }

    /// Whether `euid` is a member of the segment now.
    func segmentHas(_ s: Segment, euid: String, now: Int64) throws(StoreError) -> Bool {
        let (cond, args) = Store.segmentSQL(s, now: now, oneUser: true)
        guard let row = try db.query("SELECT u.properties FROM ma_users u WHERE \(cond) AND u.euid = ?", args + [.text(euid)]).first
        else { return false }
        return s.profileConditions.isEmpty || ((try? JSON.parse(row[0].text ?? "{}")).map(s.matchesProfile) ?? false)
    }

    // MARK: One-off sends

    /// Stores a send to `members` and answers its id.
    func createSegmentSend(segment: Int64, appKey: String, content: String, members: [String], actor: String, now: Int64)
        throws(StoreError) -> Int64
    {
        try transaction { () throws(StoreError) -> Int64 in
            guard
                let id = try db.query(
                    """
                    INSERT INTO automation_sends (segment_id, app_key, content, actor, created_ms, members)
                    VALUES (?, ?, ?, ?, ?, ?) RETURNING id
                    """, [.int(segment), .text(appKey), .text(content), .text(actor), .int(now), .int(Int64(members.count))]
                ).first?.first?.int
            else { throw .postgres(sqlstate: "XX000", message: "no id for the new send") }
            for m in members {
                try db.run("INSERT INTO automation_send_members (send_id, euid, state) VALUES (?, ?, 'pending')", [.int(id), .text(m)])
            }
            return id
        }
    }

    struct SendRow: Equatable {
        var id: Int64
        var segmentId: Int64
        var appKey: String
        var content: String
        var actor: String
        var createdMs: Int64
        var members: Int64
    }

    func segmentSend(_ id: Int64) throws(StoreError) -> SendRow? {
        try db.query(
            "SELECT id, segment_id, app_key, content, actor, created_ms, members FROM automation_sends WHERE id = ?", [.int(id)]
        ).first.map {
            SendRow(
                id: $0[0].int ?? 0, segmentId: $0[1].int ?? 0, appKey: $0[2].text ?? "", content: $0[3].text ?? "{}",
                actor: $0[4].text ?? "", createdMs: $0[5].int ?? 0, members: $0[6].int ?? 0)
        }
    }

    /// A send's members counted by state and reason.
    func segmentSendCounts(_ id: Int64) throws(StoreError) -> [(state: String, reason: String?, count: Int64)] {
        try db.query(
            "SELECT state, reason, count(*) FROM automation_send_members WHERE send_id = ? GROUP BY state, reason ORDER BY state, reason",
            [.int(id)]
        ).map { ($0[0].text ?? "", $0[1].text, $0[2].int ?? 0) }
    }

    /// Claims up to `limit` members to send to: `pending` ones, and `claimed` ones an instance
    /// took more than `AutomationLimits.reclaimAfterMs` ago (the dedup key keeps that send once).
    func claimSendMembers(now: Int64, limit: Int) throws(StoreError) -> [(send: Int64, euid: String)] {
        let rows = try db.query(
            """
            SELECT send_id, euid, state FROM automation_send_members
            WHERE state = 'pending' OR (state = 'claimed' AND claimed_ms < ?) ORDER BY send_id LIMIT ?
            """, [.int(now - AutomationLimits.reclaimAfterMs), .int(Int64(limit))])
        var out: [(Int64, String)] = []
        for r in rows {
            let (send, euid) = (r[0].int ?? 0, r[1].text ?? "")
            let n = try db.run(
                """
                UPDATE automation_send_members SET state = 'claimed', claimed_ms = ?
                WHERE send_id = ? AND euid = ? AND (state = 'pending' OR (state = 'claimed' AND claimed_ms < ?))
                """, [.int(now), .int(send), .text(euid), .int(now - AutomationLimits.reclaimAfterMs)])
            if n == 1 { out.append((send, euid)) }
        }
        return out
    }

    /// Ends a member's send: `sent` with the message id, `suppressed` with a reason, or back to
    /// `pending` (`state: pending`, the broker was not connected).
    func finishSendMember(send: Int64, euid: String, state: String, reason: String?, msgId: String?) throws(StoreError) {
        try db.run(
            "UPDATE automation_send_members SET state = ?, reason = ?, msg_id = ? WHERE send_id = ? AND euid = ?",
            [.text(state), reason.map { .text($0) } ?? .null, msgId.map { .text($0) } ?? .null, .int(send), .text(euid)])
    }
}

extension Store {
    // MARK: Dry run

    /// The trigger events of `event` in `appKey` since `sinceMs` (by the events' time), oldest
    /// first, at most `limit`: (euid, received, properties).
    func automationWindowEvents(appKey: String, event: String, sinceMs: Int64, limit: Int) throws(StoreError) -> [AutomationDryRun.Event] {
        try db.query(
            """
            SELECT e.euid, e.received_ms, coalesce(e.data, r.data, 'null')
            FROM events e LEFT JOIN records r ON r.stream = e.stream AND r.id = e.record_id
            WHERE e.app_key = ? AND e.event = ? AND e.time_ms >= ? ORDER BY e.time_ms, e.id LIMIT ?
            """, [.text(appKey), .text(event), .int(sinceMs), .int(Int64(limit))]
        ).map {
            let data = (try? JSON.parse($0[2].text ?? "null", maxDepth: Limits.maxJSONDepth + 1)) ?? .null
            return AutomationDryRun.Event(
                euid: $0[0].text ?? "", receivedMs: $0[1].int ?? 0, properties: data["properties"] ?? .object([:]))
        }
    }

    /// The rule's last entry for the user before `beforeMs`, and the non-transactional
    /// automation pushes the user got since `sinceMs`.
    func automationDryRunHistory(rule: Int64?, appKey: String, euid: String, beforeMs: Int64, sinceMs: Int64) throws(StoreError) -> (
        lastEntryMs: Int64?, sentMs: [Int64]
    ) {
        let last = try rule.flatMap { id throws(StoreError) in
            try db.query(
                "SELECT max(entered_ms) FROM automation_journeys WHERE rule_id = ? AND app_key = ? AND euid = ? AND entered_ms < ?",
                [.int(id), .text(appKey), .text(euid), .int(beforeMs)]
            ).first?.first?.int
        }
        let sent = try db.query(
            """
            SELECT sent_ms FROM automation_journeys WHERE app_key = ? AND euid = ? AND sent_ms >= ?
                AND state IN ('sending', 'sent') AND transactional = 0
            """, [.text(appKey), .text(euid), .int(sinceMs)]
        ).compactMap { $0[0].int }
        return (last, sent)
    }
}
