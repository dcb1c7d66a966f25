import PylonCore

/// Automation's objects under `/v1/admin/automation` (docs/AUTOMATION.md): push templates a
/// rule's send step names, segments, and the dry run of a rule.
extension Backend {
    func automationObjectRoute(_ request: HTTPRequest, _ r: AutomationRoute, _ principal: Principal, now: Int64) throws(APIError)
        -> HTTPResponse
    {
        switch r {
        case .templates:
            return try objectList(request, .template)
        case .createTemplate:
            let body = try jsonBody(request)
            let t = try refusing { () throws(AutomationError) in try PushTemplate.parse(body) }
            let id = try storage { () throws(StoreError) -> Int64 in
                guard try store.automationObjectCount(.template) < AutomationLimits.maxTemplates else { return 0 }
                return try store.createAutomationObject(
                    .template, name: t.name, appKey: nil, definition: t.json.serialized, actor: principal.actor, now: now)
            }
            guard id > 0 else {
                throw APIError(status: 409, code: .invalidRequest, message: "at most \(AutomationLimits.maxTemplates) templates")
            }
            audit(principal, "automation.template.create", target: "template " + String(id), detail: ["name": .string(t.name)])
            return HTTPResponse(status: 201, try objectJSON(.template, id))
        case .template(let id):
            return HTTPResponse(try objectJSON(.template, id))
        case .updateTemplate(let id):
            let body = try jsonBody(request)
            let t = try refusing { () throws(AutomationError) in try PushTemplate.parse(body) }
            guard
                try storage({ () throws(StoreError) in
                    try store.updateAutomationObject(
                        .template, id, name: t.name, appKey: nil, definition: t.json.serialized, actor: principal.actor, now: now)
                })
            else { throw APIError(status: 404, code: .notFound, message: "no template \(id)") }
            audit(principal, "automation.template.update", target: "template " + String(id))
            return HTTPResponse(try objectJSON(.template, id))
        case .segments:
            return try objectList(request, .segment)
        case .createSegment:
            let body = try jsonBody(request)
            let seg = try refusing { () throws(AutomationError) in try Segment.parse(body) }
            let id = try storage { () throws(StoreError) -> Int64 in
                guard try store.automationObjectCount(.segment) < AutomationLimits.maxSegments else { return 0 }
                return try store.createAutomationObject(
                    .segment, name: seg.name, appKey: seg.appKey, definition: seg.json.serialized, actor: principal.actor, now: now)
            }
            guard id > 0 else {
                throw APIError(status: 409, code: .invalidRequest, message: "at most \(AutomationLimits.maxSegments) segments")
            }
            audit(principal, "automation.segment.create", target: "segment " + String(id), detail: ["name": .string(seg.name)])
            return HTTPResponse(status: 201, try objectJSON(.segment, id))
        case .segment(let id):
            return HTTPResponse(try objectJSON(.segment, id))
        case .updateSegment(let id):
            let body = try jsonBody(request)
            let seg = try refusing { () throws(AutomationError) in try Segment.parse(body) }
            guard
                try storage({ () throws(StoreError) in
                    try store.updateAutomationObject(
                        .segment, id, name: seg.name, appKey: seg.appKey, definition: seg.json.serialized, actor: principal.actor, now: now)
                })
            else { throw APIError(status: 404, code: .notFound, message: "no segment \(id)") }
            audit(principal, "automation.segment.update", target: "segment " + String(id))
            return HTTPResponse(try objectJSON(.segment, id))
        case .segmentSize(let id):
            let seg = try segment(id)
            let (size, complete) = try storage { () throws(StoreError) in try store.segmentSize(seg, now: now) }
            return HTTPResponse(["segmentId": .int(id), "size": .int(size), "complete": .bool(complete)])
        case .segmentMembers(let id):
            let seg = try segment(id)
            let limit = try pageLimit(request.query, max: AutomationLimits.maxPage, default: 50)
            let after = request.query["cursor"] ?? ""
            guard after.utf8.count <= EventIndex.maxFieldBytes else { throw .badRequest(.invalidRequest, "cursor is not a cursor") }
            // One page of `limit` candidates; with profile conditions it may hold fewer members
            // and still have a next page (the cursor is the last user read).
            let page = try storage { () throws(StoreError) in try store.segmentPage(seg, after: after, scan: limit, now: now) }
            let members = page.members
            let cursor = page.scanned == limit ? page.last : nil
            let items = try members.map { euid throws(APIError) -> JSON in
                let userId = try storage { () throws(StoreError) in try store.automationUserId(appKey: seg.appKey, euid: euid) }
                return ["user": .string(euid), "userId": userId.map(JSON.string) ?? .null]
            }
            return list(items, next: cursor)
        case .segmentSend(let id):
            return try segmentSend(request, id, principal, now: now)
        case .dryRun:
            return try automationDryRun(request, now: now)
        case .send(let id):
            guard let row = try storage({ () throws(StoreError) in try store.segmentSend(id) }) else {
                throw APIError(status: 404, code: .notFound, message: "no send \(id)")
            }
            let counts = try storage { () throws(StoreError) in try store.segmentSendCounts(id) }
            var o: JSONObject = ["pending": 0, "sent": 0, "suppressed": 0]
            var reasons: JSONObject = [:]
            for c in counts {
                let state = c.state == "claimed" ? "pending" : c.state
                o[state] = .int((o[state]?.intValue ?? 0) + c.count)
                if let r = c.reason { reasons[r] = .int((reasons[r]?.intValue ?? 0) + c.count) }
            }
            o["reasons"] = .object(reasons)
            o["id"] = .int(row.id)
            o["segmentId"] = .int(row.segmentId)
            o["appKey"] = .string(row.appKey)
            o["members"] = .int(row.members)
            o["actor"] = .string(row.actor)
            o["createdMs"] = .int(row.createdMs)
            o["content"] = (try? JSON.parse(row.content)) ?? .null
            return HTTPResponse(.object(o))
        default:
            throw APIError(status: 404, code: .notFound, message: "no such automation route")
        }
    }

