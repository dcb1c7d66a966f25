import PylonCore
import PylonStore

/// The automation tables (docs/AUTOMATION.md).
///
/// - `automation_rules`: one row per rule: its current `version` and `status` (`active`,
///   `paused`, `archived`); `automation_rule_versions` keeps every version's definition.
/// - `automation_cursor`: how far the evaluator has read the event index (`events.id`); moved
///   in the same transaction as the journeys it starts, under a row lock, so of several
///   instances one evaluates a batch, and a restart continues where the last commit stopped.
/// - `automation_journeys`: one row per (rule, user, entry): `UNIQUE (rule_id, app_key, euid,
///   entry_key)` where `entry_key` is the trigger's stream and record id (or `once` for a
///   once-ever rule), so a trigger starts at most one journey whatever reads it. A journey is
///   `pending` until `due_ms` (the wait is this row, not a timer in memory), `claimed` by one
///   instance, `sending` once its guards passed (`sent_ms` set: it counts against caps), then
///   `sent` with the push's message id, or `suppressed` with the reason. The push's dedup key
///   is `automation:<journey id>`.
/// - `automation_decisions`: every decision, for the decisions view and the per-rule funnel.
extension Store {
    static let automationSchema = """
        CREATE TABLE IF NOT EXISTS automation_rules (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            name TEXT NOT NULL,
            app_key TEXT NOT NULL,
            status TEXT NOT NULL,
            version INTEGER NOT NULL,
            created_ms INTEGER NOT NULL,
            updated_ms INTEGER NOT NULL
        );
        CREATE TABLE IF NOT EXISTS automation_rule_versions (
            rule_id INTEGER NOT NULL,
            version INTEGER NOT NULL,
            definition TEXT NOT NULL,
            actor TEXT NOT NULL,
            created_ms INTEGER NOT NULL,
            PRIMARY KEY (rule_id, version)
        );
        CREATE TABLE IF NOT EXISTS automation_cursor (
            name TEXT PRIMARY KEY,
            pos INTEGER NOT NULL
        );
        CREATE TABLE IF NOT EXISTS automation_journeys (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            rule_id INTEGER NOT NULL,
            version INTEGER NOT NULL,
            app_key TEXT NOT NULL,
            euid TEXT NOT NULL,
            entry_key TEXT NOT NULL,
            event_id INTEGER NOT NULL,
            install_id TEXT NOT NULL,
            properties TEXT NOT NULL,
            state TEXT NOT NULL,
            due_ms INTEGER NOT NULL,
            entered_ms INTEGER NOT NULL,
            claimed_ms INTEGER,
            sent_ms INTEGER,
            transactional INTEGER NOT NULL,
            msg_id TEXT,
            reason TEXT,
            step INTEGER NOT NULL DEFAULT 0,
            UNIQUE (rule_id, app_key, euid, entry_key)
        );
        CREATE INDEX IF NOT EXISTS automation_journeys_due ON automation_journeys(state, due_ms);
        CREATE INDEX IF NOT EXISTS automation_journeys_user ON automation_journeys(app_key, euid, sent_ms);
        CREATE INDEX IF NOT EXISTS automation_journeys_rule ON automation_journeys(rule_id, sent_ms);
        CREATE INDEX IF NOT EXISTS automation_journeys_msg ON automation_journeys(msg_id);
        CREATE TABLE IF NOT EXISTS automation_decisions (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            time_ms INTEGER NOT NULL,
            rule_id INTEGER NOT NULL,
            version INTEGER NOT NULL,
            app_key TEXT NOT NULL,
            euid TEXT NOT NULL,
            journey_id INTEGER,
            event_id INTEGER NOT NULL,
            kind TEXT NOT NULL,
            reason TEXT,
            msg_id TEXT
        );
        CREATE INDEX IF NOT EXISTS automation_decisions_rule ON automation_decisions(rule_id, id);
        CREATE INDEX IF NOT EXISTS automation_decisions_user ON automation_decisions(euid, id);
        """ + automationObjectsSchema

    static let automationReset = """
        DELETE FROM automation_rules; DELETE FROM automation_rule_versions; DELETE FROM automation_cursor;
        DELETE FROM automation_journeys; DELETE FROM automation_decisions;
        """ + automationObjectsReset

    // MARK: Rules

