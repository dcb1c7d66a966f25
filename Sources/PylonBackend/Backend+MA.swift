import PylonCore
import PylonStore

/// The MA endpoints: the calls the MA plugin makes (`/v1/ma/...`, answered 200 with an MA
/// `code`), the admin state tests set (`/v1/admin/ma/...`) and inspection (`/v1/inspect/ma/...`).
/// Each request is one transaction.
extension Backend {
    /// `POST /v1/ma/{appKey}/{call}`. A body that is not JSON is 400; everything else is an
    /// MA reply (see `MACalls`).
    func maCall(_ request: HTTPRequest, appKey: String, _ call: MACall) throws(APIError) -> HTTPResponse {
        let body = try jsonBody(request)
        let calls = MACalls(store: store, appKey: appKey, now: System.wallClockMs())
        // A start or identify may merge identities: it holds the advisory locks of what it names
        // (PostgreSQL), so two instances merging the same identifiers run one after the other.
        let keys = call == .start || call == .identify ? Store.maLockKeys(appKey, body) : []
        let reply = try storage { () throws(StoreError) in
            try store.transaction(locking: keys) { () throws(StoreError) in try calls.run(call, body) }
        }
        log.debug("ma", ["appKey": appKey, "call": call.rawValue, "code": reply["code"]?.intValue ?? 0])
        return HTTPResponse(reply)
    }

    // MARK: Admin

    /// `GET /v1/admin/ma/{appKey}`.
    func maApp(appKey: String) throws(APIError) -> HTTPResponse {
        HTTPResponse(try storage { () throws(StoreError) in try store.maApp(appKey) }.json(appKey: appKey))
    }

    /// `POST /v1/admin/ma/{appKey}` with `{"disabled": Bool?, "project": String?}`; answers
    /// the state after the change.
    func setMAApp(_ request: HTTPRequest, appKey: String) throws(APIError) -> HTTPResponse {
        let body = try jsonBody(request)
        guard let o = body.objectValue else { throw .badRequest(.invalidRequest, "MA settings must be a JSON object") }
        for (key, value) in o {
            switch key {
            case "disabled":
                if value.boolValue == nil { throw .badRequest(.invalidRequest, "disabled must be a boolean") }
            case "project":
                guard let p = value.stringValue, (1...Limits.maxMAKeyChars).contains(p.count) else {
                    throw .badRequest(.invalidRequest, "project must be a string of 1 to \(Limits.maxMAKeyChars) characters")
                }
            default: throw .badRequest(.invalidRequest, "unknown MA setting \(key)")
            }
        }
        let app = try storage { () throws(StoreError) in
            try store.transaction { () throws(StoreError) in
                var app = try store.maApp(appKey)
                if let d = o["disabled"]?.boolValue { app.disabled = d }
                if let p = o["project"]?.stringValue { app.project = p }
                try store.setMAApp(appKey, app)
                return app
            }
        }
        log.info("ma app set", ["appKey": appKey, "disabled": app.disabled, "project": app.project])
        return HTTPResponse(app.json(appKey: appKey))
    }

    /// `GET /v1/admin/ma/{appKey}/metadata`.
    func maMetadata(appKey: String) throws(APIError) -> HTTPResponse {
        HTTPResponse(try storage { () throws(StoreError) in try store.maApp(appKey) }.metadata.json)
    }

    /// `POST /v1/admin/ma/{appKey}/metadata`: merges definitions (see `MAMetadata.merge`);
    /// answers the whole metadata.
    func setMAMetadata(_ request: HTTPRequest, appKey: String) throws(APIError) -> HTTPResponse {
        let body = try jsonBody(request)
        var check = MAMetadata()
        try check.merge(body)  // validates; the merge below, on the stored metadata, cannot fail
        let metadata = try storage { () throws(StoreError) in
            try store.transaction { () throws(StoreError) in
                var app = try store.maApp(appKey)
                try? app.metadata.merge(body)
                try store.setMAApp(appKey, app)
                return app.metadata
            }
        }
        log.info("ma metadata set", ["appKey": appKey, "metadata": metadata.json.serialized])
        return HTTPResponse(metadata.json)
    }

    // MARK: Inspection

    /// `GET /v1/inspect/ma/{appKey}/users?KIND=VALUE` with exactly one of `user_id`,
    /// `anonymous_id`, `email` (matched lower-cased), `phone`, `deviceId`: `{"euid": String?}`.
    func maFindUser(_ request: HTTPRequest, appKey: String) throws(APIError) -> HTTPResponse {
        let q = request.query
        let kinds: [(String, IdentityKind)] = [
            ("user_id", .userID), ("anonymous_id", .anonymousID), ("email", .email), ("phone", .phone),
            ("deviceId", .device),
        ]
        guard q.count == 1, let name = q.keys.first, let value = q[name],
            let kind = kinds.first(where: { $0.0 == name })?.1
        else {
            throw .badRequest(.invalidRequest, "give exactly one of user_id, anonymous_id, email, phone, deviceId")
        }
        let v = kind == .email ? value.lowercased() : value
        let euid = try storage { () throws(StoreError) in try store.maHolder(appKey, kind, v) }
        return HTTPResponse(["euid": euid.map(JSON.string) ?? .null])
    }

    /// `GET /v1/inspect/ma/{appKey}/users/{euid}`: everything stored for a user; 404 when
    /// the AppKey has no such user.
    func maInspectUser(appKey: String, euid: String) throws(APIError) -> HTTPResponse {
        let user = try storage { () throws(StoreError) -> JSON? in
            try store.transaction { () throws(StoreError) -> JSON? in
                guard try store.maUserExists(appKey, euid) else { return nil }
                let ids = try store.maIdentities(appKey, euid)
                func list(_ k: IdentityKind) -> JSON { .array((ids[k] ?? []).map(JSON.string)) }
                return [
                    "euid": .string(euid),
                    "identities": [
                        "user_id": ids[.userID]?.first.map(JSON.string) ?? .null,
                        "anonymous_id": ids[.anonymousID]?.first.map(JSON.string) ?? .null,
                        "emails": list(.email), "phones": list(.phone), "devices": list(.device),
                    ],
                    "contacts": .object(try store.maDocument(appKey, euid, .contacts) ?? [:]),
                    "properties": .object(try store.maDocument(appKey, euid, .properties) ?? [:]),
                    "channels": .array(try store.maChannelValues(appKey, euid)),
                ]
            }
        }
        guard let user else {
            throw APIError(status: 404, code: .notFound, message: "no user \(euid) for AppKey \(appKey)")
        }
        return HTTPResponse(user)
    }
}
