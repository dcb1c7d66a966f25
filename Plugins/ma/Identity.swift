import PylonPluginKit

/// MA result codes (ma.md "Error codes used"). Stable; returned as `{"code": N, ...}`.
enum MACode {
    static let failed: Int64 = -1
    static let notStarted: Int64 = -2
    static let invalidParams: Int64 = -3
    // -4 and -6 come from the backend and are passed through; -7 is never produced (docs/MA.md).
    static let identifierTooLong: Int64 = 3003
    static let identifierInvalid: Int64 = 3013
}

/// identifyAccount's identifier normalisation and local validation (docs/MA.md, "Identifier rules").
///
/// Each field is trimmed; empty, `0`, `null`, `undefined` and `nan` (any case) count as not sent;
/// a non-string or malformed value is dropped with 3013, a too-long one with 3003; the others are
/// kept. Limits (Pylon's choice, the source's table is missing): user_id and anonymous_id ≤ 256
/// characters; email ≤ 256 and `local@domain.tld`; phone `+` then 6–20 digits (≤ 32 in total).
package struct IdentityInput {
    /// Wire names of the fields, in the order results are reported.
    static let fields: [(param: String, wire: String)] = [
        ("userID", "user_id"), ("anonymousID", "anonymous_id"), ("email", "email"), ("phone", "phone"),
    ]
    static let maxIdLength = 256
    static let maxEmailLength = 256

    /// Valid, normalised values by wire name.
    var valid: [String: String] = [:]
    /// Local rejections by wire name: (code, message).
    var rejected: [String: (code: Int64, msg: String)] = [:]

    package init(_ params: JSON?) {
        for (param, wire) in IdentityInput.fields {
            guard let raw = params?[param] ?? params?[wire] else { continue }
            guard let s = raw.stringValue else {
                if raw == .null { continue }
                rejected[wire] = (MACode.identifierInvalid, "identifier must be a string")
                continue
            }
            let v = s.trimmedWhitespace
            if IdentityInput.meansNotSent(v) { continue }
            switch IdentityInput.check(wire, v) {
            case .none: valid[wire] = wire == "email" ? v.lowercased() : v
            case .some(let r): rejected[wire] = r
            }
        }
    }

    static func meansNotSent(_ v: String) -> Bool {
        v.isEmpty || ["0", "null", "undefined", "nan"].contains(v.lowercased())
    }

    /// nil when valid; else the per-field code and message.
    static func check(_ wire: String, _ v: String) -> (code: Int64, msg: String)? {
        switch wire {
        case "user_id", "anonymous_id":
            return v.count > maxIdLength ? (MACode.identifierTooLong, "identifier value exceeds the length limit") : nil
        case "email":
            if v.count > maxEmailLength { return (MACode.identifierTooLong, "identifier value exceeds the length limit") }
            let parts = v.split(separator: "@", omittingEmptySubsequences: false)
            guard parts.count == 2, !parts[0].isEmpty, parts[1].contains("."), !parts[1].hasPrefix("."), !parts[1].hasSuffix("."),
                !v.contains(" ")
            else { return (MACode.identifierInvalid, "invalid email format") }
            return nil
        case "phone":
            if v.count > 32 { return (MACode.identifierTooLong, "identifier value exceeds the length limit") }
            let digits = v.dropFirst()
            guard v.hasPrefix("+"), digits.count >= 6, digits.allSatisfy({ $0.isASCII && $0.isNumber }) else {
                return (MACode.identifierInvalid, "phone must be + followed by 6-20 digits")
            }
            if digits.count > 20 { return (MACode.identifierTooLong, "identifier value exceeds the length limit") }
            return nil
        default:
            return nil
        }
    }

    /// The per-field `message` of identifyAccount: local rejections merged with the server's
    /// results (server wins for fields it reports); `success` when there is nothing to report.
    func message(server: JSONObject?) -> String {
        var o = JSONObject()
        for (_, wire) in IdentityInput.fields {
            if let r = rejected[wire] {
                o[wire] = ["code": .int(r.code), "msg": .string(r.msg)]
            } else if let s = server?[wire] {
                o[wire] = s
            }
        }
        return o.isEmpty ? "success" : JSON.object(o).serialized
    }

    /// Only the local rejections (start's user-ID part), or "" when none.
    var localMessage: String { rejected.isEmpty ? "" : message(server: nil) }

    var identityJSON: JSON {
        var o = JSONObject()
        for (_, wire) in IdentityInput.fields { if let v = valid[wire] { o[wire] = .string(v) } }
        return .object(o)
    }
}

extension String {
    /// Without leading/trailing Unicode whitespace and newlines. A string whose first and last
    /// bytes are printable ASCII (every AppKey in use) is returned as is, without Unicode's
    /// whitespace tables: no whitespace character starts or ends with such a byte.
    var trimmedWhitespace: String {
        @inline(__always) func plain(_ c: UInt8?) -> Bool { c.map { $0 > 0x20 && $0 < 0x7F } ?? false }
        if plain(utf8.first) && plain(utf8.last) { return self }
        var s = Substring(self)
        while let f = s.first, f.isWhitespace { s = s.dropFirst() }
        while let l = s.last, l.isWhitespace { s = s.dropLast() }
        return String(s)
    }
}
