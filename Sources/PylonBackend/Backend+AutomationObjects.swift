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
        default:
            throw APIError(status: 404, code: .notFound, message: "no such automation route")
        }
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
}