    struct RuleRow: Equatable {
        var id: Int64
        var name: String
        var appKey: String
        var status: String
        var version: Int64
        var createdMs: Int64
        var updatedMs: Int64
        var definition: String
    }

    static let ruleColumns = """
        r.id, r.name, r.app_key, r.status, r.version, r.created_ms, r.updated_ms, v.definition
        FROM automation_rules r JOIN automation_rule_versions v ON v.rule_id = r.id AND v.version = r.version
        """

    static func ruleRow(_ r: [SQLValue]) -> RuleRow {
        RuleRow(
            id: r[0].int ?? 0, name: r[1].text ?? "", appKey: r[2].text ?? "", status: r[3].text ?? "", version: r[4].int ?? 0,
            createdMs: r[5].int ?? 0, updatedMs: r[6].int ?? 0, definition: r[7].text ?? "{}")
    }

    func automationRuleCount() throws(StoreError) -> Int64 {
        try db.query("SELECT count(*) FROM automation_rules WHERE status <> 'archived'").first?.first?.int ?? 0
    }

    func createAutomationRule(_ rule: AutomationRule, status: String, actor: String, now: Int64) throws(StoreError) -> Int64 {
        try transaction { () throws(StoreError) -> Int64 in
            guard
                let id = try db.query(
                    """
                    INSERT INTO automation_rules (name, app_key, status, version, created_ms, updated_ms)
                    VALUES (?, ?, ?, 1, ?, ?) RETURNING id
                    """, [.text(rule.name), .text(rule.appKey), .text(status), .int(now), .int(now)]
                ).first?.first?.int
            else { throw .postgres(sqlstate: "XX000", message: "no id for the new rule") }
            try db.run(
                "INSERT INTO automation_rule_versions (rule_id, version, definition, actor, created_ms) VALUES (?, 1, ?, ?, ?)",
                [.int(id), .text(rule.json.serialized), .text(actor), .int(now)])
            // The evaluator starts after the events stored before the first rule (a rule acts on
            // events received after its creation only).
            try db.run(
                "INSERT INTO automation_cursor (name, pos) SELECT 'events', coalesce(max(id), 0) FROM events WHERE true ON CONFLICT (name) DO NOTHING",
                [])
            return id
        }
    }

    /// Stores `rule` as the rule's next version; nil when the rule does not exist or is archived.
    func updateAutomationRule(_ id: Int64, _ rule: AutomationRule, actor: String, now: Int64) throws(StoreError) -> Int64? {
        try transaction { () throws(StoreError) -> Int64? in
            guard
                let v = try db.query(
                    """
                    UPDATE automation_rules SET version = version + 1, name = ?, app_key = ?, updated_ms = ?
                    WHERE id = ? AND status <> 'archived' RETURNING version
                    """, [.text(rule.name), .text(rule.appKey), .int(now), .int(id)]
                ).first?.first?.int
            else { return nil }
            try db.run(
                "INSERT INTO automation_rule_versions (rule_id, version, definition, actor, created_ms) VALUES (?, ?, ?, ?, ?)",
                [.int(id), .int(v), .text(rule.json.serialized), .text(actor), .int(now)])
            return v
        }
    }

    /// Sets the rule's status; false when it does not exist or is archived (archiving is final).
    func setAutomationRuleStatus(_ id: Int64, _ status: String, now: Int64) throws(StoreError) -> Bool {
        try db.run(
            "UPDATE automation_rules SET status = ?, updated_ms = ? WHERE id = ? AND status <> 'archived'",
            [.text(status), .int(now), .int(id)]) == 1
    }

    func automationRule(_ id: Int64) throws(StoreError) -> RuleRow? {
        try db.query("SELECT " + Store.ruleColumns + " WHERE r.id = ?", [.int(id)]).first.map(Store.ruleRow)
    }

    /// Rules by id, `status` filtering, after the cursor `after`.
    func automationRules(status: String?, after: Int64, limit: Int) throws(StoreError) -> [RuleRow] {
        var sql = "SELECT " + Store.ruleColumns + " WHERE r.id > ?"
        var args: [SQLBind] = [.int(after)]
        if let status {
            sql += " AND r.status = ?"
            args.append(.text(status))
        }
        sql += " ORDER BY r.id LIMIT ?"
        args.append(.int(Int64(limit)))
        return try db.query(sql, args).map(Store.ruleRow)
    }

