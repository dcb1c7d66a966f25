import PylonCore

/// One user-property operation of `POST /v1/ma/{appKey}/properties` (docs/MA.md, "User properties"), validated.
/// Applying it (`PropertyOp+Apply.swift`) is a pure function of the user's properties and the
/// AppKey's metadata.
enum PropertyOp {
    /// Plain values overwrite, objects merge, object arrays replace, `[]` clears an array.
    case set(JSONObject)
    /// Numbers to add.
    case increase(JSONObject)
    /// Strings to add to (or remove from) string arrays, by property.
    case add([(key: String, values: [String])])
    case remove([(key: String, values: [String])])
    case delete([String])
    case updateObjectArray(key: String, identifierKey: String, identifierValue: JSON, values: JSONObject)
    case addObjectArray(key: String, object: JSONObject)
    case removeObjectArray(key: String, identifierKey: String, identifierValue: JSON)
    /// An add or remove with a non-string element: the whole operation is ignored (docs/MA.md, "User properties").
    case ignored

    /// Parses the operation of a properties body `{"euid", "op", ...}`. A missing or
    /// mistyped field, or an unknown `op`, is -3; content that breaks the rules of docs/MA.md "User properties" is 4005, 4006
    /// or 4007.
    static func parse(_ body: JSONObject) throws(MAError) -> PropertyOp {
        guard let op = body["op"]?.stringValue else { throw .invalid("op must be a string") }
        func string(_ field: String) throws(MAError) -> String {
            guard let s = body[field]?.stringValue else { throw .invalid("\(field) must be a string") }
            return s
        }
        func object(_ field: String) throws(MAError) -> JSONObject {
            guard let o = body[field]?.objectValue else { throw .invalid("\(field) must be an object") }
            return o
        }
        func properties() throws(MAError) -> JSONObject {
            let p = try object("properties")
            if p.isEmpty { throw .invalid("properties must not be empty") }
            if p.count > Limits.maxPropertiesPerCall {
                throw MAError(.tooManyProperties, "more than \(Limits.maxPropertiesPerCall) properties in one call")
            }
            for (k, _) in p { try checkName(k) }
            return p
        }
        func key() throws(MAError) -> String {
            let k = try string("key")
            try checkName(k)
            return k
        }
        func identifierValue() throws(MAError) -> JSON {
            guard let v = body["identifierValue"] else { throw .invalid("identifierValue is required") }
            guard v.stringValue != nil || v.doubleValue != nil else {
                throw MAError(.identifierMismatch, "identifierValue must be a string or a number")
            }
            return v
        }

        switch op {
        case "set":
            let p = try properties()
            for (k, v) in p { try checkSetValue(k, v) }
            return .set(p)
        case "increase":
            let p = try properties()
            for (k, v) in p where v.doubleValue == nil { throw invalidValue("\(k) must be a number") }
            return .increase(p)
        case "add", "remove":
            var list: [(key: String, values: [String])] = []
            for (k, v) in try properties() {
                guard v.arrayValue != nil else { throw invalidValue("\(k) must be an array of strings") }
                guard let strings = PropertyOp.stringArray(v) else { return .ignored }  // non-string elements
                list.append((k, strings))
            }
            return op == "add" ? .add(list) : .remove(list)
        case "delete":
            guard let a = body["keys"]?.arrayValue, !a.isEmpty else { throw .invalid("keys must be a non-empty array") }
            var keys: [String] = []
            for v in a {
                guard let k = v.stringValue else { throw .invalid("keys must be strings") }
                try checkName(k)
                keys.append(k)
            }
            return .delete(keys)
        case "updateObjectArray":
            let k = try key(), idKey = try string("identifierKey"), idValue = try identifierValue()
            let values = try object("values")
            if values.isEmpty { throw invalidValue("values must not be empty") }
            if let why = invalidSubfields(values) { throw invalidValue("values: \(why)") }
            return .updateObjectArray(key: k, identifierKey: idKey, identifierValue: idValue, values: values)
        case "addObjectArray":
            let k = try key()
            let o = try object("object")
            if let why = invalidElement(o) { throw invalidValue("object: \(why)") }
            return .addObjectArray(key: k, object: o)
        case "removeObjectArray":
            let k = try key(), idKey = try string("identifierKey"), idValue = try identifierValue()
            return .removeObjectArray(key: k, identifierKey: idKey, identifierValue: idValue)
        default:
            throw .invalid("unknown op \(op)")
        }
    }

    // MARK: Validation (docs/MA.md, "User properties")

    /// Names start with a lowercase letter, hold only `[a-z0-9_]`, are at most
    /// `Limits.maxPropertyNameBytes` bytes and do not start with `el`, `engagelab` or `metaverse`.
    static func checkName(_ name: String) throws(MAError) {
        let b = Array(name.utf8)
        func lower(_ c: UInt8) -> Bool { (0x61...0x7A).contains(c) }
        let ok =
            !b.isEmpty && b.count <= Limits.maxPropertyNameBytes && lower(b[0])
            && b.allSatisfy { lower($0) || (0x30...0x39).contains($0) || $0 == UInt8(ascii: "_") }
            && !["el", "engagelab", "metaverse"].contains(where: { name.hasPrefix($0) })
        if !ok { throw MAError(.invalidPropertyName, "invalid property name \(name)") }
    }

    /// A set value: string, number, array of strings, object, or array of objects (empty
    /// arrays allowed); never null or boolean.
    static func checkSetValue(_ key: String, _ v: JSON) throws(MAError) {
        switch v {
        case .string, .int, .double: return
        case .array(let a):
            if a.allSatisfy({ $0.stringValue != nil }) { return }
            for (i, e) in a.enumerated() {
                guard let o = e.objectValue else {
                    throw invalidValue("\(key) must be an array of strings or an array of objects")
                }
                if let why = invalidElement(o) { throw invalidValue("\(key)[\(i)]: \(why)") }
            }
        case .object(let o):
            if o.isEmpty { throw invalidValue("\(key) must not be an empty object") }
            if let why = invalidSubfields(o) { throw invalidValue("\(key): \(why)") }
        case .null: throw invalidValue("\(key) is null (use op delete)")
        case .bool: throw invalidValue("\(key) must not be a boolean")
        }
    }

    /// Why an object's subfields are invalid: names non-empty without `.` or `$`; values
    /// string, number, array of strings or null.
    static func invalidSubfields(_ o: JSONObject) -> String? {
        for (name, v) in o {
            if name.isEmpty || name.contains(".") || name.contains("$") { return "invalid subfield name \"\(name)\"" }
            switch v {
            case .string, .int, .double, .null: continue
            case .array(let a) where a.allSatisfy({ $0.stringValue != nil }): continue
            default: return "subfield \(name) must be a string, a number, an array of strings or null"
            }
        }
        return nil
    }

    /// Why an object-array element is invalid: valid subfields, at least one of them non-null.
    static func invalidElement(_ o: JSONObject) -> String? {
        if let why = invalidSubfields(o) { return why }
        if !o.contains(where: { !$0.value.isNull }) { return "an element needs a non-null subfield" }
        return nil
    }

    static func invalidValue(_ message: String) -> MAError { MAError(.invalidValue, message) }
}
