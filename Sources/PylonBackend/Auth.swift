import PylonCore
import PylonStore

#if canImport(Glibc)
import Glibc
#endif

/// Who may call an endpoint (docs/SECURITY.md, "Backend"; the OpenAPI document's security
/// schemes).
///
/// - `open`: anyone (`/healthz`).
/// - `enrolment`: `POST /v1/devices/register`: the enrolment secret (`--enrol-secret-file`) or an
///   enrolment key (`pe1.…`, `Backend+EnrolmentKeys.swift`) as `Authorization: Bearer`, or
///   nothing under `--open-enrolment`.
/// - `device`: a device credential: a device token issued at registration, or the enrolment
///   secret or key the device was provisioned with.
/// - `pushDevice`: a device token only: the push calls act on that device's own push identity.
/// - `operator`: the operator token (`--operator-token-file`), or an operator session's cookie
///   (`Backend+Session.swift`: a `viewer` may only read, every change needs `X-CSRF-Token`);
///   without a token configured and no session these endpoints answer 403.
/// - `metrics`: as `operator`, or the scrape token (`--metrics-token-file`).
enum Access: Equatable {
    case open, enrolment, device, pushDevice, `operator`, metrics
}

extension Endpoint {
    var access: Access {
        switch self {
        case .health: .open
        case .deviceRegister: .enrolment
        case .ingest, .maCall, .gtmPublished, .gtmDraft: .device
        case .pushCall: .pushDevice
        case .data: .operator
        case .console(let r): r.access
        case .inspectStream, .inspectRecords, .stats, .reset, .deviceReenrol, .enrolmentKeys, .getFaults, .setFaults, .clearFaults,
            .maGetApp, .maSetApp,
            .maGetMetadata, .maSetMetadata, .maFindUser, .maInspectUser, .pushSend, .pushInspect, .gtmPublish, .gtmInspect:
            .operator
        }
    }
}

/// The caller a request was authenticated as.
enum Principal: Equatable {
    case anonymous
    /// The fleet-wide enrolment secret (`key` nil) or an enrolment key of a batch of devices
    /// (`Backend+EnrolmentKeys.swift`).
    case enrolment(key: String?)
    /// A registered device (its id and install id).
    case device(id: String, installId: String)
    /// The operator token: an admin named `SessionLimits.tokenName`.
    case `operator`
    /// An operator session (`Backend+Session.swift`).
    case session(name: String, role: Role)
    /// The scrape token of `GET /metrics`.
    case scraper

    /// The name written to the audit log.
    var actor: String {
        switch self {
        case .operator: SessionLimits.tokenName
        case .session(let name, _): name
        case .device(let id, _): "device:" + id
        case .anonymous, .enrolment, .scraper: "-"
        }
    }
}

/// The secrets the backend checks requests against, read once at start.
package struct Credentials {
    package var operatorToken: [UInt8]?
    package var enrolSecret: [UInt8]?
    package var openEnrolment = false
    /// `--metrics-token-file`: a bearer token that may read `GET /metrics` only.
    package var metricsToken: [UInt8]?

    package init() {}

    /// Constant-time comparison (the time depends on the lengths only).
    static func equal(_ a: some Collection<UInt8>, _ b: [UInt8]) -> Bool {
        guard a.count == b.count else { return false }
        var d: UInt8 = 0
        for (x, y) in zip(a, b) { d |= x ^ y }
        return d == 0
    }
}

/// Device tokens: `pd1.<deviceId>.<secret>`, the device id 16 hex digits, the secret 64.
enum DeviceToken {
    static let prefix = "pd1."

    static func make(deviceId: String, secret: String) -> String { prefix + deviceId + "." + secret }

    /// The device id and secret of a well-formed token.
    static func parse(_ t: Substring) -> (deviceId: String, secret: String)? {
        guard t.hasPrefix(prefix) else { return nil }
        let rest = t.dropFirst(prefix.count)
        guard let dot = rest.firstIndex(of: ".") else { return nil }
        let id = rest[..<dot], secret = rest[rest.index(after: dot)...]
        guard id.utf8.count == 16, secret.utf8.count == 64, isHex(id), isHex(secret) else { return nil }
        return (String(id), String(secret))
    }