    /// Every version of a rule: (version, created, actor).
    func automationRuleVersions(_ id: Int64) throws(StoreError) -> [(version: Int64, createdMs: Int64, actor: String)] {
        try db.query(
            "SELECT version, created_ms, actor FROM automation_rule_versions WHERE rule_id = ? ORDER BY version DESC LIMIT 100",
            [.int(id)]
        ).map { ($0[0].int ?? 0, $0[1].int ?? 0, $0[2].text ?? "") }
    }

    func automationRuleDefinition(_ id: Int64, version: Int64) throws(StoreError) -> String? {
        try db.query("SELECT definition FROM automation_rule_versions WHERE rule_id = ? AND version = ?", [.int(id), .int(version)])
            .first?.first?.text
    }

    /// The status of each rule in `ids`.
    func automationRuleStatus(_ id: Int64) throws(StoreError) -> String {
        try db.query("SELECT status FROM automation_rules WHERE id = ?", [.int(id)]).first?.first?.text ?? "archived"
    }

    // MARK: Evaluation

    /// One event index row the evaluator reads.
    struct TriggerRow {
        var id: Int64
        var streamId: Int64
        var recordId: String
        var appKey: String
        var event: String
        var euid: String
        var installId: String
        var receivedMs: Int64
        var data: String
    }

    /// A journey the evaluator starts.
    struct NewJourney {
        var ruleId: Int64
        var version: Int64
        var appKey: String
        var euid: String
        var entryKey: String
        var eventId: Int64
        var installId: String
        var properties: String
        var dueMs: Int64
        var transactional: Bool
        var waits: Bool
        /// The step the journey goes on with when due (after a leading wait: 1).
        var step: Int
    }

    /// What the evaluator decided for the rows of one turn.
    struct AutomationTurn {
        var journeys: [NewJourney] = []
        var refusals: [(rule: Int64, version: Int64, row: TriggerRow, reason: String)] = []
        /// The id of the last row decided when the turn stopped before the end of the rows
        /// (`AutomationLimits.journeysPerTurn`); the next turn starts after it.
        var stoppedAfter: Int64?
    }

