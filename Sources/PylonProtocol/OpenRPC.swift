import PylonCore

/// `bus.describe {"format":"openrpc"}`: the methods as an OpenRPC 1.2.6 document
/// (https://spec.open-rpc.org), the JSON-RPC ecosystem's description format, so generic tools
/// can read them. Params are by name (`paramStructure: "by-name"`); each param's and result's
/// schema is a JSON Schema `type` (none for `any`), with the result's members as `properties`.
/// Pylon's own facts ride in `x-pylon-*` extension members (allowed by the specification):
/// `x-pylon-plugin` (who serves it: `pylond`, a plugin, or `client#N`), `x-pylon-consent`.
public enum OpenRPC {
    public static let version = "1.2.6"

    /// One method to list: its full name, who serves it, its consent template and its doc
    /// (nil: undocumented, listed with no params and an open result).
    public struct Entry: Sendable {
        public var name: String
        public var servedBy: String
        public var consent: String?
        public var doc: MethodDoc?

        public init(name: String, servedBy: String, consent: String? = nil, doc: MethodDoc? = nil) {
            self.name = name
            self.servedBy = servedBy
            self.consent = consent
            self.doc = doc
        }
    }

    public static func document(title: String, version appVersion: String, methods: [Entry]) -> JSON {
        [
            "openrpc": .string(version),
            "info": ["title": .string(title), "version": .string(appVersion)],
            "methods": .array(methods.map(method)),
        ]
    }

    static func schema(_ t: MethodDoc.JSONType, _ description: String) -> JSONObject {
        var o = JSONObject()
        if t != .any { o["type"] = .string(t.rawValue) }
        if !description.isEmpty { o["description"] = .string(description) }
        return o
    }

    static func method(_ e: Entry) -> JSON {
        var o: JSONObject = ["name": .string(e.name), "paramStructure": "by-name"]
        if let d = e.doc, !d.summary.isEmpty { o["summary"] = .string(d.summary) }
        o["params"] = .array(
            (e.doc?.params ?? []).map { p in
                var po: JSONObject = ["name": .string(p.name), "required": .bool(p.required), "schema": .object(schema(p.type, ""))]
                if !p.description.isEmpty { po["description"] = .string(p.description) }
                return .object(po)
            })
        var rs = JSONObject()
        if let r = e.doc?.result {
            rs = schema(r.type, r.description)
            if !r.fields.isEmpty {
                var props = JSONObject()
                for f in r.fields { props[f.name] = .object(schema(f.type, f.description)) }
                rs["properties"] = .object(props)
                let req = r.fields.filter(\.required).map { JSON.string($0.name) }
                if !req.isEmpty { rs["required"] = .array(req) }
            }
        }
        o["result"] = ["name": "result", "schema": .object(rs)]
        o["x-pylon-plugin"] = .string(e.servedBy)
        if let c = e.consent { o["x-pylon-consent"] = .string(c) }
        return .object(o)
    }
}
