import PylonCore
import PylonStore

/// Enrolment keys for batches of devices: `POST /v1/admin/enrolment-keys {name, expiresInSeconds?,
/// maxDevices?}` makes one and answers its secret once (`pe1.<id>.<secret>`; the store keeps only
/// its SHA-256), `GET /v1/admin/enrolment-keys` lists them with the devices each registered, and
/// `DELETE /v1/admin/enrolment-keys/{id}` revokes one at once. A key is presented like the
/// fleet-wide enrolment secret (`--enrol-secret-file`) and may do what that may (register new
/// installs, and present the device's data until the device holds its own token), until it
/// expires, registered its `maxDevices`, or is revoked — so the key provisioned on one batch of
/// devices can be withdrawn without touching the others (docs/SECURITY.md, "Enrolment").
extension Backend {
    enum EnrolmentKeyLimits {
        /// Keys kept (revoked ones included): beyond it, 409.
        static let maxKeys = 1000
        static let maxNameBytes = 64
        /// Longest lifetime a key may be given (five years).
        static let maxExpiresInSeconds: Int64 = 5 * 365 * 86400
        static let maxDevices: Int64 = 100_000_000
        static let prefix = "pe1."
    }

    /// The key of a `pe1.<id>.<secret>` token when the secret matches and the key may still be
    /// used; a refusal (401) for a wrong secret or an unknown, revoked or expired key.
    func enrolmentKeyPrincipal(_ token: Substring) throws(APIError) -> Principal? {
        guard token.hasPrefix(EnrolmentKeyLimits.prefix) else { return nil }
        let parts = token.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 3, DeviceToken.isHex(parts[1]), parts[1].count == 16, DeviceToken.isHex(parts[2]), parts[2].count == 64
        else { throw .unauthorized("malformed enrolment key") }
        let row = try storage { () throws(StoreError) in try store.enrolmentKey(String(parts[1])) }
        guard let row, Credentials.equal(Backend.hashHex(parts[2]).utf8, Array(row.secretHash.utf8)) else {
            throw .unauthorized("invalid enrolment key")
        }
        // A key that registered its `maxDevices` still presents those devices' data.
        if row.revokedAt != nil { throw .unauthorized("the enrolment key was revoked") }
        if let e = row.expiresAt, e <= System.wallClockMs() { throw .unauthorized("the enrolment key expired") }
        return .enrolment(key: row.id)
    }

    static func hashHex(_ s: Substring) -> String {
        NKey.sha256(Array(s.utf8)).map { String($0, radix: 16).leftPad(2) }.joined()
    }

    /// `GET|POST /v1/admin/enrolment-keys`, `DELETE /v1/admin/enrolment-keys/{id}`.
    func enrolmentKeys(_ request: HTTPRequest, id: String?, _ principal: Principal) throws(APIError) -> HTTPResponse {
        let now = System.wallClockMs()
        switch (request.method, id) {
        case ("DELETE", let id?):
            guard try storage({ () throws(StoreError) in try store.revokeEnrolmentKey(id, now: now) }) else {
                throw .notFound(request.path)
            }
            log.info("enrolment key revoked", ["id": id, "by": principal.actor])
            return HTTPResponse(["id": .string(id), "revoked": true])
        case ("POST", nil):
            let body = try jsonBody(request)
            guard body.objectValue != nil else { throw .badRequest(.invalidRequest, "body must be a JSON object") }
            guard let name = body["name"]?.stringValue, (1...EnrolmentKeyLimits.maxNameBytes).contains(name.utf8.count),
                Router.invalidName(name, what: "name") == nil
            else {
                throw .badRequest(
                    .invalidRequest, "name must be 1 to \(EnrolmentKeyLimits.maxNameBytes) bytes without control characters")
            }
            var expiresAt: Int64?
            if let v = body["expiresInSeconds"], !v.isNull {
                guard let s = v.intValue, (60...EnrolmentKeyLimits.maxExpiresInSeconds).contains(s) else {
                    throw .badRequest(
                        .invalidRequest, "expiresInSeconds must be an integer in 60...\(EnrolmentKeyLimits.maxExpiresInSeconds)")
                }
                expiresAt = now + s * 1000
            }
            var maxDevices: Int64?
            if let v = body["maxDevices"], !v.isNull {
                guard let n = v.intValue, (1...EnrolmentKeyLimits.maxDevices).contains(n) else {
                    throw .badRequest(.invalidRequest, "maxDevices must be an integer in 1...\(EnrolmentKeyLimits.maxDevices)")
                }
                maxDevices = n
            }
            guard try storage({ () throws(StoreError) in try store.enrolmentKeyCount() }) < EnrolmentKeyLimits.maxKeys else {
                throw APIError(
                    status: 409, code: .invalidRequest, message: "\(EnrolmentKeyLimits.maxKeys) enrolment keys exist: revoke or reuse one")
            }
            let secret = System.randomHex(32)
            let row = Store.EnrolmentKeyRow(
                id: System.randomHex(8), name: name, secretHash: Backend.hashHex(secret[...]), createdBy: principal.actor, createdAt: now,
                expiresAt: expiresAt, maxDevices: maxDevices, devices: 0, revokedAt: nil)
            try storage { () throws(StoreError) in try store.createEnrolmentKey(row) }
            log.info("enrolment key made", ["id": row.id, "name": name, "by": principal.actor])
            var o = Backend.keyJSON(row, now: now).objectValue ?? [:]
            o["key"] = .string(EnrolmentKeyLimits.prefix + row.id + "." + secret)
            return HTTPResponse(status: 201, .object(o))
        case ("GET", nil):
            let rows = try storage { () throws(StoreError) in try store.enrolmentKeys(limit: EnrolmentKeyLimits.maxKeys) }
            return HTTPResponse(["keys": .array(rows.map { Backend.keyJSON($0, now: now) })])
        default:
            throw .methodNotAllowed(request.method, allowed: id == nil ? ["GET", "POST"] : ["DELETE"])
        }
    }

    static func keyJSON(_ k: Store.EnrolmentKeyRow, now: Int64) -> JSON {
        [
            "id": .string(k.id), "name": .string(k.name), "createdBy": .string(k.createdBy), "createdAt": .int(k.createdAt),
            "expiresAt": k.expiresAt.map { .int($0) } ?? .null, "maxDevices": k.maxDevices.map { .int($0) } ?? .null,
            "devices": .int(k.devices), "revokedAt": k.revokedAt.map { .int($0) } ?? .null,
            "usable": .bool(k.refusal(now: now) == nil),
        ]
    }
}
