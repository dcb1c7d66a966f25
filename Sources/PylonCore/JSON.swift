import CJSONC

/// A JSON value as a Swift value type. Produced from and serialised through json-c, which is the
/// only JSON implementation on Pylon's wire. Objects keep key order as received.
public enum JSON: Equatable, Sendable {
    case null
    case bool(Bool)
    case int(Int64)
    case double(Double)
    case string(String)
    case array([JSON])
    case object(JSONObject)

    public subscript(key: String) -> JSON? {
        if case .object(let o) = self { return o[key] }
        return nil
    }

    public var stringValue: String? { if case .string(let s) = self { return s }; return nil }
    public var boolValue: Bool? { if case .bool(let b) = self { return b }; return nil }
    public var intValue: Int64? {
        switch self {
        case .int(let i): return i
        case .double(let d) where d == d.rounded() && abs(d) < 9.0e15: return Int64(d)
        default: return nil
        }
    }
    public var doubleValue: Double? {
        switch self {
        case .int(let i): return Double(i)
        case .double(let d): return d
        default: return nil
        }
    }
    public var arrayValue: [JSON]? { if case .array(let a) = self { return a }; return nil }
    public var objectValue: JSONObject? { if case .object(let o) = self { return o }; return nil }
    public var isNull: Bool { self == .null }

    /// The value serialised as one line of compact JSON (no newline), via json-c.
    public var serialized: String {
        let ref = JSONRef(self)
        return ref.serialized
    }
    /// `serialized`, indented for a person.
    public var prettySerialized: String { JSONRef(self).prettySerialized }

    /// Parses one complete JSON text with json-c (strict, UTF-8 validated).
    public static func parse(_ text: String, maxDepth: Int32 = 64) throws(JSONParseError) -> JSON {
        var text = text
        let r: Result<JSON, JSONParseError> = text.withUTF8 { buf in
            do throws(JSONParseError) {
                return .success(try JSONRef.parse(UnsafeRawBufferPointer(buf), maxDepth: maxDepth).json)
            } catch { return .failure(error) }
        }
        return try r.get()
    }
}

/// An insertion-ordered JSON object.
public struct JSONObject: Equatable, Sendable, Sequence, ExpressibleByDictionaryLiteral {
    public private(set) var keys: [String] = []
    public private(set) var storage: [String: JSON] = [:]

    public init() {}
    public init(dictionaryLiteral elements: (String, JSON)...) {
        for (k, v) in elements { self[k] = v }
    }

    public subscript(key: String) -> JSON? {
        get { storage[key] }
        set {
            if let newValue {
                if storage.updateValue(newValue, forKey: key) == nil { keys.append(key) }
            } else if storage.removeValue(forKey: key) != nil {
                keys.removeAll { $0 == key }
            }
        }
    }

    public var count: Int { keys.count }
    public var isEmpty: Bool { keys.isEmpty }

    public func makeIterator() -> AnyIterator<(key: String, value: JSON)> {
        var i = 0
        return AnyIterator {
            guard i < keys.count else { return nil }
            defer { i += 1 }
            return (keys[i], storage[keys[i]]!)
        }
    }

    public static func == (a: JSONObject, b: JSONObject) -> Bool { a.storage == b.storage }
}

extension JSON: ExpressibleByStringLiteral, ExpressibleByIntegerLiteral, ExpressibleByBooleanLiteral,
    ExpressibleByArrayLiteral, ExpressibleByDictionaryLiteral, ExpressibleByFloatLiteral
{
    public init(stringLiteral value: String) { self = .string(value) }
    public init(integerLiteral value: Int64) { self = .int(value) }
    public init(booleanLiteral value: Bool) { self = .bool(value) }
    public init(floatLiteral value: Double) { self = .double(value) }
    public init(arrayLiteral elements: JSON...) { self = .array(elements) }
    public init(dictionaryLiteral elements: (String, JSON)...) {
        var o = JSONObject()
        for (k, v) in elements { o[k] = v }
        self = .object(o)
    }
}

/// Why a line is not acceptable JSON.
public struct JSONParseError: Error, Equatable, Sendable, CustomStringConvertible {
    public enum Kind: Equatable, Sendable { case syntax, depth, utf8, trailing, incomplete }
    public let kind: Kind
    public let detail: String
    public var description: String { detail }
    public init(kind: Kind, detail: String) {
        self.kind = kind
        self.detail = detail
    }
}
