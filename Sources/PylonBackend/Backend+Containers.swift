import PylonCore

/// The console's container pages: the list, every version (who published it, its size), one
/// version's content, and rollback (an old version's content published as a new version).
extension Backend {
    /// `GET /v1/admin/gtm/containers?q=`: containers (whose id starts with `q`); `fetches` are
    /// this instance's since it started.
    func containerList(_ request: HTTPRequest) throws(APIError) -> HTTPResponse {
        let (limit, cursor) = try page(request)
        let rows = try storage { () throws(StoreError) in
            try store.consoleQuery(
                """
                SELECT c.container_id, c.published, c.draft, (SELECT count(*) FROM gtm_versions v WHERE v.container_id = c.container_id)
                FROM gtm_containers c WHERE c.container_id > ? AND c.container_id >= ? AND c.container_id <= ?
                ORDER BY c.container_id LIMIT ?
                """, [.text(cursor ?? ""), Backend.prefix(request).low, Backend.prefix(request).high, .int(Int64(limit))])
        }
        let items: [JSON] = rows.map { r in
            let id = r[0].text ?? ""
            var byOutcome = JSONObject()
            for (k, v) in (gtmFetches[id] ?? [:]).sorted(by: { $0.key < $1.key }) { byOutcome[k] = .int(Int64(v)) }
            return [
                "id": .string(id), "publishedVersion": r[1].int.map { .int($0) } ?? .null,
                "draftVersion": r[2].int.map { .int($0) } ?? .null, "versions": .int(r[3].int ?? 0),
                "fetches": .int(Int64(gtmFetches[id]?.values.reduce(0, +) ?? 0)), "fetchesByOutcome": .object(byOutcome),
            ]
        }
        return Backend.list(items, limit: limit, lastKey: rows.last?[0].text)
    }

    /// `GET /v1/admin/gtm/containers/{id}/versions`: newest first.
    func containerVersions(_ request: HTTPRequest, _ id: String) throws(APIError) -> HTTPResponse {
        let (limit, cursor) = try page(request)
        var below = Int64.max
        if let c = cursor {
            guard let n = Int64(c) else { throw .badRequest(.invalidRequest, "cursor is not one this backend gave out") }
            below = n
        }
        let size = store.db.dialect == .postgres ? "octet_length(v.body)" : "length(CAST(v.body AS BLOB))"
        let (rows, summary) = try storage { () throws(StoreError) in
            (
                try store.consoleQuery(
                    """
                    SELECT v.version, v.created_at, a.actor, \(size) FROM gtm_versions v
                    LEFT JOIN gtm_version_actors a ON a.container_id = v.container_id AND a.version = v.version
                    WHERE v.container_id = ? AND v.version < ? ORDER BY v.version DESC LIMIT ?
                    """, [.text(id), .int(below), .int(Int64(limit))]),
                try store.gtmSummary(id)
            )
        }
        guard cursor != nil || !summary.versions.isEmpty else {
            throw APIError(status: 404, code: .notFound, message: "no container \(id)")
        }
        let items: [JSON] = rows.map { r in
            let v = r[0].int ?? 0
            return [
                "version": .int(v), "createdMs": .int(r[1].int ?? 0), "actor": r[2].text.map { .string($0) } ?? .null,
                "bytes": .int(r[3].int ?? 0), "published": .bool(summary.published == v), "draft": .bool(summary.draft == v),
            ]
        }
        return Backend.list(items, limit: limit, lastKey: rows.last?[0].int.map { String($0) })
    }

    /// `GET /v1/admin/gtm/containers/{id}/versions/{v}`: the stored content.
    func containerVersion(_ id: String, _ version: Int64) throws(APIError) -> HTTPResponse {
        guard
            let r = try storage({ () throws(StoreError) in
                try store.consoleQuery(
                    "SELECT body, created_at FROM gtm_versions WHERE container_id = ? AND version = ?", [.text(id), .int(version)]
                ).first
            })
        else { throw APIError(status: 404, code: .notFound, message: "container \(id) has no version \(version)") }
        let content = (try? JSON.parse(r[0].text ?? "null", maxDepth: 256)) ?? .null
        return HTTPResponse(["version": .int(version), "createdMs": .int(r[1].int ?? 0), "content": content])
    }

    /// `POST /v1/admin/gtm/containers/{id}/rollback` `{"version": n}`: publishes version n's
    /// content as version m+1 (stamped `m+1`, as a publish is), in one transaction.
    func rollback(_ request: HTTPRequest, _ id: String, _ principal: Principal) throws(APIError) -> HTTPResponse {
        guard case .int(let from)? = try jsonBody(request)["version"], from > 0 else {
            throw .badRequest(.invalidRequest, "version (a positive integer) is required")
        }
        let version = try storage { () throws(StoreError) -> Int64? in
            try store.transaction { () throws(StoreError) -> Int64? in
                guard
                    let body = try store.consoleQuery(
                        "SELECT body FROM gtm_versions WHERE container_id = ? AND version = ?", [.text(id), .int(from)]
                    ).first?.first?.text,
                    case .object(let top)? = try? JSON.parse(body, maxDepth: 256)
                else { return nil }
                let version = try store.gtmNextVersion(id)
                try store.gtmStore(
                    id, version: version, body: JSON.object(Backend.stamp(top, version: version)).serialized, draft: false, auth: nil)
                try store.recordGTMActor(id, version: version, actor: principal.actor)
                return version
            }
        }
        guard let version else { throw APIError(status: 404, code: .notFound, message: "container \(id) has no version \(from)") }
        audit(principal, "gtm.rollback", target: id, detail: ["from": .int(from), "version": .int(version)])
        log.info("gtm container rolled back", ["id": id, "from": from, "version": version])
        return HTTPResponse([
            "containerId": .string(id), "version": .string(String(version)), "published": true, "rolledBackFrom": .int(from),
        ])
    }

    /// A container with `version` stamped into it (`resource.version`, or `version` at the top
    /// of a container without `resource`), so `_ctv` and the plugin report it.
    static func stamp(_ top: JSONObject, version: Int64) -> JSONObject {
        var top = top
        if case .object(var res)? = top["resource"] {
            res["version"] = .string(String(version))
            top["resource"] = .object(res)
        } else {
            top["version"] = .string(String(version))
        }
        return top
    }
}