    static func isHex(_ s: Substring) -> Bool {
        s.utf8.allSatisfy { (0x30...0x39).contains($0) || (0x61...0x66).contains($0) }
    }
}

extension Backend {
    /// The bearer token of `Authorization: Bearer <token>`, or nil.
    static func bearer(_ request: HTTPRequest) -> Substring? {
        guard let h = request.header("authorization") else { return nil }
        let v = Substring(h)
        guard v.count > 7, v.prefix(7).lowercased() == "bearer " else { return nil }
        var t = v.dropFirst(7)
        while t.first == " " { t = t.dropFirst() }
        while t.last == " " { t = t.dropLast() }
        return t.isEmpty ? nil : t
    }

    /// Authenticates `request` for an endpoint needing `access`: the principal, or 401 (no or
    /// unknown credential) / 403 (a credential that may not call this endpoint, or the
    /// endpoint's secret is not configured).
    func authorize(_ request: HTTPRequest, _ access: Access) throws(APIError) -> Principal {
        if access == .open { return .anonymous }
        let token = Backend.bearer(request)
        if access == .operator || access == .metrics, token == nil, let id = SessionCookie.value(request.header("cookie")) {
            return try sessionPrincipal(request, id: id)
        }
        if access == .metrics, let token, let m = credentials.metricsToken, Credentials.equal(token.utf8, m) { return .scraper }
        if access == .operator || access == .metrics {
            guard let op = credentials.operatorToken else {
                throw .forbidden("the operator API is disabled: start the backend with --operator-token-file")
            }
            guard let token else { throw .unauthorized("the operator token is required (Authorization: Bearer)") }
            if Credentials.equal(token.utf8, op) { return .operator }
            // A valid credential of another kind is known but not allowed here: 403, as for the
            // device endpoints (docs/SECURITY.md, "Backend").
            if let e = credentials.enrolSecret, Credentials.equal(token.utf8, e) {
                throw .forbidden("the enrolment secret is a device credential, not the operator token")
            }
            if let (id, secret) = DeviceToken.parse(token),
                let row = try storage({ () throws(StoreError) in try store.device(id) }),
                Credentials.equal(secret.utf8, Array(row.secret.utf8))
            {
                throw .forbidden("a device token is not the operator token")
            }
            throw .unauthorized("invalid operator token")
        }
        if access == .enrolment, token == nil {
            guard credentials.openEnrolment else {
                throw .unauthorized("the enrolment secret is required (Authorization: Bearer)")
            }
            return .anonymous
        }
        guard let token else { throw .unauthorized("a device credential is required (Authorization: Bearer)") }
        if let (id, secret) = DeviceToken.parse(token) {
            let row = try storage { () throws(StoreError) in try store.device(id) }
            guard let row, Credentials.equal(secret.utf8, Array(row.secret.utf8)) else {
                throw .unauthorized("invalid device token")
            }
            noteDeviceSeen(id)
            return .device(id: id, installId: row.installId)
        }
        let enrolment: Principal?
        if let e = credentials.enrolSecret, Credentials.equal(token.utf8, e) {
            enrolment = .enrolment(key: nil)
        } else {
            enrolment = try enrolmentKeyPrincipal(token)
        }
        if let enrolment {
            guard access != .pushDevice else {
                throw .forbidden("push calls need this device's own token (POST /v1/devices/register)")
            }
            return enrolment
        }
        if let op = credentials.operatorToken, Credentials.equal(token.utf8, op) {
            throw .forbidden("the operator token is not a device credential")
        }
        throw .unauthorized("invalid credential")
    }
}

extension APIError.Code {
    static let unauthorized = APIError.Code(rawValue: "unauthorized")
    static let forbidden = APIError.Code(rawValue: "forbidden")
}

extension APIError {
    static func unauthorized(_ message: String) -> APIError {
        APIError(status: 401, code: .unauthorized, message: message, wwwAuthenticate: "Bearer realm=\"pylon\"")
    }
    static func forbidden(_ message: String) -> APIError {
        APIError(status: 403, code: .forbidden, message: message)
    }
}
