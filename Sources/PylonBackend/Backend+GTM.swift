import PylonCore
import PylonStore

/// Tag-manager containers: an admin publishes versions (or a draft for preview); devices fetch
/// the published version with ETag/304, or the draft with its `gtm_auth` token. `_ua` hits
/// arrive as ordinary uploader batches on stream `gtm.hits` (`/v1/batches/gtm.hits`).
extension Backend {
    /// `POST /v1/admin/gtm/containers/{id}/versions` `{container, draft?, gtmAuth?}`: stores the
    /// container as version n+1 (its `resource.version` set to `"n+1"`); publishes it unless
    /// `draft`, in which case it becomes the draft served to `gtm_auth` (given, or generated).
    func gtmPublish(_ request: HTTPRequest, id: String) throws(APIError) -> HTTPResponse {
        let body = try jsonBody(request)
        guard case .object(let top)? = body["container"] else {
            throw .badRequest(.invalidRequest, "container (a JSON object in the legacy resource layout) is required")
        }
        let draft = body["draft"]?.boolValue ?? false
        var auth = body["gtmAuth"]?.stringValue
        if draft, auth == nil { auth = System.randomHex(8) }
        if let a = auth, a.isEmpty || a.utf8.count > 128 { throw .badRequest(.invalidRequest, "gtmAuth must be 1-128 characters") }
        // The next version is read and stored in one transaction: two instances publishing at
        // once get versions n+1 and n+2 (the second runs again after the conflict).
        let version = try storage { () throws(StoreError) -> Int64 in
            try store.transaction { () throws(StoreError) -> Int64 in
                let version = try store.gtmNextVersion(id)
                let text = JSON.object(Backend.stamp(top, version: version)).serialized
                try store.gtmStore(id, version: version, body: text, draft: draft, auth: auth)
                return version
            }
        }
        log.info("gtm container version", ["id": id, "version": version, "draft": draft])
        var r: JSONObject = ["containerId": .string(id), "version": .string(String(version)), "published": .bool(!draft)]
        if draft, let auth { r["gtmAuth"] = .string(auth) }
        return HTTPResponse(.object(r))
    }

    /// `GET /v1/gtm/containers/{id}`: the published version, `ETag: "<id>-v<n>"`; a matching
    /// `If-None-Match` gets 304 with no body.
    func gtmPublished(_ request: HTTPRequest, id: String) throws(APIError) -> HTTPResponse {
        guard let (version, text) = try storage({ () throws(StoreError) in try store.gtmPublished(id) }) else {
            throw APIError(status: 404, code: .notFound, message: "no published version of container \(id)")
        }
        let etag = "\"\(id)-v\(version)\""
        if let inm = request.header("if-none-match"),
            inm.split(separator: ",").contains(where: { $0.trimmingSpaces == etag || $0.trimmingSpaces == "*" })
        {
            gtmFetches[id, default: [:]]["notModified", default: 0] += 1
            return HTTPResponse(status: 304, headers: [("ETag", etag)], .null)
        }
        gtmFetches[id, default: [:]]["published", default: 0] += 1
        let j = (try? JSON.parse(text, maxDepth: 256)) ?? .null
        return HTTPResponse(headers: [("ETag", etag), ("X-Container-Version", String(version)), ("Cache-Control", "no-cache")], j)
    }

    /// `GET /v1/gtm/containers/{id}/draft?gtm_auth=...&gtm_preview=...`: the draft, for preview.
    func gtmDraft(_ request: HTTPRequest, id: String) throws(APIError) -> HTTPResponse {
        guard let (version, text, auth) = try storage({ () throws(StoreError) in try store.gtmDraft(id) }) else {
            throw APIError(status: 404, code: .notFound, message: "container \(id) has no draft")
        }
        guard request.query["gtm_auth"] == auth else {
            gtmFetches[id, default: [:]]["denied", default: 0] += 1
            throw APIError(status: 403, code: .invalidRequest, message: "gtm_auth does not match the draft's token")
        }
        gtmFetches[id, default: [:]]["draft", default: 0] += 1
        let j = (try? JSON.parse(text, maxDepth: 256)) ?? .null
        return HTTPResponse(headers: [("X-Container-Version", String(version)), ("Cache-Control", "no-store")], j)
    }

