import PylonCore

extension PropertyOp {
    /// The user's properties after this operation, or the failure that leaves them unchanged.
    /// Pure: `props` is the user's current properties, `metadata` the AppKey's.
    func applied(to props: JSONObject, metadata: MAMetadata) throws(MAError) -> JSONObject {
        var p = props
        switch self {
        case .set(let values):
            for (k, v) in values { PropertyOp.set(&p, k, v) }
        case .increase(let values):
            for (k, n) in values {
                guard let sum = PropertyOp.sum(p[k] ?? .int(0), n) else { continue }  // non-numeric target
                p[k] = sum
            }
        case .add(let list):
            for (k, values) in list {
                guard var a = PropertyOp.stringArray(p[k] ?? .array([])) else { continue }
                for v in values where !a.contains(v) { a.append(v) }
                if p[k] != nil || !a.isEmpty { p[k] = .array(a.map(JSON.string)) }
            }
        case .remove(let list):
            for (k, values) in list {
                guard let value = p[k], let a = PropertyOp.stringArray(value) else { continue }
                p[k] = .array(a.filter { !values.contains($0) }.map(JSON.string))
            }
        case .delete(let keys):
            for k in keys { p[k] = nil }
        case .updateObjectArray(let key, let idKey, let idValue, let values):
            guard let def = metadata[key], let current = p[key] else { return props }
            try PropertyOp.checkIdentifier(idKey, idValue, def)
            if values[def.identifierKey] != nil {
                throw MAError(.subfieldMismatch, "values must not contain the identifier \(def.identifierKey)")
            }
            for (name, v) in values {
                guard let t = def.subfields[name] else {
                    throw MAError(.subfieldMismatch, "subfield \(name) is not defined for \(key)")
                }
                if !v.isNull && !t.matches(v) {
                    throw MAError(.subfieldMismatch, "subfield \(name) of \(key) must be of type \(t.rawValue)")
                }
            }
            var elements = current.arrayValue ?? []
            let i = try PropertyOp.match(elements, idKey, idValue, noneIsFailure: true)!
            var element = elements[i].objectValue!
            for (name, v) in values { element[name] = v.isNull ? nil : v }
            elements[i] = .object(element)
            p[key] = .array(elements)
        case .addObjectArray(let key, let object):
            guard metadata[key] != nil else { return props }
            let element = JSON.object(PropertyOp.withoutNulls(object))
            if case .array(let a) = p[key], a.allSatisfy({ $0.objectValue != nil }) {
                p[key] = .array(a + [element])
            } else {
                p[key] = .array([element])
            }
        case .removeObjectArray(let key, let idKey, let idValue):
            guard let def = metadata[key], case .array(var elements) = p[key] else { return props }
            try PropertyOp.checkIdentifier(idKey, idValue, def)
            guard let i = try PropertyOp.match(elements, idKey, idValue, noneIsFailure: false) else { return props }
            elements.remove(at: i)
            p[key] = .array(elements)
        case .ignored:
            break
        }
        return p
    }

    // MARK: Helpers

    /// set for one property: plain types overwrite or create; an object merges into an
    /// existing object (null deletes a subfield; nothing is created from nulls alone); an
    /// array of objects replaces the value; `[]` clears an existing array only.
    private static func set(_ p: inout JSONObject, _ k: String, _ v: JSON) {
        switch v {
        case .array(let a) where a.isEmpty:
            if p[k]?.arrayValue != nil { p[k] = .array([]) }
        case .array(let a) where a.allSatisfy({ $0.objectValue != nil }):
            p[k] = .array(a.map { .object(withoutNulls($0.objectValue!)) })
        case .object(let o):
            let existing = p[k]?.objectValue
            var merged = existing ?? JSONObject()
            for (name, sv) in o { merged[name] = sv.isNull ? nil : sv }
            if existing != nil || !merged.isEmpty { p[k] = .object(merged) }
        default:
            p[k] = v
        }
    }

    /// `a + b` for numbers (integers stay integers unless the sum overflows); nil when `a`
    /// is not a number.
    static func sum(_ a: JSON, _ b: JSON) -> JSON? {
        if case .int(let x) = a, case .int(let y) = b {
            let (s, overflow) = x.addingReportingOverflow(y)
            if !overflow { return .int(s) }
        }
        guard let x = a.doubleValue, let y = b.doubleValue else { return nil }
        return .double(x + y)
    }

    /// The strings of a string array (an empty array counts); nil for anything else.
    static func stringArray(_ v: JSON) -> [String]? {
        guard let a = v.arrayValue else { return nil }
        let s = a.compactMap(\.stringValue)
        return s.count == a.count ? s : nil
    }

    private static func withoutNulls(_ o: JSONObject) -> JSONObject {
        var out = JSONObject()
        for (k, v) in o where !v.isNull { out[k] = v }
        return out
    }

    /// identifierKey must be the metadata's and identifierValue of its identifierType: 4003.
    private static func checkIdentifier(_ key: String, _ value: JSON, _ def: MAMetadata.ObjectArray) throws(MAError) {
        guard key == def.identifierKey else {
            throw MAError(.identifierMismatch, "identifierKey must be \(def.identifierKey)")
        }
        guard def.identifierType.matches(value) else {
            throw MAError(.identifierMismatch, "identifierValue must be a \(def.identifierType.rawValue)")
        }
    }

    /// The index of the one element whose `key` subfield equals `value`; nil when there is
    /// none and that is not a failure; 4001 or 4002 otherwise.
    private static func match(_ elements: [JSON], _ key: String, _ value: JSON, noneIsFailure: Bool) throws(MAError) -> Int? {
        let hits = elements.indices.filter { i in elements[i][key].map { sameIdentifier($0, value) } ?? false }
        switch hits.count {
        case 0:
            if noneIsFailure { throw MAError(.noMatchingElement, "no element has \(key) = \(value.serialized)") }
            return nil
        case 1: return hits[0]
        default: throw MAError(.severalMatchingElements, "\(hits.count) elements have \(key) = \(value.serialized)")
        }
    }

    /// Strings compare as strings, numbers by value (1 equals 1.0).
    private static func sameIdentifier(_ a: JSON, _ b: JSON) -> Bool {
        switch (a, b) {
        case (.string(let x), .string(let y)): x == y
        case (.int(let x), .int(let y)): x == y
        default: a.stringValue == nil && b.stringValue == nil && a.doubleValue != nil && a.doubleValue == b.doubleValue
        }
    }
}
