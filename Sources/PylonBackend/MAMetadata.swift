import PylonCore

/// Server metadata of an AppKey (docs/MA.md, "User properties"): which user properties are object arrays, the
/// subfield that identifies an element, and the type of each subfield. Set by tests through
/// `POST /v1/admin/ma/{appKey}/metadata`; stored as its JSON form.
struct MAMetadata: Equatable {
    enum IdentifierType: String {
        case string, number

        func matches(_ v: JSON) -> Bool {
            switch (self, v) {
            case (.string, .string): true
            case (.number, .int), (.number, .double): true
            default: false
            }
        }
    }

    enum SubfieldType: String {
        case string, number
        case stringArray = "string_array"

        /// Whether `v` (a non-null subfield value) is of this type.
        func matches(_ v: JSON) -> Bool {
            switch (self, v) {
            case (.string, .string), (.number, .int), (.number, .double): true
            case (.stringArray, .array(let a)): a.allSatisfy { $0.stringValue != nil }
            default: false
            }
        }
    }

    struct ObjectArray: Equatable {
        var identifierKey: String
        var identifierType: IdentifierType
        /// Every allowed subfield with its type, the identifier's included.
        var subfields: [String: SubfieldType]
    }

    /// By property name; kept in definition order for display.
    private(set) var names: [String] = []
    private var defs: [String: ObjectArray] = [:]

    subscript(name: String) -> ObjectArray? {
        get { defs[name] }
        set {
            if let newValue {
                if defs.updateValue(newValue, forKey: name) == nil { names.append(name) }
            } else if defs.removeValue(forKey: name) != nil {
                names.removeAll { $0 == name }
            }
        }
    }

    /// The stored or displayed form: `{"properties": {name: definition}}`.
    var json: JSON {
        var props = JSONObject()
        for n in names {
            let d = defs[n]!
            var subs = JSONObject()
            for k in d.subfields.keys.sorted() { subs[k] = .string(d.subfields[k]!.rawValue) }
            props[n] = [
                "type": "object_array", "identifierKey": .string(d.identifierKey),
                "identifierType": .string(d.identifierType.rawValue), "subfields": .object(subs),
            ]
        }
        return ["properties": .object(props)]
    }

    /// Merges a `POST .../metadata` body into this metadata: each named property's definition
    /// is replaced, and `null` removes one. Validates everything before changing anything.
    /// The identifier subfield is added to `subfields` when not listed; when listed, its type
    /// must be the identifierType.
    mutating func merge(_ body: JSON) throws(APIError) {
        func bad(_ why: String) -> APIError { .badRequest(.invalidRequest, why) }
        guard let o = body.objectValue, let props = o["properties"]?.objectValue else {
            throw bad("metadata must be an object with a \"properties\" object")
        }
        if let extra = o.keys.first(where: { $0 != "properties" }) { throw bad("unknown metadata field \(extra)") }
        var next = self
        for (name, value) in props {
            if value.isNull {
                next[name] = nil
                continue
            }
            guard let d = value.objectValue else { throw bad("properties.\(name) must be an object or null") }
            guard d["type"]?.stringValue == "object_array" else { throw bad("properties.\(name).type must be \"object_array\"") }
            guard let key = d["identifierKey"]?.stringValue, !key.isEmpty else {
                throw bad("properties.\(name).identifierKey must be a non-empty string")
            }
            guard let type = d["identifierType"]?.stringValue.flatMap(IdentifierType.init(rawValue:)) else {
                throw bad("properties.\(name).identifierType must be \"string\" or \"number\"")
            }
            var subfields: [String: SubfieldType] = [:]
            if let s = d["subfields"], !s.isNull {
                guard let so = s.objectValue else { throw bad("properties.\(name).subfields must be an object") }
                for (sub, t) in so {
                    guard !sub.isEmpty, let st = t.stringValue.flatMap(SubfieldType.init(rawValue:)) else {
                        throw bad("properties.\(name).subfields.\(sub) must be \"string\", \"number\" or \"string_array\"")
                    }
                    subfields[sub] = st
                }
            }
            switch subfields[key] {
            case nil: subfields[key] = type == .string ? .string : .number
            case .some(.string) where type == .string, .some(.number) where type == .number: break
            default: throw bad("properties.\(name).subfields.\(key) must have the identifierType")
            }
            next[name] = ObjectArray(identifierKey: key, identifierType: type, subfields: subfields)
        }
        self = next
    }

    /// Reads the stored form (anything unreadable counts as no definition).
    static func stored(_ text: String) -> MAMetadata {
        var m = MAMetadata()
        if let j = try? JSON.parse(text, maxDepth: Limits.maxJSONDepth + 1) { try? m.merge(j) }
        return m
    }
}