    /// One evaluation step in one transaction: takes the cursor row (skipping the turn when
    /// another instance holds it, PostgreSQL), reads the index rows after it up to `upTo` of
    /// `apps` (at most `AutomationLimits.eventsPerTurn`), lets `decide` turn them into journeys
    /// and refusals, stores those and moves the cursor past what was read. Answers the rows
    /// read, or nil when the turn was skipped.
    func evaluateAutomation(
        apps: [String], upTo: Int64, now: Int64,
        decide: ([TriggerRow], _ lastEntry: (Int64, String, String) throws(StoreError) -> Int64?) throws(StoreError) -> AutomationTurn
    ) throws(StoreError) -> Int? {
        try transaction(.readCommitted) { () throws(StoreError) -> Int? in
            let lockSQL =
                db.dialect == .postgres
                ? "SELECT pos FROM automation_cursor WHERE name = 'events' FOR UPDATE SKIP LOCKED"
                : "SELECT pos FROM automation_cursor WHERE name = 'events'"
            // No row: no rule was ever created (the first creates it); or another instance holds it.
            guard let pos = try db.query(lockSQL).first?.first?.int else { return nil }
            let hi = min(upTo, pos + AutomationLimits.scanIdsPerTurn)
            guard hi > pos else { return 0 }
            var rows: [TriggerRow] = []
            if !apps.isEmpty {
                let marks = Array(repeating: "?", count: apps.count).joined(separator: ", ")
                let sql = """
                    SELECT e.id, e.stream, e.record_id, e.app_key, e.event, e.euid, e.install_id, e.received_ms,
                        coalesce(e.data, r.data, 'null')
                    FROM events e LEFT JOIN records r ON r.stream = e.stream AND r.id = e.record_id
                    WHERE e.id > ? AND e.id <= ? AND e.app_key IN (\(marks)) ORDER BY e.id LIMIT ?
                    """
                var args: [SQLBind] = [.int(pos), .int(hi)]
                args.append(contentsOf: apps.map { .text($0) })
                args.append(.int(Int64(AutomationLimits.eventsPerTurn)))
                rows = try db.query(sql, args).map {
                    TriggerRow(
                        id: $0[0].int ?? 0, streamId: $0[1].int ?? 0, recordId: $0[2].text ?? "", appKey: $0[3].text ?? "",
                        event: $0[4].text ?? "", euid: $0[5].text ?? "", installId: $0[6].text ?? "", receivedMs: $0[7].int ?? 0,
                        data: $0[8].text ?? "null")
                }
            }
            let turn = try decide(rows) { (rule: Int64, appKey: String, euid: String) throws(StoreError) -> Int64? in
                try db.query(
                    "SELECT max(entered_ms) FROM automation_journeys WHERE rule_id = ? AND app_key = ? AND euid = ?",
                    [.int(rule), .text(appKey), .text(euid)]
                ).first?.first?.int
            }
            let journeys = turn.journeys
            let refusals = turn.refusals
            // Past the last row decided (the turn stopped early), else past every row read, else
            // past the ids scanned.
            let next = turn.stoppedAfter ?? (rows.count == AutomationLimits.eventsPerTurn ? rows.last!.id : hi)
            for j in journeys {
                let id = try db.query(
                    """
                    INSERT INTO automation_journeys (rule_id, version, app_key, euid, entry_key, event_id, install_id, properties,
                        state, due_ms, entered_ms, transactional, step)
                    VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'pending', ?, ?, ?, ?)
                    ON CONFLICT (rule_id, app_key, euid, entry_key) DO NOTHING RETURNING id
                    """,
                    [
                        .int(j.ruleId), .int(j.version), .text(j.appKey), .text(j.euid), .text(j.entryKey), .int(j.eventId),
                        .text(j.installId), .text(j.properties), .int(j.dueMs), .int(now), .int(j.transactional ? 1 : 0),
                        .int(Int64(j.step)),
                    ]
                ).first?.first?.int
                guard let id else {
                    // Entered before (a once-ever rule, or this very trigger on another turn).
                    if j.entryKey == "once" {
                        try recordDecision(
                            rule: j.ruleId, version: j.version, appKey: j.appKey, euid: j.euid, journey: nil, event: j.eventId,
                            kind: "suppressed", reason: "reentry", msgId: nil, now: now)
                    }
                    continue
                }
                try recordDecision(
                    rule: j.ruleId, version: j.version, appKey: j.appKey, euid: j.euid, journey: id, event: j.eventId, kind: "triggered",
                    reason: nil, msgId: nil, now: now)
                if j.waits {
                    try recordDecision(
                        rule: j.ruleId, version: j.version, appKey: j.appKey, euid: j.euid, journey: id, event: j.eventId,
                        kind: "waiting", reason: "wait", msgId: nil, now: now)
                }
            }
            for r in refusals {
                try recordDecision(
                    rule: r.rule, version: r.version, appKey: r.row.appKey, euid: r.row.euid, journey: nil, event: r.row.id,
                    kind: "suppressed", reason: r.reason, msgId: nil, now: now)
            }
            try db.run("UPDATE automation_cursor SET pos = ? WHERE name = 'events' AND pos = ?", [.int(next), .int(pos)])
            return rows.count
        }
    }

    func automationCursor() throws(StoreError) -> Int64? {
        try db.query("SELECT pos FROM automation_cursor WHERE name = 'events'").first?.first?.int
    }

    func recordDecision(
        rule: Int64, version: Int64, appKey: String, euid: String, journey: Int64?, event: Int64, kind: String, reason: String?,
        msgId: String?, now: Int64
    ) throws(StoreError) {
        try db.run(
            """
            INSERT INTO automation_decisions (time_ms, rule_id, version, app_key, euid, journey_id, event_id, kind, reason, msg_id)
            VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
            """,
            [
                .int(now), .int(rule), .int(version), .text(appKey), .text(euid), journey.map { .int($0) } ?? .null, .int(event),
                .text(kind), reason.map { .text($0) } ?? .null, msgId.map { .text($0) } ?? .null,
            ])
    }

    // MARK: Journeys

    struct JourneyRow: Equatable {
        var id: Int64
        var ruleId: Int64
        var version: Int64
        var appKey: String
        var euid: String
        var eventId: Int64
        var installId: String
        var properties: String
        var state: String
        var dueMs: Int64
        /// The step the journey goes on with (a `sending` journey: its send step).
        var step: Int = 0
    }

    static let journeyColumns =
        "id, rule_id, version, app_key, euid, event_id, install_id, properties, state, due_ms, step FROM automation_journeys"

