import PylonCore

/// An error answered to a client: an HTTP status and a body `{"error": message, "code": code}`.
struct APIError: Error {
    /// Stable, machine-readable error codes; the one table of them (documented in
    /// docs/backend-openapi.yaml as `ErrorCode`).
    struct Code: RawRepresentable, Equatable, Sendable {
        let rawValue: String
        init(rawValue: String) { self.rawValue = rawValue }

        static let malformedHTTP = Code(rawValue: "malformed_http")
        static let headerTooLarge = Code(rawValue: "header_too_large")
        static let payloadTooLarge = Code(rawValue: "payload_too_large")
        static let unsupportedEncoding = Code(rawValue: "unsupported_encoding")
        static let invalidJSON = Code(rawValue: "invalid_json")
        static let invalidBatch = Code(rawValue: "invalid_batch")
        static let invalidRequest = Code(rawValue: "invalid_request")
        static let missingIdempotencyKey = Code(rawValue: "missing_idempotency_key")
        static let notFound = Code(rawValue: "not_found")
        static let methodNotAllowed = Code(rawValue: "method_not_allowed")
        static let injectedFault = Code(rawValue: "injected_fault")
        static let tooManyConnections = Code(rawValue: "too_many_connections")
        static let requestTimeout = Code(rawValue: "request_timeout")
        static let httpVersionNotSupported = Code(rawValue: "http_version_not_supported")
        static let storage = Code(rawValue: "storage_error")
        static let serverBusy = Code(rawValue: "server_busy")
        /// NATS mode: not connected, the stream not ready, or no acknowledgement in time.
        static let streamUnavailable = Code(rawValue: "stream_unavailable")
    }

    var status: Int
    var code: Code
    var message: String
    /// For 405: the methods the path accepts (`Allow` header).
    var allow: String? = nil
    /// Seconds for a `Retry-After` header (injected faults).
    var retryAfter: Int? = nil
    /// For 401: the `WWW-Authenticate` challenge.
    var wwwAuthenticate: String? = nil
    /// More members of the body (`retryAfterMs` of a refused login, `reason` of a refusal).
    var extra: JSONObject = [:]

    var body: JSON {
        var o: JSONObject = ["error": .string(message), "code": .string(code.rawValue)]
        for (k, v) in extra { o[k] = v }
        return .object(o)
    }

    static func badRequest(_ code: Code, _ message: String) -> APIError {
        APIError(status: 400, code: code, message: message)
    }
    static func tooLarge(_ message: String) -> APIError {
        APIError(status: 413, code: .payloadTooLarge, message: message)
    }
    static func notFound(_ path: Substring) -> APIError {
        APIError(status: 404, code: .notFound, message: "no such resource: \(path)")
    }
    static func methodNotAllowed(_ method: String, allowed: [String]) -> APIError {
        APIError(
            status: 405, code: .methodNotAllowed, message: "\(method) is not allowed here",
            allow: allowed.joined(separator: ", "))
    }
    /// 500, or what a `StoreError` asks for: 503 with `Retry-After: 1` when the database is
    /// unreachable, restarting or busy; 400 for text it cannot store.
    static func storage(_ error: any Error) -> APIError {
        if let e = error as? StoreError, e.status != 500 {
            if e.status == 400 { return .badRequest(.invalidRequest, e.description) }
            return APIError(status: e.status, code: .storage, message: "storage unavailable: \(e)", retryAfter: 1)
        }
        return APIError(status: 500, code: .storage, message: "storage failed: \(error)")
    }
}
