import PylonCore

/// One parsed HTTP/1.1 request. Header names are stored lower-cased.
package struct HTTPRequest {
    var method: String
    /// The request target as sent (path and query, percent-encoded).
    var target: String
    var headers: [(name: String, value: String)]
    var body: [UInt8]
    /// The client's address (`HOST`, no port), for per-address limits such as login attempts.
    var peer = ""
    /// False when the client asked to close after this request (`Connection: close`, or
    /// HTTP/1.0 without keep-alive); the response then carries `Connection: close`.
    var keepAlive: Bool

    /// The path part of `target` (before `?`).
    var path: Substring {
        target.firstIndex(of: "?").map { target[..<$0] } ?? target[...]
    }

    /// The decoded query parameters (`a=1&b=2`); later duplicates win.
    var query: [String: String] {
        guard let q = target.firstIndex(of: "?") else { return [:] }
        var out: [String: String] = [:]
        for pair in target[target.index(after: q)...].split(separator: "&") {
            let kv = pair.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false)
            guard let k = percentDecode(kv[0], plusIsSpace: true) else { continue }
            out[k] = kv.count > 1 ? percentDecode(kv[1], plusIsSpace: true) ?? "" : ""
        }
        return out
    }

    /// The first value of header `name` (case-insensitive).
    func header(_ name: String) -> String? {
        let n = name.lowercased()
        return headers.first { $0.name == n }?.value
    }
}

/// A response: a status, extra headers and a JSON body. `Content-Type`, `Content-Length` and
/// `Connection` are added when it is serialised.
package struct HTTPResponse {
    var status: Int
    var headers: [(String, String)] = []
    var body: JSON
    /// A body that is not JSON (console files, Prometheus text): sent instead of `body`.
    var raw: (contentType: String, bytes: [UInt8])?

    init(status: Int = 200, headers: [(String, String)] = [], _ body: JSON) {
        self.status = status
        self.headers = headers
        self.body = body
    }

    init(status: Int = 200, headers: [(String, String)] = [], contentType: String, bytes: [UInt8]) {
        self.init(status: status, headers: headers, .null)
        raw = (contentType, bytes)
    }

    init(_ error: APIError) {
        var h: [(String, String)] = []
        if let allow = error.allow { h.append(("Allow", allow)) }
        if let ra = error.retryAfter { h.append(("Retry-After", String(ra))) }
        if let w = error.wwwAuthenticate { h.append(("WWW-Authenticate", w)) }
        self.init(status: error.status, headers: h, error.body)
    }

    /// The full HTTP/1.1 message; `close` adds `Connection: close`. For a `HEAD` request
    /// (`headOnly`) the body is left out but `Content-Length` still describes it.
    func serialized(close: Bool, headOnly: Bool = false) -> [UInt8] {
        // 304 Not Modified and 204 No Content carry no body (RFC 9110 15.4.5, 15.3.5); a 204
        // has no Content-Length either (8.6).
        let bodiless = status == 304 || status == 204
        let payload = bodiless ? [] : raw?.bytes ?? Array(body.serialized.utf8)
        var head = "HTTP/1.1 \(status) \(HTTPResponse.reason(status))\r\n"
        if !bodiless { head += "Content-Type: \(raw?.contentType ?? "application/json")\r\n" }
        if status != 204 { head += "Content-Length: \(payload.count)\r\n" }
        for (k, v) in headers { head += "\(k): \(v)\r\n" }
        if close { head += "Connection: close\r\n" }
        head += "\r\n"
        return Array(head.utf8) + (headOnly ? [] : payload)
    }

    static func reason(_ status: Int) -> String {
        switch status {
        case 100: "Continue"
        case 200: "OK"
        case 204: "No Content"
        case 304: "Not Modified"
        case 400: "Bad Request"
        case 401: "Unauthorized"
        case 403: "Forbidden"
        case 404: "Not Found"
        case 405: "Method Not Allowed"
        case 408: "Request Timeout"
        case 409: "Conflict"
        case 411: "Length Required"
        case 413: "Payload Too Large"
        case 415: "Unsupported Media Type"
        case 429: "Too Many Requests"
        case 431: "Request Header Fields Too Large"
        case 500: "Internal Server Error"
        case 501: "Not Implemented"
        case 502: "Bad Gateway"
        case 503: "Service Unavailable"
        case 504: "Gateway Timeout"
        case 505: "HTTP Version Not Supported"
        default: status < 400 ? "OK" : "Error"
        }
    }
}

/// Decodes `%XX` escapes; nil when an escape is malformed or the result is not UTF-8.
/// `plusIsSpace`: `+` means a space, as in a query string (form encoding); in a path it is a
/// literal `+`.
func percentDecode(_ s: Substring, plusIsSpace: Bool) -> String? {
    var out: [UInt8] = []
    var it = s.utf8.makeIterator()
    func hex(_ c: UInt8?) -> UInt8? {
        guard let c else { return nil }
        switch c {
        case 0x30...0x39: return c - 0x30
        case 0x41...0x46: return c - 0x41 + 10
        case 0x61...0x66: return c - 0x61 + 10
        default: return nil
        }
    }
    while let c = it.next() {
        switch c {
        case UInt8(ascii: "%"):
            guard let hi = hex(it.next()), let lo = hex(it.next()) else { return nil }
            out.append(hi << 4 | lo)
        case UInt8(ascii: "+") where plusIsSpace: out.append(0x20)
        default: out.append(c)
        }
    }
    return String(validating: out, as: UTF8.self)
}