    static func journeyRow(_ r: [SQLValue]) -> JourneyRow {
        JourneyRow(
            id: r[0].int ?? 0, ruleId: r[1].int ?? 0, version: r[2].int ?? 0, appKey: r[3].text ?? "", euid: r[4].text ?? "",
            eventId: r[5].int ?? 0, installId: r[6].text ?? "", properties: r[7].text ?? "{}", state: r[8].text ?? "",
            dueMs: r[9].int ?? 0, step: Int(r[10].int ?? 0))
    }

    /// Claims due journeys (at most `limit`): `pending` ones whose time has come, and `claimed`
    /// or `sending` ones an instance took more than `AutomationLimits.reclaimAfterMs` ago and
    /// did not finish. Each is taken by one caller only (a conditional update). A reclaimed
    /// `sending` journey keeps its state: its guards passed already.
    func claimDueJourneys(now: Int64, limit: Int) throws(StoreError) -> [JourneyRow] {
        let due = try db.query(
            """
            SELECT \(Store.journeyColumns) WHERE state = 'pending' AND due_ms <= ? ORDER BY due_ms LIMIT ?
            """, [.int(now), .int(Int64(limit))]
        ).map(Store.journeyRow)
        let stale = try db.query(
            """
            SELECT \(Store.journeyColumns) WHERE state IN ('claimed', 'sending') AND claimed_ms < ? ORDER BY claimed_ms LIMIT ?
            """, [.int(now - AutomationLimits.reclaimAfterMs), .int(Int64(limit))]
        ).map(Store.journeyRow)
        var out: [JourneyRow] = []
        for var j in due + stale where out.count < limit {
            let claimed = try db.run(
                """
                UPDATE automation_journeys SET state = ?, claimed_ms = ? WHERE id = ? AND state = ?
                    AND (state = 'pending' OR claimed_ms < ?)
                """,
                [
                    .text(j.state == "pending" ? "claimed" : j.state), .int(now), .int(j.id), .text(j.state),
                    .int(now - AutomationLimits.reclaimAfterMs),
                ])
            guard claimed == 1 else { continue }
            if j.state == "pending" { j.state = "claimed" }
            out.append(j)
        }
        return out
    }

    /// The facts the guards decide on (`AutomationGuard.Facts`) for a journey's user.
    /// `offsetMinutes`: the user's UTC offset now (the calendar day of `capPerDay`, quiet hours).
    func journeyFacts(_ j: JourneyRow, rule: AutomationRule, offsetMinutes: Int, now: Int64) throws(StoreError)
        -> AutomationGuard.Facts
    {
        let status = try automationRuleStatus(j.ruleId)
        let userId = try automationUserId(appKey: j.appKey, euid: j.euid)
        let denied = try userConsentDenied(appKey: j.appKey, euid: j.euid, installId: j.installId, userId: userId)
        let devices = try userId.map { u throws(StoreError) in try pushResolve(targetType: "user", target: u).devices.count } ?? 0
        func count(_ sql: String, _ args: [SQLBind]) throws(StoreError) -> Int {
            Int(try db.query(sql, args).first?.first?.int ?? 0)
        }
        let sentSince = """
            SELECT count(*) FROM automation_journeys WHERE app_key = ? AND euid = ? AND sent_ms >= ?
                AND state IN ('sending', 'sent') AND transactional = 0
            """
        let today = try count(
            sentSince, [.text(j.appKey), .text(j.euid), .int(AutomationGuard.dayStart(now, offsetMinutes: offsetMinutes))])
        let week = try count(sentSince, [.text(j.appKey), .text(j.euid), .int(now - 7 * 86_400_000)])
        let minute = try count(
            "SELECT count(*) FROM automation_journeys WHERE rule_id = ? AND sent_ms >= ? AND state IN ('sending', 'sent')",
            [.int(j.ruleId), .int(now - 60_000)])
        return AutomationGuard.Facts(
            now: now, ruleStatus: status, consentDenied: denied, userId: userId, devices: devices, sentToday: today, sent7Days: week,
            ruleSentLastMinute: minute, offsetMinutes: offsetMinutes)
    }