    /// A stored segment's definition.
    func segment(_ id: Int64) throws(APIError) -> Segment {
        guard let row = try storage({ () throws(StoreError) in try store.automationObject(.segment, id) }),
            let j = try? JSON.parse(row.definition), let s = try? Segment.parse(j)
        else { throw APIError(status: 404, code: .notFound, message: "no segment \(id)") }
        return s
    }

    /// `POST .../segments/{id}/send` `{"push": {...}}` or `{"template": ID}`: snapshots the
    /// members (at most `AutomationLimits.maxSendMembers`) and answers 202 with the send's id;
    /// the evaluator's turns send to them (`runSegmentSends`).
    private func segmentSend(_ request: HTTPRequest, _ id: Int64, _ principal: Principal, now: Int64) throws(APIError) -> HTTPResponse {
        let seg = try segment(id)
        let body = try jsonBody(request)
        let content = try refusing { () throws(AutomationError) -> AutomationRule.Send in
            guard let o = body.objectValue else { throw AutomationError("", "must be {\"push\": {...}} or {\"template\": ID}") }
            try AutomationRule.only(o, ["push", "template"], at: "")
            switch (o["push"], o["template"]) {
            case (let p?, nil): return .push(try AutomationRule.push(p, at: "push"))
            case (nil, let t?):
                guard let n = t.intValue, n > 0 else { throw AutomationError("template", "must be a template id") }
                return .template(n)
            default: throw AutomationError("", "takes push or template (one of them)")
            }
        }
        if case .template(let t) = content, try storage({ () throws(StoreError) in try store.automationObject(.template, t) }) == nil {
            throw automationRefusal(AutomationError("template", "no template \(t)"))
        }
        var members: [String] = []
        var after = ""
        while true {
            let page = try storage { () throws(StoreError) in
                try store.segmentPage(seg, after: after, scan: AutomationLimits.segmentScanPage, now: now)
            }
            members += page.members
            guard members.count <= AutomationLimits.maxSendMembers else {
                throw APIError(
                    status: 409, code: .invalidRequest,
                    message: "segment \(id) has more than \(AutomationLimits.maxSendMembers) members: narrow it for a one-off send")
            }
            guard let last = page.last, page.scanned == AutomationLimits.segmentScanPage else { break }
            after = last
        }
        let stored: JSON
        switch content {
        case .push(let p):
            stored = ["push": ["appId": .string(p.appId), "title": .string(p.title), "body": .string(p.body), "data": .object(p.data)]]
        case .template(let t): stored = ["template": .int(t)]
        }
        let sendId = try storage { () throws(StoreError) in
            try store.createSegmentSend(
                segment: id, appKey: seg.appKey, content: stored.serialized, members: members, actor: principal.actor, now: now)
        }
        audit(
            principal, "automation.segment.send", target: "segment " + String(id),
            detail: ["send": .int(sendId), "members": .int(Int64(members.count))])
        return HTTPResponse(status: 202, ["id": .int(sendId), "segmentId": .int(id), "members": .int(Int64(members.count))])
    }