    /// `GET /v1/inspect/gtm/containers/{id}`: versions, what is published and drafted, fetch counts.
    func gtmInspect(id: String) throws(APIError) -> HTTPResponse {
        let s = try storage { () throws(StoreError) in try store.gtmSummary(id) }
        var fetches = JSONObject()
        for (k, v) in (gtmFetches[id] ?? [:]).sorted(by: { $0.key < $1.key }) { fetches[k] = .int(Int64(v)) }
        return HTTPResponse([
            "containerId": .string(id), "versions": .array(s.versions.map { .int($0) }),
            "published": s.published.map { .int($0) } ?? .null, "draft": s.draft.map { .int($0) } ?? .null,
            "fetches": .object(fetches),
        ])
    }
}

extension Store {
    static let gtmSchema = """
        CREATE TABLE IF NOT EXISTS gtm_versions (
            container_id TEXT NOT NULL,
            version INTEGER NOT NULL,
            body TEXT NOT NULL,
            created_at INTEGER NOT NULL,
            PRIMARY KEY (container_id, version)
        );
        CREATE TABLE IF NOT EXISTS gtm_containers (
            container_id TEXT PRIMARY KEY,
            published INTEGER,
            draft INTEGER,
            draft_auth TEXT
        );
        """

    func gtmNextVersion(_ id: String) throws(StoreError) -> Int64 {
        (try db.query("SELECT COALESCE(MAX(version), 0) + 1 FROM gtm_versions WHERE container_id = ?", [.text(id)]).first?.first?.int) ?? 1
    }

    func gtmStore(_ id: String, version: Int64, body: String, draft: Bool, auth: String?) throws(StoreError) {
        try transaction { () throws(StoreError) in
            try db.run(
                "INSERT INTO gtm_versions(container_id, version, body, created_at) VALUES (?, ?, ?, ?)",
                [.text(id), .int(version), .text(body), .int(System.wallClockMs())])
            try db.run("INSERT INTO gtm_containers(container_id) VALUES (?) ON CONFLICT DO NOTHING", [.text(id)])
            if draft {
                try db.run(
                    "UPDATE gtm_containers SET draft = ?, draft_auth = ? WHERE container_id = ?",
                    [.int(version), auth.map { .text($0) } ?? .null, .text(id)])
            } else {
                try db.run("UPDATE gtm_containers SET published = ? WHERE container_id = ?", [.int(version), .text(id)])
            }
        }
    }

    func gtmPublished(_ id: String) throws(StoreError) -> (Int64, String)? {
        guard
            let r = try db.query(
                """
                SELECT v.version, v.body FROM gtm_containers c JOIN gtm_versions v
                ON v.container_id = c.container_id AND v.version = c.published WHERE c.container_id = ?
                """, [.text(id)]
            ).first, let v = r[0].int, let b = r[1].text
        else { return nil }
        return (v, b)
    }

    func gtmDraft(_ id: String) throws(StoreError) -> (Int64, String, String)? {
        guard
            let r = try db.query(
                """
                SELECT v.version, v.body, c.draft_auth FROM gtm_containers c JOIN gtm_versions v
                ON v.container_id = c.container_id AND v.version = c.draft WHERE c.container_id = ?
                """, [.text(id)]
            ).first, let v = r[0].int, let b = r[1].text
        else { return nil }
        return (v, b, r[2].text ?? "")
    }

    struct GTMSummary {
        var versions: [Int64]
        var published: Int64?
        var draft: Int64?
    }

    func gtmSummary(_ id: String) throws(StoreError) -> GTMSummary {
        let versions = try db.query("SELECT version FROM gtm_versions WHERE container_id = ? ORDER BY version", [.text(id)]).compactMap {
            $0[0].int
        }
        let row = try db.query("SELECT published, draft FROM gtm_containers WHERE container_id = ?", [.text(id)]).first
        return GTMSummary(versions: versions, published: row?[0].int, draft: row?[1].int)
    }
}

extension Substring {
    var trimmingSpaces: String {
        String(drop { $0 == " " || $0 == "\t" }.reversed().drop { $0 == " " || $0 == "\t" }.reversed())
    }
}