    /// Whether the user may not be sent to: an opt-out naming the user (any switch of the
    /// AppKey or of the device); an opt-out of the device's master switch, push switch or the
    /// AppKey's MA switch on the install that triggered the journey or on any install whose push
    /// token is bound to the user; or an erasure of the user (requested or done).
    func userConsentDenied(appKey: String, euid: String, installId: String, userId: String?) throws(StoreError) -> Bool {
        if !(try db.query("SELECT 1 FROM optouts WHERE app_key = ? AND euid = ? LIMIT 1", [.text(appKey), .text(euid)]).isEmpty) {
            return true
        }
        if !installId.isEmpty,
            !(try db.query(
                """
                SELECT 1 FROM optouts WHERE install_id = ? AND app_key IN ('*', ?)
                    AND (switch = 'device' OR switch = 'push' OR switch = ?) LIMIT 1
                """, [.text(installId), .text(appKey), .text("ma:" + appKey)]
            ).isEmpty)
        {
            return true
        }
        if let userId,
            !(try db.query(
                """
                SELECT 1 FROM optouts WHERE app_key IN ('*', ?) AND (switch = 'device' OR switch = 'push' OR switch = ?)
                    AND install_id <> '' AND install_id IN
                        (SELECT p.install_id FROM push_devices p JOIN push_bindings b ON b.token = p.token WHERE b.user_id = ?)
                LIMIT 1
                """, [.text(appKey), .text("ma:" + appKey), .text(userId)]
            ).isEmpty)
        {
            return true
        }
        return
            !(try db.query(
                "SELECT 1 FROM erasures WHERE app_key = ? AND subject = ? LIMIT 1",
                [.text(appKey), .text(Store.erasureSubject(appKey, euid))]
            ).isEmpty)
    }

    /// Ends a journey without a send (its trigger properties are dropped): `suppressed` by a
    /// guard, or `exited` (an exit event or step; `kind`).
    func suppressJourney(_ j: JourneyRow, reason: String, kind: String = "suppressed", now: Int64) throws(StoreError) {
        try db.run(
            "UPDATE automation_journeys SET state = ?, reason = ?, properties = '{}', sent_ms = NULL WHERE id = ?",
            [.text(kind), .text(reason), .int(j.id)])
        try recordDecision(
            rule: j.ruleId, version: j.version, appKey: j.appKey, euid: j.euid, journey: j.id, event: j.eventId, kind: kind,
            reason: reason, msgId: nil, now: now)
    }

    /// Moves a journey back to `pending` until `untilMs` (a wait step, quiet hours deferred, rate
    /// limit, or a send the broker could not take), to go on at `step` (nil: the same);
    /// `log`: a `waiting` decision with `reason`.
    func postponeJourney(_ j: JourneyRow, untilMs: Int64, step: Int? = nil, reason: String, log: Bool, now: Int64) throws(StoreError) {
        try db.run(
            "UPDATE automation_journeys SET state = 'pending', due_ms = ?, step = ?, sent_ms = NULL, claimed_ms = NULL WHERE id = ?",
            [.int(untilMs), .int(Int64(step ?? j.step)), .int(j.id)])
        if log {
            try recordDecision(
                rule: j.ruleId, version: j.version, appKey: j.appKey, euid: j.euid, journey: j.id, event: j.eventId, kind: "waiting",
                reason: reason, msgId: nil, now: now)
        }
    }

    /// Marks the journey as passing its guards at send step `step` (`sending`, counted against
    /// caps from now).
    func reserveJourney(_ j: JourneyRow, step: Int, now: Int64) throws(StoreError) {
        try db.run(
            "UPDATE automation_journeys SET state = 'sending', sent_ms = ?, claimed_ms = ?, step = ? WHERE id = ?",
            [.int(now), .int(now), .int(Int64(step)), .int(j.id)])
    }

    func finishJourney(_ j: JourneyRow, msgId: String, now: Int64) throws(StoreError) {
        try transaction { () throws(StoreError) in
            try db.run(
                "UPDATE automation_journeys SET state = 'sent', msg_id = ?, properties = '{}' WHERE id = ?", [.text(msgId), .int(j.id)])
            try recordDecision(
                rule: j.ruleId, version: j.version, appKey: j.appKey, euid: j.euid, journey: j.id, event: j.eventId, kind: "sent",
                reason: nil, msgId: msgId, now: now)
        }
    }

    /// The user's profile properties (`{}` when none).
    func automationProfile(appKey: String, euid: String) throws(StoreError) -> String {
        try db.query("SELECT properties FROM ma_users WHERE app_key = ? AND euid = ?", [.text(appKey), .text(euid)]).first?.first?.text
            ?? "{}"
    }