    /// `{items, nextCursor}` of templates or segments by id.
    private func objectList(_ request: HTTPRequest, _ kind: Store.AutomationObject) throws(APIError) -> HTTPResponse {
        let limit = try pageLimit(request.query, max: AutomationLimits.maxPage, default: 50)
        let after = try cursorInt(request.query) ?? 0
        let rows = try storage { () throws(StoreError) in try store.automationObjects(kind, after: after, limit: limit) }
        return list(rows.map(Backend.objectJSON), next: rows.count == limit ? rows.last.map { String($0.id) } : nil)
    }

    private func objectJSON(_ kind: Store.AutomationObject, _ id: Int64) throws(APIError) -> JSON {
        guard let row = try storage({ () throws(StoreError) in try store.automationObject(kind, id) }) else {
            throw APIError(status: 404, code: .notFound, message: "no \(kind == .template ? "template" : "segment") \(id)")
        }
        return Backend.objectJSON(row)
    }

    /// A template or segment: `{id, name, version, actor, createdMs, updatedMs, ...definition}`.
    static func objectJSON(_ r: Store.ObjectRow) -> JSON {
        var o = (try? JSON.parse(r.definition))?.objectValue ?? [:]
        o["id"] = .int(r.id)
        o["name"] = .string(r.name)
        o["version"] = .int(r.version)
        o["actor"] = .string(r.actor)
        o["createdMs"] = .int(r.createdMs)
        o["updatedMs"] = .int(r.updatedMs)
        return .object(o)
    }

    /// Runs a parse, answering its refusal as `400 {error, code: invalid_request, field}`.
    func refusing<T>(_ body: () throws(AutomationError) -> T) throws(APIError) -> T {
        do throws(AutomationError) {
            return try body()
        } catch {
            throw automationRefusal(error)
        }
    }

    func automationRefusal(_ error: AutomationError) -> APIError {
        var e = APIError.badRequest(.invalidRequest, error.description)
        e.extra = ["field": .string(error.field)]
        return e
    }

    /// `POST .../dry-run` with a rule definition, or `{"rule": ID}` for a stored rule: the rule
    /// replayed over the trigger events of the last `AutomationLimits.dryRunWindowMs`
    /// (`AutomationDryRun`), at most `AutomationLimits.dryRunEvents` of them.
    private func automationDryRun(_ request: HTTPRequest, now: Int64) throws(APIError) -> HTTPResponse {
        let body = try jsonBody(request)
        var ruleId: Int64?
        let rule: AutomationRule
        if let o = body.objectValue, o.count == 1, let ref = o["rule"] {
            guard let id = ref.intValue, id > 0 else { throw automationRefusal(AutomationError("rule", "must be a rule id")) }
            let row = try ruleRow(id)
            guard let j = try? JSON.parse(row.definition) else { throw APIError(status: 404, code: .notFound, message: "no rule \(id)") }
            rule = try parseRule(j)
            ruleId = id
        } else {
            rule = try parseRule(body)
        }
        let since = now - AutomationLimits.dryRunWindowMs
        let limit = AutomationLimits.dryRunEvents
        let events = try storage { () throws(StoreError) in
            try store.automationWindowEvents(appKey: rule.appKey, event: rule.event, sinceMs: since, limit: limit + 1)
        }
        let seg: Segment? = try rule.audience.map { id throws(APIError) in try segment(id) }
        var failure: APIError?
        let result = AutomationDryRun.run(rule, events: Array(events.prefix(limit))) { euid in
            do throws(APIError) {
                return try storage { () throws(StoreError) -> AutomationDryRun.User in
                    var u = AutomationDryRun.User()
                    if let seg { u.member = try store.segmentHas(seg, euid: euid, now: now) }
                    let userId = try store.automationUserId(appKey: rule.appKey, euid: euid)
                    u.consentDenied = try store.userConsentDenied(appKey: rule.appKey, euid: euid, installId: "", userId: userId)
                    u.reachable =
                        try userId.map { id throws(StoreError) in try store.pushResolve(targetType: "user", target: id).devices.count > 0 }
                        ?? false
                    if let a = automation { u.offsetMinutes = try userOffsetMinutes(a, rule, appKey: rule.appKey, euid: euid, now: now) }
                    let h = try store.automationDryRunHistory(
                        rule: ruleId, appKey: rule.appKey, euid: euid, beforeMs: since, sinceMs: since - 7 * 86_400_000)
                    u.lastEntryMs = h.lastEntryMs
                    u.sentMs = h.sentMs
                    return u
                }
            } catch {
                failure = error
                return AutomationDryRun.User()
            }
        }
        if let failure { throw failure }
        var o = result.json.objectValue ?? [:]
        o["windowMs"] = .int(AutomationLimits.dryRunWindowMs)
        o["truncated"] = .bool(events.count > limit)
        if let ruleId { o["ruleId"] = .int(ruleId) }
        return HTTPResponse(.object(o))
    }
}
