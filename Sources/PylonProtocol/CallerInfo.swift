import PylonCore

/// Who called, as the host writes it in a request's `_pylon` member (docs/PROTOCOL.md): `client`,
/// `uid`, `gid`, `pid` for a client connection, `plugin` for a plugin, both for a plugin acting
/// for a client, `admin` for an admin client (`disclosure.admins`). The host writes it
/// (`serialized`, the only writer) and the plugin kit reads it (`init(text:)`), so both sides agree
/// on one type. Each field is what `JSON`'s `intValue`/`stringValue`/`boolValue` would give for
/// that member (nil when absent or of another type).
public struct CallerInfo: Equatable, Sendable {
    public var client: Int64?
    public var uid: Int64?
    public var gid: Int64?
    public var pid: Int64?
    public var plugin: String?
    public var admin: Bool?

    /// Nesting depth accepted when the text is parsed with json-c (the fallback of `init(text:)`);
    /// the plugin kit's own parser limit.
    public static let maxDepth: Int32 = 128

    public init(client: Int64? = nil, uid: Int64? = nil, gid: Int64? = nil, pid: Int64? = nil, plugin: String? = nil, admin: Bool? = nil) {
        self.client = client
        self.uid = uid
        self.gid = gid
        self.pid = pid
        self.plugin = plugin
        self.admin = admin
    }

    /// Whether the host says the caller is an admin client: `"admin": true`, nothing else (no uid
    /// is an admin by itself).
    public var isAdmin: Bool { admin == true }

    /// The member's JSON object text: `{"plugin":P,"client":N,"uid":U,"gid":G,"pid":P,"admin":A}`
    /// in that order, with the members that are nil left out. The host writes `_pylon` with it
    /// (and only `"admin":true`: a caller that is no admin has no `admin` member).
    public var serialized: String {
        var out = "{"
        func member(_ key: String, _ value: String) {
            if out.utf8.count > 1 { out += "," }
            out += "\"" + key + "\":" + value
        }
        if let plugin { member("plugin", JSON.string(plugin).serialized) }
        if let client { member("client", String(client)) }
        if let uid { member("uid", String(uid)) }
        if let gid { member("gid", String(gid)) }
        if let pid { member("pid", String(pid)) }
        if let admin { member("admin", admin ? "true" : "false") }
        return out + "}"
    }

    /// From the caller as a Swift value (the `_pylon` member of a parsed request).
    public init(json: JSON?) {
        client = json?["client"]?.intValue
        uid = json?["uid"]?.intValue
        gid = json?["gid"]?.intValue
        pid = json?["pid"]?.intValue
        plugin = json?["plugin"]?.stringValue
        admin = json?["admin"]?.boolValue
    }

    /// From the `_pylon` member's JSON text (valid JSON; nil: no caller info). The small,
    /// host-written object is read from its bytes; anything unusual (escapes, numbers that are not
    /// plain integers) is parsed with json-c instead, with the same result.
    public init(text: UnsafeRawBufferPointer?) {
        guard let text else { self.init(json: nil); return }
        if let fast = CallerInfo.scan(text) { self = fast; return }
        self.init(json: (try? JSONRef.parse(text, maxDepth: CallerInfo.maxDepth))?.json)
    }

    /// The byte-level read; nil when the text is not plainly written.
    package static func scan(_ t: UnsafeRawBufferPointer) -> CallerInfo? {
        let start = RawJSON.skipSpace(t, 0)
        guard start < t.count, t[start] == UInt8(ascii: "{"), !t.contains(UInt8(ascii: "\\")) else { return nil }
        // One walk over the members; the last of a repeated key wins, as in json-c.
        var c = CallerInfo()
        for m in RawJSON.Members(t, start..<t.count) {
            let k = m.key
            let first = t[m.value.lowerBound]
            let isNumber = RawJSON.isNumber(first)
            /// An integer member: nil when it is not a number, or not one written as plain digits
            /// (a fraction or exponent may still be an integer to `intValue`: json-c decides).
            func int() -> Int64?? {
                guard isNumber else { return .some(nil) }
                return RawJSON.plainInt(t, m.value).map { .some($0) }
            }
            switch k.count {
            case 3 where RawJSON.equals(t, k.lowerBound, k.upperBound, "uid"): guard let v = int() else { return nil }; c.uid = v
            case 3 where RawJSON.equals(t, k.lowerBound, k.upperBound, "gid"): guard let v = int() else { return nil }; c.gid = v
            case 3 where RawJSON.equals(t, k.lowerBound, k.upperBound, "pid"): guard let v = int() else { return nil }; c.pid = v
            case 6 where RawJSON.equals(t, k.lowerBound, k.upperBound, "client"): guard let v = int() else { return nil }; c.client = v
            case 6 where RawJSON.equals(t, k.lowerBound, k.upperBound, "plugin"): c.plugin = RawJSON.plainString(t, m.value)
            case 5 where RawJSON.equals(t, k.lowerBound, k.upperBound, "admin"):
                c.admin =
                    RawJSON.equals(t, m.value.lowerBound, m.value.upperBound, "true")
                    ? true
                    : RawJSON.equals(t, m.value.lowerBound, m.value.upperBound, "false") ? false : nil
            default: break
            }
        }
        return c
    }
}

extension CallerInfo: CustomStringConvertible {
    /// The caller as refusals name it: `uid 1000`, `plugin ma`, `plugin ma (for uid 1000)`, `an
    /// anonymous caller`.
    public var description: String {
        switch (plugin, uid) {
        case (let p?, let u?): return "plugin \(p) (for uid \(u))"
        case (let p?, nil): return "plugin \(p)"
        case (nil, let u?): return "uid \(u)"
        case (nil, nil): return "an anonymous caller"
        }
    }
}