    func automationUserId(appKey: String, euid: String) throws(StoreError) -> String? {
        try db.query(
            "SELECT value FROM ma_identities WHERE app_key = ? AND euid = ? AND kind = 'user_id' ORDER BY seq DESC LIMIT 1",
            [.text(appKey), .text(euid)]
        ).first?.first?.text
    }

    func pendingJourneys() throws(StoreError) -> Int64 {
        try db.query("SELECT count(*) FROM automation_journeys WHERE state IN ('pending', 'claimed', 'sending')").first?.first?.int ?? 0
    }

    /// Deletes the user's journeys, decisions and one-off send rows (an erasure's last step);
    /// answers how many.
    /// The erasure itself keeps the user from any later send (`userConsentDenied`).
    func eraseAutomation(appKey: String, euid: String) throws(StoreError) -> Int {
        let key: [SQLBind] = [.text(appKey), .text(euid)]
        return try db.run("DELETE FROM automation_journeys WHERE app_key = ? AND euid = ?", key)
            + db.run("DELETE FROM automation_decisions WHERE euid = ? AND app_key = ?", [.text(euid), .text(appKey)])
            + db.run(
                "DELETE FROM automation_send_members WHERE euid = ? AND send_id IN (SELECT id FROM automation_sends WHERE app_key = ?)",
                [.text(euid), .text(appKey)])
    }

    // MARK: Decisions and funnel

    struct DecisionRow: Equatable {
        var id: Int64
        var timeMs: Int64
        var ruleId: Int64
        var version: Int64
        var appKey: String
        var euid: String
        var journeyId: Int64?
        var eventId: Int64
        var kind: String
        var reason: String?
        var msgId: String?
    }

    /// Decisions newest first, before the cursor `before`, filtered by rule, user and AppKey.
    func automationDecisions(rule: Int64?, euid: String?, appKey: String?, before: Int64, limit: Int) throws(StoreError) -> [DecisionRow] {
        var sql = """
            SELECT id, time_ms, rule_id, version, app_key, euid, journey_id, event_id, kind, reason, msg_id
            FROM automation_decisions WHERE id < ?
            """
        var args: [SQLBind] = [.int(before)]
        if let rule {
            sql += " AND rule_id = ?"
            args.append(.int(rule))
        }
        if let euid {
            sql += " AND euid = ?"
            args.append(.text(euid))
        }
        if let appKey {
            sql += " AND app_key = ?"
            args.append(.text(appKey))
        }
        sql += " ORDER BY id DESC LIMIT ?"
        args.append(.int(Int64(limit)))
        return try db.query(sql, args).map {
            DecisionRow(
                id: $0[0].int ?? 0, timeMs: $0[1].int ?? 0, ruleId: $0[2].int ?? 0, version: $0[3].int ?? 0, appKey: $0[4].text ?? "",
                euid: $0[5].text ?? "", journeyId: $0[6].int, eventId: $0[7].int ?? 0, kind: $0[8].text ?? "", reason: $0[9].text,
                msgId: $0[10].text)
        }
    }

    /// A rule's decisions counted by kind and reason, and the funnel of its pushes: devices sent
    /// to, delivered (acknowledged by the device), opened.
    func automationFunnel(_ rule: Int64) throws(StoreError) -> (
        decisions: [(kind: String, reason: String?, count: Int64)], sent: Int64, delivered: Int64, opened: Int64
    ) {
        let decisions = try db.query(
            "SELECT kind, reason, count(*) FROM automation_decisions WHERE rule_id = ? GROUP BY kind, reason ORDER BY kind, reason",
            [.int(rule)]
        ).map { (kind: $0[0].text ?? "", reason: $0[1].text, count: $0[2].int ?? 0) }
        let d = try db.query(
            """
            SELECT count(*), count(d.acked_at) FROM automation_journeys j JOIN push_deliveries d ON d.msg_id = j.msg_id
            WHERE j.rule_id = ? AND j.state = 'sent'
            """, [.int(rule)]
        ).first
        let opened =
            try db.query(
                """
                SELECT count(*) FROM automation_journeys j JOIN push_opens o ON o.msg_id = j.msg_id
                WHERE j.rule_id = ? AND j.state = 'sent'
                """, [.int(rule)]
            ).first?.first?.int ?? 0
        return (decisions, d?[0].int ?? 0, d?[1].int ?? 0, opened)
    }
}
